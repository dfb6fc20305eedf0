package controller_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
)

// serverPodOf is a pod of the rendered server workload's template, as the
// Deployment controller would create it.
func serverPodOf(t *testing.T, cb *v1alpha1.CacheBackend, ns string) *corev1.Pod {
	t.Helper()
	c := render.Render(cb)
	require.NotNil(t, c.Deployment)
	raw, err := json.Marshal(c.Deployment.Spec.Template)
	require.NoError(t, err)
	var tmpl corev1.PodTemplateSpec
	require.NoError(t, json.Unmarshal(raw, &tmpl))
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "cache-", Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}
}

// TestServerPodUnderPodSecurity: the API server's Pod Security admission
// judges the rendered server pod (issue 24). As the operator renders it by
// default it passes "baseline" (no host namespaces, ports or paths, no
// privilege, no added capabilities) and fails "restricted" (no
// runAsNonRoot, seccomp profile or dropped capabilities: the default
// image's user is not known to be non-root, and adding them by default
// would restart every running server on upgrade); with
// spec.remoteStorage.lmCacheServer.pod's security contexts it passes
// "restricted".
func TestServerPodUnderPodSecurity(t *testing.T) {
	ctx := context.Background()
	namespace := func(level string) string {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "psa-" + level + "-",
			Labels: map[string]string{"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"}}}
		require.NoError(t, k8s.Create(ctx, ns))
		return ns.Name
	}
	baseline, restricted := namespace("baseline"), namespace("restricted")
	plain := newBackend(baseline, "cache")
	hardened := newBackend(restricted, "cache")
	hardened.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Pod: &v1alpha1.ServerPod{
		SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1000),
			SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		ContainerSecurityContext: &v1alpha1.ServerContainerSecurityContext{AllowPrivilegeEscalation: ptr.To(false),
			Capabilities: &v1alpha1.ServerCapabilities{Drop: []string{"ALL"}}},
	}}}

	assert.NoError(t, k8s.Create(ctx, serverPodOf(t, plain, baseline), client.DryRunAll), "the default server pod passes baseline")
	err := k8s.Create(ctx, serverPodOf(t, plain, restricted), client.DryRunAll)
	require.Error(t, err, "the default server pod fails restricted")
	assert.Contains(t, err.Error(), `violates PodSecurity "restricted:latest"`)
	t.Logf("default server pod under restricted: %v", err)
	assert.NoError(t, k8s.Create(ctx, serverPodOf(t, hardened, restricted), client.DryRunAll), "the hardened server pod passes restricted")
}
