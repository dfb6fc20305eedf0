// Package controller holds the reconcilers: they read CacheBackends, render
// their children (internal/render), hand them to the applier
// (internal/apply), and publish status.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
)

// StatusManager is the field manager of CacheBackend status. It is API:
// renaming it strands the status fields it owns.
const StatusManager = "inferencecache-operator-status"

// CacheBackendReconciler reconciles CacheBackends: render, apply, status.
type CacheBackendReconciler struct {
	Client   client.Client
	Applier  *apply.Applier
	Recorder events.EventRecorder
	// APIReader lists engine pods of engine-local backends live, so that no
	// cache of full pod objects is needed.
	APIReader client.Reader
	// Keys verifies injection receipts.
	Keys *receipt.KeyRing
	// Inject are the webhook's options, to replay injections.
	Inject inject.Options
	// Prober, when set, checks that the server answers before Ready=True.
	Prober *Prober
	// Now returns the current time; tests may replace it.
	Now func() metav1.Time
}

// RBAC markers: rbac.go.

// SetupWithManager registers the reconciler. Engine pods are watched as
// metadata only, and only label, creation, deletion and termination changes
// wake a reconcile.
func (r *CacheBackendReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = metav1.Now
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.CacheBackend{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.Deployment{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&autoscalingv2.HorizontalPodAutoscaler{}).
		WatchesMetadata(&corev1.Pod{},
			handler.EnqueueRequestsFromMapFunc(r.backendsForPod),
			builder.WithPredicates(podMembershipChanged())).
		Named("cachebackend").
		Complete(r)
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

func (r *CacheBackendReconciler) backendsForPod(ctx context.Context, pod client.Object) []reconcile.Request {
	var list v1alpha1.CacheBackendList
	if err := r.Client.List(ctx, &list, client.InNamespace(pod.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "listing CacheBackends for a pod event", "pod", client.ObjectKeyFromObject(pod))
		return nil
	}
	var reqs []reconcile.Request
	if owner := pod.GetLabels()[render.LabelCacheBackend]; owner != "" {
		// A cache-server pod: its replacement matters to its backend.
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: pod.GetNamespace(), Name: owner}})
	}
	for i := range list.Items {
		if inject.Matches(list.Items[i].Spec.EngineSelector.MatchLabels, pod.GetLabels()) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// Reconcile renders the CacheBackend's children, applies them and publishes
// status. The status is written once, at the end, and only if it changed.
func (r *CacheBackendReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	logger := log.FromContext(ctx)
	// Every path that does not reach the functional probe leaves the ready
	// state: it clears the backend's probe slot, so a return to it probes
	// afresh.
	probed := false
	defer func() {
		if r.Prober != nil && !probed {
			r.Prober.Forget(req.NamespacedName)
		}
	}()
	cb := &v1alpha1.CacheBackend{}
	if err := r.Client.Get(ctx, req.NamespacedName, cb); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cb.DeletionTimestamp.IsZero() {
		// Children carry owner references; the garbage collector removes them.
		return ctrl.Result{}, nil
	}

	st := cb.Status.DeepCopy()
	keepStatus := false
	defer func() {
		if ctx.Err() != nil || keepStatus {
			return // shutting down, or nothing trustworthy to publish
		}
		st.ObservedGeneration = cb.Generation
		if !probed {
			// The probe's verdict holds only while the backend is probed.
			meta.RemoveStatusCondition(&st.Conditions, ConditionFunctionalProbeOK)
		}
		if err := r.patchStatus(ctx, cb, st); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	if err := r.observeEngines(ctx, cb, st); err != nil {
		return ctrl.Result{}, err
	}

	if cb.Spec.Type == v1alpha1.BackendTypeSGLangHiCache {
		res, err := r.reconcileEngineLocal(ctx, cb, st)
		// Without a pod list or keys there is no trustworthy verdict: the
		// previous one stands.
		keepStatus = err != nil
		return res, err
	}

	children := render.Render(cb)

	var opts apply.Options
	live, err := r.liveWorkload(ctx, cb)
	if err != nil {
		return ctrl.Result{}, err
	}
	// A StatefulSet's claim templates cannot change: when the spec's storage
	// no longer matches them, the StatefulSet is left untouched (not applied,
	// not pruned) and the backend reports it; the rest is still applied.
	drift := ""
	if sts, ok := live.(*appsv1.StatefulSet); ok && children.StatefulSet != nil {
		if drift = claimTemplateDrift(children.StatefulSet.Spec.VolumeClaimTemplates, sts.Spec.VolumeClaimTemplates); drift != "" {
			children.StatefulSet = nil
			opts.Hold = append(opts.Hold, "StatefulSet/"+cb.Name)
		}
	}
	storageNote, err := r.reconcileClaims(ctx, cb, &children, st)
	if err != nil {
		return ctrl.Result{}, err
	}

	res, err := r.Applier.Apply(ctx, cb, children, opts)
	if res.Changed() {
		logger.Info("applied children", "changes", res.String())
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, v1alpha1.EventChildrenApplied, "Apply", "%s", res.String())
	}
	if err != nil {
		r.Recorder.Eventf(cb, nil, corev1.EventTypeWarning, v1alpha1.EventApplyFailed, "Apply", "%s", err.Error())
		st.Endpoint = ""
		r.setHealth(cb, st, health{Reason: v1alpha1.ReasonApplyFailed, Message: err.Error(), Degraded: true, Stalled: true})
		return ctrl.Result{}, err
	}
	// Health and the server observer read the workload of the kind the spec
	// asks for, after the apply: a workload of the other kind (being pruned)
	// is never advertised. A held StatefulSet still serves, so its server
	// pods are still observed.
	live, err = r.liveWorkload(ctx, cb)
	if err != nil {
		return ctrl.Result{}, err
	}
	canRoll := drift == "" && workloadAvailable(live)
	deferred, err := r.observeServer(ctx, cb, live, st, canRoll)
	if err != nil {
		return ctrl.Result{}, err
	}
	var requeue ctrl.Result
	if cb.Spec.EngineRestartPolicy != v1alpha1.EngineRestartNever {
		// Container restarts are pod status, which no watch here sees.
		requeue.RequeueAfter = serverPoll
	}
	if deferred {
		requeue.RequeueAfter = 2 * time.Second
	}
	if drift != "" {
		msg := fmt.Sprintf("storage of StatefulSet %s cannot change (%s); restore spec.storage, or delete the StatefulSet (its claims are kept) to recreate it", cb.Name, drift)
		if c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != ReasonImmutableStatefulSetStorage {
			r.Recorder.Eventf(cb, nil, corev1.EventTypeWarning, ReasonImmutableStatefulSetStorage, "Apply", "%s", msg)
		}
		st.Endpoint = ""
		r.setHealth(cb, st, health{Reason: ReasonImmutableStatefulSetStorage, Message: msg, Degraded: true, Stalled: true})
		return requeue, nil
	}

	var h health
	if children.StatefulSet != nil {
		sts, _ := live.(*appsv1.StatefulSet)
		h = statefulSetHealth(sts)
	} else {
		dep, _ := live.(*appsv1.Deployment)
		h = deploymentHealth(dep)
	}
	if h.Ready && r.Prober != nil {
		probed = true
		perr, _ := r.Prober.Check(ctx, cb)
		if perr != nil {
			h.Ready, h.Reason, h.Degraded = false, ReasonFunctionalProbeFailed, true
			h.Message = perr.Error()
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionFunctionalProbeOK, Status: metav1.ConditionFalse,
				Reason: ReasonProbeFailed, Message: perr.Error(), ObservedGeneration: cb.Generation})
			requeue.RequeueAfter = r.Prober.Interval
		} else {
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionFunctionalProbeOK, Status: metav1.ConditionTrue,
				Reason: ReasonProbeSucceeded, Message: "the cache server accepts connections on its port", ObservedGeneration: cb.Generation})
		}
	}
	if storageNote != "" {
		h.Message += "; " + storageNote
	}
	st.Endpoint = ""
	if h.Available {
		st.Endpoint = render.Endpoint(cb, r.Inject.ClusterDomain)
		if st.FirstAvailableAt == nil {
			st.FirstAvailableAt = r.firstAvailable(ctx, cb)
		}
	}
	wasReady := meta.IsStatusConditionTrue(cb.Status.Conditions, v1alpha1.ConditionReady)
	r.setHealth(cb, st, h)
	if h.Ready && !wasReady {
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, v1alpha1.EventBackendReady, "Reconcile", "cache server serving at %s", st.Endpoint)
	}
	return requeue, nil
}

