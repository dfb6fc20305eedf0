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

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/rollout"
)

// Roll executes a roll plan (rollout.Rolls): it writes
// AnnotationServerInstance=value on the pod template of each workload of
// namespace, with the rollout field manager, as kubectl rollout restart
// does with its own annotation. The plan leaves out the workloads that
// carry the value already, so a roll happens once per value and survives
// manager restarts. Every roll is tried, so a workload that cannot be
// written delays no other; it returns the rolls written, in order, and the
// failures joined.
func (a *Applier) Roll(ctx context.Context, namespace string, rolls []rollout.Roll) ([]rollout.Roll, error) {
	done := make([]rollout.Roll, 0, len(rolls))
	var errs []error
	for _, r := range rolls {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apps/v1", "kind": r.Workload.Kind,
			"metadata": map[string]any{"name": r.Workload.Name, "namespace": namespace},
			"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
				"annotations": map[string]any{v1alpha1.AnnotationServerInstance: r.Value},
			}}},
		}}
		if err := a.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(v1alpha1.FieldManagerRollout), client.ForceOwnership); err != nil {
			errs = append(errs, fmt.Errorf("rolling engine %s: %w", r.Workload, err))
			continue
		}
		done = append(done, r)
	}
	return done, errors.Join(errs...)
}

// Evict executes the evictions of a per-node cascade (rollout.RollsPerNode):
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
func (a *Applier) Evict(ctx context.Context, namespace string, evictions []rollout.Eviction) (done, forbidden []rollout.Eviction, err error) {
	done = make([]rollout.Eviction, 0, len(evictions))
	var errs []error
	var allowed *bool
	for _, e := range evictions {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: e.Pod}}
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: e.Pod},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &e.UID}}}
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
			errs = append(errs, fmt.Errorf("evicting engine pod %s on node %s: %w", e.Pod, e.Node, errors.Join(err, rerr)))
			continue
		case err != nil && !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("evicting engine pod %s on node %s: %w", e.Pod, e.Node, err))
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
