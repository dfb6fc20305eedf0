package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/inferencecache/operator/internal/kvindex"
)

// BackendA2 is a second backend in BackendA's namespace.
var BackendA2 = kvindex.BackendRef{Namespace: BackendA.Namespace, Name: "cache-2"}

// RunLimits runs the block-limit cases against stores made by newStore
// with the given limits (each call a fresh, empty store).
func RunLimits(t *testing.T, newStore func(t *testing.T, l kvindex.Limits) kvindex.Store) {
	t.Run("pod limit", func(t *testing.T) { podLimit(t, newStore(t, kvindex.Limits{PodBlocks: 4})) })
	t.Run("backend limit", func(t *testing.T) { backendLimit(t, newStore(t, kvindex.Limits{BackendBlocks: 5})) })
	t.Run("namespace limit", func(t *testing.T) { namespaceLimit(t, newStore(t, kvindex.Limits{NamespaceBlocks: 5})) })
}

// wantOver checks that err is the refusal of scope with limit, held and
// adding as the Limits doc defines them.
func wantOver(t *testing.T, what string, err error, want kvindex.LimitError) {
	t.Helper()
	var le *kvindex.LimitError
	if !errors.Is(err, kvindex.ErrOverLimit) || !errors.As(err, &le) {
		t.Fatalf("%s: error %v, want a *LimitError", what, err)
	}
	if *le != want {
		t.Fatalf("%s: %+v, want %+v", what, *le, want)
	}
}

func podBlocks(t *testing.T, s kvindex.Store, b kvindex.BackendRef, uid string) uint64 {
	t.Helper()
	n, err := s.PodBlocks(context.Background(), kvindex.PodKey{Backend: b, UID: uid})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func podLimit(t *testing.T, s kvindex.Store) {
	ctx := context.Background()
	src := Src("p1", 0)
	applyAll(t, s, src, []kvindex.Op{Store(kvindex.TierGPU, 1, 2, 3)})
	// Two hashes could be new: 3 + 2 > 4, refused whole.
	_, pos, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 2, Ops: []kvindex.Op{Store(kvindex.TierGPU, 4), Store(kvindex.TierCPU, 5)}})
	wantOver(t, "delta past the pod limit", err, kvindex.LimitError{Scope: kvindex.ScopePod, Limit: 4, Held: 3, Adding: 2})
	if pos != (kvindex.Position{Epoch: 1, Sequence: 1}) {
		t.Errorf("refused delta moved the position to %+v", pos)
	}
	if ps, _ := s.Positions(ctx, kvindex.PodKey{Backend: BackendA, UID: "p1"}); ps[0] != (kvindex.Position{Epoch: 1, Sequence: 1}) {
		t.Errorf("refused delta moved the stored position to %+v", ps[0])
	}
	if n := podBlocks(t, s, BackendA, "p1"); n != 3 {
		t.Errorf("refused delta changed the pod's blocks to %d", n)
	}
	if m := scoreOf(t, s, BackendA, []uint64{4}); len(m) != 0 {
		t.Errorf("refused delta's block answers: %+v", m)
	}
	// The same sequence within the limit applies (the refusal did not
	// consume it), and the limit counts other ranks of the pod.
	applyAll(t, s, src, []kvindex.Op{Store(kvindex.TierGPU, 4)})
	_, _, err = s.Apply(ctx, Src("p1", 1), kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{Store(kvindex.TierGPU, 9)}})
	wantOver(t, "another rank past the pod limit", err, kvindex.LimitError{Scope: kvindex.ScopePod, Limit: 4, Held: 4, Adding: 1})
	// A restart drops the rank's own blocks first: they do not count.
	if o, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 2, Sequence: 1, Ops: []kvindex.Op{Store(kvindex.TierGPU, 11, 12, 13, 14)}}); err != nil || o != kvindex.Applied {
		t.Fatalf("restart within the limit: %s, %v", o, err)
	}
	// A snapshot: 5 distinct blocks do not fit, 4 blocks in 8 entries do.
	var five, eight []kvindex.Entry
	for h := range uint64(5) {
		five = append(five, kvindex.Entry{Space: Space, Tier: kvindex.TierGPU, Hash: 20 + h, Refs: 1})
	}
	for h := range uint64(4) {
		for _, tier := range []kvindex.Tier{kvindex.TierCPU, kvindex.TierDisk} {
			eight = append(eight, kvindex.Entry{Space: Space, Tier: tier, Hash: 30 + h, Refs: 1})
		}
	}
	err = s.Replace(ctx, src, kvindex.Position{Epoch: 2, Sequence: 9}, kvindex.SnapshotOf(five))
	wantOver(t, "snapshot past the pod limit", err, kvindex.LimitError{Scope: kvindex.ScopePod, Limit: 4, Held: 0, Adding: 5})
	if ps, _ := s.Positions(ctx, kvindex.PodKey{Backend: BackendA, UID: "p1"}); ps[0] != (kvindex.Position{Epoch: 2, Sequence: 1}) {
		t.Errorf("refused snapshot moved the position to %+v", ps[0])
	}
	if got := scoreOf(t, s, BackendA, []uint64{11})["p1/0"]; got.GPU != 1 {
		t.Errorf("refused snapshot dropped the rank's blocks: %+v", got)
	}
	if err := s.Replace(ctx, src, kvindex.Position{Epoch: 2, Sequence: 9}, kvindex.SnapshotOf(eight)); err != nil {
		t.Fatalf("snapshot of 4 blocks in 8 entries: %v", err)
	}
	if n := podBlocks(t, s, BackendA, "p1"); n != 4 {
		t.Errorf("pod blocks after the snapshot = %d, want 4", n)
	}
}

