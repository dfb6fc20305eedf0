package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/operator/internal/kvindex/memstore"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// TestOverlongNamesOverTheWire: a 32 KiB name on any read path, HTTP or
// gRPC, and in a Hello, is answered 400 / InvalidArgument naming the
// field.
func TestOverlongNamesOverTheWire(t *testing.T) {
	h := newHarness(t, memstore.New())
	long := strings.Repeat("x", 32<<10)
	httpCases := []struct {
		name, method, path, body, field string
	}{
		{"participation", http.MethodGet, "/v1/backends/team-a/" + long + "/participation", "", "cache_backend.name"},
		{"query tenant", http.MethodPost, "/query", `{"model":"m","tenant_id":"team-a/` + long + `","token_ids":[1]}`, "tenant_id"},
		{"query instance", http.MethodPost, "/query_by_hash", `{"model":"m","tenant_id":"team-a/cache","instance_id":"` + long + `","seq_hashes":[1]}`, "instance_id"},
		{"query model", http.MethodPost, "/v1/query", `{"model":"` + long + `","tenant_id":"team-a/cache","token_ids":[1]}`, "model"},
		{"score lora", http.MethodPost, "/v1/score", `{"cacheBackend":{"namespace":"team-a","name":"cache"},"model":"m","loraName":"` + long + `","blockHashes":["1"]}`, "lora_name"},
	}
	for _, tt := range httpCases {
		t.Run("http/"+tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, h.http.URL+tt.path, strings.NewReader(tt.body))
			req.Header.Set("Authorization", "Bearer "+jwt("router-a"))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct{ Error string }
			_ = json.NewDecoder(resp.Body).Decode(&e)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error, tt.field) {
				t.Fatalf("HTTP %d %.200q, want 400 naming %s", resp.StatusCode, e.Error, tt.field)
			}
		})
	}
	q := pb.NewQueryClient(h.conn)
	_, err := q.Participation(withToken("router-a"), &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: long, Name: "cache"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "cache_backend.namespace") {
		t.Errorf("gRPC participation of a 32 KiB namespace: %.200v, want InvalidArgument naming cache_backend.namespace", err)
	}
	_, err = q.Score(withToken("router-a"), &pb.ScoreRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}, Model: long, BlockHashes: []uint64{1}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "model") {
		t.Errorf("gRPC score of a 32 KiB model: %.200v, want InvalidArgument naming model", err)
	}
	s := h.open(t, "sub-a")
	m := hello("team-a", "vllm-0", "uid-0", 1)
	m.GetHello().Model = long
	s.send(m)
	if _, err := s.s.Recv(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "model") {
		t.Errorf("hello with a 32 KiB model: %.200v, want InvalidArgument naming model", err)
	}
}
