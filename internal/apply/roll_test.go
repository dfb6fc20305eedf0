package apply

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/rollout"
)

// TestRollWritesTheValue: Roll writes the value on the pod template of
// Deployments and StatefulSets alike, with the rollout field manager, each
// roll of the plan once and in order.
func TestRollWritesTheValue(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(s))
	var kinds []string
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).Build(), interceptor.Funcs{
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			o := &client.ApplyOptions{}
			o.ApplyOptions(opts)
			assert.Equal(t, v1alpha1.FieldManagerRollout, o.FieldManager)
			raw, err := json.Marshal(obj)
			require.NoError(t, err)
			assert.Contains(t, string(raw), `"inferencecache.io/server-instance":"v1"`)
			var m struct{ Kind string }
			require.NoError(t, json.Unmarshal(raw, &m))
			kinds = append(kinds, m.Kind)
			return nil
		},
	})
	rolls := []rollout.Roll{
		{Workload: rollout.Workload{Kind: "Deployment", Name: "fresh"}, Value: "v1", Cause: rollout.CauseServerChange},
		{Workload: rollout.Workload{Kind: "StatefulSet", Name: "fresh"}, Value: "v1", Cause: rollout.CauseAdmittedBeforeEndpoint},
	}
	done, err := Roll(context.Background(), New(c), "llm", rolls)
	require.NoError(t, err)
	assert.Equal(t, rolls, done)
	assert.Equal(t, []string{"Deployment", "StatefulSet"}, kinds)
}

// TestEvictTriesEveryPod: each eviction is conditional on the pod's UID
// (another pod under the name is left alone, no error); a budget that refuses one engine's eviction
// (429) delays no other node's; a pod already gone counts as evicted; the
// refusal comes back as TooManyRequests, naming the pod and node; a
// refusal that RBAC explains (403, and a SelfSubjectAccessReview denies
// pods/eviction create) comes back apart, as no error; any other 403 is an
// error.
func TestEvictTriesEveryPod(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, corev1.AddToScheme(s))
	require.NoError(t, authorizationv1.AddToScheme(s))
	var tried []string
	reviews, rbacAllows := 0, false
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).Build(), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			review := obj.(*authorizationv1.SelfSubjectAccessReview)
			assert.Equal(t, authorizationv1.ResourceAttributes{Namespace: "llm", Verb: "create", Resource: "pods", Subresource: "eviction"}, *review.Spec.ResourceAttributes)
			reviews++
			review.Status.Allowed = rbacAllows
			return nil
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj client.Object, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			require.Equal(t, "eviction", sub)
			ev := subObj.(*policyv1.Eviction)
			require.NotNil(t, ev.DeleteOptions, "the pod's UID is the eviction's precondition")
			assert.Equal(t, types.UID("uid-"+obj.GetName()), *ev.DeleteOptions.Preconditions.UID)
			tried = append(tried, obj.GetName())
			switch obj.GetName() {
			case "engine-a":
				return apierrors.NewTooManyRequestsError("Cannot evict pod as it would violate the pod's disruption budget.")
			case "engine-gone":
				return apierrors.NewNotFound(corev1.Resource("pods"), obj.GetName())
			case "engine-forbidden", "engine-forbidden-too":
				return apierrors.NewForbidden(corev1.Resource("pods/eviction"), obj.GetName(), errors.New(`User "system:serviceaccount:inferencecache-system:inferencecache-operator" cannot create resource "pods/eviction"`))
			case "engine-renamed":
				return apierrors.NewConflict(corev1.Resource("pods"), obj.GetName(), errors.New("Precondition failed: UID in precondition: uid-engine-renamed, UID in object meta: uid-other"))
			}
			return nil
		},
	})
	evictions := []rollout.Eviction{{Pod: "engine-a", UID: "uid-engine-a", Node: "gpu-a"}, {Pod: "engine-b", UID: "uid-engine-b", Node: "gpu-b"},
		{Pod: "engine-gone", UID: "uid-engine-gone", Node: "gpu-c"}, {Pod: "engine-renamed", UID: "uid-engine-renamed", Node: "gpu-d"},
		{Pod: "engine-forbidden", UID: "uid-engine-forbidden", Node: "gpu-e"}, {Pod: "engine-forbidden-too", UID: "uid-engine-forbidden-too", Node: "gpu-e"}}
	done, forbidden, err := Evict(context.Background(), New(c), "llm", evictions)
	assert.Equal(t, []string{"engine-a", "engine-b", "engine-gone", "engine-renamed", "engine-forbidden", "engine-forbidden-too"}, tried)
	assert.Equal(t, evictions[1:3], done, "a pod re-created under the planned name is neither evicted nor an error")
	assert.Equal(t, evictions[4:], forbidden, "a refusal of RBAC is reported apart: no retry changes it")
	assert.Equal(t, 1, reviews, "RBAC is asked once per call")
	require.Error(t, err)
	assert.False(t, apierrors.IsForbidden(err), "%v", err)
	assert.True(t, apierrors.IsTooManyRequests(err), "%v", err)
	assert.Contains(t, err.Error(), "engine pod engine-a on node gpu-a")

	// A 403 that RBAC does not explain (an admission webhook or policy, a
	// namespace being deleted) is an error, retried like a budget's 429.
	tried, reviews, rbacAllows = nil, 0, true
	done, forbidden, err = Evict(context.Background(), New(c), "llm", evictions[4:])
	assert.Empty(t, done)
	assert.Empty(t, forbidden)
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.Contains(t, err.Error(), "engine pod engine-forbidden-too on node gpu-e")
}

// TestRollTriesEveryWorkload: a workload that cannot be written delays no
// other: the others are rolled, and the failure comes back named.
func TestRollTriesEveryWorkload(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(s))
	var written []string
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).Build(), interceptor.Funcs{
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			raw, err := json.Marshal(obj)
			require.NoError(t, err)
			var m struct{ Metadata struct{ Name string } }
			require.NoError(t, json.Unmarshal(raw, &m))
			if m.Metadata.Name == "locked" {
				return apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, "locked", errors.New("denied by a policy"))
			}
			written = append(written, m.Metadata.Name)
			return nil
		},
	})
	roll := func(name string) rollout.Roll {
		return rollout.Roll{Workload: rollout.Workload{Kind: "Deployment", Name: name}, Value: "v1", Cause: rollout.CauseAdmittedBeforeEndpoint}
	}
	done, err := Roll(context.Background(), New(c), "llm", []rollout.Roll{roll("a"), roll("locked"), roll("b")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Deployment/locked")
	assert.True(t, apierrors.IsForbidden(err), "the API's error, wrapped")
	assert.Equal(t, []rollout.Roll{roll("a"), roll("b")}, done)
	assert.Equal(t, []string{"a", "b"}, written)
}
