package kvstatus_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// buildBinaries builds cmd/cache-index and cmd/kvevent-subscriber (static)
// into dir; a build failure fails the test (nothing is skipped).
func buildBinaries(t *testing.T, dir string) (index, subscriber string) {
	t.Helper()
	for _, pkg := range []string{"./cmd/cache-index", "./cmd/kvevent-subscriber"} {
		cmd := exec.Command("go", "build", "-o", dir, pkg)
		cmd.Dir = repoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return filepath.Join(dir, "cache-index"), filepath.Join(dir, "kvevent-subscriber")
}

// proc is a process the test started; stop kills it (a crash) once.
type proc struct {
	cmd  *exec.Cmd
	log  string
	once sync.Once
}

func startProc(t *testing.T, name, bin string, args, env []string) *proc {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{cmd: cmd, log: logf.Name()}
	t.Cleanup(p.stop)
	return p
}

func (p *proc) stop() {
	p.once.Do(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
}

func (p *proc) logs() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// waitHealthy polls url until it answers 200.
func waitHealthy(t *testing.T, p *proc, url string) {
	t.Helper()
	for i := 0; ; i++ {
		resp, err := http.Get(url) //nolint:gosec // a loopback URL the test built
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if i == 300 {
			t.Fatalf("%s did not become healthy: %v\n%s", url, err, p.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// publisher drives test/kvevents/publisher.py (vLLM's wire format on
// libzmq, Debian's python3-zmq) over its stdin and stdout.
type publisher struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	once sync.Once
}

func startPublisher(t *testing.T, pubEP, replayEP string, opts ...string) *publisher {
	t.Helper()
	args := append([]string{filepath.Join(repoRoot(), "test", "kvevents", "publisher.py"), "serve", pubEP, replayEP}, opts...)
	cmd := exec.Command("/usr/bin/python3", args...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the fixture publisher (/usr/bin/python3 with python3-zmq and python3-msgpack; test/tools/install-packages.sh installs them): %v", err)
	}
	p := &publisher{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(p.stop)
	if !p.out.Scan() || !strings.Contains(p.out.Text(), "ready") {
		t.Fatalf("fixture publisher did not start: %q", p.out.Text())
	}
	return p
}

func (p *publisher) stop() {
	p.once.Do(func() { _ = p.in.Close(); _ = p.cmd.Wait() })
}

// store publishes one request's blocks (BlockStored) of tokens.
func (p *publisher) store(tokens []int) {
	p.t.Helper()
	p.do(map[string]any{"op": "store", "tokens": tokens})
}

// evict publishes the removal of the oldest block (BlockRemoved).
func (p *publisher) evict() {
	p.t.Helper()
	p.do(map[string]any{"op": "evict", "n": 1})
}

func (p *publisher) do(cmd map[string]any) {
	p.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := fmt.Fprintf(p.in, "%s\n", b); err != nil {
		p.t.Fatalf("publisher: %v", err)
	}
	if !p.out.Scan() || !strings.Contains(p.out.Text(), `"ok": true`) {
		p.t.Fatalf("publisher reply %q", p.out.Text())
	}
}
