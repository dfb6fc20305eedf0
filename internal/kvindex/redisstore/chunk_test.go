package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/redisstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
)

// scriptStats reads the calls and microseconds of the script commands
// (EVALSHA, and EVAL for the first load) from INFO commandstats.
func scriptStats(t *testing.T, c *redis.Client) (calls, usec int64) {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls += n
			case "usec":
				usec += n
			}
		}
	}
	return calls, usec
}

// pinger measures another client's PING round trips until stop is closed.
func pinger(addr string, stop <-chan struct{}) (wait func() (max time.Duration, n int)) {
	var mu sync.Mutex
	var worst time.Duration
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			_ = c.Ping(context.Background()).Err()
			d := time.Since(t0)
			mu.Lock()
			worst, n = max(worst, d), n+1
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	return func() (time.Duration, int) {
		<-done
		return worst, n
	}
}

// The 300k-hash delta of issue 25 (3.1 s in one script, another client's
// PING waited 2.9 s) and a snapshot as large run as scripts of at most
// DefaultChunkHashes hashes each: the number of script calls Redis counts
// is at least the hashes over the chunk. The PING figures are logged for
// docs/performance.md, not asserted (they are the machine's).
func TestLargeChangesRunInBoundedScripts(t *testing.T) {
	const hashes = 300_000
	addr := startRedis(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	s := newStore(t, addr)
	ctx := context.Background()
	src := storetest.Src("big", 0)
	for _, change := range []struct {
		name string
		run  func() error
	}{
		{"delta", func() error {
			o, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, storetest.Chain(1, hashes)...)}})
			if err == nil && o != kvindex.Applied {
				err = errors.New(o.String())
			}
			return err
		}},
		{"snapshot", func() error {
			entries := make([]kvindex.Entry, hashes)
			for i, h := range storetest.Chain(2, hashes) {
				entries[i] = kvindex.Entry{Space: storetest.Space, Tier: kvindex.TierCPU, Hash: h, Refs: 1}
			}
			return s.Replace(ctx, src, kvindex.Position{Epoch: 1, Sequence: 5}, kvindex.SnapshotOf(entries))
		}},
	} {
		calls0, usec0 := scriptStats(t, c)
		stop := make(chan struct{})
		wait := pinger(addr, stop)
		t0 := time.Now()
		err := change.run()
		took := time.Since(t0)
		close(stop)
		worst, pings := wait()
		if err != nil {
			t.Fatalf("%s: %v", change.name, err)
		}
		calls1, usec1 := scriptStats(t, c)
		calls := calls1 - calls0
		if want := int64(hashes / redisstore.DefaultChunkHashes); calls < want {
			t.Errorf("%s of %d hashes ran in %d script calls, want at least %d (at most %d hashes a script)", change.name, hashes, calls, want, redisstore.DefaultChunkHashes)
		}
		t.Logf("%s of %d hashes: %d script calls, %.0f µs of script a call, %v in all; another client's %d PINGs waited at most %v",
			change.name, hashes, calls, float64(usec1-usec0)/float64(max(calls, 1)), took.Round(time.Millisecond), pings, worst.Round(10*time.Microsecond))
	}
	if n, _ := s.PodBlocks(ctx, kvindex.PodKey{Backend: storetest.BackendA, UID: "big"}); n != hashes {
		t.Errorf("after the snapshot: %d blocks, want %d", n, hashes)
	}
}

var errCrash = errors.New("crash")

// crashAfter makes s stop a change after its step n ran.
func crashAfter(s *redisstore.Store, n int) {
	redisstore.SetOnCall(s, func(step int) error {
		if step >= n {
			return errCrash
		}
		return nil
	})
}

