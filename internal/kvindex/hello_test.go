package kvindex_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// podCaller is the pod-bound token of team-a's vllm-0.
var podCaller = kvindex.Caller{Username: "system:serviceaccount:team-a:vllm", Namespace: "team-a", ServiceAccount: "vllm", PodName: "vllm-0", PodUID: "u0"}

func helloOf(ranks uint32, backend string) *pb.IngestRequest {
	return helloFor("vllm-0", "u0", ranks, backend)
}

// helloFor is the Hello of pod name (uid) of team-a.
func helloFor(name, uid string, ranks uint32, backend string) *pb.IngestRequest {
	return &pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
		ProtocolVersion: kvindex.ProtocolVersion,
		Pod:             &pb.PodIdentity{Namespace: "team-a", Name: name, Uid: uid},
		CacheBackend:    &pb.CacheBackendRef{Namespace: "team-a", Name: backend},
		Model:           "m", Engine: "vllm", DataParallelSize: ranks,
		HashScheme: &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 16},
	}}}
}

// refusals counts the Observer's HelloRefused reasons (got) and
// SchemeDisagrees (disagreed).
type refusals struct {
	kvindex.NopObserver
	mu             sync.Mutex
	got, disagreed map[string]int
}

func (r *refusals) HelloRefused(reason string) { r.count(&r.got, reason) }

func (r *refusals) SchemeDisagrees(what string) { r.count(&r.disagreed, what) }

func (r *refusals) count(m *map[string]int, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if *m == nil {
		*m = map[string]int{}
	}
	(*m)[key]++
}

// fakeBackends holds the CacheBackends that exist and counts lookups.
type fakeBackends struct {
	exist   map[kvindex.BackendRef]bool
	err     error
	lookups int
}

func (f *fakeBackends) Exists(_ context.Context, b kvindex.BackendRef) (bool, error) {
	f.lookups++
	return f.exist[b], f.err
}

func TestHelloRankCap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxRanks uint32
		ranks    uint32
		refused  bool
	}{
		{"the default cap admits 64 ranks", 0, kvindex.DefaultMaxRanks, false},
		{"the default cap refuses 65", 0, kvindex.DefaultMaxRanks + 1, true},
		{"the 1,024 ranks of issue 25 are refused", 0, 1024, true},
		{"a raised cap admits them", 1024, 1024, false},
		{"a lowered cap refuses 9", 8, 9, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &refusals{}
			ix := kvindex.New(kvindex.Options{Store: memstore.New(), MaxRanks: tc.maxRanks, Observer: obs})
			s := ix.NewSession(podCaller, func() {})
			defer s.Close()
			_, err := s.Handle(context.Background(), helloOf(tc.ranks, "cache"))
			if !tc.refused {
				if err != nil {
					t.Fatalf("hello of %d ranks: %v", tc.ranks, err)
				}
				return
			}
			if !errors.Is(err, kvindex.ErrInvalid) || !strings.Contains(err.Error(), "--max-ranks") {
				t.Fatalf("hello of %d ranks: %v; want an invalid-argument refusal naming --max-ranks", tc.ranks, err)
			}
			if obs.got["ranks"] != 1 {
				t.Fatalf("refusals counted: %v; want ranks: 1", obs.got)
			}
		})
	}
}

