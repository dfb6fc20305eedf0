// Package subscriber follows one engine's KV-event stream per data-parallel
// rank: it receives the ZeroMQ PUB stream, recovers gaps through the
// engine's replay ROUTER socket, starts a new epoch when the publisher
// restarts, keeps the mirror of the engine's cached blocks, checks hash
// compatibility, and hands compact deltas to the forwarder without ever
// blocking on it.
package subscriber

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-zeromq/zmq4"
	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/operator/internal/kvevent/hashcheck"
	"github.com/inferencecache/operator/internal/kvevent/mirror"
	"github.com/inferencecache/operator/internal/kvevent/track"
	"github.com/inferencecache/operator/internal/kvevent/wire"
	"github.com/inferencecache/operator/internal/kvevent/zmtpguard"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// Config configures one rank's subscriber.
type Config struct {
	Rank           int
	Endpoint       string // the engine's PUB endpoint (tcp:// or ipc://)
	ReplayEndpoint string // the engine's replay ROUTER endpoint; empty: no replay
	Topic          string // the publisher's topic; "" subscribes to everything
	// QueueSize and QueueBytes bound live messages waiting for processing
	// (the receive loop drops, and counts, what does not fit; the gap is
	// replayed).
	QueueSize  int
	QueueBytes int64
	// ReplayIdle is how long a replay may stay silent before it is resumed
	// from the last batch received; ReplayAttempts bounds the resumptions.
	ReplayIdle     time.Duration
	ReplayAttempts int
	// SendTokens forwards token IDs while the hashes are not Verified (the
	// index then keys blocks by its own hash of the tokens).
	SendTokens bool
	// VerifyFirst BlockStored events are hash-checked, then one in VerifyEvery.
	VerifyFirst, VerifyEvery int
	Scheme                   hashcheck.Scheme
}

// Delta is a unit of change for the forwarder.
type Delta = pb.Delta

// Snapshot is a rank's mirror at (Epoch, Sequence).
type Snapshot struct {
	Rank     uint32
	Epoch    uint64
	Sequence uint64
	Chunks   []*pb.SnapshotChunk
	Count    uint64
}

// Rank follows one rank's stream. Run it once.
type Rank struct {
	cfg Config
	log logr.Logger
	m   *Metrics
	out chan<- *Delta

	dec    *wire.Decoder
	trk    track.Rank
	mir    *mirror.Mirror
	chk    *hashcheck.Checker
	stored int
	// tierChk checks the other tiers' BlockStored as LMCache's blake3
	// chunks; tierStored counts them.
	tierChk    *hashcheck.Checker
	tierStored int
	epoch      uint64
	seq        uint64 // last delta sequence of the epoch
	snapReq    chan chan *Snapshot
	label      string

	queued atomic.Int64 // payload bytes in the live queue

	mu     sync.Mutex
	health pb.RankHealth
	// blockSize is the block size of the engine's own (GPU tier, prefix
	// group) BlockStored events, as they carry it: 0 until the first.
	blockSize uint32
	// chunkSize is the block size of the verified LMCache chunks of the
	// other tiers: 0 until one is verified.
	chunkSize uint32
	// engineGone explains, while the engine's PUB stream has ended and the
	// rank dials it again, why the rank reports itself Stale.
	engineGone string
	lags       lagRing
}

// NewRank returns a rank subscriber that sends deltas to out.
func NewRank(cfg Config, log logr.Logger, m *Metrics, out chan<- *Delta) *Rank {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 4096
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = 256 << 20
	}
	if cfg.ReplayIdle <= 0 {
		cfg.ReplayIdle = 2 * time.Second
	}
	if cfg.ReplayAttempts <= 0 {
		cfg.ReplayAttempts = 4
	}
	if cfg.VerifyFirst == 0 {
		cfg.VerifyFirst = 256
	}
	if cfg.VerifyEvery <= 0 {
		cfg.VerifyEvery = 100
	}
	r := &Rank{cfg: cfg, log: log.WithValues("rank", cfg.Rank), m: m, out: out, dec: wire.NewDecoder(),
		mir: mirror.New(), chk: hashcheck.New(cfg.Scheme), tierChk: hashcheck.New(hashcheck.Scheme{Algorithm: hashcheck.LMCacheBlake3}), snapReq: make(chan chan *Snapshot), label: strconv.Itoa(cfg.Rank)}
	r.newEpoch()
	r.health.Rank = uint32(cfg.Rank)
	r.health.State = pb.PodState_POD_STATE_CONNECTING
	return r
}

