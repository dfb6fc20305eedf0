// Package storetest is the behaviour every kvindex.Store must show, run by
// the memory store's and the Redis store's tests alike.
package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inferencecache/operator/internal/kvindex"
)

// Backends and spaces used by the suite.
var (
	BackendA = kvindex.BackendRef{Namespace: "team-a", Name: "cache"}
	BackendB = kvindex.BackendRef{Namespace: "team-b", Name: "cache"}
	Space    = kvindex.Space{Model: "m", Scheme: "sha256_cbor/16/vllm-none-hash"}
)

// Src is rank r of pod uid in BackendA.
func Src(uid string, rank uint32) kvindex.Source {
	return kvindex.Source{Backend: BackendA, PodUID: uid, Rank: rank}
}

// Store is a delta of one store op.
func Store(tier kvindex.Tier, hashes ...uint64) kvindex.Op {
	return kvindex.Op{Kind: kvindex.OpStore, Tier: tier, Space: Space, Hashes: hashes}
}

// Remove is a delta of one remove op.
func Remove(tier kvindex.Tier, hashes ...uint64) kvindex.Op {
	return kvindex.Op{Kind: kvindex.OpRemove, Tier: tier, Space: Space, Hashes: hashes}
}

// Clear drops a tier (or every tier).
func Clear(tier kvindex.Tier) kvindex.Op { return kvindex.Op{Kind: kvindex.OpClear, Tier: tier} }

// Chain returns n block hashes of one prompt, distinct per seed.
func Chain(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = seed<<32 | uint64(i+1)
	}
	return out
}

// Run runs the suite against stores made by newStore (each call a fresh,
// empty store).
func Run(t *testing.T, newStore func(t *testing.T) kvindex.Store) {
	t.Run("exactly once", func(t *testing.T) { exactlyOnce(t, newStore(t)) })
	t.Run("reference counts and tiers", func(t *testing.T) { refcounts(t, newStore(t)) })
	t.Run("score", func(t *testing.T) { score(t, newStore(t)) })
	t.Run("snapshot replace", func(t *testing.T) { snapshot(t, newStore(t)) })
	t.Run("lease expiry removes exactly that pod", func(t *testing.T) { leases(t, newStore(t)) })
	t.Run("backends are isolated", func(t *testing.T) { isolation(t, newStore(t)) })
	t.Run("a backend's state goes with its last pod", func(t *testing.T) { reaping(t, newStore(t)) })
	t.Run("large deltas and snapshots", func(t *testing.T) { largeChanges(t, newStore(t)) })
}

type step struct {
	name    string
	src     kvindex.Source
	delta   kvindex.Delta
	want    kvindex.Outcome
	wantPos kvindex.Position
}

