// Package controller holds the reconcilers. A CacheBackend reconcile is a
// pipeline of values: gather and observe (every read of the cluster,
// gather.go) → plan (internal/plan, pure) → execute and roll
// (internal/apply, the only writer of children and engines) → evaluate
// (internal/evaluate, pure policy chains) → publish (the status). The
// CLI's render and diff build the same plans.
package controller

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/kvindex/indexclient"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/rollout"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/workload"
)

// CacheBackendReconciler reconciles CacheBackends: render, apply, status.
type CacheBackendReconciler struct {
	Client   client.Client
	Applier  *apply.Applier
	Recorder events.EventRecorder
	// APIReader lists engine pods of engine-local backends live, so that no
	// cache of full pod objects is needed.
	APIReader client.Reader
	// Servers reads the operator's own server-side objects: cache-server
	// pods and ReplicaSets and the claims, from a cache that holds only
	// objects labelled with a CacheBackend (ServerCache); APIReader when nil.
	Servers client.Reader
	// ServerEvents, when set, is the source of cache-server pod events
	// (WatchServerPods on the ServerCache): a container restart or a
	// replacement wakes its backend's reconcile, with no periodic poll.
	ServerEvents source.Source
	// Keys verifies injection receipts.
	Keys *receipt.KeyRing
	// Inject are the webhook's options, to replay injections.
	Inject inject.Options
	// Prober, when set, checks that the server answers before Ready=True.
	Prober *Prober
	// Now returns the current time; tests may replace it.
	Now func() metav1.Time
	// Index reads the KV-block index's participation of observed backends
	// (nil: IndexSynced says IndexUnavailable once the gate opens).
	Index IndexReader
	// IndexPoll is how often observed backends' participation is re-read
	// between reconciles (indexclient.DefaultPoll when zero).
	IndexPoll time.Duration
	// EnginePodSettle is how long an engine pod's event waits before it
	// wakes the CacheBackends that select the pod (DefaultEnginePodSettle
	// when zero; negative: at once).
	EnginePodSettle time.Duration

	// memo is what this process wrote or reported that its cache may not
	// show yet, and which wired pods carry the sidecar.
	memo memo
}

// RBAC markers: rbac.go.

// SetupWithManager registers the reconciler. Engine pods are watched as
// metadata only, and only label, creation, deletion and termination changes
// wake a reconcile.
func (r *CacheBackendReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = metav1.Now
	}
	poller := &indexclient.Poller{Period: r.IndexPoll, Backends: r.listBackends, Changed: r.indexChanged, Events: make(chan event.GenericEvent)}
	if err := mgr.Add(poller); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.CacheBackend{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, endpointChanged()))).
		WatchesRawSource(source.Channel(poller.Events, &handler.EnqueueRequestForObject{})).
		Owns(&corev1.Service{}).
		Owns(&autoscalingv2.HorizontalPodAutoscaler{}).
		WatchesMetadata(&corev1.Pod{}, r.podEvents(), builder.WithPredicates(podMembershipChanged()))
	for _, k := range workload.Kinds() {
		b = b.Owns(k.New())
	}
	if r.ServerEvents != nil {
		b = b.WatchesRawSource(r.ServerEvents)
	}
	return b.Named("cachebackend").Complete(r)
}

// servers is the reader of cache-server pods, ReplicaSets and claims.
func (r *CacheBackendReconciler) servers() client.Reader {
	if r.Servers != nil {
		return r.Servers
	}
	return r.APIReader
}

// endpointChanged passes a change of status.endpoint, which the operator
// alone should write: whoever else can write cachebackends/status may point
// it elsewhere, and the reconcile restores it at once (the webhook never
// injects it, and admits pods unwired while it differs from the spec's).
func endpointChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*v1alpha1.CacheBackend)
			n, ok2 := e.ObjectNew.(*v1alpha1.CacheBackend)
			return ok1 && ok2 && o.Status.Endpoint != n.Status.Endpoint
		},
	}
}

// podMembershipChanged passes the pod events that can change a selector's
// match count: create, delete, a label change, or the start of termination.
func podMembershipChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !equality.Semantic.DeepEqual(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) ||
				e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// DefaultEnginePodSettle is how long an engine pod's event waits before it
