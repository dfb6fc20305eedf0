package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/operator/internal/kvindex"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// maxQueryBody bounds an HTTP query (a 128k-token prompt as JSON fits).
const maxQueryBody = 4 << 20

// HTTPHandler serves the HTTP/JSON query API on mux:
//
//   - POST /query, /v1/query: Mooncake/Dynamo indexer shape, by token IDs;
//   - POST /query_by_hash, /v1/query_by_hash: the same by block hashes
//     ("seq_hashes", or "block_hash" as older drafts call it);
//   - POST /v1/score: the gRPC ScoreRequest/ScoreResponse as protobuf JSON;
//   - GET /v1/backends/{namespace}/{name}/participation: the summary.
//
// In the Mooncake shape tenant_id is the CacheBackend "namespace/name" and
// instance_id a pod name.
func HTTPHandler(ix *kvindex.Index, mux *http.ServeMux) {
	h := &httpAPI{ix: ix}
	mux.HandleFunc("POST /query", h.query)
	mux.HandleFunc("POST /v1/query", h.query)
	mux.HandleFunc("POST /query_by_hash", h.query)
	mux.HandleFunc("POST /v1/query_by_hash", h.query)
	mux.HandleFunc("POST /v1/score", h.score)
	mux.HandleFunc("GET /v1/backends/{namespace}/{name}/participation", h.participation)
}

type httpAPI struct{ ix *kvindex.Index }

func httpStatus(err error) int {
	switch {
	case errors.Is(err, kvindex.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, kvindex.ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, kvindex.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, kvindex.ErrTokensUnsupported):
		return http.StatusUnprocessableEntity
	}
	return http.StatusServiceUnavailable
}

func writeError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus(err))
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

func (h *httpAPI) caller(r *http.Request, api string) (kvindex.Caller, error) {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return h.ix.Authenticate(r.Context(), api, strings.TrimSpace(tok))
}

// mooncakeQuery is the request body of /query and /query_by_hash.
type mooncakeQuery struct {
	Model      string        `json:"model"`
	LoraName   string        `json:"lora_name"`
	TokenIDs   []uint32      `json:"token_ids"`
	SeqHashes  []json.Number `json:"seq_hashes"`
	BlockHash  []json.Number `json:"block_hash"`
	TenantID   string        `json:"tenant_id"`
	InstanceID string        `json:"instance_id"`
	BlockSize  uint32        `json:"block_size"`
}

// mooncakeInstance is one instance's line of the answer: matched tokens of
// the longest prefix over all media and ranks, per medium (blocks all in
// that medium) and per data-parallel rank.
type mooncakeInstance struct {
	LongestMatched uint64            `json:"longest_matched"`
	GPU            uint64            `json:"GPU"`
	CPU            uint64            `json:"CPU"`
	DISK           uint64            `json:"DISK"`
	DP             map[string]uint64 `json:"DP"`
}

func parseHash(n json.Number) (uint64, error) {
	s := n.String()
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return u, nil
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return uint64(i), nil // SGLang's signed hashes keep their bit pattern
	}
	return 0, fmt.Errorf("block hash %q is not a 64-bit integer: %w", s, kvindex.ErrInvalid)
}

