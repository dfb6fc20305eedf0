package cli

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/topology"
)

func TestBadInput(t *testing.T) {
	cases := map[string]struct{ input, want string }{
		"unknown field": {`apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {name: a}
spec: {type: LMCache, replicas: 3}`, `CacheBackend a: unknown field "spec.replicas"`},
		// issue 24: the path of a nested unknown field (it said only "rol").
		"nested unknown field": {`apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {name: a}
spec: {type: LMCache, integration: {rol: ReadOnly}}`, `CacheBackend a: unknown field "spec.integration.rol"`},
		"not a CacheBackend": {`apiVersion: apps/v1
kind: Deployment
metadata: {name: a}`, "no CacheBackend"},
		"invalid enum": {`apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {name: a}
spec: {type: Redis}`, `spec.type: Unsupported value: "Redis"`},
		"type/runtime": {`apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {name: a}
spec: {type: SGLangHiCache}`, "requires runtime SGLang"},
		"webhook rule": {`apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {name: a}
spec: {type: LMCache, integration: {engineOverrides: {args: ["--kv-transfer-config={}"]}}}`, "spec.integration.engineOverrides.args[0]"},
		"wrong version": {`apiVersion: inferencecache.io/v1
kind: CacheBackend
metadata: {name: a}`, `apiVersion "inferencecache.io/v1"`},
		"not YAML": {"{{{", "document 1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			objs, err := Documents([]byte(tc.input))
			if err == nil {
				_, err = Backends(objs)
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// renderExample reads examples/<dir>, which holds one CacheBackend, and
// renders it: the objects read, the backend, the rendered documents and
// their kinds.
func renderExample(t *testing.T, dir string) ([]*unstructured.Unstructured, []*v1alpha1.CacheBackend, []*unstructured.Unstructured, []string) {
	t.Helper()
	objs, err := ReadFile("../../examples/"+dir, true)
	require.NoError(t, err)
	cbs, err := Backends(objs)
	require.NoError(t, err)
	require.Len(t, cbs, 1)
	var buf bytes.Buffer
	require.NoError(t, RenderYAML(&buf, cbs[0]))
	docs, err := Documents(buf.Bytes())
	require.NoError(t, err)
	var kinds []string
	for _, d := range docs {
		kinds = append(kinds, d.GetKind())
	}
	return objs, cbs, docs, kinds
}

func TestRenderQuickstart(t *testing.T) {
	objs, cbs, _, kinds := renderExample(t, "quickstart")
	assert.Equal(t, []string{"Service", "Deployment"}, kinds)

	engines, err := Engines(objs)
	require.NoError(t, err)
	wired, d := WireEngine(cbs[0], engines[0])
	assert.Equal(t, inject.Injected, d.Outcome)
	assert.Contains(t, wired.Spec.Template.Spec.Containers[0].Args, inject.KVTransferConfigFlag)
	assert.Equal(t, "lm://qwen-demo-cache.default.svc.cluster.local:65432", wired.Spec.Template.Spec.Containers[0].Env[0].Value)
	assert.Empty(t, wired.Spec.Template.Annotations[v1alpha1.AnnotationInjectedBy], "receipts belong to pods, not templates")
}

func TestExplainOutcomes(t *testing.T) {
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	cb := v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: types.UID("uid-1"), Generation: 1},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}}},
		Status: v1alpha1.CacheBackendStatus{Endpoint: "lm://cache.llm.svc.cluster.local:65432"},
	}
	pod := func(labels, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "p", Labels: labels, Annotations: ann},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "v"}}}}
	}
	injected := inject.Decide(pod(map[string]string{"app": "qwen"}, nil), []v1alpha1.CacheBackend{cb}, inject.Options{Key: &key}).Pod
	observedCB := cb.DeepCopy()
	observedCB.Spec.Observation = &v1alpha1.Observation{ModelID: "qwen"}
	hostNet := pod(map[string]string{"app": "qwen"}, nil)
	hostNet.Spec.HostNetwork = true
	hostNet = inject.Decide(hostNet, []v1alpha1.CacheBackend{*observedCB}, inject.Options{Key: &key, KVEventSubscriberImage: "sub:v1"}).Pod
	tampered := injected.DeepCopy()
	tampered.Spec.Containers[0].Args = nil
	// A pod wired by generation 1 of a backend now at generation 2.
	newer := cb.DeepCopy()
	newer.Generation = 2
	cases := map[string]struct {
		pod        *corev1.Pod
		backend    v1alpha1.CacheBackend
		keys       []receipt.Key
		outcome    string
		receipt    string
		generation string
		line       string
	}{
		"injected":  {injected, cb, []receipt.Key{key}, ExplainInjected, ReceiptVerified, GenerationCurrent, "receipt verifies"},
		"stale":     {injected, *newer, []receipt.Key{key}, ExplainInjected, ReceiptVerified, GenerationStale, "generation 1 of the CacheBackend (now 2)"},
		"unchecked": {injected, cb, nil, ExplainUnverified, ReceiptUnchecked, GenerationCurrent, "signature not checked"},
		// issue 25: a hand-written receipt was called injected without the key.
		"hand-written unchecked": {pod(map[string]string{"app": "qwen"}, map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: string(cb.UID), v1alpha1.AnnotationInjectedGeneration: "1"}), cb, nil, ExplainUnverified, ReceiptUnchecked, GenerationCurrent, "could have written it"},
		"host-network": {hostNet, *observedCB, []receipt.Key{key}, ExplainInjected, ReceiptVerified, GenerationCurrent,
			"no KV-event sidecar (inferencecache.io/kv-events-skipped=host-network): the pod uses the node's network"},
		"skipped":    {pod(map[string]string{"app": "qwen"}, map[string]string{v1alpha1.AnnotationSkipInject: "true", v1alpha1.AnnotationInjectSkipped: v1alpha1.SkippedByAnnotation}), cb, []receipt.Key{key}, ExplainSkipped, ReceiptNone, "", "opts out"},
		"no ipc":     {pod(map[string]string{"app": "qwen"}, map[string]string{v1alpha1.AnnotationInjectSkipped: v1alpha1.SkippedIsolatedIPCUnsupported}), cb, []receipt.Key{key}, ExplainSkipped, ReceiptNone, "", "isolated IPC"},
		"fail-open":  {pod(map[string]string{"app": "qwen"}, nil), cb, []receipt.Key{key}, ExplainFailOpen, ReceiptNone, "", "admitted unwired"},
		"no match":   {pod(map[string]string{"app": "other"}, nil), cb, []receipt.Key{key}, ExplainNoMatch, ReceiptNone, "", "CacheBackend cache selects {app=qwen}"},
		"forged uid": {pod(map[string]string{"app": "qwen"}, map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "copied"}), cb, []receipt.Key{key}, ExplainForged, ReceiptFailed, "", "not written by the webhook"},
		"tampered":   {tampered, cb, []receipt.Key{key}, ExplainForged, ReceiptFailed, GenerationCurrent, "differ from the configuration"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := explain(tc.pod, []v1alpha1.CacheBackend{tc.backend}, tc.keys, errors.New("forbidden"))
			assert.Equal(t, tc.outcome, e.Outcome)
			assert.Equal(t, tc.receipt, e.Receipt, "receipt")
			assert.Equal(t, tc.generation, e.Generation, "generation")
			var buf bytes.Buffer
			e.Print(&buf)
			assert.Contains(t, buf.String(), tc.line)
		})
	}
}