func TestHelloForAMissingBackendIsRefused(t *testing.T) {
	cache := kvindex.BackendRef{Namespace: "team-a", Name: "cache"}
	for _, tc := range []struct {
		name    string
		caller  kvindex.Caller
		backend string
		lookErr error
		want    error // nil: welcomed
		lookups int
	}{
		{"an existing backend is welcomed", podCaller, "cache", nil, nil, 1},
		{"a missing backend is refused", podCaller, "junk", nil, kvindex.ErrForbidden, 1},
		{"a failed lookup is not a refusal", podCaller, "cache", errors.New("api server down"), errors.New("api server down"), 1},
		{"an unauthorised caller costs no lookup", kvindex.Caller{Username: "x", Namespace: "team-b", PodName: "vllm-0", PodUID: "u0"}, "junk", nil, kvindex.ErrForbidden, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &refusals{}
			backends := &fakeBackends{exist: map[kvindex.BackendRef]bool{cache: true}, err: tc.lookErr}
			ix := kvindex.New(kvindex.Options{Store: memstore.New(), Backends: backends, Observer: obs})
			s := ix.NewSession(tc.caller, func() {})
			defer s.Close()
			out, err := s.Handle(context.Background(), helloOf(1, tc.backend))
			switch {
			case tc.want == nil && (err != nil || out[0].GetWelcome() == nil):
				t.Fatalf("hello: %v, %v; want a welcome", out, err)
			case tc.want != nil && (err == nil || !errors.Is(err, tc.want) && !strings.Contains(err.Error(), tc.want.Error())):
				t.Fatalf("hello: %v; want %v", err, tc.want)
			}
			if backends.lookups != tc.lookups {
				t.Fatalf("%d lookups, want %d", backends.lookups, tc.lookups)
			}
			if tc.backend == "junk" && tc.lookups == 1 && obs.got["unknown_backend"] != 1 {
				t.Fatalf("refusals counted: %v; want unknown_backend: 1", obs.got)
			}
		})
	}
}

// TestInterleavedSnapshotsStageOneBound: a stream that begins a snapshot
// on every rank and sends each its entries would make the index hold
// ranks × MaxSnapshotBlocks entries (issue 25: 64 ranks × 4,000,000 ×
// 16 bytes is 4 GB). The snapshots one stream stages at once share one
// MaxSnapshotBlocks: 64 ranks each sent 50,000 entries grow the heap by
// less than twice what 50,000 entries take.
func TestInterleavedSnapshotsStageOneBound(t *testing.T) {
	const perRank = 50_000
	ctx := context.Background()
	ix := kvindex.New(kvindex.Options{Store: memstore.New(), MaxSnapshotBlocks: perRank})
	s := ix.NewSession(podCaller, func() {})
	defer s.Close()
	if _, err := s.Handle(ctx, helloOf(kvindex.DefaultMaxRanks, "cache")); err != nil {
		t.Fatal(err)
	}
	hashes := make([]uint64, 10_000)
	before := heap()
	for rank := range uint32(kvindex.DefaultMaxRanks) {
		if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{
			Rank: rank, Epoch: 1, Sequence: 1, BlockCount: perRank,
		}}}); err != nil {
			t.Fatal(err)
		}
		for sent := 0; sent < perRank; sent += len(hashes) {
			for i := range hashes {
				hashes[i] = uint64(sent + i + 1)
			}
			if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: &pb.SnapshotChunk{
				Rank: rank, Epoch: 1, Entries: []*pb.SnapshotEntries{{Tier: pb.Tier_TIER_GPU, BlockHashes: hashes}},
			}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	grew := int64(heap()) - int64(before)
	budget := int64(2 * perRank * 16) // 16 bytes a staged entry
	t.Logf("%d ranks × %d entries staged: heap grew by %d bytes (budget %d)", kvindex.DefaultMaxRanks, perRank, grew, budget)
	if grew > budget {
		t.Fatalf("interleaved snapshots grew the heap by %d bytes; want < %d (one MaxSnapshotBlocks of entries, twice)", grew, budget)
	}

	// The first rank's snapshot still applies; a later one began while it
	// staged is asked for again.
	out, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 1, BlockCount: perRank}}})
	if err != nil || len(out) != 1 || out[0].GetAck() == nil {
		t.Fatalf("rank 0's end: %v, %v; want an ack", out, err)
	}
	out, err = s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 1, Epoch: 1, Sequence: 1, BlockCount: perRank}}})
	if err != nil || len(out) != 1 || out[0].GetResync().GetReason() != pb.ResyncReason_RESYNC_REASON_SNAPSHOT_INVALID {
		t.Fatalf("rank 1's end: %v, %v; want a resync", out, err)
	}
}

