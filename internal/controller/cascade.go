package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/render"
)

const (
	// AnnotationServerInstance is written on the pod template of engine
	// Deployments the operator rolls: a hash of the cache-server instance
	// they must reconnect to. Writing it is what restarts them, as
	// kubectl rollout restart does with its own annotation; its value makes
	// the roll idempotent across manager restarts and leader changes.
	AnnotationServerInstance = "inferencecache.io/server-instance"
	// RolloutManager is the field manager of AnnotationServerInstance.
	RolloutManager = "inferencecache-operator-rollout"
	// EventEnginesRestarted: engine Deployments were rolled after a server change.
	EventEnginesRestarted = "EnginesRestarted"
)

// Cascades counts engine Deployments rolled after a cache-server change.
var Cascades = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "inferencecache_restart_cascades_total",
	Help: "Engine Deployments rolled because their cache server was replaced or restarted, by namespace and CacheBackend.",
}, []string{"namespace", "cachebackend"})

func init() { metrics.Registry.MustRegister(Cascades) }

// serverInstance identifies the serving pods of workload: ready pods it
// owns (Deployment → ReplicaSet → Pod, or StatefulSet → Pod), as sorted
// <uid>:<restart-sum>. Pods that merely carry the labels are not trusted.
func (r *CacheBackendReconciler) serverInstance(ctx context.Context, cb *v1alpha1.CacheBackend, workload client.Object) (string, error) {
	if workload == nil {
		return "", nil
	}
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(cb.Namespace), client.MatchingLabels(render.SelectorLabels(cb))); err != nil {
		return "", fmt.Errorf("listing cache-server pods: %w", err)
	}
	owners := map[string]bool{}
	if _, ok := workload.(*appsv1.Deployment); ok {
		var rss appsv1.ReplicaSetList
		if err := r.APIReader.List(ctx, &rss, client.InNamespace(cb.Namespace), client.MatchingLabels(render.SelectorLabels(cb))); err != nil {
			return "", fmt.Errorf("listing cache-server ReplicaSets: %w", err)
		}
		for i := range rss.Items {
			if metav1.IsControlledBy(&rss.Items[i], workload) {
				owners[string(rss.Items[i].UID)] = true
			}
		}
	} else {
		owners[string(workload.GetUID())] = true
	}
	var ids []string
	for i := range pods.Items {
		p := &pods.Items[i]
		ref := metav1.GetControllerOf(p)
		if ref == nil || !owners[string(ref.UID)] || !p.DeletionTimestamp.IsZero() || !podReady(p) {
			continue
		}
		var restarts int32
		for _, s := range p.Status.ContainerStatuses {
			restarts += s.RestartCount
		}
		ids = append(ids, fmt.Sprintf("%s:%d", p.UID, restarts))
	}
	sort.Strings(ids)
	return strings.Join(ids, ","), nil
}

// serverChanged reports whether a pod of prev is gone or restarted in cur.
// New pods alone (a scale-up) break no connection.
func serverChanged(prev, cur string) bool {
	if prev == "" || cur == "" || prev == cur {
		return false
	}
	now := map[string]bool{}
	for _, id := range strings.Split(cur, ",") {
		now[id] = true
	}
	for _, id := range strings.Split(prev, ",") {
		if !now[id] {
			return true
		}
	}
	return false
}

// rollEngines rolls, once, every Deployment whose pods carry cb's receipt,
// by setting AnnotationServerInstance on its pod template to a hash of inst.
// A Deployment that already carries the value is not touched again.
func (r *CacheBackendReconciler) rollEngines(ctx context.Context, cb *v1alpha1.CacheBackend, inst string) error {
	sum := sha256.Sum256([]byte(inst))
	value := hex.EncodeToString(sum[:8])
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := r.Client.List(ctx, pods, client.InNamespace(cb.Namespace)); err != nil {
		return fmt.Errorf("listing engine pods: %w", err)
	}
	deployments := map[string]bool{}
	for i := range pods.Items {
		a := pods.Items[i].Annotations
		if a[inject.AnnotationInjectedBy] != cb.Namespace+"/"+cb.Name || a[inject.AnnotationInjectedByUID] != string(cb.UID) {
			continue
		}
		ref := metav1.GetControllerOf(&pods.Items[i])
		if ref == nil || ref.Kind != "ReplicaSet" {
			continue
		}
		rs := &appsv1.ReplicaSet{}
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: cb.Namespace, Name: ref.Name}, rs); err != nil {
			continue // gone with a rollout already under way
		}
		if d := metav1.GetControllerOf(rs); d != nil && d.Kind == "Deployment" {
			deployments[d.Name] = true
		}
	}
	var rolled []string
	for name := range deployments {
		dep := &appsv1.Deployment{}
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: cb.Namespace, Name: name}, dep); err != nil {
			continue
		}
		if dep.Spec.Template.Annotations[AnnotationServerInstance] == value {
			continue
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apps/v1", "kind": "Deployment",
			"metadata": map[string]any{"name": name, "namespace": cb.Namespace},
			"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
				"annotations": map[string]any{AnnotationServerInstance: value},
			}}},
		}}
		if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(RolloutManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("rolling engine Deployment %s: %w", name, err)
		}
		Cascades.WithLabelValues(cb.Namespace, cb.Name).Inc()
		rolled = append(rolled, name)
	}
	if len(rolled) > 0 {
		sort.Strings(rolled)
		log.FromContext(ctx).Info("rolled engines after a cache-server change", "deployments", rolled)
		r.Recorder.Eventf(cb, nil, corev1.EventTypeNormal, EventEnginesRestarted, "Rollout",
			"cache server replaced or restarted: rolled engine Deployment(s) %s so they reconnect", strings.Join(rolled, ", "))
	}
	return nil
}
