package controller

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/inject"
)

// indexPods returns the matched pods the KV-block index should know: wired
// to cb (wiredForIndex) and carrying the kvevent-subscriber sidecar. A pod
// wired before spec.observation.modelID or the manager's subscriber image
// was set carries neither the sidecar nor a kv-events-skipped stamp: it is
// not counted (lifecycle step 4: without the sidecar the
// index-participation fields stay unset). The full pods are read (the
// cache holds pod metadata only) once per pod, and only while the webhook
// would add the sidecar at all.
func (r *CacheBackendReconciler) indexPods(ctx context.Context, cb *v1alpha1.CacheBackend, pods []metav1.PartialObjectMetadata) ([]evaluate.IndexPod, error) {
	candidates := wiredForIndex(cb, pods)
	if cb.Spec.Observation == nil || cb.Spec.Observation.ModelID == "" || r.Inject.KVEventSubscriberImage == "" || len(candidates) == 0 {
		r.memo.update(cb, func(e *memoEntry) { e.sidecars = nil })
		return candidates, nil // the gate is closed before it counts pods
	}
	// A pod's containers never change after its creation, so one read of
	// the full pod answers for its life; only the pods still wired are
	// kept, so the memo never grows past the backends' pods.
	prev := r.memo.get(cb).sidecars
	next := make(map[types.UID]bool, len(candidates))
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	var out []evaluate.IndexPod
	for _, p := range candidates {
		uid := types.UID(p.UID)
		has, ok := prev[uid]
		if !ok {
			full := &corev1.Pod{}
			switch err := reader.Get(ctx, client.ObjectKey{Namespace: cb.Namespace, Name: p.Name}, full); {
			case apierrors.IsNotFound(err):
				continue
			case err != nil:
				return nil, fmt.Errorf("reading engine pod %s for the kvevent-subscriber sidecar: %w", p.Name, err)
			case full.UID != uid:
				continue // replaced under the same name: the next list has it
			}
			has = slices.ContainsFunc(full.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SubscriberContainer })
		}
		next[uid] = has
		if has {
			out = append(out, p)
		}
	}
	r.memo.update(cb, func(e *memoEntry) { e.sidecars = next })
	return out, nil
}
