// Package realnode_test runs the operator on a real node: the local
// control plane and a kubelet with containerd that start real containers
// (test/testutil/realnode), in a namespace of their own on this machine.
// The install bundle runs from the project's own images (`make image`'s
// layouts, built here for this machine's platform, imported by digest as
// the bundle pins them); the kubelet runs their real probes inside them
// as their non-root user, the API server reaches the webhook through its
// Service, and the pods reach the API server, the index and each other
// through kube-proxy and CoreDNS.
//
// One node serves the whole package (TestMain); after the tests it is
// torn down and the host checked unchanged, which fails the run if not.
package realnode_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/testutil"
	"github.com/inferencecache/operator/test/testutil/realnode"
)

var (
	node   *realnode.Node
	cpDir  string
	root   string
	bundle string // the dev install bundle, pinned to the imported images
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	_, self, _, _ := runtime.Caller(0)
	root = filepath.Join(filepath.Dir(self), "..", "..")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "realnode: "+format+"\n", args...)
		return 1
	}
	var err error
	if cpDir, err = controlplane.Dir(); err != nil {
		return fail("%v", err)
	}
	nodeDir, err := realnode.Dir()
	if err != nil {
		return fail("%v", err)
	}
	// Short: containerd's socket lives in it (108 bytes at most).
	work, err := os.MkdirTemp("", "rn-")
	if err != nil {
		return fail("%v", err)
	}
	keep := false
	defer func() {
		if !keep {
			_ = os.RemoveAll(work)
			return
		}
		// The logs stay; the images and containerd's store (gigabytes)
		// do not.
		_ = os.RemoveAll(filepath.Join(work, "images"))
		_ = os.RemoveAll(filepath.Join(work, "n", "containerd"))
	}()

	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "realnode: "+format+"\n", args...) }
	node, bundle, err = realnode.StartWithBundle(ctx, root, filepath.Join(work, "images"), "realnode", realnode.Options{
		ControlPlaneDir: cpDir, NodeDir: nodeDir, WorkDir: filepath.Join(work, "n"), Scheme: testutil.Scheme(), Log: logf,
	})
	if err != nil {
		keep = true
		return fail("%v", err)
	}
	if out, err := node.Run(ctx, filepath.Join(nodeDir, "ctr"), "--address", filepath.Join(work, "n", "containerd", "containerd.sock"), "--namespace", "k8s.io", "images", "ls", "-q"); err == nil {
		fmt.Fprintf(os.Stderr, "realnode: images:\n%s", out)
	}

	code := m.Run()
	start := time.Now()
	if err := node.Stop(); err != nil {
		keep = true
		return fail("teardown: %v", err)
	}
	fmt.Fprintf(os.Stderr, "realnode: torn down in %s, the host unchanged\n", time.Since(start).Round(time.Second))
	if code != 0 {
		keep = true
		fmt.Fprintf(os.Stderr, "realnode: logs kept in %s\n", work)
	}
	return code
}

// kubectlErr runs kubectl against the cluster, in the node's namespace.
func kubectlErr(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(cpDir, "kubectl"), append([]string{"--kubeconfig", node.Cluster.Kubeconfig}, args...)...)
	node.Enter(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
