package controller_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/manifests"
	"github.com/inferencecache/operator/test/testutil"
)

// The suite runs the shipped controllers (controller.Setup) in a manager
// against a real kube-apiserver and etcd. There is no kube-controller-manager
// here: tests that need a Deployment's status write it themselves, as the
// Deployment controller would, and garbage collection is proven end to end
// in test/e2e.
const operatorNamespace = "inferencecache-system"

var (
	prober        *controller.Prober
	closedTargets sync.Map
	cfg           *rest.Config
	k8s           client.Client
	scheme        = runtime.NewScheme()
	nsSeq         atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(false), zap.Level(testutil.ZapLevel())))

	dir, err := controlplane.Dir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration tests need the local control plane:", err)
		return 1
	}
	mwc, vwc, err := manifests.Webhooks(filepath.Join("..", "..", "kustomize", "base"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "kustomize", "base", "crd")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: dir,
		// The webhook configurations the install bundle ships, pointed by
		// envtest at the manager's webhook server below.
		WebhookInstallOptions: envtest.WebhookInstallOptions{MutatingWebhooks: mwc, ValidatingWebhooks: vwc},
	}
	cfg, err = env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting kube-apiserver and etcd:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()

	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The operator's namespace holds the receipt key Secret it creates.
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
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
	// closes a backend's target by putting its address in closedTargets.
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer listener.Close()
	go serveHealth(listener, lmcacheproto.CodeSuccess)
	prober = &controller.Prober{Interval: time.Second, Timeout: time.Second,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			if _, closed := closedTargets.Load(address); closed {
				return nil, fmt.Errorf("dial %s: connection refused", address)
			}
			return (&net.Dialer{}).DialContext(ctx, network, listener.Addr().String())
		}}
	if err := controller.Setup(mgr, controller.Options{Webhooks: true, Namespace: operatorNamespace, KeyRefresh: time.Second, Probe: prober}); err != nil {
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

// newNamespace creates a namespace of its own for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", nsSeq.Add(1), strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())))
	if len(name) > 60 {
		name = strings.TrimRight(name[:60], "-")
	}
	require.NoError(t, k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
}

// markDeploymentAvailable writes the status the Deployment controller would
// write once every replica of the current generation is available.
func markDeploymentAvailable(t *testing.T, key client.ObjectKey) {
	t.Helper()
	setDeploymentStatus(t, key, func(d *appsv1.Deployment, n int32) {
		d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = n, n, n, n
		d.Status.Conditions = []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable"},
		}
	})
}

// markDeploymentRolling writes the status of a rollout with no replica
// available yet.
func markDeploymentRolling(t *testing.T, key client.ObjectKey) {
	t.Helper()
	setDeploymentStatus(t, key, func(d *appsv1.Deployment, n int32) {
		d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = n, n, 0, 0
		d.Status.UnavailableReplicas = n
		d.Status.Conditions = []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionFalse, Reason: "MinimumReplicasUnavailable"},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "ReplicaSetUpdated"},
		}
	})
}

func setDeploymentStatus(t *testing.T, key client.ObjectKey, mutate func(*appsv1.Deployment, int32)) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(context.Background(), key, d); err != nil {
			return err
		}
		n := int32(1)
		if d.Spec.Replicas != nil {
			n = *d.Spec.Replicas
		}
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation}
		mutate(d, n)
		return k8s.Status().Update(context.Background(), d)
	})
}

// writeCounter counts the requests that change objects (not dry runs) per
// resource, by wrapping a rest.Config's transport.
type writeCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (w *writeCounter) wrap(c *rest.Config) *rest.Config {
	c = rest.CopyConfig(c)
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
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

func (w *writeCounter) snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.counts {
		out[k] = v
	}
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

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
