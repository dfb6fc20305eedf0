package controller

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/workload"
)

// healPoll is how soon a backend with engines admitted before its endpoint
// looks again while the endpoint settles.
const healPoll = 2 * time.Second

// wire publishes the wiring report (status.wiredEnginePods,
// status.unwiredEnginePods, condition EnginesWired, event EnginesUnwired)
// and heals: for an LMCache backend with engineRestartPolicy
// OnServerChange, once the endpoint has settled, the Deployments and
// StatefulSets of pods admitted before it existed are rolled once per pod
// template (apply.Roll with the current server instance's value, the
// cascade's mechanism: a workload rolled by either is not rolled again for
// the same instance). It returns when to look again.
func (r *CacheBackendReconciler) wire(ctx context.Context, s *pass, p plan.Plan, f evaluate.Facts, v evaluate.Verdict, srv serverObservation, obs observation) (time.Duration, error) {
	if !obs.matchedKnown {
		return 0, nil
	}
	cb := s.cb
	keys := obs.keys
	if obs.keysErr != nil {
		keys = nil
	}
	w := evaluate.TallyWiring(cb, obs.engines, keys, r.endpointSince(cb))
	facts := evaluate.WiringFacts{
		Wiring: w, Policy: cb.Spec.EngineRestartPolicy, EngineLoc: p.EngineLocal,
		Endpoint:   v.Available && !p.EngineLocal,
		EarlyOwner: workloadNames(w.Early), LateOwner: workloadNames(w.Late),
	}
	var requeue time.Duration
	heal := !p.EngineLocal && cb.Spec.EngineRestartPolicy != v1alpha1.EngineRestartNever &&
		len(w.Early) > 0 && !w.KeysUnavailable && v.Ready && f.ApplyErr == nil && srv.change.Instance != ""
	if heal {
		rolling, after, err := r.heal(ctx, s, w, srv.change.Instance)
		if err != nil {
			return 0, err
		}
		facts.Rolling, requeue = rolling, after
	}
	rep := evaluate.ReportWiring(facts)
	s.st.WiredEnginePods, s.st.UnwiredEnginePods = w.Wired, w.Unwired()
	meta.SetStatusCondition(&s.st.Conditions, metav1.Condition{Type: v1alpha1.ConditionEnginesWired, Status: rep.Status,
		Reason: rep.Reason, Message: rep.Message, ObservedGeneration: cb.Generation})
	r.reportUnwired(s, rep)
	return requeue, nil
}

// heal rolls the workloads of the pods admitted before the endpoint, once
// the live status shows it settled. rolling is true when every such
// workload has been rolled for the current server instance.
func (r *CacheBackendReconciler) heal(ctx context.Context, s *pass, w evaluate.Wiring, inst string) (bool, time.Duration, error) {
	cb := s.cb
	live := &v1alpha1.CacheBackend{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cb), live); err != nil || !r.endpointSettled(cb, live) {
		return false, healPoll, nil // the webhook may not see the endpoint yet
	}
	set := map[apply.Workload]bool{}
	for i := range w.Early {
		wl, ok, err := apply.EngineWorkload(ctx, r.APIReader, &w.Early[i])
		if err != nil {
			return false, 0, err
		}
		if ok {
			set[wl] = true
		}
	}
	ws := make([]apply.Workload, 0, len(set))
	for wl := range set {
		ws = append(ws, wl)
	}
	rolled, carrying, err := r.Applier.Roll(ctx, r.APIReader, cb.Namespace, ws, apply.InstanceHash(inst))
	if len(rolled) > 0 {
		Heals.WithLabelValues(cb.Namespace, cb.Name).Add(float64(len(rolled)))
		log.FromContext(ctx).Info("rolled engines admitted before the endpoint existed", "workloads", joinWorkloads(rolled))
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, v1alpha1.EventEnginesRestartedForWiring, "Rollout",
			"engine pods were admitted before the endpoint existed: rolled %s once so the webhook wires their new pods", joinWorkloads(rolled))
	}
	if err != nil {
		return false, 0, err
	}
	return len(ws) > 0 && len(rolled)+len(carrying) == len(ws), 0, nil
}

// reportUnwired records EnginesUnwired when EnginesWired turns False or
// changes its reason (not for the rolling that healing itself started).
func (r *CacheBackendReconciler) reportUnwired(s *pass, rep evaluate.WiringReport) {
	key := client.ObjectKeyFromObject(s.cb)
	if rep.Status != metav1.ConditionFalse {
		if rep.Status == metav1.ConditionTrue {
			r.unwiredReported.Delete(key)
		}
		return
	}
	if rep.Reason == v1alpha1.ReasonEnginesRollingForWiring {
		return
	}
	mark := string(s.cb.UID) + "/" + rep.Reason
	if prev, ok := r.unwiredReported.Load(key); ok && prev == mark {
		return // reported by this process; the cache has not caught up yet
	}
	r.unwiredReported.Store(key, mark)
	if c := meta.FindStatusCondition(s.cb.Status.Conditions, v1alpha1.ConditionEnginesWired); c != nil && c.Status == metav1.ConditionFalse && c.Reason == rep.Reason {
		return // published before: reported already (by this or an earlier process)
	}
	r.Recorder.Eventf(s.cb, nil, corev1.EventTypeWarning, v1alpha1.EventEnginesUnwired, "Observe", "%s", rep.Message)
}

// endpointSince is when the webhook could first inject cb's published
// endpoint: its Ready transition plus the settle time; nil while cb
// publishes no endpoint (pods admitted now are admitted before it).
func (r *CacheBackendReconciler) endpointSince(cb *v1alpha1.CacheBackend) *time.Time {
	ready := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
	if cb.Status.Endpoint == "" || ready == nil || ready.Status != metav1.ConditionTrue {
		return nil
	}
	t := ready.LastTransitionTime.Add(endpointSettleTime)
	return &t
}

// workloadNames names the workload of each pod from its metadata alone, for
// reports: Deployment/<name> for a pod of a ReplicaSet named
// <name>-<pod-template-hash>, StatefulSet/<name>, else Pod/<name>. Rolls
// resolve workloads through the API instead (apply.EngineWorkload); both
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

func joinWorkloads(ws []apply.Workload) string {
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
