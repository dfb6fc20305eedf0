package redisstore_test

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/redisstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
)

// The store's whole contract holds with Score asking Redis block by block
// (no read model) too.
func TestRedisStoreWithoutReadModel(t *testing.T) {
	addr := startRedis(t)
	storetest.Run(t, func(t *testing.T) kvindex.Store {
		flush(t, addr)
		s := redisstore.NewWithOptions(redis.NewClient(&redis.Options{Addr: addr}), redisstore.Options{NoReadModel: true})
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// scores is every pod's match of q by a store, keyed "uid/rank".
func scores(t *testing.T, s kvindex.Store, q []uint64) map[string]kvindex.Match {
	t.Helper()
	ms, err := s.Score(context.Background(), storetest.BackendA, storetest.Space, q)
	require.NoError(t, err)
	out := map[string]kvindex.Match{}
	for _, m := range ms {
		out[m.PodUID+"/"+strconv.Itoa(int(m.Rank))] = m
	}
	return out
}

// A replica's read model answers as Redis's placements do, whichever
// replica applied the changes, across a feed trimmed past what it read, a
// feed begun anew, and pods expiring; and an up-to-date Score costs one
// round trip of two reads, whatever the prompt's length.
func TestReadModelFollowsTheFeed(t *testing.T) {
	for _, r := range targets(t) {
		t.Run(r.name, func(t *testing.T) {
			ctx := context.Background()
			r.flush(t)
			writer := r.store(t, redisstore.Options{})
			model, sent := countingStore(t, r, redisstore.Options{ReadModelInterval: time.Hour})
			truth := r.store(t, redisstore.Options{NoReadModel: true})
			prompt := storetest.Chain(7, 300)
			seqs := map[string]uint64{}
			apply := func(uid string, ops ...kvindex.Op) {
				t.Helper()
				seqs[uid]++
				o, _, err := writer.Apply(ctx, storetest.Src(uid, 0), kvindex.Delta{Epoch: 1, Sequence: seqs[uid], Ops: ops})
				require.NoError(t, err)
				require.Equal(t, kvindex.Applied, o)
			}
			same := func(when string) {
				t.Helper()
				want := scores(t, truth, prompt)
				assert.Equal(t, want, scores(t, model, prompt), when)
				wantPods, err := truth.Pods(ctx, storetest.BackendA)
				require.NoError(t, err)
				gotPods, err := model.Pods(ctx, storetest.BackendA)
				require.NoError(t, err)
				assert.ElementsMatch(t, wantPods, gotPods, "%s: pod records", when)
			}
			putPod := func(uid string) {
				t.Helper()
				require.NoError(t, writer.PutPod(ctx, kvindex.PodRecord{Backend: storetest.BackendA, UID: uid, Name: "engine-" + uid, Model: "m", LastSeen: time.Now().UTC().Truncate(time.Millisecond)}, time.Now().Add(time.Hour)))
			}
			for i := range 6 {
				putPod(fmt.Sprintf("p%d", i))
				apply(fmt.Sprintf("p%d", i), storetest.Store(kvindex.TierGPU, prompt[:50*(i+1)]...), storetest.Store(kvindex.TierCPU, prompt[:20]...))
			}
			same("after the first deltas")
			putPod("p0") // a heartbeat: the record changes
			same("after a record changed")
			require.NotEmpty(t, scores(t, truth, prompt), "the test data matches nothing")

			apply("p1", storetest.Remove(kvindex.TierGPU, prompt[30:40]...))
			apply("p2", storetest.Clear(kvindex.TierCPU))
			apply("p3", storetest.Store(kvindex.TierDisk, prompt...))
			same("after removals, a clear, and a new tier")

			// The feed trimmed past what the model read: it reads the pods'
			// states again.
			apply("p4", storetest.Remove(kvindex.TierGPU, prompt[:100]...))
			trimFeed(t, r)
			apply("p5", storetest.Store(kvindex.TierGPU, prompt...))
			same("after the feed was trimmed")

			// An up-to-date model costs one round trip: the feed's meta and
			// an XREAD, and no placement read.
			sent.reset()
			for range 5 {
				scores(t, model, prompt)
				_, err := model.Pods(ctx, storetest.BackendA)
				require.NoError(t, err)
			}
			assert.Equal(t, 10, sent.roundTrips(), "round trips of 5 Scores and 5 Pods")
			assert.Equal(t, map[string]int{"hmget": 10, "xread": 10}, sent.commands(), "commands of 5 Scores and 5 Pods")

			// The backend's keys gone and begun anew: the model drops what it
			// held.
			r.flush(t)
			seqs = map[string]uint64{}
			// More flushes than the model had read: the feed's count alone
			// does not tell it began anew.
			for i := range 30 {
				apply(fmt.Sprintf("r%d", i), storetest.Store(kvindex.TierGPU, 1000+uint64(i)))
				apply(fmt.Sprintf("r%d", i), storetest.Remove(kvindex.TierGPU, 1000+uint64(i)))
			}
			apply("q", storetest.Store(kvindex.TierCPU, prompt[:10]...))
			same("after the backend began anew")
			assert.Len(t, scores(t, model, prompt), 1)

			// Pods expiring take their blocks out of the model.
			require.NoError(t, writer.PutPod(ctx, kvindex.PodRecord{Backend: storetest.BackendA, UID: "q", Name: "q"}, time.Now().Add(-time.Minute)))
			gone, err := writer.ExpireLeases(ctx, time.Now())
			require.NoError(t, err)
			require.Len(t, gone, 1)
			assert.Empty(t, scores(t, model, prompt), "after the last pod expired")
			recs, err := model.Pods(ctx, storetest.BackendA)
			require.NoError(t, err)
			assert.Empty(t, recs, "pod records after the last pod expired")
		})
	}
}

// A replica that starts late reads the backend from the pods' states,
// one HSCAN per rank, whether the feed was trimmed or is still whole (it
// may lack changes made before it began, by an index of an earlier
// version).
func TestReadModelStartsLate(t *testing.T) {
	for _, r := range targets(t) {
		t.Run(r.name, func(t *testing.T) {
			ctx := context.Background()
			r.flush(t)
			writer := r.store(t, redisstore.Options{})
			truth := r.store(t, redisstore.Options{NoReadModel: true})
			prompt := storetest.Chain(9, 100)
			for i := range 4 {
				uid := fmt.Sprintf("p%d", i)
				require.NoError(t, writer.PutPod(ctx, kvindex.PodRecord{Backend: storetest.BackendA, UID: uid, Name: uid}, time.Now().Add(time.Hour)))
				_, _, err := writer.Apply(ctx, storetest.Src(uid, uint32(i%2)), kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, prompt[:25*(i+1)]...)}})
				require.NoError(t, err)
			}
			want := scores(t, truth, prompt)
			require.Len(t, want, 4)
			late := func(when string) {
				t.Helper()
				before := commandCalls(t, r)
				assert.Equal(t, want, scores(t, r.store(t, redisstore.Options{}), prompt), when)
				after := commandCalls(t, r)
				assert.Equal(t, 4, after["hscan"]-before["hscan"], "%s: one HSCAN per rank", when)
			}
			late("the feed whole")
			trimFeed(t, r)
			late("the feed trimmed")

			// Preloaded: the backend is read before the first query, which
			// then reads no pod state.
			s := r.store(t, redisstore.Options{})
			n, err := s.Preload(ctx)
			require.NoError(t, err)
			assert.Equal(t, 1, n, "backends preloaded")
			before := commandCalls(t, r)
			assert.Equal(t, want, scores(t, s, prompt), "a preloaded replica")
			after := commandCalls(t, r)
			assert.Zero(t, after["hscan"]-before["hscan"], "HSCANs of a preloaded replica's first query")
		})
	}
}