// wakes the CacheBackends that select the pod. Events for the same backend
// within that time wake it once: a Deployment scaling out by hundreds of
// pods costs each backend one reconcile (and at most one status write) per
// settle, not one per pod, and leaves the API server to the pods' own
// creation. A cache-server pod's event wakes its backend at once (the
// restart cascade follows it).
const DefaultEnginePodSettle = time.Second

// podEvents enqueues the CacheBackends a pod's event concerns (see
// DefaultEnginePodSettle).
func (r *CacheBackendReconciler) podEvents() handler.EventHandler {
	settle := cmp.Or(r.EnginePodSettle, DefaultEnginePodSettle)
	enqueue := func(ctx context.Context, pod client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		server, engines := r.backendsForPod(ctx, pod)
		if server != nil {
			q.Add(*server)
		}
		for _, req := range engines {
			if settle > 0 {
				q.AddAfter(req, settle)
			} else {
				q.Add(req)
			}
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) {
				enqueue(ctx, e.ObjectOld, q) // the backends the pod leaves
			}
			enqueue(ctx, e.ObjectNew, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q)
		},
	}
}

// backendsForPod returns the backend of a cache-server pod (nil for any
// other pod) and the backends whose engineSelector matches the pod.
func (r *CacheBackendReconciler) backendsForPod(ctx context.Context, pod client.Object) (server *reconcile.Request, engines []reconcile.Request) {
	if owner := pod.GetLabels()[render.LabelCacheBackend]; owner != "" {
		// A cache-server pod: its replacement matters to its backend.
		server = &reconcile.Request{NamespacedName: client.ObjectKey{Namespace: pod.GetNamespace(), Name: owner}}
	}
	// Read-only: the cache's objects are not copied (every pod event of
	// the cluster comes here, and a namespace may hold many backends).
	var list v1alpha1.CacheBackendList
	if err := r.Client.List(ctx, &list, client.InNamespace(pod.GetNamespace()), client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "listing CacheBackends for a pod event", "pod", client.ObjectKeyFromObject(pod))
		return server, nil
	}
	for i := range list.Items {
		if list.Items[i].Spec.EngineSelector.Matches(pod.GetLabels()) {
			engines = append(engines, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return server, engines
}

// Reconcile is the pipeline of one CacheBackend: gather → plan → execute
// → observe → evaluate → roll → publish. Every read of the cluster is in
// gather (before the plan) or observe (after the apply); plan and
// evaluate are pure; apply writes the children and the engine rolls; only
// publish writes the status. A reconcile that stops before it evaluates
// says so (Reconciling=True with a reason) and leaves observedGeneration
// alone.
func (r *CacheBackendReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	s, err := r.begin(ctx, req.NamespacedName)
	if s == nil {
		return ctrl.Result{}, err
	}
	defer r.forgetProbeUnlessProbed(s)
	if err := r.gather(ctx, s); err != nil {
		return r.stop(ctx, s, v1alpha1.ReasonObservationFailed, err)
	}
	if s.plan, err = plan.Build(s.obs.plan); err != nil {
		return r.stop(ctx, s, v1alpha1.ReasonPlanFailed, err)
	}
	r.execute(ctx, s)
	if err := r.observe(ctx, s); err != nil {
		return r.stop(ctx, s, v1alpha1.ReasonProgressingWithRetry, err)
	}
	r.planRolls(s)
	s.rollErr = r.roll(ctx, s)
	r.evaluate(s)
	return r.publish(ctx, s)
}

// pass is one reconcile: what each phase read or decided, for the next.
type pass struct {
	cb *v1alpha1.CacheBackend
	// st is the status being built (a copy of cb's).
	st *v1alpha1.CacheBackendStatus
	// obs is gather's reading; plan the children's plan.
	obs  observation
	plan plan.Plan
	// applyErr and markErr are execute's failures (the children, the
	// claims' warning marks).
	applyErr, markErr error
	// seen is observe's reading, verdict the serving verdict it asked for
	// (the KV-event gate and the rolls depend on it).
	seen    observed
	verdict evaluate.Verdict
	// rolls are planRolls' decision, rolled the workload rolls written,
	// rollErr what executing them failed with (retried; the rest of the
	// status is published meanwhile), out evaluate's: the status to
	// publish.
	rolls   rollout.RollPlan
	rolled  []rollout.Roll
	rollErr error
	out     evaluate.Outcome
	// probed: the functional probe ran in this reconcile.
	probed bool
}

// begin reads the CacheBackend and starts its pass; nil when it is gone or
// being deleted (children carry owner references: the garbage collector
// removes them).
func (r *CacheBackendReconciler) begin(ctx context.Context, key client.ObjectKey) (*pass, error) {
	cb := &v1alpha1.CacheBackend{}
	if err := r.Client.Get(ctx, key, cb); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(key)
		}
		return nil, client.IgnoreNotFound(err)
	}
	if !cb.DeletionTimestamp.IsZero() {
		r.forget(key)
		return nil, nil
	}
	// When the endpoint was published (or withdrawn) is taken from this
	// process's last write, by every status write (publish's and stop's).
	st, last := cb.Status.DeepCopy(), r.lastStatus(cb)
	st.Endpoint, st.EndpointPublishedAt = last.Endpoint, last.EndpointPublishedAt
	return &pass{cb: cb, st: st}, nil
}

