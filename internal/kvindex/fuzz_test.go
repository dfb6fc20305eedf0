package kvindex_test

import (
	"context"
	"encoding/binary"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// ingestHello opens a stream for pod vllm-0 of team-a with two ranks.
func ingestHello() *pb.IngestRequest {
	return &pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
		ProtocolVersion: kvindex.ProtocolVersion,
		Pod:             &pb.PodIdentity{Namespace: "team-a", Name: "vllm-0", Uid: "u0"},
		CacheBackend:    &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"},
		Model:           "m", Engine: "vllm", DataParallelSize: 2,
		HashScheme: &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 16},
	}}}
}

// frames encodes msgs as the fuzz input FuzzIngest reads: each message
// preceded by its length in two bytes.
func frames(msgs ...*pb.IngestRequest) []byte {
	var out []byte
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
		out = append(out, b...)
	}
	return out
}

// FuzzIngest: after a valid Hello, any sequence of ingest messages (deltas,
// snapshot begins, chunks and ends, heartbeats, in any order, with any
// ranks, epochs, counts and hashes) never panics the index; each message
// is answered or refused, a refusal ending the stream as the gRPC server
// ends it; and the index still answers a score afterwards.
func FuzzIngest(f *testing.F) {
	stored := func(rank uint32, epoch, seq uint64, hashes ...uint64) *pb.IngestRequest {
		return &pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: &pb.Delta{Rank: rank, Epoch: epoch, Sequence: seq, Events: []*pb.BlockEvent{
			{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{BlockHashes: hashes, Tier: pb.Tier_TIER_GPU, BlockSize: 16}}},
		}}}}
	}
	f.Add(frames(stored(0, 1, 1, 1, 2, 3), stored(0, 1, 2, 4), stored(1, 1, 1, 9)))
	f.Add(frames(
		&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Rank: 0, Epoch: 1, Sequence: 5, BlockCount: 3}}},
		&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: &pb.SnapshotChunk{Rank: 0, Epoch: 1, Entries: []*pb.SnapshotEntries{{Tier: pb.Tier_TIER_GPU, BlockHashes: []uint64{1, 2, 3}, RefCounts: []uint32{1, 2, 1}}}}}},
		&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 0, Epoch: 1, Sequence: 5, BlockCount: 3}}},
		stored(0, 1, 6, 7),
	))
	f.Add(frames(
		&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{Rank: 1, Epoch: 2, Sequence: 1, BlockCount: 4_000_000}}},
		&pb.IngestRequest{Message: &pb.IngestRequest_Heartbeat{Heartbeat: &pb.Heartbeat{Ranks: []*pb.RankHealth{{Rank: 1, State: pb.PodState_POD_STATE_LIVE}}}}},
		&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{Rank: 1, Epoch: 2, Sequence: 1, BlockCount: 4_000_000}}},
	))
	f.Add(frames(ingestHello()))
	f.Fuzz(func(t *testing.T, in []byte) {
		ctx := context.Background()
		ix := kvindex.New(kvindex.Options{Store: memstore.New()})
		caller := kvindex.Caller{Username: "system:serviceaccount:team-a:vllm", Namespace: "team-a", ServiceAccount: "vllm", PodName: "vllm-0", PodUID: "u0"}
		s := ix.NewSession(caller, func() {})
		defer s.Close()
		if _, err := s.Handle(ctx, ingestHello()); err != nil {
			t.Fatal(err)
		}
		for n := 0; len(in) >= 2 && n < 64; n++ {
			size := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			if size > len(in) {
				size = len(in)
			}
			var m pb.IngestRequest
			if proto.Unmarshal(in[:size], &m) != nil {
				in = in[size:]
				continue
			}
			in = in[size:]
			if _, err := s.Handle(ctx, &m); err != nil {
				break // the server ends the stream with the error
			}
		}
		if _, err := ix.Score(ctx, kvindex.Caller{Namespace: "team-a"}, &pb.ScoreRequest{
			CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: "cache"}, Model: "m", BlockHashes: []uint64{1, 2, 3},
		}); err != nil {
			t.Fatalf("score after the stream: %v", err)
		}
	})
}
