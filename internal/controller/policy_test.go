package controller_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/rollout"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// TestOperatorWritePolicy: issue 13 item 7's ValidatingAdmissionPolicy,
// as the bundle ships it, through the API server. Impersonating the
// bundle's ServiceAccount with the bundle's ClusterRole: an update of a
// Service no CacheBackend controls is denied, of an owned one allowed; on
// a Deployment or DaemonSet it does not own, the rollout annotation on the
// pod template is allowed and an image change denied. The per-node
// cascade's eviction of an engine pod is forbidden by role.yaml alone
// (apply.Evict reports it apart, no error) and allowed once the
// engine-eviction grant is bound; deleting the pod stays forbidden.
func TestOperatorWritePolicy(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	raw, err := os.ReadFile(filepath.Join("..", "..", "kustomize", "base", "policy", "operator-writes.yaml"))
	require.NoError(t, err)
	docs := strings.Split(string(raw), "\n---\n")
	require.Len(t, docs, 2)
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	require.NoError(t, yaml.UnmarshalStrict([]byte(docs[0]), policy))
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	require.NoError(t, yaml.UnmarshalStrict([]byte(docs[1]), binding))
	require.NoError(t, suite.K8s.Create(ctx, policy))
	t.Cleanup(func() { _ = suite.K8s.Delete(ctx, policy) })
	require.NoError(t, suite.K8s.Create(ctx, binding))
	t.Cleanup(func() { _ = suite.K8s.Delete(ctx, binding) })

	// The operator's ClusterRole, bound to a ServiceAccount of that name.
	role := &rbacv1.ClusterRole{}
	raw, err = os.ReadFile(filepath.Join("..", "..", "kustomize", "base", "rbac", "role.yaml"))
	require.NoError(t, err)
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		r := &rbacv1.ClusterRole{}
		require.NoError(t, yaml.Unmarshal([]byte(doc), r))
		if r.Kind == "ClusterRole" {
			role = r
		}
	}
	require.NotEmpty(t, role.Rules)
	role.Name = "policy-test-" + ns
	require.NoError(t, suite.K8s.Create(ctx, role))
	t.Cleanup(func() { _ = suite.K8s.Delete(ctx, role) })
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "inferencecache-operator"}},
	}
	require.NoError(t, suite.K8s.Create(ctx, crb))
	t.Cleanup(func() { _ = suite.K8s.Delete(ctx, crb) })
	ocfg := rest.CopyConfig(suite.Cfg)
	ocfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":inferencecache-operator",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	operator, err := client.New(ocfg, client.Options{Scheme: suite.Scheme})
	require.NoError(t, err)

	cb := suite.ServingBackend(t, ns, "cache")
	foreignSvc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "database"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "database"},
			Ports: []corev1.ServicePort{{Port: 5432, TargetPort: intstr.FromInt32(5432), Protocol: corev1.ProtocolTCP}}},
	}
	require.NoError(t, suite.K8s.Create(ctx, foreignSvc))
	engineDep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vllm"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "engine-cache"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "engine-cache"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai:v1"}}},
			},
		},
	}
	require.NoError(t, suite.K8s.Create(ctx, engineDep))

	merge := func(s string) client.Patch { return client.RawPatch(types.MergePatchType, []byte(s)) }
	denied := func(err error) error {
		if err == nil {
			return fmt.Errorf("allowed")
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "inferencecache operator may write only") {
			return fmt.Errorf("not denied by the policy: %w", err)
		}
		return nil
	}
	// The policy takes effect once the API server has loaded it: wait with
	// a dry run (admission runs, nothing is stored), so that a write the
	// API server still allows meanwhile does not change the Service.
	testutil.Eventually(t, 20*time.Second, func() error {
		return denied(operator.Patch(ctx, foreignSvc.DeepCopy(), merge(`{"spec":{"selector":{"app":"cache"}}}`), client.DryRunAll))
	})
	require.NoError(t, denied(operator.Patch(ctx, foreignSvc.DeepCopy(), merge(`{"spec":{"selector":{"app":"cache"}}}`))), "a foreign Service's selector")
	live := &corev1.Service{}
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(foreignSvc), live))
	assert.Equal(t, map[string]string{"app": "database"}, live.Spec.Selector)

	owned := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cb.Name}}
	assert.NoError(t, operator.Patch(ctx, owned, merge(`{"metadata":{"annotations":{"policy-test":"owned"}}}`)), "an owned Service")

	assert.NoError(t, operator.Patch(ctx, engineDep.DeepCopy(),
		merge(`{"spec":{"template":{"metadata":{"annotations":{"inferencecache.io/server-instance":"abc"}}}}}`)), "the rollout annotation")
	assert.NoError(t, denied(operator.Patch(ctx, engineDep.DeepCopy(),
		merge(`{"spec":{"template":{"spec":{"containers":[{"name":"vllm","image":"attacker/vllm:latest"}]}}}}`))), "an image change")
	assert.NoError(t, denied(operator.Patch(ctx, engineDep.DeepCopy(),
		merge(`{"spec":{"template":{"metadata":{"annotations":{"inferencecache.io/server-instance":"def","other":"x"}}}}}`))), "another template annotation")
	assert.NoError(t, denied(operator.Delete(ctx, foreignSvc.DeepCopy())), "deleting a foreign Service")
	engineDS := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vllm-per-node"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "engine-ds"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "engine-ds"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai:v1"}}},
			},
		},
	}
	require.NoError(t, suite.K8s.Create(ctx, engineDS))
	assert.NoError(t, operator.Patch(ctx, engineDS.DeepCopy(),
		merge(`{"spec":{"template":{"metadata":{"annotations":{"inferencecache.io/server-instance":"abc"}}}}}`)), "the rollout annotation on a DaemonSet")
	assert.NoError(t, denied(operator.Patch(ctx, engineDS.DeepCopy(),
		merge(`{"spec":{"template":{"spec":{"containers":[{"name":"vllm","image":"attacker/vllm:latest"}]}}}}`))), "an image change of a DaemonSet")
	assert.NoError(t, denied(operator.Delete(ctx, engineDS.DeepCopy())), "deleting a foreign DaemonSet")

	engine := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "engine-0"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai:v1"}}}}
	require.NoError(t, suite.K8s.Create(ctx, engine))
	// role.yaml alone does not grant evictions: the cascade's evictions
	// come back as forbidden, no error (not retried), and the pod stays.
	evict := []rollout.Eviction{{Pod: engine.Name, UID: engine.UID, Node: "gpu-a"}}
	done, forbidden, err := apply.Evict(ctx, apply.New(operator), ns, evict)
	require.NoError(t, err)
	assert.Empty(t, done)
	assert.Equal(t, evict, forbidden, "without the engine-eviction grant")
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(engine), &corev1.Pod{}))
	// With the engine-eviction grant as the bundle ships it: evicted.
	grant := &rbacv1.ClusterRole{}
	raw, err = os.ReadFile(filepath.Join("..", "..", "kustomize", "base", "rbac", "engine_eviction.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal([]byte(strings.Split(string(raw), "\n---\n")[0]), grant))
	require.Equal(t, controller.EngineEvictionClusterRole, grant.Name)
	grant.Name = "policy-test-eviction-" + ns
	require.NoError(t, suite.K8s.Create(ctx, grant))
	t.Cleanup(func() { _ = suite.K8s.Delete(ctx, grant) })
	grantBinding := crb.DeepCopy()
	grantBinding.ObjectMeta = metav1.ObjectMeta{Name: grant.Name}
	grantBinding.RoleRef.Name = grant.Name
	require.NoError(t, suite.K8s.Create(ctx, grantBinding))
	t.Cleanup(func() { _ = suite.K8s.Delete(ctx, grantBinding) })
	assert.True(t, apierrors.IsForbidden(operator.Delete(ctx, engine.DeepCopy())), "deleting an engine pod stays forbidden")
	testutil.Eventually(t, 10*time.Second, func() error {
		done, forbidden, err := apply.Evict(ctx, apply.New(operator), ns, evict)
		if err != nil || len(forbidden) > 0 || len(done) != 1 {
			return fmt.Errorf("done %v, forbidden %v, err %w", done, forbidden, err)
		}
		return nil
	})

	dep := &appsv1.Deployment{}
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(engineDep), dep))
	assert.Equal(t, "vllm/vllm-openai:v1", dep.Spec.Template.Spec.Containers[0].Image)
	assert.Equal(t, "abc", dep.Spec.Template.Annotations["inferencecache.io/server-instance"])
}
