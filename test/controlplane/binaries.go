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

// Dir returns the folder holding the binaries. It honours CONTROLPLANE_DIR
// (set by the Makefile) and otherwise runs test/tools/install.sh, which
// builds whatever is missing into a per-user cache.
var Dir = Installed("CONTROLPLANE_DIR", "install.sh", Names)

// Names of the binaries in Dir.
var Names = []string{"etcd", "kube-apiserver", "kubectl", "kube-controller-manager", "kube-scheduler", "kwok"}

// Installed returns a function that returns, once per process, the folder
// holding the binaries names: the environment variable env's value, or
// what the script of test/tools prints (it builds what is missing into a
// per-user cache).
func Installed(env, script string, names []string) func() (string, error) {
	var (
		once   sync.Once
		dir    string
		dirErr error
	)
	return func() (string, error) {
		once.Do(func() {
			if d := os.Getenv(env); d != "" {
				dir, dirErr = d, check(d, script, names)
				return
			}
			_, self, _, _ := runtime.Caller(0)
			path := filepath.Join(filepath.Dir(self), "..", "tools", script)
			cmd := exec.Command("bash", path)
			var out bytes.Buffer
			cmd.Stdout = &out
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				dirErr = fmt.Errorf("building with %s: %w", path, err)
				return
			}
			dir = strings.TrimSpace(out.String())
			dirErr = check(dir, script, names)
		})
		return dir, dirErr
	}
}

func check(d, script string, names []string) error {
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(d, n)); err != nil {
			return fmt.Errorf("binary %s missing in %s (run test/tools/%s): %w", n, d, script, err)
		}
	}
	return nil
}
