package kvindex_test

import (
	"context"
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
	s := ix.NewSession(kvindex.Caller{Username: "system:serviceaccount:team-a:vllm", Namespace: "team-a", ServiceAccount: "vllm", PodName: "vllm-0", PodUID: "u0"}, func() {})
	defer s.Close()
	if _, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
		ProtocolVersion: kvindex.ProtocolVersion,
		Pod:             &pb.PodIdentity{Namespace: "team-a", Name: "vllm-0", Uid: "u0"},
		CacheBackend:    &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"},
		Model:           "m", Engine: "vllm", DataParallelSize: 2,
		HashScheme: &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 16},
	}}}); err != nil {
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
