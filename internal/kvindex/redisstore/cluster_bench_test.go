package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/redisstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
	"github.com/inferencecache/operator/test/testutil/redisserver"
)

// clusterCPU is the CPU (user and system, µs) each master has used.
func clusterCPU(tb testing.TB, addrs []string) []int64 {
	tb.Helper()
	out := make([]int64, len(addrs))
	for i, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		info, err := c.Info(context.Background(), "cpu").Result()
		_ = c.Close()
		if err != nil {
			tb.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
				f, _ := strconv.ParseFloat(v, 64)
				out[i] += int64(f * 1e6)
			}
		}
	}
	return out
}

// selfCPU is the CPU (user and system, µs) this process has used: the
// store's side, what an index replica spends.
func selfCPU(tb testing.TB) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return (ru.Utime.Nano() + ru.Stime.Nano()) / 1000
}

// BenchmarkClusterIngest is ingest into one CacheBackend on a real Redis
// server (shards=0: one server, no cluster) and on a real Redis Cluster of
// 1 and of 3 masters (loopback), from 1, 8 and 32 publishers
// (each an engine pod of the backend, applying its own deltas in order,
// as one subscriber's stream does): each delta stores 64 new blocks in
// the GPU tier and removes the 64 it stored 8 deltas before, so a pod
// holds about 512. It reports block updates a second and the Redis CPU a
// block update costs (all masters' used_cpu over the run, from INFO) and
// the CPU the store's side (an index replica) spends on it, and the
// busiest master's share of the Redis CPU. Not
// part of make test (docs/performance.md):
//
//	go test -run '^$' -bench BenchmarkClusterIngest -benchtime 4000x -count 6 ./internal/kvindex/redisstore/
func BenchmarkClusterIngest(b *testing.B) { clusterIngest(b, redisstore.Options{}) }

// BenchmarkClusterIngestNoPlacements is BenchmarkClusterIngest with
// Options.NoPlacements (cache-index --redis-placements=false).
func BenchmarkClusterIngestNoPlacements(b *testing.B) {
	clusterIngest(b, redisstore.Options{NoPlacements: true})
}

func clusterIngest(b *testing.B, opt redisstore.Options) {
	for _, shards := range []int{0, 1, 3} {
		var addrs []string
		if shards == 0 {
			addrs = []string{redisserver.Start(b)}
		} else {
			addrs = redisserver.StartCluster(b, shards)
		}
		for _, pubs := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("shards=%d/publishers=%d", shards, pubs), func(b *testing.B) {
				var c redis.UniversalClient
				if shards == 0 {
					c = redis.NewClient(&redis.Options{Addr: addrs[0], PoolSize: 64})
				} else {
					c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
				}
				ingest(b, addrs, c, opt, pubs)
			})
		}
	}
}

// ingest is one BenchmarkClusterIngest run: pubs publishers through c into
// a store with opt, on the masters at addrs (flushed first; their CPU is
// what redis-µs/update counts).
func ingest(b *testing.B, addrs []string, c redis.UniversalClient, opt redisstore.Options, pubs int) (updates float64) {
	const perDelta, keep = 64, 8
	for _, a := range addrs {
		m := redis.NewClient(&redis.Options{Addr: a})
		if err := m.FlushAll(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
		_ = m.Close()
	}
	s := redisstore.NewWithOptions(c, opt)
	defer s.Close()
	ctx := context.Background()
	backend := kvindex.BackendRef{Namespace: "team-a", Name: "cache"}
	var next atomic.Int64
	var failed atomic.Value
	cpu0, self0 := clusterCPU(b, addrs), selfCPU(b)
	b.ResetTimer()
	var wg sync.WaitGroup
	for p := range pubs {
		wg.Go(func() {
			src := kvindex.Source{Backend: backend, PodUID: fmt.Sprintf("uid-%d", p)}
			var seq uint64
			for next.Add(1) <= int64(b.N) {
				seq++
				ops := []kvindex.Op{storetest.Store(kvindex.TierGPU, storetest.Chain(uint64(p)<<32|seq, perDelta)...)}
				if seq > keep {
					ops = append(ops, storetest.Remove(kvindex.TierGPU, storetest.Chain(uint64(p)<<32|(seq-keep), perDelta)...))
				}
				if o, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: seq, Ops: ops}); err != nil || o != kvindex.Applied {
					failed.Store(fmt.Sprintf("pod %d delta %d: %s, %v", p, seq, o, err))
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if f := failed.Load(); f != nil {
		b.Fatal(f)
	}
	for p := range min(pubs, b.N) {
		n := b.N / pubs
		if p < b.N%pubs {
			n++
		}
		updates += float64(n*perDelta + max(n-keep, 0)*perDelta)
	}
	b.ReportMetric(updates/b.Elapsed().Seconds(), "updates/s")
	var total, busiest int64
	for i, c := range clusterCPU(b, addrs) {
		total += c - cpu0[i]
		busiest = max(busiest, c-cpu0[i])
	}
	b.ReportMetric(float64(total)/updates, "redis-µs/update")
	// The busiest master's share of the Redis CPU: one
	// namespace's ceiling, on masters with a core each, is
	// a second over (redis-µs/update x this share).
	b.ReportMetric(100*float64(busiest)/float64(max(total, 1)), "busiest-master-%")
	b.ReportMetric(float64(selfCPU(b)-self0)/updates, "client-µs/update")
	b.ReportMetric(0, "ns/op")
	return updates
}

// BenchmarkWaitReplicas: BenchmarkClusterIngest's load from 8 publishers on
// a 3-master cluster whose masters each have a replica, with
// Options.WaitReplicas 0 (acked by the master) and 1 (acked once a
// replica holds it): what --redis-wait-replicas costs. redis-µs/update
// counts the masters' CPU; replica-µs/update the replicas'. Not part of
// make test (docs/performance.md):
//
//	go test -run '^$' -bench BenchmarkWaitReplicas -benchtime 2000x -count 6 ./internal/kvindex/redisstore/
func BenchmarkWaitReplicas(b *testing.B) {
	cl := redisserver.StartClusterWithReplicas(b, 3, 5000)
	var masters, replicas []string
	for i := range cl.Masters {
		masters = append(masters, cl.Masters[i].Addr)
		replicas = append(replicas, cl.Replicas[i].Addr)
	}
	for _, wait := range []int{0, 1} {
		b.Run(fmt.Sprintf("wait=%d", wait), func(b *testing.B) {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: masters, PoolSize: 64})
			r0 := clusterCPU(b, replicas)
			updates := ingest(b, masters, c, redisstore.Options{WaitReplicas: wait}, 8)
			var total int64
			for i, r := range clusterCPU(b, replicas) {
				total += r - r0[i]
			}
			b.ReportMetric(float64(total)/updates, "replica-µs/update")
		})
	}
}
