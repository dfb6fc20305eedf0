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
	"strings"
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

// StartCluster runs a Redis Cluster of n masters (no replicas), each a
// redis-server as Start runs it with cluster mode on, the 16,384 slots
// split evenly in order, and returns the masters' host:port once every
// node reports cluster_state:ok and knows the others.
func StartCluster(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
	}
	ctx := context.Background()
	clients := make([]*redis.Client, n)
	for i, a := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a})
		defer clients[i].Close()
	}
	const slots = 16384
	for i, c := range clients {
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("CLUSTER ADDSLOTSRANGE %d %d on %s: %v", lo, hi, addrs[i], err)
		}
	}
	for _, a := range addrs[1:] {
		host, port, _ := net.SplitHostPort(a)
		if err := clients[0].ClusterMeet(ctx, host, port).Err(); err != nil {
			t.Fatalf("CLUSTER MEET %s: %v", a, err)
		}
	}
	want := fmt.Sprintf("cluster_known_nodes:%d", n)
	for range 400 {
		ok := true
		for _, c := range clients {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, want) {
				ok = false
				break
			}
		}
		if ok {
			return addrs
		}
		time.Sleep(25 * time.Millisecond)
	}
	info, _ := clients[0].ClusterInfo(ctx).Result()
	t.Fatalf("the %d-master Redis Cluster on %v did not settle; CLUSTER INFO of the first:\n%s", n, addrs, info)
	return nil
}

// StartSentinel runs a Redis Sentinel (redis-server --sentinel) watching
// the master at masterAddr under name, with a quorum of 1, and returns its
// host:port once it reports the master.
func StartSentinel(t testing.TB, masterAddr, name string) string {
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
	host, mport, _ := net.SplitHostPort(masterAddr)
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 1000\n", port, dir, name, host, mport, name), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "sentinel.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Bin, conf, "--sentinel")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server --sentinel: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer c.Close()
	for range 200 {
		if got, err := c.GetMasterAddrByName(context.Background(), name).Result(); err == nil && len(got) == 2 && got[1] == mport {
			return addr
		}
		time.Sleep(25 * time.Millisecond)
	}
	out, _ := os.ReadFile(logFile.Name())
	t.Fatalf("the Sentinel on %s does not report master %s at %s; its log:\n%s", addr, name, masterAddr, out)
	return ""
}
