package evaluate

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// SetConditions writes the conditions that follow from v, computed for
// generation gen. Conditions keep their lastTransitionTime while their
// status does not change.
func SetConditions(st *v1alpha1.CacheBackendStatus, gen int64, v Verdict) {
	st.Replicas, st.ReadyReplicas = v.Replicas, v.ReadyReplicas
	set := func(t string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen,
		})
	}
	set(v1alpha1.ConditionReady, v.Ready, v.Reason, v.Message)
	if v.Progressing {
		set(v1alpha1.ConditionProgressing, true, v.Reason, v.Message)
		set(v1alpha1.ConditionReconciling, true, v.Reason, v.Message)
	} else {
		set(v1alpha1.ConditionProgressing, false, v1alpha1.ReasonStable, "no rollout in progress")
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionReconciling)
	}
	if v.Degraded {
		set(v1alpha1.ConditionDegraded, true, v.Reason, v.Message)
	} else {
		set(v1alpha1.ConditionDegraded, false, v1alpha1.ReasonStable, "not degraded")
	}
	if v.Stalled {
		set(v1alpha1.ConditionStalled, true, v.Reason, v.Message)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionStalled)
	}
	if v.Degraded && !v.Stalled && !v.Progressing {
		// Replicas are being replaced by the workload's controller: kstatus
		// should read the backend as in progress, not current.
		set(v1alpha1.ConditionReconciling, true, v.Reason, v.Message)
	}
}

// SetNotEvaluated records a reconcile that stopped, with reason and msg,
// before it evaluated generation gen: Reconciling=True says so and
// observedGeneration is left as it was. Ready keeps its verdict only when
// that verdict was computed for gen (the seed's rule for engine-local
// backends: a failed pod list keeps the published verdict); otherwise
// Ready is Unknown, so the status never claims more than was evaluated.
func SetNotEvaluated(st *v1alpha1.CacheBackendStatus, gen int64, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReconciling, Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: gen,
	})
	if ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); ready != nil && ready.ObservedGeneration == gen && st.ObservedGeneration == gen {
		return
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: metav1.ConditionUnknown, Reason: reason, Message: msg, ObservedGeneration: gen,
	})
}
