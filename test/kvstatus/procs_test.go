package kvstatus_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

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
