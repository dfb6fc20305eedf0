package subscriber

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/operator/internal/kvevent/hashcheck"
	"github.com/inferencecache/operator/internal/kvevent/wire/wiretest"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// TestOtherTiersAreNotCheckedAgainstTheEnginesHash (issue 36): LMCache's
// MP connector publishes its CPU chunks through vLLM's publisher, as
// LMCache 0.5.6 builds them (_build_store_kv_events: one BlockStored per
// chunk, block_size its chunk size of 256, the chunk's token IDs, a
// blake3 chunk hash, medium "CPU", no parent for the first chunk). Before,
// the rank checked that chunk against vLLM's sha256_cbor block hash and
// reported the pod hash Mismatch (so the index scored none of its GPU
// blocks by token IDs); now only the engine's own GPU-tier events are
// checked and set the block size, and the CPU chunk is mirrored under its
// tier.
func TestOtherTiersAreNotCheckedAgainstTheEnginesHash(t *testing.T) {
	out := make(chan *Delta, 8)
	r := NewRank(Config{Scheme: hashcheck.Scheme{Algorithm: "sha256_cbor", Seeds: []string{hashcheck.SeedVLLM}}}, logr.Discard(), NewMetrics(prometheus.NewRegistry()), out)
	gpuTokens := make([]uint32, 64)
	for i := range gpuTokens {
		gpuTokens[i] = uint32(1000 + i)
	}
	d, _, err := hashcheck.BlockDigest(hashcheck.NoneHash(hashcheck.SeedVLLM), gpuTokens, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]uint32, 256)
	for i := range chunk {
		chunk[i] = uint32(5000 + i)
	}
	f := wiretest.Format{Engine: wiretest.VLLM, Gen: wiretest.GenSpec, MapEvents: true}
	payload := f.EncodeBatch(wiretest.Batch{TS: 1, Events: []any{
		wiretest.Stored{Hashes: []any{uint64(0x9e3779b97f4a7c15)}, Tokens: chunk, BlockSize: 256, Medium: "CPU"},
		wiretest.Stored{Hashes: []any{hashcheck.Low64(d)}, Tokens: gpuTokens, BlockSize: 64, Medium: "GPU"},
	}})
	r.apply(1, payload, "live")
	if got := r.HashCompatibility(); got != pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED {
		t.Fatalf("hash compatibility %v after an LMCache CPU chunk and a valid GPU block; want Verified", got)
	}
	if got := r.BlockSize(); got != 64 {
		t.Fatalf("block size %d; want the GPU block's 64, not the CPU chunk's 256", got)
	}
	tiers := map[pb.Tier]int{}
	for n := len(out); n > 0; n-- {
		for _, ev := range (<-out).Events {
			if s := ev.GetStored(); s != nil {
				tiers[s.GetTier()] += len(s.GetBlockHashes())
			}
		}
	}
	if tiers[pb.Tier_TIER_CPU] != 1 || tiers[pb.Tier_TIER_GPU] != 1 {
		t.Fatalf("forwarded stored blocks by tier %v; want one CPU chunk and one GPU block", tiers)
	}
}
