package indexcluster_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/test/kvevents/fixture"
	"github.com/inferencecache/operator/test/testutil/freeport"
	"github.com/inferencecache/operator/test/testutil/redisserver"
)

// engine is one engine pod of the failover test: the fixture publisher in
// vLLM's wire format and the real kvevent-subscriber sidecar streaming it
// to the index.
type engine struct {
	name string
	pub  *fixture.Publisher
	next int // the next prompt's id
}

func startEngine(t *testing.T, subscriber, indexAddr string, i int, uid string) *engine {
	t.Helper()
	pubEP := fmt.Sprintf("tcp://127.0.0.1:%d", freeport.MustTake(t))
	routerEP := fmt.Sprintf("tcp://127.0.0.1:%d", freeport.MustTake(t))
	e := &engine{name: fmt.Sprintf("engine-%d", i), pub: fixture.StartPublisher(t, pubEP, routerEP, "block_size=4", "topic=kv"), next: 1}
	logs := filepath.Join(t.TempDir(), "subscriber.log")
	logf, err := os.Create(logs)
	if err != nil {
		t.Fatal(err)
	}
	sub := exec.Command(subscriber, "--endpoint", pubEP, "--replay-endpoint", routerEP, "--topic", "kv", "--index", indexAddr,
		"--http-bind-address", "127.0.0.1:0", "--block-size", "4", "--model", "m", "--cachebackend", "ns/cb",
		"--pod-name", e.name, "--pod-namespace", "ns", "--pod-uid", uid, "--replay-idle-timeout", "500ms", "--zap-devel")
	sub.Stdout, sub.Stderr = logf, logf
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sub.Process.Kill()
		_ = sub.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logs)
			t.Logf("%s's subscriber:\n%s", e.name, lastLines(b, 40))
		}
	})
	for i := 0; ; i++ {
		b, _ := os.ReadFile(logs)
		if regexp.MustCompile(`"http": "127\.0\.0\.1:\d+"`).Match(b) {
			return e
		}
		if i == 300 {
			t.Fatalf("%s's subscriber did not start:\n%s", e.name, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// serve has the engine serve n new prompts of 8 blocks each.
func (e *engine) serve(n int) {
	for range n {
		toks := make([]int, 32)
		for i := range toks {
			toks[i] = e.next*1000 + i
		}
		e.pub.Store(toks, false)
		e.next++
	}
}

// missing counts the blocks the engine holds that the index does not
// place on it; an error is a query the index could not answer.
func missing(q pb.QueryClient, e *engine, held []uint64) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := 0
	for _, h := range held {
		r, err := q.Score(ctx, &pb.ScoreRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "ns", Name: "cb"}, Model: "m", BlockHashes: []uint64{h}})
		if err != nil {
			return 0, err
		}
		found := false
		for _, p := range r.GetPods() {
			found = found || (p.GetPodName() == e.name && p.GetTiers().GetGpu() >= 1)
		}
		if !found {
			n++
		}
	}
	return n, nil
}

func heldHashes(e *engine) []uint64 {
	var out []uint64
	for h := range e.pub.Held() {
		out = append(out, h)
	}
	return out
}

