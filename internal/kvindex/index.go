package kvindex

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// ProtocolVersion is the contract version this index speaks.
const ProtocolVersion = 1

// ErrInvalid marks a malformed request (InvalidArgument / 400).
var ErrInvalid = errors.New("invalid request")

// Options configure an Index.
type Options struct {
	Store         Store
	Authenticator Authenticator
	Policy        Policy
	// Lease: a pod whose subscriber sends nothing for this long loses its
	// blocks. Default 60s.
	Lease time.Duration
	// Heartbeat the subscribers are asked to keep when idle. Default 10s.
	Heartbeat time.Duration
	// StaleAfter: a pod silent for this long is reported Stale. Default 3 ×
	// Heartbeat.
	StaleAfter time.Duration
	// MaxSnapshotBlocks bounds one rank's snapshot. Default 4,000,000.
	MaxSnapshotBlocks int
	Metrics           *Metrics
	Log               logr.Logger
	Now               func() time.Time
}

// Index is the index service: ingest sessions, lease expiry, Score and
// Participation, over a Store.
type Index struct {
	opt Options

	mu       sync.Mutex
	sessions map[PodKey]*Session
	rates    map[BackendRef]*rateWindow
}

// New returns an Index.
func New(opt Options) *Index {
	if opt.Lease <= 0 {
		opt.Lease = time.Minute
	}
	if opt.Heartbeat <= 0 {
		opt.Heartbeat = 10 * time.Second
	}
	if opt.StaleAfter <= 0 {
		opt.StaleAfter = 3 * opt.Heartbeat
	}
	if opt.MaxSnapshotBlocks <= 0 {
		opt.MaxSnapshotBlocks = 4_000_000
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Authenticator == nil {
		opt.Authenticator = AllowAll{}
	}
	if opt.Metrics == nil {
		opt.Metrics = NewMetrics(nil)
	}
	return &Index{opt: opt, sessions: map[PodKey]*Session{}, rates: map[BackendRef]*rateWindow{}}
}

// Authenticate checks a bearer token.
func (ix *Index) Authenticate(ctx context.Context, token string) (Caller, error) {
	return ix.opt.Authenticator.Authenticate(ctx, token)
}

// ExpireLeases removes the pods whose lease ended; cmd/cache-index calls it
// periodically. Every replica on a shared store may call it: a pod is
// removed once.
func (ix *Index) ExpireLeases(ctx context.Context) (int, error) {
	gone, err := ix.opt.Store.ExpireLeases(ctx, ix.opt.Now())
	for _, p := range gone {
		ix.opt.Log.Info("pod lease expired; its blocks were removed", "cacheBackend", p.Backend.String(), "podUID", p.UID)
		ix.opt.Metrics.evictions.WithLabelValues("lease").Inc()
	}
	return len(gone), err
}

// RunLeaseReaper calls ExpireLeases every interval until ctx ends.
func (ix *Index) RunLeaseReaper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := ix.ExpireLeases(ctx); err != nil {
				ix.opt.Log.Error(err, "expiring leases")
			}
		}
	}
}

// ---------------------------------------------------------------- ingest

// Session is one subscriber stream. Handle is called for each message in
// order; it is not safe for concurrent use.
type Session struct {
	ix     *Index
	caller Caller
	cancel context.CancelFunc

	hello    *pb.Hello
	pod      PodKey
	rec      PodRecord
	scheme   string
	putAt    time.Time
	snapshot map[uint32]*staging
	asked    map[uint32]bool
}

type staging struct {
	pos      Position
	expected uint64
	entries  []Entry
	bad      bool
}

// NewSession starts a stream for an authenticated caller. cancel ends the
// stream's context; the Index calls it when a newer stream for the same pod
// replaces this one.
func (ix *Index) NewSession(caller Caller, cancel context.CancelFunc) *Session {
	return &Session{ix: ix, caller: caller, cancel: cancel, snapshot: map[uint32]*staging{}, asked: map[uint32]bool{}}
}

