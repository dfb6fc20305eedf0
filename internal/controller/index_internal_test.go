package controller

import (
	"context"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/inject"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// stubIndex is an IndexReader answering sum or err, counting reads.
type stubIndex struct {
	sum   *pb.ParticipationSummary
	err   error
	reads int
}

func (s *stubIndex) Participation(context.Context, string, string) (*pb.ParticipationSummary, error) {
	s.reads++
	return s.sum, s.err
}

// TestKVEventGate guards the gate for both kinds of backend: the index is
// read only once the backend serves (LMCache: endpoint published;
// SGLangHiCache: Ready) and a matched pod carries the sidecar; without
// observation nothing is published and the condition is removed.
func TestKVEventGate(t *testing.T) {
	t.Parallel()
	live := &pb.ParticipationSummary{Pods: 1, LivePods: 1, PodList: []*pb.PodParticipation{{Name: "e-0", Uid: "u0", State: pb.PodState_POD_STATE_LIVE}}}
	wired := []evaluate.IndexPod{{Name: "e-0", UID: "u0"}}
	lmcache := func(endpoint string) *v1alpha1.CacheBackend {
		return &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cb", Generation: 1},
			Spec:   v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Observation: &v1alpha1.Observation{ModelID: "m"}},
			Status: v1alpha1.CacheBackendStatus{Endpoint: endpoint}}
	}
	hicache := func(ready metav1.ConditionStatus) *v1alpha1.CacheBackend {
		cb := lmcache("")
		cb.Spec.Type = v1alpha1.BackendTypeSGLangHiCache
		cb.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: ready}}
		return cb
	}
	plain := lmcache("lm://x")
	plain.Spec.Observation = nil
	plain.Status.IndexParticipation = &v1alpha1.IndexParticipation{Indexed: "1/1"}
	plain.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionIndexSynced, Status: metav1.ConditionTrue}}
	for _, tc := range []struct {
		name   string
		cb     *v1alpha1.CacheBackend
		wired  []evaluate.IndexPod
		err    error
		reads  int
		reason string
	}{
		{"LMCache serving", lmcache("lm://x"), wired, nil, 1, v1alpha1.ReasonAllPodsLive},
		{"LMCache not serving", lmcache(""), wired, nil, 0, v1alpha1.ReasonAwaitingWorkload},
		{"LMCache serving, no sidecar pod", lmcache("lm://x"), nil, nil, 0, v1alpha1.ReasonAwaitingWorkload},
		{"LMCache serving, index down", lmcache("lm://x"), wired, errors.New("connection refused"), 1, v1alpha1.ReasonIndexUnavailable},
		{"SGLangHiCache ready", hicache(metav1.ConditionTrue), wired, nil, 1, v1alpha1.ReasonAllPodsLive},
		{"SGLangHiCache not ready", hicache(metav1.ConditionFalse), wired, nil, 0, v1alpha1.ReasonAwaitingWorkload},
		{"no observation", plain, wired, nil, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stub := &stubIndex{sum: live, err: tc.err}
			r := &CacheBackendReconciler{Index: stub, Inject: inject.Options{KVEventSubscriberImage: "sub:1"}, Now: metav1.Now}
			s := &pass{cb: tc.cb, st: tc.cb.Status.DeepCopy()}
			publishIndex(r, s, tc.wired, gateAvailable(tc.cb))
			if stub.reads != tc.reads {
				t.Fatalf("%d reads of the index, want %d", stub.reads, tc.reads)
			}
			c := meta.FindStatusCondition(s.st.Conditions, v1alpha1.ConditionIndexSynced)
			if tc.reason == "" {
				if c != nil || s.st.IndexParticipation != nil {
					t.Fatalf("without observation: condition %+v, participation %+v", c, s.st.IndexParticipation)
				}
				return
			}
			if c == nil || c.Reason != tc.reason {
				t.Fatalf("condition %+v; want reason %s", c, tc.reason)
			}
			// The participation is published only once the index is read
			// (gate open); while the gate is closed it stays unset.
			if (s.st.IndexParticipation != nil) != (tc.reads > 0) {
				t.Fatalf("participation %+v with %d reads of the index", s.st.IndexParticipation, tc.reads)
			}
		})
	}
}

// TestWiredForIndex guards who is expected in the index: this backend's
// receipt, no kv-events-skipped stamp, not terminating.
func TestWiredForIndex(t *testing.T) {
	t.Parallel()
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cb"}}
	now := metav1.Now()
	pod := func(name string, ann map[string]string, deleting bool) metav1.PartialObjectMetadata {
		p := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Annotations: ann}}
		if deleting {
			p.DeletionTimestamp = &now
		}
		return p
	}
	ours := map[string]string{v1alpha1.AnnotationInjectedBy: "ns/cb"}
	got := wiredForIndex(cb, []metav1.PartialObjectMetadata{
		pod("wired", ours, false),
		pod("other-backend", map[string]string{v1alpha1.AnnotationInjectedBy: "ns/other"}, false),
		pod("unwired", nil, false),
		pod("skipped", map[string]string{v1alpha1.AnnotationInjectedBy: "ns/cb", v1alpha1.AnnotationKVEventsSkipped: "user-kv-events-config"}, false),
		pod("terminating", ours, true),
	})
	if len(got) != 1 || got[0].Name != "wired" || got[0].UID != "uid-wired" {
		t.Fatalf("expected pods %+v, want only wired", got)
	}
}

// publishIndex runs the index's part of a reconcile on s: observe's read
// of the index (gated), evaluate, publish.
func publishIndex(r *CacheBackendReconciler, s *pass, wired []evaluate.IndexPod, available bool) {
	s.seen.index = r.indexFacts(s.cb, wired, available)
	r.readIndex(context.Background(), s.cb, &s.seen.index)
	r.evaluate(s)
	evaluate.Publish(s.st, s.cb.Generation, s.out)
}
