package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/redisstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/test/testutil/redisserver"
)

// startRedis runs a real redis-server for the test (redisserver.Start).
func startRedis(t testing.TB) string { return redisserver.Start(t) }

func newStore(t testing.TB, addr string) *redisstore.Store {
	t.Helper()
	s := redisstore.New(redis.NewClient(&redis.Options{Addr: addr}))
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestRedisStore(t *testing.T) {
	addr := startRedis(t)
	storetest.Run(t, func(t *testing.T) kvindex.Store {
		c := redis.NewClient(&redis.Options{Addr: addr})
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		return newStore(t, addr)
	})
	storetest.RunLimits(t, func(t *testing.T, l kvindex.Limits) kvindex.Store {
		flush(t, addr)
		s := redisstore.NewWithOptions(redis.NewClient(&redis.Options{Addr: addr}), redisstore.Options{Limits: l})
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func flush(t testing.TB, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// A delta delivered to two replicas at once (a subscriber that reconnected
// elsewhere and resent its journal) is applied exactly once.
func TestReplayedDeltaAppliedOnceAcrossReplicas(t *testing.T) {
	for _, r := range targets(t) {
		t.Run(r.name, func(t *testing.T) {
			a, b := r.store(t, redisstore.Options{}), r.store(t, redisstore.Options{})
			ctx := context.Background()
			src := storetest.Src("p1", 0)
			var mu sync.Mutex
			outcomes := map[kvindex.Outcome]int{}
			var wg sync.WaitGroup
			for seq := uint64(1); seq <= 50; seq++ {
				d := kvindex.Delta{Epoch: 1, Sequence: seq, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, 7)}}
				// Each delta goes to both replicas, racing; deltas stay in order per replica.
				for _, s := range []*redisstore.Store{a, b} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for try := 0; ; try++ {
							if try == 500 {
								t.Errorf("delta %d never applied: neither applied nor duplicate after %d tries", d.Sequence, try)
								return
							}
							o, _, err := s.Apply(ctx, src, d)
							if err != nil {
								t.Error(err)
								return
							}
							if o != kvindex.NeedSnapshot { // the other replica has not applied seq-1 yet
								mu.Lock()
								outcomes[o]++
								mu.Unlock()
								return
							}
							time.Sleep(time.Millisecond)
						}
					}()
				}
				wg.Wait()
			}
			if outcomes[kvindex.Applied] != 50 || outcomes[kvindex.Duplicate] != 50 {
				t.Fatalf("outcomes %v, want 50 applied and 50 duplicates", outcomes)
			}
			// Block 7 was stored 50 times: 50 references, one residency.
			tiers, _ := a.TierBlocks(ctx, storetest.BackendA)
			if tiers[kvindex.TierGPU] != 1 {
				t.Fatalf("GPU residencies %d, want 1", tiers[kvindex.TierGPU])
			}
			for seq := uint64(51); seq <= 99; seq++ {
				if o, _, _ := b.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: seq, Ops: []kvindex.Op{storetest.Remove(kvindex.TierGPU, 7)}}); o != kvindex.Applied {
					t.Fatalf("removal %d: %s", seq, o)
				}
			}
			if ms, _ := a.Score(ctx, storetest.BackendA, storetest.Space, []uint64{7}); len(ms) != 1 {
				t.Fatalf("after 49 of 50 removals the block is gone: %v", ms)
			}
			if o, _, _ := a.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 100, Ops: []kvindex.Op{storetest.Remove(kvindex.TierGPU, 7)}}); o != kvindex.Applied {
				t.Fatal(o)
			}
			if ms, _ := b.Score(ctx, storetest.BackendA, storetest.Space, []uint64{7}); len(ms) != 0 {
				t.Fatalf("after 50 removals the block is still held: %v", ms)
			}
		})
	}
}