func backendLimit(t *testing.T, s kvindex.Store) {
	ctx := context.Background()
	applyAll(t, s, Src("p1", 0), []kvindex.Op{Store(kvindex.TierGPU, 1, 2, 3)})
	_, _, err := s.Apply(ctx, Src("p2", 0), kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{Store(kvindex.TierGPU, 1, 2, 3)}})
	wantOver(t, "second pod past the backend limit", err, kvindex.LimitError{Scope: kvindex.ScopeBackend, Limit: 5, Held: 3, Adding: 3})
	// Another backend has its own count.
	other := kvindex.Source{Backend: BackendB, PodUID: "p3"}
	if o, _, err := s.Apply(ctx, other, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{Store(kvindex.TierGPU, 1, 2, 3)}}); err != nil || o != kvindex.Applied {
		t.Fatalf("another backend: %s, %v", o, err)
	}
	applyAll(t, s, Src("p2", 0), []kvindex.Op{Store(kvindex.TierGPU, 1, 2)})
}

func namespaceLimit(t *testing.T, s kvindex.Store) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	if err := s.PutPod(ctx, kvindex.PodRecord{Backend: BackendA, UID: "p1", Name: "p1", Model: "m"}, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	applyAll(t, s, Src("p1", 0), []kvindex.Op{Store(kvindex.TierGPU, 1, 2, 3)})
	second := kvindex.Source{Backend: BackendA2, PodUID: "p2"}
	if err := s.PutPod(ctx, kvindex.PodRecord{Backend: BackendA2, UID: "p2", Name: "p2", Model: "m"}, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.Apply(ctx, second, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{Store(kvindex.TierGPU, 1, 2, 3)}})
	wantOver(t, "another backend of the namespace", err, kvindex.LimitError{Scope: kvindex.ScopeNamespace, Limit: 5, Held: 3, Adding: 3})
	if err := s.PutPod(ctx, kvindex.PodRecord{Backend: BackendB, UID: "p3", Name: "p3", Model: "m"}, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if o, _, err := s.Apply(ctx, kvindex.Source{Backend: BackendB, PodUID: "p3"}, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{Store(kvindex.TierGPU, 1, 2, 3)}}); err != nil || o != kvindex.Applied {
		t.Fatalf("a backend of another namespace: %s, %v", o, err)
	}
	// Reaping p1 returns its blocks to the namespace's count.
	if gone, err := s.ExpireLeases(ctx, now.Add(2*time.Minute)); err != nil || len(gone) != 1 {
		t.Fatalf("expiring p1: %v, %v", gone, err)
	}
	if o, _, err := s.Apply(ctx, second, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{Store(kvindex.TierGPU, 1, 2, 3)}}); err != nil || o != kvindex.Applied {
		t.Fatalf("after the reap: %s, %v", o, err)
	}
}

