package podsecurity_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/validation"
	"github.com/inferencecache/operator/internal/workload"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// serverPodOf is a pod of the server workload's template rendered with o,
// as the Deployment controller would create it.
func serverPodOf(t *testing.T, cb *v1alpha1.CacheBackend, o render.Options, ns string) *corev1.Pod {
	t.Helper()
	c := render.RenderWith(cb, o)
	require.NotNil(t, c.Deployment)
	raw, err := json.Marshal(c.Deployment.Spec.Template)
	require.NoError(t, err)
	var tmpl corev1.PodTemplateSpec
	require.NoError(t, json.Unmarshal(raw, &tmpl))
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "cache-", Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}
}

// TestServerPodUnderPodSecurity: the API server's Pod Security admission
// judges the rendered server pod (issue 24). A server the operator creates
// gets the hardened defaults and passes "restricted"; so does one whose
// spec sets its own identity. A server created before the defaults keeps
// its template (render.Options.LegacyPod): it passes "baseline" (no host
// namespaces, ports or paths, no privilege, no added capabilities) and
// fails "restricted" until its spec or the workload's
// inferencecache.io/server-pod-defaults annotation opts it in. A spec
// that asks for root passes baseline only.
func TestServerPodUnderPodSecurity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	namespace := func(level string) string {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "psa-" + level + "-",
			Labels: map[string]string{"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"}}}
		require.NoError(t, suite.K8s.Create(ctx, ns))
		return ns.Name
	}
	baseline, restricted := namespace("baseline"), namespace("restricted")
	plain := suite.NewBackend(restricted, "cache")
	ownUser := suite.NewBackend(restricted, "cache")
	ownUser.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Pod: &v1alpha1.ServerPod{
		SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1000)},
	}}}
	root := suite.NewBackend(restricted, "cache")
	root.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Pod: &v1alpha1.ServerPod{
		SecurityContext: &v1alpha1.ServerPodSecurityContext{RunAsNonRoot: ptr.To(false)},
	}}}
	legacy := render.Options{LegacyPod: true}

	assert.NoError(t, suite.K8s.Create(ctx, serverPodOf(t, plain, render.Options{}, restricted), client.DryRunAll), "a new server's default pod passes restricted")
	assert.NoError(t, suite.K8s.Create(ctx, serverPodOf(t, ownUser, render.Options{}, restricted), client.DryRunAll), "with its own user it still passes restricted")
	assert.NoError(t, suite.K8s.Create(ctx, serverPodOf(t, plain, legacy, baseline), client.DryRunAll), "an older server's pod passes baseline")
	err := suite.K8s.Create(ctx, serverPodOf(t, plain, legacy, restricted), client.DryRunAll)
	require.Error(t, err, "an older server's pod fails restricted")
	assert.Contains(t, err.Error(), `violates PodSecurity "restricted:latest"`)
	t.Logf("a server created before the defaults, under restricted: %v", err)
	assert.NoError(t, suite.K8s.Create(ctx, serverPodOf(t, root, render.Options{}, baseline), client.DryRunAll), "a server asked to run as root passes baseline")
	err = suite.K8s.Create(ctx, serverPodOf(t, root, render.Options{}, restricted), client.DryRunAll)
	require.Error(t, err, "and fails restricted")
	assert.Contains(t, err.Error(), "runAsNonRoot != true")
}

