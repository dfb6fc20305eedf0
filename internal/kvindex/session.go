package kvindex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/inferencecache/operator/internal/kvevent/hashcheck"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// Session is one subscriber stream. Handle is called for each message in
// order; it is not safe for concurrent use.
type Session struct {
	ix     *Index
	caller Caller
	cancel context.CancelFunc

	hello  *pb.Hello
	pod    PodKey
	rec    PodRecord
	scheme string
	// tierScheme is the space of the tiers other than GPU when the hello
	// announced their scheme, "" when they share scheme's.
	tierScheme string
	putAt      time.Time
	snapshot   map[uint32]*staging
	asked      map[uint32]bool
	// disagrees is the block size of the stream's GPU-tier BlockStored
	// events when it is not the one its hello announced (0 when they
	// agree): the pod is then reported hash Mismatch, since a token query
	// hashed with the announced size would match none of its blocks.
	disagrees uint32
}

type staging struct {
	pos      Position
	expected uint64
	snap     *Snapshot
	reserved int64  // entries counted in the index's staging budgets
	ns       string // the namespace whose share they count in
	bad      bool
	over     error // a *LimitError: the entries staged could not fit
}

// discard drops what st staged and gives its share of the index's
// staging budget back.
func (st *staging) discard(ix *Index) {
	st.snap = nil
	ix.releaseStaging(st.ns, st.reserved)
	st.reserved = 0
}

// NewSession starts a stream for an authenticated caller. cancel ends the
// stream's context; the Index calls it when a newer stream for the same pod
// replaces this one.
func (ix *Index) NewSession(caller Caller, cancel context.CancelFunc) *Session {
	return &Session{ix: ix, caller: caller, cancel: cancel, snapshot: map[uint32]*staging{}, asked: map[uint32]bool{}}
}

// Close unregisters the session; the pod's lease keeps running.
func (s *Session) Close() {
	for rank, st := range s.snapshot {
		st.discard(s.ix)
		delete(s.snapshot, rank)
	}
	if s.hello == nil {
		return
	}
	s.ix.mu.Lock()
	if s.ix.sessions[s.pod] == s {
		delete(s.ix.sessions, s.pod)
	}
	s.ix.mu.Unlock()
	s.ix.opt.Observer.StreamClosed()
}

// Handle applies one message and returns the responses to send.
func (s *Session) Handle(ctx context.Context, req *pb.IngestRequest) ([]*pb.IngestResponse, error) {
	if h := req.GetHello(); h != nil {
		if s.hello != nil {
			return nil, fmt.Errorf("second hello on one stream: %w", ErrInvalid)
		}
		return s.handleHello(ctx, h)
	}
	if s.hello == nil {
		return nil, fmt.Errorf("the first message must be a hello: %w", ErrInvalid)
	}
	now := s.ix.opt.Now()
	s.rec.LastSeen = now
	var out []*pb.IngestResponse
	var err error
	switch m := req.Message.(type) {
	case *pb.IngestRequest_Delta:
		disagreed := s.disagrees
		out, err = s.handleDelta(ctx, m.Delta)
		if err == nil && s.disagrees != disagreed {
			err = s.put(ctx, true) // the Mismatch shows at once
		}
	case *pb.IngestRequest_SnapshotBegin:
		out, err = s.handleSnapshotBegin(m.SnapshotBegin)
	case *pb.IngestRequest_SnapshotChunk:
		out, err = s.handleSnapshotChunk(m.SnapshotChunk)
	case *pb.IngestRequest_SnapshotEnd:
		out, err = s.handleSnapshotEnd(ctx, m.SnapshotEnd)
	case *pb.IngestRequest_Heartbeat:
		s.handleHeartbeat(m.Heartbeat)
		err = s.put(ctx, true)
	default:
		return nil, fmt.Errorf("empty ingest message: %w", ErrInvalid)
	}
	if err != nil {
		return out, err
	}
	return out, s.put(ctx, false)
}

