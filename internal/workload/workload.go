// Package workload is the one place that knows the kinds of workload the
// operator runs or rolls (Deployment, StatefulSet, DaemonSet): each kind is one
// implementation of Server, chosen once, from the spec, by For (or by its
// kind's name, ByKind). Every other package asks the interface (its
// replicas, claim templates, rollout state, serving pods, pod template)
// instead of switching on the object's type. Adding a kind is one new
// implementation and one line in kinds.
package workload

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/topology"
)

// Server is a workload of one kind, live (Object is the object read from
// the cluster) or absent (Object is nil: not created yet, or not
// controlled by the backend).
type Server interface {
	// Kind is the workload's kind, e.g. "StatefulSet".
	Kind() string
	// GroupVersionKind is the kind's API group, version and kind.
	GroupVersionKind() schema.GroupVersionKind
	// ClaimsPerReplica reports whether the kind gives each replica a claim
	// of its own (from claim templates) rather than mounting one shared
	// claim.
	ClaimsPerReplica() bool
	// PerNode reports whether the kind runs one pod per node (engines
	// reach the server of their own node), so that a server change
	// concerns the engines of its node only.
	PerNode() bool
	// New and NewList return an empty object and list of the kind, to
	// read into.
	New() client.Object
	NewList() client.ObjectList
	// Object is the live workload, nil when absent.
	Object() client.Object
	// Replicas is the live workload's spec.replicas (nil when unset or
	// absent).
	Replicas() *int32
	// ClaimTemplates are the live workload's volumeClaimTemplates (nil for
	// a kind without them).
	ClaimTemplates() []corev1.PersistentVolumeClaim
	// PodTemplate is the live workload's pod template, nil when absent.
	PodTemplate() *corev1.PodTemplateSpec
	// Rollout is the live workload's rollout state in the terms the one
	// health verdict (evaluate.Health) reads; nil when absent.
	Rollout() *Rollout
	// ServingPods lists, through r, the non-terminating pods the live
	// workload controls among those labelled selector (Deployment →
	// ReplicaSet → Pod, StatefulSet → Pod). Pods that merely carry the
	// labels are not returned.
	ServingPods(ctx context.Context, r client.Reader, selector map[string]string) ([]corev1.Pod, error)

	// empty returns an absent workload of the kind and the object to read
	// a live one into.
	empty() (Server, client.Object)
	// live returns the workload of obj, ok false when obj is not of this
	// kind.
	live(obj client.Object) (Server, bool)
	// controllerOf and nameOf name the workload of this kind that
	// controls pod (ref is its controller reference), through r or from
	// the pod's metadata alone; ok false when it is not of this kind.
	controllerOf(ctx context.Context, r client.Reader, pod metav1.Object, ref *metav1.OwnerReference) (string, bool, error)
	nameOf(pod metav1.Object, ref *metav1.OwnerReference) (string, bool)
}

// Rollout is a workload's rollout state, kind-neutral.
type Rollout struct {
	// Generation and ObservedGeneration of the workload: the controller of
	// the kind has not observed the current spec while they differ.
	Generation, ObservedGeneration int64
	// Desired is spec.replicas (1 when unset); Updated and Ready count the
	// replicas of the current revision and the ready ones.
	Desired, Updated, Ready int32
	// Serving counts the replicas that serve, as the kind counts them
	// (available for a Deployment, ready for a StatefulSet), and
	// ServingWord names that count in messages.
	Serving     int32
	ServingWord string
	// Available: at least one replica serves, so the endpoint is published.
	Available bool
	// Rolling: replicas of an older revision remain or the new revision is
	// not complete.
	Rolling bool
	// Stalled, when set, is why the rollout stopped progressing for good.
	Stalled string
	// Starting: replicas are still being created one by one, so missing
	// ones are rolling out rather than unavailable.
	Starting bool
}

// kinds are the workload kinds, by name. The first is the default of a
// spec that names none.
var kinds = []Server{&deployment{}, &statefulSet{}, &daemonSet{}}

// ClaimOwner reports whether ref, a claim's controller reference, names the
// workload called name of a kind that makes per-replica claims: such
// claims belong to the backend that owns the workload.
func ClaimOwner(ref *metav1.OwnerReference, name string) bool {
	for _, k := range kinds {
		gvk := k.GroupVersionKind()
		if k.ClaimsPerReplica() && ref.Kind == gvk.Kind && ref.APIVersion == gvk.GroupVersion().String() && ref.Name == name {
			return true
		}
	}
	return false
}

// Kinds returns an absent workload of every kind, in a stable order.
func Kinds() []Server {
	out := make([]Server, len(kinds))
	for i, k := range kinds {
		out[i], _ = k.empty()
	}
	return out
}

// ByKind returns an absent workload of the kind named kind, ok false for a
// kind the operator does not know.
func ByKind(kind string) (Server, bool) {
	for _, k := range kinds {
		if k.Kind() == kind {
			s, _ := k.empty()
			return s, true
		}
	}
	return nil, false
}

