// Package localcluster runs a whole Kubernetes cluster on this machine
// without containers: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok (simulated nodes and kubelets), all on 127.0.0.1,
// from the binaries test/tools/install.sh builds. The end-to-end tests and
// `make demo` both use it.
package localcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/test/testutil/freeport"
)

// Options configure a cluster.
type Options struct {
	// BinDir holds the control-plane binaries (controlplane.Dir()).
	BinDir string
	// WorkDir receives certificates, kubeconfig, etcd data and logs.
	WorkDir string
	// Nodes is the number of kwok nodes; at least 1.
	Nodes int
	// Detach starts the processes in sessions of their own that outlive the
	// caller (for the demo); Stop or StopWorkDir ends them.
	Detach bool
	// CRDDir, when set, holds CRDs installed before the controller-manager
	// starts, so its garbage collector knows their kinds from the start
	// (it rediscovers new kinds only every 30 seconds).
	CRDDir string
	// Log receives progress lines; nil discards them.
	Log func(format string, args ...any)

	// A cluster of real nodes (test/testutil/realnode) sets these three:
	// its processes run in the node's namespaces, the API server serves
	// and advertises a node address (the kubernetes Service gets it as
	// its endpoint, for pods), and the caller reaches it through Dial.

	// Enter, when set, makes a command, not yet started, run where the
	// cluster lives (nsenter into the node's namespaces).
	Enter func(cmd *exec.Cmd)
	// Address is the API server's bind and advertised address
	// (127.0.0.1, with no endpoint reconciler, when empty).
	Address string
	// Dial reaches Address from this process (the rest.Config's dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// NoKwok starts no kwok and waits for no node: the caller brings its
	// own nodes (Nodes is ignored).
	NoKwok bool
}

// Cluster is a running local cluster.
type Cluster struct {
	opts       Options
	Kubeconfig string
	Config     *rest.Config
	procs      []*exec.Cmd
}

const pidFile = "pids"

// Start brings the cluster up and returns once the API server is ready and
// every kwok node is Ready without the not-ready taint.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.Nodes < 1 && !opts.NoKwok {
		opts.Nodes = 1
	}
	address, reconciler := "127.0.0.1", "none"
	if opts.Address != "" {
		address, reconciler = opts.Address, "lease"
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if err := os.MkdirAll(opts.WorkDir, 0o755); err != nil {
		return nil, err
	}
	c = &Cluster{opts: opts, Kubeconfig: filepath.Join(opts.WorkDir, "kubeconfig")}
	defer func() {
		if err != nil {
			c.Stop()
			err = fmt.Errorf("%w (logs in %s)", err, opts.WorkDir)
		}
	}()
	p, err := writePKI(opts.WorkDir, net.ParseIP(address))
	if err != nil {
		return c, fmt.Errorf("writing certificates: %w", err)
	}
	ports, err := freeport.TakeN(3)
	if err != nil {
		return c, err
	}
	etcdPort, etcdPeer, apiPort := ports[0], ports[1], ports[2]
	server := fmt.Sprintf("https://%s", net.JoinHostPort(address, strconv.Itoa(apiPort)))
	if err := c.writeKubeconfig(p, server); err != nil {
		return c, err
	}

	opts.Log("starting etcd")
	if err := c.start("etcd",
		"--data-dir="+filepath.Join(opts.WorkDir, "etcd"),
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", etcdPort),
		fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", etcdPort),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", etcdPeer),
		fmt.Sprintf("--initial-cluster=default=http://127.0.0.1:%d", etcdPeer),
		"--unsafe-no-fsync", "--quota-backend-bytes=4294967296", "--log-level=warn",
	); err != nil {
		return c, err
	}

	opts.Log("starting kube-apiserver on %s", server)
	if err := c.start("kube-apiserver",
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdPort),
		"--bind-address="+address, "--advertise-address="+address,
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--kubelet-client-certificate="+p.AdminCert, "--kubelet-client-key="+p.AdminKey,
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir="+filepath.Join(opts.WorkDir, "apiserver-certs"),
		"--tls-cert-file="+p.ServingCert, "--tls-private-key-file="+p.ServingKey,
		"--client-ca-file="+p.CACert,
		"--service-account-key-file="+p.SAPub,
		"--service-account-signing-key-file="+p.SAKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.0.0.0/16", // room for a Service per CacheBackend at scale
		"--authorization-mode=RBAC",
		"--endpoint-reconciler-type="+reconciler,
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--v=0",
	); err != nil {
		return c, err
	}
	if err := waitReady(ctx, server+"/readyz", p, opts.Dial, 90*time.Second); err != nil {
		return c, fmt.Errorf("kube-apiserver not ready: %w", err)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return c, err
	}
	cfg.QPS, cfg.Burst = 50, 100
	cfg.Dial = opts.Dial
	c.Config = cfg
	if opts.CRDDir != "" {
		opts.Log("installing the CRDs of %s", opts.CRDDir)
		if err := InstallCRDs(ctx, cfg, opts.CRDDir); err != nil {
			return c, err
		}
	}

	opts.Log("starting kube-controller-manager and kube-scheduler")
	if err := c.start("kube-controller-manager",
		"--kubeconfig="+c.Kubeconfig,
		"--controllers=*,-nodeipam,-ttl,-bootstrapsigner,-tokencleaner",
		"--service-account-private-key-file="+p.SAKey,
		"--root-ca-file="+p.CACert,
		"--cluster-signing-cert-file="+p.CACert, "--cluster-signing-key-file="+p.CAKey,
		"--leader-elect=false", "--secure-port=0",
		"--v=0",
	); err != nil {
		return c, err
	}
	if err := c.start("kube-scheduler",
		"--kubeconfig="+c.Kubeconfig, "--leader-elect=false", "--secure-port=0", "--v=0",
	); err != nil {
		return c, err
	}
	if opts.NoKwok {
		cl, err := client.New(cfg, client.Options{})
		if err != nil {
			return c, err
		}
		return c, waitDefaultServiceAccount(ctx, cl, 60*time.Second)
	}
	opts.Log("starting kwok")
	kwokPort, err := freeport.TakeN(1)
	if err != nil {
		return c, err
	}
	if err := c.start("kwok",
		"--kubeconfig="+c.Kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--config="+filepath.Join(opts.BinDir, "kwok-stages.yaml"),
		fmt.Sprintf("--server-address=127.0.0.1:%d", kwokPort[0]),
		"--cidr=10.244.0.0/16",
		"--node-ip=127.0.0.1",
	); err != nil {
		return c, err
	}

	cl, err := client.New(cfg, client.Options{})
	if err != nil {
		return c, err
	}
	for i := range opts.Nodes {
		if err := cl.Create(ctx, kwokNode(fmt.Sprintf("kwok-node-%d", i))); err != nil {
			return c, fmt.Errorf("creating kwok node: %w", err)
		}
	}
	opts.Log("waiting for %d kwok node(s) to become Ready", opts.Nodes)
	if err := waitNodesReady(ctx, cl, opts.Nodes, 90*time.Second); err != nil {
		return c, err
	}
	if err := waitDefaultServiceAccount(ctx, cl, 60*time.Second); err != nil {
		return c, err
	}
	return c, nil
}