// put stores the pod record and renews the lease, at most every quarter
// lease unless forced.
func (s *Session) put(ctx context.Context, force bool) error {
	now := s.ix.opt.Now()
	if !force && now.Sub(s.putAt) < s.ix.opt.Lease/4 {
		return nil
	}
	s.putAt = now
	if err := s.ix.opt.Store.PutPod(ctx, s.rec, now.Add(s.ix.opt.Lease)); err != nil {
		return fmt.Errorf("storing pod %s: %w", s.rec.Name, err)
	}
	return nil
}

func schemeString(h *pb.HashScheme) string {
	return fmt.Sprintf("%s/%d/%s", h.GetAlgorithm(), h.GetBlockSize(), h.GetSeed())
}

func (s *Session) handleHello(ctx context.Context, h *pb.Hello) ([]*pb.IngestResponse, error) {
	pod, be := h.GetPod(), h.GetCacheBackend()
	switch {
	case h.GetProtocolVersion() != ProtocolVersion:
		return nil, fmt.Errorf("protocol version %d, this index speaks %d: %w", h.GetProtocolVersion(), ProtocolVersion, ErrInvalid)
	case pod.GetNamespace() == "" || pod.GetName() == "" || pod.GetUid() == "":
		return nil, fmt.Errorf("hello without pod namespace, name and uid: %w", ErrInvalid)
	case be.GetName() == "" || be.GetNamespace() != pod.GetNamespace():
		return nil, fmt.Errorf("hello for CacheBackend %q/%q of pod namespace %q: %w", be.GetNamespace(), be.GetName(), pod.GetNamespace(), ErrInvalid)
	case h.GetModel() == "":
		return nil, fmt.Errorf("hello without a model: %w", ErrInvalid)
	}
	if err := checkHelloNames(h); err != nil {
		return nil, err
	}
	if err := checkTierScheme(h); err != nil {
		return nil, err
	}
	backend := BackendRef{Namespace: be.GetNamespace(), Name: be.GetName()}
	podKey := pod.GetNamespace() + "/" + pod.GetName()
	if dp := h.GetDataParallelSize(); dp > s.ix.opt.MaxRanks {
		// Each rank may stage a snapshot: the ranks a Hello announces are
		// what one stream may make the index hold.
		s.ix.opt.Observer.HelloRefused("ranks")
		s.ix.opt.Log.Info("refused a hello over the rank cap", "pod", podKey, "podUID", pod.GetUid(), "cacheBackend", backend.String(), "ranks", dp, "maxRanks", s.ix.opt.MaxRanks)
		return nil, fmt.Errorf("data_parallel_size %d is over this index's --max-ranks %d: %w", dp, s.ix.opt.MaxRanks, ErrInvalid)
	}
	if err := s.ix.opt.Policy.AuthorizePublish(s.caller, backend, pod.GetNamespace(), pod.GetName(), pod.GetUid()); err != nil {
		s.ix.opt.Observer.Refused("ingest")
		return nil, err
	}
	if s.ix.opt.Backends != nil {
		// Checked after the caller is authorised, so that only a pod's own
		// token can make the index look a name up.
		ok, err := s.ix.opt.Backends.Exists(ctx, backend)
		if err != nil {
			return nil, fmt.Errorf("looking up CacheBackend %s: %w", backend, err)
		}
		if !ok {
			s.ix.opt.Observer.HelloRefused("unknown_backend")
			s.ix.opt.Log.Info("refused a hello for a CacheBackend that does not exist", "pod", podKey, "podUID", pod.GetUid(), "cacheBackend", backend.String())
			return nil, fmt.Errorf("CacheBackend %s does not exist (--require-backend): %w", backend, ErrForbidden)
		}
	}
	s.hello = h
	s.pod = PodKey{Backend: backend, UID: pod.GetUid()}
	s.scheme = schemeString(h.GetHashScheme())
	s.tierScheme = ""
	if ts := h.GetTierScheme(); ts != nil {
		s.tierScheme = schemeString(ts)
	}
	dp := max(h.GetDataParallelSize(), 1)
	now := s.ix.opt.Now()
	s.rec = PodRecord{
		Backend: backend, UID: pod.GetUid(), Name: pod.GetName(), Model: h.GetModel(), Engine: h.GetEngine(),
		Scheme: s.scheme, BlockSize: h.GetHashScheme().GetBlockSize(), Compatibility: int32(h.GetHashCompatibility()),
		TierScheme: s.tierScheme, ChunkSize: h.GetTierScheme().GetBlockSize(), DPSize: dp, LastSeen: now,
		Address: h.GetWorkerAddress(),
	}
	// Keep the counters and last event of an earlier stream of this pod.
	if old, err := s.ix.opt.Store.Pods(ctx, backend); err == nil {
		for _, o := range old {
			if o.UID == s.rec.UID {
				s.rec.Resyncs, s.rec.LastEvent, s.rec.Ranks = o.Resyncs, o.LastEvent, o.Ranks
			}
		}
	}

	s.ix.mu.Lock()
	prev := s.ix.sessions[s.pod]
	s.ix.sessions[s.pod] = s
	s.ix.mu.Unlock()
	s.ix.opt.Observer.StreamOpened()
	if prev != nil && prev.cancel != nil {
		prev.cancel()
	}

	applied, err := s.ix.opt.Store.Positions(ctx, s.pod)
	if err != nil {
		return nil, fmt.Errorf("reading positions of pod %s: %w", pod.GetName(), err)
	}
	said := map[uint32]*pb.RankPosition{}
	for _, r := range h.GetRanks() {
		said[r.GetRank()] = r
	}
	welcome := &pb.Welcome{
		LeaseSeconds:     uint32(s.ix.opt.Lease / time.Second),
		HeartbeatSeconds: uint32(s.ix.opt.Heartbeat / time.Second),
		ProtocolVersion:  ProtocolVersion,
	}
	var resyncs []*pb.IngestResponse
	for rank := range dp {
		pos, known := applied[rank]
		if known {
			welcome.Applied = append(welcome.Applied, &pb.RankPosition{Rank: rank, Epoch: pos.Epoch, Sequence: pos.Sequence})
		}
		reason := helloResync(said[rank], pos, known)
		if reason != pb.ResyncReason_RESYNC_REASON_UNSPECIFIED {
			resyncs = append(resyncs, s.resync(rank, reason, pos, known))
		}
	}
	s.rec.AwaitSnapshot = s.awaiting()
	if err := s.put(ctx, true); err != nil {
		return nil, err
	}
	s.ix.opt.Log.Info("subscriber connected", "pod", podKey, "cacheBackend", backend.String(),
		"model", h.GetModel(), "scheme", s.scheme, "ranks", dp, "resyncs", len(resyncs))
	return append([]*pb.IngestResponse{{Message: &pb.IngestResponse_Welcome{Welcome: welcome}}}, resyncs...), nil
}