// lastStatus is the status this process last wrote for cb, or the cached
// one when it wrote none: the cache may lag the process's own writes.
func (r *CacheBackendReconciler) lastStatus(cb *v1alpha1.CacheBackend) *v1alpha1.CacheBackendStatus {
	if last := r.memo.get(cb).status; last != nil {
		return last
	}
	return &cb.Status
}

// forget drops what this process keeps of a backend that is gone or
// being deleted: its memo and its probe slot.
func (r *CacheBackendReconciler) forget(key client.ObjectKey) {
	r.memo.forget(key)
	if r.Prober != nil {
		r.Prober.Forget(key)
	}
}

// forgetProbeUnlessProbed clears the backend's probe slot on every path that
// did not reach the functional probe (deletion: forget), so that a return
// to the ready state probes afresh.
func (r *CacheBackendReconciler) forgetProbeUnlessProbed(s *pass) {
	if r.Prober != nil && !s.probed {
		r.Prober.Forget(client.ObjectKeyFromObject(s.cb))
	}
}

// recordEngineMatch publishes the number of engine pods the selector
// matches and records EngineSelectorUnmatched when zero matches are first
// observed or the count drops to zero. "Already reported" is read from the
// published status (a non-empty engineSelectorMessage), which every
// reconcile writes, also one that stops early: a failed reconcile never
// makes the first observation repeat.
func (r *CacheBackendReconciler) recordEngineMatch(s *pass) {
	s.st.MatchedEnginePods = s.obs.matched
	s.st.EngineSelectorMessage = ""
	if s.obs.matched > 0 {
		r.memo.update(s.cb, func(e *memoEntry) { e.unmatched = false })
		return
	}
	s.st.EngineSelectorMessage = selectorMessage(s.cb, s.obs.claimedElsewhere)
	if r.memo.get(s.cb).unmatched {
		return // reported by this process; the cache has not caught up yet
	}
	if s.cb.Status.EngineSelectorMessage == "" {
		r.Recorder.Eventf(s.cb, nil, corev1.EventTypeNormal, v1alpha1.EventEngineSelectorUnmatched, "Observe", "%s", s.st.EngineSelectorMessage)
	}
	r.memo.update(s.cb, func(e *memoEntry) { e.unmatched = true })
}

// execute hands the plan to the applier and records what it did.
func (r *CacheBackendReconciler) execute(ctx context.Context, s *pass) {
	res, err := r.Applier.Execute(ctx, s.plan)
	if res.Changed() {
		log.FromContext(ctx).Info("applied children", "changes", res.String())
		r.Recorder.Eventf(s.cb, nil, corev1.EventTypeNormal, v1alpha1.EventChildrenApplied, "Apply", "%s", res.String())
	}
	for _, w := range res.Marked {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: w.Claim.Namespace, Name: w.Claim.Name, UID: w.UID}}
		r.Recorder.Eventf(s.cb, pvc, corev1.EventTypeWarning, w.Reason, "Reconcile", "%s", w.Message)
	}
	if err != nil {
		r.Recorder.Eventf(s.cb, nil, corev1.EventTypeWarning, v1alpha1.EventApplyFailed, "Apply", "%s", err.Error())
	}
	s.applyErr, s.markErr = err, res.MarkErr
}

