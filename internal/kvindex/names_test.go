package kvindex_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// TestReadsCreateNoState repeats issue 35's attack: 3,000 participation
// reads with 32 KiB names, then 3,000 with distinct names of a valid
// length, for backends nobody publishes for. Reads answer (the long
// names with InvalidArgument naming the field, the others with an empty
// summary) and leave nothing behind: no rate window, and the heap does
// not grow. Before, each read made a rate window keyed by its names
// (3,000 reads of 32 KiB names kept about 120 MiB).
func TestReadsCreateNoState(t *testing.T) {
	ctx := context.Background()
	ix := kvindex.New(kvindex.Options{Store: memstore.New()})
	anyone := kvindex.Caller{Anonymous: true}
	long := strings.Repeat("x", 32<<10)
	before := heap()
	var misnamed int // long names not refused with InvalidArgument naming the field
	for i := range 3000 {
		name := fmt.Sprintf("%s-%d", long, i)
		_, err := ix.Participation(ctx, anyone, &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: name}})
		if !errors.Is(err, kvindex.ErrInvalid) || !strings.Contains(err.Error(), "cache_backend.name") {
			misnamed++
		}
		_, err = ix.Participation(ctx, anyone, &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: name, Name: "cache"}})
		if !errors.Is(err, kvindex.ErrInvalid) || !strings.Contains(err.Error(), "cache_backend.namespace") {
			misnamed++
		}
	}
	for i := range 3000 {
		name := fmt.Sprintf("cache-%057d", i) // 63 bytes, distinct
		sum, err := ix.Participation(ctx, anyone, &pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: name}})
		if err != nil || sum.GetPods() != 0 {
			t.Fatalf("participation of unknown backend %s: %v, %d pods", name, err, sum.GetPods())
		}
		if _, err := ix.Score(ctx, anyone, &pb.ScoreRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: name}, Model: name, BlockHashes: []uint64{1}}); err != nil {
			t.Fatalf("score of unknown backend %s: %v", name, err)
		}
	}
	grew := int64(heap()) - int64(before)
	if misnamed > 0 {
		t.Errorf("%d of 6,000 reads with 32 KiB names were not refused with InvalidArgument naming the field", misnamed)
	}
	if n := kvindex.RateWindows(ix); n != 0 {
		t.Errorf("%d rate windows after 9,000 reads of backends nobody publishes for, want 0", n)
	}
	if grew > 1<<20 {
		t.Errorf("9,000 reads of unknown backends grew the heap by %d bytes, want < 1 MiB", grew)
	}
	t.Logf("9,000 reads of unknown backends: %d rate windows, heap grew %d bytes", kvindex.RateWindows(ix), grew)
}

