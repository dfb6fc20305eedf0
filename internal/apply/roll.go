package apply

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// InstanceHash is the value of AnnotationServerInstance for a server
// instance identity: a short hash, so the annotation does not grow with the
// replica count.
func InstanceHash(inst string) string {
	sum := sha256.Sum256([]byte(inst))
	return hex.EncodeToString(sum[:8])
}

// RollEngines rolls, once, every Deployment whose pods carry cb's receipt,
// by applying AnnotationServerInstance=InstanceHash(inst) on its pod
// template with the rollout field manager, as kubectl rollout restart does
// with its own annotation. A Deployment that already carries the value is
// not touched again, so a roll is idempotent across manager restarts.
// Pods are listed through c (metadata), ReplicaSets and Deployments read
// through r. It returns the names of the rolled Deployments, sorted.
func (a *Applier) RollEngines(ctx context.Context, r client.Reader, cb *v1alpha1.CacheBackend, inst string) ([]string, error) {
	value := InstanceHash(inst)
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := a.client.List(ctx, pods, client.InNamespace(cb.Namespace)); err != nil {
		return nil, fmt.Errorf("listing engine pods: %w", err)
	}
	deployments := map[string]bool{}
	for i := range pods.Items {
		an := pods.Items[i].Annotations
		if an[v1alpha1.AnnotationInjectedBy] != cb.Namespace+"/"+cb.Name || an[v1alpha1.AnnotationInjectedByUID] != string(cb.UID) {
			continue
		}
		ref := metav1.GetControllerOf(&pods.Items[i])
		if ref == nil || ref.Kind != "ReplicaSet" {
			continue
		}
		rs := &appsv1.ReplicaSet{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: cb.Namespace, Name: ref.Name}, rs); err != nil {
			continue // gone with a rollout already under way
		}
		if d := metav1.GetControllerOf(rs); d != nil && d.Kind == "Deployment" {
			deployments[d.Name] = true
		}
	}
	var rolled []string
	for name := range deployments {
		dep := &appsv1.Deployment{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: cb.Namespace, Name: name}, dep); err != nil {
			continue
		}
		if dep.Spec.Template.Annotations[v1alpha1.AnnotationServerInstance] == value {
			continue
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apps/v1", "kind": "Deployment",
			"metadata": map[string]any{"name": name, "namespace": cb.Namespace},
			"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
				"annotations": map[string]any{v1alpha1.AnnotationServerInstance: value},
			}}},
		}}
		if err := a.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(v1alpha1.FieldManagerRollout), client.ForceOwnership); err != nil {
			return rolled, fmt.Errorf("rolling engine Deployment %s: %w", name, err)
		}
		rolled = append(rolled, name)
	}
	sort.Strings(rolled)
	return rolled, nil
}