// Two index replicas on one Redis answer every query identically, and the
// same as an index on the memory store fed the same deltas.
func TestTwoReplicasScoreIdentically(t *testing.T) {
	for _, r := range targets(t) {
		t.Run(r.name, func(t *testing.T) {
			ctx := context.Background()
			now := time.Unix(1_800_000_000, 0)
			clock := func() time.Time { return now }
			replicas := []*kvindex.Index{
				kvindex.New(kvindex.Options{Store: r.store(t, redisstore.Options{}), Now: clock}),
				kvindex.New(kvindex.Options{Store: r.store(t, redisstore.Options{}), Now: clock}),
			}
			ref := kvindex.New(kvindex.Options{Store: memstore.New(), Now: clock})
			caller := kvindex.Caller{Anonymous: true}

			// 20 pods, 2 ranks each, prompts sharing prefixes; pod i streams to
			// replica i%2, and after half its deltas reconnects to the other
			// replica and resends the last 3 (duplicates).
			prompts := make([][]uint64, 8)
			for i := range prompts {
				prompts[i] = append(slices.Clone(storetest.Chain(100, 4)), storetest.Chain(uint64(i+1), 60)...)
			}
			for pod := range 20 {
				var msgs []*pb.IngestRequest
				for rank := range uint32(2) {
					seq := uint64(0)
					for k := range 10 {
						p := prompts[(pod+k+int(rank))%len(prompts)]
						n := 8 + (pod*7+k*13)%50
						tier := pb.Tier(1 + (pod+k)%3)
						events := []*pb.BlockEvent{{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{BlockHashes: p[:n], Tier: tier}}}}
						if k%4 == 3 {
							events = append(events, &pb.BlockEvent{Event: &pb.BlockEvent_Removed{Removed: &pb.BlockRemoved{BlockHashes: p[n/2 : n/2+3], Tier: tier}}})
						}
						seq++
						msgs = append(msgs, &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Rank: rank, Epoch: 1, Sequence: seq, Events: events}}})
					}
				}
				hello := &pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
					ProtocolVersion: 1, Model: "m", DataParallelSize: 2,
					Pod:          &pb.PodIdentity{Namespace: "team-a", Name: fmt.Sprintf("vllm-%d", pod), Uid: fmt.Sprintf("uid-%d", pod)},
					CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"},
					HashScheme:   &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 16},
				}}}
				feed := func(ix *kvindex.Index, ms []*pb.IngestRequest) {
					t.Helper()
					s := ix.NewSession(caller, nil)
					defer s.Close()
					for _, m := range append([]*pb.IngestRequest{hello}, ms...) {
						out, err := s.Handle(ctx, proto.Clone(m).(*pb.IngestRequest))
						if err != nil {
							t.Fatal(err)
						}
						for _, o := range out {
							if o.GetResync() != nil {
								t.Fatalf("pod %d: unexpected %v", pod, o)
							}
						}
					}
				}
				half := len(msgs) / 2
				feed(replicas[pod%2], msgs[:half])
				feed(replicas[(pod+1)%2], msgs[half-3:])
				feed(ref, msgs)
			}

			for qi, q := range prompts {
				req := &pb.ScoreRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}, Model: "m", BlockHashes: q}
				want, err := ref.Score(ctx, caller, req)
				if err != nil {
					t.Fatal(err)
				}
				if len(want.GetPods()) == 0 {
					t.Fatalf("query %d matches nothing: the test data is wrong", qi)
				}
				for i, r := range replicas {
					got, err := r.Score(ctx, caller, req)
					if err != nil {
						t.Fatal(err)
					}
					if !proto.Equal(got, want) {
						t.Fatalf("query %d on replica %d:\n got %v\nwant %v", qi, i, got, want)
					}
				}
			}
			for _, r := range replicas {
				sum, err := r.Participation(ctx, caller, &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}})
				if err != nil {
					t.Fatal(err)
				}
				wantSum, _ := ref.Participation(ctx, caller, &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}})
				if !proto.Equal(sum.Blocks[0], wantSum.Blocks[0]) || sum.GetPods() != 20 || !slices.EqualFunc(sum.GetBlocks(), wantSum.GetBlocks(), func(a, b *pb.TierBlocks) bool { return proto.Equal(a, b) }) {
					t.Fatalf("participation blocks %v, want %v", sum.GetBlocks(), wantSum.GetBlocks())
				}
			}
		})
	}
}

// BenchmarkIngest is the ingest benchmark on a real redis-server: one Lua
// script per delta, one round trip each, from one client.
func BenchmarkIngest(b *testing.B) {
	addr := startRedis(b)
	storetest.BenchIngest(b, newStore(b, addr))
}
