// Package install tests the install bundle end to end on a local cluster of
// its own: `kubectl apply --server-side -k kustomize/overlays/dev`, twice,
// then the quickstart. The manager runs as the locally built binary outside
// the cluster (kwok runs no real containers, so the bundle's manager pods
// only stand in), impersonating the bundle's ServiceAccount so the
// bundle's least-privilege RBAC is what it works with; it provisions its own
// webhook certificate as the dev overlay configures it. Because the API
// server cannot reach a Service without a pod network, the test points the
// webhook configurations at the binary's address; their caBundle is the one
// the manager published. The functional probe is off (no real server).
package install

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/localcluster"
	"github.com/inferencecache/operator/test/testutil"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

func TestDevOverlayInstallsAndWiresTheQuickstart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	work := t.TempDir()
	cluster, kubectl := startCluster(ctx, t, work, "")
	// Install, then upgrade in place with the same bundle: both clean.
	first := kubectl("apply", "--server-side", "-k", "../../kustomize/overlays/dev")
	assert.Contains(t, first, "customresourcedefinition.apiextensions.k8s.io/cachebackends.inferencecache.io serverside-applied")
	// The KV-block index is part of the bundle.
	index := []string{"deployment.apps/inferencecache-index", "service/inferencecache-index", "service/inferencecache-index-peers", "poddisruptionbudget.policy/inferencecache-index",
		"serviceaccount/inferencecache-index", "clusterrolebinding.rbac.authorization.k8s.io/inferencecache-index-auth-delegator"}
	for _, obj := range index {
		assert.Contains(t, first, obj+" serverside-applied")
	}
	// What the second apply could change: the objects' specs (generation,
	// which controllers' status writes do not move) and, for objects
	// without a status, the resourceVersion.
	state := func() string {
		return kubectl("get", "-n", "inferencecache-system", "deployment/inferencecache-index", "poddisruptionbudget/inferencecache-index",
			"service/inferencecache-index", "service/inferencecache-index-peers", "serviceaccount/inferencecache-index", "clusterrolebinding/inferencecache-index-auth-delegator",
			"-o", `jsonpath={range .items[*]}{.kind}/{.metadata.name} generation={.metadata.generation} rv={.metadata.resourceVersion}{"\n"}{end}`)
	}
	stable := func(s string) string {
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
			if strings.HasPrefix(line, "Deployment/") || strings.HasPrefix(line, "PodDisruptionBudget/") {
				line = line[:strings.Index(line, " rv=")]
			}
			out = append(out, line)
		}
		return strings.Join(out, "\n")
	}
	before := state()
	assert.Equal(t, "2", kubectl("get", "-n", "inferencecache-system", "deployment/inferencecache-index", "-o", "jsonpath={.spec.replicas}"))
	second := kubectl("apply", "--server-side", "-k", "../../kustomize/overlays/dev")
	assert.NotContains(t, strings.ToLower(second), "error")
	after := state()
	assert.Len(t, strings.Split(strings.TrimSpace(after), "\n"), len(index))
	assert.Equal(t, stable(before), stable(after), "the second apply changes none of the index's objects")
	kubectl("wait", "--for=condition=Established", "crd/cachebackends.inferencecache.io", "--timeout=30s")

	k8s, _ := runManager(ctx, t, work, cluster, "")
	quickstartReady(t, ctx, k8s, kubectl)
	t.Run("multiprocess mode without the engine-eviction grant", func(t *testing.T) {
		withoutEvictionGrant(t, ctx, k8s, kubectl, work)
	})
}