// checkTierScheme admits only a tier scheme the index can hash (LMCache's
// blake3 chunks) whose chunk is a whole number of the engine's blocks, as
// LMCache's connector requires: hashing a token query in it then costs no
// more hashes than in the engine's own scheme.
func checkTierScheme(h *pb.Hello) error {
	ts := h.GetTierScheme()
	if ts == nil {
		return nil
	}
	if ts.GetAlgorithm() != hashcheck.LMCacheBlake3 {
		return fmt.Errorf("tier_scheme.algorithm %q: the index hashes only %s: %w", ts.GetAlgorithm(), hashcheck.LMCacheBlake3, ErrInvalid)
	}
	bs, chunk := h.GetHashScheme().GetBlockSize(), ts.GetBlockSize()
	if !hashcheck.WholeBlocks(chunk, bs) {
		return fmt.Errorf("tier_scheme.block_size %d is not a positive multiple of hash_scheme.block_size %d: %w", chunk, bs, ErrInvalid)
	}
	return nil
}

// checkHelloNames bounds every name a Hello sends: each becomes a key of
// the index's state (the backend, the pod, its block spaces) or part of
// the pod's record.
func checkHelloNames(h *pb.Hello) error {
	for _, c := range []struct {
		field, value string
		max          int
	}{
		{"pod.namespace", h.GetPod().GetNamespace(), MaxNamespaceBytes},
		{"pod.name", h.GetPod().GetName(), MaxPodNameBytes},
		{"pod.uid", h.GetPod().GetUid(), MaxPodUIDBytes},
		{"cache_backend.name", h.GetCacheBackend().GetName(), MaxBackendNameBytes},
		{"model", h.GetModel(), MaxModelBytes},
		{"engine", h.GetEngine(), MaxEngineBytes},
		{"hash_scheme.algorithm", h.GetHashScheme().GetAlgorithm(), MaxHashAlgorithmBytes},
		{"hash_scheme.seed", h.GetHashScheme().GetSeed(), MaxHashSeedBytes},
		{"tier_scheme.algorithm", h.GetTierScheme().GetAlgorithm(), MaxHashAlgorithmBytes},
		{"tier_scheme.seed", h.GetTierScheme().GetSeed(), MaxHashSeedBytes},
		{"worker_address", h.GetWorkerAddress(), MaxWorkerAddressBytes},
	} {
		if err := checkLen(c.field, c.value, c.max); err != nil {
			return err
		}
	}
	return nil
}

