package server

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/sglangpb"
)

// RegisterSGLang serves SGLang's router query,
// kv_indexer.v1.KVIndexer/MatchExternalKvPrefix, for one CacheBackend on
// s. The router's client sends no credentials and names no backend, so a
// listener serves exactly one backend and anyone who reaches it reads that
// backend's placements: cache-index runs it only where the operator asked
// (--sglang-kv-indexer), and a NetworkPolicy should keep it to the router.
func RegisterSGLang(s grpc.ServiceRegistrar, ix *kvindex.Index, backend kvindex.BackendRef) {
	sglangpb.RegisterKVIndexerServer(s, &sglangServer{ix: ix, backend: backend})
}

type sglangServer struct {
	sglangpb.UnimplementedKVIndexerServer
	ix      *kvindex.Index
	backend kvindex.BackendRef
}

// MatchExternalKvPrefix implements sglangpb.KVIndexerServer. The router
// takes Unavailable, DeadlineExceeded, Canceled and ResourceExhausted as a
// cache miss and routes without the index; any other error fails its
// pick, so a prompt longer than the index's bound is cut to the bound (a
// shorter prefix answered, blocks_read tells) rather than refused.
func (s *sglangServer) MatchExternalKvPrefix(ctx context.Context, req *sglangpb.MatchExternalKvPrefixRequest) (*sglangpb.MatchExternalKvPrefixResponse, error) {
	in := req.GetHashes()
	if len(in) == 0 {
		return nil, status.Error(codes.InvalidArgument, "hashes is empty: a prefix query names at least the prompt's first block")
	}
	n := len(in)
	if m := int(req.GetMaxBlocks()); m > 0 {
		n = min(n, m)
	}
	n = min(n, kvindex.MaxQueryHashes)
	hashes := make([]uint64, n)
	for i, h := range in[:n] {
		hashes[i] = uint64(h) // SGLang's signed hashes keep their bit pattern
	}
	ms, err := s.ix.MatchPrefix(ctx, s.backend, hashes)
	if err != nil {
		return nil, status.Error(codes.Unavailable, fmt.Sprintf("CacheBackend %s: %v", s.backend, err))
	}
	resp := &sglangpb.MatchExternalKvPrefixResponse{BlocksRead: uint32(n)}
	for _, m := range ms {
		resp.Matches = append(resp.Matches, &sglangpb.ExternalKvPrefixMatch{
			WorkerAddress: m.Address, MatchedPrefixBlocks: m.Blocks, WorkerId: s.backend.Namespace + "/" + m.Pod})
		resp.BestPrefixBlocks = max(resp.BestPrefixBlocks, m.Blocks)
	}
	return resp, nil
}
