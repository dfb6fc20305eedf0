package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/redisstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
	"github.com/inferencecache/operator/test/testutil/redisserver"
)

// newClusterStore is a store on a Redis Cluster through go-redis'
// ClusterClient, every master flushed first.
func newClusterStore(t testing.TB, addrs []string, opt redisstore.Options) *redisstore.Store {
	t.Helper()
	// No CLIENT SETINFO (Redis 7.2's) or CLIENT MAINT_NOTIFICATIONS on
	// connect: Redis 7.0 answers them ERR, which the spread test counts.
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	if err := c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		return m.FlushAll(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	s := redisstore.NewWithOptions(c, opt)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// The store's contract holds on a real 3-master Redis Cluster.
func TestRedisClusterStore(t *testing.T) {
	addrs := redisserver.StartCluster(t, 3)
	storetest.Run(t, func(t *testing.T) kvindex.Store { return newClusterStore(t, addrs, redisstore.Options{}) })
	storetest.RunLimits(t, func(t *testing.T, l kvindex.Limits) kvindex.Store {
		return newClusterStore(t, addrs, redisstore.Options{Limits: l})
	})
}

// masterStats are the figures of one cluster master that the spread test
// reads: its keys by kind, the calls of each command, the errors it
// replied by prefix, and its CPU.
type masterStats struct {
	placements, podKeys, backendKeys int
	calls                            map[string]int64
	errors                           map[string]int64
	cpuUsec                          int64
}

func readMaster(t *testing.T, addr, namespace string) masterStats {
	t.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer c.Close()
	st := masterStats{calls: map[string]int64{}, errors: map[string]int64{}}
	keys, err := c.Keys(ctx, "kvi2:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		switch {
		case strings.Contains(k, ":blk:"+namespace+"/"):
			st.placements++
		case strings.HasPrefix(k, "kvi2:{"+namespace+"/"):
			st.podKeys++
		case strings.HasPrefix(k, "kvi2:{"+namespace+"}"):
			st.backendKeys++
		}
	}
	info, err := c.Info(ctx, "commandstats", "errorstats", "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(name, "cmdstat_"):
			st.calls[strings.TrimPrefix(name, "cmdstat_")] = statField(rest, "calls")
		case strings.HasPrefix(name, "errorstat_"):
			st.errors[strings.TrimPrefix(name, "errorstat_")] = statField(rest, "count")
		case name == "used_cpu_sys" || name == "used_cpu_user":
			f, _ := strconv.ParseFloat(rest, 64)
			st.cpuUsec += int64(f * 1e6)
		}
	}
	return st
}