// TestServerPodReachesTheDeployment: spec.remoteStorage.lmCacheServer.pod
// through the real API server (the CRD's schema, the validating webhook)
// and the reconcile's server-side apply lands in the Deployment's pod
// template; a toleration the API server's pod validation would refuse is
// refused at admission with its field path.
func TestServerPodReachesTheDeployment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "placed")
	cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Pod: &v1alpha1.ServerPod{
		Labels:            map[string]string{"team": "inference"},
		NodeSelector:      map[string]string{"node-pool": "cpu"},
		Tolerations:       []v1alpha1.ServerToleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "kv", Effect: corev1.TaintEffectNoSchedule}},
		PriorityClassName: "kv-cache",
		ImagePullSecrets:  []v1alpha1.ServerPullSecret{{Name: "regcred"}},
		ContainerSecurityContext: &v1alpha1.ServerContainerSecurityContext{AllowPrivilegeEscalation: ptr.To(false),
			Capabilities: &v1alpha1.ServerCapabilities{Drop: []string{"ALL"}}},
		Affinity: &v1alpha1.ServerAffinity{PodAntiAffinity: &v1alpha1.ServerPodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []v1alpha1.ServerWeightedPodAffinityTerm{{Weight: 50, PodAffinityTerm: v1alpha1.ServerPodAffinityTerm{TopologyKey: "kubernetes.io/hostname"}}}}},
	}}}
	require.NoError(t, suite.K8s.Create(ctx, cb))
	d := suite.WaitDeployment(t, client.ObjectKeyFromObject(cb), func(*appsv1.Deployment) error { return nil })
	spec := d.Spec.Template.Spec
	assert.Equal(t, "inference", d.Spec.Template.Labels["team"])
	assert.Equal(t, map[string]string{"node-pool": "cpu"}, spec.NodeSelector)
	assert.Equal(t, []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "kv", Effect: corev1.TaintEffectNoSchedule}}, spec.Tolerations)
	assert.Equal(t, "kv-cache", spec.PriorityClassName)
	assert.Equal(t, []corev1.LocalObjectReference{{Name: "regcred"}}, spec.ImagePullSecrets)
	require.NotNil(t, spec.Containers[0].SecurityContext)
	assert.Equal(t, []corev1.Capability{"ALL"}, spec.Containers[0].SecurityContext.Capabilities.Drop)
	require.NotNil(t, spec.Affinity, "the affinity reaches the Deployment")
	require.NotNil(t, spec.Affinity.PodAntiAffinity)
	term := spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	require.Len(t, term, 1)
	assert.Equal(t, "kubernetes.io/hostname", term[0].PodAffinityTerm.TopologyKey)
	assert.Equal(t, render.SelectorLabels(cb), term[0].PodAffinityTerm.LabelSelector.MatchLabels, "over the server's own pods")

	bad := suite.NewBackend(ns, "badtoleration")
	bad.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Pod: &v1alpha1.ServerPod{
		Tolerations: []v1alpha1.ServerToleration{{Key: "k", Operator: corev1.TolerationOpExists, Value: "v"}},
	}}}
	err := suite.K8s.Create(ctx, bad, client.DryRunAll)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.remoteStorage.lmCacheServer.pod.tolerations[0].operator")
}