// serve is the serving verdict from what observe has read so far, with
// the pure policy chains.
func (r *CacheBackendReconciler) serve(s *pass) evaluate.Verdict {
	if s.plan.EngineLocal {
		return evaluate.EngineLocal(s.cb, s.obs.enginePods, s.obs.keys, r.Inject)
	}
	return evaluate.Server(s.seen.facts)
}

// planRolls decides, from the pass's values alone, the engine rolls.
func (r *CacheBackendReconciler) planRolls(s *pass) {
	s.rolls = rollout.Decide(s.seen.roll, s.seen.candidates)
}

// evaluate decides, from the pass's values alone, the whole status to
// publish. Rolls that failed (rollErr) leave the server identity
// unrecorded, so that they are retried, and keep Reconciling True with
// EngineRestartsRetrying; everything else is published as evaluated, so a
// restart an admission policy keeps refusing freezes no other field.
func (r *CacheBackendReconciler) evaluate(s *pass) {
	cb, v, seen := s.cb, s.verdict, &s.seen
	endpoint := ""
	if v.Available && !s.plan.EngineLocal {
		endpoint = topology.Endpoint(cb, r.Inject.ClusterDomain)
	}
	w := seen.wiring
	wiring := evaluate.ReportWiring(evaluate.WiringFacts{
		Wiring: w, Policy: cb.Spec.EngineRestartPolicy, EngineLoc: s.plan.EngineLocal, Endpoint: endpoint != "",
		EarlyOwner: workloadNames(w.Early), LateOwner: workloadNames(w.Late), Rolling: s.rolls.Healing && healRolled(s.rolls.Rolls, s.rolled),
	})
	part, index := evaluate.Index(seen.index)
	s.out = evaluate.Outcome{
		Verdict: v, Wiring: wiring, Wired: w.Wired, Unwired: w.Unwired(),
		Observed: cb.Spec.Observation != nil, Index: index, Participation: evaluate.Settle(cb.Status.IndexParticipation, part),
		Probed: s.probed, ProbeErr: seen.facts.ProbeErr,
		Endpoint: endpoint, FirstAvailableAt: seen.facts.FirstAvailableAt, Now: r.Now(), Capacity: s.plan.Capacity,
		ServerInstance: seen.roll.Instance, Record: s.rolls.Record, RollErr: s.rollErr,
		Multiprocess: evaluate.NodeServers(seen.facts.Workload, seen.serverPods, topology.Port(cb)),
		Storage:      evaluate.StorageOf(cb),
	}
}

// roll executes the engine rolls the pass planned, and records them.
func (r *CacheBackendReconciler) roll(ctx context.Context, s *pass) error {
	if len(s.rolls.Rolls) == 0 && len(s.rolls.Evictions) == 0 {
		return nil
	}
	// Every roll and every eviction is tried: a workload that cannot be
	// written holds no node's evictions, and the other way round.
	done, rollErr := apply.Roll(ctx, r.Applier, s.cb.Namespace, s.rolls.Rolls)
	s.rolled = done
	if rollErr != nil {
		r.Recorder.Eventf(s.cb, nil, corev1.EventTypeWarning, v1alpha1.EventEngineRollFailed, "Rollout",
			"the API server refused an engine workload's restart; retrying: %s", evaluate.Brief(rollErr))
	}
	evicted, forbidden, evictErr := apply.Evict(ctx, r.Applier, s.cb.Namespace, unreported(r.memo.get(s.cb).forbidden, s.rolls.Evictions))
	switch {
	case apierrors.IsTooManyRequests(evictErr):
		r.Recorder.Eventf(s.cb, nil, corev1.EventTypeWarning, v1alpha1.EventEngineEvictionBlocked, "Evict",
			"a PodDisruptionBudget allows no disruption now; retrying: %s", evaluate.Brief(evictErr))
	case evictErr != nil:
		r.Recorder.Eventf(s.cb, nil, corev1.EventTypeWarning, v1alpha1.EventEngineEvictionBlocked, "Evict",
			"the API server refused an eviction; retrying: %s", evaluate.Brief(evictErr))
	}
	r.rememberForbidden(s.cb, s.rolls.Evictions, forbidden)
	r.recordRolls(ctx, s.cb, rollout.RollPlan{Rolls: done, Evictions: evicted})
	r.recordForbidden(ctx, s.cb, forbidden)
	return errors.Join(rollErr, evictErr)
}

