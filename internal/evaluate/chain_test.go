package evaluate

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestServerChain: the order of the chain is the precedence of the
// reasons: a name conflict, a failed apply, then held storage, then the workload's own
// state, then the functional probe.
func TestServerChain(t *testing.T) {
	ready := deployment(dep(1, 1, 1, 1, 1, availableTrue, progressDone))
	rolling := deployment(dep(2, 1, 1, 1, 1, availableTrue, progressDone))
	probeErr := errors.New("connection refused")
	cases := []struct {
		name   string
		f      Facts
		reason string
		ready  bool
	}{
		{"ready", Facts{Workload: ready}, v1alpha1.ReasonBackendReady, true},
		{"ready and the probe answers", Facts{Workload: ready, Probed: true}, v1alpha1.ReasonBackendReady, true},
		{"the probe fails", Facts{Workload: ready, Probed: true, ProbeErr: probeErr}, v1alpha1.ReasonFunctionalProbeFailed, false},
		{"the workload beats the probe", Facts{Workload: rolling, Probed: true, ProbeErr: probeErr}, v1alpha1.ReasonRolloutInProgress, false},
		{"held storage beats the workload", Facts{Workload: ready, StorageHold: "storage cannot change"}, v1alpha1.ReasonImmutableStatefulSetStorage, false},
		{"a failed apply beats the rest", Facts{Workload: ready, StorageHold: "held", ApplyErr: errors.New("refused")}, v1alpha1.ReasonApplyFailed, false},
		{"a name conflict beats everything", Facts{Workload: ready, StorageHold: "held", ApplyErr: errors.New("refused"), NameConflict: "Service cache exists"}, v1alpha1.ReasonNameConflict, false},
		{"no workload yet", Facts{}, v1alpha1.ReasonRolloutInProgress, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := Server(tc.f)
			assert.Equal(t, tc.reason, v.Reason, v.Message)
			assert.Equal(t, tc.ready, v.Ready)
		})
	}
	v := Server(Facts{Workload: ready, StorageNote: "size 1Gi cannot be applied"})
	assert.Contains(t, v.Message, "size 1Gi cannot be applied", "a held claim change is said in the Ready message")
	assert.True(t, v.Ready)
}

// TestSetNotEvaluated: a reconcile that stopped keeps observedGeneration,
// says Reconciling=True with its reason, and keeps Ready only when Ready
// was computed for the current generation.
func TestSetNotEvaluated(t *testing.T) {
	evaluated := func(gen int64) *v1alpha1.CacheBackendStatus {
		st := &v1alpha1.CacheBackendStatus{ObservedGeneration: gen}
		Publish(st, gen, Outcome{Verdict: Verdict{Ready: true, Reason: v1alpha1.ReasonBackendReady, Message: "1 of 1"}})
		return st
	}
	cases := []struct {
		name      string
		st        *v1alpha1.CacheBackendStatus
		gen       int64
		wantReady metav1.ConditionStatus
		reason    string
		observed  int64
	}{
		{"never evaluated", &v1alpha1.CacheBackendStatus{}, 1, metav1.ConditionUnknown, v1alpha1.ReasonObservationFailed, 0},
		{"evaluated for this generation: the verdict stands", evaluated(2), 2, metav1.ConditionTrue, v1alpha1.ReasonBackendReady, 2},
		{"evaluated for an older generation: Unknown", evaluated(1), 2, metav1.ConditionUnknown, v1alpha1.ReasonObservationFailed, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			SetNotEvaluated(tc.st, tc.gen, v1alpha1.ReasonObservationFailed, "listing engine pods: refused")
			assert.Equal(t, tc.observed, tc.st.ObservedGeneration, "observedGeneration is left alone")
			ready := meta.FindStatusCondition(tc.st.Conditions, v1alpha1.ConditionReady)
			assert.Equal(t, tc.wantReady, ready.Status)
			assert.Equal(t, tc.reason, ready.Reason)
			rec := meta.FindStatusCondition(tc.st.Conditions, v1alpha1.ConditionReconciling)
			assert.Equal(t, metav1.ConditionTrue, rec.Status)
			assert.Equal(t, v1alpha1.ReasonObservationFailed, rec.Reason)
		})
	}
}
