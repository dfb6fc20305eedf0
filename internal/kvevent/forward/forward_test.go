package forward_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"

	"github.com/inferencecache/operator/internal/kvevent/forward"
	"github.com/inferencecache/operator/internal/kvevent/subscriber"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// fakeIndex records one session at a time. welcome is what it answers a
// hello with; ackUpTo limits the acks it sends (0: ack everything);
// closeAfter ends the stream after that many deltas.
type fakeIndex struct {
	pb.UnimplementedIngestServer
	mu         sync.Mutex
	welcome    *pb.Welcome
	ackUpTo    uint64
	closeAfter int
	hellos     []*pb.Hello
	deltas     []uint64 // sequences received
	snapshots  []*pb.SnapshotEnd
	heartbeats int
}

func (f *fakeIndex) Stream(s grpc.BidiStreamingServer[pb.IngestRequest, pb.IngestResponse]) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.hellos = append(f.hellos, m.GetHello())
	w := f.welcome
	f.mu.Unlock()
	if w == nil {
		w = &pb.Welcome{HeartbeatSeconds: 60}
	}
	if err := s.Send(&pb.IngestResponse{Message: &pb.IngestResponse_Welcome{Welcome: w}}); err != nil {
		return err
	}
	n := 0
	for {
		m, err := s.Recv()
		if err != nil {
			return nil
		}
		f.mu.Lock()
		var ack *pb.RankPosition
		switch x := m.Message.(type) {
		case *pb.IngestRequest_Delta:
			f.deltas = append(f.deltas, x.Delta.Sequence)
			n++
			if f.ackUpTo == 0 || x.Delta.Sequence <= f.ackUpTo {
				ack = &pb.RankPosition{Rank: x.Delta.Rank, Epoch: x.Delta.Epoch, Sequence: x.Delta.Sequence}
			}
		case *pb.IngestRequest_SnapshotEnd:
			f.snapshots = append(f.snapshots, x.SnapshotEnd)
			ack = &pb.RankPosition{Rank: x.SnapshotEnd.Rank, Epoch: x.SnapshotEnd.Epoch, Sequence: x.SnapshotEnd.Sequence}
		case *pb.IngestRequest_Heartbeat:
			f.heartbeats++
		}
		closeNow := f.closeAfter > 0 && n >= f.closeAfter
		f.mu.Unlock()
		if ack != nil {
			if err := s.Send(&pb.IngestResponse{Message: &pb.IngestResponse_Ack{Ack: &pb.Ack{Applied: ack}}}); err != nil {
				return err
			}
		}
		if closeNow {
			return nil
		}
	}
}

func (f *fakeIndex) state() (hellos int, deltas []uint64, snaps int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.hellos), append([]uint64(nil), f.deltas...), len(f.snapshots)
}

func serve(t *testing.T, f *fakeIndex, addr string) (string, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pb.RegisterIngestServer(s, f)
	go func() { _ = s.Serve(ln) }()
	return ln.Addr().String(), s.Stop
}

// source is a rank whose snapshot is at (epoch, seq).
type source struct {
	mu         sync.Mutex
	epoch, seq uint64
	blockSize  uint32
	tier       *pb.HashScheme
}

func (s *source) Snapshot(context.Context) (*subscriber.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &subscriber.Snapshot{Epoch: s.epoch, Sequence: s.seq, Count: 1, Chunks: []*pb.SnapshotChunk{{Epoch: s.epoch,
		Entries: []*pb.SnapshotEntries{{Tier: pb.Tier_TIER_GPU, BlockHashes: []uint64{7}}}}}}, nil
}
func (s *source) HashSeed() string { return "0" }
func (s *source) BlockSize() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blockSize
}
func (s *source) TierScheme() *pb.HashScheme {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tier
}
func (s *source) Health() *pb.RankHealth { return &pb.RankHealth{} }
func (s *source) HashCompatibility() pb.HashCompatibility {
	return pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED
}

// startAtEpochStart runs a forwarder of one rank at epoch 5 against a fake
// index that holds that rank at the epoch's start.
func startAtEpochStart(t *testing.T) (*fakeIndex, *source, chan *pb.Delta) {
	t.Helper()
	f := &fakeIndex{welcome: &pb.Welcome{HeartbeatSeconds: 60, Applied: []*pb.RankPosition{{Epoch: 5, Sequence: 0}}}}
	addr, stop := serve(t, f, "127.0.0.1:0")
	t.Cleanup(stop)
	src := &source{epoch: 5}
	in := make(chan *pb.Delta, 16)
	start(t, addr, 100, src, in, &depth{})
	return f, src, in
}

