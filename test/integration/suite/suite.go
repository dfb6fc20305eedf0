// Package suite is the integration tests' shared setup: a real
// kube-apiserver and etcd (envtest, from the local control plane) with the
// shipped controllers and webhooks (controller.Setup) running in a
// manager, and the helpers the tests share. Each test package runs it from
// its TestMain (os.Exit(suite.Run(m))) and gets a control plane of its
// own; tests in one package share it and make a namespace each
// (NewNamespace). There is no kube-controller-manager here: tests that
// need a Deployment's status write it themselves, as the Deployment
// controller would, and garbage collection is proven end to end in
// test/e2e.
package suite

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/manifests"
	"github.com/inferencecache/operator/test/testutil"
)

// OperatorNamespace is the manager's namespace (it holds the receipt key
// Secret the manager creates).
const OperatorNamespace = "inferencecache-system"

// What Run sets up, for the tests.
var (
	// Prober is the manager's functional probe; it dials a local listener
	// that answers LMCache's HEALTH request as lmcache_server does,
	// instead of the Service. A test closes a backend's target by storing
	// its address in ClosedTargets.
	Prober        *controller.Prober
	ClosedTargets sync.Map
	// Cfg reaches the API server as its administrator; K8s is a client
	// of it (Scheme: client-go's kinds and the API's).
	Cfg    *rest.Config
	K8s    client.Client
	Scheme = k8sruntime.NewScheme()
	nsSeq  atomic.Int64
)

// repoRoot is the repository's top directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Run starts the control plane and the manager, runs the package's tests
// and stops both; it is the package's exit code. The tests share the
// manager: each makes its own namespace.
func Run(m *testing.M) int {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(v1alpha1.AddToScheme(Scheme))
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(false), zap.Level(testutil.ZapLevel())))

	dir, err := controlplane.Dir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration tests need the local control plane:", err)
		return 1
	}
	mwc, vwc, err := manifests.Webhooks(filepath.Join(repoRoot(), "kustomize", "base"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(repoRoot(), "kustomize", "base", "crd")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: dir,
		// The webhook configurations the install bundle ships, pointed by
		// envtest at the manager's webhook server below.
		WebhookInstallOptions: envtest.WebhookInstallOptions{MutatingWebhooks: mwc, ValidatingWebhooks: vwc},
	}
	Cfg, err = env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting kube-apiserver and etcd:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()

	K8s, err = client.New(Cfg, client.Options{Scheme: Scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The operator's namespace holds the receipt key Secret it creates.
	if err := K8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OperatorNamespace}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mgr, err := ctrl.NewManager(Cfg, ctrl.Options{
		Scheme:                 Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    env.WebhookInstallOptions.LocalServingHost,
			Port:    env.WebhookInstallOptions.LocalServingPort,
			CertDir: env.WebhookInstallOptions.LocalServingCertDir,
		}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The functional probe dials a local listener that answers LMCache's
	// HEALTH request as lmcache_server does, instead of the Service; a test
	// closes a backend's target by putting its address in ClosedTargets.
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer listener.Close()
	go ServeHealth(listener, lmcacheproto.CodeSuccess)
	Prober = &controller.Prober{Interval: time.Second, Timeout: time.Second,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			if _, closed := ClosedTargets.Load(address); closed {
				return nil, fmt.Errorf("dial %s: connection refused", address)
			}
			return (&net.Dialer{}).DialContext(ctx, network, listener.Addr().String())
		}}
	if err := controller.Setup(mgr, controller.Options{Webhooks: true, Namespace: OperatorNamespace, KeyRefresh: time.Second, Probe: Prober}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop := testutil.RunManager(context.Background(), mgr)
	defer stop()
	if err := waitWebhook(context.Background(), env.WebhookInstallOptions); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// NewNamespace creates a namespace of its own for one test.
func NewNamespace(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", nsSeq.Add(1), strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())))
	if len(name) > 60 {
		name = strings.TrimRight(name[:60], "-")
	}
	require.NoError(t, K8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
}

// MarkDeploymentAvailable writes the status the Deployment controller would
// write once every replica of the current generation is available.
func MarkDeploymentAvailable(t *testing.T, key client.ObjectKey) {
	t.Helper()
	SetDeploymentStatus(t, key, func(d *appsv1.Deployment, n int32) {
		d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = n, n, n, n
		d.Status.Conditions = []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable"},
		}
	})
}

// MarkDeploymentRolling writes the status of a rollout with no replica
// available yet.
func MarkDeploymentRolling(t *testing.T, key client.ObjectKey) {
	t.Helper()
	SetDeploymentStatus(t, key, func(d *appsv1.Deployment, n int32) {
		d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = n, n, 0, 0
		d.Status.UnavailableReplicas = n
		d.Status.Conditions = []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionFalse, Reason: "MinimumReplicasUnavailable"},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "ReplicaSetUpdated"},
		}
	})
}

