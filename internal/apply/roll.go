package apply

import (
	"context"
	"errors"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Rollable is an engine workload to roll: its kind and name in the
// namespace, and the value of AnnotationServerInstance its pod template
// gets (rollout.Roll is one; apply does not import the roll plan, which
// sits above it).
type Rollable interface {
	RollTarget() (kind, name, value string)
}

// Evictable is an engine pod to evict: its name, the UID it must still
// have, and its node (for messages). rollout.Eviction is one.
type Evictable interface {
	EvictTarget() (pod string, uid types.UID, node string)
}

// Roll executes a roll plan (rollout.Decide's rolls): it writes
// AnnotationServerInstance=value on the pod template of each workload of
// namespace, with the rollout field manager, as kubectl rollout restart
// does with its own annotation. The plan leaves out the workloads that
// carry the value already, so a roll happens once per value and survives
// manager restarts. Every roll is tried, so a workload that cannot be
// written delays no other; it returns the rolls written, in order, and the
// failures joined.
func Roll[R Rollable](ctx context.Context, a *Applier, namespace string, rolls []R) ([]R, error) {
	done := make([]R, 0, len(rolls))
	var errs []error
	for _, r := range rolls {
		kind, name, value := r.RollTarget()
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apps/v1", "kind": kind,
			"metadata": map[string]any{"name": name, "namespace": namespace},
			"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
				"annotations": map[string]any{v1alpha1.AnnotationServerInstance: value},
			}}},
		}}
		if err := a.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(v1alpha1.FieldManagerRollout), client.ForceOwnership); err != nil {
			errs = append(errs, fmt.Errorf("rolling engine %s/%s: %w", kind, name, err))
			continue
		}
		done = append(done, r)
	}
	return done, errors.Join(errs...)
}

// Evict executes the evictions of a per-node cascade (rollout.Decide's):
// each engine pod is evicted through the Eviction API, so that its
// PodDisruptionBudget is respected and its controller re-creates it, wired
// again at its CREATE, and only if it is still the pod planned (its UID,
// a precondition). A pod already gone counts as evicted; a pod re-created
// under the same name is left alone. Every eviction is tried, so a budget
// that blocks one node's engines delays no other's. It returns the
// evictions done, in order; those the operator may not make (403, and a
// SelfSubjectAccessReview says RBAC does not allow pods/eviction create
// in namespace: an install without the engine-eviction grant,
// docs/security.md), which no retry would change; and the other refusals
// joined (a budget that allows no disruption now answers 429,
// apierrors.IsTooManyRequests; an admission webhook or policy, or a
// namespace being deleted, 403), which the reconcile retries: the plan
// never evicts a pod created after its node's server started.
func Evict[E Evictable](ctx context.Context, a *Applier, namespace string, evictions []E) (done, forbidden []E, err error) {
	done = make([]E, 0, len(evictions))
	var errs []error
	var allowed *bool
	for _, e := range evictions {
		name, uid, node := e.EvictTarget()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}}
		switch err := a.client.SubResource("eviction").Create(ctx, pod, ev); {
		case apierrors.IsConflict(err):
			// Another pod under that name (the UID precondition failed):
			// the planned one is gone, and the new one is not evicted.
			continue
		case apierrors.IsForbidden(err):
			ok, rerr := a.mayEvict(ctx, namespace, &allowed)
			if rerr == nil && !ok {
				forbidden = append(forbidden, e)
				continue
			}
			errs = append(errs, fmt.Errorf("evicting engine pod %s on node %s: %w", name, node, errors.Join(err, rerr)))
			continue
		case err != nil && !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("evicting engine pod %s on node %s: %w", name, node, err))
			continue
		}
		done = append(done, e)
	}
	return done, forbidden, errors.Join(errs...)
}

// mayEvict asks the API server whether RBAC lets the operator create
// pods/eviction in namespace (a SelfSubjectAccessReview, which every
// authenticated user may create), once per Evict call (*memo).
func (a *Applier) mayEvict(ctx context.Context, namespace string, memo **bool) (bool, error) {
	if *memo != nil {
		return **memo, nil
	}
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "create", Resource: "pods", Subresource: "eviction"}}}
	if err := a.client.Create(ctx, review); err != nil {
		return false, fmt.Errorf("asking whether RBAC allows evictions: %w", err)
	}
	*memo = &review.Status.Allowed
	return review.Status.Allowed, nil
}
