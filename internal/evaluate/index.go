package evaluate

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// IndexPod is a matched engine pod wired for KV events (the index should
// know it).
type IndexPod struct {
	Name string
	UID  string
}

// IndexFacts is what the IndexSynced evaluation looks at.
type IndexFacts struct {
	// Observed: spec.observation is set. Without it there is no
	// indexParticipation and no IndexSynced condition.
	Observed bool
	// ModelID is spec.observation.modelID; the webhook adds the sidecar
	// only when it is set.
	ModelID string
	// SubscriberImage: the manager runs with --kvevent-subscriber-image.
	SubscriberImage bool
	// WorkloadAvailable: the backend serves (LMCache: the endpoint is
	// published; SGLangHiCache: the engine pods are Ready).
	WorkloadAvailable bool
	// Expected are the matched pods that carry the sidecar.
	Expected []IndexPod
	// Summary is the index's participation summary; nil when the gate kept
	// the index from being read or the read failed (ReadErr).
	Summary *pb.ParticipationSummary
	ReadErr error
}

// IndexVerdict is the IndexSynced condition's status, reason and message.
type IndexVerdict struct {
	Status  metav1.ConditionStatus
	Reason  string
	Message string
}

// GateOpen reports whether the KV-event gate is open: observation is
// configured, the sidecar can be injected, the workload serves and at least
// one matched pod carries the sidecar. Only then is the index read.
func (f IndexFacts) GateOpen() bool {
	return f.Observed && f.ModelID != "" && f.SubscriberImage && f.WorkloadAvailable && len(f.Expected) > 0
}

// indexChain is the precedence of IndexSynced's reasons, first match wins.
var indexChain = []func(IndexFacts, *v1alpha1.IndexParticipation) (IndexVerdict, bool){
	noSubscriber,
	gateClosed,
	indexUnread,
	hashMismatch,
	podsUnsynced,
	podsMissing,
	podsStale,
	podsResyncing,
	allPodsLive,
}

func noSubscriber(f IndexFacts, _ *v1alpha1.IndexParticipation) (IndexVerdict, bool) {
	if f.ModelID == "" {
		return falseV(v1alpha1.ReasonSubscriberMissing, "spec.observation.modelID is empty: the webhook adds no kvevent-subscriber sidecar"), true
	}
	if !f.SubscriberImage {
		return falseV(v1alpha1.ReasonSubscriberMissing, "the manager runs without --kvevent-subscriber-image: the webhook adds no kvevent-subscriber sidecar"), true
	}
	return IndexVerdict{}, false
}

func gateClosed(f IndexFacts, _ *v1alpha1.IndexParticipation) (IndexVerdict, bool) {
	switch {
	case !f.WorkloadAvailable:
		return IndexVerdict{metav1.ConditionUnknown, v1alpha1.ReasonAwaitingWorkload, "the KV-event gate is closed: the backend is not serving yet"}, true
	case len(f.Expected) == 0:
		return IndexVerdict{metav1.ConditionUnknown, v1alpha1.ReasonAwaitingWorkload, "the KV-event gate is closed: no matched engine pod carries the kvevent-subscriber sidecar"}, true
	}
	return IndexVerdict{}, false
}

func indexUnread(f IndexFacts, _ *v1alpha1.IndexParticipation) (IndexVerdict, bool) {
	if f.ReadErr == nil && f.Summary != nil {
		return IndexVerdict{}, false
	}
	msg := "the KV-block index was not read"
	if f.ReadErr != nil {
		msg = "reading the KV-block index: " + f.ReadErr.Error()
	}
	return falseV(v1alpha1.ReasonIndexUnavailable, msg+" (Ready is not affected)"), true
}

func hashMismatch(_ IndexFacts, p *v1alpha1.IndexParticipation) (IndexVerdict, bool) {
	return falseV(v1alpha1.ReasonHashMismatch, "the engines' block hashes do not match the configured scheme "+p.HashScheme+": token-ID queries never match; check --prefix-caching-hash-algo, the block size and PYTHONHASHSEED"),
		p.HashCompatibility == v1alpha1.HashMismatch
}

