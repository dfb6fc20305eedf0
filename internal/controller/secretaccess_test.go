package controller_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/test/integration/suite"
)

// TestCacheBackendNamesOnlySecretsItsAuthorMayRead: issue 35, through
// the API server with impersonated users. Both may edit CacheBackends;
// only alice (through a group) may get the Secret redis-auth. Mallory's
// CacheBackend naming it, as the RESP credentials, an engine override's
// value or an image pull secret, is refused with the field path; her edit
// of alice's backend that leaves the reference alone is admitted, and one
// that sends the credentials to another host is refused.
func TestCacheBackendNamesOnlySecretsItsAuthorMayRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	require.NoError(t, suite.K8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "redis-auth"},
		StringData: map[string]string{"password": "s3cret", "other": "x"}}))
	role := func(name string, rule rbacv1.PolicyRule, subjects ...rbacv1.Subject) {
		require.NoError(t, suite.K8s.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: []rbacv1.PolicyRule{rule}}))
		require.NoError(t, suite.K8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subjects}))
	}
	role("cachebackend-edit", rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"cachebackends"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"},
		rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"})
	role("redis-auth-read", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"redis-auth"}, Verbs: []string{"get"}},
		rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "redis-readers"})
	as := func(user string, groups ...string) client.Client {
		c := rest.CopyConfig(suite.Cfg)
		c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
		cl, err := client.New(c, client.Options{Scheme: suite.Scheme})
		require.NoError(t, err)
		return cl
	}
	alice, mallory := as("alice", "redis-readers"), as("mallory")
	require.Error(t, mallory.Get(ctx, client.ObjectKey{Namespace: ns, Name: "redis-auth"}, &corev1.Secret{}), "mallory may not read the Secret")

	withRESP := func(name string) *v1alpha1.CacheBackend {
		cb := suite.NewBackend(ns, name)
		suite.MP(cb).L2 = &v1alpha1.MultiprocessL2{RESP: &v1alpha1.MultiprocessRESP{Host: "redis.cache.svc", Capacity: resource.MustParse("1Gi"),
			CredentialsSecretRef: &v1alpha1.RESPCredentials{Name: "redis-auth"}}}
		return cb
	}
	const credentials = "spec.multiprocess.l2.resp.credentialsSecretRef.name"
	refused := func(t *testing.T, err error, path string) {
		t.Helper()
		require.Error(t, err)
		assert.Contains(t, err.Error(), path)
		assert.Contains(t, err.Error(), `user "mallory" may not get Secret "redis-auth"`)
	}

	require.NoError(t, alice.Create(ctx, withRESP("alices")), "alice may read the Secret")
	t.Run("mallory names the Secret", func(t *testing.T) {
		refused(t, mallory.Create(ctx, withRESP("mallorys")), credentials)
		env := suite.NewBackend(ns, "env")
		env.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{OptIn: &v1alpha1.OptInOverrides{Env: []corev1.EnvVar{
			{Name: "A", Value: "a"},
			{Name: "STOLEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "redis-auth"}, Key: "password"}}}}}}
		refused(t, mallory.Create(ctx, env, client.DryRunAll), "spec.integration.engineOverrides.optIn.env[1].valueFrom.secretKeyRef.name")
		require.NoError(t, alice.Create(ctx, env, client.DryRunAll))
		pull := suite.NewBackend(ns, "pull")
		pull.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Pod: &v1alpha1.ServerPod{
			ImagePullSecrets: []v1alpha1.ServerPullSecret{{Name: "redis-auth"}}}}}
		refused(t, mallory.Create(ctx, pull, client.DryRunAll), "spec.remoteStorage.lmCacheServer.pod.imagePullSecrets[0].name")
		require.NoError(t, mallory.Create(ctx, suite.NewBackend(ns, "plain"), client.DryRunAll), "a backend naming no Secret")
	})

	update := func(c client.Client, mutate func(*v1alpha1.CacheBackend)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cb := &v1alpha1.CacheBackend{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "alices"}, cb); err != nil {
				return err
			}
			mutate(cb)
			return c.Update(ctx, cb)
		})
	}
	t.Run("mallory edits alice's backend", func(t *testing.T) {
		require.NoError(t, update(mallory, func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels["tier"] = "gold"
			cb.Spec.Multiprocess.L2.RESP.Capacity = resource.MustParse("2Gi")
		}), "an edit that leaves the reference alone")
		refused(t, update(mallory, func(cb *v1alpha1.CacheBackend) { cb.Spec.Multiprocess.L2.RESP.Host = "collector.attacker.example" }), credentials)
		refused(t, update(mallory, func(cb *v1alpha1.CacheBackend) { cb.Spec.Multiprocess.L2.RESP.Port = 6380 }), credentials)
		refused(t, update(mallory, func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Multiprocess.L2.RESP.CredentialsSecretRef.PasswordKey = "other"
		}), credentials)
		require.NoError(t, update(alice, func(cb *v1alpha1.CacheBackend) { cb.Spec.Multiprocess.L2.RESP.Host = "redis-2.cache.svc" }))
	})
}