func TestIsEnginePod(t *testing.T) {
	cbs := []v1alpha1.CacheBackend{{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache"},
		Spec: v1alpha1.CacheBackendSpec{EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}}}}}
	pod := func(labels, ann map[string]string, image string, args ...string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "p", Labels: labels, Annotations: ann},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image, Args: args}}}}
	}
	cases := map[string]struct {
		pod  *corev1.Pod
		want bool
	}{
		"selected":            {pod(map[string]string{"app": "qwen"}, nil, "busybox"), true},
		"receipt":             {pod(nil, map[string]string{v1alpha1.AnnotationInjectedBy: "llm/gone"}, "busybox"), true},
		"opt-out":             {pod(nil, map[string]string{v1alpha1.AnnotationSkipInject: "true"}, "busybox"), true},
		"vllm image":          {pod(nil, nil, "vllm/vllm-openai:v0.9"), true},
		"sglang command":      {pod(nil, nil, "python", "-m", "SGLang.launch_server"), true},
		"unrelated":           {pod(map[string]string{"app": "web"}, nil, "nginx"), false},
		"operator's own pods": {pod(map[string]string{"inferencecache.io/cachebackend": "cache", "app": "qwen"}, nil, "lmcache/vllm-openai"), false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, IsEnginePod(tc.pod, cbs))
		})
	}
}

