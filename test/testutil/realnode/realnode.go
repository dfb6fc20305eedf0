// Package realnode runs a Kubernetes cluster with a real node on this
// machine: the local control plane (test/localcluster) and a kubelet with
// containerd, runc, the CNI bridge, kube-proxy and CoreDNS, all built from
// Go modules and Debian packages (test/tools/install-node.sh,
// test/tools/install-packages.sh), running real containers. Everything
// lives in one private network and mount namespace (the node's), so the
// host's network, mounts and sysctls are never touched; Stop checks that
// they are as they were. See docs/testing.md#the-real-node.
//
// Needs root. Nothing here skips: a missing part fails the caller.
package realnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/test/localcluster"
	"github.com/inferencecache/operator/test/testutil/netns"
)

// The node's addresses. The API server, CoreDNS and the kubelet serve on
// IP, an interface of the node's namespace; pods get PodCIDR on the
// bridge cni0 and reach IP through it.
const (
	IP          = "10.77.0.1"
	PodCIDR     = "10.88.0.0/16"
	ServiceCIDR = "10.0.0.0/16" // localcluster's --service-cluster-ip-range
	// Name is the node's name.
	Name = "realnode-0"
)

// Options configure a node.
type Options struct {
	// ControlPlaneDir holds the control plane's binaries (test/tools/install.sh).
	ControlPlaneDir string
	// NodeDir holds the node's binaries (test/tools/install-node.sh).
	NodeDir string
	// WorkDir receives the configuration, state and logs. Its path is
	// kept short: containerd's socket lives in it.
	WorkDir string
	// CRDDir, if set, is installed before the controller-manager starts.
	CRDDir string
	// Log receives progress lines; nil discards them.
	Log func(format string, args ...any)
	// Scheme is Client's scheme (client-go's when nil).
	Scheme *k8sruntime.Scheme
}

// Node is a running cluster with one real node.
type Node struct {
	opts    Options
	Cluster *localcluster.Cluster
	// Client is an admin client of the cluster, reaching it through Dial.
	Client client.Client

	holder     *exec.Cmd
	hold       io.WriteCloser
	pid        int
	cgroupName string
	cgroups    []string
	host       hostState
}

// Start brings up the control plane and the node in a namespace of their
// own and returns once the node is Ready and CoreDNS answers.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("a real node needs root (namespaces, cgroups, mounts)")
	}
	for _, bin := range []string{"unshare", "nsenter", "ip", "iptables", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%s (test/tools/install-packages.sh installs it): %w", bin, err)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return nil, fmt.Errorf("the CNI plugins (Debian containernetworking-plugins; test/tools/install-packages.sh): %w", err)
	}
	for _, bin := range Names {
		if _, err := os.Stat(filepath.Join(opts.NodeDir, bin)); err != nil {
			return nil, fmt.Errorf("the node's %s (test/tools/install-node.sh builds it): %w", bin, err)
		}
	}
	if err := os.MkdirAll(opts.WorkDir, 0o755); err != nil {
		return nil, err
	}
	n = &Node{opts: opts}
	if n.host, err = readHost(); err != nil {
		return nil, fmt.Errorf("reading the host's state: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("%w (logs in %s)", err, opts.WorkDir), n.Stop())
		}
	}()
	if err := n.startHolder(); err != nil {
		return n, err
	}
	if err := n.setup(); err != nil {
		return n, fmt.Errorf("setting up the node's namespace: %w", err)
	}

	opts.Log("starting the control plane in the node's namespace")
	c, err := localcluster.Start(ctx, localcluster.Options{
		BinDir: opts.ControlPlaneDir, WorkDir: filepath.Join(opts.WorkDir, "cluster"), CRDDir: opts.CRDDir,
		Enter: n.Enter, Address: IP, Dial: n.Dial, NoKwok: true, Log: opts.Log,
	})
	n.Cluster = c
	if err != nil {
		return n, err
	}
	if n.Client, err = client.New(c.Config, client.Options{Scheme: opts.Scheme}); err != nil {
		return n, err
	}
	if err := n.startNode(ctx); err != nil {
		return n, err
	}
	return n, nil
}

// Enter makes cmd, not yet started, run in the node's network and mount
// namespaces.
func (n *Node) Enter(cmd *exec.Cmd) {
	args := []string{"nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", n.pid), fmt.Sprintf("--mount=/proc/%d/ns/mnt", n.pid), "--", cmd.Path}
	cmd.Args = append(args, cmd.Args[1:]...)
	cmd.Path, _ = exec.LookPath("nsenter")
}