// helloResync decides whether a rank needs a snapshot right after Hello.
func helloResync(said *pb.RankPosition, pos Position, known bool) pb.ResyncReason {
	switch {
	case said == nil:
		return pb.ResyncReason_RESYNC_REASON_UNSPECIFIED // the deltas will tell
	case !known && said.GetSequence() == 0:
		return pb.ResyncReason_RESYNC_REASON_UNSPECIFIED // nothing sent yet: sequence 1 applies
	case !known:
		return pb.ResyncReason_RESYNC_REASON_UNKNOWN_RANK
	case said.GetEpoch() == pos.Epoch && said.GetSequence() >= pos.Sequence:
		return pb.ResyncReason_RESYNC_REASON_UNSPECIFIED // resume after pos.Sequence
	case said.GetEpoch() > pos.Epoch && said.GetSequence() == 0:
		return pb.ResyncReason_RESYNC_REASON_UNSPECIFIED // a new epoch starts at sequence 1
	}
	return pb.ResyncReason_RESYNC_REASON_EPOCH_CHANGED
}

func (s *Session) resync(rank uint32, reason pb.ResyncReason, pos Position, known bool) *pb.IngestResponse {
	s.asked[rank] = true
	s.ix.opt.Observer.Resync(strings.ToLower(strings.TrimPrefix(reason.String(), "RESYNC_REASON_")))
	r := &pb.ResyncRequest{Rank: rank, Reason: reason}
	if known {
		r.Applied = &pb.RankPosition{Rank: rank, Epoch: pos.Epoch, Sequence: pos.Sequence}
	}
	return &pb.IngestResponse{Message: &pb.IngestResponse_Resync{Resync: r}}
}