func podsUnsynced(_ IndexFacts, p *v1alpha1.IndexParticipation) (IndexVerdict, bool) {
	return falseV(v1alpha1.ReasonPodsUnsynced, podsMessage(p, v1alpha1.IndexPodUnsynced, p.UnsyncedPods, "lost events they cannot recover")), p.UnsyncedPods > 0
}

func podsMissing(_ IndexFacts, p *v1alpha1.IndexParticipation) (IndexVerdict, bool) {
	return falseV(v1alpha1.ReasonSubscriberMissing, podsMessage(p, v1alpha1.IndexPodMissing, p.MissingPods, "never reached the index")), p.MissingPods > 0
}

func podsStale(_ IndexFacts, p *v1alpha1.IndexParticipation) (IndexVerdict, bool) {
	return falseV(v1alpha1.ReasonPodsStale, podsMessage(p, v1alpha1.IndexPodStale, p.StalePods, "sent nothing for the index's stale period")), p.StalePods > 0
}

func podsResyncing(_ IndexFacts, p *v1alpha1.IndexParticipation) (IndexVerdict, bool) {
	return falseV(v1alpha1.ReasonPodsResyncing, fmt.Sprintf("%d pod(s) connecting or catching up", p.ResyncingPods)), p.ResyncingPods > 0
}

func allPodsLive(_ IndexFacts, p *v1alpha1.IndexParticipation) (IndexVerdict, bool) {
	return IndexVerdict{metav1.ConditionTrue, v1alpha1.ReasonAllPodsLive, fmt.Sprintf("%s engine pods live in the KV-block index", p.Indexed)}, true
}

func falseV(reason, msg string) IndexVerdict {
	return IndexVerdict{Status: metav1.ConditionFalse, Reason: reason, Message: msg}
}

// podsMessage names up to three pods in state.
func podsMessage(p *v1alpha1.IndexParticipation, state v1alpha1.IndexPodState, n int32, what string) string {
	var names []string
	for _, pod := range p.Pods {
		if pod.State == state && len(names) < 3 {
			names = append(names, pod.Name)
		}
	}
	return fmt.Sprintf("%d pod(s) %s: %v", n, what, names)
}

// Index evaluates KV-event observation: the participation to publish
// (nil without spec.observation) and the IndexSynced verdict.
func Index(f IndexFacts) (*v1alpha1.IndexParticipation, IndexVerdict) {
	if !f.Observed {
		return nil, IndexVerdict{}
	}
	// While the gate is closed no pod streams (no sidecar, or the backend
	// does not serve yet): the participation stays unset, as the seed's
	// lifecycle step 4 says; only the condition says why.
	var p *v1alpha1.IndexParticipation
	if f.GateOpen() {
		p = Participation(f.Expected, f.Summary)
	}
	for _, pol := range indexChain {
		if v, ok := pol(f, p); ok {
			return p, v
		}
	}
	return p, IndexVerdict{}
}

var podStates = map[pb.PodState]v1alpha1.IndexPodState{
	pb.PodState_POD_STATE_CONNECTING: v1alpha1.IndexPodConnecting,
	pb.PodState_POD_STATE_REPLAYING:  v1alpha1.IndexPodReplaying,
	pb.PodState_POD_STATE_LIVE:       v1alpha1.IndexPodLive,
	pb.PodState_POD_STATE_STALE:      v1alpha1.IndexPodStale,
	pb.PodState_POD_STATE_UNSYNCED:   v1alpha1.IndexPodUnsynced,
}

func severity(s v1alpha1.IndexPodState) int {
	return map[v1alpha1.IndexPodState]int{
		v1alpha1.IndexPodMissing: 6, v1alpha1.IndexPodUnsynced: 5, v1alpha1.IndexPodStale: 4,
		v1alpha1.IndexPodReplaying: 3, v1alpha1.IndexPodConnecting: 2, v1alpha1.IndexPodLive: 1,
	}[s]
}

