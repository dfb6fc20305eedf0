package e2e

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
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/test/testutil"
)

// gpuTaint keeps every pod but those that tolerate it off the GPU nodes of
// the multiprocess test, as on a real cluster, so the other tests' pods
// stay on kwok-node-0.
var gpuTaint = corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}

// gpuNodes adds kwok nodes labelled gpu=true and tainted gpuTaint, waits
// until they are Ready and untainted by the node-lifecycle controller, and
// removes them when the test ends.
func gpuNodes(t *testing.T, names ...string) {
	t.Helper()
	gpuNodesOf(t, "256Gi", names...)
}

// gpuNodesOf is gpuNodes with memory as the nodes' memory capacity.
func gpuNodesOf(t *testing.T, memory string, names ...string) {
	t.Helper()
	ctx := context.Background()
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse(memory), corev1.ResourcePods: resource.MustParse("110")}
	for _, n := range names {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n,
				Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
				Labels:      map[string]string{"type": "kwok", "gpu": "true", "kubernetes.io/hostname": n, "kubernetes.io/os": "linux"}},
			Spec:   corev1.NodeSpec{Taints: []corev1.Taint{gpuTaint}},
			Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
		}
		require.NoError(t, k8s.Create(ctx, node))
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), node) })
	}
	testutil.Eventually(t, 60*time.Second, func() error {
		for _, n := range names {
			node := &corev1.Node{}
			if err := k8s.Get(ctx, client.ObjectKey{Name: n}, node); err != nil {
				return err
			}
			for _, taint := range node.Spec.Taints {
				if taint.Key != gpuTaint.Key {
					return fmt.Errorf("node %s still tainted %s", n, taint.Key)
				}
			}
		}
		return nil
	})
}

// mpBackend is a multiprocess CacheBackend whose servers run on the GPU
// nodes (nodeSelector gpu=true, tolerating gpuTaint) and wire the pods
// labelled app=mp-engine.
const mpBackend = `apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata:
  name: mp-cache
spec:
  type: LMCache
  engineSelector:
    matchLabels: {app: mp-engine}
  multiprocess:
    l1: {size: 1Gi}
    engineSharedMemory: 2Gi
  remoteStorage:
    lmCacheServer:
      pod:
        nodeSelector: {gpu: "true"}
        tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
`

// mpEngine is one vLLM engine Deployment spread over both GPU nodes, one
// pod on each.
const mpEngine = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: mp-engine
spec:
  replicas: 2
  selector:
    matchLabels: {app: mp-engine}
  template:
    metadata:
      labels: {app: mp-engine}
    spec:
      nodeSelector: {gpu: "true"}
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: mp-engine}}}
      containers:
      - name: vllm
        image: vllm/vllm-openai:v0.33.0
        command: [vllm, serve]
        args: [Qwen/Qwen2.5-0.5B-Instruct]
