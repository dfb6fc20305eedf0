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

	"github.com/inferencecache/operator/test/testutil/freeport"
)

// Bin is the redis-server the tests run.
const Bin = "/usr/bin/redis-server"

// Start runs redis-server with args after the loopback, port and
// no-persistence ones (e.g. --requirepass, --user) and returns its
// host:port once it answers (a refusal such as NOAUTH is an answer).
func Start(t testing.TB, args ...string) string {
	t.Helper()
	p := launch(t, "redis.log", func(port int, dir string) []string {
		return append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}, args...)
	})
	c := redis.NewClient(&redis.Options{Addr: p.addr})
	defer c.Close()
	p.waitFor(t, "redis-server on "+p.addr+" did not answer", func() bool {
		var answer redis.Error
		err := c.Ping(context.Background()).Err()
		return err == nil || errors.As(err, &answer)
	})
	return p.addr
}

// process is a redis-server launch started: its address and log.
type process struct {
	addr, log string
}

// launch starts redis-server with the arguments args gives for a free
// loopback port and a fresh directory, logging to logName there, and
// kills it at the test's end. A missing binary fails the test.
func launch(t testing.TB, logName string, args func(port int, dir string) []string) process {
	t.Helper()
	if _, err := os.Stat(Bin); err != nil {
		t.Fatalf("%s is missing (%v): run `make packages` (test/tools/install-packages.sh installs the Debian package redis-server)", Bin, err)
	}
	port := freeport.MustTake(t)
	dir := t.TempDir()
	logFile, err := os.Create(filepath.Join(dir, logName))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Bin, args(port, dir)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", Bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return process{addr: fmt.Sprintf("127.0.0.1:%d", port), log: logFile.Name()}
}

// waitFor polls ready for 5 s, then fails the test with what and the log.
func (p process) waitFor(t testing.TB, what string, ready func() bool) {
	t.Helper()
	for range 200 {
		if ready() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	out, _ := os.ReadFile(p.log)
	t.Fatalf("%s; its log:\n%s", what, out)
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
	host, mport, _ := net.SplitHostPort(masterAddr)
	p := launch(t, "sentinel.log", func(port int, dir string) []string {
		conf := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(conf, fmt.Appendf(nil, "port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 1000\n", port, dir, name, host, mport, name), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{conf, "--sentinel"}
	})
	c := redis.NewSentinelClient(&redis.Options{Addr: p.addr})
	defer c.Close()
	p.waitFor(t, fmt.Sprintf("the Sentinel on %s does not report master %s at %s", p.addr, name, masterAddr), func() bool {
		got, err := c.GetMasterAddrByName(context.Background(), name).Result()
		return err == nil && len(got) == 2 && got[1] == mport
	})
	return p.addr
}