// TestServerCreatedBeforeTheDefaultsKeepsItsPods: upgrading the operator
// restarts no cache server, of either kind. A workload as an operator
// before the hardened defaults left it (its template applied by the
// children's field manager, no inferencecache.io/server-pod-defaults)
// keeps its template through reconciles of the new operator (a replica
// change lands, the template does not move); annotating the workload opts
// it in, and the next reconcile applies the hardened template once. A new
// server's workload keeps its hardened template through reconciles too.
func TestServerCreatedBeforeTheDefaultsKeepsItsPods(t *testing.T) {
	t.Parallel()
	for _, kind := range []v1alpha1.DeploymentKind{v1alpha1.DeploymentKindDeployment, v1alpha1.DeploymentKindStatefulSet} {
		t.Run(string(kind), func(t *testing.T) {
			ctx := context.Background()
			ns := suite.NewNamespace(t)
			cb := suite.NewBackend(ns, "older")
			cb.Spec.DeploymentKind = kind
			key := testutil.StartBackend(t, suite.K8s, cb)
			// read is the live workload once cond holds for it.
			read := func(cond func(obj client.Object, tmpl *corev1.PodTemplateSpec) error) (client.Object, *corev1.PodTemplateSpec) {
				t.Helper()
				var obj client.Object
				var tmpl *corev1.PodTemplateSpec
				testutil.Eventually(t, 15*time.Second, func() error {
					w, err := workload.Read(ctx, suite.K8s, suite.GetBackend(t, key))
					if err != nil {
						return err
					}
					if obj, tmpl = w.Object(), w.PodTemplate(); obj == nil {
						return fmt.Errorf("no %s yet", kind)
					}
					return cond(obj, tmpl)
				})
				return obj, tmpl
			}
			hardened := func(obj client.Object, tmpl *corev1.PodTemplateSpec) error {
				if obj.GetAnnotations()[v1alpha1.AnnotationServerPodDefaults] != v1alpha1.ServerPodDefaultsRestricted {
					return fmt.Errorf("annotations %v", obj.GetAnnotations())
				}
				if sc := tmpl.Spec.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != render.DefaultServerUID {
					return fmt.Errorf("pod security context %+v", sc)
				}
				return nil
			}
			_, createdTmpl := read(hardened)
			// A reconcile of a change outside the template (the replica
			// count) keeps the template hardened.
			suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
				cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Replicas: ptr.To[int32](3)}}
			})
			created, tmpl := read(func(obj client.Object, tmpl *corev1.PodTemplateSpec) error {
				if r := workload.Observed(suite.GetBackend(t, key), obj).Replicas(); r == nil || *r != 3 {
					return fmt.Errorf("replicas %v", r)
				}
				return hardened(obj, tmpl)
			})
			assert.Equal(t, *createdTmpl, *tmpl, "a new server keeps its template through reconciles")

			// What an older operator applied: the legacy render, by the same
			// field manager, so the fields it no longer names are dropped.
			objs, err := render.Objects(render.RenderWith(suite.GetBackend(t, key), render.Options{LegacyPod: true}))
			require.NoError(t, err)
			for _, o := range objs {
				if o.GetKind() == string(kind) {
					require.NoError(t, suite.K8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(v1alpha1.FieldManagerChildren), client.ForceOwnership))
				}
			}
			old, oldTmpl := read(func(obj client.Object, tmpl *corev1.PodTemplateSpec) error {
				// The API server defaults an empty pod security context.
				if sc := tmpl.Spec.SecurityContext; (sc != nil && sc.RunAsNonRoot != nil) || obj.GetAnnotations()[v1alpha1.AnnotationServerPodDefaults] != "" {
					return fmt.Errorf("still hardened: %v %+v", obj.GetAnnotations(), sc)
				}
				return nil
			})
			require.Greater(t, old.GetGeneration(), created.GetGeneration())

			// A reconcile of the new operator: the replica count changes, the
			// template does not.
			suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
				cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Replicas: ptr.To[int32](2)}}
			})
			scaled, scaledTmpl := read(func(obj client.Object, _ *corev1.PodTemplateSpec) error {
				w := workload.Observed(suite.GetBackend(t, key), obj)
				if r := w.Replicas(); r == nil || *r != 2 {
					return fmt.Errorf("replicas %v", r)
				}
				return nil
			})
			assert.Equal(t, *oldTmpl, *scaledTmpl, "the older server's pod template is kept")
			assert.Empty(t, scaled.GetAnnotations()[v1alpha1.AnnotationServerPodDefaults])
			assert.Nil(t, scaledTmpl.Spec.Containers[0].Resources.Requests, "no default resources either")

			// Opting in by hand: the next reconcile hardens the template.
			patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+v1alpha1.AnnotationServerPodDefaults+`":"`+v1alpha1.ServerPodDefaultsRestricted+`"}}}`))
			require.NoError(t, suite.K8s.Patch(ctx, scaled, patch))
			_, tmpl = read(hardened)
			assert.Equal(t, render.DefaultResources().Limits, tmpl.Spec.Containers[0].Resources.Limits)
			assert.Equal(t, []corev1.Capability{"ALL"}, tmpl.Spec.Containers[0].SecurityContext.Capabilities.Drop)
		})
	}
}