// endpointSettled reports whether engines rolled now will be wired: the
// live status (read from the API server, not the cache) publishes the
// endpoint and has been Ready for a few seconds, so that the webhook's
// cache, which lags the API server, holds the endpoint too.
func (r *CacheBackendReconciler) endpointSettled(ctx context.Context, cb *v1alpha1.CacheBackend) bool {
	live := &v1alpha1.CacheBackend{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cb), live); err != nil {
		return false
	}
	ready := meta.FindStatusCondition(live.Status.Conditions, v1alpha1.ConditionReady)
	return live.Status.Endpoint == render.Endpoint(cb, r.Inject.ClusterDomain) && ready != nil && ready.Status == metav1.ConditionTrue &&
		r.Now().Sub(ready.LastTransitionTime.Time) >= endpointSettleTime
}

// endpointSettleTime is how long a backend must have been Ready before its
// engines are rolled.
const endpointSettleTime = 3 * time.Second

// firstAvailable returns the time to record as status.firstAvailableAt:
// the live object's when it already has one (the cache may lag a write that
// recorded it), now otherwise. It runs once per backend.
func (r *CacheBackendReconciler) firstAvailable(ctx context.Context, cb *v1alpha1.CacheBackend) *metav1.Time {
	live := &v1alpha1.CacheBackend{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cb), live); err == nil && live.Status.FirstAvailableAt != nil {
		return live.Status.FirstAvailableAt
	}
	now := r.Now()
	return &now
}