// Run runs bin args in the node's namespaces and returns its output.
func (n *Node) Run(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	n.Enter(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in the node: %w\n%s", bin, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Dial dials addr from inside the node's network namespace.
func (n *Node) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return netns.Of(n.pid).Dial(ctx, network, addr)
}

// startHolder starts the process that holds the node's namespaces: a
// private mount namespace (nothing propagates to the host) and a network
// namespace. It ends when its standard input closes (Stop, or this
// process's death).
func (n *Node) startHolder() error {
	cmd := exec.Command("unshare", "--mount", "--net", "--propagation", "private", "--", "sh", "-c", "echo up && read _")
	hold, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "up" {
		_ = hold.Close()
		_ = cmd.Wait()
		return fmt.Errorf("unshare --mount --net: %q", line)
	}
	n.holder, n.hold, n.pid = cmd, hold, cmd.Process.Pid
	return nil
}

// sysctls are the kernel settings the kubelet wants (setupKernelTunables:
// it writes any that differ, host-wide). The node's mount namespace shows
// it files holding these values instead, so it reads what it wants and
// writes nothing.
var sysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// setup makes the node's namespace: its network (lo, the node's address,
// the route of the Service range), tmpfs over the paths the runtime and
// the kubelet use outside their configured folders, the kernel settings
// the kubelet reads, and a cgroup of its own in each v1 hierarchy.
func (n *Node) setup() error {
	ctx := context.Background()
	w := n.opts.WorkDir
	steps := [][]string{
		{"ip", "link", "set", "lo", "up"},
		// The node's interface: one end of a veth pair whose peer stays
		// in the namespace too (this kernel has no dummy links).
		{"ip", "link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"},
		{"ip", "addr", "add", IP + "/32", "dev", "node0"},
		{"ip", "link", "set", "node0", "up"},
		{"ip", "link", "set", "node0-peer", "up"},
		{"ip", "route", "add", ServiceCIDR, "dev", "node0"},
		// runc's and the shim's state (/run/containerd), the CNI's IPAM
		// and result caches (/var/lib/cni), the pods' logs.
		{"mount", "-t", "tmpfs", "tmpfs", "/run"},
		{"mount", "-t", "tmpfs", "tmpfs", "/var/lib"},
		{"mount", "-t", "tmpfs", "tmpfs", "/var/log"},
		{"mkdir", "-p", "/var/log/pods", "/var/log/containers", "/var/lib/cni", "/run/containerd"},
	}
	sysDir := filepath.Join(w, "sysctl")
	if err := os.MkdirAll(sysDir, 0o755); err != nil {
		return err
	}
	for key, v := range sysctls {
		f := filepath.Join(sysDir, strings.ReplaceAll(key, "/", "."))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o444); err != nil {
			return err
		}
		steps = append(steps, []string{"mount", "--bind", f, "/proc/sys/" + key})
	}
	for _, s := range steps {
		if _, err := n.Run(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	// A cgroup of the node's own in every v1 hierarchy: the kubelet's
	// cgroupRoot. The cgroup file system is the host's: Stop removes them.
	ctrls, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	n.cgroupName = fmt.Sprintf("inferencecache-node-%d", n.pid)
	for _, c := range ctrls {
		if !c.IsDir() {
			continue
		}
		// unified too: the kubelet makes its root there as well (this
		// machine's cgroup2 holds no controllers).
		dir, err := mkCgroup(filepath.Join("/sys/fs/cgroup", c.Name()), n.cgroupName)
		if dir != "" {
			n.cgroups = append(n.cgroups, dir)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// mkCgroup makes the cgroup parent/name of a v1 hierarchy; a cpuset gets
// its parent's CPUs and memory nodes (an empty one admits no process).
func mkCgroup(parent, name string) (string, error) {
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("cgroup %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(parent, "cpuset.cpus")); err == nil {
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(parent, f))
			if err != nil {
				return dir, err
			}
			if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
				return dir, err
			}
		}
	}
	return dir, nil
}

// cgroupRoot is the kubelet's cgroupRoot.
func (n *Node) cgroupRoot() string { return "/" + n.cgroupName }

// Stop tears everything down (the node's processes, then its namespace
// and cgroups) and checks that the host's network, mounts, sysctls and
// cgroups are as they were before Start.
func (n *Node) Stop() error {
	var errs []error
	if n.Cluster != nil {
		n.Cluster.Stop()
	}
	// Processes the kubelet started (the shims, the containers) are not
	// the cluster's children: end everything left in the node's cgroups.
	for range 3 {
		if killCgroups(n.cgroups) == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if n.holder != nil {
		_ = n.hold.Close()
		_ = n.holder.Wait()
	}
	for i := len(n.cgroups) - 1; i >= 0; i-- {
		if err := removeCgroup(n.cgroups[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if n.host != (hostState{}) {
		if err := n.host.same(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killCgroups SIGKILLs every process of the cgroups and their children,
// and returns how many it found.
func killCgroups(dirs []string) int {
	found := 0
	for _, d := range dirs {
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil || e.Name() != "cgroup.procs" {
				return nil
			}
			raw, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(raw)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil && pid > 0 {
					found++
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
	return found
}

// removeCgroup removes a cgroup and its children, deepest first.
func removeCgroup(dir string) error {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var last error
	for i := len(dirs) - 1; i >= 0; i-- {
		for try := 0; ; try++ {
			err := os.Remove(dirs[i])
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if try == 20 {
				last = fmt.Errorf("removing cgroup %s: %w", dirs[i], err)
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	return last
}

// Ready reports whether the node is Ready.
func Ready(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// EnterCommand is the command line prefix that runs a program in the
// node's network and mount namespaces from another shell.
func (n *Node) EnterCommand() string {
	return fmt.Sprintf("nsenter --net=/proc/%d/ns/net --mount=/proc/%d/ns/mnt --", n.pid, n.pid)
}