// A replica that dies between the steps of a delta leaves the position
// where it was; the resend (to any replica) resumes and applies each step
// once: the hashes stored twice hold exactly two references.
func TestDeltaResumedAfterACrashAppliesOnce(t *testing.T) {
	for _, r := range targets(t) {
		t.Run(r.name, func(t *testing.T) {
			ctx := context.Background()
			hashes := storetest.Chain(3, 2000)
			d := kvindex.Delta{Epoch: 1, Sequence: 2, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, hashes...), storetest.Store(kvindex.TierGPU, hashes[:500]...)}}
			src := storetest.Src("p", 0)
			pod := kvindex.PodKey{Backend: storetest.BackendA, UID: "p"}
			tests := []struct {
				name  string
				after int // the step the crash follows (2,500 hashes: steps 0 to 9)
			}{{"after the begin", 0}, {"mid-delta", 3}, {"before the last step", 8}}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					r.flush(t)
					dying, other := r.store(t, redisstore.Options{}), r.store(t, redisstore.Options{})
					if o, _, err := other.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierCPU, 1)}}); err != nil || o != kvindex.Applied {
						t.Fatalf("sequence 1: %s, %v", o, err)
					}
					crashAfter(dying, tt.after)
					if _, _, err := dying.Apply(ctx, src, d); !errors.Is(err, errCrash) {
						t.Fatalf("crash: %v", err)
					}
					if ps, _ := other.Positions(ctx, pod); ps[0] != (kvindex.Position{Epoch: 1, Sequence: 1}) {
						t.Fatalf("a partly applied delta moved the position to %+v", ps[0])
					}
					// Something else under the same position is not mixed in.
					alt := kvindex.Delta{Epoch: 1, Sequence: 2, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, 42)}}
					if o, _, err := other.Apply(ctx, src, alt); err != nil || o != kvindex.NeedSnapshot {
						t.Fatalf("another delta over a partial one: %s, %v, want need_snapshot", o, err)
					}
					if o, pos, err := other.Apply(ctx, src, d); err != nil || o != kvindex.Applied || pos != (kvindex.Position{Epoch: 1, Sequence: 2}) {
						t.Fatalf("resend: %s at %+v, %v", o, pos, err)
					}
					if o, _, err := other.Apply(ctx, src, d); err != nil || o != kvindex.Duplicate {
						t.Fatalf("second resend: %s, %v", o, err)
					}
					wantGPU := func(when string, n uint64) {
						t.Helper()
						if tiers, _ := other.TierBlocks(ctx, storetest.BackendA); tiers[kvindex.TierGPU] != n {
							t.Fatalf("%s: %d GPU residencies, want %d", when, tiers[kvindex.TierGPU], n)
						}
					}
					wantGPU("after the resend", 2000)
					if ms, _ := other.Score(ctx, storetest.BackendA, storetest.Space, hashes); len(ms) != 1 || ms[0].GPU != 2000 {
						t.Fatalf("after the resend the placements match %+v, want the pod's 2000 GPU blocks", ms)
					}
					rm := func(seq uint64) {
						if o, _, err := other.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: seq, Ops: []kvindex.Op{storetest.Remove(kvindex.TierGPU, hashes[:500]...)}}); err != nil || o != kvindex.Applied {
							t.Fatalf("removal %d: %s, %v", seq, o, err)
						}
					}
					rm(3)
					wantGPU("after one removal of the twice-stored hashes", 2000)
					rm(4)
					wantGPU("after the second removal", 1500)
					if n, _ := other.PodBlocks(ctx, pod); n != 1501 {
						t.Errorf("pod blocks = %d, want 1501", n)
					}
				})
			}
		})
	}
}