// workloadAvailable reports whether the workload serves (the endpoint's rule).
func workloadAvailable(w client.Object) bool {
	switch w := w.(type) {
	case *appsv1.Deployment:
		return deploymentHealth(w).Available
	case *appsv1.StatefulSet:
		return statefulSetHealth(w).Available
	}
	return false
}

// serverPoll is how often an LMCache backend's server pods are looked at
// for container restarts, which change pod status only.
const serverPoll = 30 * time.Second

// observeServer records the identity of the serving cache-server pods and,
// when a pod seen before was replaced or restarted, rolls the wired engines
// (unless spec.engineRestartPolicy is Never). The first observation never
// rolls anything; while no pod serves, the last identity is kept so that
// the replacement is recognised when it serves. Engines are rolled only
// while the endpoint is published (in the status the webhook reads), so
// that their new pods are wired; until then the change is deferred and the
// returned flag asks for an early re-check.
func (r *CacheBackendReconciler) observeServer(ctx context.Context, cb *v1alpha1.CacheBackend, workload client.Object, st *v1alpha1.CacheBackendStatus, canRoll bool) (bool, error) {
	inst, err := r.serverInstance(ctx, cb, workload)
	if err != nil || inst == "" {
		return false, err
	}
	if cb.Spec.EngineRestartPolicy != v1alpha1.EngineRestartNever && serverChanged(cb.Status.ObservedServerInstance, inst) {
		if !canRoll || !r.endpointSettled(ctx, cb) {
			return true, nil
		}
		if err := r.rollEngines(ctx, cb, inst); err != nil {
			return false, err
		}
	}
	st.ObservedServerInstance = inst
	return false, nil
}

// liveWorkload returns the cache-server workload of the kind cb asks for,
// if it exists and cb controls it; nil otherwise.
func (r *CacheBackendReconciler) liveWorkload(ctx context.Context, cb *v1alpha1.CacheBackend) (client.Object, error) {
	var obj client.Object = &appsv1.Deployment{}
	if render.IsStatefulSet(cb) {
		obj = &appsv1.StatefulSet{}
	}
	switch err := r.Client.Get(ctx, client.ObjectKeyFromObject(cb), obj); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the cache-server %s: %w", render.WorkloadKind(cb), err)
	case !metav1.IsControlledBy(obj, cb):
		return nil, nil
	}
	return obj, nil
}

// engineLocalPoll is how often a non-ready engine-local backend is checked.
// Pod readiness is not watched (no cache of full pod objects), so it is
// polled until the backend converges; then pod events drive reconciles.
const engineLocalPoll = 5 * time.Second

