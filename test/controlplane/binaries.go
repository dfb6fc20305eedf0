// Package controlplane finds, or builds, the control-plane binaries the
// integration and end-to-end tests run: kube-apiserver, etcd, kubectl,
// kube-controller-manager, kube-scheduler and kwok, built from the Go module
// proxy by test/tools/install.sh. Tests never skip for a missing binary: they
// build it, or fail with the build's error.
package controlplane

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

var (
	once   sync.Once
	dir    string
	dirErr error
)

// Dir returns the folder holding the binaries. It honours CONTROLPLANE_DIR
// (set by the Makefile) and otherwise runs test/tools/install.sh, which
// builds whatever is missing into a per-user cache.
func Dir() (string, error) {
	once.Do(func() {
		if d := os.Getenv("CONTROLPLANE_DIR"); d != "" {
			dir, dirErr = d, check(d)
			return
		}
		_, self, _, _ := runtime.Caller(0)
		script := filepath.Join(filepath.Dir(self), "..", "tools", "install.sh")
		cmd := exec.Command("bash", script)
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			dirErr = fmt.Errorf("building the control plane with %s: %w", script, err)
			return
		}
		dir = strings.TrimSpace(out.String())
		dirErr = check(dir)
	})
	return dir, dirErr
}

// Names of the binaries in Dir.
var Names = []string{"etcd", "kube-apiserver", "kubectl", "kube-controller-manager", "kube-scheduler", "kwok"}

func check(d string) error {
	for _, n := range Names {
		if _, err := os.Stat(filepath.Join(d, n)); err != nil {
			return fmt.Errorf("control-plane binary %s missing in %s (run test/tools/install.sh): %w", n, d, err)
		}
	}
	return nil
}
