package gitops

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
)

const indexName = v1alpha1.IndexService

// TestIndexInEveryOverlay: every overlay installs the KV-block index in
// the operator's namespace: two restricted replicas probed on :8081, a
// Service on the ports routers and the manager use, a headless Service
// on the gRPC port for the sidecars (the manager's default), a
// PodDisruptionBudget, and a ServiceAccount whose only permission is
// system:auth-delegator (TokenReview and SubjectAccessReview).
func TestIndexInEveryOverlay(t *testing.T) {
	overlays, err := filepath.Glob("../../kustomize/overlays/*")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(overlays), 2)
	for _, dir := range overlays {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			objs := build(t, dir)
			find := func(kind, name string) *unstructured.Unstructured {
				for _, o := range objs {
					if o.GetKind() == kind && o.GetName() == name {
						return o
					}
				}
				t.Fatalf("no %s %s in %s", kind, name, dir)
				return nil
			}
			d := convert[appsv1.Deployment](t, find("Deployment", indexName))
			assert.Equal(t, operatorNamespace, d.Namespace)
			require.NotNil(t, d.Spec.Replicas)
			assert.EqualValues(t, 2, *d.Spec.Replicas)
			assert.Equal(t, indexName, d.Spec.Template.Spec.ServiceAccountName)
			ps := d.Spec.Template.Spec.SecurityContext
			require.NotNil(t, ps)
			assert.Equal(t, true, *ps.RunAsNonRoot)
			assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, ps.SeccompProfile.Type)
			require.Len(t, d.Spec.Template.Spec.Containers, 1)
			c := d.Spec.Template.Spec.Containers[0]
			assert.Equal(t, "ghcr.io/inferencecache/inferencecache-cache-index", imageName(c.Image), "the image make image builds, make push publishes and build-installer pins")
			sc := c.SecurityContext
			require.NotNil(t, sc)
			assert.Equal(t, false, *sc.AllowPrivilegeEscalation)
			assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
			assert.Equal(t, true, *sc.ReadOnlyRootFilesystem)
			assert.Nil(t, sc.Privileged)
			for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
				require.NotNil(t, p)
				require.NotNil(t, p.HTTPGet)
				port := slices.IndexFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.HTTPGet.Port.StrVal })
				require.GreaterOrEqual(t, port, 0)
				assert.EqualValues(t, 8081, c.Ports[port].ContainerPort)
			}
			assert.Contains(t, c.Args, "--store=memory")
			assert.Contains(t, c.Args, "--auth=tokenreview")
			assert.Contains(t, c.Args, "--audience="+v1alpha1.IndexTokenAudience, "the audience of the sidecars' projected token")
			assert.Contains(t, c.Args, "--cluster-reader=system:serviceaccount:inferencecache-system:inferencecache-operator")
			assert.NotNil(t, c.Resources.Limits.Memory())

			svc := convert[corev1.Service](t, find("Service", indexName))
			assert.Equal(t, operatorNamespace, svc.Namespace)
			ports := map[string]int32{}
			for _, p := range svc.Spec.Ports {
				assert.Equal(t, corev1.ProtocolTCP, p.Protocol, "protocol is set (list-map key)")
				ports[p.Name] = p.Port
			}
			assert.Equal(t, map[string]int32{"grpc": v1alpha1.IndexGRPCPort, "http": v1alpha1.IndexHTTPPort}, ports)
			assert.True(t, labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)))
			assert.NotEqual(t, corev1.ClusterIPNone, svc.Spec.ClusterIP, "routers and the operator reach one virtual IP")

			// The sidecars' address: a headless Service resolving to every
			// ready replica, so each replica is streamed every pod.
			peers := convert[corev1.Service](t, find("Service", v1alpha1.IndexPeersService))
			assert.Equal(t, operatorNamespace, peers.Namespace)
			assert.Equal(t, corev1.ClusterIPNone, peers.Spec.ClusterIP)
			assert.False(t, peers.Spec.PublishNotReadyAddresses, "ready replicas only")
			require.Len(t, peers.Spec.Ports, 1)
			assert.Equal(t, corev1.ServicePort{Name: "grpc", Port: v1alpha1.IndexGRPCPort, TargetPort: intstr.FromString("grpc"),
				Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To("grpc")}, peers.Spec.Ports[0])
			assert.Equal(t, svc.Spec.Selector, peers.Spec.Selector)
			assert.Equal(t, "grpc", c.Ports[slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == v1alpha1.IndexGRPCPort })].Name)
			for _, o := range objs {
				if o.GetKind() == "Deployment" && o.GetName() == "inferencecache-operator" {
					args := convert[appsv1.Deployment](t, o).Spec.Template.Spec.Containers[0].Args
					assert.False(t, slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--kvindex-endpoint") }),
						"the manager's default, the headless Service, reaches the sidecars")
				}
			}

			pdb := convert[policyv1.PodDisruptionBudget](t, find("PodDisruptionBudget", indexName))
			require.NotNil(t, pdb.Spec.MinAvailable)
			assert.Equal(t, 1, pdb.Spec.MinAvailable.IntValue())
			assert.Equal(t, d.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels)

			find("ServiceAccount", indexName)
			var indexBindings []*unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
					continue
				}
				b := convert[rbacv1.ClusterRoleBinding](t, o)
				for _, s := range b.Subjects {
					if s.Kind == "ServiceAccount" && s.Name == indexName {
						indexBindings = append(indexBindings, o)
					}
				}
			}
			// Least privilege: TokenReview/SubjectAccessReview through the
			// built-in auth-delegator, and reading CacheBackends
			// (--require-backend), nothing else.
			require.Len(t, indexBindings, 2, "least privilege: two bindings for the index")
			refs := map[string]bool{}
			for _, o := range indexBindings {
				b := convert[rbacv1.ClusterRoleBinding](t, o)
				assert.Equal(t, "ClusterRoleBinding", o.GetKind())
				assert.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: indexName, Namespace: operatorNamespace}}, b.Subjects)
				assert.Equal(t, "ClusterRole", b.RoleRef.Kind)
				refs[b.RoleRef.Name] = true
			}
			assert.Equal(t, map[string]bool{"system:auth-delegator": true, indexName + "-cachebackends": true}, refs)
			reader := convert[rbacv1.ClusterRole](t, find("ClusterRole", indexName+"-cachebackends"))
			assert.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{"inferencecache.io"}, Resources: []string{"cachebackends"}, Verbs: []string{"get", "list", "watch"}}}, reader.Rules,
				"the index reads CacheBackends and writes nothing")
			for _, o := range objs {
				assert.False(t, (o.GetKind() == "ClusterRole" || o.GetKind() == "Role") && o.GetName() == indexName, "no role of its own")
			}
		})
	}
}