// newEpoch starts an epoch: strictly increasing, also across subscriber
// restarts (it starts at the wall clock in nanoseconds).
func (r *Rank) newEpoch() {
	e := uint64(time.Now().UnixNano())
	if e <= r.epoch {
		e = r.epoch + 1
	}
	r.epoch, r.seq = e, 0
}

// Health returns the rank's health for heartbeats.
func (r *Rank) Health() *pb.RankHealth {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.health.LagP50Millis, r.health.LagP99Millis = r.lags.percentiles()
	h := proto.Clone(&r.health).(*pb.RankHealth)
	if r.engineGone != "" && h.State != pb.PodState_POD_STATE_UNSYNCED {
		// An idle engine sends nothing either; only a stream that ended
		// says the engine is gone (it crashed or is restarting).
		h.State, h.Message = pb.PodState_POD_STATE_STALE, r.engineGone
	}
	return h
}

func (r *Rank) setEngineGone(msg string) {
	r.mu.Lock()
	r.engineGone = msg
	r.mu.Unlock()
}

// HashCompatibility is the rank's hash verdict.
func (r *Rank) HashCompatibility() pb.HashCompatibility {
	r.mu.Lock()
	defer r.mu.Unlock()
	return hashResult(r.chk.Result())
}

func hashResult(h hashcheck.Result) pb.HashCompatibility {
	switch h {
	case hashcheck.Verified:
		return pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED
	case hashcheck.Mismatch:
		return pb.HashCompatibility_HASH_COMPATIBILITY_MISMATCH
	}
	return pb.HashCompatibility_HASH_COMPATIBILITY_UNVERIFIABLE
}

// BlockSize is the block size of the engine's own BlockStored events, or
// 0 before the first.
func (r *Rank) BlockSize() uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blockSize
}

// TierScheme is the verified scheme of the blocks in the engine's other
// tiers (LMCache's blake3 chunks), or nil: none seen, or one failed.
func (r *Rank) TierScheme() *pb.HashScheme {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.chunkSize == 0 || r.tierChk.Result() != hashcheck.Verified {
		return nil
	}
	return &pb.HashScheme{Algorithm: hashcheck.LMCacheBlake3, BlockSize: r.chunkSize}
}

// HashSeed is the NONE_HASH seed the hash check matched, or "".
func (r *Rank) HashSeed() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.chk.Seed()
}

