package realnode_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/test/testutil"
	"github.com/inferencecache/operator/test/testutil/realnode"
)

// gpuLabel is the label of GPU nodes the multiprocess example's placement
// selects (nvidia's GPU feature discovery sets it).
const gpuLabel = "nvidia.com/gpu.present"

// TestMultiprocessModeOnARealNode (issue 37): LMCache's multiprocess mode
// on the real node, labelled as a GPU node, in a namespace enforcing Pod
// Security baseline (what docs/design/multiprocess-mode.md says both sides
// need). The DaemonSet's `lmcache server` (LMCache 0.5.6, the engine
// image) runs as rendered and becomes Ready through its exec probe inside
// the image as the pod's non-root user; status.multiprocess counts it.
// The engine pod on that node is wired at CREATE (LMCacheMPConnector,
// PYTHONHASHSEED, a private memory-backed /dev/shm) and its stand-in
// (realnode.EngineProgram) checks, inside the container: vLLM's own
// parser takes the wired command line; LMCache's own MP client reaches
// the server of its node through the node-local Service's DNS name
// (get_chunk_size); /dev/shm is a tmpfs of the rendered size. Its
// kvevent-subscriber sidecar carries the blocks vLLM's own publisher
// published, through the pod's loopback, into the index, where
// status.indexParticipation counts them.
//
// Not exercised, for want of a GPU: CUDA IPC between the engine and the
// server (isolated IPC exports cudaMalloc memory), the engine's GPU
// memory registration, a store and a retrieve.
func TestMultiprocessModeOnARealNode(t *testing.T) {
	ctx := context.Background()
	ns := "realnode-mp"
	dumpOnFailure(t, operatorNamespace, ns)
	install(t)
	engineImage(t)

	var nodes corev1.NodeList
	require.NoError(t, node.Client.List(ctx, &nodes))
	require.Len(t, nodes.Items, 1)
	nodeName := nodes.Items[0].Name
	label := func(v *string) {
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, gpuLabel)
		if v != nil {
			patch = fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, gpuLabel, *v)
		}
		require.NoError(t, node.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, client.RawPatch(types.MergePatchType, patch)))
	}
	on := "true"
	label(&on)
	t.Cleanup(func() { label(nil) })

	require.NoError(t, node.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "latest",
	}}}))
	shm := resource.MustParse("256Mi")
	cb := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-mp-cache"},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen-mp"}},
			RemoteStorage: &v1alpha1.RemoteStorage{Provider: v1alpha1.ProviderLMCacheServer, Ownership: v1alpha1.OwnershipManaged,
				LMCacheServer: &v1alpha1.LMCacheServer{
					Pod: &v1alpha1.ServerPod{NodeSelector: map[string]string{gpuLabel: "true"}},
					// The node has 2 CPUs: the rendered 4-CPU request would
					// never schedule.
					Resources: &corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
						Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("3Gi")},
					},
				}},
			Multiprocess: &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("1Gi")}, EngineSharedMemory: &shm},
			Observation:  &v1alpha1.Observation{ModelID: "Qwen/Qwen2.5-0.5B-Instruct"},
		},
	}
	require.NoError(t, node.Client.Create(ctx, cb))
	key := client.ObjectKeyFromObject(cb)
	testutil.Eventually(t, 4*time.Minute, func() error {
		if err := node.Client.Get(ctx, key, cb); err != nil {
			return err
		}
		mp := cb.Status.Multiprocess
		if err := testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady)(cb); err != nil || mp == nil || mp.ReadyServers != 1 || cb.Status.Endpoint == "" {
			return fmt.Errorf("not Ready with 1 of 1 servers (%w): %+v %+v\n%s", err, mp, cb.Status.Conditions, podsOf(ns, nil))
		}
		return nil
	})
	assert.Equal(t, int32(1), cb.Status.Multiprocess.DesiredServers)
	var servers corev1.PodList
	require.NoError(t, node.Client.List(ctx, &servers, client.InNamespace(ns), client.MatchingLabels(render.SelectorLabels(cb))))
	require.Len(t, servers.Items, 1)
	server := servers.Items[0]
	assert.Equal(t, nodeName, server.Spec.NodeName)
	require.NotNil(t, server.Spec.SecurityContext)
	assert.True(t, ptr.Deref(server.Spec.SecurityContext.RunAsNonRoot, false), "the server runs as non-root")
	for _, st := range append(slices.Clone(server.Status.InitContainerStatuses), server.Status.ContainerStatuses...) {
		assert.True(t, st.Ready, "%s ready (its probe ran inside the image)", st.Name)
	}

	engine := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-mp-engine"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "qwen-mp"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "qwen-mp"},
					Annotations: map[string]string{v1alpha1.AnnotationVLLMVersion: "0.33.0"}},
				Spec: restrictedPod(realnode.StandInEngine(render.DefaultImage, corev1.EnvVar{Name: "EXPECT_SHM_BYTES", Value: strconv.FormatInt(shm.Value(), 10)})),
			},
		},
	}
	engine.Spec.Template.Spec.NodeSelector = map[string]string{gpuLabel: "true"}
	require.NoError(t, node.Client.Create(ctx, engine))
	available(t, ns, engine.Name, 3*time.Minute)
	var pods corev1.PodList
	require.NoError(t, node.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "qwen-mp"}))
	require.Len(t, pods.Items, 1)
	pod := pods.Items[0]
	assert.Equal(t, ns+"/"+cb.Name, pod.Annotations[v1alpha1.AnnotationInjectedBy])
	c := pod.Spec.Containers[0]
	i := slices.Index(c.Args, inject.KVTransferConfigFlag)
	require.GreaterOrEqual(t, i, 0, "wired: %q", c.Args)
	assert.Contains(t, c.Args[i+1], inject.LMCacheMPConnector)
	// The engine runs as 65532: LMCache imports only with the webhook's
	// numba cache.
	assert.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.VolumeNumbaCache, MountPath: inject.NumbaCacheDir})
	requireEngineSaid(t, ns, pod.Name, "vLLM parsed kv_transfer_config \""+inject.LMCacheMPConnector+"\"")
	requireEngineSaid(t, ns, pod.Name, "LMCache MP server at tcp://"+topology.Host(cb, "")+":"+strconv.Itoa(int(topology.Port(cb)))+" answered get_chunk_size")
	requireEngineSaid(t, ns, pod.Name, fmt.Sprintf("/dev/shm is a private tmpfs of %d bytes", shm.Value()))
	// 2 prompts of 64 tokens (engine.py's PROMPT_TOKENS), in blocks of the
	// wired --block-size or vLLM 0.33's default, 16.
	blockSize := 16
	if j := slices.Index(c.Args, "--block-size"); j >= 0 {
		blockSize, _ = strconv.Atoi(c.Args[j+1])
	}
	requireEngineSaid(t, ns, pod.Name, fmt.Sprintf("%d blocks of %d tokens", 64/blockSize, blockSize))

	// The sidecar carried vLLM's events into the index: both prompts'
	// blocks.
	testutil.Eventually(t, 2*time.Minute, func() error {
		if err := node.Client.Get(ctx, key, cb); err != nil {
			return err
		}
		p := cb.Status.IndexParticipation
		if p == nil || p.LivePods != 1 || p.Blocks.GPU != int64(2*64/blockSize) {
			return fmt.Errorf("status.indexParticipation %+v", p)
		}
		return nil
	})
}