func exactlyOnce(t *testing.T, s kvindex.Store) {
	ctx := context.Background()
	d := func(epoch, seq uint64, ops ...kvindex.Op) kvindex.Delta {
		return kvindex.Delta{Epoch: epoch, Sequence: seq, Ops: ops}
	}
	steps := []step{
		{"unknown rank, not sequence 1", Src("p1", 0), d(5, 3, Store(kvindex.TierGPU, 1)), kvindex.NeedSnapshot, kvindex.Position{}},
		{"sequence 1 of a new rank applies", Src("p1", 0), d(5, 1, Store(kvindex.TierGPU, 1, 2)), kvindex.Applied, kvindex.Position{Epoch: 5, Sequence: 1}},
		{"next sequence applies", Src("p1", 0), d(5, 2, Store(kvindex.TierGPU, 3)), kvindex.Applied, kvindex.Position{Epoch: 5, Sequence: 2}},
		{"replayed sequence is a duplicate", Src("p1", 0), d(5, 2, Store(kvindex.TierGPU, 3)), kvindex.Duplicate, kvindex.Position{Epoch: 5, Sequence: 2}},
		{"older sequence is a duplicate", Src("p1", 0), d(5, 1, Store(kvindex.TierGPU, 1, 2)), kvindex.Duplicate, kvindex.Position{Epoch: 5, Sequence: 2}},
		{"skipped sequence needs a snapshot", Src("p1", 0), d(5, 4, Store(kvindex.TierGPU, 9)), kvindex.NeedSnapshot, kvindex.Position{Epoch: 5, Sequence: 2}},
		{"older epoch needs a snapshot", Src("p1", 0), d(4, 1, Store(kvindex.TierGPU, 9)), kvindex.NeedSnapshot, kvindex.Position{Epoch: 5, Sequence: 2}},
		{"newer epoch past sequence 1 needs a snapshot", Src("p1", 0), d(6, 2, Store(kvindex.TierGPU, 9)), kvindex.NeedSnapshot, kvindex.Position{Epoch: 5, Sequence: 2}},
		{"other rank is independent", Src("p1", 1), d(7, 1, Store(kvindex.TierGPU, 1)), kvindex.Applied, kvindex.Position{Epoch: 7, Sequence: 1}},
		{"sequence 1 of a newer epoch restarts the rank", Src("p1", 0), d(6, 1, Store(kvindex.TierGPU, 7)), kvindex.Applied, kvindex.Position{Epoch: 6, Sequence: 1}},
	}
	for _, st := range steps {
		got, pos, err := s.Apply(ctx, st.src, st.delta)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got != st.want || pos != st.wantPos {
			t.Fatalf("%s: got %s at %+v, want %s at %+v", st.name, got, pos, st.want, st.wantPos)
		}
	}
	// The restart dropped blocks 1, 2, 3 of epoch 5: rank 0 holds only 7,
	// and the replays above changed nothing.
	n, err := s.PodBlocks(ctx, kvindex.PodKey{Backend: BackendA, UID: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 { // rank 0: {7}, rank 1: {1}
		t.Errorf("pod holds %d blocks, want 2", n)
	}
	tiers, _ := s.TierBlocks(ctx, BackendA)
	if tiers[kvindex.TierGPU] != 2 {
		t.Errorf("GPU residencies = %d, want 2", tiers[kvindex.TierGPU])
	}
	pos, err := s.Positions(ctx, kvindex.PodKey{Backend: BackendA, UID: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]kvindex.Position{0: {Epoch: 6, Sequence: 1}, 1: {Epoch: 7, Sequence: 1}}
	if len(pos) != 2 || pos[0] != want[0] || pos[1] != want[1] {
		t.Errorf("positions = %v, want %v", pos, want)
	}
}

func applyAll(t *testing.T, s kvindex.Store, src kvindex.Source, deltas ...[]kvindex.Op) {
	t.Helper()
	ctx := context.Background()
	ps, _ := s.Positions(ctx, kvindex.PodKey{Backend: src.Backend, UID: src.PodUID})
	pos := ps[src.Rank]
	epoch := max(pos.Epoch, 1)
	for _, ops := range deltas {
		pos.Sequence++
		got, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: epoch, Sequence: pos.Sequence, Ops: ops})
		if err != nil || got != kvindex.Applied {
			t.Fatalf("apply %d: %s, %v", pos.Sequence, got, err)
		}
	}
}

func scoreOf(t *testing.T, s kvindex.Store, backend kvindex.BackendRef, hashes []uint64) map[string]kvindex.Match {
	t.Helper()
	ms, err := s.Score(context.Background(), backend, Space, hashes)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]kvindex.Match{}
	for _, m := range ms {
		out[m.PodUID+"/"+string(rune('0'+m.Rank))] = m
	}
	return out
}

