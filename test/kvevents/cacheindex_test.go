package kvevents_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/inferencecache/operator/test/kvevents/fixture"
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
	ix := fixture.StartCacheIndex(t, bin, addr, "--heartbeat", "1s", "--zap-devel")
	q, err := newQueryIndex(addr, "ns", "cb", "m", "engine-0", ix.Kill)
	if err != nil {
		t.Fatal(err)
	}
	return q
}
