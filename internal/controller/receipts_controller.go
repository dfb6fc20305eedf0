package controller

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/topology"
)

// DefaultReceiptEventHorizon is how old a pod may be and still get its
// receipt event from a manager that did not see it before (after a
// restart). It equals the API server's default --event-ttl (1 h): an event
// recorded for a younger pod still exists, so creating it again fails with
// AlreadyExists instead of reporting twice.
const DefaultReceiptEventHorizon = time.Hour

// ReceiptReconciler turns the webhook's receipts into events on the pods.
// The events come from a controller, not from the webhook, because a pod
// has no UID while it is being admitted: an event about it would not show
// under kubectl describe pod.
//
// Per pod it sends one request, the create of the event, and never writes
// to or reads the pod itself: it works from its own view of pods (see
// NewReceiptPodCache), which holds the digest of their containers. The
// event's name is deterministic per pod and keyed (receipt.EventName), so
// the event is recorded once across replicas and restarts: a second create
// answers AlreadyExists.
type ReceiptReconciler struct {
	// Client creates the events and reads CacheBackends.
	Client client.Client
	// Pods reads the receipt view of pods (NewReceiptPodCache).
	Pods client.Reader
	Keys *receipt.KeyRing
	// Horizon: pods created longer ago than this are not reported by a
	// manager that did not report them (DefaultReceiptEventHorizon when
	// zero); it must not exceed the API server's --event-ttl.
	Horizon time.Duration
	// Instance is the events' reportingInstance (the host name when empty).
	Instance string
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	// reported holds the UID of every pod this manager reported, so that
	// the pod's later updates send nothing.
	reported sync.Map // types.NamespacedName -> types.UID
}

// receiptDigestKey holds, in the receipt view of a pod only, the digest of
// the containers the pod was observed with. It is outside the
// inferencecache.io/ prefix, whose annotations alone the view keeps from
// the API object, so a pod cannot carry it in.
const receiptDigestKey = "receipts.view.inferencecache.internal/observed-digest"

// receiptView is the receipt controller's cache transform: a pod reduced to
// its identity, its inferencecache.io/ annotations and, for a pod with a
// receipt, the digest of its containers. A cached pod costs a few hundred
// bytes whatever its spec.
func receiptView(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	view := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		CreationTimestamp: pod.CreationTimestamp, DeletionTimestamp: pod.DeletionTimestamp,
	}}
	for k, v := range pod.Annotations {
		if strings.HasPrefix(k, "inferencecache.io/") {
			if view.Annotations == nil {
				view.Annotations = map[string]string{}
			}
			view.Annotations[k] = v
		}
	}
	if claimed := view.Annotations[v1alpha1.AnnotationInjectedConfigDigest]; claimed != "" {
		view.Annotations[receiptDigestKey] = receipt.DigestLike(pod, claimed)
	}
	return view, nil
}

// NewReceiptPodCache is the receipt controller's own informer cache of pods,
// reduced by receiptView as they arrive. It is separate from the manager's
// cache so that the manager's other pod watches keep their own options.
func NewReceiptPodCache(mgr ctrl.Manager) (cache.Cache, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(),
		Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Transform: receiptView},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the receipt controller's pod cache: %w", err)
	}
	return c, nil
}