// A snapshot cut short leaves the position where it was and only a change
// that drops the rank first applies after it; a restart applies whole.
func TestSnapshotCutShortIsReplacedWhole(t *testing.T) {
	for _, r := range targets(t) {
		t.Run(r.name, func(t *testing.T) {
			ctx := context.Background()
			dying, other := r.store(t, redisstore.Options{}), r.store(t, redisstore.Options{})
			src := storetest.Src("p", 0)
			pod := kvindex.PodKey{Backend: storetest.BackendA, UID: "p"}
			if o, _, err := other.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierCPU, 1)}}); err != nil || o != kvindex.Applied {
				t.Fatalf("sequence 1: %s, %v", o, err)
			}
			entries := make([]kvindex.Entry, 0, 3000)
			for _, h := range storetest.Chain(4, 3000) {
				entries = append(entries, kvindex.Entry{Space: storetest.Space, Tier: kvindex.TierGPU, Hash: h, Refs: 1})
			}
			crashAfter(dying, 4)
			if err := dying.Replace(ctx, src, kvindex.Position{Epoch: 1, Sequence: 9}, kvindex.SnapshotOf(entries)); !errors.Is(err, errCrash) {
				t.Fatalf("crash: %v", err)
			}
			if ps, _ := other.Positions(ctx, pod); ps[0] != (kvindex.Position{Epoch: 1, Sequence: 1}) {
				t.Fatalf("a partial snapshot moved the position to %+v", ps[0])
			}
			if o, _, err := other.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 2}); err != nil || o != kvindex.NeedSnapshot {
				t.Fatalf("the next delta over a partial snapshot: %s, %v", o, err)
			}
			if err := other.Replace(ctx, src, kvindex.Position{Epoch: 1, Sequence: 9}, kvindex.SnapshotOf(entries)); err != nil {
				t.Fatal(err)
			}
			if tiers, _ := other.TierBlocks(ctx, storetest.BackendA); tiers != [kvindex.NumTiers]uint64{0, 3000, 0, 0} {
				t.Fatalf("after the snapshot sent again: tiers %v", tiers)
			}
			if n, _ := other.PodBlocks(ctx, pod); n != 3000 {
				t.Errorf("pod blocks = %d, want 3000", n)
			}
		})
	}
}

// Two replicas applying the same large delta at once (a subscriber that
// reconnected elsewhere while the first replica was still at it) apply
// each step once: one reports it applied, the other a duplicate.
func TestConcurrentReplicasApplyALargeDeltaOnce(t *testing.T) {
	for _, r := range targets(t) {
		t.Run(r.name, func(t *testing.T) {
			ctx := context.Background()
			a, b := r.store(t, redisstore.Options{}), r.store(t, redisstore.Options{})
			src := storetest.Src("p", 0)
			hashes := storetest.Chain(5, 3000)
			for seq := uint64(1); seq <= 4; seq++ {
				op := storetest.Store(kvindex.TierGPU, hashes...)
				if seq%2 == 0 {
					op = storetest.Remove(kvindex.TierGPU, hashes...)
				}
				d := kvindex.Delta{Epoch: 1, Sequence: seq, Ops: []kvindex.Op{op, op}}
				var wg sync.WaitGroup
				outcomes := make([]kvindex.Outcome, 2)
				errs := make([]error, 2)
				for i, s := range []*redisstore.Store{a, b} {
					wg.Go(func() { outcomes[i], _, errs[i] = s.Apply(ctx, src, d) })
				}
				wg.Wait()
				if errs[0] != nil || errs[1] != nil {
					t.Fatalf("sequence %d: %v, %v", seq, errs[0], errs[1])
				}
				if got := [2]kvindex.Outcome(outcomes); got != [2]kvindex.Outcome{kvindex.Applied, kvindex.Duplicate} && got != [2]kvindex.Outcome{kvindex.Duplicate, kvindex.Applied} {
					t.Fatalf("sequence %d: outcomes %v, want one applied and one duplicate", seq, outcomes)
				}
				// Stores add two references (one residency), removals drop both.
				want := uint64(3000)
				if seq%2 == 0 {
					want = 0
				}
				if tiers, _ := a.TierBlocks(ctx, storetest.BackendA); tiers[kvindex.TierGPU] != want {
					t.Fatalf("after sequence %d: %d GPU residencies, want %d", seq, tiers[kvindex.TierGPU], want)
				}
			}
		})
	}
}

