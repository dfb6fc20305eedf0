package kvevents_test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/operator/test/kvevents/fixture"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds cmd/cache-index and cmd/kvevent-subscriber (static) once
// per test run.
func binaries(t *testing.T) (index, subscriber string) {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "kvevents-bin-"); binErr != nil {
			return
		}
		_, _, binErr = fixture.BuildBinaries(binDir)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "cache-index"), filepath.Join(binDir, "kvevent-subscriber")
}

// startCacheIndex runs the cache-index binary (memory store, no
// authentication) with its gRPC API on addr, and reads it through Query.
// Stopping it kills the process: a crash, losing the index's state.
func startCacheIndex(t *testing.T, addr string) index {
	t.Helper()
	bin, _ := binaries(t)
	probe := fmt.Sprintf("127.0.0.1:%d", freeport.MustTake(t))
	logs, err := os.Create(filepath.Join(t.TempDir(), "cache-index.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--grpc-bind-address", addr, "--http-bind-address", fmt.Sprintf("127.0.0.1:%d", freeport.MustTake(t)),
		"--health-probe-bind-address", probe, "--auth", "none", "--heartbeat", "1s", "--zap-devel")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start cache-index: %v", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	t.Cleanup(stop)
	for i := 0; ; i++ {
		resp, err := http.Get("http://" + probe + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if i == 300 {
			b, _ := os.ReadFile(logs.Name())
			t.Fatalf("cache-index did not become healthy: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	q, err := newQueryIndex(addr, "ns", "cb", "m", "engine-0", stop)
	if err != nil {
		t.Fatal(err)
	}
	return q
}
