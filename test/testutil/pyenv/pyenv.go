// Package pyenv gives tests the engines' own Python code as real peers: the
// virtual environments test/tools/install-python.sh builds from the pinned
// locks in test/tools/python (vllm: vLLM and LMCache; sglang: SGLang). A
// test that needs one calls Python; a missing environment is built (once
// per lock, into the per-user cache), and a build that fails fails the
// test. Nothing here skips.
package pyenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The environments of test/tools/python/tested-versions.txt.
const (
	VLLM   = "vllm"
	SGLang = "sglang"
)

var (
	mu   sync.Mutex
	dirs = map[string]string{}
)

// Root is the module's root folder (where go.mod is), found from the
// working directory up.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/inferencecache/operator\n")) {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("pyenv: the operator's go.mod is not above the working directory")
		}
		dir = parent
	}
}

// Dir returns the folder of the environment name, building it if needed.
func Dir(t testing.TB, name string) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if d, ok := dirs[name]; ok {
		return d
	}
	script := filepath.Join(Root(t), "test", "tools", "install-python.sh")
	var stderr bytes.Buffer
	cmd := exec.Command("bash", script, name)
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pyenv: building the %s environment (%s) failed: %v\n%s", name, script, err, stderr.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("pyenv: %s environment ready after %s", name, d.Round(time.Second))
	}
	d := strings.TrimSpace(string(out))
	dirs[name] = d
	return d
}

// Python returns the interpreter of the environment name.
func Python(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(Dir(t, name), "bin", "python")
}

// Bin returns the path of a console script installed in the environment.
func Bin(t testing.TB, name, script string) string {
	t.Helper()
	return filepath.Join(Dir(t, name), "bin", script)
}

// Env is the environment a check runs with: no hub access, no bytecode
// written into the shared environment, CUDA hidden (this machine has no
// GPU; the engines pick their CPU paths).
func Env() []string {
	return append(os.Environ(),
		"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "PYTHONDONTWRITEBYTECODE=1",
		"CUDA_VISIBLE_DEVICES=", "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1", "TOKENIZERS_PARALLELISM=false")
}

// RunJSON runs `python script` in the environment name with in as JSON on
// its standard input, and decodes its standard output into out. A non-zero
// exit or output that is not JSON fails the test with the script's stderr.
func RunJSON(t testing.TB, name, script string, in, out any) {
	t.Helper()
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Python(t, name), script)
	cmd.Env = Env()
	cmd.Stdin = bytes.NewReader(body)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("pyenv: %s %s: %v\nstderr:\n%s", name, script, err, tail(stderr.String(), 8000))
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("pyenv: %s %s printed no JSON (%v):\n%s\nstderr:\n%s", name, script, err, tail(stdout.String(), 4000), tail(stderr.String(), 8000))
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("...%s", s[len(s)-n:])
}

// Cell is one environment of test/tools/python/tested-versions.txt with
// the versions its section pins (package name → version), e.g. env
// "vllm-0.34": vllm 0.34.0, lmcache 0.5.7rc2.
type Cell struct {
	Env      string
	Versions map[string]string
}

// VLLM is the cell's vLLM version ("" when it has none).
func (c Cell) VLLM() string { return c.Versions["vllm"] }

// LMCache is the cell's LMCache version ("" when it has none).
func (c Cell) LMCache() string { return c.Versions["lmcache"] }

// Cells returns every environment of tested-versions.txt that pins
// package, in file order: the supported-version matrix the conformance
// suite runs each check against (package "vllm": every vLLM and LMCache
// pair; "sglang": every SGLang).
func Cells(t testing.TB, pkg string) []Cell {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Root(t), "test", "tools", "python", "tested-versions.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var all []Cell
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "# env "):
			all = append(all, Cell{Env: strings.TrimPrefix(line, "# env "), Versions: map[string]string{}})
		case line == "" || strings.HasPrefix(line, "#"):
		case len(all) > 0:
			name, version, ok := strings.Cut(line, "==")
			if !ok {
				t.Fatalf("pyenv: tested-versions.txt: %q is not NAME==VERSION", line)
			}
			all[len(all)-1].Versions[strings.TrimSpace(name)] = strings.TrimSpace(version)
		}
	}
	var out []Cell
	for _, c := range all {
		if _, ok := c.Versions[pkg]; ok {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		t.Fatalf("pyenv: tested-versions.txt pins no %s", pkg)
	}
	return out
}
