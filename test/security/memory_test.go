package security

import (
	"bufio"
	"context"
	"fmt"
	"net"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/inferencecache/operator/api/v1alpha1"
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
// 16 pods of 2 MiB of env each (less 8 KiB, etcd's limit) at once, matched by a CacheBackend. The
// manager stays up, its peak RSS stays within budget, and every pod is
// admitted: unwired, since each request exceeds the 1 MiB guard.
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
	port, health := freePort(t), freePort(t)
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
		"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health), "--functional-probe=false")
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

	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache"},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "big"}}}}
	require.NoError(t, k8s.Create(ctx, cb))

	before := peakRSS(t, mgr.Process.Pid)
	var wg sync.WaitGroup
	errs := make([]error, 16)
	pods := make([]*corev1.Pod, 16)
	for i := range 16 {
		wg.Go(func() {
			pods[i] = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: fmt.Sprintf("big-%d", i), Labels: map[string]string{"app": "big"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm",
					// 2 MiB less 8 KiB: the API server's etcd client sends at most 2 MiB per object.
					Env: []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("x", 2<<20-8<<10)}}}}}}
			errs[i] = k8s.Create(ctx, pods[i])
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "pod %d admitted", i)
		assert.Empty(t, pods[i].Annotations["inferencecache.io/injected-by"], "unwired: the guard tripped")
	}
	select {
	case err := <-exited:
		t.Fatalf("the manager exited: %v", err)
	default:
	}
	peak := peakRSS(t, mgr.Process.Pid)
	t.Logf("manager peak RSS: %d MiB before the pods, %d MiB after", before>>20, peak>>20)
	// Budget: 32 MiB of growth for 32 MiB of requests. Without the guard
	// (the limits raised by flag) the same run grew by 56 MiB (73 to 129).
	assert.Less(t, peak-before, int64(32<<20), "peak RSS grows by less than 32 MiB under GOMEMLIMIT=64MiB")
	logs, _ := os.ReadFile(logf.Name())
	assert.Contains(t, string(logs), "pod admitted unwired without decoding it", "a log line per tripped guard")
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
