package kvindex_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// TestTokenQueriesScoreLMCacheChunks (issue 36): LMCache's multiprocess
// connector publishes its CPU chunks (256 tokens, blake3) through the
// engine's publisher. Before, they sat in the engine's sha256_cbor space,
// where no token query could match them: a prompt the pod holds only in
// LMCache's CPU tier scored nothing. With the tier scheme announced, the
// index keeps them in their own space, hashes the tokens again with it,
// and counts the chunk prefix in the pod's own blocks, merged with its GPU
// prefix.
func TestTokenQueriesScoreLMCacheChunks(t *testing.T) {
	const bs, chunk = 16, 256
	prompt := make([]uint32, 3*chunk)
	for i := range prompt {
		prompt[i] = uint32(70000 + i)
	}
	gpu, err := kvindex.HashTokens("sha256_cbor", "vllm-none-hash", bs, prompt[:2*bs])
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := kvindex.HashChunks(chunk, prompt[:2*chunk])
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		announce  bool
		gpuBlocks []uint64 // the pod's GPU blocks of the prompt
		want      *pb.PodScore
	}{
		{"chunks only, tier scheme announced", true, nil,
			&pb.PodScore{MatchedBlocks: 32, MatchedTokens: 512, Tiers: &pb.TierMatch{Gpu: 0, Cpu: 32, Disk: 32}}},
		{"chunks and a shorter GPU prefix", true, gpu,
			&pb.PodScore{MatchedBlocks: 32, MatchedTokens: 512, Tiers: &pb.TierMatch{Gpu: 2, Cpu: 32, Disk: 32}}},
		{"no tier scheme: the GPU prefix alone", false, gpu,
			&pb.PodScore{MatchedBlocks: 2, MatchedTokens: 32, Tiers: &pb.TierMatch{Gpu: 2, Cpu: 2, Disk: 2}}},
		{"no tier scheme, chunks only: nothing", false, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var tier *pb.HashScheme
			if tc.announce {
				tier = &pb.HashScheme{Algorithm: "lmcache_blake3", BlockSize: chunk}
			}
			ix, s := verifiedSession(t, tier)
			events := []*pb.BlockEvent{{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{Tier: pb.Tier_TIER_CPU, BlockSize: chunk, BlockHashes: chunks}}}}
			if tc.gpuBlocks != nil {
				events = append(events, &pb.BlockEvent{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{Tier: pb.Tier_TIER_GPU, BlockSize: bs, BlockHashes: tc.gpuBlocks}}})
			}
			if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Epoch: 1, Sequence: 1, Events: events}}}); err != nil {
				t.Fatal(err)
			}
			resp, err := ix.Score(ctx, kvindex.Caller{Namespace: "team-a"}, &pb.ScoreRequest{
				CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}, Model: "m", TokenIds: prompt})
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if len(resp.GetPods()) != 0 {
					t.Fatalf("pods %v, want none", resp.GetPods())
				}
				return
			}
			if len(resp.GetPods()) != 1 {
				t.Fatalf("pods %v, want the one pod", resp.GetPods())
			}
			got := resp.GetPods()[0]
			if got.GetMatchedBlocks() != tc.want.MatchedBlocks || got.GetMatchedTokens() != tc.want.MatchedTokens ||
				got.GetTiers().GetGpu() != tc.want.Tiers.Gpu || got.GetTiers().GetCpu() != tc.want.Tiers.Cpu || got.GetTiers().GetDisk() != tc.want.Tiers.Disk {
				t.Fatalf("score %v, want %v", got, tc.want)
			}
			sum, err := ix.Participation(ctx, kvindex.Caller{Anonymous: true}, &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}})
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{true: "lmcache_blake3/256/"}[tc.announce]; sum.GetTierScheme() != want {
				t.Fatalf("summary tier scheme %q, want %q", sum.GetTierScheme(), want)
			}
			// A removal of a CPU chunk takes it out of the chunk space.
			if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Epoch: 1, Sequence: 2, Events: []*pb.BlockEvent{
				{Event: &pb.BlockEvent_Removed{Removed: &pb.BlockRemoved{Tier: pb.Tier_TIER_CPU, BlockHashes: chunks[:1]}}}}}}}); err != nil {
				t.Fatal(err)
			}
			resp, err = ix.Score(ctx, kvindex.Caller{Namespace: "team-a"}, &pb.ScoreRequest{
				CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}, Model: "m", TokenIds: prompt})
			if err != nil {
				t.Fatal(err)
			}
			if wantAfter := uint32(len(tc.gpuBlocks)); len(resp.GetPods()) > 0 && resp.GetPods()[0].GetMatchedBlocks() != wantAfter ||
				len(resp.GetPods()) == 0 && wantAfter != 0 {
				t.Fatalf("after the first chunk's removal: %v, want %d blocks", resp.GetPods(), wantAfter)
			}
		})
	}
}

// TestTierSchemesTheIndexCannotHashAreRefused: a hello's tier scheme is
// admitted only as LMCache's blake3 chunks whose chunk is a whole number
// of the engine's blocks (LMCache's connector refuses anything else), so
// that hashing a token query in it costs no more than in the engine's own
// scheme; anything else ends the stream with InvalidArgument naming the
// field.
func TestTierSchemesTheIndexCannotHashAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tier  *pb.HashScheme
		field string // "" = admitted
	}{
		{"LMCache chunks of 256", &pb.HashScheme{Algorithm: "lmcache_blake3", BlockSize: 256}, ""},
		{"another algorithm", &pb.HashScheme{Algorithm: "xxhash", BlockSize: 256}, "tier_scheme.algorithm"},
		{"no chunk size", &pb.HashScheme{Algorithm: "lmcache_blake3"}, "tier_scheme.block_size"},
		{"a chunk smaller than a block", &pb.HashScheme{Algorithm: "lmcache_blake3", BlockSize: 8}, "tier_scheme.block_size"},
		{"a chunk not a multiple of the block", &pb.HashScheme{Algorithm: "lmcache_blake3", BlockSize: 40}, "tier_scheme.block_size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := kvindex.New(kvindex.Options{Store: memstore.New()})
			s := ix.NewSession(podCaller, func() {})
			defer s.Close()
			h := helloOf(1, "cache") // block size 16
			h.GetHello().TierScheme = tc.tier
			_, err := s.Handle(context.Background(), h)
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.field != "" && (!errors.Is(err, kvindex.ErrInvalid) || !strings.Contains(err.Error(), tc.field)):
				t.Fatalf("err = %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
}