// Close unregisters the session; the pod's lease keeps running.
func (s *Session) Close() {
	if s.hello == nil {
		return
	}
	s.ix.mu.Lock()
	if s.ix.sessions[s.pod] == s {
		delete(s.ix.sessions, s.pod)
	}
	s.ix.mu.Unlock()
	s.ix.opt.Metrics.streams.Dec()
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
		out, err = s.handleDelta(ctx, m.Delta)
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
	case h.GetDataParallelSize() > 1024:
		return nil, fmt.Errorf("data_parallel_size %d: %w", h.GetDataParallelSize(), ErrInvalid)
	}
	backend := BackendRef{Namespace: be.GetNamespace(), Name: be.GetName()}
	if err := s.ix.opt.Policy.AuthorizePublish(s.caller, backend, pod.GetNamespace(), pod.GetName(), pod.GetUid()); err != nil {
		s.ix.opt.Metrics.refused.WithLabelValues("ingest").Inc()
		return nil, err
	}
	s.hello = h
	s.pod = PodKey{Backend: backend, UID: pod.GetUid()}
	s.scheme = schemeString(h.GetHashScheme())
	dp := max(h.GetDataParallelSize(), 1)
	now := s.ix.opt.Now()
	s.rec = PodRecord{
		Backend: backend, UID: pod.GetUid(), Name: pod.GetName(), Model: h.GetModel(), Engine: h.GetEngine(),
		Scheme: s.scheme, BlockSize: h.GetHashScheme().GetBlockSize(), Compatibility: int32(h.GetHashCompatibility()),
		DPSize: dp, LastSeen: now,
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
	s.ix.opt.Metrics.streams.Inc()
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
	s.ix.opt.Log.Info("subscriber connected", "pod", pod.GetNamespace()+"/"+pod.GetName(), "cacheBackend", backend.String(),
		"model", h.GetModel(), "scheme", s.scheme, "ranks", dp, "resyncs", len(resyncs))
	return append([]*pb.IngestResponse{{Message: &pb.IngestResponse_Welcome{Welcome: welcome}}}, resyncs...), nil
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
	s.ix.opt.Metrics.resyncs.WithLabelValues(strings.ToLower(strings.TrimPrefix(reason.String(), "RESYNC_REASON_"))).Inc()
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

func (s *Session) space(lora string) Space {
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
	for _, ev := range d.GetEvents() {
		switch e := ev.Event.(type) {
		case *pb.BlockEvent_Stored:
			delta.Ops = append(delta.Ops, Op{Kind: OpStore, Tier: Tier(e.Stored.GetTier()), Space: s.space(e.Stored.GetLoraName()), Hashes: e.Stored.GetBlockHashes()})
			blocks += len(e.Stored.GetBlockHashes())
		case *pb.BlockEvent_Removed:
			delta.Ops = append(delta.Ops, Op{Kind: OpRemove, Tier: Tier(e.Removed.GetTier()), Space: s.space(e.Removed.GetLoraName()), Hashes: e.Removed.GetBlockHashes()})
			blocks += len(e.Removed.GetBlockHashes())
		case *pb.BlockEvent_Cleared:
			delta.Ops = append(delta.Ops, Op{Kind: OpClear, Tier: Tier(e.Cleared.GetTier())})
			blocks++
		}
	}
	start := time.Now()
	outcome, pos, err := s.ix.opt.Store.Apply(ctx, s.source(d.GetRank()), delta)
	if err != nil {
		return nil, fmt.Errorf("applying delta %d of pod %s rank %d: %w", d.GetSequence(), s.rec.Name, d.GetRank(), err)
	}
	s.ix.opt.Metrics.applyDuration.Observe(time.Since(start).Seconds())
	s.ix.opt.Metrics.deltas.WithLabelValues(outcome.String()).Inc()
	switch outcome {
	case Applied:
		s.ix.opt.Metrics.blockEvents.Add(float64(blocks))
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
	st := &staging{pos: Position{Epoch: b.GetEpoch(), Sequence: b.GetSequence()}, expected: b.GetBlockCount()}
	if b.GetBlockCount() > uint64(s.ix.opt.MaxSnapshotBlocks) {
		st.bad = true
	} else {
		st.entries = make([]Entry, 0, b.GetBlockCount())
	}
	s.snapshot[b.GetRank()] = st
	return nil, nil
}

func (s *Session) handleSnapshotChunk(c *pb.SnapshotChunk) ([]*pb.IngestResponse, error) {
	st := s.snapshot[c.GetRank()]
	if st == nil || st.pos.Epoch != c.GetEpoch() {
		return nil, fmt.Errorf("snapshot chunk for rank %d epoch %d without its begin: %w", c.GetRank(), c.GetEpoch(), ErrInvalid)
	}
	for _, e := range c.GetEntries() {
		refs := e.GetRefCounts()
		if len(refs) != 0 && len(refs) != len(e.GetBlockHashes()) {
			st.bad = true
		}
		if st.bad || uint64(len(st.entries)+len(e.GetBlockHashes())) > st.expected {
			st.bad, st.entries = true, nil
			continue
		}
		sp := s.space(e.GetLoraName())
		for i, h := range e.GetBlockHashes() {
			n := uint32(1)
			if len(refs) != 0 {
				n = refs[i]
			}
			st.entries = append(st.entries, Entry{Space: sp, Tier: Tier(e.GetTier()), Hash: h, Refs: n})
		}
	}
	return nil, nil
}

func (s *Session) handleSnapshotEnd(ctx context.Context, e *pb.SnapshotEnd) ([]*pb.IngestResponse, error) {
	rank := e.GetRank()
	st := s.snapshot[rank]
	delete(s.snapshot, rank)
	pos := Position{Epoch: e.GetEpoch(), Sequence: e.GetSequence()}
	if st == nil || st.bad || st.pos != pos || uint64(len(st.entries)) != e.GetBlockCount() || e.GetBlockCount() != st.expected {
		s.ix.opt.Log.Info("snapshot did not add up; asking again", "pod", s.rec.Name, "rank", rank)
		return []*pb.IngestResponse{s.resync(rank, pb.ResyncReason_RESYNC_REASON_SNAPSHOT_INVALID, Position{}, false)}, nil
	}
	if err := s.ix.opt.Store.Replace(ctx, s.source(rank), pos, st.entries); err != nil {
		if errors.Is(err, ErrStaleEpoch) {
			return nil, fmt.Errorf("%w: %w", err, ErrInvalid)
		}
		return nil, fmt.Errorf("replacing rank %d of pod %s: %w", rank, s.rec.Name, err)
	}
	s.asked[rank] = false
	s.rec.AwaitSnapshot = s.awaiting()
	s.rec.Resyncs++
	s.rec.LastEvent = s.ix.opt.Now()
	s.ix.opt.Metrics.snapshots.Inc()
	s.ix.opt.Log.Info("snapshot applied", "pod", s.rec.Name, "rank", rank, "epoch", pos.Epoch, "sequence", pos.Sequence, "blocks", len(st.entries))
	return []*pb.IngestResponse{ack(rank, pos)}, s.put(ctx, true)
}

func (s *Session) handleHeartbeat(h *pb.Heartbeat) {
	if c := h.GetHashCompatibility(); c != pb.HashCompatibility_HASH_COMPATIBILITY_UNSPECIFIED {
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

// ---------------------------------------------------------------- state

// podState is a pod's participation state from its record.
func (ix *Index) podState(rec PodRecord, ranksKnown int, now time.Time) pb.PodState {
	if now.Sub(rec.LastSeen) > ix.opt.StaleAfter {
		return pb.PodState_POD_STATE_STALE
	}
	replaying, stale := len(rec.AwaitSnapshot) > 0, false
	for _, r := range rec.Ranks {
		switch pb.PodState(r.State) {
		case pb.PodState_POD_STATE_UNSYNCED:
			return pb.PodState_POD_STATE_UNSYNCED
		case pb.PodState_POD_STATE_STALE:
			stale = true // the subscriber's engine stream ended
		case pb.PodState_POD_STATE_REPLAYING:
			replaying = true
		}
	}
	if stale {
		return pb.PodState_POD_STATE_STALE
	}
	if replaying {
		return pb.PodState_POD_STATE_REPLAYING
	}
	if ranksKnown == 0 && len(rec.Ranks) == 0 {
		return pb.PodState_POD_STATE_CONNECTING
	}
	return pb.PodState_POD_STATE_LIVE
}

// rateWindow counts applied block events per second over the last minute.
type rateWindow struct {
	mu      sync.Mutex
	buckets [60]uint64
	stamps  [60]int64
}

func (ix *Index) rate(b BackendRef) *rateWindow {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r := ix.rates[b]
	if r == nil {
		r = &rateWindow{}
		ix.rates[b] = r
	}
	return r
}

func (r *rateWindow) add(now time.Time, n uint64) {
	sec := now.Unix()
	i := sec % 60
	r.mu.Lock()
	if r.stamps[i] != sec {
		r.stamps[i], r.buckets[i] = sec, 0
	}
	r.buckets[i] += n
	r.mu.Unlock()
}

func (r *rateWindow) perSecond(now time.Time) float64 {
	sec := now.Unix()
	var sum uint64
	r.mu.Lock()
	for i := range r.buckets {
		if sec-r.stamps[i] < 60 {
			sum += r.buckets[i]
		}
	}
	r.mu.Unlock()
	return float64(sum) / 60
}

// ---------------------------------------------------------------- query

// Score answers a router's query: per pod, its best rank's longest prefix.
func (ix *Index) Score(ctx context.Context, caller Caller, req *pb.ScoreRequest) (*pb.ScoreResponse, error) {
	start := time.Now()
	backend := BackendRef{Namespace: req.GetCacheBackend().GetNamespace(), Name: req.GetCacheBackend().GetName()}
	res, err := ix.ScoreByRank(ctx, caller, backend, req.GetModel(), req.GetLoraName(), req.GetBlockHashes(), req.GetTokenIds())
	if err != nil {
		return nil, err
	}
	resp := &pb.ScoreResponse{QueryBlocks: res.QueryBlocks, BlockSize: res.BlockSize}
	best := map[string]*pb.PodScore{}
	for _, m := range res.Matches {
		if len(req.GetCandidatePods()) > 0 && !slices.Contains(req.GetCandidatePods(), m.Pod) {
			continue
		}
		ps := &pb.PodScore{
			PodName: m.Pod, PodUid: m.PodUID, Rank: m.Rank, MatchedBlocks: m.Any, MatchedTokens: uint64(m.Any) * uint64(m.BlockSize),
			Tiers: &pb.TierMatch{Gpu: m.GPU, Cpu: m.GPUOrCPU, Disk: m.Any}, State: m.State,
		}
		if cur, ok := best[m.PodUID]; !ok || betterScore(ps, cur) {
			best[m.PodUID] = ps
		}
	}
	for _, ps := range best {
		resp.Pods = append(resp.Pods, ps)
	}
	slices.SortFunc(resp.Pods, func(a, b *pb.PodScore) int {
		if betterScore(a, b) {
			return -1
		}
		if betterScore(b, a) {
			return 1
		}
		return cmp.Compare(a.PodName, b.PodName)
	})
	if l := int(req.GetLimit()); l > 0 && len(resp.Pods) > l {
		resp.Pods = resp.Pods[:l]
	}
	ix.opt.Metrics.scoreDuration.Observe(time.Since(start).Seconds())
	return resp, nil
}

func betterScore(a, b *pb.PodScore) bool {
	if a.MatchedBlocks != b.MatchedBlocks {
		return a.MatchedBlocks > b.MatchedBlocks
	}
	if a.Tiers.Gpu != b.Tiers.Gpu {
		return a.Tiers.Gpu > b.Tiers.Gpu
	}
	return a.Tiers.Cpu > b.Tiers.Cpu
}

func schemeParts(scheme string) (alg, seed string) {
	parts := strings.SplitN(scheme, "/", 3)
	if len(parts) != 3 {
		return scheme, ""
	}
	return parts[0], parts[2]
}

// RankScores is the answer of ScoreByRank.
type RankScores struct {
	Matches     []RankMatch
	QueryBlocks uint32
	BlockSize   uint32
}

// ScoreByRank returns every (pod, rank) of the backend serving model that
// holds at least the prompt's first block, with its prefix lengths; the
// Mooncake-shaped HTTP API reports them per rank and medium. The prompt is
// block hashes, or token IDs that the index hashes with the pods' scheme
// when that scheme is a Verified sha256_cbor. Pods reported Unsynced are
// left out: their blocks are not trusted.
func (ix *Index) ScoreByRank(ctx context.Context, caller Caller, backend BackendRef, model, lora string, hashes []uint64, tokens []uint32) (RankScores, error) {
	var res RankScores
	if backend.Namespace == "" || backend.Name == "" || model == "" {
		return res, fmt.Errorf("a query names a cache backend and a model: %w", ErrInvalid)
	}
	if err := ix.opt.Policy.AuthorizeRead(caller, backend); err != nil {
		ix.opt.Metrics.refused.WithLabelValues("query").Inc()
		return res, err
	}
	recs, err := ix.opt.Store.Pods(ctx, backend)
	if err != nil {
		return res, fmt.Errorf("listing pods of %s: %w", backend, err)
	}
	now := ix.opt.Now()
	pods := map[string]PodRecord{}
	schemes := map[string]PodRecord{}
	for _, r := range recs {
		if r.Model != model {
			continue
		}
		pods[r.UID] = r
		if _, ok := schemes[r.Scheme]; !ok || r.Compatibility == int32(pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED) {
			schemes[r.Scheme] = r
		}
	}
	hashedTokens := false
	for _, scheme := range slices.Sorted(maps.Keys(schemes)) {
		rep := schemes[scheme]
		hs := hashes
		if len(hs) == 0 && len(tokens) > 0 {
			if rep.Compatibility != int32(pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED) || lora != "" {
				continue
			}
			alg, seed := schemeParts(scheme)
			if hs, err = HashTokens(alg, seed, int(rep.BlockSize), tokens); err != nil {
				continue
			}
			hashedTokens = true
		}
		res.QueryBlocks = max(res.QueryBlocks, uint32(len(hs)))
		res.BlockSize = rep.BlockSize
		ms, err := ix.opt.Store.Score(ctx, backend, Space{Model: model, Lora: lora, Scheme: scheme}, hs)
		if err != nil {
			return res, fmt.Errorf("scoring in %s: %w", backend, err)
		}
		for _, m := range ms {
			rec, ok := pods[m.PodUID]
			if !ok || m.Any == 0 {
				continue
			}
			state := ix.podState(rec, 1, now)
			if state == pb.PodState_POD_STATE_UNSYNCED {
				continue
			}
			res.Matches = append(res.Matches, RankMatch{Pod: rec.Name, BlockSize: rec.BlockSize, State: state, Match: m})
		}
	}
	if len(hashes) == 0 && len(tokens) > 0 && len(schemes) > 0 && !hashedTokens {
		return res, fmt.Errorf("no pod of model %s in %s has a Verified sha256_cbor scheme for the base model: %w", model, backend, ErrTokensUnsupported)
	}
	return res, nil
}

// RankMatch is one (pod, rank)'s match with the pod's name and state.
type RankMatch struct {
	Pod       string
	BlockSize uint32
	State     pb.PodState
	Match
}

// Participation summarises a backend for the operator.
func (ix *Index) Participation(ctx context.Context, caller Caller, req *pb.ParticipationRequest) (*pb.ParticipationSummary, error) {
	backend := BackendRef{Namespace: req.GetCacheBackend().GetNamespace(), Name: req.GetCacheBackend().GetName()}
	if backend.Namespace == "" || backend.Name == "" {
		return nil, fmt.Errorf("a participation request names a cache backend: %w", ErrInvalid)
	}
	if err := ix.opt.Policy.AuthorizeRead(caller, backend); err != nil {
		ix.opt.Metrics.refused.WithLabelValues("query").Inc()
		return nil, err
	}
	recs, err := ix.opt.Store.Pods(ctx, backend)
	if err != nil {
		return nil, fmt.Errorf("listing pods of %s: %w", backend, err)
	}
	tiers, err := ix.opt.Store.TierBlocks(ctx, backend)
	if err != nil {
		return nil, fmt.Errorf("counting blocks of %s: %w", backend, err)
	}
	now := ix.opt.Now()
	sum := &pb.ParticipationSummary{
		CacheBackend:       &pb.CacheBackendRef{Namespace: backend.Namespace, Name: backend.Name},
		ObservedUnixMillis: now.UnixMilli(),
		EventsPerSecond:    ix.rate(backend).perSecond(now),
	}
	for t := TierGPU; t <= TierDisk; t++ {
		sum.Blocks = append(sum.Blocks, &pb.TierBlocks{Tier: pb.Tier(t), Blocks: tiers[t]})
	}
	models, schemes := map[string]bool{}, map[string]bool{}
	var list []*pb.PodParticipation
	for _, r := range recs {
		key := PodKey{Backend: backend, UID: r.UID}
		positions, err := ix.opt.Store.Positions(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("reading positions of pod %s: %w", r.Name, err)
		}
		blocks, err := ix.opt.Store.PodBlocks(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("counting blocks of pod %s: %w", r.Name, err)
		}
		state := ix.podState(r, len(positions), now)
		p := &pb.PodParticipation{
			Name: r.Name, Uid: r.UID, State: state, DataParallelSize: r.DPSize, Blocks: blocks,
			Resyncs: r.Resyncs, HashCompatibility: pb.HashCompatibility(r.Compatibility),
		}
		if !r.LastEvent.IsZero() {
			p.LastEventUnixMillis = r.LastEvent.UnixMilli()
			sum.LastEventUnixMillis = max(sum.LastEventUnixMillis, p.LastEventUnixMillis)
		}
		for _, pos := range positions {
			p.Epoch = max(p.Epoch, pos.Epoch)
			p.LastSequence += pos.Sequence
		}
		for _, rh := range r.Ranks {
			p.LagMillis = max(p.LagMillis, rh.LagP99Millis)
			p.SequenceGaps += rh.Gaps
			sum.SequenceGaps += rh.Gaps
			sum.GapsRecovered += rh.GapsRecovered
			sum.LagP50Millis = max(sum.LagP50Millis, rh.LagP50Millis)
			sum.LagP99Millis = max(sum.LagP99Millis, rh.LagP99Millis)
			if rh.Message != "" {
				p.Message = rh.Message
			}
		}
		if len(r.AwaitSnapshot) > 0 && p.Message == "" {
			p.Message = fmt.Sprintf("index awaits a snapshot of ranks %v", r.AwaitSnapshot)
		}
		sum.Resyncs += r.Resyncs
		sum.Pods++
		switch state {
		case pb.PodState_POD_STATE_LIVE:
			sum.LivePods++
		case pb.PodState_POD_STATE_REPLAYING:
			sum.ReplayingPods++
		case pb.PodState_POD_STATE_STALE:
			sum.StalePods++
		case pb.PodState_POD_STATE_UNSYNCED:
			sum.UnsyncedPods++
		case pb.PodState_POD_STATE_CONNECTING:
			sum.ConnectingPods++
		}
		sum.HashCompatibility = worseCompat(sum.HashCompatibility, p.HashCompatibility)
		models[r.Model], schemes[r.Scheme] = true, true
		list = append(list, p)
	}
	sum.Model = joinOrMixed(models)
	sum.HashScheme = joinOrMixed(schemes)
	slices.SortFunc(list, func(a, b *pb.PodParticipation) int {
		if c := cmp.Compare(stateSeverity(b.State), stateSeverity(a.State)); c != 0 {
			return c
		}
		if c := cmp.Compare(b.LagMillis, a.LagMillis); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	limit := int(req.GetMaxPods())
	if limit <= 0 || limit > 32 {
		limit = 32
	}
	if len(list) > limit {
		list, sum.PodsTruncated = list[:limit], true
	}
	sum.PodList = list
	return sum, nil
}

func stateSeverity(s pb.PodState) int {
	switch s {
	case pb.PodState_POD_STATE_UNSYNCED:
		return 5
	case pb.PodState_POD_STATE_STALE:
		return 4
	case pb.PodState_POD_STATE_REPLAYING:
		return 3
	case pb.PodState_POD_STATE_CONNECTING:
		return 2
	}
	return 1
}

func worseCompat(a, b pb.HashCompatibility) pb.HashCompatibility {
	rank := func(c pb.HashCompatibility) int {
		switch c {
		case pb.HashCompatibility_HASH_COMPATIBILITY_MISMATCH:
			return 3
		case pb.HashCompatibility_HASH_COMPATIBILITY_UNVERIFIABLE:
			return 2
		case pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED:
			return 1
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}

func joinOrMixed(set map[string]bool) string {
	switch len(set) {
	case 0:
		return ""
	case 1:
		for k := range set {
			return k
		}
	}
	return "mixed"
}