// TestShardFailoverMidStream: three engines stream into the real
// cache-index on a real Redis Cluster of three masters, each with a
// replica. Mid-stream, a master's replica stops answering (SIGSTOP) while
// the engines cache more, then the master crashes (SIGKILL) and its replica
// comes back and is promoted by the other masters: the worst case of
// Redis' asynchronous replication, where the master had writes the replica
// never got. That master holds block placements only (placementsOnly):
// no position of a pod goes back, so nothing tells a subscriber to resend;
// and the replica's socket buffers are full, so it cannot have received
// the index's writes before the crash.
// Where queries read Redis's placements (--redis-read-model=false): with
// --redis-wait-replicas=1 no placement is lost: nothing the replica
// lacked was acked, and the sidecars sent it again; without it the same
// crash loses acked placements for good. With the read model (the
// default) queries walk a copy kept from the pods' states and the feed,
// which the crash does not touch: nothing is lost without WAIT either,
// and a query during the outage answers from the copy. Every query asked
// from the freeze until the cluster is whole again is counted: a query
// the index cannot answer (its blocks' master is gone) is one a router
// would route blind.
func TestShardFailoverMidStream(t *testing.T) {
	index, subscriber, err := fixture.BuildBinaries(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		wait bool
		// loses: the crash must lose placements (the scenario shows what
		// WAIT is for only where queries read Redis's placements).
		loses bool
	}{
		{"with --redis-wait-replicas=1, queries reading the placements", []string{"--redis-wait-replicas=1", "--redis-wait-timeout=200ms", "--redis-read-model=false"}, true, false},
		{"acked by the master alone, queries reading the placements", []string{"--redis-read-model=false"}, false, true},
		// The default: queries walk the read model, which follows the
		// pods' states and the feed, not the placements a crash loses.
		{"acked by the master alone, queries reading the read model", nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redisserver.StartClusterWithReplicas(t, 3, 1000)
			var masters []string
			for _, m := range c.Masters {
				masters = append(masters, m.Addr)
			}
			addr := fmt.Sprintf("127.0.0.1:%d", freeport.MustTake(t))
			fixture.StartCacheIndex(t, index, addr, append([]string{"--store=redis", "--redis-address=" + strings.Join(masters, ","), "--heartbeat", "1s"}, tc.args...)...)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			q := pb.NewQueryClient(conn)

			victim, uids, junk := placementsOnly(t, c.Masters[0].Addr, 3)
			t.Logf("master %d holds placements only: the pods' positions and the backend's counts are on the others", victim)
			engines := make([]*engine, 3)
			for i := range engines {
				engines[i] = startEngine(t, subscriber, addr, i, uids[i])
				engines[i].serve(5)
			}
			before := map[string][]uint64{}
			for _, e := range engines {
				before[e.name] = heldHashes(e)
				settle(t, q, e, before[e.name], 30*time.Second)
			}

			// Queries from the freeze on: each engine's blocks from before
			// it, which the index holds.
			var asked, blind atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					for _, e := range engines {
						asked.Add(1)
						if n, err := missing(q, e, before[e.name]); err != nil || n > 0 {
							blind.Add(1)
						}
					}
				}
			})

			if err := c.Replicas[victim].Stop(); err != nil {
				t.Fatal(err)
			}
			// A stopped replica's socket still takes in what its master
			// sends, up to the kernel's buffers, and it would apply that
			// when resumed: 32 MiB of other writes to the master first
			// fill them, so the index's writes stay in the master's own
			// buffer, which its crash loses.
			fill := redis.NewClient(&redis.Options{Addr: c.Masters[victim].Addr})
			if err := fill.Set(context.Background(), junk, strings.Repeat("x", 32<<20), 0).Err(); err != nil {
				t.Fatal(err)
			}
			_ = fill.Close()
			for _, e := range engines {
				e.serve(5)
			}
			if tc.wait {
				// The subscribers send, the index writes, waits for the
				// replica in vain, and acks nothing.
				time.Sleep(2 * time.Second)
			} else {
				// Acked: every block the engines hold is placed, on the
				// master alone for those of its slots.
				for _, e := range engines {
					settle(t, q, e, heldHashes(e), 30*time.Second)
				}
			}
			if err := c.Masters[victim].Kill(); err != nil {
				t.Fatal(err)
			}
			if err := c.Replicas[victim].Continue(); err != nil {
				t.Fatal(err)
			}
			promoted := time.Now()
			waitPromoted(t, c.Replicas[victim].Addr, 30*time.Second)
			t.Logf("the replica promoted %s after it was resumed", time.Since(promoted).Round(100*time.Millisecond))
			for _, e := range engines {
				e.serve(1) // after the failover
			}

			lost := 0
			deadline := time.Now().Add(10 * time.Second)
			for _, e := range engines {
				if tc.wait {
					settle(t, q, e, heldHashes(e), 60*time.Second)
					continue
				}
				// Without WAIT: give the sidecars 10 s (the first settle
				// above took about 1), then count.
				held := heldHashes(e)
				n, err := missing(q, e, held)
				for (err != nil || n > 0) && time.Now().Before(deadline) {
					time.Sleep(500 * time.Millisecond)
					n, err = missing(q, e, held)
				}
				if err != nil {
					t.Fatalf("%s: %v", e.name, err)
				}
				t.Logf("%s: %d of its %d blocks not in the index", e.name, n, len(held))
				lost += n
			}
			close(stop)
			wg.Wait()
			t.Logf("placements lost: %d; queries from the freeze to the end: %d, %d of them blind (an error or a block missing)", lost, asked.Load(), blind.Load())
			switch {
			case tc.loses && lost == 0:
				t.Errorf("without WAIT the crash lost no placement: the scenario no longer shows what --redis-wait-replicas is for")
			case !tc.loses && lost > 0:
				t.Errorf("%d placements lost", lost)
			}
		})
	}
}

// placementsOnly picks the master whose slots hold no key of namespace
// ns's (the backend's counts) and n pod UIDs whose keys (each pod's
// positions and lease) are not on it either, asking the cluster at addr
// for the slots (CLUSTER KEYSLOT; the masters split the slots evenly in
// order): a crash of that master can lose placements only, which no
// position shows.
func placementsOnly(t *testing.T, addr string, n int) (victim int, uids []string, junk string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	master := func(key string) int {
		slot, err := c.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(slot * 3 / 16384)
	}
	victim = (master("kvi2:{ns}:cb:") + 1) % 3
	for i := 0; len(uids) < n; i++ {
		uid := fmt.Sprintf("uid-%d", i)
		if master("kvi2:{ns/cb/"+uid+"}:") != victim {
			uids = append(uids, uid)
		}
	}
	for i := 0; junk == ""; i++ {
		if k := fmt.Sprintf("junk-%d", i); master(k) == victim {
			junk = k
		}
	}
	return victim, uids, junk
}

// settle waits until the index places every block in held on e, and
// fails the test with how many it lacks after timeout.
func settle(t *testing.T, q pb.QueryClient, e *engine, held []uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, err := missing(q, e, held)
		if err == nil && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after %s the index lacks %d of its %d blocks (%v)", e.name, timeout, n, len(held), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitPromoted waits until the node at addr is a master and the cluster is
// whole (cluster_state:ok).
func waitPromoted(t *testing.T, addr string, timeout time.Duration) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		role, _ := c.Info(context.Background(), "replication").Result()
		info, _ := c.ClusterInfo(context.Background()).Result()
		if strings.Contains(role, "role:master") && strings.Contains(info, "cluster_state:ok") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not promoted after %s:\n%s\n%s", addr, timeout, role, info)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