// TestOverlongNamesAreRefused: every name a caller sends, on queries and
// on ingest, is bounded, and the refusal (InvalidArgument) names the
// field; a Hello refused so leaves no pod behind.
func TestOverlongNamesAreRefused(t *testing.T) {
	ctx := context.Background()
	anyone := kvindex.Caller{Anonymous: true}
	over := func(n int) string { return strings.Repeat("x", n+1) }
	ref := &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}
	queries := []struct {
		field string
		req   *pb.ScoreRequest
	}{
		{"cache_backend.namespace", &pb.ScoreRequest{CacheBackend: &pb.CacheBackendRef{Namespace: over(63), Name: "cache"}, Model: "m"}},
		{"cache_backend.name", &pb.ScoreRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: over(63)}, Model: "m"}},
		{"model", &pb.ScoreRequest{CacheBackend: ref, Model: over(256)}},
		{"lora_name", &pb.ScoreRequest{CacheBackend: ref, Model: "m", LoraName: over(256)}},
		{"candidate_pods[1]", &pb.ScoreRequest{CacheBackend: ref, Model: "m", CandidatePods: []string{"a", over(253)}}},
		{"candidate_pods", &pb.ScoreRequest{CacheBackend: ref, Model: "m", CandidatePods: make([]string, 1025)}},
	}
	ix := kvindex.New(kvindex.Options{Store: memstore.New()})
	for _, q := range queries {
		t.Run("score "+q.field, func(t *testing.T) {
			_, err := ix.Score(ctx, anyone, q.req)
			if !errors.Is(err, kvindex.ErrInvalid) || !strings.Contains(err.Error(), q.field) {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, q.field)
			}
		})
	}
	hellos := []struct {
		field string
		edit  func(h *pb.Hello)
	}{
		{"pod.namespace", func(h *pb.Hello) { h.Pod.Namespace, h.CacheBackend.Namespace = over(63), over(63) }},
		{"pod.name", func(h *pb.Hello) { h.Pod.Name = over(253) }},
		{"pod.uid", func(h *pb.Hello) { h.Pod.Uid = over(64) }},
		{"cache_backend.name", func(h *pb.Hello) { h.CacheBackend.Name = over(63) }},
		{"model", func(h *pb.Hello) { h.Model = over(256) }},
		{"engine", func(h *pb.Hello) { h.Engine = over(64) }},
		{"hash_scheme.algorithm", func(h *pb.Hello) { h.HashScheme.Algorithm = over(64) }},
		{"hash_scheme.seed", func(h *pb.Hello) { h.HashScheme.Seed = over(256) }},
	}
	for _, tt := range hellos {
		t.Run("hello "+tt.field, func(t *testing.T) {
			store := memstore.New()
			ix := kvindex.New(kvindex.Options{Store: store})
			s := ix.NewSession(anyone, func() {})
			defer s.Close()
			m := helloOf(1, "cache")
			tt.edit(m.GetHello())
			_, err := s.Handle(ctx, m)
			if !errors.Is(err, kvindex.ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tt.field)
			}
			be := m.GetHello().GetCacheBackend()
			if pods, _ := store.Pods(ctx, kvindex.BackendRef{Namespace: be.GetNamespace(), Name: be.GetName()}); len(pods) != 0 {
				t.Errorf("a refused hello left %d pods", len(pods))
			}
		})
	}
	ingest := []struct {
		field string
		m     *pb.IngestRequest
	}{
		{"delta.events[1].lora_name", &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Epoch: 1, Sequence: 1, Events: []*pb.BlockEvent{
			{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{Tier: pb.Tier_TIER_GPU, BlockHashes: []uint64{1}}}},
			{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{Tier: pb.Tier_TIER_GPU, BlockHashes: []uint64{2}, LoraName: over(256)}}},
		}}}}},
		{"delta.events[0].lora_name", &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Epoch: 1, Sequence: 1, Events: []*pb.BlockEvent{
			{Event: &pb.BlockEvent_Removed{Removed: &pb.BlockRemoved{Tier: pb.Tier_TIER_GPU, BlockHashes: []uint64{1}, LoraName: over(256)}}},
		}}}}},
		{"snapshot_chunk.entries[0].lora_name", &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: &pb.SnapshotChunk{Epoch: 1, Entries: []*pb.SnapshotEntries{
			{Tier: pb.Tier_TIER_GPU, BlockHashes: []uint64{1}, LoraName: over(256)},
		}}}}},
	}
	for _, tt := range ingest {
		t.Run(tt.field, func(t *testing.T) {
			store := memstore.New()
			ix := kvindex.New(kvindex.Options{Store: store})
			s := ix.NewSession(anyone, func() {})
			defer s.Close()
			if _, err := s.Handle(ctx, helloOf(1, "cache")); err != nil {
				t.Fatal(err)
			}
			if tt.m.GetSnapshotChunk() != nil {
				if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Epoch: 1, Sequence: 1, BlockCount: 1}}}); err != nil {
					t.Fatal(err)
				}
			}
			_, err := s.Handle(ctx, tt.m)
			if !errors.Is(err, kvindex.ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tt.field)
			}
			if n, _ := store.TierBlocks(ctx, kvindex.BackendRef{Namespace: "team-a", Name: "cache"}); n != [kvindex.NumTiers]uint64{} {
				t.Errorf("a refused change left blocks: %v", n)
			}
			if n := kvindex.StagedBlocks(ix); n != 0 {
				t.Errorf("a refused chunk left %d entries staged", n)
			}
		})
	}
}
