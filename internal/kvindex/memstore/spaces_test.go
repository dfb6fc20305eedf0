package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
)

func loraSpace(i int) kvindex.Space {
	return kvindex.Space{Model: "m", Lora: fmt.Sprintf("lora-%0250d", i), Scheme: storetest.Space.Scheme}
}

// TestEmptySpacesAreDropped (issue 35): a pod under a 10-block namespace
// limit stores and removes one block under 20,000 LoRA names in turn
// (by a remove, a clear and a snapshot). The store keeps no space without
// blocks; before, each name left an empty space behind: 20,000 spaces,
// 14 MB of heap, whatever the block limits.
func TestEmptySpacesAreDropped(t *testing.T) {
	ctx := context.Background()
	s := memstore.NewLimited(kvindex.Limits{PodBlocks: 10, NamespaceBlocks: 10})
	src := storetest.Src("p", 0)
	// Another pod's block keeps the base space alive through it all.
	if _, _, err := s.Apply(ctx, storetest.Src("q", 0), kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, 7)}}); err != nil {
		t.Fatal(err)
	}
	before := heapBytes()
	const names = 20_000
	seq := uint64(0)
	for i := range names {
		sp := loraSpace(i)
		store := kvindex.Op{Kind: kvindex.OpStore, Tier: kvindex.TierGPU, Space: sp, Hashes: []uint64{1}}
		var err error
		switch i % 3 {
		case 0:
			seq++
			_, _, err = s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: seq, Ops: []kvindex.Op{store, {Kind: kvindex.OpRemove, Tier: kvindex.TierGPU, Space: sp, Hashes: []uint64{1}}}})
		case 1:
			seq++
			_, _, err = s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: seq, Ops: []kvindex.Op{store, storetest.Clear(kvindex.TierUnspecified)}})
		case 2:
			if err = s.Replace(ctx, src, kvindex.Position{Epoch: 1, Sequence: seq}, kvindex.SnapshotOf([]kvindex.Entry{{Space: sp, Tier: kvindex.TierCPU, Hash: 1, Refs: 1}})); err == nil {
				err = s.Replace(ctx, src, kvindex.Position{Epoch: 1, Sequence: seq}, kvindex.SnapshotOf(nil))
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	grew := int64(heapBytes()) - int64(before)
	n := memstore.Spaces(s)
	runtime.KeepAlive(s)
	t.Logf("%d LoRA names stored and removed: %d spaces kept, heap grew %d bytes", names, n, grew)
	if n != 1 {
		t.Errorf("%d spaces kept, want 1 (the other pod's)", n)
	}
	if grew > 1<<20 {
		t.Errorf("the heap grew %d bytes, want < 1 MiB", grew)
	}
	if ms, err := s.Score(ctx, storetest.BackendA, storetest.Space, []uint64{7}); err != nil || len(ms) != 1 {
		t.Errorf("the other pod's block: %v, %v", ms, err)
	}
}

// TestNamespaceSpaceLimit: the CacheBackends of a namespace hold at most
// Limits.NamespaceSpaces spaces together; a change storing into more new
// ones is refused whole (scope spaces), another namespace is not
// affected, and a space given back makes room.
func TestNamespaceSpaceLimit(t *testing.T) {
	ctx := context.Background()
	s := memstore.NewLimited(kvindex.Limits{NamespaceSpaces: 3})
	store := func(i int, h uint64) kvindex.Op {
		return kvindex.Op{Kind: kvindex.OpStore, Tier: kvindex.TierGPU, Space: loraSpace(i), Hashes: []uint64{h}}
	}
	if _, _, err := s.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{store(0, 1), store(1, 1), store(1, 2)}}); err != nil {
		t.Fatal(err)
	}
	other := kvindex.Source{Backend: storetest.BackendA2, PodUID: "q"}
	if _, _, err := s.Apply(ctx, other, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{store(2, 1)}}); err != nil {
		t.Fatalf("the third space, in another backend of the namespace: %v", err)
	}
	want := kvindex.LimitError{Scope: kvindex.ScopeSpaces, Limit: 3, Held: 3, Adding: 1}
	_, _, err := s.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: 2, Ops: []kvindex.Op{store(0, 5), store(3, 1)}})
	wantSpaces(t, "a fourth space by delta", err, want)
	err = s.Replace(ctx, other, kvindex.Position{Epoch: 1, Sequence: 1}, kvindex.SnapshotOf([]kvindex.Entry{{Space: loraSpace(4), Tier: kvindex.TierGPU, Hash: 1, Refs: 1}}))
	wantSpaces(t, "a fourth space by snapshot", err, want)
	if pos, _ := s.Positions(ctx, kvindex.PodKey{Backend: storetest.BackendA, UID: "p"}); pos[0].Sequence != 1 {
		t.Errorf("the refused delta moved the position to %v", pos[0])
	}
	// Stores into spaces held pass; another namespace has its own count.
	if _, _, err := s.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: 2, Ops: []kvindex.Op{store(0, 5), store(1, 9)}}); err != nil {
		t.Fatalf("stores into held spaces: %v", err)
	}
	if _, _, err := s.Apply(ctx, kvindex.Source{Backend: storetest.BackendB, PodUID: "r"}, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{store(7, 1)}}); err != nil {
		t.Fatalf("another namespace: %v", err)
	}
	// The other backend gives its space back: one new space fits.
	if _, _, err := s.Apply(ctx, other, kvindex.Delta{Epoch: 1, Sequence: 2, Ops: []kvindex.Op{storetest.Clear(kvindex.TierUnspecified)}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: 3, Ops: []kvindex.Op{store(3, 1)}}); err != nil {
		t.Fatalf("a new space once one was given back: %v", err)
	}
	_, _, err = s.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: 4, Ops: []kvindex.Op{store(4, 1)}})
	wantSpaces(t, "a fourth space again", err, want)
	// p empties space 1 by removals: it goes, and makes room.
	if _, _, err := s.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: 4, Ops: []kvindex.Op{{Kind: kvindex.OpRemove, Tier: kvindex.TierGPU, Space: loraSpace(1), Hashes: []uint64{1, 2, 9}}}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: 5, Ops: []kvindex.Op{store(4, 1)}}); err != nil {
		t.Fatalf("a new space once p emptied one: %v", err)
	}
}

func wantSpaces(t *testing.T, what string, err error, want kvindex.LimitError) {
	t.Helper()
	var le *kvindex.LimitError
	if !errors.As(err, &le) || !errors.Is(err, kvindex.ErrOverLimit) || *le != want {
		t.Fatalf("%s: %v, want %+v", what, err, want)
	}
}
