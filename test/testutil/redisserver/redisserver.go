// Package redisserver runs a real redis-server (Debian's, installed by
// `make packages`) for a test: on a free loopback port, without
// persistence, stopped at cleanup. A missing binary fails the test.
package redisserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Bin is the redis-server the tests run.
const Bin = "/usr/bin/redis-server"

// Start runs redis-server with args after the loopback, port and
// no-persistence ones (e.g. --requirepass, --user) and returns its
// host:port once it answers (a refusal such as NOAUTH is an answer).
func Start(t testing.TB, args ...string) string {
	t.Helper()
	if _, err := os.Stat(Bin); err != nil {
		t.Fatalf("%s is missing (%v): run `make packages` (test/tools/install-packages.sh installs the Debian package redis-server)", Bin, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	logFile, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for range 200 {
		var answer redis.Error
		if err := c.Ping(context.Background()).Err(); err == nil || errors.As(err, &answer) {
			return addr
		}
		time.Sleep(25 * time.Millisecond)
	}
	out, _ := os.ReadFile(logFile.Name())
	t.Fatalf("redis-server on %s did not answer; its log:\n%s", addr, out)
	return ""
}
