// Package forward streams a subscriber's deltas to the KV-block index over
// the kvindex.v1 Ingest contract: Hello, then deltas in order per rank,
// snapshots when the index asks or when the subscriber lost track (a new
// epoch, a dropped delta, a journal that overflowed), heartbeats while idle.
//
// Sent deltas stay in a bounded journal until the index acks them, so a
// reconnect resumes where the index stands instead of resending everything.
// The forwarder reads deltas from a channel the subscriber never blocks on.
package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/inferencecache/operator/internal/kvevent/hashcheck"
	"github.com/inferencecache/operator/internal/kvevent/subscriber"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// Source is one rank as the forwarder needs it.
type Source interface {
	Snapshot(ctx context.Context) (*subscriber.Snapshot, error)
	Health() *pb.RankHealth
	HashCompatibility() pb.HashCompatibility
	// HashSeed is the NONE_HASH seed verification matched; "" if none yet.
	HashSeed() string
	// BlockSize is the block size of the engine's own BlockStored events;
	// 0 before the first.
	BlockSize() uint32
	// TierScheme is the verified scheme of the engine's other tiers
	// (LMCache's chunks), or nil.
	TierScheme() *pb.HashScheme
}

// Config configures the forwarder.
type Config struct {
	Target string // the index's gRPC address (host:port)
	Hello  *pb.Hello
	// TokenFile holds the bearer token (a projected ServiceAccount token),
	// read again on every connect; empty sends none.
	TokenFile string
	// JournalLimit bounds the unacknowledged deltas kept for a reconnect,
	// over all ranks; past it a rank's journal is dropped and the rank is
	// resent as a snapshot.
	JournalLimit int
	// Heartbeat is the idle heartbeat period until the index says otherwise.
	Heartbeat time.Duration
	// Backoff between connection attempts.
	Backoff time.Duration
	// DialOptions replace the default (plaintext) transport options.
	DialOptions []grpc.DialOption
	// Join: the forwarder starts while the subscriber's stream is already
	// running (an index replica that appeared later), so every rank is sent
	// as a snapshot on its first connect instead of waiting for the next
	// delta to reveal the gap.
	Join bool
	// Disconnected, if set, is called each time a stream ends or fails to
	// open (the fan-out re-resolves the index's replicas then).
	Disconnected func()
}

// Metrics the forwarder updates (all optional).
type Metrics struct {
	JournalDepth func(int)
	Snapshot     func(reason string)
	Connected    func(bool)
}

type rankState struct {
	epoch   uint64
	seq     uint64      // last delta sequence sent (or covered by a snapshot)
	journal []*pb.Delta // sent, not acked, in order
	lost    bool        // the journal overflowed: resend a snapshot on reconnect
	valid   bool
}

// Forwarder sends deltas to the index.
type Forwarder struct {
	cfg     Config
	log     logr.Logger
	m       Metrics
	in      <-chan *pb.Delta
	sources map[uint32]Source
	ranks   map[uint32]*rankState
	depth   int
	// announced is the block size the current stream's hello announced,
	// announcedTier its tier scheme ("" for none).
	announced     uint32
	announcedTier string
}

// New returns a forwarder reading deltas from in.
func New(cfg Config, log logr.Logger, m Metrics, in <-chan *pb.Delta, sources map[uint32]Source) *Forwarder {
	if cfg.JournalLimit <= 0 {
		cfg.JournalLimit = 50_000
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = time.Second
	}
	if m.JournalDepth == nil {
		m.JournalDepth = func(int) {}
	}
	if m.Snapshot == nil {
		m.Snapshot = func(string) {}
	}
	if m.Connected == nil {
		m.Connected = func(bool) {}
	}
	f := &Forwarder{cfg: cfg, log: log, m: m, in: in, sources: sources, ranks: map[uint32]*rankState{}}
	for r := range sources {
		f.ranks[r] = &rankState{}
	}
	return f
}

