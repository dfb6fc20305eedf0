// Package evaluate decides a CacheBackend's conditions from what a
// reconcile gathered and did, with no client: pure functions, ordered in
// policy chains whose order is the precedence of the reasons. It also holds
// the other pure rules of a reconcile (the server-instance identity).
package evaluate

import (
	"fmt"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/workload"
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

// Health judges a cache-server workload of any kind from its rollout state
// (workload.Rollout): Ready when the workload's controller observed the
// current spec, the rollout is complete and every replica serves.
// A nil w is an absent workload of the default kind.
func Health(w workload.Server) Verdict {
	if w == nil {
		w = workload.For(&v1alpha1.CacheBackend{})
	}
	r := w.Rollout()
	if r == nil {
		return Verdict{Reason: v1alpha1.ReasonRolloutInProgress, Message: "waiting for the cache-server " + w.Kind() + " to be created", Progressing: true}
	}
	h := Verdict{Replicas: r.Desired, ReadyReplicas: r.Ready, Available: r.Available}
	switch {
	case r.ObservedGeneration < r.Generation:
		h.Reason, h.Progressing = v1alpha1.ReasonRolloutInProgress, true
		h.Message = "waiting for the " + w.Kind() + " controller to observe the latest spec"
	case r.Stalled != "":
		h.Reason, h.Degraded, h.Stalled = v1alpha1.ReasonProgressDeadlineExceeded, true, true
		h.Message = r.Stalled
	case r.Rolling:
		h.Reason, h.Progressing = v1alpha1.ReasonRolloutInProgress, true
		h.Message = fmt.Sprintf("rollout in progress: %d of %d replicas updated, %d %s", r.Updated, r.Desired, r.Serving, r.ServingWord)
	case r.Serving < r.Desired && r.Starting:
		h.Reason, h.Progressing = v1alpha1.ReasonRolloutInProgress, true
		h.Message = fmt.Sprintf("%d of %d replicas %s", r.Serving, r.Desired, r.ServingWord)
	case r.Serving < r.Desired:
		h.Reason, h.Degraded = v1alpha1.ReasonReplicasUnavailable, true
		h.Message = fmt.Sprintf("%d of %d replicas %s", r.Serving, r.Desired, r.ServingWord)
	case r.Desired == 0 && w.PerNode():
		// Ready, so that a GPU pool scaled to zero does not hold the
		// engines of a later sync wave (whose pending pods grow it); but
		// say that nothing serves yet: no endpoint until a node has a
		// server.
		h.Ready, h.Reason = true, v1alpha1.ReasonBackendReady
		h.Message = "no node selected for a server yet (spec.remoteStorage.lmCacheServer.pod): no endpoint, and engines are admitted unwired, until a selected node's server is available"
	default:
		h.Ready, h.Reason = true, v1alpha1.ReasonBackendReady
		h.Message = fmt.Sprintf("%d of %d replicas %s", r.Serving, r.Desired, r.ServingWord)
	}
	return h
}
