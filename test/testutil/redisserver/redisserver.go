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
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inferencecache/operator/test/testutil/freeport"
)

// Bin is the redis-server the tests run.
const Bin = "/usr/bin/redis-server"

// Start runs redis-server with args after the loopback, port,
// no-persistence and no-replication-delay (a replica's first sync starts
// at once, not after Redis' default 5 s) ones (e.g. --requirepass, --user) and returns its
// host:port once it answers (a refusal such as NOAUTH is an answer).
func Start(t testing.TB, args ...string) string {
	t.Helper()
	return start(t, args...).addr
}

// start is Start, returning the process.
func start(t testing.TB, args ...string) process {
	t.Helper()
	p := launch(t, "redis.log", func(port int, dir string) []string {
		return append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--dir", dir}, args...)
	})
	c := redis.NewClient(&redis.Options{Addr: p.addr})
	defer c.Close()
	p.waitFor(t, "redis-server on "+p.addr+" did not answer", func() bool {
		var answer redis.Error
		err := c.Ping(context.Background()).Err()
		return err == nil || errors.As(err, &answer)
	})
	return p
}

// process is a redis-server launch started: its address and log.
type process struct {
	addr, log string
	cmd       *exec.Cmd
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
	return process{addr: fmt.Sprintf("127.0.0.1:%d", port), log: logFile.Name(), cmd: cmd}
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
	c := startCluster(t, n, 0, 5000)
	addrs := make([]string, n)
	for i, m := range c.Masters {
		addrs[i] = m.Addr
	}
	return addrs
}

// Node is one redis-server of a cluster.
type Node struct {
	Addr string
	ID   string // its cluster node ID
	proc process
}

// Kill ends the node with SIGKILL, as a crash would.
func (n *Node) Kill() error { return n.proc.cmd.Process.Kill() }

// Stop freezes the node (SIGSTOP): it answers nothing, replicates nothing
// and keeps its state; Continue resumes it.
func (n *Node) Stop() error { return n.proc.cmd.Process.Signal(syscall.SIGSTOP) }

// Continue resumes a node Stop froze.
func (n *Node) Continue() error { return n.proc.cmd.Process.Signal(syscall.SIGCONT) }

// Cluster is a Redis Cluster with a replica for each master: Replicas[i]
// replicates Masters[i].
type Cluster struct {
	Masters, Replicas []*Node
}

// StartClusterWithReplicas runs a Redis Cluster of n masters, as
// StartCluster does, and one replica of each, with a node timeout of
// nodeTimeoutMillis (a master that answers nothing for that long is failed
// over to its replica by the other masters' votes). It returns once every
// master reports its replica online and every node cluster_state:ok.
func StartClusterWithReplicas(t testing.TB, n, nodeTimeoutMillis int) *Cluster {
	t.Helper()
	return startCluster(t, n, 1, nodeTimeoutMillis)
}

func startCluster(t testing.TB, n, replicas, nodeTimeoutMillis int) *Cluster {
	t.Helper()
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", strconv.Itoa(nodeTimeoutMillis)}
	c := &Cluster{}
	var all []*Node
	var bus []int
	for i := range n * (1 + replicas) {
		// The cluster bus on a port of its own: Redis' default, the
		// client port plus 10,000, may be taken, or past 65,535.
		bus = append(bus, freeport.MustTake(t))
		node := &Node{proc: start(t, append(args, "--cluster-port", strconv.Itoa(bus[i]))...)}
		node.Addr = node.proc.addr
		if i < n {
			c.Masters = append(c.Masters, node)
		} else {
			c.Replicas = append(c.Replicas, node)
		}
		all = append(all, node)
	}
	ctx := context.Background()
	clients := make([]*redis.Client, len(all))
	for i, node := range all {
		clients[i] = redis.NewClient(&redis.Options{Addr: node.Addr})
		defer clients[i].Close()
		id, err := clients[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatalf("CLUSTER MYID on %s: %v", node.Addr, err)
		}
		node.ID = id
	}
	const slots = 16384
	for i := range n {
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if err := clients[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("CLUSTER ADDSLOTSRANGE %d %d on %s: %v", lo, hi, all[i].Addr, err)
		}
	}
	for i, node := range all[1:] {
		host, port, _ := net.SplitHostPort(node.Addr)
		if err := clients[0].Do(ctx, "CLUSTER", "MEET", host, port, bus[i+1]).Err(); err != nil {
			t.Fatalf("CLUSTER MEET %s: %v", node.Addr, err)
		}
	}
	settled := func() bool {
		for i, cl := range clients {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(all))) {
				return false
			}
			if i < n && replicas > 0 && !replicating(cl, clients[n+i]) {
				return false
			}
		}
		return true
	}
	replicated := make([]bool, len(c.Replicas))
	for range 400 {
		// A replica is told its master once it knows the master's node.
		for i := range c.Replicas {
			if !replicated[i] {
				replicated[i] = clients[n+i].Do(ctx, "CLUSTER", "REPLICATE", c.Masters[i].ID).Err() == nil
			}
		}
		if settled() {
			return c
		}
		time.Sleep(25 * time.Millisecond)
	}
	info, _ := clients[0].ClusterInfo(ctx).Result()
	addrs := make([]string, len(all))
	for i, node := range all {
		addrs[i] = node.Addr
	}
	t.Fatalf("the Redis Cluster of %d masters and %d replicas each on %v did not settle; CLUSTER INFO of the first:\n%s", n, replicas, addrs, info)
	return nil
}

// StartReplica runs a redis-server as Start does, replicating the server
// at masterAddr, and returns it once the master reports it online.
func StartReplica(t testing.TB, masterAddr string) *Node {
	t.Helper()
	host, port, _ := net.SplitHostPort(masterAddr)
	n := &Node{proc: start(t, "--replicaof", host, port)}
	n.Addr = n.proc.addr
	m := redis.NewClient(&redis.Options{Addr: masterAddr})
	defer m.Close()
	r := redis.NewClient(&redis.Options{Addr: n.Addr})
	defer r.Close()
	n.proc.waitFor(t, "the replica on "+n.Addr+" of "+masterAddr+" did not come online", func() bool {
		return replicating(m, r)
	})
	return n
}

// replicating reports whether master counts replica online and the
// replica its link to the master up, its first sync loaded: only then does
// it acknowledge what the master sends (a WAIT right after the master
// first says online can still count 0).
func replicating(master, replica *redis.Client) bool {
	ctx := context.Background()
	m, err := master.Info(ctx, "replication").Result()
	if err != nil || !strings.Contains(m, "connected_slaves:1") || !strings.Contains(m, "state=online") {
		return false
	}
	r, err := replica.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(r, "master_link_status:up") && strings.Contains(r, "master_sync_in_progress:0")
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