// Run connects and forwards until ctx ends. While disconnected it keeps
// reading deltas into the journal, so the subscriber never waits.
func (f *Forwarder) Run(ctx context.Context) error {
	opts := f.cfg.DialOptions
	if opts == nil {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(f.cfg.Target, opts...)
	if err != nil {
		return fmt.Errorf("index client for %s: %w", f.cfg.Target, err)
	}
	defer func() { _ = conn.Close() }()
	client := pb.NewIngestClient(conn)
	for ctx.Err() == nil {
		err := f.session(ctx, client)
		f.m.Connected(false)
		if ctx.Err() != nil {
			return nil
		}
		if f.cfg.Disconnected != nil {
			f.cfg.Disconnected()
		}
		f.log.Info("index stream ended; reconnecting", "target", f.cfg.Target, "error", errString(err))
		f.drainFor(ctx, f.cfg.Backoff)
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// drainFor keeps journaling deltas while disconnected.
func (f *Forwarder) drainFor(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case dl := <-f.in:
			f.journalOnly(dl)
		}
	}
}

// journalOnly records a delta that could not be sent now.
func (f *Forwarder) journalOnly(d *pb.Delta) {
	st := f.rank(d.Rank)
	if !st.valid || st.lost || d.Epoch != st.epoch || d.Sequence != st.seq+1 {
		// Out of line: the rank will be resent whole on reconnect.
		f.drop(st)
		st.lost = true
		return
	}
	f.record(st, d)
}

func (f *Forwarder) rank(r uint32) *rankState {
	st, ok := f.ranks[r]
	if !ok {
		st = &rankState{}
		f.ranks[r] = st
	}
	return st
}

func (f *Forwarder) drop(st *rankState) {
	f.depth -= len(st.journal)
	st.journal = nil
	f.m.JournalDepth(f.depth)
}

func (f *Forwarder) record(st *rankState, d *pb.Delta) {
	st.epoch, st.seq = d.Epoch, d.Sequence
	if f.depth >= f.cfg.JournalLimit {
		f.drop(st)
		st.lost = true
		return
	}
	st.journal = append(st.journal, d)
	f.depth++
	f.m.JournalDepth(f.depth)
}

func (f *Forwarder) token() (string, error) {
	if f.cfg.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(f.cfg.TokenFile)
	if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

type stream = grpc.BidiStreamingClient[pb.IngestRequest, pb.IngestResponse]

func (f *Forwarder) session(ctx context.Context, client pb.IngestClient) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tok, err := f.token()
	if err != nil {
		return err
	}
	if tok != "" {
		sctx = metadata.AppendToOutgoingContext(sctx, "authorization", "Bearer "+tok)
	}
	s, err := client.Stream(sctx)
	if err != nil {
		return fmt.Errorf("open ingest stream: %w", err)
	}
	hello := &pb.Hello{}
	if f.cfg.Hello != nil {
		hello = cloneHello(f.cfg.Hello)
	}
	hello.HashCompatibility = f.hashCompatibility()
	for _, src := range f.sources {
		if seed := src.HashSeed(); seed != "" && hello.HashScheme != nil {
			// The seed the engine really uses, found by verification.
			sc := hello.HashScheme
			hello.HashScheme = &pb.HashScheme{Algorithm: sc.GetAlgorithm(), Seed: seed, BlockSize: sc.GetBlockSize()}
			break
		}
	}
	if bs := f.blockSize(); bs > 0 && hello.HashScheme != nil && bs != hello.HashScheme.GetBlockSize() {
		// The block size the engine's events carry, not the configured
		// guess (vLLM picks it with its attention backend).
		sc := hello.HashScheme
		hello.HashScheme = &pb.HashScheme{Algorithm: sc.GetAlgorithm(), Seed: sc.GetSeed(), BlockSize: bs}
	}
	hello.TierScheme = f.tierScheme(hello.GetHashScheme().GetBlockSize())
	f.announced, f.announcedTier = hello.GetHashScheme().GetBlockSize(), tierKey(hello.TierScheme)
	for r, st := range f.ranks {
		if st.valid {
			hello.Ranks = append(hello.Ranks, &pb.RankPosition{Rank: r, Epoch: st.epoch, Sequence: st.seq})
		}
	}
	if err := s.Send(&pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: hello}}); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	first, err := s.Recv()
	if err != nil {
		return fmt.Errorf("receive welcome: %w", err)
	}
	w := first.GetWelcome()
	if w == nil {
		return errors.New("index answered the hello without a welcome")
	}
	f.m.Connected(true)
	hb := f.cfg.Heartbeat
	if w.HeartbeatSeconds > 0 {
		hb = time.Duration(w.HeartbeatSeconds) * time.Second
	}
	applied := map[uint32]*pb.RankPosition{}
	for _, p := range w.Applied {
		applied[p.Rank] = p
	}
	// Resume each rank from what the index holds, or resend it whole.
	for r, st := range f.ranks {
		p := applied[r]
		if err := f.resume(sctx, s, r, st, p); err != nil {
			return err
		}
	}
	responses := make(chan *pb.IngestResponse, 64)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case responses <- m:
			case <-sctx.Done():
				return
			}
		}
	}()
	ticker := time.NewTicker(hb)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = s.CloseSend()
			return nil
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return errors.New("index closed the stream")
			}
			return err
		case m := <-responses:
			if err := f.response(sctx, s, m); err != nil {
				return err
			}
		case <-ticker.C:
			if err := f.reannounce(); err != nil {
				return err
			}
			if err := f.heartbeat(s); err != nil {
				return err
			}
		case d := <-f.in:
			if err := f.forward(sctx, s, d); err != nil {
				return err
			}
			if err := f.reannounce(); err != nil {
				return err
			}
		}
	}
}

