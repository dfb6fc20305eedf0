package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// TestTamperedStatusEndpoint: issue 13 item 3 through the API server. A
// user allowed to write cachebackends/status (and nothing else of the
// backend) points status.endpoint at another host. No engine pod is ever
// given that host: a pod admitted while the status is tampered is left
// unwired (endpoint-mismatch); the operator restores the status at once
// (a status endpoint change wakes the reconcile), and the next pod gets
// the spec-derived address and a receipt.
func TestTamperedStatusEndpoint(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.ServingBackend(t, ns, "cache")
	want := cb.Status.Endpoint
	require.Equal(t, fmt.Sprintf("lm://cache.%s.svc.cluster.local:65432", ns), want)
	const evil = "lm://collector.attacker.example:65432"

	// A user with status write only, as RBAC grants it.
	require.NoError(t, suite.K8s.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "status-writer"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"cachebackends/status"}, Verbs: []string{"get", "patch", "update"}}},
	}))
	require.NoError(t, suite.K8s.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "status-writer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "status-writer"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "status-writer"}},
	}))
	ucfg := rest.CopyConfig(suite.Cfg)
	ucfg.Impersonate = rest.ImpersonationConfig{UserName: "status-writer"}
	user, err := client.New(ucfg, client.Options{Scheme: suite.Scheme})
	require.NoError(t, err)
	patch := client.RawPatch(types.MergePatchType, []byte(`{"status":{"endpoint":"`+evil+`"}}`))
	target := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache"}}
	require.Error(t, user.Patch(ctx, target, patch), "the user cannot write the spec side")
	// Each tampering, and a pod created right after it: never the other host.
	for i := range 3 {
		require.NoError(t, user.Status().Patch(ctx, target, patch))
		pod := suite.Engine(ns, fmt.Sprintf("engine-%d", i), map[string]string{"app": "engine-cache"}, nil)
		require.NoError(t, suite.K8s.Create(ctx, pod))
		for _, e := range pod.Spec.Containers[0].Env {
			if e.Name == "LMCACHE_REMOTE_URL" {
				assert.Equal(t, want, e.Value, "pod %s: only the spec-derived address is ever injected", pod.Name)
			}
		}
		if !suite.IsWired(pod) {
			assert.Empty(t, pod.Annotations[v1alpha1.AnnotationInjectedBy], "an unwired pod carries no receipt")
		}
	}

	restored := func() error {
		got := suite.GetBackend(t, client.ObjectKeyFromObject(cb))
		if got.Status.Endpoint != want {
			return fmt.Errorf("status.endpoint %q, want %q restored", got.Status.Endpoint, want)
		}
		return nil
	}
	testutil.Eventually(t, 10*time.Second, restored)
	// With no pod event to wake it, the operator restores the status at
	// once too: the status change itself wakes the reconcile (no waiting
	// for a periodic poll).
	time.Sleep(2 * time.Second) // the reconciles the pods woke are done
	require.NoError(t, user.Status().Patch(ctx, target, patch))
	testutil.Eventually(t, 5*time.Second, restored)
	// Once the webhook's cache holds the restored status, pods are wired
	// with the spec-derived address and a receipt.
	var pod *corev1.Pod
	testutil.Eventually(t, 10*time.Second, func() error {
		pod = suite.Engine(ns, fmt.Sprintf("after-%d", time.Now().UnixNano()), map[string]string{"app": "engine-cache"}, nil)
		if err := suite.K8s.Create(ctx, pod); err != nil {
			return err
		}
		if !suite.IsWired(pod) {
			return fmt.Errorf("pod %s not wired yet (the webhook's cache lags the restored status)", pod.Name)
		}
		return nil
	})
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == "LMCACHE_REMOTE_URL" {
			assert.Equal(t, want, e.Value)
		}
	}
	assert.Equal(t, ns+"/cache", pod.Annotations[v1alpha1.AnnotationInjectedBy])
	assert.Equal(t, string(cb.UID), pod.Annotations[v1alpha1.AnnotationInjectedByUID])
	suite.WaitPodEvent(t, ns, pod.Name, "Normal/"+v1alpha1.EventInjected)
}
