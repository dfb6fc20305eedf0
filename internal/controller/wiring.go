package controller

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/rollout"
	"github.com/inferencecache/operator/internal/workload"
)

// recordRolls counts, logs and records the engine rolls written: the
// restart cascade (EnginesRestarted) and the heal of engines admitted
// before the endpoint existed (EnginesRestartedForWiring).
func (r *CacheBackendReconciler) recordRolls(ctx context.Context, cb *v1alpha1.CacheBackend, done rollout.RollPlan) {
	if ws := done.Workloads(rollout.CauseServerChange); len(ws) > 0 {
		Cascades.WithLabelValues(cb.Namespace, cb.Name).Add(float64(len(ws)))
		log.FromContext(ctx).Info("rolled engines after a cache-server change", "workloads", joinWorkloads(ws))
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, v1alpha1.EventEnginesRestarted, "Rollout",
			"cache server replaced or restarted: rolled engine workload(s) %s so they reconnect", joinWorkloads(ws))
	}
	if len(done.Evictions) > 0 {
		Evictions.WithLabelValues(cb.Namespace, cb.Name).Add(float64(len(done.Evictions)))
		pods := podsByNode(done.Evictions)
		log.FromContext(ctx).Info("evicted engine pods after their node's cache server changed", "pods", pods)
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, v1alpha1.EventEnginesRestarted, "Evict",
			"node-local cache server replaced or restarted: evicted the engine pods wired to it so they reconnect (%s)", pods)
	}
	if ws := done.Workloads(rollout.CauseAdmittedBeforeEndpoint); len(ws) > 0 {
		Heals.WithLabelValues(cb.Namespace, cb.Name).Add(float64(len(ws)))
		log.FromContext(ctx).Info("rolled engines admitted before the endpoint existed", "workloads", joinWorkloads(ws))
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, v1alpha1.EventEnginesRestartedForWiring, "Rollout",
			"engine pods were admitted before the endpoint existed: rolled %s once so the webhook wires their new pods", joinWorkloads(ws))
	}
}

// recordForbidden counts, logs and records the evictions of the per-node
// cascade that the operator may not make (an install without the
// engine-eviction grant): the pods to restart by hand. The change is not
// retried (no retry would be allowed), and the memo keeps a reconcile that
// reads a stale status from reporting the same pods again.
func (r *CacheBackendReconciler) recordForbidden(ctx context.Context, cb *v1alpha1.CacheBackend, forbidden []rollout.Eviction) {
	if len(forbidden) == 0 {
		return
	}
	EvictionsForbidden.WithLabelValues(cb.Namespace, cb.Name).Add(float64(len(forbidden)))
	pods := podsByNode(forbidden)
	log.FromContext(ctx).Error(nil, "not allowed to evict the engine pods of a node whose cache server changed; restart them by hand", "pods", pods,
		"grant", "ClusterRole "+EngineEvictionClusterRole)
	r.Recorder.Eventf(cb, nil, corev1.EventTypeWarning, v1alpha1.EventEngineEvictionForbidden, "Evict",
		"node-local cache server replaced or restarted, and the operator may not evict pods (no pods/eviction create: ClusterRole %s not bound to it): restart these engine pods by hand so they reconnect (%s)",
		EngineEvictionClusterRole, pods)
}

// EngineEvictionClusterRole is the ClusterRole that grants the operator
// pods/eviction create (kustomize/base/rbac/engine_eviction.yaml).
const EngineEvictionClusterRole = "inferencecache-operator-engine-eviction"

// podsByNode lists evictions as "node X: pod, pod; node Y: pod", nodes in
// their first order.
func podsByNode(evictions []rollout.Eviction) string {
	byNode := map[string][]string{}
	var nodes []string
	for _, e := range evictions {
		if _, ok := byNode[e.Node]; !ok {
			nodes = append(nodes, e.Node)
		}
		byNode[e.Node] = append(byNode[e.Node], e.Pod)
	}
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		parts[i] = "node " + n + ": " + strings.Join(byNode[n], ", ")
	}
	return strings.Join(parts, "; ")
}

// reportUnwired records EnginesUnwired when EnginesWired turns False or
// changes its reason (not for the rolling that healing itself started).
func (r *CacheBackendReconciler) reportUnwired(s *pass) {
	rep := s.out.Wiring
	if rep.Status != metav1.ConditionFalse {
		if rep.Status == metav1.ConditionTrue {
			r.memo.update(s.cb, func(e *memoEntry) { e.unwired = "" })
		}
		return
	}
	if rep.Reason == v1alpha1.ReasonEnginesRollingForWiring || r.memo.get(s.cb).unwired == rep.Reason {
		return // reported by this process; the cache has not caught up yet
	}
	r.memo.update(s.cb, func(e *memoEntry) { e.unwired = rep.Reason })
	if c := meta.FindStatusCondition(s.cb.Status.Conditions, v1alpha1.ConditionEnginesWired); c != nil && c.Status == metav1.ConditionFalse && c.Reason == rep.Reason {
		return // published before: reported already (by this or an earlier process)
	}
	r.Recorder.Eventf(s.cb, nil, corev1.EventTypeWarning, v1alpha1.EventEnginesUnwired, "Observe", "%s", rep.Message)
}

// workloadNames names the workload of each pod from its metadata alone, for
// reports: Deployment/<name> for a pod of a ReplicaSet named
// <name>-<pod-template-hash>, StatefulSet/<name>, else Pod/<name>. Rolls
// resolve workloads through the API instead (rollout.EarlyWorkloads); both
// ask internal/workload.
func workloadNames(pods []metav1.PartialObjectMetadata) []string {
	out := make([]string, 0, len(pods))
	for i := range pods {
		p := &pods[i]
		name := "Pod/" + p.Name
		if kind, n, ok := workload.NameOf(p); ok {
			name = kind + "/" + n
		}
		out = append(out, name)
	}
	return out
}

func joinWorkloads(ws []rollout.Workload) string {
	names := make([]string, len(ws))
	for i, w := range ws {
		names[i] = w.String()
	}
	return strings.Join(names, ", ")
}

// sooner is the earlier of two requeue delays, zero meaning none.
func sooner(a, b time.Duration) time.Duration {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}
