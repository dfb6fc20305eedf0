package indexclient_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex/indexclient"
)

// TestHTTP guards the manager's read of the index: the path,
// the bearer token re-read from its file, the protobuf-JSON decoding, and
// an error for any answer but 200.
func TestHTTP(t *testing.T) {
	var gotPath, gotAuth string
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotAuth = r.URL.RequestURI(), r.Header.Get("Authorization")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"cache_backend":{"namespace":"team","name":"cache"},"live_pods":2,"pods":3,` +
			`"hash_compatibility":"HASH_COMPATIBILITY_VERIFIED","pod_list":[{"name":"p","state":"POD_STATE_STALE","blocks":"7"}],"future_field":1}`))
	}))
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &indexclient.HTTP{BaseURL: srv.URL + "/", TokenFile: tokenFile}
	sum, err := r.Participation(context.Background(), "team", "cache")
	if err != nil {
		t.Fatal(err)
	}
	if gotPath != "/v1/backends/team/cache/participation?maxPods=32" || gotAuth != "Bearer first" {
		t.Fatalf("request %s with %q", gotPath, gotAuth)
	}
	if sum.GetLivePods() != 2 || sum.GetPods() != 3 || len(sum.GetPodList()) != 1 || sum.GetPodList()[0].GetBlocks() != 7 {
		t.Fatalf("decoded %v", sum)
	}
	// A rotated token is used at once.
	if err := os.WriteFile(tokenFile, []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	status = http.StatusForbidden
	if _, err := r.Participation(context.Background(), "team", "cache"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("a 403 answer gave %v", err)
	}
	if gotAuth != "Bearer second" {
		t.Fatalf("token %q after rotation", gotAuth)
	}
	srv.Close()
	if _, err := r.Participation(context.Background(), "team", "cache"); err == nil {
		t.Fatal("an unreachable index gave no error")
	}
}
