// Command localcluster runs the operator's demo on a local cluster built
// from the Go module proxy (see test/localcluster):
//
//	localcluster demo              start the cluster (kwok nodes) and the operator, apply examples/quickstart, wait for Ready
//	localcluster demo --node=real  the same on a real node, in the foreground until interrupted (root)
//	localcluster stop              stop what demo started
//
// Run it from the repository root (make demo, make demo NODE=real,
// make demo-stop).
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/internal/logging"
	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/localcluster"
	"github.com/inferencecache/operator/test/manifests"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

const (
	workDir  = ".localcluster"
	backend  = "qwen-demo-cache"
	examples = "examples/quickstart"
)

func main() {
	ctrl.SetLogger(zapr.NewLogger(logging.Console(os.Stderr)))
	if len(os.Args) < 2 || len(os.Args) > 3 || (len(os.Args) == 3 && (os.Args[1] != "demo" || (os.Args[2] != "--node=real" && os.Args[2] != "--node=kwok"))) {
		fmt.Fprintln(os.Stderr, "usage: localcluster demo [--node=kwok|real] | stop")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "demo":
		if len(os.Args) == 3 && os.Args[2] == "--node=real" {
			ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			err = demoRealNode(ctx)
			cancel()
			break
		}
		err = demo()
	case "stop":
		err = localcluster.StopWorkDir(abs(workDir))
		if err == nil {
			fmt.Println("local cluster stopped")
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

func say(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func demo() error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	bin, err := controlplane.Dir()
	if err != nil {
		return err
	}
	wd := abs(workDir)
	if err := localcluster.StopWorkDir(wd); err != nil {
		return fmt.Errorf("stopping the previous demo: %w", err)
	}
	if err := os.RemoveAll(wd); err != nil {
		return err
	}
	say("starting a local cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) in %s", wd)
	c, err := localcluster.Start(ctx, localcluster.Options{
		BinDir: bin, WorkDir: wd, Nodes: 1, Detach: true, CRDDir: "kustomize/base/crd",
		Log: func(f string, a ...any) { say(f, a...) },
	})
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			say("demo failed; stopping the cluster (logs stay in %s)", wd)
			c.Stop()
		}
	}()

	say("building the operator (bin/manager) and its kubectl plugin (bin/kubectl-cachebackend)")
	// Both with make build's version stamp (LDFLAGS from the Makefile):
	// the children carry the manager's version in a label, and the
	// plugin's diff renders them with its own, so two different stamps
	// would show every child as changed.
	for _, b := range [][2]string{{"bin/manager", "./cmd/manager"}, {"bin/kubectl-cachebackend", "./cmd/kubectl-cachebackend"}} {
		if out, err := exec.CommandContext(ctx, "go", "build", "-ldflags", os.Getenv("LDFLAGS"), "-o", b[0], b[1]).CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %w\n%s", b[0], err, out)
		}
	}
	say("starting the operator, logs in %s/manager.log", workDir)
	ports, err := freeport.TakeN(3)
	if err != nil {
		return err
	}
	if err := os.Setenv("KUBECONFIG", c.Kubeconfig); err != nil {
		return err
	}
	// The manager runs outside the cluster, so its webhooks are served on
	// 127.0.0.1 with a self-signed certificate, and the install bundle's
	// webhook configurations point there.
	certDir := filepath.Join(wd, "webhook-certs")
	ca, err := localcluster.WebhookServing(certDir)
	if err != nil {
		return err
	}
	mwc, vwc, err := manifests.Webhooks("kustomize/base")
	if err != nil {
		return err
	}
	if err := localcluster.InstallWebhooks(ctx, c.Config, fmt.Sprintf("https://127.0.0.1:%d", ports[2]), ca, mwc, vwc); err != nil {
		return err
	}
	// The install bundle creates the operator's namespace; it holds the
	// receipt key Secret the manager creates.
	cl, err := client.New(c.Config, client.Options{})
	if err != nil {
		return err
	}
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "inferencecache-system"}}); err != nil {
		return err
	}
	if err := startDetached(wd, "manager", abs("bin/manager"),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[1]),
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", ports[2]), "--webhook-cert-dir="+certDir,
		// kwok pods run no lmcache_server, and <svc>.<ns>.svc does not
		// resolve outside a cluster: the functional probe is off here.
		"--functional-probe=false",
	); err != nil {
		return err
	}
	if err := localcluster.WaitServing(ctx, fmt.Sprintf("127.0.0.1:%d", ports[2]), 60*time.Second); err != nil {
		return fmt.Errorf("the manager's webhook server did not come up (see %s/manager.log): %w", workDir, err)
	}

	kubectl := filepath.Join(bin, "kubectl")
	if err := os.MkdirAll(filepath.Join(wd, "bin"), 0o755); err == nil {
		_ = os.Symlink(kubectl, filepath.Join(wd, "bin", "kubectl"))
	}
	run := func(args ...string) error {
		fmt.Printf("$ kubectl %s\n", strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, kubectl, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		return cmd.Run()
	}
	say("applying the CacheBackend of %s", examples)
	if err := run("apply", "--server-side", "-f", examples+"/cachebackend.yaml"); err != nil {
		return err
	}
	say("waiting for the CacheBackend to become Ready (its endpoint must exist before engines are admitted)")
	if err := run("wait", "--for=condition=Ready", "cachebackend/"+backend, "--timeout=180s"); err != nil {
		return err
	}
	say("applying the vLLM engine of %s; the webhook wires its pods at CREATE", examples)
	if err := run("apply", "--server-side", "-f", examples+"/engine.yaml"); err != nil {
		return err
	}
	if err := run("rollout", "status", "deployment/qwen-engine", "--timeout=180s"); err != nil {
		return err
	}
	// The controller counts the wired pods shortly after they exist: wait
	// for the count, so that the table below is not a stale 0.
	replicas, err := exec.CommandContext(ctx, kubectl, "--kubeconfig="+c.Kubeconfig, "get", "deployment", "qwen-engine",
		"-o", "jsonpath={.spec.replicas}").Output()
	if err != nil {
		return err
	}
	say("waiting for the CacheBackend's status to count the engine's %s pod(s) as wired", replicas)
	if err := run("wait", "--for=jsonpath={.status.wiredEnginePods}="+string(replicas), "cachebackend/"+backend, "--timeout=60s"); err != nil {
		return err
	}
	if err := run("get", "cachebackend", backend, "-o", "wide"); err != nil {
		return err
	}
	if err := run("get", "deployment,service,pods", "-o", "wide"); err != nil {
		return err
	}
	say("the engine pod as wired by the webhook (receipts, LMCache environment, --kv-transfer-config)")
	// The receipt event comes from a controller shortly after the pod exists.
	time.Sleep(2 * time.Second)
	if err := run("describe", "pod", "-l", "app=qwen-demo"); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig="+c.Kubeconfig, "get", "cachebackend", backend,
		"-o", "jsonpath={.status.endpoint}").Output()
	if err != nil {
		return err
	}
	ok = true
	fmt.Printf(`
CacheBackend %s is Ready; endpoint: %s

The cluster and the operator keep running in the background.
  reach it:  export KUBECONFIG=%s
             %s get cachebackends
  preview:   bin/kubectl-cachebackend diff -f %s/cachebackend.yaml   (exit 0: no changes)
  check:     bin/kubectl-cachebackend check
  logs:      %s/*.log (manager.log is the operator)
  stop it:   make demo-stop
`, backend, out, c.Kubeconfig, filepath.Join(workDir, "bin", "kubectl"), examples, workDir)
	return nil
}

// startDetached runs a process in a session of its own, recorded in the
// cluster's pid file so that `localcluster stop` ends it.
func startDetached(wd, name, path string, args ...string) error {
	logf, err := os.Create(filepath.Join(wd, name+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	f, err := os.OpenFile(filepath.Join(wd, "pids"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "%d %s\n", cmd.Process.Pid, name)
	time.Sleep(time.Second)
	return err
}
