package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// TestPodCreateIsWired: lifecycle steps 2 and 3 through the real API server:
// the webhook wires a matching pod at CREATE and stamps the receipt; the
// receipt controller verifies it and records InjectedByCacheBackend once,
// also when a fresh controller (as after a restart) looks at the pod again.
func TestPodCreateIsWired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.ServingBackend(t, ns, "cache")
	pod := suite.Engine(ns, "engine", map[string]string{"app": "engine-cache"}, nil)
	require.NoError(t, suite.K8s.Create(ctx, pod))

	assert.True(t, suite.IsWired(pod), "the created pod carries the LMCache environment")
	assert.Equal(t, []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct", "--kv-transfer-config",
		`{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`}, pod.Spec.Containers[0].Args)
	assert.Equal(t, ns+"/cache", pod.Annotations[v1alpha1.AnnotationInjectedBy])
	assert.Equal(t, string(cb.UID), pod.Annotations[v1alpha1.AnnotationInjectedByUID])
	assert.Equal(t, fmt.Sprint(cb.Generation), pod.Annotations[v1alpha1.AnnotationInjectedGeneration])
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == "LMCACHE_REMOTE_URL" {
			assert.Equal(t, cb.Status.Endpoint, e.Value)
		}
	}

	suite.WaitPodEvent(t, ns, "engine", "Normal/"+v1alpha1.EventInjected)
}

