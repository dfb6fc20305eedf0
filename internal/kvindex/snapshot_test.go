package kvindex_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// heap is the live heap after a collection, in bytes.
func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestSnapshotBeginReservesNothing: a SnapshotBegin only announces a
// count; the index holds memory for the entries that arrive, not for the
// count (issue 25: two 24-byte begins announcing 4,000,000 blocks held
// 549 MiB). Two ranks announce the most a rank may send, and the heap
// grows by less than 1 MiB.
func TestSnapshotBeginReservesNothing(t *testing.T) {
	ctx := context.Background()
	ix := kvindex.New(kvindex.Options{Store: memstore.New()})
	s := ix.NewSession(podCaller, func() {})
	defer s.Close()
	if _, err := s.Handle(ctx, helloOf(2, "cache")); err != nil {
		t.Fatal(err)
	}
	before := heap()
	for rank := range uint32(2) {
		if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{
			Rank: rank, Epoch: 1, Sequence: 1, BlockCount: 4_000_000,
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	grew := int64(heap()) - int64(before)
	runtime.KeepAlive(s)
	if grew > 1<<20 {
		t.Fatalf("two SnapshotBegins grew the heap by %d bytes; want < 1 MiB", grew)
	}
	t.Logf("two SnapshotBegins of 4,000,000 blocks: heap grew by %d bytes", grew)

	// The snapshot still adds up when its entries arrive.
	if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: 3}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: &pb.SnapshotChunk{Rank: 0, Epoch: 1, Entries: []*pb.SnapshotEntries{
		{Tier: pb.Tier_TIER_GPU, BlockHashes: []uint64{1, 2, 3}},
	}}}}); err != nil {
		t.Fatal(err)
	}
	out, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].GetAck().GetApplied().GetSequence() != 1 {
		t.Fatalf("snapshot end answered %v, want an ack of sequence 1", out)
	}
}

// TestSnapshotRange: a Snapshot built chunk by chunk yields, for every
// range, the entries a flat slice of them holds.
func TestSnapshotRange(t *testing.T) {
	a, b := kvindex.Space{Model: "m", Lora: "a"}, kvindex.Space{Model: "m", Lora: "b"}
	var flat []kvindex.Entry
	snap := &kvindex.Snapshot{}
	for i, c := range []struct {
		space  kvindex.Space
		tier   kvindex.Tier
		hashes []uint64
		refs   []uint32
	}{
		{a, kvindex.TierGPU, []uint64{1, 2, 3}, nil},
		{b, kvindex.TierCPU, []uint64{4}, []uint32{7}},
		{a, kvindex.TierDisk, nil, nil}, // an empty run adds nothing
		{a, kvindex.TierCPU, []uint64{5, 6}, []uint32{2, 3}},
	} {
		if err := snap.Add(c.space, c.tier, c.hashes, c.refs); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		for j, h := range c.hashes {
			n := uint32(1)
			if c.refs != nil {
				n = c.refs[j]
			}
			flat = append(flat, kvindex.Entry{Space: c.space, Tier: c.tier, Hash: h, Refs: n})
		}
	}
	if snap.Len() != len(flat) {
		t.Fatalf("Len = %d, want %d", snap.Len(), len(flat))
	}
	for start := 0; start <= len(flat)+1; start++ {
		for end := start; end <= len(flat)+2; end++ {
			var got []kvindex.Entry
			for e := range snap.Range(start, end) {
				got = append(got, e)
			}
			want := flat[min(start, len(flat)):min(end, len(flat))]
			if len(want) == 0 {
				want = nil
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Range(%d, %d) = %v, want %v", start, end, got, want)
			}
		}
	}
	if n := snap.DistinctBlocks(); n != 6 {
		t.Errorf("DistinctBlocks = %d, want 6", n)
	}
}

