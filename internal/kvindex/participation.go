package kvindex

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

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

// rate is the backend's window, made on its first applied delta.
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

// eventsPerSecond is the backend's applied block events per second over
// the last minute. A read makes no window: a backend without one (no
// delta applied, or a name nobody publishes for) has none.
func (ix *Index) eventsPerSecond(b BackendRef, now time.Time) float64 {
	ix.mu.Lock()
	r := ix.rates[b]
	ix.mu.Unlock()
	if r == nil {
		return 0
	}
	return r.perSecond(now)
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

// Participation summarises a backend for the operator.
func (ix *Index) Participation(ctx context.Context, caller Caller, req *pb.ParticipationRequest) (*pb.ParticipationSummary, error) {
	backend := BackendRef{Namespace: req.GetCacheBackend().GetNamespace(), Name: req.GetCacheBackend().GetName()}
	if backend.Namespace == "" || backend.Name == "" {
		return nil, fmt.Errorf("a participation request names a cache backend: %w", ErrInvalid)
	}
	if err := checkBackend(backend); err != nil {
		return nil, err
	}
	if err := ix.opt.Policy.AuthorizeRead(caller, backend); err != nil {
		ix.opt.Observer.Refused("query")
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
		EventsPerSecond:    ix.eventsPerSecond(backend, now),
	}
	for t := TierGPU; t <= TierDisk; t++ {
		sum.Blocks = append(sum.Blocks, &pb.TierBlocks{Tier: pb.Tier(t), Blocks: tiers[t]})
	}
	models, schemes, tierSchemes := map[string]bool{}, map[string]bool{}, map[string]bool{}
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
		models[r.Model] = true
		if r.BlockSize > 0 {
			// A pod that announced no block size yet (its subscriber has
			// seen no event) has no scheme to report.
			schemes[r.Scheme] = true
		}
		if r.TierScheme != "" {
			tierSchemes[r.TierScheme] = true
		}
		list = append(list, p)
	}
	sum.Model = joinOrMixed(models)
	sum.HashScheme = joinOrMixed(schemes)
	sum.TierScheme = joinOrMixed(tierSchemes)
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
