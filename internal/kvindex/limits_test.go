package kvindex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

func TestLimitsCheck(t *testing.T) {
	l := kvindex.Limits{PodBlocks: 10, BackendBlocks: 20, NamespaceBlocks: 30}
	tests := []struct {
		name   string
		held   kvindex.Held
		adding uint64
		want   *kvindex.LimitError
	}{
		{"within every limit", kvindex.Held{Pod: 5, Backend: 5, Namespace: 5}, 5, nil},
		{"exactly at the limits", kvindex.Held{Pod: 5, Backend: 15, Namespace: 25}, 5, nil},
		{"past the pod limit", kvindex.Held{Pod: 6}, 5, &kvindex.LimitError{Scope: kvindex.ScopePod, Limit: 10, Held: 6, Adding: 5}},
		{"past the backend limit", kvindex.Held{Backend: 16}, 5, &kvindex.LimitError{Scope: kvindex.ScopeBackend, Limit: 20, Held: 16, Adding: 5}},
		{"past the namespace limit", kvindex.Held{Namespace: 26}, 5, &kvindex.LimitError{Scope: kvindex.ScopeNamespace, Limit: 30, Held: 26, Adding: 5}},
		{"the pod is named first", kvindex.Held{Pod: 10, Backend: 20, Namespace: 30}, 1, &kvindex.LimitError{Scope: kvindex.ScopePod, Limit: 10, Held: 10, Adding: 1}},
		{"nothing added passes nothing", kvindex.Held{Pod: 99, Backend: 99, Namespace: 99}, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := l.Check(tt.held, tt.adding)
			var le *kvindex.LimitError
			switch {
			case tt.want == nil && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != nil && (!errors.As(err, &le) || *le != *tt.want || !errors.Is(err, kvindex.ErrOverLimit)):
				t.Fatalf("got %v, want %+v", err, *tt.want)
			}
		})
	}
	if err := (kvindex.Limits{}).Check(kvindex.Held{Pod: 1 << 60}, 1<<60); err != nil {
		t.Errorf("zero limits refused: %v", err)
	}
}

func TestDistinctBlocks(t *testing.T) {
	a, b := kvindex.Space{Model: "a"}, kvindex.Space{Model: "b"}
	entries := []kvindex.Entry{
		{Space: a, Tier: kvindex.TierGPU, Hash: 1, Refs: 1},
		{Space: a, Tier: kvindex.TierCPU, Hash: 1, Refs: 1},  // the same block in another tier
		{Space: b, Tier: kvindex.TierGPU, Hash: 1, Refs: 1},  // another space
		{Space: a, Tier: kvindex.TierDisk, Hash: 2, Refs: 0}, // no reference: not stored
		{Space: a, Tier: kvindex.TierUnspecified, Hash: 3, Refs: 1},
	}
	if n := kvindex.SnapshotOf(entries).DistinctBlocks(); n != 2 {
		t.Errorf("DistinctBlocks = %d, want 2", n)
	}
}

type limitObserver struct {
	kvindex.NopObserver
	scopes []kvindex.LimitScope
}

func (o *limitObserver) OverLimit(s kvindex.LimitScope) { o.scopes = append(o.scopes, s) }

// A snapshot that cannot fit the pod's limit is refused as its entries
// arrive: past (NumTiers-1) × the limit, the session drops what it staged
// (the heap does not hold the rest of the sender's entries) and the end
// is refused with ErrOverLimit, counted by scope.
func TestSnapshotPastThePodLimitIsNotStaged(t *testing.T) {
	ctx := context.Background()
	const limit = 10_000
	obs := &limitObserver{}
	ix := kvindex.New(kvindex.Options{Store: memstore.NewLimited(kvindex.Limits{PodBlocks: limit}), Limits: kvindex.Limits{PodBlocks: limit}, Observer: obs, Now: func() time.Time { return time.Unix(1_800_000_000, 0) }})
	s := ix.NewSession(podCaller, func() {})
	defer s.Close()
	if _, err := s.Handle(ctx, helloOf(1, "cache")); err != nil {
		t.Fatal(err)
	}
	const total = 40 * limit
	if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: total}}}); err != nil {
		t.Fatal(err)
	}
	before := heap()
	hashes := make([]uint64, limit)
	for c := range 40 {
		for i := range hashes {
			hashes[i] = uint64(c*limit + i + 1)
		}
		if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: &pb.SnapshotChunk{Rank: 0, Epoch: 1, Entries: []*pb.SnapshotEntries{{Tier: pb.Tier_TIER_DISK, BlockHashes: hashes}}}}}); err != nil {
			t.Fatal(err)
		}
	}
	grew := int64(heap()) - int64(before)
	// Staged whole, 400,000 entries hold about 30 MB; the cut-off staged
	// at most 3 × 10,000 and then dropped them.
	if grew > 1<<20 {
		t.Errorf("staging a snapshot of %d entries under a %d-block pod limit grew the heap by %d bytes, want < 1 MiB", total, limit, grew)
	}
	t.Logf("%d snapshot entries under a %d-block pod limit: heap grew %d bytes", total, limit, grew)
	_, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: total}}})
	if !errors.Is(err, kvindex.ErrOverLimit) {
		t.Fatalf("snapshot end: %v, want ErrOverLimit", err)
	}
	if len(obs.scopes) != 1 || obs.scopes[0] != kvindex.ScopePod {
		t.Errorf("refusals observed: %v, want one of scope pod", obs.scopes)
	}
}

// A backend's ingest-rate window goes with its last pod's lease (issue 25:
// rate windows outlived every lease).
func TestRateWindowGoesWithTheLastPod(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	ix := kvindex.New(kvindex.Options{Store: memstore.New(), Lease: time.Minute, Now: func() time.Time { return now }})
	s := ix.NewSession(podCaller, func() {})
	if _, err := s.Handle(ctx, helloOf(1, "cache")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Rank: 0, Epoch: 1, Sequence: 1, Events: []*pb.BlockEvent{
		{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{Tier: pb.Tier_TIER_GPU, BlockHashes: []uint64{1, 2}}}},
	}}}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if n := kvindex.RateWindows(ix); n != 1 {
		t.Fatalf("%d rate windows after a delta, want 1", n)
	}
	now = now.Add(2 * time.Minute)
	if n, err := ix.ExpireLeases(ctx); err != nil || n != 1 {
		t.Fatalf("expired %d pods, %v", n, err)
	}
	if n := kvindex.RateWindows(ix); n != 0 {
		t.Errorf("%d rate windows after the backend's last pod was reaped, want 0", n)
	}
}