// TestEventsThatDisagreeWithTheHelloAreReported (issue 36): a stream that
// announced block size 16 and whose GPU-tier events carry 64 (a sidecar
// that does not learn it: vLLM 0.34's default) is reported hash Mismatch
// in the pod's participation, whatever its heartbeats say, and counted
// once; CPU-tier events (LMCache's chunks) and events of the announced
// size are not a disagreement. A new hello announcing 64 clears it.
func TestEventsThatDisagreeWithTheHelloAreReported(t *testing.T) {
	ctx := context.Background()
	obs := &refusals{}
	ix := kvindex.New(kvindex.Options{Store: memstore.New(), Observer: obs})
	compat := func() pb.HashCompatibility {
		t.Helper()
		sum, err := ix.Participation(ctx, kvindex.Caller{Anonymous: true}, &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range sum.GetPodList() {
			if p.GetName() == "vllm-0" {
				return p.GetHashCompatibility()
			}
		}
		t.Fatalf("no pod vllm-0 in %v", sum)
		return 0
	}
	verified := &pb.IngestRequest{Message: &pb.IngestRequest_Heartbeat{Heartbeat: &pb.Heartbeat{HashCompatibility: pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED}}}
	stored := func(seq uint64, tier pb.Tier, bs uint32) *pb.IngestRequest {
		return &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Epoch: 1, Sequence: seq, Events: []*pb.BlockEvent{
			{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{BlockHashes: []uint64{seq}, Tier: tier, BlockSize: bs}}}}}}}
	}
	s := ix.NewSession(podCaller, func() {})
	for _, req := range []*pb.IngestRequest{helloOf(1, "cache"),
		{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Epoch: 1, Sequence: 0}}},
		{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Epoch: 1, Sequence: 0}}},
		stored(1, pb.Tier_TIER_GPU, 16), stored(2, pb.Tier_TIER_CPU, 256), verified} {
		if _, err := s.Handle(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if c := compat(); c != pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED || len(obs.disagreed) != 0 {
		t.Fatalf("agreeing events: %v, disagreements %v; want Verified, none", c, obs.disagreed)
	}
	for _, req := range []*pb.IngestRequest{stored(3, pb.Tier_TIER_GPU, 64), stored(4, pb.Tier_TIER_GPU, 64), verified} {
		if _, err := s.Handle(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if c := compat(); c != pb.HashCompatibility_HASH_COMPATIBILITY_MISMATCH || obs.disagreed["block_size"] != 1 {
		t.Fatalf("64-token events on a 16-token hello: %v, disagreements %v; want Mismatch, block_size: 1", c, obs.disagreed)
	}
	s.Close()

	s = ix.NewSession(podCaller, func() {})
	defer s.Close()
	hello := helloOf(1, "cache")
	hello.GetHello().HashScheme.BlockSize = 64
	for _, req := range []*pb.IngestRequest{hello, verified} {
		if _, err := s.Handle(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if c := compat(); c != pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED {
		t.Fatalf("after a hello announcing 64: %v, want Verified", c)
	}
}

// TestSummarySchemeLeavesOutPodsWithoutABlockSize: a pod whose subscriber
// announced no block size yet (0: it has seen no event) does not make the
// backend's hash scheme "mixed" or report a scheme of block size 0.
func TestSummarySchemeLeavesOutPodsWithoutABlockSize(t *testing.T) {
	ctx := context.Background()
	ix := kvindex.New(kvindex.Options{Store: memstore.New()})
	idle := helloFor("vllm-0", "u0", 1, "cache")
	idle.GetHello().HashScheme.BlockSize = 0
	busy := helloFor("vllm-1", "u1", 1, "cache")
	busy.GetHello().HashScheme.BlockSize = 64
	for _, h := range []*pb.IngestRequest{idle, busy} {
		s := ix.NewSession(kvindex.Caller{Anonymous: true}, func() {})
		defer s.Close()
		if _, err := s.Handle(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := ix.Participation(ctx, kvindex.Caller{Anonymous: true}, &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}})
	if err != nil {
		t.Fatal(err)
	}
	if sum.GetPods() != 2 || sum.GetHashScheme() != "sha256_cbor/64/vllm-none-hash" {
		t.Fatalf("summary: %d pods, scheme %q; want 2 pods and the busy pod's sha256_cbor/64/vllm-none-hash", sum.GetPods(), sum.GetHashScheme())
	}
}
