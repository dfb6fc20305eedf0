package kvevents_test

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// recordingIndex is an Ingest server that applies what arrives as the
// contract says (exactly once per rank, epoch and sequence; snapshots
// replace a rank) and records it. The interoperability test runs the
// subscriber against it and restarts it, empty, mid-stream.
type recordingIndex struct {
	pb.UnimplementedIngestServer
	mu               sync.Mutex
	ranks            map[uint32]*indexRank
	deltas           int // applied
	dupes            int // acked without applying
	snapshotsApplied int
	resyncs          map[pb.ResyncReason]int
	hellos           []*pb.Hello
	heartbeat        int
	rank0            pb.PodState // the state rank 0's last heartbeat reported
	srv              *grpc.Server
	addr             string
}

type indexRank struct {
	epoch, seq uint64
	blocks     map[uint64]uint32 // GPU blocks of the base model: hash -> refs
	staging    map[uint64]uint32
	stagingAt  *pb.SnapshotBegin
}

func startRecordingIndex(t *testing.T, addr string) index {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("index listen: %v", err)
	}
	ix := &recordingIndex{ranks: map[uint32]*indexRank{}, resyncs: map[pb.ResyncReason]int{}, addr: ln.Addr().String()}
	ix.srv = grpc.NewServer()
	pb.RegisterIngestServer(ix.srv, ix)
	go func() { _ = ix.srv.Serve(ln) }()
	return ix
}

func (ix *recordingIndex) stop() { ix.srv.Stop() }

func (ix *recordingIndex) holds(h uint64) (bool, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r := ix.ranks[0]
	return r != nil && r.blocks[h] > 0, nil
}

func (ix *recordingIndex) count() (int, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if r := ix.ranks[0]; r != nil {
		return len(r.blocks), nil
	}
	return 0, nil
}

func (ix *recordingIndex) snapshots() (int, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.snapshotsApplied, nil
}

func (ix *recordingIndex) state() (pb.PodState, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.rank0, nil
}

func (ix *recordingIndex) Stream(s grpc.BidiStreamingServer[pb.IngestRequest, pb.IngestResponse]) error {
	first, err := s.Recv()
	if err != nil {
		return err
	}
	h := first.GetHello()
	if h == nil {
		return errors.New("first message is not a hello")
	}
	ix.mu.Lock()
	ix.hellos = append(ix.hellos, h)
	w := &pb.Welcome{LeaseSeconds: 30, HeartbeatSeconds: 1, ProtocolVersion: 1}
	var resync []uint32
	for r := uint32(0); r < max(h.DataParallelSize, 1); r++ {
		if st := ix.ranks[r]; st != nil {
			w.Applied = append(w.Applied, &pb.RankPosition{Rank: r, Epoch: st.epoch, Sequence: st.seq})
		} else {
			resync = append(resync, r)
		}
	}
	ix.mu.Unlock()
	if err := s.Send(&pb.IngestResponse{Message: &pb.IngestResponse_Welcome{Welcome: w}}); err != nil {
		return err
	}
	for _, r := range resync {
		if err := ix.resync(s, r, pb.ResyncReason_RESYNC_REASON_UNKNOWN_RANK); err != nil {
			return err
		}
	}
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var reply *pb.IngestResponse
		var askRank *uint32
		var askReason pb.ResyncReason
		ix.mu.Lock()
		switch x := m.Message.(type) {
		case *pb.IngestRequest_Delta:
			d := x.Delta
			st := ix.ranks[d.Rank]
			switch {
			case st == nil:
				askRank, askReason = &d.Rank, pb.ResyncReason_RESYNC_REASON_UNKNOWN_RANK
			case d.Epoch == st.epoch && d.Sequence <= st.seq:
				ix.dupes++
				reply = ack(d.Rank, st)
			case d.Epoch == st.epoch && d.Sequence == st.seq+1:
				apply(st.blocks, d.Events)
				st.seq = d.Sequence
				ix.deltas++
				reply = ack(d.Rank, st)
			case d.Epoch != st.epoch:
				askRank, askReason = &d.Rank, pb.ResyncReason_RESYNC_REASON_EPOCH_CHANGED
			default:
				askRank, askReason = &d.Rank, pb.ResyncReason_RESYNC_REASON_GAP
			}
		case *pb.IngestRequest_SnapshotBegin:
			st := ix.rank(x.SnapshotBegin.Rank)
			st.staging, st.stagingAt = map[uint64]uint32{}, x.SnapshotBegin
		case *pb.IngestRequest_SnapshotChunk:
			st := ix.rank(x.SnapshotChunk.Rank)
			for _, e := range x.SnapshotChunk.Entries {
				for i, hash := range e.BlockHashes {
					n := uint32(1)
					if len(e.RefCounts) > 0 {
						n = e.RefCounts[i]
					}
					if e.Tier == pb.Tier_TIER_GPU && e.LoraName == "" {
						st.staging[hash] += n
					}
				}
			}
		case *pb.IngestRequest_SnapshotEnd:
			st := ix.rank(x.SnapshotEnd.Rank)
			st.blocks, st.epoch, st.seq = st.staging, x.SnapshotEnd.Epoch, x.SnapshotEnd.Sequence
			st.staging, st.stagingAt = nil, nil
			ix.snapshotsApplied++
			reply = ack(x.SnapshotEnd.Rank, st)
		case *pb.IngestRequest_Heartbeat:
			ix.heartbeat++
			for _, r := range x.Heartbeat.GetRanks() {
				if r.GetRank() == 0 {
					ix.rank0 = r.GetState()
				}
			}
		}
		ix.mu.Unlock()
		if reply != nil {
			if err := s.Send(reply); err != nil {
				return err
			}
		}
		if askRank != nil {
			if err := ix.resync(s, *askRank, askReason); err != nil {
				return err
			}
		}
	}
}

func (ix *recordingIndex) rank(r uint32) *indexRank {
	st := ix.ranks[r]
	if st == nil {
		st = &indexRank{blocks: map[uint64]uint32{}}
		ix.ranks[r] = st
	}
	return st
}

func (ix *recordingIndex) resync(s grpc.BidiStreamingServer[pb.IngestRequest, pb.IngestResponse], r uint32, reason pb.ResyncReason) error {
	ix.mu.Lock()
	ix.resyncs[reason]++
	ix.mu.Unlock()
	return s.Send(&pb.IngestResponse{Message: &pb.IngestResponse_Resync{Resync: &pb.ResyncRequest{Rank: r, Reason: reason}}})
}

func ack(r uint32, st *indexRank) *pb.IngestResponse {
	return &pb.IngestResponse{Message: &pb.IngestResponse_Ack{Ack: &pb.Ack{Applied: &pb.RankPosition{Rank: r, Epoch: st.epoch, Sequence: st.seq}}}}
}

func apply(blocks map[uint64]uint32, events []*pb.BlockEvent) {
	for _, e := range events {
		switch x := e.Event.(type) {
		case *pb.BlockEvent_Stored:
			if x.Stored.Tier == pb.Tier_TIER_GPU && x.Stored.LoraName == "" {
				for _, h := range x.Stored.BlockHashes {
					blocks[h]++
				}
			}
		case *pb.BlockEvent_Removed:
			if x.Removed.Tier == pb.Tier_TIER_GPU && x.Removed.LoraName == "" {
				for _, h := range x.Removed.BlockHashes {
					if blocks[h] <= 1 {
						delete(blocks, h)
					} else {
						blocks[h]--
					}
				}
			}
		case *pb.BlockEvent_Cleared:
			clear(blocks)
		}
	}
}

var _ pb.IngestServer = (*recordingIndex)(nil)