// sent counts what a client sends: round trips (a command, or a
// pipeline) and commands by name.
type sent struct {
	mu    sync.Mutex
	trips int
	cmds  map[string]int
}

func (c *sent) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips, c.cmds = 0, map[string]int{}
}

func (c *sent) roundTrips() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.trips
}

func (c *sent) commands() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.cmds)
}

func (c *sent) count(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trips++
	for _, cmd := range cmds {
		c.cmds[cmd.Name()]++
	}
}

func (c *sent) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *sent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c *sent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.count(cmds...)
		return next(ctx, cmds)
	}
}

// countingStore is a store on r whose client counts what it sends.
func countingStore(t *testing.T, r target, opt redisstore.Options) (*redisstore.Store, *sent) {
	t.Helper()
	c := r.client()
	counter := &sent{cmds: map[string]int{}}
	c.AddHook(counter)
	s := redisstore.NewWithOptions(c, opt)
	t.Cleanup(func() { _ = s.Close() })
	return s, counter
}

// trimFeed trims storetest.BackendA's feed to its last entry, as Redis
// trims one that grew past FeedLength.
func trimFeed(t *testing.T, r target) {
	t.Helper()
	c := r.client()
	defer c.Close()
	n, err := c.XLen(context.Background(), feedKey).Result()
	require.NoError(t, err)
	require.Greater(t, n, int64(1), "nothing to trim")
	require.NoError(t, c.XTrimMaxLen(context.Background(), feedKey, 1).Err())
}

// feedKey is storetest.BackendA's feed.
var feedKey = "kvi2:{" + storetest.BackendA.Namespace + "}:" + storetest.BackendA.Name + ":feed"

// feedNodes are clients of r's masters (the feed is on one of them; the
// others have no such key).
func feedNodes(t *testing.T, r target) []*redis.Client {
	t.Helper()
	var out []*redis.Client
	for _, a := range r.addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = c.Close() })
		out = append(out, c)
	}
	return out
}