// healRolled reports whether every heal roll the pass planned was written
// (the heal's pods are being replaced, whatever else failed).
func healRolled(planned, done []rollout.Roll) bool {
	for _, p := range planned {
		if p.Cause == rollout.CauseAdmittedBeforeEndpoint && !slices.Contains(done, p) {
			return false
		}
	}
	return true
}

// unreported leaves out of planned the evictions RBAC refused before for
// the same start of their node's server (reported).
func unreported(reported map[types.UID]time.Time, planned []rollout.Eviction) []rollout.Eviction {
	return slices.DeleteFunc(slices.Clone(planned), func(e rollout.Eviction) bool {
		since, ok := reported[e.UID]
		return ok && since.Equal(e.Since)
	})
}

// rememberForbidden keeps, of the evictions planned, those RBAC refused
// now or before (for the same server start of their node), so that they
// are reported once (memoEntry.forbidden).
func (r *CacheBackendReconciler) rememberForbidden(cb *v1alpha1.CacheBackend, planned, forbidden []rollout.Eviction) {
	r.memo.update(cb, func(m *memoEntry) {
		keep := map[types.UID]time.Time{}
		for _, e := range planned {
			if since, ok := m.forbidden[e.UID]; ok && since.Equal(e.Since) {
				keep[e.UID] = since
			}
		}
		for _, e := range forbidden {
			keep[e.UID] = e.Since
		}
		m.forbidden = keep
	})
}

// engineLocalPoll is how often a non-ready engine-local backend with
// matched pods is checked. Pod readiness is not watched (no cache of full
// pod objects), so it is polled until the backend converges; then pod
// events drive reconciles.
const engineLocalPoll = 5 * time.Second

// nameConflictRecheck is how often a backend stopped by a name conflict
// looks again whether the other object is gone (removing it wakes no
// watch of this backend).
const nameConflictRecheck = time.Minute

// requeueAfter is when the pass wants to look again, 0 for never: a roll
// waiting for the endpoint to settle, an engine-local backend polled until
// ready, a failed probe, a name conflict. Everything else is watched.
func (r *CacheBackendReconciler) requeueAfter(s *pass) time.Duration {
	d := s.rolls.Wait
	if s.plan.EngineLocal && !s.verdict.Ready && s.st.MatchedEnginePods > 0 {
		// Readiness of matched pods is polled; without a matched pod only
		// a pod event (watched) can change the verdict.
		d = sooner(d, engineLocalPoll)
	}
	if s.probed && s.seen.facts.ProbeErr != nil {
		d = sooner(d, r.Prober.Interval)
	}
	if s.verdict.Reason == v1alpha1.ReasonNameConflict {
		d = sooner(d, nameConflictRecheck)
	}
	return d
}

// publish writes the status of the evaluated generation and records the
// events of its transitions.
func (r *CacheBackendReconciler) publish(ctx context.Context, s *pass) (ctrl.Result, error) {
	cb, v := s.cb, s.verdict
	stepErr := errors.Join(s.applyErr, s.markErr, s.rollErr)
	// The transitions are judged from this process's last status write (a
	// reconcile retried at once after a failed roll reads a cache from
	// before its publish, and would record an event twice).
	previous := meta.FindStatusCondition(r.lastStatus(cb).Conditions, v1alpha1.ConditionReady)
	evaluate.Publish(s.st, cb.Generation, s.out)
	if ctx.Err() != nil {
		return ctrl.Result{}, ctx.Err() // shutting down: nothing trustworthy to publish
	}
	if err := r.patchStatus(ctx, cb, s.st); err != nil {
		return ctrl.Result{}, errors.Join(stepErr, err)
	}
	r.reportUnwired(s)
	changed := previous == nil || previous.Reason != v.Reason
	if v.Reason == v1alpha1.ReasonImmutableStatefulSetStorage && changed {
		r.Recorder.Eventf(cb, nil, corev1.EventTypeWarning, v1alpha1.ReasonImmutableStatefulSetStorage, "Apply", "%s", v.Message)
	}
	if v.Reason == v1alpha1.ReasonNameConflict && (changed || previous.Message != v.Message) {
		r.Recorder.Eventf(cb, nil, corev1.EventTypeWarning, v1alpha1.ReasonNameConflict, "Apply", "%s", v.Message)
	}
	if v.Ready && (previous == nil || previous.Status != metav1.ConditionTrue) {
		msg := v.Message
		if !s.plan.EngineLocal {
			msg = "cache server serving at " + s.st.Endpoint
		}
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, v1alpha1.EventBackendReady, "Reconcile", "%s", msg)
	}
	return ctrl.Result{RequeueAfter: r.requeueAfter(s)}, stepErr
}