func kwokNode(name string) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}

func waitNodesReady(ctx context.Context, cl client.Client, n int, timeout time.Duration) error {
	return Poll(ctx, timeout, func() error {
		var nodes corev1.NodeList
		if err := cl.List(ctx, &nodes); err != nil {
			return err
		}
		ready := 0
		for _, node := range nodes.Items {
			tainted := false
			for _, t := range node.Spec.Taints {
				if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
					tainted = true
				}
			}
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue && !tainted {
					ready++
				}
			}
		}
		if ready < n {
			return fmt.Errorf("%d of %d nodes Ready and untainted", ready, n)
		}
		return nil
	})
}

func waitDefaultServiceAccount(ctx context.Context, cl client.Client, timeout time.Duration) error {
	return Poll(ctx, timeout, func() error {
		return cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: "default"}, &corev1.ServiceAccount{})
	})
}

// Poll calls f until it returns nil, every 250 ms for at most timeout.
func Poll(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func waitReady(ctx context.Context, url string, p *pki, dial func(ctx context.Context, network, addr string) (net.Conn, error), timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.caPEM)
	cert, err := tls.LoadX509KeyPair(p.AdminCert, p.AdminKey)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		DialContext:     dial,
	}}
	return Poll(ctx, timeout, func() error {
		resp, err := hc.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	})
}

func (c *Cluster) writeKubeconfig(p *pki, server string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
`, server, p.CACert, p.AdminCert, p.AdminKey)
	return os.WriteFile(c.Kubeconfig, []byte(kc), 0o600)
}

// start runs one binary of BinDir with its output in WorkDir/<name>.log.
func (c *Cluster) start(name string, args ...string) error {
	logf, err := os.Create(filepath.Join(c.opts.WorkDir, name+".log"))
	if err != nil {
		return err
	}
	return c.startCmd(name, exec.Command(filepath.Join(c.opts.BinDir, name), args...), logf)
}

// Start runs bin args where the cluster lives (Options.Enter), with its
// output in WorkDir/<name>.log, and ends it with the cluster (Stop).
func (c *Cluster) Start(name, bin string, args ...string) error {
	logf, err := os.Create(filepath.Join(c.opts.WorkDir, name+".log"))
	if err != nil {
		return err
	}
	return c.startCmd(name, exec.Command(bin, args...), logf)
}

func (c *Cluster) startCmd(name string, cmd *exec.Cmd, logf *os.File) error {
	if c.opts.Enter != nil {
		c.opts.Enter(cmd)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if c.opts.Detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		// Die with the test binary, even when it is killed by a timeout.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	logf.Close()
	c.procs = append(c.procs, cmd)
	f, err := os.OpenFile(filepath.Join(c.opts.WorkDir, pidFile), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "%d %s\n", cmd.Process.Pid, name)
	return err
}

// Stop ends every process of the cluster, in reverse start order.
func (c *Cluster) Stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i].Process
		done := make(chan struct{})
		go func() { _, _ = p.Wait(); close(done) }()
		_ = syscall.Kill(-p.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
			<-done
		}
	}
	c.procs = nil
	_ = os.Remove(filepath.Join(c.opts.WorkDir, pidFile))
}

// StopWorkDir ends the processes a detached cluster recorded in workDir.
func StopWorkDir(workDir string) error {
	raw, err := os.ReadFile(filepath.Join(workDir, pidFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		pid, err := strconv.Atoi(strings.Fields(lines[i])[0])
		if err == nil {
			stopProcess(pid)
		}
	}
	return os.Remove(filepath.Join(workDir, pidFile))
}

// stopProcess ends a process that is not a child of this one (a detached
// cluster's): SIGTERM to its process group, then SIGKILL if it has not gone
// within five seconds.
func stopProcess(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	for range 50 {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}
