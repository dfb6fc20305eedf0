package memstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
)

func TestMemStore(t *testing.T) {
	storetest.Run(t, func(*testing.T) kvindex.Store { return memstore.New() })
	storetest.RunLimits(t, func(_ *testing.T, l kvindex.Limits) kvindex.Store { return memstore.NewLimited(l) })
}

// The memory store's bitset walk against a naive model of the same deltas,
// on postings large enough to be kept as bitsets (and shrinking back).
func TestMemStoreScoreMatchesNaiveModel(t *testing.T) {
	s := memstore.New()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	type key struct {
		uid  string
		rank uint32
		h    uint64
		tier kvindex.Tier
	}
	refs := map[key]int{}
	prompt := storetest.Chain(9, 150)
	seqs := map[kvindex.Source]uint64{}
	apply := func(src kvindex.Source, op kvindex.Op) {
		seqs[src]++
		if o, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: seqs[src], Ops: []kvindex.Op{op}}); err != nil || o != kvindex.Applied {
			t.Fatalf("apply: %s %v", o, err)
		}
		for _, h := range op.Hashes {
			k := key{src.PodUID, src.Rank, h, op.Tier}
			if op.Kind == kvindex.OpStore {
				refs[k]++
			} else if refs[k] > 0 {
				refs[k]--
			}
		}
	}
	naive := func(hashes []uint64) map[string]kvindex.Match {
		out := map[string]kvindex.Match{}
		for src := range seqs {
			m := kvindex.Match{PodUID: src.PodUID, Rank: src.Rank}
			alive := [5]bool{true, true, true, true, true}
			for _, h := range hashes {
				in := func(t kvindex.Tier) bool { return refs[key{src.PodUID, src.Rank, h, t}] > 0 }
				g, c, d := in(kvindex.TierGPU), in(kvindex.TierCPU), in(kvindex.TierDisk)
				kinds := [5]bool{g || c || d, g, c, d, g || c}
				ptrs := [5]*uint32{&m.Any, &m.GPU, &m.CPU, &m.Disk, &m.GPUOrCPU}
				for k := range kinds {
					alive[k] = alive[k] && kinds[k]
					if alive[k] {
						*ptrs[k]++
					}
				}
			}
			if m.Any > 0 {
				out[fmt.Sprintf("%s/%d", m.PodUID, m.Rank)] = m
			}
		}
		return out
	}
	check := func(round int) {
		for cut := range 5 {
			q := prompt[:10+cut*35]
			want := naive(q)
			// The walk's sparse phase (the few instances still matching,
			// checked one by one): never (0), from the first block (1000),
			// and past thresholds crossed mid-prompt.
			for _, sparseMax := range []int{0, 1000, 48, 10} {
				restore := memstore.SetSparseMax(sparseMax)
				ms, err := s.Score(ctx, storetest.BackendA, storetest.Space, q)
				restore()
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]kvindex.Match{}
				for _, m := range ms {
					got[fmt.Sprintf("%s/%d", m.PodUID, m.Rank)] = m
				}
				if len(got) != len(want) {
					t.Fatalf("round %d, sparse below %d: %d matches, want %d", round, sparseMax, len(got), len(want))
				}
				for k, w := range want {
					if got[k] != w {
						t.Fatalf("round %d, sparse below %d, %s: got %+v, want %+v", round, sparseMax, k, got[k], w)
					}
				}
			}
		}
	}
	for round := range 6 {
		for range 400 {
			src := storetest.Src(fmt.Sprintf("p%d", rng.IntN(120)), uint32(rng.IntN(2)))
			tier := kvindex.Tier(1 + rng.IntN(3))
			from := rng.IntN(len(prompt))
			n := 1 + rng.IntN(len(prompt)-from)
			if round < 3 || rng.IntN(3) == 0 {
				apply(src, storetest.Store(tier, prompt[:from+n]...))
			} else {
				apply(src, storetest.Remove(tier, prompt[from:from+n]...))
			}
		}
		check(round)
	}
}

// A backend's spaces, slabs, instance table and namespace count go with
// its last pod's lease (issue 25: index state outlived every lease).
func TestMemStoreDropsReapedBackends(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	now := time.Unix(1_800_000_000, 0)
	for i := range 3 {
		b := kvindex.BackendRef{Namespace: fmt.Sprintf("ns-%d", i), Name: "cache"}
		if err := s.PutPod(ctx, kvindex.PodRecord{Backend: b, UID: "p", Name: "p", Model: "m"}, now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Apply(ctx, kvindex.Source{Backend: b, PodUID: "p"}, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, 1, 2)}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := memstore.Backends(s); n != 6 {
		t.Fatalf("3 backends in 3 namespaces: %d entries, want 6", n)
	}
	if gone, err := s.ExpireLeases(ctx, now.Add(2*time.Minute)); err != nil || len(gone) != 3 {
		t.Fatalf("expiring: %v, %v", gone, err)
	}
	if n := memstore.Backends(s); n != 0 {
		t.Errorf("after every pod's lease ended: %d backend and namespace entries, want 0", n)
	}
}
