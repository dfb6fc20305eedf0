package realnode_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/test/testutil"
	"github.com/inferencecache/operator/test/testutil/pyenv"
	"github.com/inferencecache/operator/test/testutil/realnode"
)

// TestManagedServerOnARealNode (issue 37): the quickstart's shape, a
// managed in-process LMCache server, on the real node. The server image is
// built from the locked Python environment of LMCache 0.5.6 (the files
// lmcache_server and the rendered probe use, at their paths; see
// realnode.LMCacheServerArchive) and imported under the default server
// image's name. The server pod, as rendered (non-root, read-only root,
// restricted Pod Security), becomes Ready through its exec probe, which
// runs python3 inside the image; the operator's functional probe reaches
// it through its Service; status.endpoint is published. An engine pod
// (the stand-in engine of the same image, realnode.EngineProgram: vLLM's
// own parser takes the wired command line) is wired with that endpoint
// and reaches the server by its Service's DNS name. The server pod
// replaced, the engine Deployment is rolled once.
func TestManagedServerOnARealNode(t *testing.T) {
	ctx := context.Background()
	ns := "realnode-server"
	dumpOnFailure(t, operatorNamespace, ns)
	install(t)

	engineImage(t)

	require.NoError(t, node.Client.Create(ctx, restrictedNamespace(ns)))
	cb := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-demo-cache"},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen-demo"}},
			RemoteStorage:  &v1alpha1.RemoteStorage{Provider: v1alpha1.ProviderLMCacheServer, Ownership: v1alpha1.OwnershipManaged, LMCacheServer: &v1alpha1.LMCacheServer{}},
		},
	}
	require.NoError(t, node.Client.Create(ctx, cb))
	key := client.ObjectKeyFromObject(cb)
	testutil.Eventually(t, 3*time.Minute, func() error {
		if err := node.Client.Get(ctx, key, cb); err != nil {
			return err
		}
		if err := testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady)(cb); err != nil || cb.Status.Endpoint == "" {
			return fmt.Errorf("not Ready with an endpoint (%w): %+v\n%s", err, cb.Status.Conditions, podsOf(ns, nil))
		}
		return nil
	})
	assert.Equal(t, topology.Endpoint(cb, ""), cb.Status.Endpoint)

	engine := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-engine"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "qwen-demo"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "qwen-demo"},
					Annotations: map[string]string{v1alpha1.AnnotationVLLMVersion: "0.33.0"}},
				Spec: restrictedPod(realnode.StandInEngine(render.DefaultImage, corev1.EnvVar{Name: "PROBE", Value: lmcacheproto.ProbeScript()})),
			},
		},
	}
	require.NoError(t, node.Client.Create(ctx, engine))
	available(t, ns, engine.Name, 3*time.Minute)
	var pods corev1.PodList
	require.NoError(t, node.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "qwen-demo"}))
	require.Len(t, pods.Items, 1)
	assert.Equal(t, ns+"/"+cb.Name, pods.Items[0].Annotations[v1alpha1.AnnotationInjectedBy])
	requireEngineSaid(t, ns, pods.Items[0].Name, "lmcache_server at "+cb.Name)

	// The server pod replaced: the engines are rolled once.
	require.NoError(t, node.Client.Get(ctx, client.ObjectKeyFromObject(engine), engine))
	gen := engine.Generation
	var servers corev1.PodList
	require.NoError(t, node.Client.List(ctx, &servers, client.InNamespace(ns), client.MatchingLabels(render.SelectorLabels(cb))))
	require.Len(t, servers.Items, 1, "one server pod")
	require.NoError(t, node.Client.Delete(ctx, &servers.Items[0]))
	testutil.Eventually(t, 5*time.Minute, func() error {
		if err := node.Client.Get(ctx, client.ObjectKeyFromObject(engine), engine); err != nil {
			return err
		}
		if engine.Generation == gen {
			return fmt.Errorf("engine Deployment not rolled yet (generation %d)\n%s", gen, podsOf(ns, nil))
		}
		return nil
	})
	available(t, ns, engine.Name, 3*time.Minute)
	// Settled: no second roll.
	time.Sleep(10 * time.Second)
	require.NoError(t, node.Client.Get(ctx, client.ObjectKeyFromObject(engine), engine))
	assert.Equal(t, gen+1, engine.Generation, "rolled once")
}

// engineImage builds (once per environment) and imports the engine image:
// vLLM 0.33 and LMCache 0.5.6 from the locked vllm environment, under
// render.DefaultImage (lmcache/vllm-openai, LMCache's image of both).
func engineImage(t *testing.T) {
	t.Helper()
	engineImageOnce.Do(func() {
		start := time.Now()
		engineImageErr = node.ImportEngineImage(context.Background(), pyenv.Dir(t, "vllm"), realnode.ImagesCacheDir(), render.DefaultImage)
		t.Logf("engine image %s built and imported in %s", render.DefaultImage, time.Since(start).Round(time.Second))
	})
	require.NoError(t, engineImageErr, "the engine image")
}

var (
	engineImageOnce sync.Once
	engineImageErr  error
)

// requireEngineSaid requires the stand-in engine of pod ns/name to have
// logged a line starting "engine: " and containing want.
func requireEngineSaid(t *testing.T, ns, name, want string) {
	t.Helper()
	out, err := kubectlErr("-n", ns, "logs", name, "-c", "vllm")
	require.NoError(t, err)
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "engine: ") && strings.Contains(l, want) {
			t.Log(l)
			return
		}
	}
	t.Fatalf("engine %s/%s never said %q:\n%s", ns, name, want, out)
}