// Every key of a pod, its backend and its namespace expires with the
// lease plus the margin (blocks, shared by pods, go with the reaper's
// clears); the reaper's list forgets a backend with its last pod.
func TestKeysExpireWithTheirLease(t *testing.T) {
	addr := startRedis(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	s := newStore(t, addr)
	now := time.Now()
	rec := kvindex.PodRecord{Backend: storetest.BackendA, UID: "p", Name: "p", Model: "m"}
	if err := s.PutPod(ctx, rec, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	storeOps := []kvindex.Op{storetest.Store(kvindex.TierGPU, 1, 2, 3)}
	if _, _, err := s.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: 1, Ops: storeOps}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutPod(ctx, rec, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "kvi2:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	limit := time.Minute + redisstore.DefaultKeyTTLMargin
	checked := 0
	for _, k := range keys {
		if k == "kvi2:backends" || strings.Contains(k, ":blk:") {
			continue
		}
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > limit {
			t.Errorf("key %s: TTL %v, want (0, %v]", k, ttl, limit)
		}
		checked++
	}
	if checked < 8 { // pods, leases, tiers, podblocks, blocks, the namespace count, pos, ranks, rev
		t.Errorf("checked %d keys (%v), want the pod's, backend's and namespace's", checked, keys)
	}
	if _, err := s.ExpireLeases(ctx, now.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.SCard(ctx, "kvi2:backends").Result(); n != 0 {
		t.Errorf("kvi2:backends keeps %d backends after their last pod", n)
	}
	left, _ := c.Keys(ctx, "kvi2:*").Result()
	for _, k := range left {
		if v, _ := c.Get(ctx, k).Result(); v != "0" {
			t.Errorf("key %s outlives the backend's last pod", k)
		}
	}
}

// A caller whose flush would start after half its lease sends nothing (so
// it cannot overwrite a flush another caller took over since); the
// change's resend takes the flush over and completes it.
func TestAnOwnerPastItsLeaseSendsNothing(t *testing.T) {
	for _, r := range clusterOnly(t) {
		t.Run(r.name, func(t *testing.T) {
			ctx := context.Background()
			late := r.store(t, redisstore.Options{FlushLease: time.Nanosecond})
			t.Cleanup(func() { _ = late.Close() })
			other := r.store(t, redisstore.Options{})
			src := storetest.Src("p", 0)
			hashes := storetest.Chain(6, 10)
			d := kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierCPU, hashes...)}}
			if _, _, err := late.Apply(ctx, src, d); err == nil || !strings.Contains(err.Error(), "half its lease") {
				t.Fatalf("apply past the lease: %v, want the flush refused", err)
			}
			if ms, _ := other.Score(ctx, storetest.BackendA, storetest.Space, hashes); len(ms) != 0 {
				t.Fatalf("a flush past its lease wrote placements: %+v", ms)
			}
			if tiers, _ := other.TierBlocks(ctx, storetest.BackendA); tiers != [kvindex.NumTiers]uint64{} {
				t.Fatalf("a flush past its lease counted: %v", tiers)
			}
			if o, _, err := other.Apply(ctx, src, d); err != nil || o != kvindex.Duplicate {
				t.Fatalf("resend: %s, %v, want duplicate (the state was applied, its flush taken over)", o, err)
			}
			if ms, _ := other.Score(ctx, storetest.BackendA, storetest.Space, hashes); len(ms) != 1 || ms[0].CPU != 10 {
				t.Fatalf("after the resend: %+v, want the pod's 10 CPU blocks", ms)
			}
			if tiers, _ := other.TierBlocks(ctx, storetest.BackendA); tiers[kvindex.TierCPU] != 10 {
				t.Fatalf("after the resend: tiers %v", tiers)
			}
		})
	}
}
