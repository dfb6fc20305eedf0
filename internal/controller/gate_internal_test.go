package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/test/testutil"
)

// TestGateCountsOnlyPodsWithTheSidecar guards lifecycle step 4: a wired
// pod admitted before spec.observation.modelID (or the manager's
// --kvevent-subscriber-image) was set carries neither the
// kvevent-subscriber sidecar nor a kv-events-skipped stamp. It must not
// count as a pod of the index: with only such pods the gate stays closed
// (AwaitingWorkload, no indexParticipation), instead of publishing a
// participation of Missing pods no sidecar will ever fill.
func TestGateCountsOnlyPodsWithTheSidecar(t *testing.T) {
	t.Parallel()
	cb := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cb", UID: "uid-cb", Generation: 1},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "vllm"}},
			Observation:    &v1alpha1.Observation{ModelID: "m"}},
	}
	pod := func(name string, sidecar bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
			Labels:      map[string]string{"app": "vllm"},
			Annotations: map[string]string{v1alpha1.AnnotationInjectedBy: "ns/cb"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}}}
		if sidecar {
			p.Spec.InitContainers = []corev1.Container{{Name: inject.SubscriberContainer, Image: "sub:1"}}
		}
		return p
	}
	live := &pb.ParticipationSummary{Pods: 1, LivePods: 1, PodList: []*pb.PodParticipation{{Name: "streaming", Uid: "uid-streaming", State: pb.PodState_POD_STATE_LIVE}}}
	for _, tc := range []struct {
		name     string
		pods     []client.Object
		expected []string
		reason   string
	}{
		{"only pods admitted before modelID", []client.Object{pod("early", false)}, nil, v1alpha1.ReasonAwaitingWorkload},
		{"one pod with the sidecar", []client.Object{pod("early", false), pod("streaming", true)}, []string{"streaming"}, v1alpha1.ReasonAllPodsLive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(testutil.Scheme()).WithObjects(append([]client.Object{cb.DeepCopy()}, tc.pods...)...).Build()
			stub := &stubIndex{sum: live}
			r := &CacheBackendReconciler{Client: c, APIReader: c, Index: stub, Inject: inject.Options{KVEventSubscriberImage: "sub:1"}, Now: metav1.Now}
			s := &pass{cb: cb, st: cb.Status.DeepCopy()}
			if err := r.gather(context.Background(), s); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range s.obs.wired {
				names = append(names, p.Name)
			}
			if len(names) != len(tc.expected) || (len(names) > 0 && names[0] != tc.expected[0]) {
				t.Fatalf("pods expected in the index %v, want %v", names, tc.expected)
			}
			publishIndex(r, s, s.obs.wired, true)
			c0 := meta.FindStatusCondition(s.st.Conditions, v1alpha1.ConditionIndexSynced)
			if c0 == nil || c0.Reason != tc.reason {
				t.Fatalf("IndexSynced %+v, want reason %s", c0, tc.reason)
			}
			if (s.st.IndexParticipation != nil) != (len(tc.expected) > 0) {
				t.Fatalf("indexParticipation %+v with %d pod(s) carrying the sidecar", s.st.IndexParticipation, len(tc.expected))
			}
		})
	}
}