// Snapshot asks the rank's loop for its mirror at the current position.
func (r *Rank) Snapshot(ctx context.Context) (*Snapshot, error) {
	reply := make(chan *Snapshot, 1)
	select {
	case r.snapReq <- reply:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case s := <-reply:
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// message is one ZeroMQ message of the live stream.
type message struct {
	seq     uint64
	payload []byte
}

// Run subscribes and processes until ctx ends.
func (r *Rank) Run(ctx context.Context) error {
	live := make(chan message, r.cfg.QueueSize)
	go r.receive(ctx, live)
	for {
		select {
		case <-ctx.Done():
			return nil
		case reply := <-r.snapReq:
			chunks, n := r.mir.Chunks(uint32(r.cfg.Rank), r.epoch, 8192)
			reply <- &Snapshot{Rank: uint32(r.cfg.Rank), Epoch: r.epoch, Sequence: r.seq, Chunks: chunks, Count: n}
		case msg := <-live:
			r.queued.Add(-int64(len(msg.payload)))
			r.handle(ctx, msg)
		}
	}
}

// receive reads the PUB stream into live, never blocking on it, and dials
// again when the stream fails (the engine restarted).
func (r *Rank) receive(ctx context.Context, live chan<- message) {
	for ctx.Err() == nil {
		sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(250*time.Millisecond))
		err := sub.Dial(zmtpguard.Endpoint(r.cfg.Endpoint))
		if err == nil {
			err = sub.SetOption(zmq4.OptionSubscribe, r.cfg.Topic)
		}
		if err == nil {
			r.setEngineGone("")
		}
		for err == nil {
			var msg zmq4.Msg
			msg, err = sub.Recv()
			if err != nil {
				break
			}
			f := msg.Frames
			if len(f) != 3 || len(f[1]) != 8 {
				r.m.Dropped.WithLabelValues("frame").Inc()
				continue
			}
			n := int64(len(f[2]))
			if r.queued.Add(n) > r.cfg.QueueBytes {
				r.queued.Add(-n)
				r.m.Dropped.WithLabelValues("receive").Inc()
				continue
			}
			select {
			case live <- message{seq: binary.BigEndian.Uint64(f[1]), payload: f[2]}:
			default:
				r.queued.Add(-n)
				r.m.Dropped.WithLabelValues("receive").Inc()
			}
		}
		_ = sub.Close()
		if ctx.Err() == nil {
			r.log.Info("event stream ended; dialing again", "endpoint", r.cfg.Endpoint, "error", err.Error())
			r.setEngineGone("the engine's event stream ended; dialing it again")
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
}

func (r *Rank) setState(s pb.PodState, msg string) {
	r.mu.Lock()
	r.health.State, r.health.Message = s, msg
	r.mu.Unlock()
}

func (r *Rank) handle(ctx context.Context, msg message) {
	v, from, to := r.trk.Live(msg.seq)
	switch v {
	case track.Duplicate:
		return
	case track.Restart:
		r.log.Info("publisher restarted: new epoch", "sequence", msg.seq)
		r.m.Epochs.WithLabelValues(r.label).Inc()
		r.mir.Reset()
		r.newEpoch()
		r.trk.Restarted(msg.seq)
		r.mu.Lock()
		r.health.Epochs++
		r.mu.Unlock()
		r.emit(nil, msg.seq, msg.seq, 0, true) // an empty first delta marks the new epoch
		if msg.seq > 0 {
			from, to = 0, msg.seq-1
			v = track.Gap
		} else {
			v = track.Apply
		}
	}
	if v == track.Gap {
		r.m.Gaps.WithLabelValues(r.label).Inc()
		r.mu.Lock()
		r.health.SequenceGaps++
		r.mu.Unlock()
		r.log.V(1).Info("sequence gap", "from", from, "to", to)
		r.replay(ctx, from, to)
		if r.trk.Next() > msg.seq {
			return // the replay covered it
		}
		if r.trk.Next() < msg.seq {
			r.lost(r.trk.Next(), msg.seq-1)
		}
	}
	r.apply(msg.seq, msg.payload, "live")
}

// lost gives up on [from, to]: the mirror may now miss blocks the engine
// holds, so a new epoch starts and the forwarder resends the mirror.
func (r *Rank) lost(from, to uint64) {
	r.log.Info("events lost: replay window exceeded", "from", from, "to", to)
	r.trk.Skip(to + 1)
	r.m.Epochs.WithLabelValues(r.label).Inc()
	r.newEpoch()
	r.mu.Lock()
	r.health.Epochs++
	r.mu.Unlock()
	r.setState(pb.PodState_POD_STATE_UNSYNCED, fmt.Sprintf("replay window exceeded: batches %d to %d lost", from, to))
	r.emit(nil, from, to, 0, true)
}

func (r *Rank) apply(seq uint64, payload []byte, source string) {
	r.trk.Applied(seq)
	r.m.LastSequence.WithLabelValues(r.label).Set(float64(seq))
	b, err := r.dec.Decode(payload)
	if err != nil {
		var de *wire.Error
		reason := "unknown"
		if errors.As(err, &de) {
			reason = string(de.Reason)
		}
		r.m.DecodeErrors.WithLabelValues(r.label, reason).Inc()
		r.log.Info("dropped a batch that does not decode", "sequence", seq, "error", err.Error())
		return
	}
	r.m.Batches.WithLabelValues(r.label, source).Inc()
	r.mu.Lock()
	for i := range b.Events {
		e := &b.Events[i]
		if e.Kind != wire.BlockStored {
			continue
		}
		if mirror.TierOf(e.Medium) != pb.Tier_TIER_GPU {
			// Another tier's events carry another scheme: LMCache's MP
			// connector publishes its CPU chunks (block_size = its chunk
			// size, blake3 chunk hashes) through the engine's publisher.
			// They are checked as LMCache's chunks, never against the
			// engine's block hash; once verified, the hello announces
			// their scheme and the index keeps them in its space.
			r.checkTier(e)
			continue
		}
		if bs := uint32(e.BlockSize); bs > 0 && bs != r.blockSize && mirror.PrefixGroup(e.SpecKind) {
			// The engine's real block size (vLLM picks it when its
			// attention backend is chosen; 0.34's default is 64).
			r.log.Info("the engine's block size, from its events", "blockSize", bs, "before", r.blockSize)
			r.blockSize = bs
			r.m.BlockSize.WithLabelValues(r.label).Set(float64(bs))
		}
		r.stored++
		if r.due(r.stored) {
			if res := r.chk.Check(e); res != hashcheck.Unverifiable {
				r.m.HashVerify.WithLabelValues(res.String()).Inc()
			}
		}
	}
	withTokens := r.cfg.SendTokens && r.chk.Result() != hashcheck.Verified
	r.mu.Unlock()
	before := r.mir.Stats
	events := r.mir.Apply(b.Events, withTokens, make([]*pb.BlockEvent, 0, len(b.Events)))
	after := r.mir.Stats
	r.m.Events.WithLabelValues(r.label, "BlockStored").Add(float64(after.Stored - before.Stored))
	r.m.Events.WithLabelValues(r.label, "BlockRemoved").Add(float64(after.Removed - before.Removed))
	r.m.Events.WithLabelValues(r.label, "AllBlocksCleared").Add(float64(after.Cleared - before.Cleared))
	r.m.UnknownRemove.WithLabelValues(r.label).Add(float64(after.UnknownRemovals - before.UnknownRemovals))
	r.m.MirrorBlocks.WithLabelValues(r.label).Set(float64(r.mir.Len()))
	var ts int64
	if b.TS > 0 && b.TS < math.MaxInt64/1e9 {
		ts = int64(b.TS * 1e9)
		lag := time.Since(time.Unix(0, ts))
		r.m.Lag.WithLabelValues(r.label).Observe(lag.Seconds())
		r.mu.Lock()
		r.lags.add(uint32(min(max(lag.Milliseconds(), 0), math.MaxUint32)))
		r.mu.Unlock()
	}
	r.mu.Lock()
	r.health.EventsTotal += (after.Stored - before.Stored) + (after.Removed - before.Removed) + (after.Cleared - before.Cleared)
	r.health.Blocks = uint64(r.mir.Len())
	r.health.LastEventUnixMillis = time.Now().UnixMilli()
	// A replay ends in Live itself, with its message cleared (replay):
	// a batch it applies leaves the rank Replaying.
	if r.health.State != pb.PodState_POD_STATE_UNSYNCED && r.health.State != pb.PodState_POD_STATE_REPLAYING {
		r.health.State = pb.PodState_POD_STATE_LIVE
	}
	if after.Cleared > before.Cleared && r.health.State == pb.PodState_POD_STATE_UNSYNCED {
		// After a clear the mirror is exact again.
		r.health.State, r.health.Message = pb.PodState_POD_STATE_LIVE, ""
	}
	r.mu.Unlock()
	if len(events) > 0 {
		r.emit(events, seq, seq, ts, false)
	}
}

// due reports whether the nth BlockStored of a stream is hash-checked: the
// first VerifyFirst, then one in VerifyEvery.
func (r *Rank) due(n int) bool { return n <= r.cfg.VerifyFirst || n%r.cfg.VerifyEvery == 0 }

// checkTier checks one BlockStored of a tier other than GPU as an LMCache
// chunk, on the same schedule as the engine's own blocks. Call with r.mu.
func (r *Rank) checkTier(e *wire.Event) {
	r.tierStored++
	if !r.due(r.tierStored) {
		return
	}
	res := r.tierChk.Check(e)
	if res == hashcheck.Unverifiable {
		return
	}
	r.m.TierVerify.WithLabelValues(res.String()).Inc()
	switch bs := uint32(e.BlockSize); {
	case res == hashcheck.Mismatch && r.tierChk.Failed == 1:
		r.log.Info("the engine's other-tier blocks are not LMCache's blake3 chunks: they are indexed in the engine's scheme, and token queries do not see them",
			"tier", mirror.TierOf(e.Medium).String(), "blockSize", bs)
	case res == hashcheck.Verified && bs != r.chunkSize:
		r.log.Info("LMCache's chunks, from the engine's events", "tier", mirror.TierOf(e.Medium).String(), "chunkSize", bs, "before", r.chunkSize)
		r.chunkSize = bs
	}
}

// emit hands a delta to the forwarder without blocking: when its queue is
// full the delta is dropped and counted, and the forwarder, seeing the
// sequence skip, resends the mirror.
func (r *Rank) emit(events []*pb.BlockEvent, first, last uint64, ts int64, always bool) {
	if len(events) == 0 && !always {
		return
	}
	r.seq++
	d := &pb.Delta{Rank: uint32(r.cfg.Rank), Epoch: r.epoch, Sequence: r.seq, Events: events,
		EngineSequenceFirst: first, EngineSequenceLast: last, EngineTimeUnixNanos: ts}
	r.mu.Lock()
	r.health.Epoch, r.health.Sequence = r.epoch, r.seq
	r.mu.Unlock()
	select {
	case r.out <- d:
	default:
		r.m.Dropped.WithLabelValues("forward").Inc()
	}
}

// replay asks the engine's ROUTER for batches from `from` on and applies
// them, resuming from the last one received when the reply stalls.
func (r *Rank) replay(ctx context.Context, from, to uint64) {
	if r.cfg.ReplayEndpoint == "" {
		r.m.Replays.WithLabelValues(r.label, "disabled").Inc()
		return
	}
	r.setState(pb.PodState_POD_STATE_REPLAYING, fmt.Sprintf("replaying batches %d to %d", from, to))
	result := "timeout"
	for attempt := 0; attempt < r.cfg.ReplayAttempts && ctx.Err() == nil; attempt++ {
		start := r.trk.Next()
		done, progressed, expired, err := r.replayOnce(ctx, start)
		switch {
		case err != nil:
			result = "error"
			r.log.Info("replay failed", "from", start, "error", err.Error())
		case expired:
			result = "expired"
		case done:
			result = "ok"
		case progressed:
			result = "partial"
			r.m.Replays.WithLabelValues(r.label, result).Inc()
			continue
		}
		if done || expired {
			break
		}
	}
	r.m.Replays.WithLabelValues(r.label, result).Inc()
	if result == "ok" {
		r.mu.Lock()
		r.health.GapsRecovered++
		r.mu.Unlock()
	}
	r.mu.Lock()
	if r.health.State == pb.PodState_POD_STATE_REPLAYING {
		r.health.State, r.health.Message = pb.PodState_POD_STATE_LIVE, ""
	}
	r.mu.Unlock()
}

var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// replayOnce runs one replay request. It returns done when the end marker
// arrived, progressed when at least one batch was applied, and expired when
// the engine's ring no longer held the first batch asked for.
func (r *Rank) replayOnce(ctx context.Context, start uint64) (done, progressed, expired bool, err error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dealer := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(4), zmq4.WithDialerRetry(100*time.Millisecond))
	defer func() { _ = dealer.Close() }()
	if err = dealer.Dial(zmtpguard.Endpoint(r.cfg.ReplayEndpoint)); err != nil {
		return false, false, false, fmt.Errorf("dial replay endpoint: %w", err)
	}
	var seq8 [8]byte
	binary.BigEndian.PutUint64(seq8[:], start)
	if err = dealer.Send(zmq4.NewMsgFrom([]byte{}, seq8[:])); err != nil {
		return false, false, false, fmt.Errorf("send replay request: %w", err)
	}
	type recv struct {
		msg zmq4.Msg
		err error
	}
	ch := make(chan recv, 1)
	read := func() {
		m, err := dealer.Recv()
		ch <- recv{m, err}
	}
	go read()
	// The idle deadline is pushed back only by a batch that applies: a
	// peer that keeps sending stale batches or bad frames does not hold
	// the rank in its replay (issue 25: such a replay never ended).
	idle := time.NewTimer(r.cfg.ReplayIdle)
	defer idle.Stop()
	for {
		var got recv
		select {
		case got = <-ch:
		case <-idle.C:
			cancel()
			<-ch
			return false, progressed, false, nil
		case <-ctx.Done():
			cancel()
			<-ch
			return false, progressed, false, ctx.Err()
		}
		if got.err != nil {
			return false, progressed, false, fmt.Errorf("receive replay: %w", got.err)
		}
		seqb, payload, ok := replayFrames(got.msg.Frames)
		if !ok {
			r.m.Dropped.WithLabelValues("frame").Inc()
			go read()
			continue
		}
		if string(seqb) == string(endSeq) {
			// The caller compares where the stream stands with the live
			// batch that revealed the gap.
			return true, progressed, expired, nil
		}
		seq := binary.BigEndian.Uint64(seqb)
		v, from, to := r.trk.Replayed(seq)
		switch v {
		case track.Apply:
			r.apply(seq, payload, "replay")
			progressed = true
			idle.Reset(r.cfg.ReplayIdle)
		case track.Gap:
			expired = true
			r.lost(from, to)
			r.apply(seq, payload, "replay")
			progressed = true
			idle.Reset(r.cfg.ReplayIdle)
		default:
			r.m.Dropped.WithLabelValues("stale").Inc()
		}
		go read()
		if expired {
			// keep reading the rest of the ring
			continue
		}
	}
}

// replayFrames extracts (seq, payload) from a replay reply as a DEALER
// sees it: [b"", topic, seq, payload] (vLLM ≥ #45177), [b"", seq, payload]
// (before, and SGLang), with or without the empty delimiter.
func replayFrames(f [][]byte) (seq, payload []byte, ok bool) {
	if len(f) > 0 && len(f[0]) == 0 && (len(f) == 4 || len(f) == 3 && len(f[1]) == 8) {
		f = f[1:]
	}
	switch {
	case len(f) == 3 && len(f[1]) == 8:
		return f[1], f[2], true
	case len(f) == 2 && len(f[0]) == 8:
		return f[0], f[1], true
	}
	return nil, nil, false
}

// lagRing keeps the last lag samples (milliseconds) for the heartbeat's
// percentiles.
type lagRing struct {
	buf [256]uint32
	n   int
}

func (l *lagRing) add(ms uint32) {
	l.buf[l.n%len(l.buf)] = ms
	l.n++
}

func (l *lagRing) percentiles() (p50, p99 uint32) {
	n := min(l.n, len(l.buf))
	if n == 0 {
		return 0, 0
	}
	s := make([]uint32, n)
	copy(s, l.buf[:n])
	slices.Sort(s)
	return s[(n*50-1)/100], s[(n*99-1)/100]
}
