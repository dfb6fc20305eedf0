package workload

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// daemonSet is the DaemonSet kind (the node-local servers of LMCache's
// multiprocess mode); d is nil when absent. It has no replica count of
// its own: one pod runs on each node its template selects.
type daemonSet struct{ d *appsv1.DaemonSet }

func (w *daemonSet) Kind() string { return "DaemonSet" }

func (w *daemonSet) GroupVersionKind() schema.GroupVersionKind {
	return appsv1.SchemeGroupVersion.WithKind(w.Kind())
}

func (w *daemonSet) ClaimsPerReplica() bool { return false }

func (w *daemonSet) PerNode() bool { return true }

func (w *daemonSet) New() client.Object { return &appsv1.DaemonSet{} }

func (w *daemonSet) NewList() client.ObjectList { return &appsv1.DaemonSetList{} }

func (w *daemonSet) Object() client.Object {
	if w.d == nil {
		return nil
	}
	return w.d
}

// Replicas is nil: a DaemonSet has no spec.replicas.
func (w *daemonSet) Replicas() *int32 { return nil }

func (w *daemonSet) ClaimTemplates() []corev1.PersistentVolumeClaim { return nil }

func (w *daemonSet) PodTemplate() *corev1.PodTemplateSpec {
	if w.d == nil {
		return nil
	}
	return &w.d.Spec.Template
}

func (w *daemonSet) empty() (Server, client.Object) {
	return &daemonSet{}, w.New()
}

func (w *daemonSet) live(obj client.Object) (Server, bool) {
	d, ok := obj.(*appsv1.DaemonSet)
	return &daemonSet{d: d}, ok && d != nil
}

// Rollout reads the DaemonSet controller's status: Desired is the number
// of nodes that should run a server, Serving those whose server is
// available; the rollout is under way while some node runs an older
// template or has no server yet.
func (w *daemonSet) Rollout() *Rollout {
	if w.d == nil {
		return nil
	}
	d, st := w.d, w.d.Status
	r := &Rollout{Generation: d.Generation, ObservedGeneration: st.ObservedGeneration, Desired: st.DesiredNumberScheduled,
		Updated: st.UpdatedNumberScheduled, Ready: st.NumberReady, Serving: st.NumberAvailable, ServingWord: "available",
		Available: st.NumberAvailable > 0}
	r.Rolling = st.UpdatedNumberScheduled < st.DesiredNumberScheduled || st.CurrentNumberScheduled < st.DesiredNumberScheduled
	return r
}

// ServingPods lists the pods the DaemonSet controls.
func (w *daemonSet) ServingPods(ctx context.Context, r client.Reader, selector map[string]string) ([]corev1.Pod, error) {
	if w.d == nil {
		return nil, nil
	}
	return directPods(ctx, r, w.d, selector)
}

// controllerOf: a DaemonSet controls its pods directly.
func (w *daemonSet) controllerOf(_ context.Context, _ client.Reader, _ metav1.Object, ref *metav1.OwnerReference) (string, bool, error) {
	name, ok := directOwner(w.Kind(), ref)
	return name, ok, nil
}

func (w *daemonSet) nameOf(_ metav1.Object, ref *metav1.OwnerReference) (string, bool) {
	return directOwner(w.Kind(), ref)
}