func statField(rest, field string) int64 {
	for kv := range strings.SplitSeq(rest, ",") {
		if k, v, _ := strings.Cut(kv, "="); k == field {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// One namespace's index, one CacheBackend's pods, spreads over every master
// of a 3-master Redis Cluster: its block placements by block hash, its
// pods' states by pod; every master serves its writes and no master ever
// answers MOVED, ASK or any other error (the client follows the slots,
// each master's placement script touches only keys it serves).
// The commands a block update costs are counted, not timed.
func TestOneNamespaceSpreadsOverEveryMaster(t *testing.T) {
	addrs := redisserver.StartCluster(t, 3)
	s := newClusterStore(t, addrs, redisstore.Options{})
	ctx := context.Background()
	before := make([]masterStats, len(addrs))
	for i, a := range addrs {
		before[i] = readMaster(t, a, "team-a")
	}
	backend := kvindex.BackendRef{Namespace: "team-a", Name: "cache"}
	const pods, perPod = 12, 512
	prompt := storetest.Chain(9, perPod)
	for p := range pods {
		src := kvindex.Source{Backend: backend, PodUID: fmt.Sprintf("uid-%d", p)}
		if err := s.PutPod(ctx, kvindex.PodRecord{Backend: backend, UID: src.PodUID, Name: fmt.Sprintf("vllm-%d", p), Model: "m"}, time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		hashes := append(slices.Clone(prompt[:perPod/2]), storetest.Chain(uint64(100+p), perPod/2)...)
		o, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, hashes...)}})
		if err != nil || o != kvindex.Applied {
			t.Fatalf("pod %d: %s, %v", p, o, err)
		}
	}
	ms, err := s.Score(ctx, backend, storetest.Space, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != pods {
		t.Fatalf("the shared prefix matches %d pods, want %d", len(ms), pods)
	}
	for _, m := range ms {
		if m.GPU != perPod/2 {
			t.Fatalf("pod %s matches %d blocks, want %d", m.PodUID, m.GPU, perPod/2)
		}
	}
	if tiers, _ := s.TierBlocks(ctx, backend); tiers[kvindex.TierGPU] != pods*perPod {
		t.Fatalf("GPU residencies %d, want %d", tiers[kvindex.TierGPU], pods*perPod)
	}

	// Distinct blocks: the shared half once, each pod's own half.
	const blocks = perPod/2 + pods*perPod/2
	var placements, podMasters int
	var calls, cpu int64
	byName := map[string]int64{}
	for i, a := range addrs {
		st := readMaster(t, a, "team-a")
		t.Logf("master %d (%s): %d placements, %d pod keys, %d backend keys, %d HSET, %d EVALSHA, %d µs of CPU",
			i, a, st.placements, st.podKeys, st.backendKeys, st.calls["hset"]-before[i].calls["hset"], st.calls["evalsha"]-before[i].calls["evalsha"], st.cpuUsec-before[i].cpuUsec)
		// Each master holds a fair share of the placements (a third
		// each, give or take a quarter of that).
		if lo, hi := blocks/4, blocks*5/12; st.placements < lo || st.placements > hi {
			t.Errorf("master %d holds %d of the namespace's %d placements, want %d to %d", i, st.placements, blocks, lo, hi)
		}
		if st.calls["hset"]-before[i].calls["hset"] == 0 {
			t.Errorf("master %d served no placement write", i)
		}
		if st.podKeys > 0 {
			podMasters++
		}
		// No MOVED, ASK or CROSSSLOT, and no script refused for a key
		// of another node (errorstat_ERR): only NOSCRIPT, the first
		// EVALSHA of each script on each master.
		for name, n := range st.errors {
			if name != "NOSCRIPT" && n > before[i].errors[name] {
				t.Errorf("master %d answered %s %d times", i, name, n-before[i].errors[name])
			}
		}
		placements += st.placements
		for name, n := range st.calls {
			if name != "info" && name != "keys" && !strings.HasPrefix(name, "cluster") && !strings.HasPrefix(name, "flush") && name != "ping" && name != "script|load" {
				calls += n - before[i].calls[name]
				byName[name] += n - before[i].calls[name]
			}
		}
		cpu += st.cpuUsec - before[i].cpuUsec
	}
	if placements != blocks {
		t.Errorf("%d placement keys in all, want %d", placements, blocks)
	}
	if podMasters < 2 {
		t.Errorf("the %d pods' states are on %d master(s), want them spread", pods, podMasters)
	}
	// The budget, counting the commands the scripts call: per block
	// update one placement write (the rank's state is read and written
	// once a step, in one HMGET and one HSET); per pod about 100 (its
	// lease and record, the change's record, its flush and count, key
	// expiries); per block of the query one read. It was 3 per update
	// before a step batched its reads and writes and each master's
	// placements went in one script.
	updates := int64(pods * perPod)
	if budget := updates + 120*pods + int64(len(prompt)); calls > budget {
		t.Errorf("%d commands for %d block updates, want at most %d", calls, updates, budget)
	}
	t.Logf("commands (Lua's calls included): %v", byName)
	t.Logf("%d commands and %d µs of Redis CPU for %d block updates (%.2f µs each, figures of this machine)", calls, cpu, updates, float64(cpu)/float64(updates))
}

// The store's contract holds through Sentinel: go-redis' failover client
// asks a real Sentinel for the master, as cache-index does with
// --redis-sentinel-master.
func TestRedisStoreThroughSentinel(t *testing.T) {
	master := redisserver.Start(t)
	sentinel := redisserver.StartSentinel(t, master, "index")
	newStore := func(t *testing.T, l kvindex.Limits) kvindex.Store {
		c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{sentinel}, MasterName: "index"})
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		s := redisstore.NewWithOptions(c, redisstore.Options{Limits: l})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	storetest.Run(t, func(t *testing.T) kvindex.Store { return newStore(t, kvindex.Limits{}) })
	storetest.RunLimits(t, newStore)
}

// target is a Redis the store runs on: one server, or a cluster.
type target struct {
	name  string
	addrs []string
}

// client is a new client of r: one server's, or the cluster's.
func (r target) client() redis.UniversalClient {
	if len(r.addrs) == 1 {
		return redis.NewClient(&redis.Options{Addr: r.addrs[0]})
	}
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: r.addrs})
}

