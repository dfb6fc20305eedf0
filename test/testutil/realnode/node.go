package realnode

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/test/localcluster"
)

// PauseImage is the sandbox image containerd pins: test/tools/pause,
// imported by Start.
const PauseImage = "localhost/pause:inferencecache"

// ClusterDomain is the cluster's DNS domain.
const ClusterDomain = "cluster.local"

// startNode starts containerd, imports the pause image, then the kubelet,
// kube-proxy and CoreDNS, and waits for the node to be Ready.
func (n *Node) startNode(ctx context.Context) error {
	w := n.opts.WorkDir
	c := n.Cluster
	for _, d := range []string{"containerd", "net.d", "cni", "kubelet", "opt"} {
		if err := os.MkdirAll(filepath.Join(w, d), 0o755); err != nil {
			return err
		}
	}
	files := map[string]string{
		"containerd.toml": containerdConfig(w),
		"net.d/10-bridge.conflist": fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "realnode",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, filepath.Join(w, "cni", "networks"), PodCIDR),
		"kubelet.yaml":    n.kubeletConfig(),
		"kube-proxy.yaml": n.kubeProxyConfig(),
		"resolv.conf":     "", // pods of dnsPolicy Default get no nameserver: nothing goes out
		"Corefile": fmt.Sprintf(`.:53 {
    bind %s
    errors
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
`, IP, ClusterDomain, c.Kubeconfig),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(w, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	bin := func(name string) string { return filepath.Join(n.opts.NodeDir, name) }

	n.opts.Log("starting containerd")
	// The 2.x shim first on containerd's PATH (a Debian 1.6 shim would
	// not run a 2.x containerd's tasks), then Debian's runc.
	// containerd, and the shims it starts, in a cgroup of the node's own
	// ("runtime", beside the kubelet's kubepods): Stop ends whatever is
	// left there.
	var script strings.Builder
	for _, cg := range n.cgroups {
		sub, err := mkCgroup(cg, "runtime")
		if err != nil {
			return err
		}
		fmt.Fprintf(&script, "echo $$ > %s/cgroup.procs && ", sub)
	}
	fmt.Fprintf(&script, "exec env PATH=%s:%s %s --config %s", n.opts.NodeDir, os.Getenv("PATH"), bin("containerd"), filepath.Join(w, "containerd.toml"))
	if err := c.Start("containerd", "/bin/sh", "-c", script.String()); err != nil {
		return err
	}
	sock := filepath.Join(w, "containerd", "containerd.sock")
	if err := waitFile(ctx, sock, 30*time.Second); err != nil {
		return fmt.Errorf("containerd never made its socket: %w", err)
	}
	pause, err := PauseArchive(bin("pause"), filepath.Join(w, "pause.tar"))
	if err != nil {
		return err
	}
	if err := n.Import(ctx, pause); err != nil {
		return err
	}

	n.opts.Log("starting the kubelet, kube-proxy and CoreDNS")
	if err := c.Start("kubelet", bin("kubelet"),
		"--config="+filepath.Join(w, "kubelet.yaml"),
		"--kubeconfig="+c.Kubeconfig,
		"--hostname-override="+Name, "--node-ip="+IP,
		"--root-dir="+filepath.Join(w, "kubelet"),
		"--cert-dir="+filepath.Join(w, "kubelet", "pki"),
		"--v=1",
	); err != nil {
		return err
	}
	if err := c.Start("kube-proxy", bin("kube-proxy"), "--config="+filepath.Join(w, "kube-proxy.yaml"), "--v=1"); err != nil {
		return err
	}
	if err := c.Start("coredns", bin("coredns"), "-conf", filepath.Join(w, "Corefile")); err != nil {
		return err
	}
	n.opts.Log("waiting for node %s to become Ready", Name)
	return localcluster.Poll(ctx, 90*time.Second, func() error {
		node := &corev1.Node{}
		if err := n.Client.Get(ctx, client.ObjectKey{Name: Name}, node); err != nil {
			return err
		}
		if !Ready(node) {
			return fmt.Errorf("node %s not Ready: %+v", Name, node.Status.Conditions)
		}
		conn, err := n.Dial(ctx, "tcp", net.JoinHostPort(IP, "53"))
		if err != nil {
			return fmt.Errorf("CoreDNS: %w", err)
		}
		return conn.Close()
	})
}

// Import imports a docker-archive or oci-archive tarball into the node's
// containerd, for the kubelet (namespace k8s.io), under the names it
// carries.
func (n *Node) Import(ctx context.Context, tarball string) error {
	_, err := n.Run(ctx, filepath.Join(n.opts.NodeDir, "ctr"),
		"--address", filepath.Join(n.opts.WorkDir, "containerd", "containerd.sock"),
		"--namespace", "k8s.io", "images", "import", "--platform", "linux/"+runtime.GOARCH, tarball)
	return err
}

func containerdConfig(w string) string {
	return fmt.Sprintf(`version = 3
root = %q
state = %q

[grpc]
  address = %q

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = %q
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %q
  [plugins.'io.containerd.cri.v1.runtime']
    # The kubelet gives the sandbox oom_score_adj -998; this machine kind
    # has no CAP_SYS_RESOURCE to lower it (runc fails the sandbox).
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/usr/lib/cni']
      conf_dir = %q
`, filepath.Join(w, "containerd", "root"), filepath.Join(w, "containerd", "state"),
		filepath.Join(w, "containerd", "containerd.sock"), filepath.Join(w, "opt"), PauseImage, filepath.Join(w, "net.d"))
}

func (n *Node) kubeletConfig() string {
	w := n.opts.WorkDir
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine kind has cgroup v1 only (docs/testing.md#the-real-node).
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: unix://%s
podLogsDir: /var/log/pods
clusterDNS: [%s]
clusterDomain: %s
resolvConf: %s
address: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
failSwapOn: false
# The machine's disk is shared and mostly full: no eviction for it.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
`, n.cgroupRoot(), filepath.Join(w, "containerd", "containerd.sock"), IP, ClusterDomain, filepath.Join(w, "resolv.conf"), IP, filepath.Join(w, "cluster", "ca.crt"))
}

func (n *Node) kubeProxyConfig() string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
mode: iptables
hostnameOverride: %s
bindAddress: %s
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# The conntrack settings are the host's: left alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
# Service traffic between pods of the one bridge comes back through the
# node, whatever the host's bridge netfilter.
iptables: {masqueradeAll: true}
`, n.Cluster.Kubeconfig, Name, IP, PodCIDR)
}

func waitFile(ctx context.Context, path string, timeout time.Duration) error {
	return localcluster.Poll(ctx, timeout, func() error { _, err := os.Stat(path); return err })
}
