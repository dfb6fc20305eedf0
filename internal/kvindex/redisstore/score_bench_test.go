package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/redisstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
)

// The Score benchmark's index, at issue 38's sizes: 100 pods × 20,000 GPU
// blocks. The blocks are prefixes of 32k-token prompts (2,048 blocks of 16
// tokens) from a pool of 100 prompts sharing a 64-block system prompt;
// each pod holds prompt 0 and 8 more whole prompts and the start of a
// 10th (so a pool prompt is on about 9 pods, the system prompt on all
// 100), and prompt 0 is on every pod.
const (
	scorePods      = 100
	scorePerPod    = 20_000
	scorePromptLen = 2048
	scorePool      = 100
	scoreSystem    = 64
)

func scorePrompt(p int) []uint64 {
	out := make([]uint64, scorePromptLen)
	for i := range out {
		if i < scoreSystem {
			out[i] = storetest.Splitmix(uint64(i) | 1<<62)
		} else {
			out[i] = storetest.Splitmix(uint64(p)<<20 | uint64(i))
		}
	}
	return out
}

// scoreDeltas are the pods' deltas that build the index, one per pod.
func scoreDeltas() []kvindex.Delta {
	out := make([]kvindex.Delta, scorePods)
	for pod := range scorePods {
		held := map[uint64]bool{}
		var ops []kvindex.Op
		add := func(hs []uint64) {
			ops = append(ops, storetest.Store(kvindex.TierGPU, hs...))
			for _, h := range hs {
				held[h] = true
			}
		}
		add(scorePrompt(0))
		for k := 1; len(held) < scorePerPod; k++ {
			hs := scorePrompt(1 + int(storetest.Splitmix(uint64(pod)<<16|uint64(k))%(scorePool-1)))
			if room := scorePerPod - len(held); room < len(hs)-scoreSystem {
				hs = hs[:scoreSystem+room]
			}
			add(hs)
		}
		out[pod] = kvindex.Delta{Epoch: 1, Sequence: 1, Ops: ops}
	}
	return out
}

// BenchmarkScoreRedis measures Score for a 2,048-block prompt on the index
// above held in one real redis-server, answered by a replica's read model
// ("read-model", the default; "read-model-lag-100ms" with
// Options.ReadModelMaxLag 100 ms) and block by block from the placements
// ("placements", Options.NoReadModel), against the memory store holding
// the same blocks ("memory"); p50 and p99 latency, wall clock and the
// querying thread's CPU time.
func BenchmarkScoreRedis(b *testing.B) {
	ctx := context.Background()
	addr := startRedis(b)
	deltas := scoreDeltas()
	mem := memstore.New()
	writer := redisstore.New(redis.NewClient(&redis.Options{Addr: addr}))
	defer writer.Close()
	var wg sync.WaitGroup
	work := make(chan int)
	errs := make(chan error, scorePods)
	for range 4 {
		wg.Go(func() {
			for pod := range work {
				src := kvindex.Source{Backend: storetest.BackendA, PodUID: fmt.Sprintf("pod-%d", pod)}
				if _, _, err := writer.Apply(ctx, src, deltas[pod]); err != nil {
					errs <- err
				}
			}
		})
	}
	for pod := range scorePods {
		work <- pod
		src := kvindex.Source{Backend: storetest.BackendA, PodUID: fmt.Sprintf("pod-%d", pod)}
		if _, _, err := mem.Apply(ctx, src, deltas[pod]); err != nil {
			b.Fatal(err)
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	stores := []struct {
		name  string
		store kvindex.Store
	}{
		{"memory", mem},
		{"read-model", redisstore.New(redis.NewClient(&redis.Options{Addr: addr}))},
		{"read-model-lag-100ms", redisstore.NewWithOptions(redis.NewClient(&redis.Options{Addr: addr}), redisstore.Options{ReadModelMaxLag: 100 * time.Millisecond})},
		{"placements", redisstore.NewWithOptions(redis.NewClient(&redis.Options{Addr: addr}), redisstore.Options{NoReadModel: true})},
	}
	queries := []struct {
		name string
		gen  func(i int) []uint64
		want int // pods matching at least the first block
	}{
		{"typical", func(i int) []uint64 { return scorePrompt(1 + i%(scorePool-1)) }, scorePods},
		{"on-every-pod", func(int) []uint64 { return scorePrompt(0) }, scorePods},
	}
	for _, q := range queries {
		qs := make([][]uint64, 64)
		for i := range qs {
			qs[i] = q.gen(i)
		}
		for _, st := range stores {
			b.Run(q.name+"/"+st.name, func(b *testing.B) {
				// The first query of a replica waits for the backend to be
				// read into its model (cache-index does that before it is
				// ready: Store.Preload): not timed.
				if ms, err := st.store.Score(ctx, storetest.BackendA, storetest.Space, qs[0]); err != nil || len(ms) != q.want {
					b.Fatalf("score: %d matches, %v; want %d", len(ms), err, q.want)
				}
				storetest.BenchLatency(b, func(i int) error {
					ms, err := st.store.Score(ctx, storetest.BackendA, storetest.Space, qs[i%len(qs)])
					if err != nil || len(ms) != q.want {
						return fmt.Errorf("score: %d matches, %w; want %d", len(ms), err, q.want)
					}
					return nil
				})
			})
		}
	}
}

// BenchmarkPodsRedis measures Pods, which every query of the index asks
// before Score, for a backend of 100 pods: the memory store, a replica's
// read model (the default), and the records read from Redis
// (Options.NoReadModel).
func BenchmarkPodsRedis(b *testing.B) {
	ctx := context.Background()
	addr := startRedis(b)
	mem := memstore.New()
	writer := redisstore.New(redis.NewClient(&redis.Options{Addr: addr}))
	defer writer.Close()
	for i := range scorePods {
		rec := kvindex.PodRecord{Backend: storetest.BackendA, UID: fmt.Sprintf("pod-%d", i), Name: fmt.Sprintf("vllm-%d", i), Model: "meta-llama/Llama-3.1-8B-Instruct",
			Engine: "vllm", Scheme: "sha256_cbor/16/vllm-none-hash", BlockSize: 16, DPSize: 1, Address: fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256),
			LastSeen: time.Now(), Ranks: []kvindex.RankHealth{{Rank: 0, State: 1, EventsTotal: 123456, LagP50Millis: 2, LagP99Millis: 9}}}
		for _, s := range []kvindex.Store{mem, writer} {
			if err := s.PutPod(ctx, rec, time.Now().Add(time.Hour)); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, st := range []struct {
		name  string
		store kvindex.Store
	}{
		{"memory", mem},
		{"read-model", redisstore.New(redis.NewClient(&redis.Options{Addr: addr}))},
		{"records", redisstore.NewWithOptions(redis.NewClient(&redis.Options{Addr: addr}), redisstore.Options{NoReadModel: true})},
	} {
		b.Run(st.name, func(b *testing.B) {
			storetest.BenchLatency(b, func(int) error {
				recs, err := st.store.Pods(ctx, storetest.BackendA)
				if err != nil || len(recs) != scorePods {
					return fmt.Errorf("pods: %d records, %w; want %d", len(recs), err, scorePods)
				}
				return nil
			})
		})
	}
}