// reaping: a backend whose last pod is reaped leaves nothing a new pod of
// it would see, and a new pod starts from empty counts.
func reaping(t *testing.T, s kvindex.Store) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	if err := s.PutPod(ctx, kvindex.PodRecord{Backend: BackendB, UID: "only", Name: "only", Model: "m"}, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	applyAll(t, s, kvindex.Source{Backend: BackendB, PodUID: "only"}, []kvindex.Op{Store(kvindex.TierGPU, 1, 2), Store(kvindex.TierCPU, 2)})
	if gone, err := s.ExpireLeases(ctx, now.Add(2*time.Minute)); err != nil || len(gone) != 1 {
		t.Fatalf("expiring the backend's last pod: %v, %v", gone, err)
	}
	if tiers, _ := s.TierBlocks(ctx, BackendB); tiers != [kvindex.NumTiers]uint64{} {
		t.Errorf("tier counts outlive the backend's last pod: %v", tiers)
	}
	if pods, _ := s.Pods(ctx, BackendB); len(pods) != 0 {
		t.Errorf("pods outlive their leases: %+v", pods)
	}
	if m, _ := s.Score(ctx, BackendB, Space, []uint64{1}); len(m) != 0 {
		t.Errorf("blocks outlive the backend's last pod: %+v", m)
	}
	if gone, err := s.ExpireLeases(ctx, now.Add(3*time.Minute)); err != nil || len(gone) != 0 {
		t.Errorf("a second reap: %v, %v", gone, err)
	}
}

// LargeHashes is the size of the large delta and snapshot of largeChanges:
// several of any store's chunks (the Redis store's default is 256).
const LargeHashes = 3000

// largeChanges: a delta and a snapshot far larger than one chunk apply
// whole, with reference counts and a clear between stores kept in order.
func largeChanges(t *testing.T, s kvindex.Store) {
	ctx := context.Background()
	src := Src("big", 0)
	pod := kvindex.PodKey{Backend: BackendA, UID: "big"}
	hashes := Chain(9, LargeHashes)
	// Every hash stored twice on GPU (two references), the first half on
	// CPU, then CPU cleared and stored again for the last 10.
	ops := []kvindex.Op{Store(kvindex.TierGPU, hashes...), Store(kvindex.TierGPU, hashes...), Store(kvindex.TierCPU, hashes[:LargeHashes/2]...), Clear(kvindex.TierCPU), Store(kvindex.TierCPU, hashes[LargeHashes-10:]...)}
	applyAll(t, s, src, ops)
	tiers, _ := s.TierBlocks(ctx, BackendA)
	if tiers[kvindex.TierGPU] != LargeHashes || tiers[kvindex.TierCPU] != 10 {
		t.Fatalf("after a large delta: tiers %v, want GPU %d, CPU 10", tiers, LargeHashes)
	}
	if n := podBlocks(t, s, BackendA, "big"); n != LargeHashes {
		t.Fatalf("after a large delta: %d blocks, want %d", n, LargeHashes)
	}
	// One removal leaves one reference of each.
	applyAll(t, s, src, []kvindex.Op{Remove(kvindex.TierGPU, hashes...)})
	if got := scoreOf(t, s, BackendA, hashes)["big/0"]; got.GPU != LargeHashes {
		t.Fatalf("after one removal of two references: %+v", got)
	}
	entries := make([]kvindex.Entry, 0, 2*LargeHashes)
	for i, h := range hashes {
		entries = append(entries, kvindex.Entry{Space: Space, Tier: kvindex.TierDisk, Hash: h + 1<<20, Refs: 1})
		if i%2 == 0 {
			entries = append(entries, kvindex.Entry{Space: Space, Tier: kvindex.TierCPU, Hash: h + 1<<20, Refs: 3})
		}
	}
	if err := s.Replace(ctx, src, kvindex.Position{Epoch: 1, Sequence: 100}, kvindex.SnapshotOf(entries)); err != nil {
		t.Fatal(err)
	}
	tiers, _ = s.TierBlocks(ctx, BackendA)
	if tiers != [kvindex.NumTiers]uint64{0, 0, LargeHashes / 2, LargeHashes} {
		t.Fatalf("after a large snapshot: tiers %v", tiers)
	}
	if n := podBlocks(t, s, BackendA, "big"); n != LargeHashes {
		t.Fatalf("after a large snapshot: %d blocks, want %d", n, LargeHashes)
	}
	if ps, _ := s.Positions(ctx, pod); ps[0] != (kvindex.Position{Epoch: 1, Sequence: 100}) {
		t.Fatalf("after a large snapshot: position %+v", ps[0])
	}
	// A restart of a large rank drops it whole before its first delta.
	if o, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 2, Sequence: 1, Ops: []kvindex.Op{Store(kvindex.TierGPU, 1)}}); err != nil || o != kvindex.Applied {
		t.Fatalf("restart: %s, %v", o, err)
	}
	if tiers, _ := s.TierBlocks(ctx, BackendA); tiers != [kvindex.NumTiers]uint64{0, 1, 0, 0} {
		t.Fatalf("after a restart: tiers %v", tiers)
	}
}
