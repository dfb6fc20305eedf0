package memstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
)

var (
	benchBackend = kvindex.BackendRef{Namespace: "bench", Name: "cache"}
	benchSpace   = kvindex.Space{Model: "m", Scheme: "sha256_cbor/16/vllm-none-hash"}
)

// BenchmarkIngest measures applying deltas in the memory store: each delta
// stores 16 new blocks of a prompt and evicts the 16 stored 4 deltas
// earlier, for one of 100 pods in turn (a steady-state cache).
func BenchmarkIngest(b *testing.B) {
	storetest.BenchIngest(b, memstore.New())
}

// The Score benchmark's index: 1,000 pods × 100,000 GPU blocks each. The
// blocks are prefixes of 32k-token prompts (2,048 blocks of 16 tokens)
// drawn from a pool of 5,000 prompts that share a 64-block system prompt;
// each pod holds 48 whole prompts and the start of a 49th (so a prompt is
// on about 10 pods, and the system prompt on all 1,000). Prompt 0 is on
// every pod (the worst case for a prefix walk).
const (
	benchPods      = 1000
	benchPerPod    = 100_000
	benchPromptLen = 2048
	benchPool      = 5000
	benchSystem    = 64
)

func promptHash(p, i int) uint64 {
	if i < benchSystem {
		return storetest.Splitmix(uint64(i) | 1<<62)
	}
	return storetest.Splitmix(uint64(p)<<20 | uint64(i))
}

func prompt(p int) []uint64 {
	out := make([]uint64, benchPromptLen)
	for i := range out {
		out[i] = promptHash(p, i)
	}
	return out
}

var bigIndex = sync.OnceValues(func() (*memstore.Store, [2]float64) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := memstore.New()
	ctx := context.Background()
	var residencies uint64
	for pod := range benchPods {
		src := kvindex.Source{Backend: benchBackend, PodUID: fmt.Sprintf("pod-%d", pod)}
		var ops []kvindex.Op
		held := map[uint64]bool{}
		add := func(hs []uint64) {
			ops = append(ops, kvindex.Op{Kind: kvindex.OpStore, Tier: kvindex.TierGPU, Space: benchSpace, Hashes: hs})
			for _, h := range hs {
				held[h] = true
			}
		}
		add(prompt(0))
		for k := 1; len(held) < benchPerPod; k++ {
			p := 1 + int(storetest.Splitmix(uint64(pod)<<16|uint64(k))%(benchPool-1))
			hs := prompt(p)
			if room := benchPerPod - len(held); room < len(hs)-benchSystem {
				hs = hs[:benchSystem+room]
			}
			add(hs)
		}
		residencies += uint64(len(held))
		if o, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: ops}); err != nil || o != kvindex.Applied {
			panic(fmt.Sprintf("building the index: %s, %v", o, err))
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	return s, [2]float64{float64(residencies), float64(after.HeapAlloc-before.HeapAlloc) / float64(residencies)}
})

// BenchmarkScore measures Score for a 32k-token prompt (2,048 block
// hashes) against the index above, reporting p50 and p99 latency and the
// heap bytes per indexed block residency.
func BenchmarkScore(b *testing.B) {
	s, mem := bigIndex()
	ctx := context.Background()
	queries := map[string]func(i int) []uint64{
		// A pool prompt: a full match on ~10 pods, the system prompt on all.
		"typical": func(i int) []uint64 { return prompt(1 + int(storetest.Splitmix(uint64(i))%(benchPool-1))) },
		// A new prompt: the system prompt on all pods, then nothing.
		"miss-after-system-prompt": func(i int) []uint64 { return prompt(benchPool + i) },
		// Prompt 0: every pod holds all 2,048 blocks.
		"on-every-pod": func(int) []uint64 { return prompt(0) },
	}
	for _, name := range []string{"typical", "miss-after-system-prompt", "on-every-pod"} {
		gen := queries[name]
		b.Run(name, func(b *testing.B) {
			qs := make([][]uint64, 64)
			for i := range qs {
				qs[i] = gen(i)
			}
			storetest.BenchLatency(b, func(i int) error {
				ms, err := s.Score(ctx, benchBackend, benchSpace, qs[i%len(qs)])
				if err != nil || len(ms) == 0 {
					return fmt.Errorf("score: %d matches, %w", len(ms), err)
				}
				return nil
			})
			b.ReportMetric(mem[1], "B/residency")
			b.ReportMetric(mem[0], "residencies")
		})
	}
}