// withoutEvictionGrant: the bundle installed without its one pod write
// (the ClusterRoleBinding kustomize/components/without-engine-eviction
// leaves out, deleted here), a multiprocess backend's server replaced on
// the node of a wired engine: the operator, refused by RBAC itself, records
// the Warning event EngineEvictionForbidden naming the engine pod to
// restart by hand, the pod keeps running, and the new server identity is
// recorded (the change is not retried).
func withoutEvictionGrant(t *testing.T, ctx context.Context, k8s client.Client, kubectl func(...string) string, work string) {
	kubectl("delete", "clusterrolebinding", "inferencecache-operator-engine-eviction")
	testutil.Eventually(t, 30*time.Second, func() error {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:inferencecache-system:inferencecache-operator",
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:inferencecache-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "mp", Verb: "create", Resource: "pods", Subresource: "eviction"}}}
		if err := k8s.Create(ctx, sar); err != nil {
			return err
		}
		if sar.Status.Allowed {
			return fmt.Errorf("the operator may still evict")
		}
		return nil
	})
	file := func(name, body string) string {
		p := filepath.Join(work, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	kubectl("create", "namespace", "mp")
	kubectl("apply", "--server-side", "-n", "mp", "-f", file("mp-cache.yaml", `apiVersion: inferencecache.io/v1alpha1
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
`))
	kubectl("wait", "-n", "mp", "--for=condition=Ready", "cachebackend/mp-cache", "--timeout=90s")
	kubectl("apply", "--server-side", "-n", "mp", "-f", file("mp-engine.yaml", `apiVersion: apps/v1
kind: Deployment
metadata:
  name: mp-engine
spec:
  replicas: 1
  selector:
    matchLabels: {app: mp-engine}
  template:
    metadata:
      labels: {app: mp-engine}
    spec:
      containers:
      - name: vllm
        image: vllm/vllm-openai:v0.33.0
        command: [vllm, serve]
        args: [Qwen/Qwen2.5-0.5B-Instruct]
`))
	kubectl("rollout", "status", "-n", "mp", "deployment/mp-engine", "--timeout=90s")
	var pods corev1.PodList
	require.NoError(t, k8s.List(ctx, &pods, client.InNamespace("mp"), client.MatchingLabels{"app": "mp-engine"}))
	require.Len(t, pods.Items, 1)
	engine := pods.Items[0]
	require.Equal(t, "mp/mp-cache", engine.Annotations[v1alpha1.AnnotationInjectedBy], "the engine is wired")
	key := client.ObjectKey{Namespace: "mp", Name: "mp-cache"}
	cb := &v1alpha1.CacheBackend{}
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if cb.Status.ObservedServerInstance == "" {
			return fmt.Errorf("no server instance recorded yet")
		}
		return nil
	})
	recorded := cb.Status.ObservedServerInstance
	var servers corev1.PodList
	require.NoError(t, k8s.List(ctx, &servers, client.InNamespace("mp"), client.MatchingLabels{"inferencecache.io/cachebackend": "mp-cache"}))
	require.Len(t, servers.Items, 1)
	require.NoError(t, k8s.Delete(ctx, &servers.Items[0]))

	testutil.Eventually(t, 90*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if n := testutil.CountEvents(t, k8s, "mp", "mp-cache", v1alpha1.EventEngineEvictionForbidden); n != 1 || cb.Status.ObservedServerInstance == recorded {
			return fmt.Errorf("%d %s events, new identity recorded: %t", n, v1alpha1.EventEngineEvictionForbidden, cb.Status.ObservedServerInstance != recorded)
		}
		return nil
	})
	var events eventsv1.EventList
	require.NoError(t, k8s.List(ctx, &events, client.InNamespace("mp")))
	for _, e := range events.Items {
		if e.Reason == v1alpha1.EventEngineEvictionForbidden {
			assert.Equal(t, corev1.EventTypeWarning, e.Type)
			assert.Contains(t, e.Note, "node "+engine.Spec.NodeName+": "+engine.Name, "the pod to restart by hand")
			assert.Contains(t, e.Note, "inferencecache-operator-engine-eviction", "the grant it lacks")
		}
	}
	require.NoError(t, k8s.List(ctx, &pods, client.InNamespace("mp"), client.MatchingLabels{"app": "mp-engine"}))
	require.Len(t, pods.Items, 1)
	assert.Equal(t, engine.UID, pods.Items[0].UID, "the engine keeps running")
	assert.Zero(t, testutil.CountEvents(t, k8s, "mp", "mp-cache", v1alpha1.EventEngineEvictionBlocked), "not retried as a refusal")
}

// runManager starts the manager binary as the bundle's ServiceAccount,
// with its own webhook certificate, waits for its webhook server and
// points the bundle's webhook configurations at it (the API server cannot
// reach a Service here). A version, when set, is linked in as make build
// does; extraArgs are passed on (the installed Deployment's, where a test
// checks what they do). It returns a client of the test and the manager's
// metrics URL.
func runManager(ctx context.Context, t *testing.T, work string, cluster *localcluster.Cluster, version string, extraArgs ...string) (client.Client, string) {
	t.Helper()
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	k8s, err := client.New(cluster.Config, client.Options{Scheme: s})
	require.NoError(t, err)

	// The manager binary, as the bundle's ServiceAccount.
	managerBin := filepath.Join(work, "manager")
	args := []string{"build", "-o", managerBin}
	if version != "" {
		args = append(args, "-ldflags", "-X github.com/inferencecache/operator/internal/version.Version="+version)
	}
	build := exec.Command("go", append(args, "../../cmd/manager")...)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	kc, err := os.ReadFile(cluster.Kubeconfig)
	require.NoError(t, err)
	saKubeconfig := filepath.Join(work, "manager.kubeconfig")
	require.NoError(t, os.WriteFile(saKubeconfig, []byte(strings.Replace(string(kc), "    client-key:",
		"    as: system:serviceaccount:inferencecache-system:inferencecache-operator\n    client-key:", 1)), 0o600))
	port, err := freeport.Take()
	require.NoError(t, err)
	health, err := freeport.Take()
	require.NoError(t, err)
	metricsPort, err := freeport.Take()
	require.NoError(t, err)
	logf, err := os.Create(filepath.Join(work, "manager.log"))
	require.NoError(t, err)
	t.Cleanup(func() { logf.Close() })
	mgr := exec.CommandContext(ctx, managerBin, append([]string{
		"--namespace=inferencecache-system", "--leader-elect", "--leader-election-namespace=inferencecache-system",
		"--self-signed-webhook-cert", "--webhook-cert-hosts=127.0.0.1",
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", port), "--webhook-cert-dir=" + filepath.Join(work, "certs"),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health),
		"--functional-probe=false",
	}, extraArgs...)...)
	mgr.Env = append(os.Environ(), "KUBECONFIG="+saKubeconfig)
	mgr.Stdout, mgr.Stderr = logf, logf
	require.NoError(t, mgr.Start())
	t.Cleanup(func() {
		_ = mgr.Process.Signal(os.Interrupt)
		_ = mgr.Wait()
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(work, "manager.log"))
			t.Logf("manager log:\n%s", log)
		}
	})
	require.NoError(t, localcluster.WaitServing(ctx, fmt.Sprintf("127.0.0.1:%d", port), 60*time.Second), "the manager's webhook server")

	// The manager published its CA; point the configurations at it.
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Name: "inferencecache-pod-injector"}, mwc); err != nil {
			return err
		}
		if len(mwc.Webhooks[0].ClientConfig.CABundle) == 0 {
			return fmt.Errorf("no caBundle published yet")
		}
		return nil
	})
	url := func(path string) *string { u := fmt.Sprintf("https://127.0.0.1:%d%s", port, path); return &u }
	mwc.Webhooks[0].ClientConfig.URL, mwc.Webhooks[0].ClientConfig.Service = url("/mutate-v1-pod"), nil
	require.NoError(t, k8s.Update(ctx, mwc))
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Name: "inferencecache-cachebackend-validator"}, vwc))
	require.NotEmpty(t, vwc.Webhooks[0].ClientConfig.CABundle)
	vwc.Webhooks[0].ClientConfig.URL, vwc.Webhooks[0].ClientConfig.Service = url("/validate-inferencecache-io-v1alpha1-cachebackend"), nil
	require.NoError(t, k8s.Update(ctx, vwc))

	return k8s, fmt.Sprintf("https://127.0.0.1:%d/metrics", metricsPort)
}