func hashCompat(c pb.HashCompatibility) v1alpha1.HashCompatibility {
	switch c {
	case pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED:
		return v1alpha1.HashVerified
	case pb.HashCompatibility_HASH_COMPATIBILITY_MISMATCH:
		return v1alpha1.HashMismatch
	case pb.HashCompatibility_HASH_COMPATIBILITY_UNVERIFIABLE:
		return v1alpha1.HashUnverifiable
	}
	return ""
}

func millisTime(ms int64) *metav1.Time {
	if ms <= 0 {
		return nil
	}
	t := metav1.NewTime(time.UnixMilli(ms).UTC().Truncate(time.Second))
	return &t
}

func clampInt64(u uint64) int64 { return int64(min(u, math.MaxInt64)) }

// Participation builds the published participation from the expected pods
// and the index's summary (nil: nothing read, every count but expected is
// zero). Pod counts are over the expected pods only when the index listed
// every pod it knows (a pod that left the selector but whose lease still
// runs is not counted); from a truncated list they are the index's own.
func Participation(expected []IndexPod, sum *pb.ParticipationSummary) *v1alpha1.IndexParticipation {
	p := &v1alpha1.IndexParticipation{ExpectedPods: int32(len(expected))}
	if sum == nil {
		p.Indexed = fmt.Sprintf("0/%d", p.ExpectedPods)
		return p
	}
	for _, tb := range sum.GetBlocks() {
		switch tb.GetTier() {
		case pb.Tier_TIER_GPU:
			p.Blocks.GPU = clampInt64(tb.GetBlocks())
		case pb.Tier_TIER_CPU:
			p.Blocks.CPU = clampInt64(tb.GetBlocks())
		case pb.Tier_TIER_DISK:
			p.Blocks.Disk = clampInt64(tb.GetBlocks())
		}
	}
	p.EventsPerMinute = int64(math.Round(sum.GetEventsPerSecond() * 60))
	p.LagP50Millis, p.LagP99Millis = int64(sum.GetLagP50Millis()), int64(sum.GetLagP99Millis())
	p.SequenceGaps, p.GapsRecovered, p.Resyncs = clampInt64(sum.GetSequenceGaps()), clampInt64(sum.GetGapsRecovered()), clampInt64(sum.GetResyncs())
	p.HashScheme = truncate(sum.GetHashScheme(), 128)
	p.TierScheme = truncate(sum.GetTierScheme(), 128)
	p.HashCompatibility = hashCompat(sum.GetHashCompatibility())
	p.LastEventTime = millisTime(sum.GetLastEventUnixMillis())

	byUID := map[string]IndexPod{}
	for _, e := range expected {
		byUID[e.UID] = e
	}
	seen := map[string]bool{}
	var pods []v1alpha1.PodIndexParticipation
	for _, ip := range sum.GetPodList() {
		if _, ok := byUID[ip.GetUid()]; !ok {
			continue
		}
		seen[ip.GetUid()] = true
		pods = append(pods, v1alpha1.PodIndexParticipation{
			Name: ip.GetName(), State: podStates[ip.GetState()], Blocks: clampInt64(ip.GetBlocks()),
			LagMillis: int64(ip.GetLagMillis()), SequenceGaps: clampInt64(ip.GetSequenceGaps()), Resyncs: clampInt64(ip.GetResyncs()),
			HashCompatibility: hashCompat(ip.GetHashCompatibility()), LastEventTime: millisTime(ip.GetLastEventUnixMillis()),
			Message: truncate(ip.GetMessage(), 256),
		})
	}
	if sum.GetPodsTruncated() {
		p.LivePods = int32(sum.GetLivePods())
		p.ResyncingPods = int32(sum.GetReplayingPods() + sum.GetConnectingPods())
		p.StalePods, p.UnsyncedPods = int32(sum.GetStalePods()), int32(sum.GetUnsyncedPods())
		p.MissingPods = max(0, p.ExpectedPods-int32(sum.GetPods()))
	} else {
		for _, e := range expected {
			if !seen[e.UID] {
				pods = append(pods, v1alpha1.PodIndexParticipation{Name: e.Name, State: v1alpha1.IndexPodMissing, Message: "the index has never heard of this pod's subscriber"})
			}
		}
		for _, pod := range pods {
			switch pod.State {
			case v1alpha1.IndexPodLive:
				p.LivePods++
			case v1alpha1.IndexPodReplaying, v1alpha1.IndexPodConnecting:
				p.ResyncingPods++
			case v1alpha1.IndexPodStale:
				p.StalePods++
			case v1alpha1.IndexPodUnsynced:
				p.UnsyncedPods++
			case v1alpha1.IndexPodMissing:
				p.MissingPods++
			}
		}
	}
	slices.SortFunc(pods, func(a, b v1alpha1.PodIndexParticipation) int {
		if c := cmp.Compare(severity(b.State), severity(a.State)); c != 0 {
			return c
		}
		if c := cmp.Compare(b.LagMillis, a.LagMillis); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	if len(pods) > v1alpha1.MaxIndexParticipationPods {
		pods = pods[:v1alpha1.MaxIndexParticipationPods]
		p.PodsTruncated = true
	}
	p.PodsTruncated = p.PodsTruncated || sum.GetPodsTruncated()
	p.Pods = pods
	p.Indexed = fmt.Sprintf("%d/%d", p.LivePods, p.ExpectedPods)
	return p
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// Change thresholds: a participation that differs from the published one
// only by these is not a meaningful change and is not written.
const (
	// blocksChangeFraction: block counts within 10% of the published ones.
	blocksChangeFraction = 10
	// lagChangeMillis: lags within 100 ms or 25% of the published ones.
	lagChangeMillis = 100
	// eventTimeChange: last event times within a minute of the published.
	eventTimeChange = time.Minute
)

// Settle returns published when next differs from it only by jitter (the
// event rate always; block counts, lags and event times within the change
// thresholds), next otherwise. The caller writes status only when the
// result is not published, so a steady stream of events costs no writes.
func Settle(published, next *v1alpha1.IndexParticipation) *v1alpha1.IndexParticipation {
	if published == nil || next == nil {
		return next
	}
	n := next.DeepCopy()
	n.EventsPerMinute = published.EventsPerMinute
	settleInt(&n.Blocks.GPU, published.Blocks.GPU, blocksNear)
	settleInt(&n.Blocks.CPU, published.Blocks.CPU, blocksNear)
	settleInt(&n.Blocks.Disk, published.Blocks.Disk, blocksNear)
	settleInt(&n.LagP50Millis, published.LagP50Millis, lagNear)
	settleInt(&n.LagP99Millis, published.LagP99Millis, lagNear)
	settleTime(&n.LastEventTime, published.LastEventTime)
	old := map[string]v1alpha1.PodIndexParticipation{}
	for _, p := range published.Pods {
		old[p.Name] = p
	}
	for i := range n.Pods {
		o, ok := old[n.Pods[i].Name]
		if !ok {
			continue
		}
		settleInt(&n.Pods[i].Blocks, o.Blocks, blocksNear)
		settleInt(&n.Pods[i].LagMillis, o.LagMillis, lagNear)
		settleTime(&n.Pods[i].LastEventTime, o.LastEventTime)
	}
	if ParticipationEqual(published, n) {
		return published
	}
	return next
}

// ParticipationEqual compares two participations field by field (times
// by instant).
func ParticipationEqual(a, b *v1alpha1.IndexParticipation) bool {
	return equality.Semantic.DeepEqual(a, b)
}

func blocksNear(old, v int64) bool {
	if old == 0 || v == 0 {
		return old == v
	}
	d := v - old
	return max(d, -d)*blocksChangeFraction <= old
}

func lagNear(old, v int64) bool {
	d := max(v-old, old-v)
	return d <= lagChangeMillis || d*4 <= old
}

func settleInt(v *int64, old int64, near func(old, v int64) bool) {
	if near(old, *v) {
		*v = old
	}
}

func settleTime(v **metav1.Time, old *metav1.Time) {
	if *v != nil && old != nil && (*v).Sub(old.Time).Abs() < eventTimeChange {
		*v = old
	}
}