func refcounts(t *testing.T, s kvindex.Store) {
	ctx := context.Background()
	src := Src("p1", 0)
	// vLLM may cache one hash twice: two stores, one removal, still held.
	applyAll(t, s, src,
		[]kvindex.Op{Store(kvindex.TierGPU, 1, 2)},
		[]kvindex.Op{Store(kvindex.TierGPU, 2)},
		[]kvindex.Op{Remove(kvindex.TierGPU, 2)},
		[]kvindex.Op{Store(kvindex.TierCPU, 2, 3)},
		[]kvindex.Op{Remove(kvindex.TierGPU, 99)}, // never stored: ignored
	)
	got := scoreOf(t, s, BackendA, []uint64{1, 2, 3})["p1/0"]
	want := kvindex.Match{PodUID: "p1", Rank: 0, Any: 3, GPU: 2, CPU: 0, Disk: 0, GPUOrCPU: 3}
	if got != want {
		t.Fatalf("after duplicate store and one removal: %+v, want %+v", got, want)
	}
	tiers, _ := s.TierBlocks(ctx, BackendA)
	if tiers[kvindex.TierGPU] != 2 || tiers[kvindex.TierCPU] != 2 {
		t.Errorf("tiers = %v, want GPU 2, CPU 2", tiers)
	}
	applyAll(t, s, src, []kvindex.Op{Remove(kvindex.TierGPU, 2)}, []kvindex.Op{Clear(kvindex.TierCPU)})
	got = scoreOf(t, s, BackendA, []uint64{1, 2, 3})["p1/0"]
	want = kvindex.Match{PodUID: "p1", Rank: 0, Any: 1, GPU: 1, GPUOrCPU: 1}
	if got != want {
		t.Fatalf("after the second removal and a CPU clear: %+v, want %+v", got, want)
	}
	applyAll(t, s, src, []kvindex.Op{Clear(kvindex.TierUnspecified)})
	if m := scoreOf(t, s, BackendA, []uint64{1}); len(m) != 0 {
		t.Fatalf("after a clear of every tier: %+v, want nothing", m)
	}
	if n, _ := s.PodBlocks(ctx, kvindex.PodKey{Backend: BackendA, UID: "p1"}); n != 0 {
		t.Errorf("pod blocks after clear = %d", n)
	}
	if tiers, _ := s.TierBlocks(ctx, BackendA); tiers != [4]uint64{} {
		t.Errorf("tiers after clear = %v", tiers)
	}
}

func score(t *testing.T, s kvindex.Store) {
	prompt := Chain(7, 6)
	applyAll(t, s, Src("full", 0), []kvindex.Op{Store(kvindex.TierGPU, prompt...)})
	applyAll(t, s, Src("half", 0), []kvindex.Op{Store(kvindex.TierGPU, prompt[:3]...)})
	applyAll(t, s, Src("tiers", 0), []kvindex.Op{Store(kvindex.TierGPU, prompt[:2]...), Store(kvindex.TierCPU, prompt[1:4]...), Store(kvindex.TierDisk, prompt[4])})
	applyAll(t, s, Src("hole", 0), []kvindex.Op{Store(kvindex.TierGPU, prompt[0], prompt[2], prompt[3])})
	applyAll(t, s, Src("late", 0), []kvindex.Op{Store(kvindex.TierGPU, prompt[1:]...)})
	applyAll(t, s, Src("dp", 0), []kvindex.Op{Store(kvindex.TierGPU, prompt[:1]...)})
	applyAll(t, s, Src("dp", 1), []kvindex.Op{Store(kvindex.TierCPU, prompt[:4]...)})
	tests := []struct {
		name   string
		hashes []uint64
		want   map[string]kvindex.Match
	}{
		{"whole prompt", prompt, map[string]kvindex.Match{
			"full/0":  {PodUID: "full", Any: 6, GPU: 6, GPUOrCPU: 6},
			"half/0":  {PodUID: "half", Any: 3, GPU: 3, GPUOrCPU: 3},
			"tiers/0": {PodUID: "tiers", Any: 5, GPU: 2, GPUOrCPU: 4},
			"hole/0":  {PodUID: "hole", Any: 1, GPU: 1, GPUOrCPU: 1},
			"dp/0":    {PodUID: "dp", Any: 1, GPU: 1, GPUOrCPU: 1},
			"dp/1":    {PodUID: "dp", Rank: 1, Any: 4, CPU: 4, GPUOrCPU: 4},
		}},
		{"prompt diverging after 2 blocks", append(slices.Clone(prompt[:2]), 999, prompt[3]), map[string]kvindex.Match{
			"full/0":  {PodUID: "full", Any: 2, GPU: 2, GPUOrCPU: 2},
			"half/0":  {PodUID: "half", Any: 2, GPU: 2, GPUOrCPU: 2},
			"tiers/0": {PodUID: "tiers", Any: 2, GPU: 2, GPUOrCPU: 2},
			"hole/0":  {PodUID: "hole", Any: 1, GPU: 1, GPUOrCPU: 1},
			"dp/0":    {PodUID: "dp", Any: 1, GPU: 1, GPUOrCPU: 1},
			"dp/1":    {PodUID: "dp", Rank: 1, Any: 2, CPU: 2, GPUOrCPU: 2},
		}},
		{"unknown first block matches nobody", append([]uint64{12345}, prompt...), map[string]kvindex.Match{}},
		{"empty prompt", nil, map[string]kvindex.Match{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := scoreOf(t, s, BackendA, tt.hashes)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d matches %+v, want %d", len(got), got, len(tt.want))
			}
			for k, w := range tt.want {
				if got[k] != w {
					t.Errorf("%s: got %+v, want %+v", k, got[k], w)
				}
			}
		})
	}
}

