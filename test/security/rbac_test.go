// Package security holds the security regression tests that need a real
// API server: the bundle's RBAC, exercised by impersonating the operator's
// ServiceAccount.
package security

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/cli"
)

const operatorNamespace = "inferencecache-system"

// TestOperatorRBACThroughTheAPIServer installs the production bundle's
// RBAC on a real API server and acts as the operator's ServiceAccount:
// what issue 13 forbids is forbidden, what the operator needs is allowed.
func TestOperatorRBACThroughTheAPIServer(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = os.Getenv("CONTROLPLANE_DIR")
	}
	require.NotEmpty(t, assets, "set KUBEBUILDER_ASSETS (or CONTROLPLANE_DIR) to the control-plane binaries (make controlplane)")
	env := &envtest.Environment{BinaryAssetsDirectory: assets,
		CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{"../../kustomize/base/crd"}, ErrorIfPathMissing: true}}
	cfg, err := env.Start()
	require.NoError(t, err, "the API server accepts the CRD with its CEL size rules (within the cost budget)")
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	ctx := context.Background()
	t.Run("CRD bounds strings and the total size of engineOverrides", func(t *testing.T) {
		require.NoError(t, admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "crd"}}))
		cb := func(name string, args []string, env ...corev1.EnvVar) *v1alpha1.CacheBackend {
			return &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "crd", Name: name},
				Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
					Integration: v1alpha1.Integration{EngineOverrides: &v1alpha1.EngineOverrides{Args: args, Env: env}}}}
		}
		require.NoError(t, admin.Create(ctx, cb("small", []string{"--max-model-len=4096"}, corev1.EnvVar{Name: "A", Value: "b"})))
		assert.True(t, apierrors.IsInvalid(admin.Create(ctx, cb("long-arg", []string{strings.Repeat("x", 4097)}))))
		assert.True(t, apierrors.IsInvalid(admin.Create(ctx, cb("long-env", nil, corev1.EnvVar{Name: "A", Value: strings.Repeat("x", 16385)}))))
		var env []corev1.EnvVar
		for i := range 8 {
			env = append(env, corev1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: strings.Repeat("x", 16000)})
		}
		err := admin.Create(ctx, cb("too-much", nil, env...))
		assert.True(t, apierrors.IsInvalid(err), "128 KB of env in total: %v", err)
		split := cb("too-much-with-opt-in", nil, env[:4]...)
		split.Spec.Integration.EngineOverrides.OptIn = &v1alpha1.OptInOverrides{Env: env[4:]}
		err = admin.Create(ctx, split)
		assert.True(t, apierrors.IsInvalid(err), "64 KB of env and 64 KB under optIn: %v", err)
	})

	objs, err := cli.ReadFile("../../kustomize/overlays/production", true)
	require.NoError(t, err)
	for _, ns := range []string{operatorNamespace, "tenant"} {
		require.NoError(t, admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			require.NoError(t, admin.Create(ctx, o), "%s %s", o.GetKind(), o.GetName())
		}
	}
	for _, s := range []string{"inferencecache-receipt-key", "inferencecache-webhook-cert", "someone-elses"} {
		require.NoError(t, admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: s}}))
	}
	require.NoError(t, admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "db"}}))

	as := rest.CopyConfig(cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + operatorNamespace + ":inferencecache-operator"}
	op, err := client.New(as, client.Options{Scheme: scheme})
	require.NoError(t, err)

	secret := func(ns, name string) error {
		return op.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Secret{})
	}
	assert.NoError(t, secret(operatorNamespace, "inferencecache-receipt-key"), "its receipt key")
	assert.NoError(t, secret(operatorNamespace, "inferencecache-webhook-cert"), "its webhook certificate")
	assert.True(t, apierrors.IsForbidden(secret(operatorNamespace, "someone-elses")), "Secrets only by name")
	assert.True(t, apierrors.IsForbidden(secret("tenant", "db")), "no Secret of another namespace")
	assert.True(t, apierrors.IsForbidden(op.List(ctx, &corev1.SecretList{}, client.InNamespace(operatorNamespace))), "no listing Secrets")

	lease := func(ns string) error {
		return op.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inferencecache-operator.inferencecache.io"}})
	}
	assert.NoError(t, lease(operatorNamespace), "the leader-election Lease in its namespace")
	assert.True(t, apierrors.IsForbidden(lease("tenant")), "no Lease elsewhere")
	assert.True(t, apierrors.IsForbidden(lease("kube-system")), "no Lease in kube-system")

	// Multiprocess mode's per-node cascade evicts engine pods (never
	// deletes them), through the engine-eviction grant; an install without
	// it (kustomize/components/without-engine-eviction) is refused.
	evict := func(name string) error {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
		require.NoError(t, admin.Create(ctx, pod))
		return op.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: name}})
	}
	assert.True(t, apierrors.IsForbidden(op.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "engine-0"}})), "no pod delete")
	assert.NoError(t, evict("engine-0"), "evicts an engine pod")
	require.NoError(t, admin.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "inferencecache-operator-engine-eviction"}}))
	require.Eventually(t, func() bool {
		err := op.SubResource("eviction").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "engine-1"}},
			&policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "engine-1"}})
		return apierrors.IsForbidden(err)
	}, 10*time.Second, 100*time.Millisecond, "without the engine-eviction binding, evictions are refused")
	assert.True(t, apierrors.IsForbidden(evict("engine-2")), "without the engine-eviction binding")

	// The KV-block index's ServiceAccount: TokenReview and
	// SubjectAccessReview for its callers (system:auth-delegator), and
	// nothing of the cluster's objects.
	ixCfg := rest.CopyConfig(cfg)
	ixCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + operatorNamespace + ":inferencecache-index"}
	ix, err := client.New(ixCfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	assert.NoError(t, ix.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: "not-a-token", Audiences: []string{v1alpha1.IndexTokenAudience}}}), "reviews its callers' tokens")
	assert.NoError(t, ix.Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: "someone",
		ResourceAttributes: &authzv1.ResourceAttributes{Verb: "get", Resource: "pods"}}}), "asks the API server about its callers")
	assert.True(t, apierrors.IsForbidden(ix.List(ctx, &corev1.PodList{})), "no pods")
	assert.True(t, apierrors.IsForbidden(ix.List(ctx, &corev1.SecretList{}, client.InNamespace(operatorNamespace))), "no Secrets")
	assert.NoError(t, ix.List(ctx, &v1alpha1.CacheBackendList{}), "reads CacheBackends, to refuse ingest for one that does not exist")
	assert.True(t, apierrors.IsForbidden(ix.Create(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "x"},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache}})), "writes no CacheBackend")
	assert.True(t, apierrors.IsForbidden(ix.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: operatorNamespace, Name: "x"}})), "writes nothing")
}
