package kvindex_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// allocated is the bytes fn allocates.
func allocated(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// verifiedSession opens a memory-store index and the stream of a pod of
// team-a/cache whose sha256_cbor scheme is Verified, with the other tiers'
// scheme tier (nil for none).
func verifiedSession(t *testing.T, tier *pb.HashScheme) (*kvindex.Index, *kvindex.Session) {
	t.Helper()
	ix := kvindex.New(kvindex.Options{Store: memstore.New()})
	s := ix.NewSession(podCaller, func() {})
	t.Cleanup(s.Close)
	h := helloOf(1, "cache")
	h.GetHello().HashCompatibility = pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED
	h.GetHello().TierScheme = tier
	if _, err := s.Handle(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	return ix, s
}

// TestQueryPromptIsBounded (issue 25, left open in round two): a query of
// 1,000,000 token IDs made the index hash every 16-token block (about
// 2 s of CPU); past MaxQueryTokens tokens, or MaxQueryHashes block
// hashes, a query is refused with InvalidArgument naming the field before
// any hashing, so it allocates next to nothing; a prompt at the bound is
// answered.
func TestQueryPromptIsBounded(t *testing.T) {
	ctx := context.Background()
	ix, s := verifiedSession(t, nil)
	tokens := make([]uint32, 1_000_000)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	first, err := kvindex.HashTokens("sha256_cbor", "vllm-none-hash", 16, tokens[:16])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Epoch: 1, Sequence: 1, Events: []*pb.BlockEvent{
		{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{Tier: pb.Tier_TIER_GPU, BlockHashes: first}}},
	}}}}); err != nil {
		t.Fatal(err)
	}
	ref := &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}
	reader := kvindex.Caller{Namespace: "team-a"}
	for _, q := range []struct {
		field string
		req   *pb.ScoreRequest
	}{
		{"token_ids", &pb.ScoreRequest{CacheBackend: ref, Model: "m", TokenIds: tokens}},
		{"block_hashes", &pb.ScoreRequest{CacheBackend: ref, Model: "m", BlockHashes: make([]uint64, kvindex.MaxQueryHashes+1)}},
	} {
		var err error
		bytes := allocated(func() { _, err = ix.Score(ctx, reader, q.req) })
		t.Logf("a query of %d tokens and %d hashes allocated %d bytes: %.120v", len(q.req.TokenIds), len(q.req.BlockHashes), bytes, err)
		if !errors.Is(err, kvindex.ErrInvalid) || !strings.Contains(err.Error(), q.field) {
			t.Errorf("%s over the bound: %.200v, want InvalidArgument naming %s", q.field, err, q.field)
		}
		if bytes > 64<<10 {
			t.Errorf("%s over the bound: the query allocated %d bytes, want < 64 KiB", q.field, bytes)
		}
	}
	resp, err := ix.Score(ctx, reader, &pb.ScoreRequest{CacheBackend: ref, Model: "m", TokenIds: tokens[:kvindex.MaxQueryTokens]})
	if err != nil || len(resp.GetPods()) != 1 || resp.GetPods()[0].GetMatchedBlocks() != 1 || resp.GetQueryBlocks() != kvindex.MaxQueryTokens/16 {
		t.Fatalf("a prompt at the bound: %v, %v", resp, err)
	}
}