func SetDeploymentStatus(t *testing.T, key client.ObjectKey, mutate func(*appsv1.Deployment, int32)) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		d := &appsv1.Deployment{}
		if err := K8s.Get(context.Background(), key, d); err != nil {
			return err
		}
		n := int32(1)
		if d.Spec.Replicas != nil {
			n = *d.Spec.Replicas
		}
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation}
		mutate(d, n)
		return K8s.Status().Update(context.Background(), d)
	})
}

// WriteCounter counts the requests that change objects (not dry runs) per
// resource, by wrapping a rest.Config's transport.
type WriteCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

// NewWriteCounter is a WriteCounter with nothing counted.
func NewWriteCounter() *WriteCounter { return &WriteCounter{counts: map[string]int{}} }

// Wrap is c with its requests counted.
func (w *WriteCounter) Wrap(c *rest.Config) *rest.Config {
	c = rest.CopyConfig(c)
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return RoundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method != http.MethodGet && r.URL.Query().Get("dryRun") == "" {
				parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
				res := r.Method
				for i, p := range parts {
					if p == "namespaces" && i+2 < len(parts) {
						res = r.Method + " " + strings.Join(parts[i+2:], "/")
					}
				}
				w.mu.Lock()
				w.counts[res]++
				w.mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	}
	return c
}

// Snapshot is the counts so far, per "METHOD resource".
func (w *WriteCounter) Snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.counts {
		out[k] = v
	}
	return out
}

// RoundTripFunc is an http.RoundTripper of a function.
type RoundTripFunc func(*http.Request) (*http.Response, error)

func (f RoundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// waitWebhook waits until the manager's webhook server accepts TLS
// connections, so the first test's pods are not admitted unwired.
func waitWebhook(ctx context.Context, o envtest.WebhookInstallOptions) error {
	addr := fmt.Sprintf("%s:%d", o.LocalServingHost, o.LocalServingPort)
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // readiness probe only
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("webhook server at %s not serving: %w", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func NewBackend(ns, name string) *v1alpha1.CacheBackend {
	return &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime:        v1alpha1.RuntimeVLLM,
			Type:           v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "engine-" + name}},
		},
	}
}

func GetBackend(t *testing.T, key client.ObjectKey) *v1alpha1.CacheBackend {
	t.Helper()
	cb := &v1alpha1.CacheBackend{}
	require.NoError(t, K8s.Get(context.Background(), key, cb))
	return cb
}

// UpdateBackend changes a CacheBackend's spec, retrying on conflicts with
// the controller's status writes.
func UpdateBackend(t *testing.T, key client.ObjectKey, mutate func(*v1alpha1.CacheBackend)) *v1alpha1.CacheBackend {
	t.Helper()
	cb := &v1alpha1.CacheBackend{}
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := K8s.Get(context.Background(), key, cb); err != nil {
			return err
		}
		mutate(cb)
		return K8s.Update(context.Background(), cb)
	}))
	return cb
}

// WaitFor reads key into obj until cond (nil: existence) holds.
func WaitFor[T client.Object](t *testing.T, key client.ObjectKey, obj T, cond func(T) error) T {
	t.Helper()
	testutil.Eventually(t, 15*time.Second, func() error {
		if err := K8s.Get(context.Background(), key, obj); err != nil {
			return err
		}
		if cond == nil {
			return nil
		}
		return cond(obj)
	})
	return obj
}

func WaitDeployment(t *testing.T, key client.ObjectKey, cond func(*appsv1.Deployment) error) *appsv1.Deployment {
	t.Helper()
	return WaitFor(t, key, &appsv1.Deployment{}, cond)
}

func WaitBackend(t *testing.T, key client.ObjectKey, cond func(*v1alpha1.CacheBackend) error) *v1alpha1.CacheBackend {
	t.Helper()
	return WaitFor(t, key, &v1alpha1.CacheBackend{}, cond)
}

func Managers(obj client.Object) []string {
	var out []string
	for _, e := range obj.GetManagedFields() {
		out = append(out, fmt.Sprintf("%s/%s", e.Manager, e.Operation))
	}
	return out
}

// Reconciled changes the backend's spec (one more millicore of server CPU
// request: a change of the pod template, as an argument was before
// extraArgs were refused) and waits until a reconcile evaluated the new
// generation.
func Reconciled(t *testing.T, key client.ObjectKey) {
	t.Helper()
	cb := UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		if cb.Spec.RemoteStorage == nil {
			cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{}
		}
		s := cb.Spec.RemoteStorage.LMCacheServer
		if s == nil {
			s = &v1alpha1.LMCacheServer{}
			cb.Spec.RemoteStorage.LMCacheServer = s
		}
		if s.Resources == nil {
			s.Resources = &corev1.ResourceRequirements{}
		}
		if s.Resources.Requests == nil {
			s.Resources.Requests = corev1.ResourceList{}
		}
		cpu := s.Resources.Requests[corev1.ResourceCPU]
		s.Resources.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(cpu.MilliValue()+1, resource.DecimalSI)
	})
	WaitBackend(t, key, func(got *v1alpha1.CacheBackend) error {
		if got.Status.ObservedGeneration < cb.Generation {
			return fmt.Errorf("generation %d not Reconciled yet", cb.Generation)
		}
		return nil
	})
}

