package server_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/server"
)

// queryPaths are the index's HTTP query endpoints FuzzHTTPQuery posts to.
var queryPaths = []string{"/query", "/v1/query", "/query_by_hash", "/v1/query_by_hash", "/v1/score"}

// FuzzHTTPQuery: any body posted to any of the index's HTTP query
// endpoints is answered, never with a server error: a malformed or
// unanswerable query is the caller's error (4xx), not the index's (5xx).
func FuzzHTTPQuery(f *testing.F) {
	f.Add(uint8(0), []byte(`{"model":"m","tenant_id":"team-a/cache","token_ids":[1,2,3,4]}`))
	f.Add(uint8(2), []byte(`{"model":"m","tenant_id":"team-a/cache","block_size":16,"seq_hashes":[1,2,3]}`))
	f.Add(uint8(4), []byte(`{"cacheBackend":{"namespace":"team-a","name":"cache"},"model":"m","blockHashes":["1","2"]}`))
	f.Add(uint8(4), []byte(`{"cacheBackend":{"namespace":"team-a","name":"cache"},"model":"m","tokenIds":[1,2,3]}`))
	f.Add(uint8(1), []byte(`{"tenant_id":"nope"}`))
	f.Add(uint8(3), []byte(`{`))
	ix := kvindex.New(kvindex.Options{Store: memstore.New()})
	mux := http.NewServeMux()
	server.HTTPHandler(ix, mux)
	f.Fuzz(func(t *testing.T, path uint8, body []byte) {
		p := queryPaths[int(path)%len(queryPaths)]
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, p, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		mux.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("POST %s %q answered %d: %s", p, body, rec.Code, rec.Body.String())
		}
	})
}