func delta(epoch, seq uint64) *pb.Delta {
	return &pb.Delta{Epoch: epoch, Sequence: seq, Events: []*pb.BlockEvent{{Event: &pb.BlockEvent_Stored{Stored: &pb.BlockStored{BlockHashes: []uint64{seq}}}}}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 200; i++ {
		if cond() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

type depth struct {
	mu sync.Mutex
	n  int
}

func (d *depth) set(n int) { d.mu.Lock(); d.n = n; d.mu.Unlock() }
func (d *depth) get() int  { d.mu.Lock(); defer d.mu.Unlock(); return d.n }

func start(t *testing.T, addr string, limit int, src *source, in chan *pb.Delta, dp *depth) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	fw := forward.New(forward.Config{Target: addr, JournalLimit: limit, Backoff: 50 * time.Millisecond, Hello: &pb.Hello{DataParallelSize: 1,
		HashScheme: &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 16}}},
		logr.Discard(), forward.Metrics{JournalDepth: dp.set}, in, map[uint32]forward.Source{0: src})
	done := make(chan struct{})
	go func() { _ = fw.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestAcksEmptyTheJournal: acked deltas leave the journal.
func TestAcksEmptyTheJournal(t *testing.T) {
	f := &fakeIndex{welcome: &pb.Welcome{HeartbeatSeconds: 60, Applied: []*pb.RankPosition{{Epoch: 5, Sequence: 0}}}, ackUpTo: 2}
	addr, stop := serve(t, f, "127.0.0.1:0")
	defer stop()
	src := &source{epoch: 5}
	in := make(chan *pb.Delta, 16)
	dp := &depth{}
	start(t, addr, 100, src, in, dp)
	// The first delta of an epoch the forwarder has not sent yet goes with
	// a snapshot at the source's position (here 0), then the deltas.
	for s := uint64(1); s <= 3; s++ {
		in <- delta(5, s)
	}
	waitFor(t, "three deltas", func() bool { _, d, _ := f.state(); return len(d) == 3 })
	waitFor(t, "journal of the one unacked delta", func() bool { return dp.get() == 1 })
	f.mu.Lock()
	seed := f.hellos[0].GetHashScheme().GetSeed()
	f.mu.Unlock()
	if seed != "0" {
		t.Fatalf("hello seed %q, want the verified seed \"0\"", seed)
	}
}

// TestReconnectResumesFromTheIndex: after a reconnect only the deltas the
// index did not apply are sent again, without a snapshot.
func TestReconnectResumesFromTheIndex(t *testing.T) {
	f1 := &fakeIndex{ackUpTo: 1, closeAfter: 3}
	addr, stop1 := serve(t, f1, "127.0.0.1:0")
	src := &source{epoch: 5}
	in := make(chan *pb.Delta, 16)
	dp := &depth{}
	start(t, addr, 100, src, in, dp)
	for s := uint64(1); s <= 3; s++ {
		in <- delta(5, s)
	}
	waitFor(t, "three deltas", func() bool { _, d, _ := f1.state(); return len(d) == 3 })
	stop1()
	// The new index applied up to 2 under epoch 5.
	f2 := &fakeIndex{welcome: &pb.Welcome{HeartbeatSeconds: 60, Applied: []*pb.RankPosition{{Epoch: 5, Sequence: 2}}}}
	_, stop2 := serve(t, f2, addr)
	defer stop2()
	in <- delta(5, 4)
	waitFor(t, "deltas 3 and 4", func() bool { _, d, _ := f2.state(); return len(d) == 2 })
	_, d, snaps := f2.state()
	if d[0] != 3 || d[1] != 4 || snaps != 0 {
		t.Fatalf("resumed with deltas %v and %d snapshots, want [3 4] and none", d, snaps)
	}
	waitFor(t, "empty journal", func() bool { return dp.get() == 0 })
}

// TestJournalOverflowResendsASnapshot: while the index is away, more
// deltas than the journal holds arrive; on reconnect the rank goes as a
// snapshot, and the journal never holds more than its limit.
func TestJournalOverflowResendsASnapshot(t *testing.T) {
	f1 := &fakeIndex{ackUpTo: 1, closeAfter: 1}
	addr, stop1 := serve(t, f1, "127.0.0.1:0")
	src := &source{epoch: 5}
	in := make(chan *pb.Delta, 16)
	dp := &depth{}
	start(t, addr, 3, src, in, dp)
	in <- delta(5, 1)
	waitFor(t, "first delta", func() bool { _, d, _ := f1.state(); return len(d) == 1 })
	stop1()
	max := 0
	for s := uint64(2); s <= 9; s++ {
		in <- delta(5, s)
		time.Sleep(5 * time.Millisecond)
		if n := dp.get(); n > max {
			max = n
		}
	}
	src.mu.Lock()
	src.seq = 9
	src.mu.Unlock()
	f2 := &fakeIndex{welcome: &pb.Welcome{HeartbeatSeconds: 60, Applied: []*pb.RankPosition{{Epoch: 5, Sequence: 1}}}}
	_, stop2 := serve(t, f2, addr)
	defer stop2()
	waitFor(t, "a snapshot", func() bool { _, _, s := f2.state(); return s == 1 })
	if _, d, _ := f2.state(); len(d) != 0 {
		t.Fatalf("deltas %v resent after the journal overflowed; want the snapshot only", d)
	}
	if max > 3 {
		t.Fatalf("journal held %d deltas, over its limit of 3", max)
	}
}

// TestDroppedDeltaResendsASnapshot: a delta the subscriber dropped (its
// queue was full) shows as a sequence skip; the forwarder sends the mirror
// instead of a delta the index would refuse.
func TestDroppedDeltaResendsASnapshot(t *testing.T) {
	f, src, in := startAtEpochStart(t)
	in <- delta(5, 1)
	waitFor(t, "delta 1", func() bool { _, d, _ := f.state(); return len(d) == 1 })
	_, _, before := f.state() // the first delta of a subscriber's epoch goes with a snapshot
	src.mu.Lock()
	src.seq = 3
	src.mu.Unlock()
	in <- delta(5, 3) // 2 was dropped
	in <- delta(5, 4)
	waitFor(t, "delta 4", func() bool { _, d, _ := f.state(); return len(d) == 2 })
	_, d, snaps := f.state()
	if snaps != before+1 || d[1] != 4 {
		t.Fatalf("deltas %v, %d snapshots after delta 1; want [1 4] around one snapshot", d, snaps-before)
	}
}

// TestBlockSizeFromTheEventsIsAnnounced (issue 36): the hello announces
// the configured block size (16) until the engine's events carry another
// (vLLM 0.34's 64); then the forwarder ends the stream, announces the
// events' block size in a new hello and resends the rank whole as a
// snapshot, so that no block stays in the old scheme's space. Before the
// fix the stream stayed on 16: the index hashed token queries with it and
// matched nothing.
func TestBlockSizeFromTheEventsIsAnnounced(t *testing.T) {
	f, src, in := startAtEpochStart(t)
	in <- delta(5, 1)
	waitFor(t, "the first delta", func() bool { _, d, _ := f.state(); return len(d) == 1 })
	src.mu.Lock()
	src.blockSize, src.seq = 64, 1
	src.mu.Unlock()
	in <- delta(5, 2)
	waitFor(t, "a second hello and a snapshot", func() bool { h, _, s := f.state(); return h == 2 && s >= 1 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.hellos[0].GetHashScheme().GetBlockSize(); got != 16 {
		t.Fatalf("first hello block size %d, want the configured 16", got)
	}
	if got := f.hellos[1].GetHashScheme().GetBlockSize(); got != 64 {
		t.Fatalf("second hello block size %d, want the events' 64", got)
	}
	if sc := f.hellos[1].GetHashScheme(); sc.GetAlgorithm() != "sha256_cbor" || sc.GetSeed() != "0" {
		t.Fatalf("second hello scheme %v: algorithm and verified seed kept", sc)
	}
}

// TestTierSchemeIsAnnounced (issue 36): LMCache's CPU chunks, once the
// subscriber verified them, are announced in a new hello with the rank
// resent whole, so the index moves them into their own scheme's space.
func TestTierSchemeIsAnnounced(t *testing.T) {
	f, src, in := startAtEpochStart(t)
	in <- delta(5, 1)
	waitFor(t, "the first delta", func() bool { _, d, _ := f.state(); return len(d) == 1 })
	src.mu.Lock()
	src.tier, src.seq = &pb.HashScheme{Algorithm: "lmcache_blake3", BlockSize: 256}, 1
	src.mu.Unlock()
	in <- delta(5, 2)
	waitFor(t, "a second hello and a snapshot", func() bool { h, _, s := f.state(); return h == 2 && s >= 1 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.hellos[0].GetTierScheme(); got != nil {
		t.Fatalf("first hello tier scheme %v, want none before the chunks were verified", got)
	}
	if got := f.hellos[1].GetTierScheme(); got.GetAlgorithm() != "lmcache_blake3" || got.GetBlockSize() != 256 {
		t.Fatalf("second hello tier scheme %v, want lmcache_blake3/256", got)
	}
	if got := f.hellos[1].GetHashScheme().GetBlockSize(); got != 16 {
		t.Fatalf("second hello block size %d, want the configured 16 kept", got)
	}
}

// TestTierSchemeNotAWholeNumberOfBlocksIsNotAnnounced: a tier scheme whose
// chunk is not a whole number of the announced blocks is never put in a
// hello (the index would refuse the hello, and the forwarder would open the
// same refused stream forever).
func TestTierSchemeNotAWholeNumberOfBlocksIsNotAnnounced(t *testing.T) {
	f, src, in := startAtEpochStart(t)
	src.mu.Lock()
	src.tier = &pb.HashScheme{Algorithm: "lmcache_blake3", BlockSize: 40}
	src.mu.Unlock()
	for seq := uint64(1); seq <= 3; seq++ {
		in <- delta(5, seq)
	}
	waitFor(t, "three deltas", func() bool { _, d, _ := f.state(); return len(d) == 3 })
	hellos, _, _ := f.state()
	f.mu.Lock()
	defer f.mu.Unlock()
	if hellos != 1 || f.hellos[0].GetTierScheme() != nil {
		t.Fatalf("%d hellos, the first with tier scheme %v; want one hello without it", hellos, f.hellos[0].GetTierScheme())
	}
}
