package workload

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// deployment is the Deployment kind; d is nil when absent.
type deployment struct{ d *appsv1.Deployment }

func (w *deployment) Kind() string { return "Deployment" }

func (w *deployment) GroupVersionKind() schema.GroupVersionKind {
	return appsv1.SchemeGroupVersion.WithKind(w.Kind())
}

func (w *deployment) PerNode() bool { return false }

func (w *deployment) ClaimsPerReplica() bool { return false }

func (w *deployment) New() client.Object { return &appsv1.Deployment{} }

func (w *deployment) NewList() client.ObjectList { return &appsv1.DeploymentList{} }

func (w *deployment) Object() client.Object {
	if w.d == nil {
		return nil
	}
	return w.d
}

func (w *deployment) Replicas() *int32 {
	if w.d == nil {
		return nil
	}
	return w.d.Spec.Replicas
}

func (w *deployment) ClaimTemplates() []corev1.PersistentVolumeClaim { return nil }

func (w *deployment) PodTemplate() *corev1.PodTemplateSpec {
	if w.d == nil {
		return nil
	}
	return &w.d.Spec.Template
}

func (w *deployment) empty() (Server, client.Object) {
	return &deployment{}, w.New()
}

func (w *deployment) live(obj client.Object) (Server, bool) {
	d, ok := obj.(*appsv1.Deployment)
	return &deployment{d: d}, ok && d != nil
}

// Rollout reads the Deployment controller's status: the rollout is complete
// when the Progressing condition says NewReplicaSetAvailable and no replica
// of an older ReplicaSet remains; it stalled on ProgressDeadlineExceeded.
func (w *deployment) Rollout() *Rollout {
	if w.d == nil {
		return nil
	}
	d, st := w.d, w.d.Status
	r := &Rollout{Generation: d.Generation, ObservedGeneration: st.ObservedGeneration, Desired: desired(d.Spec.Replicas),
		Updated: st.UpdatedReplicas, Ready: st.ReadyReplicas, Serving: st.AvailableReplicas, ServingWord: "available"}
	var prog *appsv1.DeploymentCondition
	for i := range st.Conditions {
		c := &st.Conditions[i]
		switch c.Type {
		case appsv1.DeploymentProgressing:
			prog = c
		case appsv1.DeploymentAvailable:
			r.Available = st.AvailableReplicas > 0 && c.Status == corev1.ConditionTrue
		}
	}
	if prog != nil && prog.Status == corev1.ConditionFalse && prog.Reason == "ProgressDeadlineExceeded" {
		r.Stalled = fmt.Sprintf("Deployment rollout stopped progressing: %s", prog.Message)
	}
	r.Rolling = st.UpdatedReplicas < r.Desired || st.Replicas > st.UpdatedReplicas || (prog != nil && prog.Reason != "NewReplicaSetAvailable")
	return r
}

// ServingPods lists the pods of the Deployment's ReplicaSets.
func (w *deployment) ServingPods(ctx context.Context, r client.Reader, selector map[string]string) ([]corev1.Pod, error) {
	if w.d == nil {
		return nil, nil
	}
	pods, err := listPods(ctx, r, w.d.Namespace, selector)
	if err != nil {
		return nil, err
	}
	var rss appsv1.ReplicaSetList
	if err := r.List(ctx, &rss, client.InNamespace(w.d.Namespace), client.MatchingLabels(selector)); err != nil {
		return nil, fmt.Errorf("listing cache-server ReplicaSets: %w", err)
	}
	owners := map[string]bool{}
	for i := range rss.Items {
		if metav1.IsControlledBy(&rss.Items[i], w.d) {
			owners[string(rss.Items[i].UID)] = true
		}
	}
	return controlled(pods, owners), nil
}

// controllerOf reads the pod's ReplicaSet (as metadata) for its Deployment.
func (w *deployment) controllerOf(ctx context.Context, r client.Reader, pod metav1.Object, ref *metav1.OwnerReference) (string, bool, error) {
	if ref.Kind != "ReplicaSet" {
		return "", false, nil
	}
	rs := &metav1.PartialObjectMetadata{}
	rs.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))
	if err := r.Get(ctx, client.ObjectKey{Namespace: pod.GetNamespace(), Name: ref.Name}, rs); err != nil {
		if apierrors.IsNotFound(err) {
			return "", false, nil // gone with a rollout already under way
		}
		return "", false, fmt.Errorf("reading ReplicaSet %s/%s: %w", pod.GetNamespace(), ref.Name, err)
	}
	if rs.UID != ref.UID {
		return "", false, nil
	}
	if d := metav1.GetControllerOf(rs); d != nil && d.Kind == w.Kind() {
		return d.Name, true, nil
	}
	return "", false, nil
}

// nameOf strips the pod-template hash from the ReplicaSet's name.
func (w *deployment) nameOf(pod metav1.Object, ref *metav1.OwnerReference) (string, bool) {
	hash := pod.GetLabels()[appsv1.DefaultDeploymentUniqueLabelKey]
	if ref.Kind != "ReplicaSet" || hash == "" || !strings.HasSuffix(ref.Name, "-"+hash) {
		return "", false
	}
	return strings.TrimSuffix(ref.Name, "-"+hash), true
}