// TestStagedEntriesTakeSixteenBytes: a staged snapshot entry holds its
// hash, references, tier and an index of its space, not a copy of the
// space's three strings (issue 25: 72 bytes an entry, so that 4,000,000
// staged grew the real binary past its limit). 1,000,000 entries staged
// in chunks of 10,000 grow the heap by less than 17 MB.
func TestStagedEntriesTakeSixteenBytes(t *testing.T) {
	const n, chunk = 1_000_000, 10_000
	ctx := context.Background()
	ix := kvindex.New(kvindex.Options{Store: memstore.New()})
	s := ix.NewSession(podCaller, func() {})
	defer s.Close()
	if _, err := s.Handle(ctx, helloOf(1, "cache")); err != nil {
		t.Fatal(err)
	}
	before := heap()
	sendSnapshot(t, s, 0, n, chunk)
	grew := int64(heap()) - int64(before)
	runtime.KeepAlive(s)
	t.Logf("%d entries staged: heap grew by %d bytes (%.1f a entry)", n, grew, float64(grew)/n)
	if grew > 17*n {
		t.Fatalf("%d staged entries grew the heap by %d bytes; want < %d", n, grew, 17*n)
	}
	if got := kvindex.StagedBlocks(ix); got != n {
		t.Errorf("the staging budget counts %d, want %d", got, n)
	}
	out, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: n}}})
	if err != nil || len(out) != 1 || out[0].GetAck() == nil {
		t.Fatalf("end: %v, %v; want an ack", out, err)
	}
	if got := kvindex.StagedBlocks(ix); got != 0 {
		t.Errorf("the staging budget counts %d after the end, want 0", got)
	}
}

// sendSnapshot begins rank's snapshot of n entries on s and sends them in
// chunks, without its end.
func sendSnapshot(t *testing.T, s *kvindex.Session, rank uint32, n, chunk int) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Rank: rank, Epoch: 1, Sequence: 1, BlockCount: uint64(n)}}}); err != nil {
		t.Fatal(err)
	}
	hashes := make([]uint64, chunk)
	for sent := 0; sent < n; sent += chunk {
		for i := range hashes {
			hashes[i] = uint64(sent + i + 1)
		}
		if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: &pb.SnapshotChunk{
			Rank: rank, Epoch: 1, Entries: []*pb.SnapshotEntries{{Tier: pb.Tier_TIER_CPU, BlockHashes: hashes[:min(chunk, n-sent)]}},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStagingBudgetSpansStreams: every stream bounds what it stages, but
// many streams (one per pod) could still make the index hold their
// number × MaxSnapshotBlocks. The index's staging budget is shared: with
// room for 30,000 entries, a first pod stages 20,000; a second pod's
// snapshot of 20,000 passes the budget midway, is dropped and refused at
// its end (ResourceExhausted, scope staging) while the first still
// applies; closing a stream gives its share back.
func TestStagingBudgetSpansStreams(t *testing.T) {
	const budget, n, chunk = 30_000, 20_000, 5_000
	ctx := context.Background()
	obs := &limitObserver{}
	// One namespace's streams, with the namespace's share as large as the
	// budget: this test is about the index's budget (the share is
	// TestNamespaceCannotTakeTheStagingBudget's).
	ix := kvindex.New(kvindex.Options{Store: memstore.New(), MaxStagedBlocks: budget, MaxStagedBlocksPerNamespace: budget, Observer: obs})
	pod := func(i int) *kvindex.Session {
		name, uid := fmt.Sprintf("vllm-%d", i), fmt.Sprintf("u%d", i)
		s := ix.NewSession(kvindex.Caller{Username: "system:serviceaccount:team-a:vllm", Namespace: "team-a", ServiceAccount: "vllm", PodName: name, PodUID: uid}, func() {})
		if _, err := s.Handle(ctx, helloFor(name, uid, 1, "cache")); err != nil {
			t.Fatal(err)
		}
		return s
	}
	first, second := pod(0), pod(1)
	defer first.Close()
	sendSnapshot(t, first, 0, n, chunk)
	sendSnapshot(t, second, 0, n, chunk)
	if got := kvindex.StagedBlocks(ix); got != n {
		t.Fatalf("staged %d entries, want %d: the second snapshot is dropped once it passes the budget", got, n)
	}
	_, err := second.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: n}}})
	var le *kvindex.LimitError
	if !errors.As(err, &le) || le.Scope != kvindex.ScopeStaging || le.Limit != budget {
		t.Fatalf("the second snapshot's end: %v, want a staging LimitError of %d", err, budget)
	}
	if len(obs.scopes) != 1 || obs.scopes[0] != kvindex.ScopeStaging {
		t.Errorf("refusals observed: %v, want one of scope staging", obs.scopes)
	}
	out, err := first.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: n}}})
	if err != nil || len(out) != 1 || out[0].GetAck() == nil {
		t.Fatalf("the first snapshot's end: %v, %v; want an ack", out, err)
	}
	// A stream that stops midway gives its share back when it closes.
	third := pod(2)
	sendSnapshot(t, third, 0, n, chunk)
	if got := kvindex.StagedBlocks(ix); got != n {
		t.Fatalf("staged %d entries, want %d", got, n)
	}
	third.Close()
	second.Close()
	if got := kvindex.StagedBlocks(ix); got != 0 {
		t.Errorf("staged %d entries after the streams closed, want 0", got)
	}
}