// reconcileEngineLocal publishes an SGLangHiCache backend's readiness from
// its engine pods. Such a backend runs no server: it has no children and no
// endpoint. When the pods cannot be listed or receipts cannot be verified,
// the previous verdict stands and the error is returned.
func (r *CacheBackendReconciler) reconcileEngineLocal(ctx context.Context, cb *v1alpha1.CacheBackend, st *v1alpha1.CacheBackendStatus) (ctrl.Result, error) {
	st.Endpoint = ""
	var pods corev1.PodList
	if sel := cb.Spec.EngineSelector.MatchLabels; len(sel) > 0 {
		if err := r.APIReader.List(ctx, &pods, client.InNamespace(cb.Namespace), client.MatchingLabels(sel)); err != nil {
			return ctrl.Result{}, fmt.Errorf("listing engine pods (previous verdict kept): %w", err)
		}
	}
	keys, err := r.Keys.Keys(ctx)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("reading receipt keys (previous verdict kept): %w", err)
	}
	h := engineLocalHealth(cb, pods.Items, keys, r.Inject)
	wasReady := meta.IsStatusConditionTrue(cb.Status.Conditions, v1alpha1.ConditionReady)
	r.setHealth(cb, st, h)
	if h.Ready && !wasReady {
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, v1alpha1.EventBackendReady, "Reconcile", "%s", h.Message)
	}
	if !h.Ready {
		return ctrl.Result{RequeueAfter: engineLocalPoll}, nil
	}
	return ctrl.Result{}, nil
}

// observeEngines counts the engine pods the selector matches, from the
// metadata-only pod cache, and records EngineSelectorUnmatched when zero
// matches are first observed or the count drops to zero.
func (r *CacheBackendReconciler) observeEngines(ctx context.Context, cb *v1alpha1.CacheBackend, st *v1alpha1.CacheBackendStatus) error {
	sel := cb.Spec.EngineSelector.MatchLabels
	var n int32
	if len(sel) > 0 {
		pods := &metav1.PartialObjectMetadataList{}
		pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := r.Client.List(ctx, pods, client.InNamespace(cb.Namespace), client.MatchingLabels(sel)); err != nil {
			return fmt.Errorf("listing engine pods: %w", err)
		}
		for i := range pods.Items {
			if pods.Items[i].DeletionTimestamp.IsZero() {
				n++
			}
		}
	}
	firstObservation := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady) == nil
	dropped := cb.Status.MatchedEnginePods > 0
	st.MatchedEnginePods = n
	st.EngineSelectorMessage = ""
	if n > 0 {
		return nil
	}
	st.EngineSelectorMessage = selectorMessage(cb)
	if firstObservation || dropped {
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, v1alpha1.EventEngineSelectorUnmatched, "Observe", "%s", st.EngineSelectorMessage)
	}
	return nil
}

func selectorMessage(cb *v1alpha1.CacheBackend) string {
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
	return fmt.Sprintf("engineSelector %s matches no pod in namespace %s", strings.Join(parts, ","), cb.Namespace)
}

// setHealth writes the conditions that follow from h. Conditions keep their
// lastTransitionTime while their status does not change.
func (r *CacheBackendReconciler) setHealth(cb *v1alpha1.CacheBackend, st *v1alpha1.CacheBackendStatus, h health) {
	st.Replicas, st.ReadyReplicas = h.Replicas, h.ReadyReplicas
	set := func(t string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: cb.Generation,
		})
	}
	set(v1alpha1.ConditionReady, h.Ready, h.Reason, h.Message)
	if h.Progressing {
		set(v1alpha1.ConditionProgressing, true, h.Reason, h.Message)
		set(v1alpha1.ConditionReconciling, true, h.Reason, h.Message)
	} else {
		set(v1alpha1.ConditionProgressing, false, v1alpha1.ReasonStable, "no rollout in progress")
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionReconciling)
	}
	if h.Degraded {
		set(v1alpha1.ConditionDegraded, true, h.Reason, h.Message)
	} else {
		set(v1alpha1.ConditionDegraded, false, v1alpha1.ReasonStable, "not degraded")
	}
	if h.Stalled {
		set(v1alpha1.ConditionStalled, true, h.Reason, h.Message)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionStalled)
	}
	if h.Degraded && !h.Stalled && !h.Progressing {
		// Replicas are being replaced by the workload's controller: kstatus
		// should read the backend as in progress, not current.
		set(v1alpha1.ConditionReconciling, true, h.Reason, h.Message)
	}
}

// patchStatus server-side applies the whole status with the status field
// manager, so fields left empty (a cleared endpoint) are removed. Nothing is
// sent when the status did not change.
func (r *CacheBackendReconciler) patchStatus(ctx context.Context, cb *v1alpha1.CacheBackend, st *v1alpha1.CacheBackendStatus) error {
	if equality.Semantic.DeepEqual(&cb.Status, st) {
		return nil
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
		client.FieldOwner(StatusManager), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}
