package controller

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
)

// Receipt events are recorded on pods, once per pod.
const (
	// EventInjected: the pod's receipt matches the live CacheBackend.
	EventInjected = "InjectedByCacheBackend"
	// EventSkipped: the webhook left the matched pod unwired on purpose.
	EventSkipped = "SkippedByOperator"
	// EventReceiptMismatch: the pod carries a receipt that does not match a
	// live CacheBackend (hand-written, copied, or of a deleted backend).
	EventReceiptMismatch = "ReceiptMismatch"

	// AnnotationReceiptObserved records on a pod which receipt event was
	// recorded, so that it is recorded once, also across manager restarts.
	AnnotationReceiptObserved = "inferencecache.io/receipt-observed"
	// ReceiptsManager is the field manager of AnnotationReceiptObserved.
	ReceiptsManager = "inferencecache-operator-receipts"
)

// ReceiptReconciler turns the webhook's receipts into events on the pods.
// The events come from a controller, not from the webhook, because a pod
// has no UID while it is being admitted: an event about it would not show
// under kubectl describe pod.
type ReceiptReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// APIReader reads the full pod (once per receipt) to check its
	// configuration against the signed digest.
	APIReader client.Reader
	Keys      *receipt.KeyRing
}

// SetupWithManager watches pod metadata only, and only pods with a receipt
// or a skip stamp that has not been reported yet.
func (r *ReceiptReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("receipts").
		For(&corev1.Pod{}, builder.OnlyMetadata, builder.WithPredicates(predicate.NewPredicateFuncs(needsReport))).
		Complete(r)
}

func needsReport(o client.Object) bool {
	a := o.GetAnnotations()
	if a[AnnotationReceiptObserved] != "" {
		return false
	}
	return a[inject.AnnotationInjectedBy] != "" || a[inject.AnnotationSkipped] != ""
}

// Reconcile records one event for the pod and marks it reported.
func (r *ReceiptReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pod := &metav1.PartialObjectMetadata{}
	pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	if err := r.Client.Get(ctx, req.NamespacedName, pod); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !needsReport(pod) || !pod.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	evType, reason, related, note, err := r.verdict(ctx, pod)
	if err != nil {
		return ctrl.Result{}, err
	}
	// Mark first: a crash between the two loses one event rather than
	// repeating it after every restart.
	if err := r.markReported(ctx, pod, reason); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if related != nil {
		r.Recorder.Eventf(pod, related, evType, reason, "Admit", "%s", note)
	} else {
		// A typed nil would reach the recorder as a non-nil related object.
		r.Recorder.Eventf(pod, nil, evType, reason, "Admit", "%s", note)
	}
	log.FromContext(ctx).V(1).Info("receipt reported", "reason", reason)
	return ctrl.Result{}, nil
}

// verdict checks the pod's receipt against the live CacheBackend it names.
func (r *ReceiptReconciler) verdict(ctx context.Context, pod *metav1.PartialObjectMetadata) (string, string, *v1alpha1.CacheBackend, string, error) {
	a := pod.Annotations
	if skipped := a[inject.AnnotationSkipped]; skipped != "" && a[inject.AnnotationInjectedBy] == "" {
		return corev1.EventTypeNormal, EventSkipped, nil,
			fmt.Sprintf("pod left unwired by the inferencecache webhook: %s", skipped), nil
	}
	by := a[inject.AnnotationInjectedBy]
	ns, name, ok := strings.Cut(by, "/")
	if !ok || ns != pod.Namespace || name == "" {
		return corev1.EventTypeWarning, EventReceiptMismatch, nil,
			fmt.Sprintf("receipt %s=%q does not name a CacheBackend of this namespace", inject.AnnotationInjectedBy, by), nil
	}
	cb := &v1alpha1.CacheBackend{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cb); err != nil {
		if apierrors.IsNotFound(err) {
			return corev1.EventTypeWarning, EventReceiptMismatch, nil,
				fmt.Sprintf("receipt names CacheBackend %s, which does not exist", by), nil
		}
		return "", "", nil, "", fmt.Errorf("reading CacheBackend %s: %w", by, err)
	}
	if uid := a[inject.AnnotationInjectedByUID]; uid != string(cb.UID) {
		return corev1.EventTypeWarning, EventReceiptMismatch, cb,
			fmt.Sprintf("receipt names CacheBackend %s with uid %q, but its uid is %q: the receipt was not written by the webhook for this backend", by, uid, cb.UID), nil
	}
	full := &corev1.Pod{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pod), full); err != nil {
		return "", "", nil, "", fmt.Errorf("reading pod: %w", err)
	}
	keys, err := r.Keys.Keys(ctx)
	if err != nil {
		return "", "", nil, "", err
	}
	if err := receipt.Verify(keys, full, inject.ClaimOf(full)); err != nil {
		return corev1.EventTypeWarning, EventReceiptMismatch, cb,
			fmt.Sprintf("receipt for CacheBackend %s not trusted: %v", by, err), nil
	}
	return corev1.EventTypeNormal, EventInjected, cb,
		fmt.Sprintf("wired to CacheBackend %s (generation %s)", by, a[inject.AnnotationInjectedGeneration]), nil
}

func (r *ReceiptReconciler) markReported(ctx context.Context, pod *metav1.PartialObjectMetadata, reason string) error {
	return applyAnnotation(ctx, r.Client, "Pod", pod, AnnotationReceiptObserved, reason, ReceiptsManager)
}

// applyAnnotation server-side applies one annotation on a core/v1 object
// with its own field manager, guarded by the object's UID so that a
// recreated object of the same name is never marked.
func applyAnnotation(ctx context.Context, c client.Client, kind string, obj metav1.Object, key, value, manager string) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind(kind)
	u.SetNamespace(obj.GetNamespace())
	u.SetName(obj.GetName())
	u.SetUID(obj.GetUID())
	u.SetAnnotations(map[string]string{key: value})
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership)
}