// store is a new store on r (not flushed).
func (r target) store(t testing.TB, opt redisstore.Options) *redisstore.Store {
	t.Helper()
	s := redisstore.NewWithOptions(r.client(), opt)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// flush empties every master of r.
func (r target) flush(t testing.TB) {
	t.Helper()
	for _, a := range r.addrs {
		flush(t, a)
	}
}

// targets are the two shapes a test of the store's changes runs on: one
// server, where a change writes its placements and counts in its own
// scripts, and a 3-master cluster, where it leaves them to a flush.
func targets(t *testing.T) []target {
	return []target{{name: "server", addrs: []string{startRedis(t)}}, clusterOnly(t)[0]}
}

// clusterOnly is a 3-master cluster: for what only a flush does.
func clusterOnly(t *testing.T) []target {
	return []target{{name: "cluster", addrs: redisserver.StartCluster(t, 3)}}
}

// moveSlot moves a slot, with its keys, from the master at from to the one
// at to, and tells every master: a resharding as redis-cli --cluster
// reshard does it, while the store's client still has the old slot map.
func moveSlot(t *testing.T, addrs []string, slot int64, from, to string) {
	t.Helper()
	ctx := context.Background()
	cl := map[string]*redis.Client{}
	ids := map[string]string{}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		defer c.Close()
		cl[a] = c
		id, err := c.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		ids[a] = id
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cl[to].Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]).Err())
	must(cl[from].Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]).Err())
	keys, err := cl[from].ClusterGetKeysInSlot(ctx, int(slot), 1000).Result()
	must(err)
	if len(keys) > 0 {
		host, port, _ := net.SplitHostPort(to)
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(cl[from].Do(ctx, args...).Err())
	}
	for _, a := range addrs {
		must(cl[a].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err())
	}
}

// A slot that moves to another master between two changes (a resharding)
// does not lose a write: the placement script, run on the master the
// client still thinks serves the block, refuses the key it no longer
// holds, and the placements go one command each through the cluster
// client, which follows MOVED. Nothing surfaces to the caller.
func TestPlacementsFollowAMovedSlot(t *testing.T) {
	addrs := redisserver.StartCluster(t, 3)
	s := newClusterStore(t, addrs, redisstore.Options{})
	ctx := context.Background()
	backend := kvindex.BackendRef{Namespace: "team-a", Name: "cache"}
	src := kvindex.Source{Backend: backend, PodUID: "uid-0"}
	hashes := storetest.Chain(11, 64)
	if o, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, hashes...)}}); err != nil || o != kvindex.Applied {
		t.Fatalf("delta 1: %s, %v", o, err)
	}
	// Move the slot of the first block's placement to the next master;
	// the pod's slot stays, so that nothing tells the client before the
	// placement script runs on the block's old master.
	probe := redis.NewClient(&redis.Options{Addr: addrs[0]})
	defer probe.Close()
	owner := func(slot int64) string {
		shards, err := probe.ClusterShards(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start <= slot && slot <= r.End {
					for _, n := range sh.Nodes {
						if n.Role == "master" {
							return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
						}
					}
				}
			}
		}
		t.Fatalf("no master serves slot %d", slot)
		return ""
	}
	next := func(a string) string { return addrs[(slices.Index(addrs, a)+1)%len(addrs)] }
	for _, tag := range []string{fmt.Sprintf("%016x", hashes[0])} {
		slot, err := probe.ClusterKeySlot(ctx, "{"+tag+"}").Result()
		if err != nil {
			t.Fatal(err)
		}
		from := owner(slot)
		moveSlot(t, addrs, slot, from, next(from))
		if got := owner(slot); got != next(from) {
			t.Fatalf("slot %d is on %s after the move, want %s", slot, got, next(from))
		}
	}
	// Remove the first block, add it in the CPU tier: both need the
	// moved slots.
	d := kvindex.Delta{Epoch: 1, Sequence: 2, Ops: []kvindex.Op{storetest.Remove(kvindex.TierGPU, hashes[0]), storetest.Store(kvindex.TierCPU, hashes[0])}}
	if o, _, err := s.Apply(ctx, src, d); err != nil || o != kvindex.Applied {
		t.Fatalf("delta 2 after the moves: %s, %v", o, err)
	}
	ms, err := s.Score(ctx, backend, storetest.Space, hashes)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Any != 64 || ms[0].GPU != 0 || ms[0].CPU != 1 {
		t.Fatalf("after the moves: %+v, want the pod with 64 blocks, the first in CPU only", ms)
	}
	if tiers, _ := s.TierBlocks(ctx, backend); tiers != [kvindex.NumTiers]uint64{0, 63, 1, 0} {
		t.Fatalf("tiers %v, want 63 GPU and 1 CPU", tiers)
	}
}