func snapshot(t *testing.T, s kvindex.Store) {
	ctx := context.Background()
	applyAll(t, s, Src("p1", 0), []kvindex.Op{Store(kvindex.TierGPU, 1, 2, 3)})
	entries := []kvindex.Entry{
		{Space: Space, Tier: kvindex.TierGPU, Hash: 10, Refs: 2},
		{Space: Space, Tier: kvindex.TierCPU, Hash: 11, Refs: 1},
	}
	if err := s.Replace(ctx, Src("p1", 0), kvindex.Position{Epoch: 3, Sequence: 40}, kvindex.SnapshotOf(entries)); err != nil {
		t.Fatal(err)
	}
	if m := scoreOf(t, s, BackendA, []uint64{1}); len(m) != 0 {
		t.Errorf("blocks of before the snapshot still answer: %+v", m)
	}
	if got := scoreOf(t, s, BackendA, []uint64{10, 11})["p1/0"]; got.Any != 2 || got.GPU != 1 {
		t.Errorf("after snapshot: %+v, want Any 2, GPU 1", got)
	}
	// The snapshot's sequence is the base: 41 is next.
	if o, _, _ := s.Apply(ctx, Src("p1", 0), kvindex.Delta{Epoch: 3, Sequence: 40, Ops: []kvindex.Op{Remove(kvindex.TierGPU, 10)}}); o != kvindex.Duplicate {
		t.Errorf("sequence 40 after a snapshot at 40: %s, want duplicate", o)
	}
	if o, _, _ := s.Apply(ctx, Src("p1", 0), kvindex.Delta{Epoch: 3, Sequence: 41, Ops: []kvindex.Op{Remove(kvindex.TierGPU, 10)}}); o != kvindex.Applied {
		t.Errorf("sequence 41 after a snapshot at 40: %s, want applied", o)
	}
	if got := scoreOf(t, s, BackendA, []uint64{10})["p1/0"]; got.GPU != 1 {
		t.Errorf("a hash with 2 references removed once: %+v, want still held", got)
	}
	if err := s.Replace(ctx, Src("p1", 0), kvindex.Position{Epoch: 2, Sequence: 1}, nil); err == nil {
		t.Error("a snapshot of an older epoch was accepted")
	}
}