func cloneHello(h *pb.Hello) *pb.Hello {
	c := &pb.Hello{ProtocolVersion: h.ProtocolVersion, Pod: h.Pod, CacheBackend: h.CacheBackend, Model: h.Model, Engine: h.Engine,
		HashScheme: h.HashScheme, DataParallelSize: h.DataParallelSize, SubscriberVersion: h.SubscriberVersion,
		WorkerAddress: h.WorkerAddress}
	return c
}

// blockSize is the block size the engine's events carry (the first rank
// that has seen one), or 0.
func (f *Forwarder) blockSize() uint32 {
	for _, src := range f.sources {
		if bs := src.BlockSize(); bs > 0 {
			return bs
		}
	}
	return 0
}

// tierScheme is the other tiers' verified scheme (the first rank that has
// one) when its chunk is a whole number of blocks of size bs (the index
// refuses any other, as LMCache's connector does), or nil.
func (f *Forwarder) tierScheme(bs uint32) *pb.HashScheme {
	for _, src := range f.sources {
		if sc := src.TierScheme(); sc != nil {
			if !hashcheck.WholeBlocks(sc.GetBlockSize(), bs) {
				return nil
			}
			return sc
		}
	}
	return nil
}

func tierKey(sc *pb.HashScheme) string {
	if sc == nil {
		return ""
	}
	return fmt.Sprintf("%s/%d", sc.GetAlgorithm(), sc.GetBlockSize())
}

// errReannounce ends a stream whose hello announced another block size
// (or tier scheme) than the engine's events carry.
var errReannounce = errors.New("the hash scheme changed")

// reannounce ends the stream when the engine's events carry another block
// size than its hello announced: the index hashes token queries with the
// announced one. Every rank is resent whole on the next stream, under the
// new hello, so that no block stays in the old scheme's space (a snapshot
// replaces everything the rank held).
//
// The same holds for the other tiers' scheme: once LMCache's chunks are
// verified, the next hello announces it and the index moves those tiers
// into its space.
func (f *Forwarder) reannounce() error {
	if f.cfg.Hello == nil || f.cfg.Hello.HashScheme == nil {
		return nil
	}
	var why string
	if bs := f.blockSize(); bs != 0 && bs != f.announced {
		why = fmt.Sprintf("the engine's events carry block size %d, the stream announced %d", bs, f.announced)
	} else if tk := tierKey(f.tierScheme(f.announced)); tk != f.announcedTier {
		why = fmt.Sprintf("the engine's other tiers carry the scheme %q, the stream announced %q", tk, f.announcedTier)
	} else {
		return nil
	}
	for _, st := range f.ranks {
		f.drop(st)
		st.lost = true
	}
	return fmt.Errorf("%s: %w", why, errReannounce)
}

func (f *Forwarder) hashCompatibility() pb.HashCompatibility {
	worst := pb.HashCompatibility_HASH_COMPATIBILITY_UNSPECIFIED
	for _, src := range f.sources {
		h := src.HashCompatibility()
		switch {
		case h == pb.HashCompatibility_HASH_COMPATIBILITY_MISMATCH:
			return h
		case h == pb.HashCompatibility_HASH_COMPATIBILITY_UNVERIFIABLE,
			worst == pb.HashCompatibility_HASH_COMPATIBILITY_UNSPECIFIED:
			worst = h
		}
	}
	if worst == pb.HashCompatibility_HASH_COMPATIBILITY_UNSPECIFIED {
		worst = pb.HashCompatibility_HASH_COMPATIBILITY_UNVERIFIABLE
	}
	return worst
}

// resume brings one rank of a new stream in line with the index.
func (f *Forwarder) resume(ctx context.Context, s stream, r uint32, st *rankState, p *pb.RankPosition) error {
	if !st.valid && f.cfg.Join {
		return f.snapshot(ctx, s, r, "join")
	}
	if p == nil || p.Epoch != st.epoch {
		// The index sends a ResyncRequest for such a rank right after its
		// Welcome; the snapshot goes out then.
		return nil
	}
	if !st.valid || st.lost || p.Sequence > st.seq {
		return f.snapshot(ctx, s, r, "resume")
	}
	for _, d := range st.journal {
		if d.Sequence <= p.Sequence {
			continue
		}
		if err := s.Send(&pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: d}}); err != nil {
			return fmt.Errorf("resend delta: %w", err)
		}
	}
	f.trim(st, p.Sequence)
	if len(st.journal) > 0 && st.journal[0].Sequence != p.Sequence+1 {
		return f.snapshot(ctx, s, r, "resume")
	}
	return nil
}

