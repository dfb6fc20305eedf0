package render_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
)

// TestServerPodDefaults: each hardened default fills only what the spec
// leaves unset, the identity fields as one, and the spec is not changed.
func TestServerPodDefaults(t *testing.T) {
	uid := render.DefaultServerUID
	for _, tc := range []struct {
		name    string
		in      *v1alpha1.ServerPod
		pod     v1alpha1.ServerPodSecurityContext
		ctr     v1alpha1.ServerContainerSecurityContext
		sameOut bool // the spec already says everything
	}{
		{"nothing set: all defaults", nil,
			v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: &uid, RunAsGroup: &uid, SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			v1alpha1.ServerContainerSecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &v1alpha1.ServerCapabilities{Drop: []string{"ALL"}}}, false},
		{"a user ID of its own keeps the image's group and no runAsNonRoot",
			&v1alpha1.ServerPod{SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsUser: ptr.To[int64](1000)}},
			v1alpha1.ServerPodSecurityContext{RunAsUser: ptr.To[int64](1000), SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			v1alpha1.ServerContainerSecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &v1alpha1.ServerCapabilities{Drop: []string{"ALL"}}}, false},
		{"runAsNonRoot false on the container: root stays possible",
			&v1alpha1.ServerPod{ContainerSecurityContext: &v1alpha1.ServerContainerSecurityContext{RunAsNonRoot: ptr.To(false)}},
			v1alpha1.ServerPodSecurityContext{SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			v1alpha1.ServerContainerSecurityContext{RunAsNonRoot: ptr.To(false), AllowPrivilegeEscalation: ptr.To(false), Capabilities: &v1alpha1.ServerCapabilities{Drop: []string{"ALL"}}}, false},
		{"a container seccomp profile is not doubled on the pod; own capabilities kept",
			&v1alpha1.ServerPod{ContainerSecurityContext: &v1alpha1.ServerContainerSecurityContext{
				SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeUnconfined},
				Capabilities:   &v1alpha1.ServerCapabilities{Drop: []string{"NET_RAW"}}, AllowPrivilegeEscalation: ptr.To(true)}},
			v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: &uid, RunAsGroup: &uid},
			v1alpha1.ServerContainerSecurityContext{AllowPrivilegeEscalation: ptr.To(true), Capabilities: &v1alpha1.ServerCapabilities{Drop: []string{"NET_RAW"}},
				SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}, false},
		{"everything set: nothing added",
			&v1alpha1.ServerPod{SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](7), SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
				ContainerSecurityContext: &v1alpha1.ServerContainerSecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &v1alpha1.ServerCapabilities{}}},
			v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](7), SeccompProfile: &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			v1alpha1.ServerContainerSecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &v1alpha1.ServerCapabilities{}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.in.DeepCopy()
			out := render.ServerPodDefaults(tc.in)
			assert.Equal(t, tc.pod, *out.SecurityContext)
			assert.Equal(t, tc.ctr, *out.ContainerSecurityContext)
			assert.Equal(t, before, tc.in, "the spec itself is unchanged")
			if tc.sameOut {
				assert.Equal(t, tc.in, out)
			}
		})
	}
}

// TestOptionsFor: only a live workload without the defaults' annotation
// renders as before them; no workload (a new server) and one the operator
// created with them (or one opted in by hand) get them.
func TestOptionsFor(t *testing.T) {
	var none *appsv1.Deployment
	assert.False(t, render.OptionsFor(nil).LegacyPod, "no workload")
	assert.False(t, render.OptionsFor(none).LegacyPod, "a typed nil workload")
	assert.True(t, render.OptionsFor(&appsv1.Deployment{}).LegacyPod, "created before the defaults")
	assert.True(t, render.OptionsFor(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationServerPodDefaults: "something-else"}}}).LegacyPod)
	assert.False(t, render.OptionsFor(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationServerPodDefaults: v1alpha1.ServerPodDefaultsRestricted}}}).LegacyPod)
}

// TestDefaultResources: a spec without resources gets the defaults, one
// with any resources keeps exactly its own, and an older server neither.
func TestDefaultResources(t *testing.T) {
	cb := load(t, "testdata/minimal.yaml")
	c := render.Render(cb).Deployment.Spec.Template.Spec.Containers[0]
	require.NotNil(t, c.Resources)
	assert.Equal(t, render.DefaultResources().Requests, *c.Resources.Requests)
	assert.Equal(t, render.DefaultResources().Limits, *c.Resources.Limits)
	assert.Nil(t, render.RenderWith(cb, render.Options{LegacyPod: true}).Deployment.Spec.Template.Spec.Containers[0].Resources)

	own := cb.DeepCopy()
	own.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Resources: &corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: render.DefaultServerMemoryLimit}}}}
	c = render.Render(own).Deployment.Spec.Template.Spec.Containers[0]
	assert.Equal(t, own.Spec.RemoteStorage.LMCacheServer.Resources.Requests, *c.Resources.Requests)
	assert.Nil(t, c.Resources.Limits, "no default limit under the spec's own request")
}

// TestRenderedWorkloadsReadBackAsRendered: the workload of every kind and
// case, rendered for a new server and for an older one, reads back through
// OptionsFor (as the next reconcile reads the live object) with the
// options it was rendered with; otherwise the next reconcile would flip
// its template (as a StatefulSet without the mark once did: the hardened
// template on create, the old one at generation 2).
func TestRenderedWorkloadsReadBackAsRendered(t *testing.T) {
	var n int
	for _, in := range inputs(t) {
		for _, o := range []render.Options{{}, {LegacyPod: true}} {
			objs, err := render.Objects(render.RenderWith(load(t, in), o))
			require.NoError(t, err)
			for _, u := range objs {
				if u.GetKind() != "Deployment" && u.GetKind() != "StatefulSet" {
					continue
				}
				n++
				assert.Equal(t, o, render.OptionsFor(u), "%s %s rendered with %+v", in, u.GetKind(), o)
			}
		}
	}
	assert.GreaterOrEqual(t, n, 4, "both kinds, both options")
}

// TestServerPodsMountNoAPIToken (issue 35): a new server's pods, of every
// kind (Deployment, StatefulSet, the multiprocess DaemonSet), do not mount
// the namespace's ServiceAccount token; a server created before the
// hardened defaults keeps its template as it was.
func TestServerPodsMountNoAPIToken(t *testing.T) {
	for _, in := range []string{"testdata/minimal.yaml", "testdata/statefulset.yaml", "testdata/multiprocess.yaml"} {
		t.Run(in, func(t *testing.T) {
			cb := load(t, in)
			children := render.Render(cb)
			var spec *corev1ac.PodSpecApplyConfiguration
			switch {
			case children.Deployment != nil:
				spec = children.Deployment.Spec.Template.Spec
			case children.StatefulSet != nil:
				spec = children.StatefulSet.Spec.Template.Spec
			case children.DaemonSet != nil:
				spec = children.DaemonSet.Spec.Template.Spec
			}
			require.NotNil(t, spec)
			require.NotNil(t, spec.AutomountServiceAccountToken, "automountServiceAccountToken is set")
			assert.False(t, *spec.AutomountServiceAccountToken)
			if children.DaemonSet == nil {
				legacy := render.RenderWith(cb, render.Options{LegacyPod: true})
				if legacy.Deployment != nil {
					assert.Nil(t, legacy.Deployment.Spec.Template.Spec.AutomountServiceAccountToken, "an older server's template is unchanged")
				} else {
					assert.Nil(t, legacy.StatefulSet.Spec.Template.Spec.AutomountServiceAccountToken, "an older server's template is unchanged")
				}
			}
		})
	}
}