// TestNamespaceCannotTakeTheStagingBudget (issue 35): the staging budget
// was first come, first served across namespaces, so the pods of one
// namespace staging snapshots (each within its own limits) left none for
// another's. Each namespace now stages at most its share
// (MaxStagedBlocksPerNamespace, half of the budget by default): team-a's
// second snapshot is refused with ScopeNamespaceStaging past its share,
// and team-b's snapshot stages and is acknowledged.
func TestNamespaceCannotTakeTheStagingBudget(t *testing.T) {
	const budget, n, chunk = 20_000, 10_000, 2_500
	ctx := context.Background()
	obs := &limitObserver{}
	ix := kvindex.New(kvindex.Options{Store: memstore.New(), MaxStagedBlocks: budget, Observer: obs})
	pod := func(ns string, i int) *kvindex.Session {
		name, uid := fmt.Sprintf("vllm-%d", i), fmt.Sprintf("%s-u%d", ns, i)
		s := ix.NewSession(kvindex.Caller{Username: "system:serviceaccount:" + ns + ":vllm", Namespace: ns, ServiceAccount: "vllm", PodName: name, PodUID: uid}, func() {})
		h := helloFor(name, uid, 1, "cache")
		h.GetHello().Pod.Namespace, h.GetHello().CacheBackend.Namespace = ns, ns
		if _, err := s.Handle(ctx, h); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	end := func(s *kvindex.Session) ([]*pb.IngestResponse, error) {
		return s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: n}}})
	}
	a0, a1 := pod("team-a", 0), pod("team-a", 1)
	sendSnapshot(t, a0, 0, n, chunk)
	sendSnapshot(t, a1, 0, n, chunk)
	b := pod("team-b", 0)
	sendSnapshot(t, b, 0, n, chunk)
	out, err := end(b)
	if err != nil || len(out) != 1 || out[0].GetAck() == nil {
		t.Fatalf("team-b's snapshot end: %v, %v; want an ack: team-a took the staging budget", out, err)
	}
	_, err = end(a1)
	var le *kvindex.LimitError
	if !errors.As(err, &le) || le.Scope != kvindex.ScopeNamespaceStaging || le.Limit != budget/2 {
		t.Fatalf("team-a's second snapshot end: %v, want a namespace-staging LimitError of %d", err, budget/2)
	}
	if out, err := end(a0); err != nil || len(out) != 1 || out[0].GetAck() == nil {
		t.Fatalf("team-a's first snapshot end: %v, %v; want an ack", out, err)
	}
	if got := kvindex.StagedBlocks(ix); got != 0 {
		t.Errorf("staged %d entries after the ends, want 0", got)
	}
}