// commandCalls sums INFO commandstats' calls per command over r's masters.
func commandCalls(t *testing.T, r target) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, c := range feedNodes(t, r) {
		info, err := c.Info(context.Background(), "commandstats").Result()
		require.NoError(t, err)
		for line := range strings.SplitSeq(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok {
				continue
			}
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			out[strings.TrimPrefix(name, "cmdstat_")] += n
		}
	}
	return out
}

// With ReadModelMaxLag a Score right after a sync sends nothing to Redis,
// and so may miss a change acked meanwhile; once the lag has passed, it
// reads the feed again.
func TestReadModelMaxLag(t *testing.T) {
	r := target{name: "server", addrs: []string{startRedis(t)}}
	ctx := context.Background()
	writer := r.store(t, redisstore.Options{})
	model, sent := countingStore(t, r, redisstore.Options{ReadModelInterval: time.Hour, ReadModelMaxLag: 300 * time.Millisecond})
	prompt := storetest.Chain(5, 10)
	apply := func(seq uint64, n int) {
		t.Helper()
		_, _, err := writer.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: seq, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, prompt[:n]...)}})
		require.NoError(t, err)
	}
	apply(1, 4)
	require.Equal(t, uint32(4), scores(t, model, prompt)["p/0"].GPU)
	synced := time.Now()
	apply(2, 8)
	sent.reset()
	got := scores(t, model, prompt)["p/0"].GPU
	if time.Since(synced) < 300*time.Millisecond {
		assert.Equal(t, uint32(4), got, "within the lag: the model as last synced")
		assert.Zero(t, sent.roundTrips(), "round trips within the lag")
	}
	time.Sleep(time.Until(synced.Add(300 * time.Millisecond)))
	assert.Equal(t, uint32(8), scores(t, model, prompt)["p/0"].GPU, "after the lag")
}

// While Redis cannot be read (here: paused past the query's deadline, as
// in a failover), a Score answers from the model as last synced instead of
// failing.
func TestReadModelAnswersThroughAnOutage(t *testing.T) {
	r := target{name: "server", addrs: []string{startRedis(t)}}
	ctx := context.Background()
	writer := r.store(t, redisstore.Options{})
	// Context deadlines end a command (go-redis' ContextTimeoutEnabled).
	newStore := func() *redisstore.Store {
		s := redisstore.NewWithOptions(redis.NewClient(&redis.Options{Addr: r.addrs[0], ContextTimeoutEnabled: true}), redisstore.Options{ReadModelInterval: time.Hour})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	model := newStore()
	prompt := storetest.Chain(5, 10)
	_, _, err := writer.Apply(ctx, storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, prompt[:6]...)}})
	require.NoError(t, err)
	require.Equal(t, uint32(6), scores(t, model, prompt)["p/0"].GPU)
	require.NoError(t, writer.PutPod(ctx, kvindex.PodRecord{Backend: storetest.BackendA, UID: "p", Name: "engine-0"}, time.Now().Add(time.Hour)))
	recs, err := model.Pods(ctx, storetest.BackendA)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	pause := feedNodes(t, r)[0]
	require.NoError(t, pause.Do(ctx, "CLIENT", "PAUSE", 2000, "ALL").Err())
	t.Cleanup(func() { _ = pause.Do(context.Background(), "CLIENT", "UNPAUSE").Err() })
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	ms, err := model.Score(qctx, storetest.BackendA, storetest.Space, prompt)
	require.NoError(t, err, "a Score during the outage")
	require.Len(t, ms, 1)
	assert.Equal(t, uint32(6), ms[0].GPU)
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer pcancel()
	recs, err = model.Pods(pctx, storetest.BackendA)
	require.NoError(t, err, "the pods' records during the outage")
	require.Len(t, recs, 1)
	assert.Equal(t, "engine-0", recs[0].Name)
	// A store that never synced has nothing to answer with.
	fresh := newStore()
	qctx2, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	_, err = fresh.Score(qctx2, storetest.BackendA, storetest.Space, prompt)
	assert.Error(t, err, "a Score on a model never synced, during the outage")
}

// With NoPlacements the store's whole contract holds, on one server and a
// cluster, and Redis holds no placement key.
func TestNoPlacements(t *testing.T) {
	for _, r := range targets(t) {
		t.Run(r.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) kvindex.Store {
				r.flush(t)
				return r.store(t, redisstore.Options{NoPlacements: true})
			})
			var keys int
			for _, c := range feedNodes(t, r) {
				for cursor := uint64(0); ; {
					ks, next, err := c.Scan(context.Background(), cursor, "*:blk:*", 1000).Result()
					require.NoError(t, err)
					keys += len(ks)
					if cursor = next; cursor == 0 {
						break
					}
				}
			}
			assert.Zero(t, keys, "placement keys")
			n := 0
			for _, c := range feedNodes(t, r) {
				size, err := c.DBSize(context.Background()).Result()
				require.NoError(t, err)
				n += int(size)
			}
			assert.NotZero(t, n, "keys of the last subtest: none, so the scan above proves nothing")
		})
	}
}