`

// TestMultiprocessUnderBaselineRollsOnlyTheNodesEngines: in a namespace
// that enforces Pod Security baseline, a multiprocess CacheBackend gets one
// server pod per selected GPU node (the DaemonSet, admitted by baseline),
// reports each node's server in status.multiprocess and publishes the
// node-local Service's tcp:// endpoint; the webhook wires the engine pods
// (admitted by baseline too: a private /dev/shm, no host IPC). Replacing
// the server pod of node gpu-a evicts only gpu-a's engine pod, once: the
// engine on gpu-b keeps running, the engine Deployment is not rolled, and
// a manager that sees the same change again (the old identity put back)
// evicts nothing more.
func TestMultiprocessUnderBaselineRollsOnlyTheNodesEngines(t *testing.T) {
	ctx := context.Background()
	gpuNodes(t, "gpu-a", "gpu-b")
	ns := "mp-baseline"
	require.NoError(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "latest"}}}))
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", manifest(t, mpBackend))
	kubectlRun(t, "wait", "-n", ns, "--for=condition=Ready", "cachebackend/mp-cache", "--timeout=90s")
	key := client.ObjectKey{Namespace: ns, Name: "mp-cache"}

	cb := &v1alpha1.CacheBackend{}
	testutil.Eventually(t, 60*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if m := cb.Status.Multiprocess; m == nil || m.DesiredServers != 2 || m.ReadyServers != 2 || len(m.Nodes) != 2 {
			return fmt.Errorf("status.multiprocess %+v, want 2 of 2 servers on 2 nodes", cb.Status.Multiprocess)
		}
		return nil
	})
	assert.Equal(t, "tcp://mp-cache."+ns+".svc.cluster.local:5555", cb.Status.Endpoint)
	for i, n := range []string{"gpu-a", "gpu-b"} {
		got := cb.Status.Multiprocess.Nodes[i]
		assert.Equal(t, n, got.Node, "one server per GPU node, none on kwok-node-0")
		assert.True(t, got.Ready)
		assert.True(t, strings.HasPrefix(got.Endpoint, "tcp://") && strings.HasSuffix(got.Endpoint, ":5555"), got.Endpoint)
	}
	ds := &appsv1.DaemonSet{}
	require.NoError(t, k8s.Get(ctx, key, ds))
	assert.Equal(t, int32(2), ds.Status.NumberReady, "baseline admitted both server pods")
	svc := &corev1.Service{}
	require.NoError(t, k8s.Get(ctx, key, svc))
	require.NotNil(t, svc.Spec.InternalTrafficPolicy)
	assert.Equal(t, corev1.ServiceInternalTrafficPolicyLocal, *svc.Spec.InternalTrafficPolicy)

	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", manifest(t, mpEngine))
	kubectlRun(t, "rollout", "status", "-n", ns, "deployment/mp-engine", "--timeout=90s")
	engines := func() map[string]corev1.Pod {
		var pods corev1.PodList
		require.NoError(t, k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "mp-engine"}))
		out := map[string]corev1.Pod{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp.IsZero() && p.Spec.NodeName != "" {
				out[p.Spec.NodeName] = p
			}
		}
		return out
	}
	before := engines()
	require.Len(t, before, 2, "one engine pod on each GPU node")
	for node, p := range before {
		assert.Equal(t, ns+"/mp-cache", p.Annotations[v1alpha1.AnnotationInjectedBy], "the engine on %s is wired (baseline admitted it)", node)
		assert.Contains(t, strings.Join(p.Spec.Containers[0].Args, " "), "LMCacheMPConnector", "the engine on %s gets the MP connector", node)
		assert.True(t, mountsMemoryShm(p), "the engine on %s gets a private memory-backed /dev/shm", node)
	}
	engine := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mp-engine"}, engine))
	require.Equal(t, int64(1), engine.Generation)
	cb = observedBackend(t, key)
	first := cb.Status.ObservedServerInstance
	require.Contains(t, first, "@gpu-a")

	// Replace gpu-a's server.
	deleteServerOn(t, ns, "mp-cache", "gpu-a")

	testutil.Eventually(t, 90*time.Second, func() error {
		now := engines()
		a, ok := now["gpu-a"]
		if !ok || a.UID == before["gpu-a"].UID {
			_ = k8s.Get(ctx, key, cb)
			return fmt.Errorf("gpu-a's engine pod not replaced yet (observedServerInstance %q, conditions %+v, nodes %+v)",
				cb.Status.ObservedServerInstance, cb.Status.Conditions, cb.Status.Multiprocess)
		}
		if a.Annotations[v1alpha1.AnnotationInjectedBy] != ns+"/mp-cache" {
			return fmt.Errorf("gpu-a's new engine pod %s not wired", a.Name)
		}
		return nil
	})
	after := engines()
	assert.Equal(t, before["gpu-b"].UID, after["gpu-b"].UID, "gpu-b's engine keeps running")
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mp-engine"}, engine))
	assert.Equal(t, int64(1), engine.Generation, "the engine Deployment is not rolled")
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if cb.Status.ObservedServerInstance == first {
			return fmt.Errorf("the new instance is not recorded yet")
		}
		return nil
	})
	for _, e := range strings.Split(first, ",") {
		if strings.HasSuffix(e, "@gpu-b") {
			assert.Contains(t, cb.Status.ObservedServerInstance, e, "gpu-b's server is the same pod")
		} else {
			assert.NotContains(t, cb.Status.ObservedServerInstance, e, "gpu-a's server was replaced")
		}
	}
	assert.Equal(t, 1, testutil.CountEvents(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestarted))

	// Once: the change seen again (the old identity put back, as a manager
	// that crashed before recording it would) evicts nothing more.
	seeChangeAgain(t, key, first, "mp-engine")
	// Release-aware wiring through the real webhook (issue 36): the
	// engines' vllm/vllm-openai:v0.33.0 tag is their vLLM release; the
	// bystander's untagged image tells none, so its receipt event is the
	// Warning EngineReleaseUnknown and its connector has no module path.
	for node, p := range before {
		assert.Equal(t, "vllm=0.33.0 (image); lmcache=unknown", p.Annotations[v1alpha1.AnnotationWiredFor], "the engine on %s", node)
		assert.Contains(t, strings.Join(p.Spec.Containers[0].Args, " "), inject.LMCacheMPConnectorModulePath, "the engine on %s", node)
	}
	bystander := &corev1.Pod{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bystander"}, bystander))
	assert.Equal(t, "vllm=unknown; lmcache=unknown", bystander.Annotations[v1alpha1.AnnotationWiredFor])
	assert.NotContains(t, strings.Join(bystander.Spec.Containers[0].Args, " "), inject.LMCacheMPConnectorModulePath)
	testutil.WaitEvent(t, k8s, ns, "bystander", v1alpha1.EventEngineReleaseUnknown, 1)
	assert.Zero(t, testutil.CountEvents(t, k8s, ns, before["gpu-a"].Name, v1alpha1.EventEngineReleaseUnknown))
	final := engines()
	assert.Equal(t, after["gpu-a"].UID, final["gpu-a"].UID, "gpu-a's new engine is not evicted again")
	assert.Equal(t, after["gpu-b"].UID, final["gpu-b"].UID)
	assert.Equal(t, 1, testutil.CountEvents(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestarted))

	// A PodDisruptionBudget that allows no disruption holds gpu-b's engine
	// when gpu-b's server is replaced: the pod keeps running, a Warning
	// event and the Reconciling condition say why; once the budget allows
	// it, the engine is evicted, once, and gpu-a's is left alone.
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mp-engine"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(2)),
			// the two engines, not seeChangeAgain's bystander
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "mp-engine"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "role", Operator: metav1.LabelSelectorOpDoesNotExist}}}},
	}
	require.NoError(t, k8s.Create(ctx, pdb))
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pdb), pdb); err != nil {
			return err
		}
		if pdb.Status.ObservedGeneration != pdb.Generation || pdb.Status.CurrentHealthy != 2 || pdb.Status.DisruptionsAllowed != 0 {
			return fmt.Errorf("the disruption controller has not computed the budget yet: %+v", pdb.Status)
		}
		return nil
	})
	deleteServerOn(t, ns, "mp-cache", "gpu-b")
	testutil.WaitEvent(t, k8s, ns, "mp-cache", v1alpha1.EventEngineEvictionBlocked, 1)
	// The event is recorded during the pass, the status at its end.
	var reconciling *metav1.Condition
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		reconciling = meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReconciling)
		if reconciling == nil || !strings.Contains(reconciling.Message, "disruption budget") {
			return fmt.Errorf("Reconciling does not name the budget yet: %+v", reconciling)
		}
		return nil
	})
	assert.Contains(t, reconciling.Message, final["gpu-b"].Name)
	assert.Equal(t, final["gpu-b"].UID, engines()["gpu-b"].UID, "the budget holds gpu-b's engine")

	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(pdb), pdb))
	pdb.Spec.MinAvailable = ptr.To(intstr.FromInt32(1))
	require.NoError(t, k8s.Update(ctx, pdb))
	testutil.Eventually(t, 90*time.Second, func() error {
		b, ok := engines()["gpu-b"]
		if !ok || b.UID == final["gpu-b"].UID {
			return fmt.Errorf("gpu-b's engine pod not replaced yet")
		}
		if b.Annotations[v1alpha1.AnnotationInjectedBy] != ns+"/mp-cache" {
			return fmt.Errorf("gpu-b's new engine pod %s not wired", b.Name)
		}
		return nil
	})
	assert.Equal(t, final["gpu-a"].UID, engines()["gpu-a"].UID, "gpu-a's engine keeps running")
	testutil.WaitEvent(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestarted, 2)
	assert.Equal(t, 2, testutil.CountEvents(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestarted), "gpu-b's engine evicted once")

	// An admission policy (here a ValidatingAdmissionPolicy with reason
	// Forbidden) refuses evictions with 403, which RBAC does not explain
	// (this suite's operator is the cluster's admin): gpu-a's server
	// replaced, the refusal is retried, with the Warning event
	// EngineEvictionBlocked carrying the API server's message, the engine
	// keeps running and the identity stays unrecorded; the rest of the
	// status is published meanwhile (gpu-a's new server ready, Reconciling
	// True with EngineRestartsRetrying and the message); once the policy
	// is gone, gpu-a's engine is evicted, once. (RBAC's own refusal,
	// reported and not retried, is test/install's, with the bundle's RBAC.)
	engineNow := engines()
	blocked := testutil.CountEvents(t, k8s, ns, "mp-cache", v1alpha1.EventEngineEvictionBlocked)
	denyEvictions(t, ns)
	cb = observedBackend(t, key)
	recorded := cb.Status.ObservedServerInstance
	oldServer := nodeServer(cb, "gpu-a").Pod
	require.NotEmpty(t, oldServer, "status.multiprocess lists gpu-a's server")
	deleteServerOn(t, ns, "mp-cache", "gpu-a")
	testutil.WaitEvent(t, k8s, ns, "mp-cache", v1alpha1.EventEngineEvictionBlocked, blocked+1)
	var events eventsv1.EventList
	require.NoError(t, k8s.List(ctx, &events, client.InNamespace(ns)))
	refused := false
	for _, e := range events.Items {
		if e.Reason == v1alpha1.EventEngineEvictionBlocked && strings.Contains(e.Note, "refused an eviction") {
			refused = true
			assert.Contains(t, e.Note, "an admission policy of the test", "the API server's message")
			assert.Contains(t, e.Note, engineNow["gpu-a"].Name)
		}
	}
	assert.True(t, refused, "an EngineEvictionBlocked event says the API server refused the eviction")
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if srv := nodeServer(cb, "gpu-a"); srv.Pod == oldServer || !srv.Ready {
			return fmt.Errorf("status.multiprocess does not show gpu-a's new server ready while the eviction is refused: %+v", cb.Status.Multiprocess)
		}
		rec := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReconciling)
		if rec == nil || rec.Status != metav1.ConditionTrue || rec.Reason != v1alpha1.ReasonEngineRestartsRetrying {
			return fmt.Errorf("Reconciling is not True with %s: %+v", v1alpha1.ReasonEngineRestartsRetrying, rec)
		}
		if !strings.Contains(rec.Message, "an admission policy of the test") {
			return fmt.Errorf("Reconciling does not carry the API server's message: %q", rec.Message)
		}
		return nil
	})
	assert.Equal(t, cb.Generation, cb.Status.ObservedGeneration, "evaluated")
	assert.Equal(t, recorded, cb.Status.ObservedServerInstance, "not recorded while refused")
	assert.Equal(t, engineNow["gpu-a"].UID, engines()["gpu-a"].UID, "gpu-a's engine keeps running")
	assert.Zero(t, testutil.CountEvents(t, k8s, ns, "mp-cache", v1alpha1.EventEngineEvictionForbidden), "not taken for missing RBAC")
	allowEvictions(t, ns)
	testutil.Eventually(t, 90*time.Second, func() error {
		a, ok := engines()["gpu-a"]
		if !ok || a.UID == engineNow["gpu-a"].UID || a.Annotations[v1alpha1.AnnotationInjectedBy] != ns+"/mp-cache" {
			return fmt.Errorf("gpu-a's engine not replaced by a wired pod yet")
		}
		return nil
	})
	assert.Equal(t, engineNow["gpu-b"].UID, engines()["gpu-b"].UID)
	testutil.WaitEvent(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestarted, 3)
	assert.Equal(t, 3, testutil.CountEvents(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestarted), "gpu-a's engine evicted once")
}

// nodeServer is node's entry in cb's status.multiprocess (empty if none).
func nodeServer(cb *v1alpha1.CacheBackend, node string) v1alpha1.MultiprocessNode {
	if cb.Status.Multiprocess != nil {
		for _, n := range cb.Status.Multiprocess.Nodes {
			if n.Node == node {
				return n
			}
		}
	}
	return v1alpha1.MultiprocessNode{}
}

// denyEvictions makes the API server refuse every eviction in ns with 403
// Forbidden (a ValidatingAdmissionPolicy, as an admission webhook or
// policy of a cluster may), and waits until it does.
func denyEvictions(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-evictions-" + ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods/eviction"}},
				}}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Reason: ptr.To(metav1.StatusReasonForbidden),
				Message: "evictions are not allowed here (an admission policy of the test)"}},
		},
	}
	require.NoError(t, k8s.Create(ctx, policy))
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}},
	}
	require.NoError(t, k8s.Create(ctx, binding))
	t.Cleanup(func() { allowEvictions(t, ns) })
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "eviction-probe"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	require.NoError(t, k8s.Create(ctx, probe))
	testutil.Eventually(t, 30*time.Second, func() error {
		err := k8s.SubResource("eviction").Create(ctx, probe, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: probe.Name}})
		if !apierrors.IsForbidden(err) {
			return fmt.Errorf("eviction not refused with 403 yet: %w", err)
		}
		return nil
	})
}

// allowEvictions removes denyEvictions' policy and waits until an
// eviction in ns is allowed again.
func allowEvictions(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	name := "deny-evictions-" + ns
	if err := k8s.Delete(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}}); apierrors.IsNotFound(err) {
		return
	}
	_ = k8s.Delete(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}})
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "eviction-probe"}}
	testutil.Eventually(t, 30*time.Second, func() error {
		err := k8s.SubResource("eviction").Create(ctx, probe, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: probe.Name}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("eviction still refused: %w", err)
		}
		return nil
	})
}

// TestMultiprocessNodeWithoutServerHoldsNoOtherNode: a selected GPU node
// too small for the server's memory request keeps its server pod Pending,
// so the backend is not Ready (2 of 3 servers) while it publishes its
// endpoint. The engine applied before the backend (admitted unwired) is
// healed: its Deployment rolled once, its new pod wired. Replacing gpu-a's
// server evicts gpu-a's engine, once its new server is ready and the
// endpoint has been published for the settle time
// (status.endpointPublishedAt), and the re-created engine is wired.
// Before, the heal and the cascade waited for Ready, which this backend
// never reaches.
func TestMultiprocessNodeWithoutServerHoldsNoOtherNode(t *testing.T) {
	ctx := context.Background()
	gpuNodes(t, "gpu-a", "gpu-b")
	gpuNodesOf(t, "4Gi", "gpu-small") // the server requests L1 + 5Gi
	ns := namespace(t, "mp-pending-node")
	// One engine, on gpu-a, applied first: admitted before the endpoint.
	// Its rollouts take 15 s (minReadySeconds): the heal's leaves the old
	// pod running meanwhile.
	engine := strings.Replace(strings.Replace(mpEngine, "replicas: 2", "replicas: 1\n  minReadySeconds: 15", 1),
		"nodeSelector: {gpu: \"true\"}", "nodeSelector: {kubernetes.io/hostname: gpu-a}", 1)
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", manifest(t, engine))
	testutil.Eventually(t, 60*time.Second, func() error {
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "mp-engine"}); err != nil {
			return err
		}
		if len(pods.Items) != 1 || pods.Items[0].Spec.NodeName == "" {
			return fmt.Errorf("the engine pod is not scheduled yet")
		}
		return nil
	})
	early := engineOn(t, ns, "gpu-a")
	require.Empty(t, early.Annotations[v1alpha1.AnnotationInjectedBy], "no backend yet: admitted unwired")
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", manifest(t, mpBackend))
	key := client.ObjectKey{Namespace: ns, Name: "mp-cache"}
	cb := &v1alpha1.CacheBackend{}
	testutil.Eventually(t, 60*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if m := cb.Status.Multiprocess; m == nil || m.DesiredServers != 3 || m.ReadyServers != 2 || cb.Status.Endpoint == "" || cb.Status.EndpointPublishedAt == nil {
			return fmt.Errorf("status.multiprocess %+v, endpoint %q published at %v: want 2 of 3 servers ready and the endpoint published",
				cb.Status.Multiprocess, cb.Status.Endpoint, cb.Status.EndpointPublishedAt)
		}
		return nil
	})
	require.NoError(t, testutil.ReadyIs(metav1.ConditionFalse, "")(cb), "gpu-small has no server: not Ready")
	// The heal: the engine Deployment rolled once, its new pod wired. A
	// node's server that comes up while the heal's rollout runs (gpu-c,
	// joining now) rolls it no second time: the heal writes the hash of
	// the endpoint's publication, which the new server leaves alone (the
	// server instance's hash, which it changes, used to roll it again).
	testutil.WaitEvent(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestartedForWiring, 1)
	gpuNodes(t, "gpu-c")
	testutil.Eventually(t, 60*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if m := cb.Status.Multiprocess; m == nil || m.ReadyServers != 3 {
			return fmt.Errorf("gpu-c's server is not ready yet: %+v", m)
		}
		return nil
	})
	// The rollout still needs most of its 15 s: a second roll would
	// follow gpu-c's server within a reconcile, long before it ends.
	inWindow := k8s.Get(ctx, client.ObjectKeyFromObject(&early), &corev1.Pod{}) == nil
	testutil.Eventually(t, 60*time.Second, func() error {
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "mp-engine"}); err != nil {
			return err
		}
		if len(pods.Items) != 1 || pods.Items[0].UID == early.UID || pods.Items[0].Annotations[v1alpha1.AnnotationInjectedBy] != ns+"/mp-cache" {
			return fmt.Errorf("the engine admitted before the endpoint is not replaced by one wired pod yet (%d pods)", len(pods.Items))
		}
		return nil
	})
	assert.Equal(t, 1, testutil.CountEvents(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestartedForWiring), "healed once, also after gpu-c's server came up")
	var sets appsv1.ReplicaSetList
	require.NoError(t, k8s.List(ctx, &sets, client.InNamespace(ns), client.MatchingLabels{"app": "mp-engine"}))
	var revisions []string
	for _, rs := range sets.Items {
		revisions = append(revisions, rs.Name+" revision "+rs.Annotations["deployment.kubernetes.io/revision"])
	}
	assert.Len(t, revisions, 2, "the engine Deployment rolled once: its first ReplicaSet and the heal's, not %v", revisions)
	require.True(t, inWindow, "the heal's rollout ended before gpu-c's server came up: the window this test covers was missed")
	before := engineOn(t, ns, "gpu-a")
	observedBackend(t, key)
	require.NoError(t, k8s.Get(ctx, key, cb))
	require.NoError(t, testutil.ReadyIs(metav1.ConditionFalse, "")(cb), "healed while not Ready")

	deleteServerOn(t, ns, "mp-cache", "gpu-a")
	testutil.Eventually(t, 60*time.Second, func() error {
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "mp-engine"}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.UID != before.UID && p.DeletionTimestamp.IsZero() && p.Annotations[v1alpha1.AnnotationInjectedBy] == ns+"/mp-cache" {
				return nil
			}
		}
		_ = k8s.Get(ctx, key, cb)
		return fmt.Errorf("gpu-a's engine not replaced by a wired pod yet (conditions %+v)", cb.Status.Conditions)
	})
	require.NoError(t, k8s.Get(ctx, key, cb))
	require.NoError(t, testutil.ReadyIs(metav1.ConditionFalse, "")(cb), "still not Ready: the eviction did not wait for it")
	testutil.WaitEvent(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestarted, 1)
	assert.Equal(t, 1, testutil.CountEvents(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestartedForWiring), "healed once")

	// gpu-c leaves the servers' selection: its server is gone for good
	// while gpu-small's stays Pending (not scheduled). The change is
	// recorded (nothing on gpu-c to reconnect): counting only scheduled
	// server pods read gpu-c as waiting for a replacement, and the
	// identity stayed unrecorded, polled every 2 s.
	var servers corev1.PodList
	require.NoError(t, k8s.List(ctx, &servers, client.InNamespace(ns), client.MatchingLabels{"inferencecache.io/cachebackend": "mp-cache"}))
	var gpuC types.UID
	for _, p := range servers.Items {
		if p.Spec.NodeName == "gpu-c" {
			gpuC = p.UID
		}
	}
	require.NotEmpty(t, gpuC, "gpu-c runs a server")
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if !strings.Contains(cb.Status.ObservedServerInstance, string(gpuC)) {
			return fmt.Errorf("gpu-c's server is not in the recorded identity yet: %s", cb.Status.ObservedServerInstance)
		}
		return nil
	})
	node := &corev1.Node{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Name: "gpu-c"}, node))
	delete(node.Labels, "gpu")
	require.NoError(t, k8s.Update(ctx, node))
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if m := cb.Status.Multiprocess; m == nil || m.DesiredServers != 3 {
			return fmt.Errorf("the DaemonSet still wants gpu-c's server: %+v", m)
		}
		if strings.Contains(cb.Status.ObservedServerInstance, string(gpuC)) {
			return fmt.Errorf("gpu-c's server left for good, still recorded: %s", cb.Status.ObservedServerInstance)
		}
		return nil
	})
	assert.Equal(t, 1, testutil.CountEvents(t, k8s, ns, "mp-cache", v1alpha1.EventEnginesRestarted), "nothing evicted for gpu-c")
}

// engineOn returns the one running (not terminating) mp-engine pod of ns
// on node.
func engineOn(t *testing.T, ns, node string) corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	require.NoError(t, k8s.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{"app": "mp-engine"}))
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp.IsZero() && p.Spec.NodeName == node {
			out = append(out, p)
		}
	}
	require.Len(t, out, 1, "one engine pod on %s", node)
	return out[0]
}

// manifest writes body to a file of the test's and returns its path, for
// kubectl apply -f.
func manifest(t *testing.T, body string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "*.yaml")
	require.NoError(t, err)
	_, err = f.WriteString(body)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return f.Name()
}

// deleteServerOn deletes the server pod of backend name on node, as a
// node's server replaced (a crash, a drain, an upgrade) would be.
func deleteServerOn(t *testing.T, ns, name, node string) {
	t.Helper()
	ctx := context.Background()
	var servers corev1.PodList
	require.NoError(t, k8s.List(ctx, &servers, client.InNamespace(ns), client.MatchingLabels{"inferencecache.io/cachebackend": name}))
	for i := range servers.Items {
		if servers.Items[i].Spec.NodeName == node {
			require.NoError(t, k8s.Delete(ctx, &servers.Items[i]))
			return
		}
	}
	t.Fatalf("no server pod of %s on %s", name, node)
}

// mountsMemoryShm reports whether p's engine container mounts a volume of
// medium Memory at /dev/shm.
func mountsMemoryShm(p corev1.Pod) bool {
	for _, m := range p.Spec.Containers[0].VolumeMounts {
		if m.MountPath != "/dev/shm" {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.Name == m.Name && v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory {
				return true
			}
		}
	}
	return false
}

// TestMigrationToMultiprocessRollsEnginesOnce is the migration guide's
// step through a whole cluster: the quickstart (the in-process server, its
// engine wired with LMCacheConnectorV1) gets spec.multiprocess applied
// with kubectl apply --server-side; the operator replaces the Deployment
// by the DaemonSet, publishes the tcp:// endpoint, and rolls the engine
// Deployment once (its pods were wired to a server that is gone), whose
// new pods the webhook wires with LMCacheMPConnector.
func TestMigrationToMultiprocessRollsEnginesOnce(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "mp-migrate")
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/quickstart/cachebackend.yaml")
	kubectlRun(t, "wait", "-n", ns, "--for=condition=Ready", "cachebackend/qwen-demo-cache", "--timeout=60s")
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/quickstart/engine.yaml")
	kubectlRun(t, "rollout", "status", "-n", ns, "deployment/qwen-engine", "--timeout=60s")
	key := client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache"}
	observedBackend(t, key)
	engineKey := client.ObjectKey{Namespace: ns, Name: "qwen-engine"}
	connectors := func() []string {
		var pods corev1.PodList
		require.NoError(t, k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "qwen-demo"}))
		var out []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp.IsZero() {
				args := strings.Join(p.Spec.Containers[0].Args, " ")
				switch {
				case strings.Contains(args, "LMCacheMPConnector"):
					out = append(out, "mp")
				case strings.Contains(args, "LMCacheConnectorV1"):
					out = append(out, "in-process")
				default:
					out = append(out, "unwired")
				}
			}
		}
		return out
	}
	require.Equal(t, []string{"in-process"}, connectors())

	raw, err := os.ReadFile("../../examples/quickstart/cachebackend.yaml")
	require.NoError(t, err)
	mp := filepath.Join(t.TempDir(), "cachebackend.yaml")
	require.NoError(t, os.WriteFile(mp, append(raw, []byte("  multiprocess:\n    l1: {size: 1Gi}\n")...), 0o600))
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", mp)

	engine := &appsv1.Deployment{}
	waitGeneration(t, engineKey, engine, 2, 90*time.Second)
	testutil.Eventually(t, 60*time.Second, func() error {
		if got := connectors(); len(got) != 1 || got[0] != "mp" {
			return fmt.Errorf("engine pods wired %v, want one with the MP connector", got)
		}
		return nil
	})
	cb := &v1alpha1.CacheBackend{}
	require.NoError(t, k8s.Get(ctx, key, cb))
	assert.Equal(t, "tcp://qwen-demo-cache."+ns+".svc.cluster.local:5555", cb.Status.Endpoint)
	assert.NoError(t, k8s.Get(ctx, key, &appsv1.DaemonSet{}), "the DaemonSet runs the servers")
	assert.True(t, apierrors.IsNotFound(k8s.Get(ctx, key, &appsv1.Deployment{})), "the in-process server's Deployment is pruned")
	time.Sleep(5 * time.Second) // a roll that would happen twice has happened by now
	require.NoError(t, k8s.Get(ctx, engineKey, engine))
	assert.Equal(t, int64(2), engine.Generation, "rolled once")
	assert.Equal(t, 1, testutil.CountEvents(t, k8s, ns, "qwen-demo-cache", v1alpha1.EventEnginesRestarted))
}

// TestMultiprocessWithNoNodeSays: a multiprocess backend whose servers'
// placement selects no node (make demo's cluster has no GPU node) gets a
// DaemonSet the DaemonSet controller reports as 0 desired: Ready stays
// True (a GPU pool scaled to zero must not hold a later sync wave), with
// no endpoint, and Ready's message says that nothing serves yet instead
// of "0 of 0 replicas available".
func TestMultiprocessWithNoNodeSays(t *testing.T) {
	ns := namespace(t, "mp-no-node")
	body := strings.Replace(strings.Replace(mpBackend, "name: mp-cache", "name: mp-nowhere", 1), `gpu: "true"`, `gpu: "no-such-node"`, 1)
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", manifest(t, body))
	key := client.ObjectKey{Namespace: ns, Name: "mp-nowhere"}
	var cb v1alpha1.CacheBackend
	testutil.Eventually(t, 60*time.Second, func() error {
		if err := k8s.Get(context.Background(), key, &cb); err != nil {
			return err
		}
		ready := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
		if ready == nil || ready.Status != metav1.ConditionTrue || cb.Status.ObservedGeneration != cb.Generation || cb.Status.Multiprocess == nil {
			return fmt.Errorf("not Ready yet: %+v, multiprocess %+v", ready, cb.Status.Multiprocess)
		}
		return nil
	})
	ready := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
	assert.Equal(t, v1alpha1.ReasonBackendReady, ready.Reason)
	assert.Contains(t, ready.Message, "no node selected for a server yet")
	assert.NotContains(t, ready.Message, "0 of 0")
	assert.Empty(t, cb.Status.Endpoint, "no server: no endpoint")
	assert.Equal(t, int32(0), cb.Status.Multiprocess.DesiredServers)
}