// TestAffinityRefusedAsTheAPIServerRefusesIt: for each affinity the CRD's
// schema admits, the validating webhook's rules refuse it exactly when the
// API server refuses the Deployment render makes of it, at the same field
// (the path under affinity), so a refused affinity never reaches a
// workload apply that would fail.
func TestAffinityRefusedAsTheAPIServerRefusesIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	req := func(key string, op corev1.NodeSelectorOperator, values ...string) *v1alpha1.ServerAffinity {
		return &v1alpha1.ServerAffinity{NodeAffinity: &v1alpha1.ServerNodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1alpha1.ServerNodeSelector{
			NodeSelectorTerms: []v1alpha1.ServerNodeSelectorTerm{{MatchExpressions: []v1alpha1.ServerNodeSelectorRequirement{{Key: key, Operator: op, Values: values}}}}}}}
	}
	anti := func(key string) *v1alpha1.ServerAffinity {
		return &v1alpha1.ServerAffinity{PodAntiAffinity: &v1alpha1.ServerPodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []v1alpha1.ServerPodAffinityTerm{{TopologyKey: key}}}}
	}
	for _, tc := range []struct {
		name string
		a    *v1alpha1.ServerAffinity
	}{
		{"In with values", req("node-pool", corev1.NodeSelectorOpIn, "a", "b")},
		{"In without values", req("node-pool", corev1.NodeSelectorOpIn)},
		{"NotIn without values", req("node-pool", corev1.NodeSelectorOpNotIn)},
		{"Exists", req("example.com/gpu", corev1.NodeSelectorOpExists)},
		{"DoesNotExist with a value", req("gpu", corev1.NodeSelectorOpDoesNotExist, "x")},
		{"Gt one value", req("cpus", corev1.NodeSelectorOpGt, "8")},
		{"Lt two values", req("cpus", corev1.NodeSelectorOpLt, "8", "9")},
		{"Gt no value", req("cpus", corev1.NodeSelectorOpGt)},
		{"a key with a bad prefix", req("Bad_Prefix/pool", corev1.NodeSelectorOpExists)},
		{"a key with two slashes", req("a/b/c", corev1.NodeSelectorOpExists)},
		{"anti-affinity per host", anti("kubernetes.io/hostname")},
		{"anti-affinity with a bad key", anti("host name")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := suite.NewBackend(ns, "cache")
			cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Pod: &v1alpha1.ServerPod{Affinity: tc.a}}}
			ours := validation.Validate(cb)
			u, err := render.Objects(render.Render(cb))
			require.NoError(t, err)
			var d appsv1.Deployment
			for _, o := range u {
				if o.GetKind() == "Deployment" {
					raw, err := json.Marshal(o.Object)
					require.NoError(t, err)
					require.NoError(t, json.Unmarshal(raw, &d))
				}
			}
			d.OwnerReferences = nil
			theirs := suite.K8s.Create(ctx, &d, client.DryRunAll)
			if theirs == nil {
				assert.Empty(t, ours, "the API server admits the Deployment")
				return
			}
			require.NotEmpty(t, ours, "the API server refuses the Deployment: %v", theirs)
			_, under, ok := strings.Cut(ours[0].Field, ".affinity.")
			require.True(t, ok, ours[0].Field)
			assert.Contains(t, theirs.Error(), "spec.template.spec.affinity."+under, "the same field")
			t.Logf("webhook: %s; API server: %v", ours[0].Error(), theirs)
		})
	}
}

// TestMPWorkloadUnderTheAPIServer: the multiprocess server's DaemonSet and
// node-local Service (render.MPDaemonSet, render.MPService; issue 23's
// groundwork, not applied by the reconcile yet) are valid objects to the
// real API server, and the DaemonSet's pod, with its disk tier's ephemeral
// volume, passes Pod Security "restricted" (so "baseline" too): isolated
// IPC needs no host namespace and the disk is no hostPath.
func TestMPWorkloadUnderTheAPIServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "psa-mp-",
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}
	require.NoError(t, suite.K8s.Create(ctx, ns))
	cb := suite.NewBackend(ns.Name, "cache")
	s := render.MPServer{Port: 5555, HTTPPort: 8080, L1SizeGiB: 20, EvictionPolicy: "LRU", WatermarkPercent: 80, RatioPercent: 20,
		RESP: &render.MPRESP{Host: "redis", Port: 6379, CapacityGiB: 1, Credentials: "redis-auth", UsernameKey: "username", PasswordKey: "password"},
		Disk: &render.MPDisk{Path: "/var/lib/lmcache/l2", CapacityGiB: 10, StorageClassName: ptr.To("local-nvme")}}
	asTyped := func(ac, obj any) {
		raw, err := json.Marshal(ac)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(raw, obj))
	}
	var ds appsv1.DaemonSet
	asTyped(render.MPDaemonSet(cb, s), &ds)
	ds.OwnerReferences = nil
	require.NoError(t, suite.K8s.Create(ctx, &ds, client.DryRunAll), "the API server admits the DaemonSet")
	var svc corev1.Service
	asTyped(render.MPService(cb, s), &svc)
	svc.OwnerReferences = nil
	require.NoError(t, suite.K8s.Create(ctx, &svc, client.DryRunAll), "and the node-local Service")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, GenerateName: "cache-", Labels: ds.Spec.Template.Labels}, Spec: ds.Spec.Template.Spec}
	assert.NoError(t, suite.K8s.Create(ctx, pod, client.DryRunAll), "its pod passes Pod Security restricted")
}