// quickstartReady applies the quickstart: the CacheBackend becomes Ready
// and the engine's pods are wired by the webhook.
func quickstartReady(t *testing.T, ctx context.Context, k8s client.Client, kubectl func(...string) string) {
	t.Helper()
	kubectl("apply", "--server-side", "-f", "../../examples/quickstart/cachebackend.yaml")
	kubectl("wait", "--for=condition=Ready", "cachebackend/qwen-demo-cache", "--timeout=90s")
	cb := &v1alpha1.CacheBackend{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "qwen-demo-cache"}, cb))
	assert.Equal(t, "lm://qwen-demo-cache.default.svc.cluster.local:65432", cb.Status.Endpoint)
	assert.True(t, meta.IsStatusConditionTrue(cb.Status.Conditions, v1alpha1.ConditionReady))

	kubectl("apply", "--server-side", "-f", "../../examples/quickstart/engine.yaml")
	kubectl("rollout", "status", "deployment/qwen-engine", "--timeout=90s")
	var pods corev1.PodList
	require.NoError(t, k8s.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{"app": "qwen-demo"}))
	require.NotEmpty(t, pods.Items)
	for _, p := range pods.Items {
		assert.Equal(t, "default/qwen-demo-cache", p.Annotations[v1alpha1.AnnotationInjectedBy], "pod %s wired", p.Name)
		assert.Contains(t, p.Spec.Containers[0].Args, inject.KVTransferConfigFlag)
	}
}

// TestProductionOverlayAppliesTwice: the production overlay (cert-manager
// Issuer and Certificate, CA injection) installs and upgrades cleanly with
// kubectl apply --server-side -k, twice. cert-manager cannot run here: its
// kinds are registered by stand-in CRDs (testdata), so this proves the
// bundle applies, not that cert-manager issues the certificate.
func TestProductionOverlayAppliesTwice(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, kubectl := startCluster(ctx, t, t.TempDir(), "testdata")
	first := kubectl("apply", "--server-side", "-k", "../../kustomize/overlays/production")
	assert.Contains(t, first, "certificate.cert-manager.io/inferencecache-webhook serverside-applied")
	second := kubectl("apply", "--server-side", "-k", "../../kustomize/overlays/production")
	assert.NotContains(t, strings.ToLower(second), "error")
	out := kubectl("get", "mutatingwebhookconfiguration", "inferencecache-pod-injector", "-o", "jsonpath={.metadata.annotations}")
	assert.Contains(t, out, "inferencecache-system/inferencecache-webhook", "cert-manager is asked to inject the CA")
}

// startCluster starts a local cluster of the test's own (stopped when the
// test ends), with the CRDs of crdDir if set, and returns a kubectl for it.
func startCluster(ctx context.Context, t *testing.T, work, crdDir string) (*localcluster.Cluster, func(...string) string) {
	t.Helper()
	bin, err := controlplane.Dir()
	require.NoError(t, err, "the local control plane")
	cluster, err := localcluster.Start(ctx, localcluster.Options{BinDir: bin, WorkDir: filepath.Join(work, "cluster"), Nodes: 1, CRDDir: crdDir})
	require.NoError(t, err)
	t.Cleanup(cluster.Stop)
	return cluster, func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "kubectl"), args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.Kubeconfig)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "kubectl %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
}