// requestLog records the API requests of one manager, as a client-side
// transport sees them.
type requestLog struct {
	mu   sync.Mutex
	reqs []string // "<METHOD> <path>"
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return suite.RoundTripFunc(func(req *http.Request) (*http.Response, error) {
		l.mu.Lock()
		l.reqs = append(l.reqs, req.Method+" "+req.URL.Path)
		l.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

// count returns how many requests match.
func (l *requestLog) count(match func(method, path string) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.reqs {
		m, p, _ := strings.Cut(r, " ")
		if match(m, p) {
			n++
		}
	}
	return n
}

// startReceiptManager runs a second manager with only the receipt
// controller, as shipped (its own pod view, the key ring), against the
// same API server, recording every request it sends.
func startReceiptManager(t *testing.T) *requestLog {
	t.Helper()
	log := &requestLog{}
	rcfg := rest.CopyConfig(suite.Cfg)
	rcfg.Wrap(log.wrap)
	mgr, err := ctrl.NewManager(rcfg, ctrl.Options{
		Scheme:                 suite.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	keys := &receipt.KeyRing{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: suite.OperatorNamespace, Name: receipt.DefaultSecretName}
	require.NoError(t, mgr.Add(keys))
	pods, err := controller.NewReceiptPodCache(mgr)
	require.NoError(t, err)
	require.NoError(t, mgr.Add(pods))
	r := &controller.ReceiptReconciler{Client: mgr.GetClient(), Keys: keys, Instance: "second-manager"}
	require.NoError(t, r.SetupWithManager(mgr, pods))
	t.Cleanup(testutil.RunManager(context.Background(), mgr))
	return log
}

// TestReceiptEventBudget: issue 12's per-pod budget and the once-per-pod
// event across managers. A wired pod costs the operator one API request,
// the create of its event, and nothing on the pod (no write, no GET); a
// second manager (as after a restart, or a second replica) reports no pod
// a second time: its one create per pod answers AlreadyExists. A pod that
// carries the old receipt-observed mark is reported all the same.
func TestReceiptEventBudget(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	suite.ServingBackend(t, ns, "cache")
	names := []string{"engine-0", "engine-1", "engine-2"}
	for _, name := range names {
		require.NoError(t, suite.K8s.Create(ctx, suite.Engine(ns, name, map[string]string{"app": "engine-cache"}, nil)))
	}
	for _, name := range names {
		suite.WaitPodEvent(t, ns, name, "Normal/"+v1alpha1.EventInjected)
	}

	log := startReceiptManager(t)
	// A pod created while the second manager runs, with the mark that used
	// to suppress the event pre-set (the webhook leaves it: it means
	// nothing), and a look-alike event its creator made in advance (they
	// may create Events; the pod's UID, and so the real name, they cannot
	// know yet).
	decoy := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "engine-marked.decoy"},
		EventTime:  metav1.NowMicro(), ReportingController: v1alpha1.ReportingController, ReportingInstance: "pod-creator",
		Action: "Admit", Reason: v1alpha1.EventInjected, Type: corev1.EventTypeNormal, Note: "already reported",
		Regarding: corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: ns, Name: "engine-marked"},
	}
	require.NoError(t, suite.K8s.Create(ctx, decoy))
	marked := suite.Engine(ns, "engine-marked", map[string]string{"app": "engine-cache"},
		map[string]string{"inferencecache.io/receipt-observed": v1alpha1.EventInjected})
	require.NoError(t, suite.K8s.Create(ctx, marked))
	require.True(t, suite.IsWired(marked))
	keys, err := (&receipt.KeyRing{Client: suite.K8s, Reader: suite.K8s, Namespace: suite.OperatorNamespace, Name: receipt.DefaultSecretName}).Keys(ctx)
	require.NoError(t, err)
	reported := &eventsv1.Event{}
	testutil.Eventually(t, 15*time.Second, func() error {
		return suite.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: receipt.EventName(keys[0], marked.Name, string(marked.UID))}, reported)
	})
	assert.Equal(t, marked.UID, reported.Regarding.UID, "the operator's own event, keyed by the pod's UID")
	assert.Equal(t, v1alpha1.EventInjected, reported.Reason)
	require.NoError(t, suite.K8s.Delete(ctx, decoy))
	names = append(names, marked.Name)

	inNS := "/namespaces/" + ns + "/"
	testutil.Eventually(t, 15*time.Second, func() error {
		n := log.count(func(method, path string) bool {
			return method == http.MethodPost && strings.Contains(path, inNS+"events")
		})
		if n < len(names) {
			return fmt.Errorf("the second manager sent %d event creates, want one per pod (%d)", n, len(names))
		}
		return nil
	})
	// Updates of the pods after their report send nothing more: touch each.
	for _, name := range names {
		p := &corev1.Pod{}
		require.NoError(t, suite.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p))
		p.Labels["touched"] = "yes"
		require.NoError(t, suite.K8s.Update(ctx, p))
	}
	// A sentinel pod created last: once the second manager reported it, it
	// has seen the updates above (one watch, in order).
	sentinel := suite.Engine(ns, "sentinel", map[string]string{"app": "engine-cache"}, nil)
	require.NoError(t, suite.K8s.Create(ctx, sentinel))
	names = append(names, sentinel.Name)
	testutil.Eventually(t, 15*time.Second, func() error {
		n := log.count(func(method, path string) bool {
			return method == http.MethodPost && strings.Contains(path, inNS+"events")
		})
		if n < len(names) {
			return fmt.Errorf("the second manager sent %d event creates, want %d", n, len(names))
		}
		return nil
	})
	writes := log.count(func(method, path string) bool {
		return method != http.MethodGet && strings.Contains(path, inNS)
	})
	podWrites := log.count(func(method, path string) bool {
		return method != http.MethodGet && strings.Contains(path, inNS+"pods")
	})
	podGets := log.count(func(method, path string) bool {
		return method == http.MethodGet && strings.Contains(path, inNS+"pods/")
	})
	t.Logf("second manager, %d wired pods: %d writes, %d pod writes, %d pod GETs", len(names), writes, podWrites, podGets)
	assert.LessOrEqual(t, writes, len(names), "at most one write (the event) per wired pod")
	assert.Zero(t, podWrites, "no write to a pod")
	assert.Zero(t, podGets, "no GET of a pod")
	for _, name := range names {
		suite.WaitPodEvent(t, ns, name, "Normal/"+v1alpha1.EventInjected)
		assert.Equal(t, map[string]int{"Normal/" + v1alpha1.EventInjected: 1}, suite.PodEvents(t, ns, name), "pod %s: one event across two managers", name)
	}
}

// TestRelabelledPodIsNotWired: the failure-modes row "labelled after
// creation": the match is evaluated at CREATE only.
func TestRelabelledPodIsNotWired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	suite.ServingBackend(t, ns, "cache")
	pod := suite.Engine(ns, "late", map[string]string{"app": "unrelated"}, nil)
	require.NoError(t, suite.K8s.Create(ctx, pod))
	assert.False(t, suite.IsWired(pod))

	pod.Labels = map[string]string{"app": "engine-cache"}
	require.NoError(t, suite.K8s.Update(ctx, pod))
	assert.False(t, suite.IsWired(pod), "relabelling does not wire an existing pod")
	assert.Empty(t, pod.Annotations[v1alpha1.AnnotationInjectedBy])
	suite.WaitBackend(t, client.ObjectKey{Namespace: ns, Name: "cache"}, func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.MatchedEnginePods != 1 {
			return fmt.Errorf("matched %d", cb.Status.MatchedEnginePods)
		}
		return nil
	})
}