func TestImageTag(t *testing.T) {
	for ref, want := range map[string]string{
		"inferencecache/operator:v0.1.0":                     "v0.1.0",
		"registry.local:5000/inferencecache/operator:v1.2.3": "v1.2.3",
		"registry.local:5000/inferencecache/operator":        Unknown,
		"inferencecache/operator":                            Unknown,
		"inferencecache/operator:v0.2.0@sha256:abc":          "v0.2.0",
		"inferencecache/operator@sha256:abc":                 "sha256:abc",
	} {
		assert.Equal(t, want, ImageTag(ref), ref)
	}
}

func TestPrintChecks(t *testing.T) {
	results := []CheckResult{{Name: "a", OK: true, Detail: "fine"}, {Name: "b", OK: true, Warning: true, Detail: "note"}, {Name: "c", Detail: "broken"}}
	var buf bytes.Buffer
	require.NoError(t, PrintChecks(&buf, results))
	assert.Equal(t, "✔  a  fine\n!  b  note\n✗  c  broken\n", buf.String())
	assert.True(t, Failed(results))
	assert.False(t, Failed(results[:2]), "a warning is not a failure")
}

func TestKubernetesMinor(t *testing.T) {
	cases := map[string]struct {
		info         version.Info
		major, minor int
		ok           bool
	}{
		"binary version":   {version.Info{Major: "1", Minor: "37", GitVersion: "v1.37.2"}, 1, 37, true},
		"provider suffix":  {version.Info{Major: "1", Minor: "31+", GitVersion: "v1.31.4-eks-1"}, 1, 31, true},
		"emulated only":    {version.Info{EmulationMajor: "1", EmulationMinor: "37", GitVersion: "v0.0.0-master"}, 1, 37, true},
		"git version only": {version.Info{GitVersion: "v1.30.1"}, 1, 30, true},
		"not stamped":      {version.Info{GitVersion: "v0.0.0-master+$Format:%H$"}, 0, 0, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			major, minor, ok := KubernetesMinor(&tc.info)
			assert.Equal(t, []any{tc.major, tc.minor, tc.ok}, []any{major, minor, ok})
		})
	}
}

// TestExplainIndexState guards explain pod's index line: read from the
// backend's status.indexParticipation per-pod list.
func TestExplainIndexState(t *testing.T) {
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	base := v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: types.UID("uid-1"), Generation: 1},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}}},
		Status: v1alpha1.CacheBackendStatus{Endpoint: "lm://cache.llm.svc.cluster.local:65432"},
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "p", Labels: map[string]string{"app": "qwen"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "v"}}}}
	injected := inject.Decide(pod, []v1alpha1.CacheBackend{base}, inject.Options{Key: &key}).Pod
	observed := func(p *v1alpha1.IndexParticipation) v1alpha1.CacheBackend {
		cb := *base.DeepCopy()
		cb.Spec.Observation = &v1alpha1.Observation{ModelID: "m"}
		cb.Status.IndexParticipation = p
		if p != nil {
			cb.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionIndexSynced, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPodsStale, Message: "1 pod(s) sent nothing"}}
		}
		return cb
	}
	stale := &v1alpha1.IndexParticipation{Indexed: "1/2", Pods: []v1alpha1.PodIndexParticipation{
		{Name: "q", State: v1alpha1.IndexPodUnsynced}, {Name: "p", State: v1alpha1.IndexPodStale, Blocks: 12, Message: "no heartbeat"}}}
	truncated := &v1alpha1.IndexParticipation{Indexed: "30/40", PodsTruncated: true, Pods: []v1alpha1.PodIndexParticipation{{Name: "q", State: v1alpha1.IndexPodReplaying}}}
	for name, tc := range map[string]struct {
		backend v1alpha1.CacheBackend
		state   string
		line    string
	}{
		"no observation":      {base, IndexNotObserved, "Index:        not-observed"},
		"not published":       {observed(nil), IndexNotPublished, "not published yet"},
		"listed":              {observed(stale), string(v1alpha1.IndexPodStale), "index state: Stale, 12 blocks: no heartbeat"},
		"not among the worst": {observed(truncated), IndexNotListed, "at least Replaying"},
	} {
		t.Run(name, func(t *testing.T) {
			e := explain(injected, []v1alpha1.CacheBackend{tc.backend}, []receipt.Key{key}, nil)
			assert.Equal(t, ExplainInjected, e.Outcome)
			assert.Equal(t, tc.state, e.IndexState)
			var buf bytes.Buffer
			e.Print(&buf)
			assert.Contains(t, buf.String(), tc.line)
		})
	}
}

