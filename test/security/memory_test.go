package security

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

// peakRSS is VmHWM of a process, in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestWebhookUnderAMemoryLimit builds cmd/manager and runs it with
// GOMEMLIMIT=64MiB as the Pod webhook of a real API server, then creates
// 16 pods of 2 MiB of env each at once where the webhook does not serve,
// and 16 more where it does, each batch matched by a CacheBackend. The
// manager stays up, the served batch costs it less than the budget in
// allocated bytes beyond what the unserved one costs its informers and
// reconciles, and every pod is admitted: unwired, since each request
// exceeds the 1 MiB guard.
func TestWebhookUnderAMemoryLimit(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = os.Getenv("CONTROLPLANE_DIR")
	}
	require.NotEmpty(t, assets, "set KUBEBUILDER_ASSETS (or CONTROLPLANE_DIR) to the control-plane binaries (make controlplane)")
	work := t.TempDir()
	bin := filepath.Join(work, "manager")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/manager")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	etcd := &envtest.Etcd{}
	etcd.Configure().Set("max-request-bytes", strconv.Itoa(8<<20)) // 2 MiB pods
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ControlPlane: envtest.ControlPlane{Etcd: etcd},
		CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{"../../kustomize/base/crd"}, ErrorIfPathMissing: true}}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kubeconfig := filepath.Join(work, "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, env.KubeConfig, 0o600))

	for _, ns := range []string{operatorNamespace, "llm"} {
		require.NoError(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	port, health, metricsPort := freeport.MustTake(t), freeport.MustTake(t), freeport.MustTake(t)
	none := admissionregistrationv1.SideEffectClassNone
	require.NoError(t, k8s.Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "inferencecache-pod-injector"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "inject.inferencecache.io", AdmissionReviewVersions: []string{"v1"}, SideEffects: &none,
			FailurePolicy:  ptr.To(admissionregistrationv1.Ignore),
			TimeoutSeconds: ptr.To[int32](10),
			ClientConfig:   admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d/mutate-v1-pod", port))},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "llm"}},
		}},
	}))

	// The manager publishes its CA on both of its webhook configurations;
	// the validating one matches nothing here.
	require.NoError(t, k8s.Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "inferencecache-cachebackend-validator"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "validate.cachebackend.inferencecache.io", AdmissionReviewVersions: []string{"v1"}, SideEffects: &none,
			ClientConfig:      admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d/x", port))},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"never": "matches"}},
		}},
	}))
	mgr := exec.CommandContext(ctx, bin, "--namespace="+operatorNamespace, "--self-signed-webhook-cert", "--webhook-cert-hosts=127.0.0.1",
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", port), "--webhook-cert-dir="+filepath.Join(work, "certs"),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort), "--metrics-secure=false", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health), "--functional-probe=false")
	mgr.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "GOMEMLIMIT=64MiB")
	logf, err := os.Create(filepath.Join(work, "manager.log"))
	require.NoError(t, err)
	mgr.Stdout, mgr.Stderr = logf, logf
	require.NoError(t, mgr.Start())
	exited := make(chan error, 1)
	go func() { exited <- mgr.Wait() }()
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("manager log:\n%s", b)
		}
	})
	ready := false
	for range 600 {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", health))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ready = true
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.True(t, ready, "the manager became ready")

	// The same backend in a namespace the webhook does not serve: its pods
	// cost the manager's informers and reconciles what the served ones
	// do, without the webhook.
	require.NoError(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bystander"}}))
	for _, ns := range []string{"llm", "bystander"} {
		require.NoError(t, k8s.Create(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache"},
			Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
				EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "big"}}}}))
	}

	// Peak RSS moves by 20 to 35 MiB with each batch of 16 pods of 2 MiB
	// whether the webhook serves them or not (the receipt informer decodes
	// every pod in full to digest it; the garbage collector's timing does
	// the rest), too noisy to hold the webhook to. What the webhook costs
	// is read from the bytes the manager allocates: per batch, served
	// against unserved.
	rssBefore := peakRSS(t, mgr.Process.Pid)
	batch := func(ns, name string) (allocated int64) {
		from := allocatedBytes(t, metricsPort)
		pods := createBig(ctx, t, k8s, ns, name)
		seen(ctx, t, k8s, name+"-done")
		for _, p := range pods {
			assert.Empty(t, p.Annotations[v1alpha1.AnnotationInjectedBy], "unwired (%s): the guard tripped or the webhook did not serve", ns)
		}
		return allocatedBytes(t, metricsPort) - from
	}
	unserved := batch("bystander", "unserved")
	served := batch("llm", "served")
	select {
	case err := <-exited:
		t.Fatalf("the manager exited: %v", err)
	default:
	}
	rss := peakRSS(t, mgr.Process.Pid)
	t.Logf("manager peak RSS: %d MiB before the pods, %d MiB after 2 × 16; allocated: %d MiB for 16 unserved, %d MiB for 16 served (webhook: %+d MiB)",
		rssBefore>>20, rss>>20, unserved>>20, served>>20, (served-unserved)>>20)
	// Budget: the webhook allocates less than 8 MiB for 32 MiB of
	// requests it does not decode; measured, the served batch allocated
	// 4 to 6 MiB less than the unserved one (which also warms the
	// manager's caches). Without the guard (its limits raised by flag)
	// it allocated 58 MiB more.
	assert.Less(t, served-unserved, int64(8<<20), "the webhook allocates less than 8 MiB for 16 oversized pods")
	logs, _ := os.ReadFile(logf.Name())
	assert.Contains(t, string(logs), "pod admitted unwired without decoding it", "a log line per tripped guard")
}

