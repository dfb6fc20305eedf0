package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/receipt"
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
	if a[v1alpha1.AnnotationReceiptObserved] != "" {
		return false
	}
	return a[v1alpha1.AnnotationInjectedBy] != "" || a[v1alpha1.AnnotationInjectSkipped] != ""
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
		switch {
		case apierrors.IsNotFound(err):
			return ctrl.Result{}, nil
		case apierrors.IsConflict(err):
			// The pod changed since the cached copy this reconcile read:
			// possibly by an earlier reconcile's mark that the cache does not
			// show yet. Look again once it has caught up; report nothing now.
			return ctrl.Result{RequeueAfter: time.Second}, nil
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

// verdict judges the pod's receipt against the live CacheBackend it names,
// with receipt.Judge (the verdict engine-local readiness and the CLI share).
func (r *ReceiptReconciler) verdict(ctx context.Context, pod *metav1.PartialObjectMetadata) (string, string, *v1alpha1.CacheBackend, string, error) {
	a := pod.Annotations
	if skipped := a[v1alpha1.AnnotationInjectSkipped]; skipped != "" && a[v1alpha1.AnnotationInjectedBy] == "" {
		return corev1.EventTypeNormal, v1alpha1.EventSkipped, nil,
			fmt.Sprintf("pod left unwired by the inferencecache webhook: %s", skipped), nil
	}
	full := &corev1.Pod{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pod), full); err != nil {
		return "", "", nil, "", fmt.Errorf("reading pod: %w", err)
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
	keys, err := r.Keys.Keys(ctx)
	if err != nil {
		return "", "", nil, "", err
	}
	j := receipt.Judge(full, cb, keys)
	if j.Verdict != receipt.Valid {
		if j.Verdict == receipt.NoBackend || j.Verdict == receipt.Foreign || j.Verdict == receipt.Incomplete {
			cb = nil
		}
		return corev1.EventTypeWarning, v1alpha1.EventReceiptMismatch, cb, j.Message, nil
	}
	return corev1.EventTypeNormal, v1alpha1.EventInjected, cb, j.Message, nil
}

func (r *ReceiptReconciler) markReported(ctx context.Context, pod *metav1.PartialObjectMetadata, reason string) error {
	return apply.Annotate(ctx, r.Client, "Pod", pod.Namespace, pod.Name, pod.UID, pod.ResourceVersion, v1alpha1.AnnotationReceiptObserved, reason, v1alpha1.FieldManagerReceipts)
}
