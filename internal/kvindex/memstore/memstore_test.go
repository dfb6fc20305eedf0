package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
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

// heapBytes is the live heap after a collection, in bytes.
func heapBytes() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// pushBlocks stores n fresh blocks for one pod in deltas of per hashes,
// as a publisher that never evicts would, and returns the heap growth,
// the blocks held and the deltas refused.
func pushBlocks(t *testing.T, s kvindex.Store, n, per int) (grew int64, held uint64, refused int) {
	t.Helper()
	ctx := context.Background()
	src := storetest.Src("greedy", 0)
	before := heapBytes()
	seq := uint64(0)
	for start := 0; start < n; start += per {
		hashes := make([]uint64, per)
		for i := range hashes {
			hashes[i] = rand.Uint64()
		}
		_, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: seq + 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierDisk, hashes...)}})
		switch {
		case errors.Is(err, kvindex.ErrOverLimit):
			refused++
		case err != nil:
			t.Fatal(err)
		default:
			seq++
		}
	}
	grew = int64(heapBytes()) - int64(before)
	held, _ = s.PodBlocks(ctx, kvindex.PodKey{Backend: storetest.BackendA, UID: "greedy"})
	runtime.KeepAlive(s)
	return grew, held, refused
}

// MaxBytesPerBlock is the heap budget of one block of one pod in the
// memory store that cmd/cache-index's default limits are sized from
// (docs/kvindex.md): its default namespace limit times this fits the
// index's 1 GiB container limit with room for map growth and queries.
const maxBytesPerBlock = 64

// TestPodBlockLimitBoundsTheHeap: issue 25 found one pod holding 5 M
// blocks, no cap. A pod pushing 1,000,000 fresh blocks into a store with
// a 100,000-block pod limit is refused past it and the heap holds the
// limit's worth; unlimited, the same pod grows the heap by the million.
func TestPodBlockLimitBoundsTheHeap(t *testing.T) {
	const pushed, per, limit = 1_000_000, 10_000, 100_000
	grewFree, heldFree, _ := pushBlocks(t, memstore.New(), pushed, per)
	perBlock := float64(grewFree) / float64(heldFree)
	t.Logf("unlimited: %d blocks held, heap grew %d bytes (%.1f B/block)", heldFree, grewFree, perBlock)
	if perBlock > maxBytesPerBlock {
		t.Errorf("%.1f heap bytes per block, over the %d the default limits are sized from", perBlock, maxBytesPerBlock)
	}
	grew, held, refused := pushBlocks(t, memstore.NewLimited(kvindex.Limits{PodBlocks: limit}), pushed, per)
	t.Logf("pod limit %d: %d blocks held, %d deltas refused, heap grew %d bytes", limit, held, refused, grew)
	if held != limit || refused != (pushed-limit)/per {
		t.Errorf("held %d blocks with %d deltas refused, want %d held and %d refused", held, refused, limit, (pushed-limit)/per)
	}
	if budget := int64(limit * maxBytesPerBlock); grew > budget {
		t.Errorf("the heap grew %d bytes under a %d-block pod limit, want at most %d", grew, limit, budget)
	}
}