func (s *Session) awaiting() []uint32 {
	var out []uint32
	for r, v := range s.asked {
		if v {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return out
}

func (s *Session) source(rank uint32) Source {
	return Source{Backend: s.pod.Backend, PodUID: s.pod.UID, Rank: rank}
}

// space is where the blocks of a tier live: the GPU tier (and every tier
// when the hello announced no tier scheme) in the engine's scheme, the
// other tiers in theirs.
func (s *Session) space(lora string, tier pb.Tier) Space {
	if s.tierScheme != "" && tier != pb.Tier_TIER_GPU {
		return Space{Model: s.rec.Model, Lora: lora, Scheme: s.tierScheme}
	}
	return Space{Model: s.rec.Model, Lora: lora, Scheme: s.scheme}
}

func (s *Session) checkRank(rank uint32) error {
	if rank >= s.rec.DPSize {
		return fmt.Errorf("rank %d of a pod with %d ranks: %w", rank, s.rec.DPSize, ErrInvalid)
	}
	return nil
}

func (s *Session) handleDelta(ctx context.Context, d *pb.Delta) ([]*pb.IngestResponse, error) {
	if err := s.checkRank(d.GetRank()); err != nil {
		return nil, err
	}
	delta := Delta{Epoch: d.GetEpoch(), Sequence: d.GetSequence(), Ops: make([]Op, 0, len(d.GetEvents()))}
	var blocks int
	for i, ev := range d.GetEvents() {
		if err := checkLen(fmt.Sprintf("delta.events[%d].lora_name", i), eventLora(ev), MaxLoraBytes); err != nil {
			return nil, err
		}
		switch e := ev.Event.(type) {
		case *pb.BlockEvent_Stored:
			delta.Ops = append(delta.Ops, Op{Kind: OpStore, Tier: Tier(e.Stored.GetTier()), Space: s.space(e.Stored.GetLoraName(), e.Stored.GetTier()), Hashes: e.Stored.GetBlockHashes()})
			blocks += len(e.Stored.GetBlockHashes())
			s.checkBlockSize(e.Stored)
		case *pb.BlockEvent_Removed:
			delta.Ops = append(delta.Ops, Op{Kind: OpRemove, Tier: Tier(e.Removed.GetTier()), Space: s.space(e.Removed.GetLoraName(), e.Removed.GetTier()), Hashes: e.Removed.GetBlockHashes()})
			blocks += len(e.Removed.GetBlockHashes())
		case *pb.BlockEvent_Cleared:
			delta.Ops = append(delta.Ops, Op{Kind: OpClear, Tier: Tier(e.Cleared.GetTier())})
			blocks++
		}
	}
	outcome, pos, err := s.ix.opt.Store.Apply(ctx, s.source(d.GetRank()), delta)
	if errors.Is(err, ErrOverLimit) {
		return nil, s.overLimit(d.GetRank(), "delta", err)
	}
	if err != nil {
		return nil, fmt.Errorf("applying delta %d of pod %s rank %d: %w", d.GetSequence(), s.rec.Name, d.GetRank(), err)
	}
	s.ix.opt.Observer.Delta(outcome, blocks)
	switch outcome {
	case Applied:
		s.ix.rate(s.pod.Backend).add(s.ix.opt.Now(), uint64(blocks))
		s.rec.LastEvent = s.ix.opt.Now()
		fallthrough
	case Duplicate:
		return []*pb.IngestResponse{ack(d.GetRank(), pos)}, nil
	}
	if s.asked[d.GetRank()] {
		return nil, nil // a snapshot is on its way; drop until it arrives
	}
	_, known := s.knownPosition(ctx, d.GetRank())
	reason := pb.ResyncReason_RESYNC_REASON_UNKNOWN_RANK
	switch {
	case known && d.GetEpoch() == pos.Epoch:
		reason = pb.ResyncReason_RESYNC_REASON_GAP
		s.ix.opt.Log.Info("delta skipped a sequence; asking for a snapshot", "pod", s.rec.Name, "rank", d.GetRank(), "applied", pos.Sequence, "got", d.GetSequence())
	case known:
		reason = pb.ResyncReason_RESYNC_REASON_EPOCH_CHANGED
	}
	out := []*pb.IngestResponse{s.resync(d.GetRank(), reason, pos, known)}
	s.rec.AwaitSnapshot = s.awaiting()
	return out, s.put(ctx, true)
}

func eventLora(ev *pb.BlockEvent) string {
	switch e := ev.Event.(type) {
	case *pb.BlockEvent_Stored:
		return e.Stored.GetLoraName()
	case *pb.BlockEvent_Removed:
		return e.Removed.GetLoraName()
	}
	return ""
}

func (s *Session) knownPosition(ctx context.Context, rank uint32) (Position, bool) {
	ps, err := s.ix.opt.Store.Positions(ctx, s.pod)
	if err != nil {
		return Position{}, false
	}
	p, ok := ps[rank]
	return p, ok
}

func ack(rank uint32, pos Position) *pb.IngestResponse {
	return &pb.IngestResponse{Message: &pb.IngestResponse_Ack{Ack: &pb.Ack{Applied: &pb.RankPosition{Rank: rank, Epoch: pos.Epoch, Sequence: pos.Sequence}}}}
}

func (s *Session) handleSnapshotBegin(b *pb.SnapshotBegin) ([]*pb.IngestResponse, error) {
	if err := s.checkRank(b.GetRank()); err != nil {
		return nil, err
	}
	if old := s.snapshot[b.GetRank()]; old != nil {
		old.discard(s.ix) // a new begin drops the rank's staging
		delete(s.snapshot, b.GetRank())
	}
	// The count is a claim: nothing is reserved for it, the entries take
	// memory as their chunks arrive (Snapshot), so that a begin costs its
	// sender as much as the index.
	st := &staging{pos: Position{Epoch: b.GetEpoch(), Sequence: b.GetSequence()}, expected: b.GetBlockCount(), snap: &Snapshot{}, ns: s.pod.Backend.Namespace}
	if b.GetBlockCount() > uint64(s.ix.opt.MaxSnapshotBlocks)-min(s.staged(), uint64(s.ix.opt.MaxSnapshotBlocks)) {
		// Over the bound for one rank, or for the ranks the stream stages
		// at once: the subscriber sends one rank's snapshot at a time, so
		// only a stream that interleaves them, to make the index hold
		// ranks × the bound, is refused.
		st.bad, st.snap = true, nil
	}
	s.snapshot[b.GetRank()] = st
	return nil, nil
}

// staged is the entries the stream's snapshots in progress may still
// stage: the counts their begins announced.
func (s *Session) staged() uint64 {
	var n uint64
	for _, st := range s.snapshot {
		if !st.bad {
			n += st.expected
		}
	}
	return n
}

func (s *Session) handleSnapshotChunk(c *pb.SnapshotChunk) ([]*pb.IngestResponse, error) {
	st := s.snapshot[c.GetRank()]
	if st == nil || st.pos.Epoch != c.GetEpoch() {
		return nil, fmt.Errorf("snapshot chunk for rank %d epoch %d without its begin: %w", c.GetRank(), c.GetEpoch(), ErrInvalid)
	}
	for i, e := range c.GetEntries() {
		if err := checkLen(fmt.Sprintf("snapshot_chunk.entries[%d].lora_name", i), e.GetLoraName(), MaxLoraBytes); err != nil {
			st.discard(s.ix)
			return nil, err
		}
	}
	for _, e := range c.GetEntries() {
		if st.bad || st.over != nil {
			break
		}
		refs, hashes := e.GetRefCounts(), e.GetBlockHashes()
		adding := uint64(len(hashes))
		staged := uint64(st.snap.Len()) + adding
		switch {
		case len(refs) != 0 && len(refs) != len(hashes), staged > st.expected:
			st.bad = true
		case s.ix.opt.Limits.PodBlocks > 0 && staged > (NumTiers-1)*s.ix.opt.Limits.PodBlocks:
			// Each block is at most in NumTiers-1 entries: past that many
			// per block the pod may hold, the snapshot cannot fit, so stop
			// staging it now rather than hold it until its end.
			st.over = &LimitError{Scope: ScopePod, Limit: s.ix.opt.Limits.PodBlocks, Adding: staged}
		default:
			// The index's staging budget, all streams together (what many
			// streams may make the index hold before their ends), and the
			// namespace's share of it.
			if err := s.ix.reserveStaging(st.ns, adding); err != nil {
				st.over = err
				break
			}
			st.reserved += int64(adding)
			if err := st.snap.Add(s.space(e.GetLoraName(), e.GetTier()), Tier(e.GetTier()), hashes, refs); err != nil {
				st.bad = true
			}
		}
	}
	if st.bad || st.over != nil {
		st.discard(s.ix)
	}
	return nil, nil
}

func (s *Session) handleSnapshotEnd(ctx context.Context, e *pb.SnapshotEnd) ([]*pb.IngestResponse, error) {
	rank := e.GetRank()
	st := s.snapshot[rank]
	delete(s.snapshot, rank)
	if st != nil {
		defer st.discard(s.ix) // the entries are the store's once Replace returns
	}
	pos := Position{Epoch: e.GetEpoch(), Sequence: e.GetSequence()}
	if st != nil && st.over != nil {
		return nil, s.overLimit(rank, "snapshot", st.over)
	}
	if st == nil || st.bad || st.pos != pos || uint64(st.snap.Len()) != e.GetBlockCount() || e.GetBlockCount() != st.expected {
		s.ix.opt.Log.Info("snapshot did not add up; asking again", "pod", s.rec.Name, "rank", rank)
		return []*pb.IngestResponse{s.resync(rank, pb.ResyncReason_RESYNC_REASON_SNAPSHOT_INVALID, Position{}, false)}, nil
	}
	if err := s.ix.opt.Store.Replace(ctx, s.source(rank), pos, st.snap); err != nil {
		if errors.Is(err, ErrOverLimit) {
			return nil, s.overLimit(rank, "snapshot", err)
		}
		if errors.Is(err, ErrStaleEpoch) {
			return nil, fmt.Errorf("%w: %w", err, ErrInvalid)
		}
		return nil, fmt.Errorf("replacing rank %d of pod %s: %w", rank, s.rec.Name, err)
	}
	s.asked[rank] = false
	s.rec.AwaitSnapshot = s.awaiting()
	s.rec.Resyncs++
	s.rec.LastEvent = s.ix.opt.Now()
	s.ix.opt.Observer.SnapshotApplied()
	s.ix.opt.Log.Info("snapshot applied", "pod", s.rec.Name, "rank", rank, "epoch", pos.Epoch, "sequence", pos.Sequence, "blocks", st.snap.Len())
	return []*pb.IngestResponse{ack(rank, pos)}, s.put(ctx, true)
}

// overLimit reports a delta or snapshot refused by a block limit and
// returns the error that ends the stream (ResourceExhausted, naming the
// scope and limit). Nothing was applied: the subscriber reconnects after
// its backoff and resends from the index's position, so exactly-once
// holds, and the pod keeps what it held (its lease reaps it if it stops).
func (s *Session) overLimit(rank uint32, what string, err error) error {
	var le *LimitError
	if errors.As(err, &le) {
		s.ix.opt.Observer.OverLimit(le.Scope)
	}
	s.ix.opt.Log.Info("refused a "+what+" over a block limit", "pod", s.hello.GetPod().GetNamespace()+"/"+s.rec.Name,
		"podUID", s.pod.UID, "cacheBackend", s.pod.Backend.String(), "rank", rank, "reason", err.Error())
	return fmt.Errorf("%s of pod %s rank %d refused: %w", what, s.rec.Name, rank, err)
}

// checkBlockSize compares a GPU-tier BlockStored's block size with the one
// the hello announced: a disagreement is logged and counted once per
// block size, and reports the pod hash Mismatch for the rest of the
// stream (a subscriber that learns the block size from the events
// announces it in a new hello). A hello that announced none (0: the
// subscriber has not seen an event yet) disagrees with nothing; the
// pod's blocks are not scored by token IDs until one announces it.
func (s *Session) checkBlockSize(e *pb.BlockStored) {
	bs := e.GetBlockSize()
	if bs == 0 || e.GetTier() != pb.Tier_TIER_GPU || s.rec.BlockSize == 0 || bs == s.rec.BlockSize || bs == s.disagrees {
		return
	}
	s.disagrees = bs
	s.rec.Compatibility = int32(pb.HashCompatibility_HASH_COMPATIBILITY_MISMATCH)
	s.ix.opt.Observer.SchemeDisagrees("block_size")
	s.ix.opt.Log.Info("the pod's events carry another block size than its hello announced; reported as hash Mismatch",
		"pod", s.pod.Backend.Namespace+"/"+s.rec.Name, "podUID", s.pod.UID, "announced", s.rec.BlockSize, "events", bs)
}

func (s *Session) handleHeartbeat(h *pb.Heartbeat) {
	if c := h.GetHashCompatibility(); c != pb.HashCompatibility_HASH_COMPATIBILITY_UNSPECIFIED && s.disagrees == 0 {
		s.rec.Compatibility = int32(c)
	}
	ranks := make([]RankHealth, 0, len(h.GetRanks()))
	for _, r := range h.GetRanks() {
		if r.GetRank() >= s.rec.DPSize {
			continue
		}
		ranks = append(ranks, RankHealth{
			Rank: r.GetRank(), State: int32(r.GetState()), EventsTotal: r.GetEventsTotal(), Gaps: r.GetSequenceGaps(),
			GapsRecovered: r.GetGapsRecovered(), LagP50Millis: r.GetLagP50Millis(), LagP99Millis: r.GetLagP99Millis(),
			Message: truncate(r.GetMessage(), 256),
		})
		if t := r.GetLastEventUnixMillis(); t > 0 && time.UnixMilli(t).After(s.rec.LastEvent) {
			s.rec.LastEvent = time.UnixMilli(t)
		}
	}
	s.rec.Ranks = ranks
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
