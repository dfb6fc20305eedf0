package evaluate

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
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

// TestPublishWithFailedRestarts: engine restarts that failed keep the
// server identity unrecorded (so they are retried) and Reconciling True
// with EngineRestartsRetrying and the error, whatever the verdict; the
// rest of the status is published as evaluated.
func TestPublishWithFailedRestarts(t *testing.T) {
	ready := Verdict{Ready: true, Reason: v1alpha1.ReasonBackendReady, Message: "3 of 3"}
	rolling := Verdict{Progressing: true, Reason: v1alpha1.ReasonRolloutInProgress, Message: "2 of 3"}
	refused := errors.New("evicting engine pod llm/engine-a on node gpu-a: denied by an admission policy")
	cases := []struct {
		name       string
		o          Outcome
		instance   string
		reconciles bool
		reason     string
	}{
		{"restarts done: the identity is recorded", Outcome{Verdict: ready, ServerInstance: "new", Record: true}, "new", false, ""},
		{"restarts failed: retried, the identity stays", Outcome{Verdict: ready, ServerInstance: "new", Record: true, RollErr: refused}, "old", true, v1alpha1.ReasonEngineRestartsRetrying},
		{"restarts failed while rolling out: the restarts' reason", Outcome{Verdict: rolling, ServerInstance: "new", Record: true, RollErr: refused}, "old", true, v1alpha1.ReasonEngineRestartsRetrying},
		{"rolling out, no restart failed", Outcome{Verdict: rolling, ServerInstance: "new"}, "old", true, v1alpha1.ReasonRolloutInProgress},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := &v1alpha1.CacheBackendStatus{ObservedGeneration: 1, ObservedServerInstance: "old"}
			tc.o.Endpoint = "tcp://cache.llm.svc:65432"
			Publish(st, 2, tc.o)
			assert.Equal(t, int64(2), st.ObservedGeneration, "evaluated: observedGeneration follows")
			assert.Equal(t, tc.o.Endpoint, st.Endpoint)
			assert.Equal(t, tc.o.Verdict.Ready, meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionReady))
			assert.Equal(t, tc.instance, st.ObservedServerInstance)
			rec := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReconciling)
			if !tc.reconciles {
				assert.Nil(t, rec)
				return
			}
			if assert.NotNil(t, rec) {
				assert.Equal(t, metav1.ConditionTrue, rec.Status)
				assert.Equal(t, tc.reason, rec.Reason)
				if tc.o.RollErr != nil {
					assert.Equal(t, refused.Error(), rec.Message)
				}
			}
		})
	}
}

// TestReconcilingKeepsItsTransitionWhileRestartsFail: retries of failed
// engine restarts publish Reconciling=True again without moving its
// lastTransitionTime, also when the verdict alone would remove it; it is
// removed once the restarts succeed.
func TestReconcilingKeepsItsTransitionWhileRestartsFail(t *testing.T) {
	ready := Verdict{Ready: true, Reason: v1alpha1.ReasonBackendReady, Message: "3 of 3"}
	rolling := Verdict{Progressing: true, Reason: v1alpha1.ReasonRolloutInProgress, Message: "2 of 3"}
	refused := errors.New("evicting engine pod llm/engine-a on node gpu-a: denied by an admission policy")
	st := &v1alpha1.CacheBackendStatus{}
	Publish(st, 1, Outcome{Verdict: rolling})
	first := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReconciling)
	if !assert.NotNil(t, first) {
		return
	}
	since := metav1.NewTime(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	first.LastTransitionTime = since
	for _, v := range []Verdict{rolling, ready, ready} {
		Publish(st, 1, Outcome{Verdict: v, RollErr: refused})
		rec := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReconciling)
		if assert.NotNil(t, rec) {
			assert.Equal(t, v1alpha1.ReasonEngineRestartsRetrying, rec.Reason)
			assert.Equal(t, since, rec.LastTransitionTime, "True all along: the transition stays")
		}
	}
	Publish(st, 1, Outcome{Verdict: ready})
	assert.Nil(t, meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReconciling), "removed once the restarts succeed")
}

// TestStoragePersistent: a backend with spec.storage.pvc says, for as long
// as it holds, that its server never writes the claim; without the claim
// the condition is absent (and removed when the claim goes).
func TestStoragePersistent(t *testing.T) {
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Name: "cache"}, Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache}}
	assert.Nil(t, StorageOf(cb))

	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("200Gi")}}
	c := StorageOf(cb)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, v1alpha1.ReasonServerKeepsKVInMemory, c.Reason)
	assert.Contains(t, c.Message, "the claim cache-data is mounted at /data but never written")

	cb.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet
	assert.Contains(t, StorageOf(cb).Message, "each replica's claim (cache-data-cache-<n>)")

	st := &v1alpha1.CacheBackendStatus{}
	ready := Verdict{Ready: true, Reason: v1alpha1.ReasonBackendReady, Message: "1 of 1"}
	Publish(st, 1, Outcome{Verdict: ready, Storage: StorageOf(cb)})
	got := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStoragePersistent)
	require.NotNil(t, got)
	assert.Equal(t, v1alpha1.ReasonServerKeepsKVInMemory, got.Reason)
	assert.Equal(t, int64(1), got.ObservedGeneration)
	assert.True(t, meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionReady), "a claim nobody writes does not make the server unready")

	Publish(st, 2, Outcome{Verdict: ready})
	assert.Nil(t, meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStoragePersistent), "removed with the claim")
}