func leases(t *testing.T, s kvindex.Store) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	shared := Chain(1, 4)
	for _, uid := range []string{"gone", "stays"} {
		if err := s.PutPod(ctx, kvindex.PodRecord{Backend: BackendA, UID: uid, Name: uid, Model: "m"}, now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		applyAll(t, s, Src(uid, 0), []kvindex.Op{Store(kvindex.TierGPU, shared...)}, []kvindex.Op{Store(kvindex.TierCPU, uid2hash(uid))})
	}
	if err := s.PutPod(ctx, kvindex.PodRecord{Backend: BackendA, UID: "stays", Name: "stays", Model: "m"}, now.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	gone, err := s.ExpireLeases(ctx, now.Add(30*time.Second))
	if err != nil || len(gone) != 0 {
		t.Fatalf("before any lease ended: %v, %v", gone, err)
	}
	gone, err = s.ExpireLeases(ctx, now.Add(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != 1 || gone[0].UID != "gone" || gone[0].Backend != BackendA {
		t.Fatalf("expired %v, want only pod gone", gone)
	}
	got := scoreOf(t, s, BackendA, shared)
	if len(got) != 1 || got["stays/0"].Any != 4 {
		t.Fatalf("after expiry: %+v, want only stays with 4 blocks", got)
	}
	if m := scoreOf(t, s, BackendA, []uint64{uid2hash("gone")}); len(m) != 0 {
		t.Errorf("the expired pod's own block still answers: %+v", m)
	}
	if m := scoreOf(t, s, BackendA, []uint64{uid2hash("stays")}); len(m) != 1 {
		t.Errorf("the other pod's own block is gone: %+v", m)
	}
	tiers, _ := s.TierBlocks(ctx, BackendA)
	if tiers[kvindex.TierGPU] != 4 || tiers[kvindex.TierCPU] != 1 {
		t.Errorf("tiers after expiry = %v, want GPU 4, CPU 1", tiers)
	}
	if ps, _ := s.Positions(ctx, kvindex.PodKey{Backend: BackendA, UID: "gone"}); len(ps) != 0 {
		t.Errorf("expired pod keeps positions %v", ps)
	}
	pods, _ := s.Pods(ctx, BackendA)
	if len(pods) != 1 || pods[0].UID != "stays" {
		t.Errorf("pods after expiry = %+v", pods)
	}
	if gone, _ := s.ExpireLeases(ctx, now.Add(2*time.Minute)); len(gone) != 0 {
		t.Errorf("a second expiry removed %v again", gone)
	}
}

func uid2hash(uid string) uint64 {
	var h uint64 = 1469598103934665603
	for _, c := range []byte(uid) {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

func isolation(t *testing.T, s kvindex.Store) {
	prompt := Chain(3, 3)
	applyAll(t, s, Src("a", 0), []kvindex.Op{Store(kvindex.TierGPU, prompt...)})
	if m := scoreOf(t, s, BackendB, prompt); len(m) != 0 {
		t.Fatalf("backend B sees backend A's blocks: %+v", m)
	}
	other := kvindex.Space{Model: "other", Scheme: Space.Scheme}
	ms, _ := s.Score(context.Background(), BackendA, other, prompt)
	if len(ms) != 0 {
		t.Fatalf("model other sees model m's blocks: %+v", ms)
	}
}

// BenchIngest applies deltas to s in a steady state: each delta stores 16
// new blocks and evicts the 16 stored 4 deltas earlier, for one of 100 pods
// in turn. It reports block updates per wall-clock second, and per second
// of the process's CPU time (what the ingest costs on an idle machine).
func BenchIngest(b *testing.B, s kvindex.Store) {
	ctx := context.Background()
	const pods, per, lag = 100, 16, 4
	seqs := make([]uint64, pods)
	srcs := make([]kvindex.Source, pods)
	for i := range srcs {
		srcs[i] = kvindex.Source{Backend: BackendA, PodUID: fmt.Sprintf("pod-%d", i)}
	}
	hashes := func(pod int, seq uint64) []uint64 {
		out := make([]uint64, per)
		for i := range out {
			out[i] = uint64(pod)<<40 | seq<<8 | uint64(i)
		}
		return out
	}
	b.ResetTimer()
	c0, start := processCPU(), time.Now()
	for i := range b.N {
		pod := i % pods
		seqs[pod]++
		seq := seqs[pod]
		ops := []kvindex.Op{Store(kvindex.TierGPU, hashes(pod, seq)...)}
		if seq > lag {
			ops = append(ops, Remove(kvindex.TierGPU, hashes(pod, seq-lag)...))
		}
		if o, _, err := s.Apply(ctx, srcs[pod], kvindex.Delta{Epoch: 1, Sequence: seq, Ops: ops}); err != nil || o != kvindex.Applied {
			b.Fatalf("apply: %s, %v", o, err)
		}
	}
	updates := float64(b.N * 2 * per)
	b.ReportMetric(updates/time.Since(start).Seconds(), "block-updates/s")
	b.ReportMetric(updates/(processCPU()-c0).Seconds(), "block-updates/cpu-s")
}

func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