func (h *httpAPI) query(w http.ResponseWriter, r *http.Request) {
	caller, err := h.caller(r, "query")
	if err != nil {
		writeError(w, err)
		return
	}
	var q mooncakeQuery
	dec := json.NewDecoder(io.LimitReader(r.Body, maxQueryBody))
	dec.UseNumber()
	if err := dec.Decode(&q); err != nil {
		writeError(w, fmt.Errorf("decoding the query: %w", errors.Join(err, kvindex.ErrInvalid)))
		return
	}
	if n := len(q.TenantID); n > kvindex.MaxNamespaceBytes+1+kvindex.MaxBackendNameBytes {
		writeError(w, fmt.Errorf("tenant_id is %d bytes, over the index's bound of %d: %w", n, kvindex.MaxNamespaceBytes+1+kvindex.MaxBackendNameBytes, kvindex.ErrInvalid))
		return
	}
	if n := len(q.InstanceID); n > kvindex.MaxPodNameBytes {
		writeError(w, fmt.Errorf("instance_id is %d bytes, over the index's bound of %d: %w", n, kvindex.MaxPodNameBytes, kvindex.ErrInvalid))
		return
	}
	ns, name, ok := strings.Cut(q.TenantID, "/")
	if !ok {
		writeError(w, fmt.Errorf("tenant_id %q is not a CacheBackend namespace/name: %w", q.TenantID, kvindex.ErrInvalid))
		return
	}
	var hashes []uint64
	for _, n := range append(q.SeqHashes, q.BlockHash...) {
		v, err := parseHash(n)
		if err != nil {
			writeError(w, err)
			return
		}
		hashes = append(hashes, v)
	}
	if strings.HasSuffix(r.URL.Path, "query_by_hash") && len(hashes) == 0 {
		writeError(w, fmt.Errorf("query_by_hash without seq_hashes: %w", kvindex.ErrInvalid))
		return
	}
	res, err := h.ix.ScoreByRank(r.Context(), caller, kvindex.BackendRef{Namespace: ns, Name: name}, q.Model, q.LoraName, hashes, q.TokenIDs)
	if err != nil {
		writeError(w, err)
		return
	}
	if q.BlockSize != 0 && res.BlockSize != 0 && q.BlockSize != res.BlockSize {
		writeError(w, fmt.Errorf("block_size %d, the pods use %d: %w", q.BlockSize, res.BlockSize, kvindex.ErrInvalid))
		return
	}
	inst := map[string]*mooncakeInstance{}
	for _, m := range res.Matches {
		if q.InstanceID != "" && m.Pod != q.InstanceID {
			continue
		}
		bs := uint64(m.BlockSize)
		mi := inst[m.Pod]
		if mi == nil {
			mi = &mooncakeInstance{DP: map[string]uint64{}}
			inst[m.Pod] = mi
		}
		mi.LongestMatched = max(mi.LongestMatched, uint64(m.Any)*bs)
		mi.GPU = max(mi.GPU, uint64(m.GPU)*bs)
		mi.CPU = max(mi.CPU, uint64(m.CPU)*bs)
		mi.DISK = max(mi.DISK, uint64(m.Disk)*bs)
		mi.DP[strconv.FormatUint(uint64(m.Rank), 10)] = uint64(m.Any) * bs
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]map[string]*mooncakeInstance{q.TenantID: inst})
}

func (h *httpAPI) score(w http.ResponseWriter, r *http.Request) {
	caller, err := h.caller(r, "query")
	if err != nil {
		writeError(w, err)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxQueryBody))
	if err != nil {
		writeError(w, fmt.Errorf("reading the request: %w", errors.Join(err, kvindex.ErrInvalid)))
		return
	}
	var req pb.ScoreRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		writeError(w, fmt.Errorf("decoding the request: %w", errors.Join(err, kvindex.ErrInvalid)))
		return
	}
	resp, err := h.ix.Score(r.Context(), caller, &req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeProto(w, resp)
}

func (h *httpAPI) participation(w http.ResponseWriter, r *http.Request) {
	caller, err := h.caller(r, "query")
	if err != nil {
		writeError(w, err)
		return
	}
	maxPods, _ := strconv.ParseUint(r.URL.Query().Get("maxPods"), 10, 32)
	resp, err := h.ix.Participation(r.Context(), caller, &pb.ParticipationRequest{
		CacheBackend: &pb.CacheBackendRef{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")},
		MaxPods:      uint32(maxPods),
	})
	if err != nil {
		writeError(w, err)
		return
	}
	writeProto(w, resp)
}

func writeProto(w http.ResponseWriter, m proto.Message) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
