package evaluate

import (
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

func pod(name string, st pb.PodState) *pb.PodParticipation {
	return &pb.PodParticipation{Name: name, Uid: "uid-" + name, State: st, Blocks: 7,
		HashCompatibility: pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED}
}

func summary(pods ...*pb.PodParticipation) *pb.ParticipationSummary {
	return &pb.ParticipationSummary{Pods: uint32(len(pods)), PodList: pods, HashScheme: "sha256_cbor/16/vllm-none-hash", TierScheme: "lmcache_blake3/256/",
		HashCompatibility: pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED,
		Blocks:            []*pb.TierBlocks{{Tier: pb.Tier_TIER_GPU, Blocks: 14}, {Tier: pb.Tier_TIER_CPU, Blocks: 3}}}
}

func expected(names ...string) []IndexPod {
	var out []IndexPod
	for _, n := range names {
		out = append(out, IndexPod{Name: n, UID: "uid-" + n})
	}
	return out
}

// TestIndex guards IndexSynced's reasons and their precedence.
func TestIndex(t *testing.T) {
	open := IndexFacts{Observed: true, ModelID: "m", SubscriberImage: true, WorkloadAvailable: true, Expected: expected("a", "b")}
	with := func(mod func(*IndexFacts)) IndexFacts {
		f := open
		mod(&f)
		return f
	}
	mismatch := summary(pod("a", pb.PodState_POD_STATE_LIVE), pod("b", pb.PodState_POD_STATE_STALE))
	mismatch.HashCompatibility = pb.HashCompatibility_HASH_COMPATIBILITY_MISMATCH
	for _, tc := range []struct {
		name    string
		facts   IndexFacts
		status  metav1.ConditionStatus
		reason  string
		indexed string
	}{
		{"no observation: no condition", IndexFacts{}, "", "", ""},
		{"no model id", with(func(f *IndexFacts) { f.ModelID = "" }), metav1.ConditionFalse, v1alpha1.ReasonSubscriberMissing, ""},
		{"no subscriber image", with(func(f *IndexFacts) { f.SubscriberImage = false }), metav1.ConditionFalse, v1alpha1.ReasonSubscriberMissing, ""},
		{"gate: workload not available", with(func(f *IndexFacts) { f.WorkloadAvailable = false }), metav1.ConditionUnknown, v1alpha1.ReasonAwaitingWorkload, ""},
		{"gate: no pod carries the sidecar", with(func(f *IndexFacts) { f.Expected = nil }), metav1.ConditionUnknown, v1alpha1.ReasonAwaitingWorkload, ""},
		{"index unavailable", with(func(f *IndexFacts) { f.ReadErr = errors.New("connection refused") }), metav1.ConditionFalse, v1alpha1.ReasonIndexUnavailable, "0/2"},
		{"hash mismatch before stale", with(func(f *IndexFacts) { f.Summary = mismatch }), metav1.ConditionFalse, v1alpha1.ReasonHashMismatch, "1/2"},
		{"unsynced before missing", with(func(f *IndexFacts) { f.Summary = summary(pod("a", pb.PodState_POD_STATE_UNSYNCED)) }), metav1.ConditionFalse, v1alpha1.ReasonPodsUnsynced, "0/2"},
		{"missing before stale", with(func(f *IndexFacts) { f.Summary = summary(pod("a", pb.PodState_POD_STATE_STALE)) }), metav1.ConditionFalse, v1alpha1.ReasonSubscriberMissing, "0/2"},
		{"stale", with(func(f *IndexFacts) {
			f.Summary = summary(pod("a", pb.PodState_POD_STATE_STALE), pod("b", pb.PodState_POD_STATE_REPLAYING))
		}), metav1.ConditionFalse, v1alpha1.ReasonPodsStale, "0/2"},
		{"resyncing", with(func(f *IndexFacts) {
			f.Summary = summary(pod("a", pb.PodState_POD_STATE_LIVE), pod("b", pb.PodState_POD_STATE_CONNECTING))
		}), metav1.ConditionFalse, v1alpha1.ReasonPodsResyncing, "1/2"},
		{"all live", with(func(f *IndexFacts) {
			f.Summary = summary(pod("a", pb.PodState_POD_STATE_LIVE), pod("b", pb.PodState_POD_STATE_LIVE))
		}), metav1.ConditionTrue, v1alpha1.ReasonAllPodsLive, "2/2"},
		{"a departed pod in the index is not counted", with(func(f *IndexFacts) {
			f.Summary = summary(pod("a", pb.PodState_POD_STATE_LIVE), pod("b", pb.PodState_POD_STATE_LIVE), pod("gone", pb.PodState_POD_STATE_STALE))
		}), metav1.ConditionTrue, v1alpha1.ReasonAllPodsLive, "2/2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, v := Index(tc.facts)
			if v.Status != tc.status || v.Reason != tc.reason {
				t.Fatalf("verdict %s/%s (%s), want %s/%s", v.Status, v.Reason, v.Message, tc.status, tc.reason)
			}
			if tc.indexed == "" {
				if p != nil {
					t.Fatalf("participation %+v without observation or with the gate closed (the seed: no sidecar, fields unset)", p)
				}
				return
			}
			if p.Indexed != tc.indexed {
				t.Fatalf("indexed %q, want %q", p.Indexed, tc.indexed)
			}
		})
	}
}