// mpBackend is a CacheBackend in multiprocess mode with a RESP and a disk
// tier, and its status.multiprocess as the controller publishes it.
func mpBackend() v1alpha1.CacheBackend {
	class := "local-nvme"
	return v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: types.UID("uid-mp"), Generation: 3},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}},
			Multiprocess: &v1alpha1.Multiprocess{Port: 5555, HTTPPort: 8080,
				L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("20Gi"), EvictionPolicy: v1alpha1.MPEvictionLRU, EvictionWatermarkPercent: 80, EvictionRatioPercent: 20},
				L2: &v1alpha1.MultiprocessL2{
					RESP: &v1alpha1.MultiprocessRESP{Host: "redis.cache.svc", Port: 6379, Capacity: resource.MustParse("100Gi"),
						CredentialsSecretRef: &v1alpha1.RESPCredentials{Name: "redis-auth", PasswordKey: "password"}},
					Disk: &v1alpha1.MultiprocessDisk{Path: "/var/lib/lmcache", Capacity: resource.MustParse("500Gi"), StorageClassName: &class}}}},
		Status: v1alpha1.CacheBackendStatus{Endpoint: "tcp://cache.llm.svc.cluster.local:5555",
			Multiprocess: &v1alpha1.MultiprocessStatus{DesiredServers: 2, ReadyServers: 1, Nodes: []v1alpha1.MultiprocessNode{
				{Node: "gpu-b", Pod: "cache-bbbbb", Ready: false}, {Node: "gpu-a", Pod: "cache-aaaaa", Ready: true, Endpoint: "tcp://10.0.0.5:5555"}}}},
	}
}

// stamp writes the webhook's receipt on pod for cb, signed with key, over
// the pod's containers as they are (the webhook's own stamp, without its
// wiring: the tests choose the wiring).
func stamp(pod *corev1.Pod, cb v1alpha1.CacheBackend, key receipt.Key) *corev1.Pod {
	p := pod.DeepCopy()
	c := receipt.Claim{Backend: cb.Namespace + "/" + cb.Name, UID: string(cb.UID), Generation: strconv.FormatInt(cb.Generation, 10), Digest: receipt.Digest(p)}
	p.Annotations = map[string]string{
		v1alpha1.AnnotationInjectedBy: c.Backend, v1alpha1.AnnotationInjectedByUID: c.UID,
		v1alpha1.AnnotationInjectedGeneration: c.Generation, v1alpha1.AnnotationInjectedConfigDigest: c.Digest,
		v1alpha1.AnnotationReceiptSignature: receipt.Sign(key, c)}
	return p
}

// TestRenderMultiprocess: render of a multiprocess CacheBackend prints its
// node-local Service and the DaemonSet, nothing of the in-process server.
func TestRenderMultiprocess(t *testing.T) {
	_, cbs, docs, kinds := renderExample(t, "multiprocess")
	require.Equal(t, []string{"Service", "DaemonSet"}, kinds)
	policy, _, _ := unstructured.NestedString(docs[0].Object, "spec", "internalTrafficPolicy")
	assert.Equal(t, "Local", policy)
	ports, _, _ := unstructured.NestedSlice(docs[0].Object, "spec", "ports")
	require.Len(t, ports, 1, "the ZMQ port only: the HTTP admin API stays off the Service")
	assert.EqualValues(t, 5555, ports[0].(map[string]any)["port"])
	containers, _, _ := unstructured.NestedSlice(docs[1].Object, "spec", "template", "spec", "containers")
	require.Len(t, containers, 1)
	assert.Equal(t, []any{"lmcache", "server"}, containers[0].(map[string]any)["command"])
	assert.Contains(t, containers[0].(map[string]any)["args"], "--isolated-ipc")
	assert.Equal(t, "tcp://qwen-mp-cache.default.svc.cluster.local:5555", topology.Endpoint(cbs[0], ""))
}

