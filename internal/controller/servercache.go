package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/render"
)

// CacheOptions are the manager's cache options: managedFields are
// stripped from every cached object (the operator never reads them, and
// they are often the largest part of a small object). Engine pods are
// cached as metadata only (WatchesMetadata), never as full pods.
func CacheOptions() cache.Options {
	return cache.Options{DefaultTransform: cache.TransformStripManagedFields()}
}

// NewServerCache returns the cache of the operator's own server-side
// objects: the pods, ReplicaSets and claims that carry the
// inferencecache.io/cachebackend label. It is a second cache, label-selected
// as a whole, because the manager's cache holds every pod of the cluster as
// metadata (engine pods) and a label selector there, per kind, would hide
// the engine pods. It holds full objects, so that container restarts
// (pod status) are seen, but only of the few server pods. Add it to the
// manager (mgr.Add) so that it starts with it.
func NewServerCache(mgr ctrl.Manager) (cache.Cache, error) {
	owned, err := labels.NewRequirement(render.LabelCacheBackend, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	opts := CacheOptions()
	opts.Scheme, opts.Mapper = mgr.GetScheme(), mgr.GetRESTMapper()
	opts.DefaultLabelSelector = labels.NewSelector().Add(*owned)
	c, err := cache.New(mgr.GetConfig(), opts)
	if err != nil {
		return nil, fmt.Errorf("creating the cache-server cache: %w", err)
	}
	return c, nil
}

// WatchServerPods is the source of cache-server pod events from the
// server cache: a pod's creation or deletion, the start of its
// termination, a change of its readiness or of its containers' restart
// count wakes the backend named by its label.
func WatchServerPods(c cache.Cache) source.Source {
	return source.Kind(c, &corev1.Pod{},
		handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, p *corev1.Pod) []reconcile.Request {
			owner := p.Labels[render.LabelCacheBackend]
			if owner == "" || p.Labels[render.LabelComponent] != render.ComponentCacheServer {
				return nil
			}
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: p.Namespace, Name: owner}}}
		}),
		predicate.TypedFuncs[*corev1.Pod]{
			UpdateFunc: func(e event.TypedUpdateEvent[*corev1.Pod]) bool {
				return serverPodState(e.ObjectOld) != serverPodState(e.ObjectNew)
			},
			GenericFunc: func(event.TypedGenericEvent[*corev1.Pod]) bool { return false },
		})
}

// serverPodState is what of a server pod the reconcile observes
// (evaluate.ObserveServer), plus the start of its termination.
type serverPodInfo struct {
	restarts    int32
	ready       bool
	terminating bool
}

func serverPodState(p *corev1.Pod) serverPodInfo {
	var s serverPodInfo
	for _, c := range p.Status.ContainerStatuses {
		s.restarts += c.RestartCount
	}
	s.ready = evaluate.PodReady(p)
	s.terminating = !p.DeletionTimestamp.IsZero()
	return s
}
