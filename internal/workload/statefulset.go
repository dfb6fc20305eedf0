package workload

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// statefulSet is the StatefulSet kind; s is nil when absent.
type statefulSet struct{ s *appsv1.StatefulSet }

func (w *statefulSet) Kind() string { return "StatefulSet" }

func (w *statefulSet) GroupVersionKind() schema.GroupVersionKind {
	return appsv1.SchemeGroupVersion.WithKind(w.Kind())
}

func (w *statefulSet) PerNode() bool { return false }

func (w *statefulSet) ClaimsPerReplica() bool { return true }

func (w *statefulSet) New() client.Object { return &appsv1.StatefulSet{} }

func (w *statefulSet) NewList() client.ObjectList { return &appsv1.StatefulSetList{} }

func (w *statefulSet) Object() client.Object {
	if w.s == nil {
		return nil
	}
	return w.s
}

func (w *statefulSet) Replicas() *int32 {
	if w.s == nil {
		return nil
	}
	return w.s.Spec.Replicas
}

func (w *statefulSet) ClaimTemplates() []corev1.PersistentVolumeClaim {
	if w.s == nil {
		return nil
	}
	return w.s.Spec.VolumeClaimTemplates
}

func (w *statefulSet) PodTemplate() *corev1.PodTemplateSpec {
	if w.s == nil {
		return nil
	}
	return &w.s.Spec.Template
}

func (w *statefulSet) empty() (Server, client.Object) {
	return &statefulSet{}, w.New()
}

func (w *statefulSet) live(obj client.Object) (Server, bool) {
	s, ok := obj.(*appsv1.StatefulSet)
	return &statefulSet{s: s}, ok && s != nil
}

// Rollout reads the StatefulSet controller's status: the rollout is
// complete when every replica runs the update revision; the controller
// creates replicas one by one, so missing ones are still starting until
// every replica existed once.
func (w *statefulSet) Rollout() *Rollout {
	if w.s == nil {
		return nil
	}
	s, st := w.s, w.s.Status
	r := &Rollout{Generation: s.Generation, ObservedGeneration: st.ObservedGeneration, Desired: desired(s.Spec.Replicas),
		Updated: st.UpdatedReplicas, Ready: st.ReadyReplicas, Serving: st.ReadyReplicas, ServingWord: "ready",
		Available: st.AvailableReplicas > 0 || st.ReadyReplicas > 0}
	r.Rolling = st.UpdatedReplicas < r.Desired || (st.UpdateRevision != "" && st.CurrentRevision != st.UpdateRevision)
	r.Starting = st.Replicas < r.Desired || st.CurrentReplicas < r.Desired
	return r
}

// ServingPods lists the pods the StatefulSet controls.
func (w *statefulSet) ServingPods(ctx context.Context, r client.Reader, selector map[string]string) ([]corev1.Pod, error) {
	if w.s == nil {
		return nil, nil
	}
	return directPods(ctx, r, w.s, selector)
}

// controllerOf: a StatefulSet controls its pods directly.
func (w *statefulSet) controllerOf(_ context.Context, _ client.Reader, _ metav1.Object, ref *metav1.OwnerReference) (string, bool, error) {
	name, ok := directOwner(w.Kind(), ref)
	return name, ok, nil
}

func (w *statefulSet) nameOf(_ metav1.Object, ref *metav1.OwnerReference) (string, bool) {
	return directOwner(w.Kind(), ref)
}