// TestExplainMultiprocess: explain (and so audit) of the engine pods of a
// multiprocess CacheBackend: the mode, the server of the pod's node from
// status.multiprocess, the connector against the one the mode wires, the
// private /dev/shm and the server's tiers.
func TestExplainMultiprocess(t *testing.T) {
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	cb := mpBackend()
	mpConfig := inject.MPKVTransferConfig("cache.llm.svc.cluster.local", 5555, v1alpha1.RoleReadWrite)
	v1Config := `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`
	pod := func(node, config string, shm bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "p", Labels: map[string]string{"app": "qwen"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
		if config != "" {
			p.Spec.Containers[0].Args = []string{"--model", "m", inject.KVTransferConfigFlag, config}
		}
		if shm {
			size := resource.MustParse("1Gi")
			p.Spec.Volumes = []corev1.Volume{{Name: "dshm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &size}}}}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "dshm", MountPath: "/dev/shm"}}
		}
		return p
	}
	noStatus := cb.DeepCopy()
	noStatus.Status.Multiprocess = nil
	// No node selected for a server: Ready, no endpoint (make demo's
	// cluster has no GPU-labelled node).
	noNode := cb.DeepCopy()
	noNode.Status.Endpoint = ""
	noNode.Status.Multiprocess = &v1alpha1.MultiprocessStatus{}
	noNode.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonBackendReady}}
	inProcess := cb.DeepCopy()
	inProcess.Spec.Multiprocess = nil
	cases := map[string]struct {
		pod        *corev1.Pod
		backend    v1alpha1.CacheBackend
		outcome    string
		nodeServer string
		mismatch   bool
		lines      []string
	}{
		"wired, server ready": {stamp(pod("gpu-a", mpConfig, true), cb, key), cb, ExplainInjected, NodeServerReady, false, []string{
			"Mode:         multiprocess", "Node server:  ready",
			"one lmcache server per node (DaemonSet llm/cache), reached through the node-local Service cache (internalTrafficPolicy Local) at tcp://cache.llm.svc.cluster.local:5555",
			"server of node gpu-a: pod cache-aaaaa, ready (1 of 2 node servers ready)",
			`engine wiring: container "vllm", --kv-transfer-config LMCacheMPConnector to tcp://cache.llm.svc.cluster.local:5555, isolated IPC`,
			"private /dev/shm: volume dshm (emptyDir, medium Memory, sizeLimit 1Gi)",
			"server tiers: L1 20 GiB of host memory (LRU, eviction from 80% full, frees 20%); L2: RESP (Redis/Valkey) redis.cache.svc:6379, 100 GiB, credentials from Secret redis-auth, no TLS; " +
				"disk /var/lib/lmcache, 500 GiB, a generic ephemeral volume of class local-nvme (kept over a container restart, empty after the server pod is replaced)"}},
		"wired for a release": {withWiredFor(stamp(pod("gpu-a", mpConfig, true), cb, key), "vllm=0.34.0 (image); lmcache=unknown"), cb, ExplainInjected, NodeServerReady, false, []string{
			"wired for the engine releases vllm=0.34.0 (image); lmcache=unknown"}},
		"server not ready": {stamp(pod("gpu-b", mpConfig, true), cb, key), cb, ExplainInjected, NodeServerNotReady, false, []string{
			"server of node gpu-b: pod cache-bbbbb, NOT ready (1 of 2 node servers ready)"}},
		"no server on the node": {stamp(pod("cpu-1", mpConfig, true), cb, key), cb, ExplainInjected, NodeServerNone, false, []string{
			"server of node cpu-1: none: no server pod runs on the node"}},
		"status not published": {stamp(pod("gpu-a", mpConfig, true), *noStatus, key), *noStatus, ExplainInjected, NodeServerUnknown, false, []string{
			"status.multiprocess is not published yet"}},
		"unscheduled": {stamp(pod("", mpConfig, true), cb, key), cb, ExplainInjected, NodeServerUnscheduled, false, []string{"Node server:  unscheduled"}},
		"no /dev/shm": {stamp(pod("gpu-a", mpConfig, false), cb, key), cb, ExplainInjected, NodeServerReady, false, []string{
			`no private /dev/shm mounted in container "vllm"`}},
		// Wired by an in-process generation, before spec.multiprocess.
		"wired in-process": {stamp(pod("gpu-a", v1Config, false), cb, key), cb, ExplainInjected, NodeServerReady, true, []string{
			`connector mismatch: container "vllm" is wired with LMCacheConnectorV1, but the backend runs in multiprocess mode, which wires LMCacheMPConnector`}},
		// The reverse: multiprocess wiring left after the mode was removed.
		"wired multiprocess, backend in-process": {stamp(pod("gpu-a", mpConfig, true), *inProcess, key), *inProcess, ExplainInjected, "", true, []string{
			"Mode:         in-process", "which wires LMCacheConnectorV1"}},
		"fail-open": {pod("gpu-a", "", true), cb, ExplainFailOpen, NodeServerReady, false, []string{
			"admitted unwired", "server of node gpu-a: pod cache-aaaaa, ready"}},
		"fail-open, no node selected": {pod("", "", true), *noNode, ExplainFailOpen, NodeServerUnscheduled, false, []string{
			"no node is selected for a multiprocess server (status.multiprocess.desiredServers 0)",
			"once status.endpoint is published"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := explain(tc.pod, []v1alpha1.CacheBackend{tc.backend}, []receipt.Key{key}, nil)
			assert.Equal(t, tc.outcome, e.Outcome, e.Lines)
			assert.Equal(t, tc.nodeServer, e.NodeServer)
			assert.Equal(t, tc.mismatch, e.WiringMismatch)
			var buf bytes.Buffer
			e.Print(&buf)
			for _, l := range tc.lines {
				assert.Contains(t, buf.String(), l)
			}
			if tc.outcome == ExplainFailOpen {
				assert.NotContains(t, buf.String(), "engine wiring:", "an unwired pod has no wiring to describe")
				assert.NotContains(t, buf.String(), "wait until it is Ready", "say what is missing, not a condition that holds")
			}
		})
	}
}

// TestAuditMultiprocessColumns: -o wide's columns and the warnings of the
// multiprocess rows.
func TestAuditMultiprocessColumns(t *testing.T) {
	rows := []AuditRow{
		{Namespace: "llm", Pod: "a", CacheBackend: "llm/cache", Outcome: ExplainInjected, Receipt: ReceiptVerified, Generation: GenerationCurrent,
			Mode: ModeMultiprocess, Connector: inject.LMCacheMPConnector, Node: "gpu-a", NodeServer: NodeServerReady},
		{Namespace: "llm", Pod: "b", CacheBackend: "llm/cache", Outcome: ExplainInjected, Receipt: ReceiptVerified, Generation: GenerationStale,
			Mode: ModeMultiprocess, Connector: inject.LMCacheConnector, WiringMismatch: true, Node: "cpu-1", NodeServer: NodeServerNone},
	}
	var buf bytes.Buffer
	require.NoError(t, PrintAuditWide(&buf, rows, false))
	assert.Equal(t, `POD   CACHEBACKEND   OUTCOME    RECEIPT    GENERATION   MODE           CONNECTOR             NODE    NODE-SERVER
a     llm/cache      injected   verified   current      multiprocess   LMCacheMPConnector    gpu-a   ready
b     llm/cache      injected   verified   stale        multiprocess   LMCacheConnectorV1!   cpu-1   none
`, buf.String())
	buf.Reset()
	require.NoError(t, PrintAuditTable(&buf, rows, false))
	assert.Equal(t, "POD   CACHEBACKEND   OUTCOME    RECEIPT    GENERATION\n", strings.SplitAfter(buf.String(), "\n")[0], "the default table keeps its columns")
	assert.Equal(t, []string{
		"1 pod(s) wired with another connector than their CacheBackend's mode wires; roll their workloads: llm/b",
		"1 multiprocess engine pod(s) on a node without a ready server: llm/b (node cpu-1: none)",
	}, AuditWarnings(rows))
}

func withWiredFor(p *corev1.Pod, releases string) *corev1.Pod {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[v1alpha1.AnnotationWiredFor] = releases
	return p
}