// TestParticipationWorstFirstBounded guards the per-pod list: worst first,
// missing pods included, at most MaxIndexParticipationPods.
func TestParticipationWorstFirstBounded(t *testing.T) {
	var exp []IndexPod
	var list []*pb.PodParticipation
	for i := range 14 {
		n := string(rune('a' + i))
		exp = append(exp, IndexPod{Name: n, UID: "uid-" + n})
		if i < 12 {
			st := pb.PodState_POD_STATE_LIVE
			if i == 5 {
				st = pb.PodState_POD_STATE_STALE
			}
			list = append(list, pod(n, st))
		}
	}
	p := Participation(exp, summary(list...))
	if len(p.Pods) != v1alpha1.MaxIndexParticipationPods || !p.PodsTruncated {
		t.Fatalf("%d pods, truncated %v", len(p.Pods), p.PodsTruncated)
	}
	want := []v1alpha1.IndexPodState{v1alpha1.IndexPodMissing, v1alpha1.IndexPodMissing, v1alpha1.IndexPodStale, v1alpha1.IndexPodLive}
	for i, w := range want {
		if p.Pods[i].State != w {
			t.Fatalf("pod %d is %s, want %s: %+v", i, p.Pods[i].State, w, p.Pods)
		}
	}
	if p.LivePods != 11 || p.StalePods != 1 || p.MissingPods != 2 || p.ExpectedPods != 14 || p.Indexed != "11/14" {
		t.Fatalf("counts %+v", p)
	}
	if p.Blocks.GPU != 14 || p.Blocks.CPU != 3 || p.HashCompatibility != v1alpha1.HashVerified || p.TierScheme != "lmcache_blake3/256/" {
		t.Fatalf("blocks %+v compat %s tier scheme %q", p.Blocks, p.HashCompatibility, p.TierScheme)
	}
}

// TestSettle guards the change test: jitter alone is no change.
func TestSettle(t *testing.T) {
	at := func(s int) *metav1.Time { v := metav1.NewTime(time.Unix(1_800_000_000+int64(s), 0)); return &v }
	base := &v1alpha1.IndexParticipation{Indexed: "1/1", ExpectedPods: 1, LivePods: 1, Blocks: v1alpha1.IndexBlocks{GPU: 1000},
		EventsPerMinute: 600, LagP99Millis: 20, LastEventTime: at(0),
		Pods: []v1alpha1.PodIndexParticipation{{Name: "a", State: v1alpha1.IndexPodLive, Blocks: 1000, LagMillis: 20, LastEventTime: at(0)}}}
	for _, tc := range []struct {
		name    string
		mod     func(*v1alpha1.IndexParticipation)
		changed bool
	}{
		{"identical", func(*v1alpha1.IndexParticipation) {}, false},
		{"event rate only", func(p *v1alpha1.IndexParticipation) { p.EventsPerMinute = 9000 }, false},
		{"blocks within 10%", func(p *v1alpha1.IndexParticipation) { p.Blocks.GPU, p.Pods[0].Blocks = 1090, 950 }, false},
		{"blocks beyond 10%", func(p *v1alpha1.IndexParticipation) { p.Blocks.GPU = 1200 }, true},
		{"blocks from zero", func(p *v1alpha1.IndexParticipation) { p.Blocks.CPU = 1 }, true},
		{"lag jitter", func(p *v1alpha1.IndexParticipation) { p.LagP99Millis, p.Pods[0].LagMillis = 90, 110 }, false},
		{"lag jump", func(p *v1alpha1.IndexParticipation) { p.LagP99Millis = 2000 }, true},
		{"last event within a minute", func(p *v1alpha1.IndexParticipation) { p.LastEventTime, p.Pods[0].LastEventTime = at(30), at(59) }, false},
		{"last event a minute later", func(p *v1alpha1.IndexParticipation) { p.LastEventTime = at(61) }, true},
		{"pod state", func(p *v1alpha1.IndexParticipation) {
			p.Pods[0].State, p.LivePods, p.StalePods = v1alpha1.IndexPodStale, 0, 1
		}, true},
		{"gaps", func(p *v1alpha1.IndexParticipation) { p.SequenceGaps = 1 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := base.DeepCopy()
			tc.mod(next)
			got := Settle(base, next)
			if changed := got != base; changed != tc.changed {
				t.Fatalf("changed %v, want %v", changed, tc.changed)
			}
			if tc.changed && got != next {
				t.Fatal("a meaningful change publishes the fresh values")
			}
		})
	}
	if Settle(nil, base) != base || Settle(base, nil) != nil {
		t.Fatal("nil on either side is a change")
	}
}