// TestIndexRedisComponent: the component switches the index to Redis and
// leaves the rest of it alone.
func TestIndexRedisComponent(t *testing.T) {
	var args []string
	n := 0
	objs := build(t, "testdata/index-redis")
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetName() == indexName {
			n++
			args = convert[appsv1.Deployment](t, o).Spec.Template.Spec.Containers[0].Args
		}
	}
	require.Equal(t, 1, n)
	assert.Contains(t, args, "--store=redis")
	assert.NotContains(t, args, "--store=memory")
	assert.True(t, slices.ContainsFunc(args, func(a string) bool {
		return strings.HasPrefix(a, "--redis-address=") && len(a) > len("--redis-address=")
	}))
	assert.Contains(t, args, "--audience="+v1alpha1.IndexTokenAudience)
	// One shared store: the sidecars stream to one replica through the
	// ClusterIP Service instead of every replica through the headless one.
	var managerArgs []string
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetName() == "inferencecache-operator" {
			managerArgs = convert[appsv1.Deployment](t, o).Spec.Template.Spec.Containers[0].Args
		}
	}
	assert.Contains(t, managerArgs, fmt.Sprintf("--kvindex-endpoint=%s.%s.svc.cluster.local:%d", indexName, operatorNamespace, v1alpha1.IndexGRPCPort))
}

func imageName(image string) string {
	for i := len(image) - 1; i >= 0; i-- {
		switch image[i] {
		case '@', ':':
			return imageName(image[:i])
		case '/':
			return image
		}
	}
	return image
}

// TestSGLangRouterComponent: the component serves SGLang's router query
// for one CacheBackend on a port of its own: the index's argument, a
// named container port, the Service's port, and a NetworkPolicy that
// lets only pods labelled as SGLang routers reach it (the listener has no
// authentication).
func TestSGLangRouterComponent(t *testing.T) {
	objs := build(t, "testdata/sglang-router")
	var d *appsv1.Deployment
	var svc *corev1.Service
	var np []*networkingv1.NetworkPolicy
	for _, o := range objs {
		switch {
		case o.GetKind() == "Deployment" && o.GetName() == indexName:
			d = convert[appsv1.Deployment](t, o)
		case o.GetKind() == "Service" && o.GetName() == indexName:
			svc = convert[corev1.Service](t, o)
		case o.GetKind() == "NetworkPolicy":
			np = append(np, convert[networkingv1.NetworkPolicy](t, o))
		}
	}
	require.NotNil(t, d)
	require.NotNil(t, svc)
	c := d.Spec.Template.Spec.Containers[0]
	assert.Contains(t, c.Args, "--sglang-kv-indexer=default/qwen-hicache=:50051", "the example's SGLang CacheBackend")
	assert.Contains(t, c.Ports, corev1.ContainerPort{Name: "sglang-router", ContainerPort: 50051, Protocol: corev1.ProtocolTCP})
	assert.True(t, slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Port == 50051 && p.TargetPort == intstr.FromString("sglang-router")
	}), "Service ports %v", svc.Spec.Ports)
	// Which policies admit the port, and from whom.
	var from []networkingv1.NetworkPolicyPeer
	for _, p := range np {
		if !labels.SelectorFromSet(p.Spec.PodSelector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		for _, in := range p.Spec.Ingress {
			if slices.ContainsFunc(in.Ports, func(pp networkingv1.NetworkPolicyPort) bool {
				return pp.Port != nil && *pp.Port == intstr.FromString("sglang-router")
			}) {
				from = append(from, in.From...)
			}
		}
	}
	require.Len(t, from, 1, "one peer may reach the unauthenticated listener")
	assert.Equal(t, map[string]string{"inferencecache.io/sglang-router": "true"}, from[0].PodSelector.MatchLabels)
}