// ServingBackend creates a CacheBackend and makes its server available, so
// that it has a status.endpoint.
func ServingBackend(t *testing.T, ns, name string) *v1alpha1.CacheBackend {
	t.Helper()
	cb := NewBackend(ns, name)
	require.NoError(t, K8s.Create(context.Background(), cb))
	key := client.ObjectKeyFromObject(cb)
	WaitDeployment(t, key, nil)
	MarkDeploymentAvailable(t, key)
	return WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.Endpoint == "" {
			return fmt.Errorf("no endpoint yet")
		}
		return nil
	})
}

func Engine(ns, name string, labels map[string]string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "vllm", Image: "vllm/vllm-openai", Args: []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct"},
		}}},
	}
}

func PodEvents(t *testing.T, ns, pod string) map[string]int {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, K8s.List(context.Background(), &list, client.InNamespace(ns)))
	out := map[string]int{}
	for _, e := range list.Items {
		if e.Regarding.Kind == "Pod" && e.Regarding.Name == pod {
			out[e.Type+"/"+e.Reason]++
		}
	}
	return out
}

func WaitPodEvent(t *testing.T, ns, pod, typeReason string) {
	t.Helper()
	testutil.Eventually(t, 15*time.Second, func() error {
		if got := PodEvents(t, ns, pod); got[typeReason] == 0 {
			return fmt.Errorf("events of pod %s: %v, want %s", pod, got, typeReason)
		}
		return nil
	})
}

func IsWired(p *corev1.Pod) bool {
	for _, e := range p.Spec.Containers[0].Env {
		if e.Name == "LMCACHE_REMOTE_URL" {
			return true
		}
	}
	return false
}

// MP gives cb a multiprocess block with a 1 GiB L1 (when it has none) and
// returns it.
func MP(cb *v1alpha1.CacheBackend) *v1alpha1.Multiprocess {
	if cb.Spec.Multiprocess == nil {
		cb.Spec.Multiprocess = &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("1Gi")}}
	}
	return cb.Spec.Multiprocess
}

// WithWebhookUnreachable points the Pod webhook at a closed port while f
// runs, as when the operator is down (failurePolicy Ignore admits pods
// untouched), and restores it afterwards. The change reaches the API
// server's admission chain asynchronously: f should retry until a pod is
// admitted unwired.
func WithWebhookUnreachable(t *testing.T, f func()) {
	t.Helper()
	ctx := context.Background()
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	require.NoError(t, K8s.Get(ctx, client.ObjectKey{Name: "inferencecache-pod-injector"}, mwc))
	saved := mwc.Webhooks[0].ClientConfig.URL
	mwc.Webhooks[0].ClientConfig.URL = ptr.To("https://127.0.0.1:1/mutate-v1-pod")
	require.NoError(t, K8s.Update(ctx, mwc))
	defer func() {
		require.NoError(t, K8s.Get(ctx, client.ObjectKey{Name: "inferencecache-pod-injector"}, mwc))
		mwc.Webhooks[0].ClientConfig.URL = saved
		require.NoError(t, K8s.Update(ctx, mwc))
	}()
	f()
}

// ServeHealth answers every HEALTH request on l with a reply of code, as
// lmcache_server does (code 200); any other header closes the connection.
func ServeHealth(l net.Listener, code int32) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			h := make([]byte, lmcacheproto.HeaderSize)
			for {
				if _, err := io.ReadFull(c, h); err != nil || binary.LittleEndian.Uint32(h) != uint32(lmcacheproto.CommandHealth) {
					return
				}
				reply := make([]byte, lmcacheproto.ReplySize)
				binary.LittleEndian.PutUint32(reply, uint32(code))
				if _, err := c.Write(reply); err != nil {
					return
				}
			}
		}()
	}
}

// MPBackend is a CacheBackend of ns in multiprocess mode.
func MPBackend(ns, name string) *v1alpha1.CacheBackend {
	cb := NewBackend(ns, name)
	cb.Spec.Multiprocess = &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("4Gi")}}
	return cb
}

func STSBackend(ns, name string, replicas int32, storage bool) *v1alpha1.CacheBackend {
	cb := NewBackend(ns, name)
	cb.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet
	cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Replicas: ptr.To(replicas)}}
	if storage {
		cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("10Gi")}}
	}
	return cb
}

func WaitStatefulSet(t *testing.T, key client.ObjectKey, cond func(*appsv1.StatefulSet) error) *appsv1.StatefulSet {
	t.Helper()
	return WaitFor(t, key, &appsv1.StatefulSet{}, cond)
}