// TestPodsBeforeTheEndpointStayUnwired: lifecycle step 1: the webhook
// admits a pod that a backend without status.endpoint selects unwired
// (fail-open, with the no-endpoint warning), with no annotation and no
// event, yet counted as matched. A pod admitted before the webhook's cache
// holds the backend is a no-match, which leaves a pod unwired too: the
// admission warning tells the two apart, so the test waits for a pod the
// webhook failed open for.
func TestPodsBeforeTheEndpointStayUnwired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	require.NoError(t, suite.K8s.Create(ctx, cb))
	warnings := &warningRecorder{}
	wcfg := rest.CopyConfig(suite.Cfg)
	wcfg.WarningHandler = warnings
	c, err := client.New(wcfg, client.Options{Scheme: suite.Scheme})
	require.NoError(t, err)

	var pod *corev1.Pod
	created := int32(0)
	testutil.Eventually(t, 15*time.Second, func() error {
		p := suite.Engine(ns, fmt.Sprintf("early-%d", created), map[string]string{"app": "engine-cache"}, nil)
		warnings.reset()
		if err := c.Create(ctx, p); err != nil {
			return err
		}
		created++
		if !warnings.has("has no status.endpoint yet") {
			return fmt.Errorf("pod %s admitted without the fail-open warning (no match yet?): %v", p.Name, warnings.all())
		}
		pod = p
		return nil
	})
	assert.False(t, suite.IsWired(pod))
	assert.Empty(t, pod.Annotations)
	suite.WaitBackend(t, client.ObjectKeyFromObject(cb), func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.MatchedEnginePods != created {
			return fmt.Errorf("matched %d, want %d", cb.Status.MatchedEnginePods, created)
		}
		return nil
	})
	assert.Empty(t, suite.PodEvents(t, ns, pod.Name))
}

// warningRecorder collects the API server's warnings (admission warnings
// among them).
type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningRecorder) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = nil
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