// stop publishes a reconcile that ended before it evaluated the backend:
// Reconciling=True with reason, Ready kept only when it was computed for
// this generation (Unknown otherwise), observedGeneration unchanged. What
// was observed before the failure (the engine match) is published too.
func (r *CacheBackendReconciler) stop(ctx context.Context, s *pass, reason string, err error) (ctrl.Result, error) {
	if ctx.Err() != nil {
		return ctrl.Result{}, err
	}
	evaluate.SetNotEvaluated(s.st, s.cb.Generation, reason, err.Error())
	return ctrl.Result{}, errors.Join(err, r.patchStatus(ctx, s.cb, s.st))
}

func selectorMessage(cb *v1alpha1.CacheBackend, claimedElsewhere map[string]int) string {
	sel := cb.Spec.EngineSelector.MatchLabels
	if len(sel) == 0 {
		return "spec.engineSelector.matchLabels is empty: it matches no pod"
	}
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + sel[k]
	}
	if len(claimedElsewhere) > 0 {
		var by []string
		n := 0
		for _, name := range slices.Sorted(maps.Keys(claimedElsewhere)) {
			by = append(by, fmt.Sprintf("%d by CacheBackend %s", claimedElsewhere[name], name))
			n += claimedElsewhere[name]
		}
		return fmt.Sprintf("engineSelector %s matches %d pod(s) in namespace %s, each claimed by another CacheBackend (%s): the webhook wires a pod to the first by name of the backends whose selectors match it; give this one a selector of its own",
			strings.Join(parts, ","), n, cb.Namespace, strings.Join(by, ", "))
	}
	return fmt.Sprintf("engineSelector %s matches no pod in namespace %s", strings.Join(parts, ","), cb.Namespace)
}

// patchStatus server-side applies the whole status with the status field
// manager, so fields left empty (a cleared endpoint) are removed. Nothing is
// sent when the status did not change.
//
// "Did not change" needs both the cached status and the status this
// process last wrote to equal st: after a write of A then B, a cache still
// showing A says nothing about the live B, and a reconcile that computes A
// again must write it (otherwise the live status stays B until some other
// change wakes the backend).
func (r *CacheBackendReconciler) patchStatus(ctx context.Context, cb *v1alpha1.CacheBackend, st *v1alpha1.CacheBackendStatus) error {
	if equality.Semantic.DeepEqual(&cb.Status, st) {
		if last := r.memo.get(cb).status; last == nil || equality.Semantic.DeepEqual(last, st) {
			return nil
		}
	}
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encoding status: %w", err)
	}
	var status map[string]any
	if err := json.Unmarshal(raw, &status); err != nil {
		return fmt.Errorf("encoding status: %w", err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "CacheBackend",
		"metadata":   map[string]any{"name": cb.Name, "namespace": cb.Namespace, "uid": string(cb.UID)},
		"status":     status,
	}}
	if err := r.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u),
		client.FieldOwner(v1alpha1.FieldManagerStatus), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return fmt.Errorf("writing status: %w", err)
	}
	// Kept as the API server stores it (times in whole seconds), so that
	// the cache showing this write compares equal.
	written := &v1alpha1.CacheBackendStatus{}
	if err := json.Unmarshal(raw, written); err != nil {
		return fmt.Errorf("encoding status: %w", err)
	}
	r.memo.update(cb, func(e *memoEntry) { e.status = written })
	return nil
}