// createBig creates 16 pods of 2 MiB of env each (less 8 KiB, etcd's
// limit) at once in ns, named <prefix>-<i>, labelled for the CacheBackend of
// TestWebhookUnderAMemoryLimit.
func createBig(ctx context.Context, t *testing.T, k8s client.Client, ns, prefix string) []*corev1.Pod {
	var wg sync.WaitGroup
	errs := make([]error, 16)
	pods := make([]*corev1.Pod, 16)
	for i := range 16 {
		wg.Go(func() {
			pods[i] = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", prefix, i), Labels: map[string]string{"app": "big"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm",
					// 2 MiB less 8 KiB: the API server's etcd client sends at most 2 MiB per object.
					Env: []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("x", 2<<20-8<<10)}}}}}}
			errs[i] = k8s.Create(ctx, pods[i])
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "pod %s/%s-%d admitted", ns, prefix, i)
	}
	return pods
}

// seen creates a small pod, name, in the namespace the webhook does not
// serve, with a skip stamp, and waits until the manager's receipt
// controller has reported it: its pod informer, one watch of the whole
// cluster in resourceVersion order, has then decoded every pod created
// before it.
func seen(ctx context.Context, t *testing.T, k8s client.Client, name string) {
	require.NoError(t, k8s.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "bystander", Name: name,
		Annotations: map[string]string{v1alpha1.AnnotationInjectSkipped: "marker"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}}}}))
	for range 600 {
		var evs eventsv1.EventList
		require.NoError(t, k8s.List(ctx, &evs, client.InNamespace("bystander")))
		for _, ev := range evs.Items {
			if ev.Regarding.Kind == "Pod" && ev.Regarding.Name == name {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the manager reported no receipt event for pod bystander/%s", name)
}

// allocatedBytes is the manager's go_memstats_alloc_bytes_total: every
// byte it has allocated on the heap since it started.
func allocatedBytes(t *testing.T, port int) int64 {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_alloc_bytes_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return int64(f)
		}
	}
	require.NoError(t, sc.Err())
	t.Fatal("no go_memstats_alloc_bytes_total in the manager's metrics")
	return 0
}
