// Package evaluate decides a CacheBackend's conditions from what a
// reconcile gathered and did, with no client: pure functions, ordered in
// policy chains whose order is the precedence of the reasons. It also holds
// the other pure rules of a reconcile (the server-instance identity).
package evaluate

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Verdict is the outcome of an evaluation: the reason and message of the
// Ready condition, and the flags the other conditions follow.
type Verdict struct {
	Ready       bool
	Reason      string
	Message     string
	Progressing bool
	Degraded    bool
	Stalled     bool
	// Available means at least one replica serves, so the endpoint is
	// published (also during a rollout that keeps replicas available).
	Available     bool
	Replicas      int32
	ReadyReplicas int32
}

// DeploymentHealth judges a cache-server Deployment as observed in the
// cache; dep is nil when it does not exist (yet).
func DeploymentHealth(dep *appsv1.Deployment) Verdict {
	if dep == nil {
		return Verdict{Reason: v1alpha1.ReasonRolloutInProgress, Message: "waiting for the cache-server Deployment to be created", Progressing: true}
	}
	desired := int32(1)
	if dep.Spec.Replicas != nil {
		desired = *dep.Spec.Replicas
	}
	st := dep.Status
	h := Verdict{
		Replicas:      desired,
		ReadyReplicas: st.ReadyReplicas,
		Available:     st.AvailableReplicas > 0 && condition(dep, appsv1.DeploymentAvailable) == corev1.ConditionTrue,
	}
	prog := findCondition(dep, appsv1.DeploymentProgressing)
	switch {
	case st.ObservedGeneration < dep.Generation:
		h.Reason, h.Progressing = v1alpha1.ReasonRolloutInProgress, true
		h.Message = "waiting for the Deployment controller to observe the latest spec"
	case prog != nil && prog.Status == corev1.ConditionFalse && prog.Reason == "ProgressDeadlineExceeded":
		h.Reason, h.Degraded, h.Stalled = v1alpha1.ReasonProgressDeadlineExceeded, true, true
		h.Message = fmt.Sprintf("Deployment rollout stopped progressing: %s", prog.Message)
	case st.UpdatedReplicas < desired || st.Replicas > st.UpdatedReplicas || (prog != nil && prog.Reason != "NewReplicaSetAvailable"):
		h.Reason, h.Progressing = v1alpha1.ReasonRolloutInProgress, true
		h.Message = fmt.Sprintf("rollout in progress: %d of %d replicas updated, %d available", st.UpdatedReplicas, desired, st.AvailableReplicas)
	case st.AvailableReplicas < desired:
		h.Reason, h.Degraded = v1alpha1.ReasonReplicasUnavailable, true
		h.Message = fmt.Sprintf("%d of %d replicas available", st.AvailableReplicas, desired)
	default:
		h.Ready = true
		h.Reason = v1alpha1.ReasonBackendReady
		h.Message = fmt.Sprintf("%d of %d replicas available", st.AvailableReplicas, desired)
	}
	return h
}

func findCondition(dep *appsv1.Deployment, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range dep.Status.Conditions {
		if dep.Status.Conditions[i].Type == t {
			return &dep.Status.Conditions[i]
		}
	}
	return nil
}

func condition(dep *appsv1.Deployment, t appsv1.DeploymentConditionType) corev1.ConditionStatus {
	if c := findCondition(dep, t); c != nil {
		return c.Status
	}
	return corev1.ConditionUnknown
}

// StatefulSetHealth judges a cache-server StatefulSet: Ready when the
// controller observed the current spec and every replica is updated and
// ready.
func StatefulSetHealth(sts *appsv1.StatefulSet) Verdict {
	if sts == nil {
		return Verdict{Reason: v1alpha1.ReasonRolloutInProgress, Message: "waiting for the cache-server StatefulSet to be created", Progressing: true}
	}
	desired := int32(1)
	if sts.Spec.Replicas != nil {
		desired = *sts.Spec.Replicas
	}
	st := sts.Status
	h := Verdict{
		Replicas:      desired,
		ReadyReplicas: st.ReadyReplicas,
		Available:     st.AvailableReplicas > 0 || st.ReadyReplicas > 0,
	}
	switch {
	case st.ObservedGeneration < sts.Generation:
		h.Reason, h.Progressing = v1alpha1.ReasonRolloutInProgress, true
		h.Message = "waiting for the StatefulSet controller to observe the latest spec"
	case st.UpdatedReplicas < desired || (st.UpdateRevision != "" && st.CurrentRevision != st.UpdateRevision):
		h.Reason, h.Progressing = v1alpha1.ReasonRolloutInProgress, true
		h.Message = fmt.Sprintf("rollout in progress: %d of %d replicas updated, %d ready", st.UpdatedReplicas, desired, st.ReadyReplicas)
	case st.ReadyReplicas < desired:
		// A StatefulSet creates its pods one by one: until every replica
		// was ready once, missing ones are still rolling out.
		if st.Replicas < desired || st.CurrentReplicas < desired {
			h.Reason, h.Progressing = v1alpha1.ReasonRolloutInProgress, true
		} else {
			h.Reason, h.Degraded = v1alpha1.ReasonReplicasUnavailable, true
		}
		h.Message = fmt.Sprintf("%d of %d replicas ready", st.ReadyReplicas, desired)
	default:
		h.Ready = true
		h.Reason = v1alpha1.ReasonBackendReady
		h.Message = fmt.Sprintf("%d of %d replicas ready", st.ReadyReplicas, desired)
	}
	return h
}