// SetupWithManager watches pods through pods (NewReceiptPodCache, which
// the caller adds to the manager), only those with a receipt or a skip
// stamp.
func (r *ReceiptReconciler) SetupWithManager(mgr ctrl.Manager, pods cache.Cache) error {
	if r.Pods == nil {
		r.Pods = pods
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("receipts").
		WatchesRawSource(source.Kind(pods, &corev1.Pod{}, &handler.TypedEnqueueRequestForObject[*corev1.Pod]{},
			predicate.NewTypedPredicateFuncs(func(p *corev1.Pod) bool { return needsReport(p) }))).
		Complete(r)
}

func needsReport(o client.Object) bool {
	a := o.GetAnnotations()
	return a[v1alpha1.AnnotationInjectedBy] != "" || a[v1alpha1.AnnotationInjectSkipped] != ""
}

// Reconcile records the pod's one receipt event.
func (r *ReceiptReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &corev1.Pod{}
	if err := r.Pods.Get(ctx, req.NamespacedName, pod); err != nil {
		if apierrors.IsNotFound(err) {
			r.reported.Delete(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if uid, ok := r.reported.Load(req.NamespacedName); ok && uid == pod.UID {
		return ctrl.Result{}, nil
	}
	if !needsReport(pod) || !pod.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	logger := log.FromContext(ctx)
	if age := r.now().Sub(pod.CreationTimestamp.Time); age > r.horizon() {
		// Its event, if it was recorded, may have expired: recording it
		// again could report the pod twice.
		r.reported.Store(req.NamespacedName, pod.UID)
		logger.V(1).Info("receipt not reported: the pod is older than the event horizon", "age", age.Round(time.Second), "horizon", r.horizon())
		return ctrl.Result{}, nil
	}
	keys, err := r.Keys.Keys(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(keys) == 0 {
		return ctrl.Result{}, fmt.Errorf("no receipt key to name the event with")
	}
	ev, err := r.event(ctx, pod, keys)
	if err != nil {
		return ctrl.Result{}, err
	}
	created, err := apply.RecordOnce(ctx, r.Client, ev)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.reported.Store(req.NamespacedName, pod.UID)
	logger.V(1).Info("receipt reported", "reason", ev.Reason, "event", ev.Name, "created", created)
	return ctrl.Result{}, nil
}

// event is the pod's receipt event, named by receipt.EventName with the
// current key.
func (r *ReceiptReconciler) event(ctx context.Context, pod *corev1.Pod, keys []receipt.Key) (*eventsv1.Event, error) {
	evType, reason, related, note, err := r.verdict(ctx, pod, keys)
	if err != nil {
		return nil, err
	}
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: pod.Namespace, Name: receipt.EventName(keys[0], pod.Name, string(pod.UID))},
		EventTime:           metav1.NewMicroTime(r.now()),
		ReportingController: v1alpha1.ReportingController,
		ReportingInstance:   r.instance(),
		Action:              "Admit",
		Reason:              reason,
		Type:                evType,
		Note:                note,
		Regarding: corev1.ObjectReference{
			APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
		},
	}
	if related != nil {
		ev.Related = &corev1.ObjectReference{
			APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend",
			Namespace: related.Namespace, Name: related.Name, UID: related.UID,
		}
	}
	return ev, nil
}

// verdict judges the pod's receipt against the live CacheBackend it names,
// with receipt.JudgeObserved (the verdict engine-local readiness and the
// CLI share, on the digest the pod view holds).
func (r *ReceiptReconciler) verdict(ctx context.Context, pod *corev1.Pod, keys []receipt.Key) (string, string, *v1alpha1.CacheBackend, string, error) {
	a := pod.Annotations
	if skipped := a[v1alpha1.AnnotationInjectSkipped]; skipped != "" && a[v1alpha1.AnnotationInjectedBy] == "" {
		return corev1.EventTypeNormal, v1alpha1.EventSkipped, nil,
			fmt.Sprintf("pod left unwired by the inferencecache webhook: %s", skipped), nil
	}
	var cb *v1alpha1.CacheBackend
	if ns, name, ok := strings.Cut(a[v1alpha1.AnnotationInjectedBy], "/"); ok && ns == pod.Namespace && name != "" {
		cb = &v1alpha1.CacheBackend{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cb); err != nil {
			if !apierrors.IsNotFound(err) {
				return "", "", nil, "", fmt.Errorf("reading CacheBackend %s/%s: %w", ns, name, err)
			}
			cb = nil
		}
	}
	j := receipt.JudgeObserved(pod, a[receiptDigestKey], cb, keys)
	if j.Verdict != receipt.Valid {
		if j.Verdict == receipt.NoBackend || j.Verdict == receipt.Foreign || j.Verdict == receipt.Incomplete {
			cb = nil
		}
		return corev1.EventTypeWarning, v1alpha1.EventReceiptMismatch, cb, j.Message, nil
	}
	if msg := releaseUnknown(pod, cb); msg != "" {
		return corev1.EventTypeWarning, v1alpha1.EventEngineReleaseUnknown, cb, j.Message + "; " + msg, nil
	}
	return corev1.EventTypeNormal, v1alpha1.EventInjected, cb, j.Message, nil
}

// releaseUnknown says, for a pod wired to cb's multiprocess server whose
// vLLM release the webhook could not tell (its receipt's
// inferencecache.io/wired-for), what it got and how to declare the
// release; "" otherwise.
func releaseUnknown(pod *corev1.Pod, cb *v1alpha1.CacheBackend) string {
	if cb == nil || topology.Of(cb) != topology.Multiprocess || !inject.VLLMReleaseUnknown(pod.Annotations[v1alpha1.AnnotationWiredFor]) {
		return ""
	}
	return fmt.Sprintf("the engine's vLLM release is unknown, so it was wired without kv_connector_module_path (as every supported vLLM accepts); "+
		"declare the release (pod annotation %s, a vllm/vllm-openai:vX.Y.Z image or spec.integration.versions.vllm) to get the wiring made for it",
		v1alpha1.AnnotationVLLMVersion)
}

func (r *ReceiptReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *ReceiptReconciler) horizon() time.Duration {
	if r.Horizon > 0 {
		return r.Horizon
	}
	return DefaultReceiptEventHorizon
}

func (r *ReceiptReconciler) instance() string {
	if r.Instance != "" {
		return r.Instance
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown"
	}
	return v1alpha1.ReportingController + "-" + host
}