func (w *warningRecorder) has(s string) bool {
	for _, m := range w.all() {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// TestSkippedPodGetsEvent: the opt-out row: stamped skip-inject-annotation,
// unwired, with a SkippedByOperator event.
func TestSkippedPodGetsEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	suite.ServingBackend(t, ns, "cache")
	pod := suite.Engine(ns, "vanilla", map[string]string{"app": "engine-cache"}, map[string]string{v1alpha1.AnnotationSkipInject: "true"})
	require.NoError(t, suite.K8s.Create(ctx, pod))
	assert.False(t, suite.IsWired(pod))
	assert.Equal(t, v1alpha1.SkippedByAnnotation, pod.Annotations[v1alpha1.AnnotationInjectSkipped])
	assert.Equal(t, "true", pod.Annotations[v1alpha1.AnnotationSkipInject])
	assert.Empty(t, pod.Annotations[v1alpha1.AnnotationInjectedBy])
	suite.WaitPodEvent(t, ns, "vanilla", "Normal/"+v1alpha1.EventSkipped)
}

// TestWebhookUnreachable: with failurePolicy Ignore, pods are admitted while
// the webhook cannot be reached: unwired and without receipts; a receipt
// written by hand is not trusted (Warning ReceiptMismatch, never
// InjectedByCacheBackend).
func TestWebhookUnreachable(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	suite.ServingBackend(t, ns, "cache")

	suite.WithWebhookUnreachable(t, func() {
		// The webhook configuration change reaches the API server's admission
		// chain asynchronously: wait until a pod is admitted without it.
		var plain *corev1.Pod
		testutil.Eventually(t, 15*time.Second, func() error {
			plain = suite.Engine(ns, fmt.Sprintf("plain-%d", time.Now().UnixNano()), map[string]string{"app": "engine-cache"}, nil)
			if err := suite.K8s.Create(ctx, plain); err != nil {
				return err
			}
			if suite.IsWired(plain) {
				return fmt.Errorf("still wired by the webhook")
			}
			return nil
		})
		assert.Empty(t, plain.Annotations, "admitted unwired and without receipts")

		forged := suite.Engine(ns, "forged", map[string]string{"app": "engine-cache"}, map[string]string{
			v1alpha1.AnnotationInjectedBy: ns + "/cache", v1alpha1.AnnotationInjectedByUID: "00000000-copied-from-another-pod", v1alpha1.AnnotationInjectedGeneration: "1",
			// The mark that used to suppress the event, pre-set: it means nothing.
			"inferencecache.io/receipt-observed": v1alpha1.EventInjected,
		})
		require.NoError(t, suite.K8s.Create(ctx, forged))
		assert.False(t, suite.IsWired(forged))
		suite.WaitPodEvent(t, ns, "forged", "Warning/"+v1alpha1.EventReceiptMismatch)
		assert.Zero(t, suite.PodEvents(t, ns, "forged")["Normal/"+v1alpha1.EventInjected])
	})
}

// TestValidatingWebhookRejectsWhatTheSchemaCannot: rules beyond the CRD
// schema, each naming the field.
func TestValidatingWebhookRejectsWhatTheSchemaCannot(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	cases := []struct {
		name   string
		mutate func(*v1alpha1.CacheBackend)
		field  string
		text   string
	}{
		{"override of the injected kv-transfer-config", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: []string{"--kv-transfer-config={}"}}
		}, "spec.integration.engineOverrides.args[0]", "set by the injection"},
		{"override of the endpoint", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{{Name: "LMCACHE_REMOTE_URL", Value: "lm://x:1"}}}
		}, "spec.integration.engineOverrides.env[0].name", "cannot be overridden"},
		{"invalid env name", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{{Name: "1=BAD", Value: "x"}}}
		}, "spec.integration.engineOverrides.env[0].name", "environment variable name"},
		{"the PYTHONWARNINGS and BROWSER attack (issue 25)", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{
				{Name: "PYTHONWARNINGS", Value: "ignore::antigravity.x"}, {Name: "BROWSER", Value: "sh -c 'id' %s"}}}
		}, "spec.integration.engineOverrides.env[1].name", "annotated inferencecache.io/allow-overrides"},
		{"remote code and the attacker's tokenizer (issue 25)", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: []string{"--trust-remote-code", "--tokenizer", "attacker/tok"}}
		}, "spec.integration.engineOverrides.args[1]", "move it to spec.integration.engineOverrides.optIn.args"},
		{"a denied name even under optIn", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{OptIn: &v1alpha1.OptInOverrides{Env: []corev1.EnvVar{{Name: "LD_PRELOAD", Value: "/x.so"}}}}
		}, "spec.integration.engineOverrides.optIn.env[0].name", "LD_*"},
		{"an override value the kubelet would expand (issue 35)", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: []string{"--served-model-name", "$(HF_TOKEN)"}}
		}, "spec.integration.engineOverrides.args[1]", "write $$( for a literal $("},
		{"invalid selector key", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels = map[string]string{"bad key!": "x"}
		}, "spec.engineSelector.matchLabels[bad key!]", "label key"},
		{"invalid selector value", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": "has spaces"}
		}, "spec.engineSelector.matchLabels[app]", "label value"},
		{"invalid engine container", func(cb *v1alpha1.CacheBackend) { cb.Spec.Integration.EngineContainer = "Not_A_Name" },
			"spec.integration.engineContainer", "container name"},
		// The declared engine releases (issue 36) are release versions.
		{"an unreadable vLLM release", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.Versions = &v1alpha1.EngineVersions{VLLM: "newest"}
		}, "spec.integration.versions.vllm", "should match"},
		{"an unreadable LMCache release", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.Versions = &v1alpha1.EngineVersions{LMCache: "0.5.7; rm -rf"}
		}, "spec.integration.versions.lmcache", "should match"},
		// Multiprocess mode (issue 23): what LMCache's server refuses or
		// runs wrongly, and the in-process server's fields.
		{"MP L1 not whole GiB", func(cb *v1alpha1.CacheBackend) { suite.MP(cb).L1.Size = resource.MustParse("1536Mi") },
			"spec.multiprocess.l1.size", "whole number of GiB"},
		{"MP L1 watermark above 100 percent", func(cb *v1alpha1.CacheBackend) { suite.MP(cb).L1.EvictionWatermarkPercent = 150 },
			"spec.multiprocess.l1.evictionWatermarkPercent", "less than or equal to 100"},
		{"MP eviction policy noop", func(cb *v1alpha1.CacheBackend) { suite.MP(cb).L1.EvictionPolicy = "noop" },
			"spec.multiprocess.l1.evictionPolicy", `Unsupported value: "noop"`},
		{"MP RESP with TLS", func(cb *v1alpha1.CacheBackend) {
			suite.MP(cb).L2 = &v1alpha1.MultiprocessL2{RESP: &v1alpha1.MultiprocessRESP{Host: "redis", TLS: true, Capacity: resource.MustParse("1Gi")}}
		}, "spec.multiprocess.l2.resp.tls", "no TLS"},
		{"MP disk at the root", func(cb *v1alpha1.CacheBackend) {
			suite.MP(cb).L2 = &v1alpha1.MultiprocessL2{Disk: &v1alpha1.MultiprocessDisk{Path: "/", Capacity: resource.MustParse("1Gi")}}
		}, "spec.multiprocess.l2.disk.path", "root folder"},
		{"MP server memory limit below L1", func(cb *v1alpha1.CacheBackend) {
			suite.MP(cb).L1.Size = resource.MustParse("20Gi")
			cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Resources: &corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")}}}}
		}, "spec.remoteStorage.lmCacheServer.resources.limits.memory", "at least 21Gi"},
		{"MP with a StatefulSet", func(cb *v1alpha1.CacheBackend) {
			suite.MP(cb)
			cb.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet
		}, "spec.deploymentKind", "DaemonSet"},
		{"MP with autoscaling", func(cb *v1alpha1.CacheBackend) {
			suite.MP(cb)
			cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MaxReplicas: 3}
		}, "spec.autoscaling", "in-process lmcache_server"},
		{"MP with in-process LMCache settings", func(cb *v1alpha1.CacheBackend) {
			suite.MP(cb)
			cb.Spec.LMCache = &v1alpha1.LMCacheConfig{ChunkSize: ptr.To(int32(256))}
		}, "spec.lmCache", "LMCacheMPConnector does not use"},
		{"MP on an engine-local type", func(cb *v1alpha1.CacheBackend) {
			suite.MP(cb)
			cb.Spec.Type, cb.Spec.Runtime = v1alpha1.BackendTypeSGLangHiCache, v1alpha1.RuntimeSGLang
		}, "spec", "multiprocess is only valid with type LMCache"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cb := suite.NewBackend(ns, "invalid")
			tc.mutate(cb)
			err := suite.K8s.Create(context.Background(), cb, client.DryRunAll)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field)
			assert.Contains(t, err.Error(), tc.text)
		})
	}
	// What the attack needs, under optIn, is admitted: it reaches only the
	// pods whose template opts in.
	cb := suite.NewBackend(ns, "opted")
	cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{OptIn: &v1alpha1.OptInOverrides{
		Args: []string{"--trust-remote-code"}, Env: []corev1.EnvVar{{Name: "PYTHONWARNINGS", Value: "default"}}}}
	require.NoError(t, suite.K8s.Create(context.Background(), cb, client.DryRunAll))
	// A multiprocess backend with both L2 tiers is admitted.
	cb = suite.NewBackend(ns, "mp")
	suite.MP(cb).L2 = &v1alpha1.MultiprocessL2{
		RESP: &v1alpha1.MultiprocessRESP{Host: "redis.cache.svc", Capacity: resource.MustParse("10Gi"),
			CredentialsSecretRef: &v1alpha1.RESPCredentials{Name: "redis-auth", UsernameKey: "username"}},
		Disk: &v1alpha1.MultiprocessDisk{Capacity: resource.MustParse("100Gi")}}
	// and so are declared releases as Parse reads them (issue 36).
	cb.Spec.Integration.Versions = &v1alpha1.EngineVersions{VLLM: "v0.34.0", LMCache: "0.5.7rc2"}
	require.NoError(t, suite.K8s.Create(context.Background(), cb, client.DryRunAll))
}