func (f *Forwarder) trim(st *rankState, upTo uint64) {
	i := 0
	for i < len(st.journal) && st.journal[i].Sequence <= upTo {
		i++
	}
	if i > 0 {
		st.journal = append([]*pb.Delta(nil), st.journal[i:]...)
		f.depth -= i
		f.m.JournalDepth(f.depth)
	}
}

// snapshot sends the rank's mirror and makes it the rank's position.
func (f *Forwarder) snapshot(ctx context.Context, s stream, r uint32, reason string) error {
	src, ok := f.sources[r]
	if !ok {
		return nil
	}
	snap, err := src.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("snapshot rank %d: %w", r, err)
	}
	send := func(m *pb.IngestRequest) error {
		if err := s.Send(m); err != nil {
			return fmt.Errorf("send snapshot of rank %d: %w", r, err)
		}
		return nil
	}
	if err := send(&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotBegin{SnapshotBegin: &pb.SnapshotBegin{
		Rank: r, Epoch: snap.Epoch, Sequence: snap.Sequence, BlockCount: snap.Count}}}); err != nil {
		return err
	}
	for _, c := range snap.Chunks {
		if err := send(&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotChunk{SnapshotChunk: c}}); err != nil {
			return err
		}
	}
	if err := send(&pb.IngestRequest{Message: &pb.IngestRequest_SnapshotEnd{SnapshotEnd: &pb.SnapshotEnd{
		Rank: r, Epoch: snap.Epoch, Sequence: snap.Sequence, BlockCount: snap.Count}}}); err != nil {
		return err
	}
	st := f.rank(r)
	f.drop(st)
	st.epoch, st.seq, st.valid, st.lost = snap.Epoch, snap.Sequence, true, false
	f.m.Snapshot(reason)
	f.log.V(1).Info("sent snapshot", "rank", r, "epoch", snap.Epoch, "sequence", snap.Sequence, "blocks", snap.Count, "reason", reason)
	return nil
}

// forward sends one delta, or a snapshot when the delta is out of line.
func (f *Forwarder) forward(ctx context.Context, s stream, d *pb.Delta) error {
	st := f.rank(d.Rank)
	if st.valid && d.Epoch == st.epoch && d.Sequence <= st.seq {
		return nil // covered by a snapshot already sent
	}
	if !st.valid || st.lost || d.Epoch != st.epoch || d.Sequence != st.seq+1 {
		reason := "sequence"
		if st.valid && d.Epoch != st.epoch {
			reason = "epoch"
		}
		if err := f.snapshot(ctx, s, d.Rank, reason); err != nil {
			return err
		}
		if d.Epoch != st.epoch || d.Sequence <= st.seq {
			return nil
		}
	}
	if err := s.Send(&pb.IngestRequest{Message: &pb.IngestRequest_Delta{Delta: d}}); err != nil {
		return fmt.Errorf("send delta: %w", err)
	}
	f.record(st, d)
	return nil
}

func (f *Forwarder) response(ctx context.Context, s stream, m *pb.IngestResponse) error {
	switch x := m.Message.(type) {
	case *pb.IngestResponse_Ack:
		if p := x.Ack.GetApplied(); p != nil {
			if st := f.ranks[p.Rank]; st != nil && p.Epoch == st.epoch {
				f.trim(st, p.Sequence)
			}
		}
	case *pb.IngestResponse_Resync:
		f.log.Info("index asked for a snapshot", "rank", x.Resync.Rank, "reason", x.Resync.Reason.String())
		return f.snapshot(ctx, s, x.Resync.Rank, strings.ToLower(strings.TrimPrefix(x.Resync.Reason.String(), "RESYNC_REASON_")))
	}
	return nil
}

func (f *Forwarder) heartbeat(s stream) error {
	hb := &pb.Heartbeat{HashCompatibility: f.hashCompatibility()}
	for _, src := range f.sources {
		hb.Ranks = append(hb.Ranks, src.Health())
	}
	if err := s.Send(&pb.IngestRequest{Message: &pb.IngestRequest_Heartbeat{Heartbeat: hb}}); err != nil {
		return fmt.Errorf("send heartbeat: %w", err)
	}
	return nil
}
