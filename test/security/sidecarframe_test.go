package security

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/test/testutil/freeport"
)

// zmtpGreeting is a ZMTP 3.0 greeting with the NULL mechanism, as an
// engine's PUB socket sends it.
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	g[32] = 1 // as-server
	return g
}

// TestSidecarUnderAHugeFrameHeader: the real kvevent-subscriber binary
// dialing an "engine" that answers its greeting with a 9-byte frame
// header announcing 1 TiB (issue 25: the ZeroMQ library allocated the
// frame with make([]byte, size) and the sidecar died before any limit).
// The frame is refused at its header: the sidecar dials again and again,
// each time refused, and keeps serving with its heap near where it
// started.
func TestSidecarUnderAHugeFrameHeader(t *testing.T) {
	work := t.TempDir()
	bin := filepath.Join(work, "kvevent-subscriber")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kvevent-subscriber").CombinedOutput()
	require.NoError(t, err, "%s", out)

	engine, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer engine.Close()
	var attacks atomic.Int32
	go func() {
		for {
			c, err := engine.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				header := make([]byte, 9)
				header[0] = 0x02 // LONG
				binary.BigEndian.PutUint64(header[1:], 1<<40)
				if _, err := c.Write(append(zmtpGreeting(), header...)); err == nil {
					attacks.Add(1)
				}
				buf := make([]byte, 4096)
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}(c)
		}
	}()

	httpPort := freeport.MustTake(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc := exec.CommandContext(ctx, bin, "--endpoint=tcp://"+engine.Addr().String(), "--index=",
		fmt.Sprintf("--http-bind-address=127.0.0.1:%d", httpPort), "--model=m", "--cachebackend=llm/cache",
		"--pod-name=p", "--pod-namespace=llm", "--pod-uid=u")
	sc.Stderr = os.Stderr
	require.NoError(t, sc.Start())
	exited := make(chan error, 1)
	go func() { exited <- sc.Wait() }()
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", httpPort)
	serves := func() bool {
		r, err := http.Get(healthz) //nolint:noctx // a local probe
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == http.StatusOK
	}
	for deadline := time.Now().Add(30 * time.Second); attacks.Load() < 3; {
		select {
		case err := <-exited:
			t.Fatalf("the sidecar exited under the attack (%d headers sent): %v", attacks.Load(), err)
		case <-time.After(50 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "the sidecar dialled the engine three times")
	}
	select {
	case err := <-exited:
		t.Fatalf("the sidecar exited under the attack: %v", err)
	case <-time.After(time.Second):
	}
	assert.True(t, serves(), "the sidecar still serves /healthz")
	peak := peakRSS(t, sc.Process.Pid)
	t.Logf("%d huge frame headers refused; sidecar peak RSS %d MiB", attacks.Load(), peak>>20)
	assert.Less(t, peak, int64(128<<20), "the sidecar's peak RSS stays under its 128 MiB limit")
	require.NoError(t, sc.Process.Signal(os.Interrupt))
}