// For returns the (absent) server workload of the kind cb's spec asks for:
// a DaemonSet in multiprocess mode (spec.multiprocess), otherwise
// spec.deploymentKind (Deployment when unset). It is the one decision on
// the workload kind.
func For(cb *v1alpha1.CacheBackend) Server {
	if topology.Of(cb) == topology.Multiprocess {
		return &daemonSet{}
	}
	if s, ok := ByKind(string(cb.Spec.DeploymentKind)); ok {
		return s
	}
	s, _ := kinds[0].empty()
	return s
}

// Observed returns cb's server workload holding obj when obj is a live
// workload of the kind cb asks for, absent otherwise (nil, or another
// kind, being pruned).
func Observed(cb *v1alpha1.CacheBackend, obj client.Object) Server {
	s := For(cb)
	if obj == nil {
		return s
	}
	if live, ok := s.live(obj); ok {
		return live
	}
	return s
}

// Read reads cb's server workload (named like cb) through r: live when it
// exists and cb controls it, absent otherwise.
func Read(ctx context.Context, r client.Reader, cb *v1alpha1.CacheBackend) (Server, error) {
	s, obj := For(cb).empty()
	switch err := r.Get(ctx, client.ObjectKeyFromObject(cb), obj); {
	case apierrors.IsNotFound(err):
		return s, nil
	case err != nil:
		return s, fmt.Errorf("reading the cache-server %s: %w", s.Kind(), err)
	case !metav1.IsControlledBy(obj, cb):
		return s, nil
	}
	live, _ := s.live(obj)
	return live, nil
}

// ReadNamed reads the workload of kind named name in namespace through r;
// ok false when the kind is unknown or the workload does not exist.
func ReadNamed(ctx context.Context, r client.Reader, kind, namespace, name string) (Server, bool, error) {
	k, ok := ByKind(kind)
	if !ok {
		return nil, false, nil
	}
	s, obj := k.empty()
	switch err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); {
	case apierrors.IsNotFound(err):
		return s, false, nil
	case err != nil:
		return s, false, fmt.Errorf("reading %s %s/%s: %w", kind, namespace, name, err)
	}
	live, _ := s.live(obj)
	return live, true, nil
}

// desired is spec.replicas, 1 when unset (the API server's default).
func desired(r *int32) int32 {
	if r != nil {
		return *r
	}
	return 1
}

// controlled filters pods to the non-terminating ones whose controller is
// one of owners (UIDs).
func controlled(pods []corev1.Pod, owners map[string]bool) []corev1.Pod {
	var out []corev1.Pod
	for i := range pods {
		ref := metav1.GetControllerOf(&pods[i])
		if ref != nil && owners[string(ref.UID)] && pods[i].DeletionTimestamp.IsZero() {
			out = append(out, pods[i])
		}
	}
	return out
}

// directPods lists the non-terminating pods labelled selector that obj
// controls directly (a StatefulSet's, a DaemonSet's).
func directPods(ctx context.Context, r client.Reader, obj client.Object, selector map[string]string) ([]corev1.Pod, error) {
	pods, err := listPods(ctx, r, obj.GetNamespace(), selector)
	if err != nil {
		return nil, err
	}
	return controlled(pods, map[string]bool{string(obj.GetUID()): true}), nil
}

// directOwner names the workload of kind that controls a pod directly
// (ref is the pod's controller reference).
func directOwner(kind string, ref *metav1.OwnerReference) (string, bool) {
	return ref.Name, ref.Kind == kind
}

func listPods(ctx context.Context, r client.Reader, namespace string, selector map[string]string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels(selector)); err != nil {
		return nil, fmt.Errorf("listing cache-server pods: %w", err)
	}
	return pods.Items, nil
}

// ControllerOf resolves, through r, the workload that controls pod (a
// Deployment through its ReplicaSet, checked by UID; a StatefulSet
// directly). ok is false for a pod of no known kind (a bare pod, a Job's),
// or whose ReplicaSet is gone or is not the one its owner reference names.
func ControllerOf(ctx context.Context, r client.Reader, pod metav1.Object) (kind, name string, ok bool, err error) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return "", "", false, nil
	}
	for _, k := range kinds {
		if name, ok, err := k.controllerOf(ctx, r, pod, ref); err != nil || ok {
			return k.Kind(), name, ok, err
		}
	}
	return "", "", false, nil
}

// NameOf names the workload of pod from its metadata alone, for reports:
// a Deployment's from the name of its ReplicaSet, <name>-<pod-template-hash>.
// Rolls resolve workloads through the API instead (ControllerOf).
func NameOf(pod metav1.Object) (kind, name string, ok bool) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return "", "", false
	}
	for _, k := range kinds {
		if name, ok := k.nameOf(pod, ref); ok {
			return k.Kind(), name, true
		}
	}
	return "", "", false
}
