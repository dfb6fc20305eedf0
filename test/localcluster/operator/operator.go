// Package operator starts a whole local cluster (test/localcluster) with
// the operator running in the calling process through controller.Setup,
// the wiring of the manager binary: the end-to-end suite and the GitOps
// drift module (test/gitopsdiff) share it.
package operator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/localcluster"
	"github.com/inferencecache/operator/test/manifests"
	"github.com/inferencecache/operator/test/testutil"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

// Env is a running local cluster with the operator.
type Env struct {
	Cluster *localcluster.Cluster
	Client  client.Client
	// BinDir holds the control-plane binaries (kubectl among them).
	BinDir string
	// WorkDir holds the components' logs.
	WorkDir string
	stop    func()
}

// Start starts the cluster from repo (the repository root, relative to the
// caller), installs the bundle's webhook configurations pointed at this
// process, and runs the operator (functional probe off: kwok runs no
// server). Stop ends both.
func Start(ctx context.Context, repo string, scheme *runtime.Scheme) (*Env, error) {
	bin, err := controlplane.Dir()
	if err != nil {
		return nil, fmt.Errorf("the local control plane: %w", err)
	}
	work, err := os.MkdirTemp("", "inferencecache-cluster-")
	if err != nil {
		return nil, err
	}
	c, err := localcluster.Start(ctx, localcluster.Options{
		BinDir: bin, WorkDir: work, Nodes: 1, CRDDir: filepath.Join(repo, "kustomize", "base", "crd"),
	})
	if err != nil {
		return nil, fmt.Errorf("starting the local cluster: %w", err)
	}
	e := &Env{Cluster: c, BinDir: bin, WorkDir: work, stop: c.Stop}
	ok := false
	defer func() {
		if !ok {
			e.Stop()
		}
	}()
	if e.Client, err = client.New(c.Config, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	// The webhooks are served by this process on 127.0.0.1 with a
	// self-signed certificate; the bundle's configurations point there.
	port, err := freeport.Take()
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(work, "webhook-certs")
	ca, err := localcluster.WebhookServing(certDir)
	if err != nil {
		return nil, err
	}
	mwc, vwc, err := manifests.Webhooks(filepath.Join(repo, "kustomize", "base"))
	if err != nil {
		return nil, err
	}
	if err := localcluster.InstallWebhooks(ctx, c.Config, fmt.Sprintf("https://127.0.0.1:%d", port), ca, mwc, vwc); err != nil {
		return nil, err
	}
	if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "inferencecache-system"}}); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(c.Config, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		WebhookServer: webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir}),
	})
	if err != nil {
		return nil, err
	}
	if err := controller.Setup(mgr, controller.Options{Webhooks: true}); err != nil {
		return nil, err
	}
	stopMgr := testutil.RunManager(ctx, mgr)
	e.stop = func() { stopMgr(); c.Stop() }
	if err := localcluster.WaitServing(ctx, fmt.Sprintf("127.0.0.1:%d", port), 30*time.Second); err != nil {
		return nil, fmt.Errorf("webhook server: %w", err)
	}
	ok = true
	return e, nil
}

// Stop stops the operator and the cluster.
func (e *Env) Stop() { e.stop() }

// Finish ends a test binary's use of e: it stops e, removes its work
// folder when the tests passed (code 0) and otherwise keeps it, saying
// where the components' logs are. It returns code.
func (e *Env) Finish(code int) int {
	e.Stop()
	if code == 0 {
		_ = os.RemoveAll(e.WorkDir)
	} else {
		fmt.Fprintf(os.Stderr, "component logs kept in %s\n", e.WorkDir)
	}
	return code
}