// TestDeletedBackendLeavesWiringInPlace: the failure-modes row "CacheBackend
// deleted, engines keep the old wiring": wiring lasts for the pod's life,
// and pods created afterwards match nothing.
func TestDeletedBackendLeavesWiringInPlace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.ServingBackend(t, ns, "cache")
	wired := suite.Engine(ns, "wired", map[string]string{"app": "engine-cache"}, nil)
	require.NoError(t, suite.K8s.Create(ctx, wired))
	require.True(t, suite.IsWired(wired))

	require.NoError(t, suite.K8s.Delete(ctx, cb))
	testutil.Eventually(t, 10*time.Second, func() error {
		err := suite.K8s.Get(ctx, client.ObjectKeyFromObject(cb), &v1alpha1.CacheBackend{})
		if err == nil {
			return fmt.Errorf("CacheBackend still there")
		}
		return client.IgnoreNotFound(err)
	})
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(wired), wired))
	assert.True(t, suite.IsWired(wired), "an admitted pod keeps its wiring")
	// The webhook's cache may lag the deletion for a moment.
	testutil.Eventually(t, 10*time.Second, func() error {
		fresh := suite.Engine(ns, fmt.Sprintf("fresh-%d", time.Now().UnixNano()), map[string]string{"app": "engine-cache"}, nil)
		if err := suite.K8s.Create(ctx, fresh); err != nil {
			return err
		}
		if suite.IsWired(fresh) || len(fresh.Annotations) > 0 {
			return fmt.Errorf("pod %s wired after the backend was deleted", fresh.Name)
		}
		return nil
	})
}
