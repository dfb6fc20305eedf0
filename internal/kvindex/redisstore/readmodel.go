package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
)

// The read model: each index replica mirrors the placements and pod
// records of the backends it follows (every backend with a live pod, see
// preload and follow, and any it was asked about) in a memory store and
// walks that for Score, instead of asking Redis for each block of the
// prompt. It follows each
// backend's feed (P feed, written with every flush, atomically with the
// flush's counts: see writesLua), and reads a backend whole from its pods'
// states (Q own:rank) when it starts following it, or when the feed moved
// on without it (trimmed past, or begun anew).
//
// Score reads the feed up to where it stood when Score began, so a query
// sees every change acked before it, whichever replica applied it; a
// background loop keeps each followed backend within the feed's length
// between queries.

// feedRecord is the length of one member of a feed entry: "S:H" (16 hex
// digits, ':', 16 hex digits) and its mask digit.
const feedRecord = 34

// feedBatch is how many feed entries one read asks for.
const feedBatch = 512

// MaxSyncWait bounds how long a Score waits for its read of the feed
// before it answers from the model as last synced (see MaxStaleOnError).
const MaxSyncWait = 250 * time.Millisecond

// MaxStaleOnError is how long after its last sync the read model still
// answers a Score whose own sync failed: the outage of a failover, not
// more.
const MaxStaleOnError = 30 * time.Second

// DefaultReadModelInterval is Options.ReadModelInterval's default.
const DefaultReadModelInterval = 100 * time.Millisecond

type readModel struct {
	s   *Store
	mem *memstore.Store

	mu      sync.Mutex
	feeds   map[kvindex.BackendRef]*feedState
	started bool
	closed  bool
	stop    chan struct{}
	stopped chan struct{}
}

// feedState is how far the model has followed one backend's feed.
type feedState struct {
	// asked counts the syncs asked for; synced is the count the last
	// finished sync covers (it read the feed after they were asked).
	asked atomic.Uint64
	// changes counts the changes made to the backend's model.
	changes atomic.Uint64
	// syncedAt is when the last finished sync began (unix ns): the model
	// holds every change acked before then.
	syncedAt atomic.Int64
	// loading: the backend is being read again (the model holds part of
	// it).
	loading atomic.Bool

	// pods are the backend's pod records by UID, as the model read them.
	podsMu sync.RWMutex
	pods   map[string]kvindex.PodRecord

	mu     sync.Mutex // held by a sync
	synced uint64
	loaded bool
	gen    string
	last   uint64
}

func newReadModel(s *Store) *readModel {
	return &readModel{s: s, mem: memstore.New(), feeds: map[kvindex.BackendRef]*feedState{}, stop: make(chan struct{}), stopped: make(chan struct{})}
}

// modelSpace is the memory store's space for a Redis space id.
func modelSpace(sid string) kvindex.Space { return kvindex.Space{Scheme: sid} }

// score answers Score from the model as it holds every change the feed
// held when score was called. The walk does not wait for the feed's
// round trip: it runs beside it, and again after it only when the model
// changed meanwhile (a walk that began before the sync's changes may
// have missed one the caller must see).
func (m *readModel) score(ctx context.Context, backend kvindex.BackendRef, space kvindex.Space, hashes []uint64) ([]kvindex.Match, error) {
	fs := m.feed(backend)
	sp := modelSpace(spaceID(space))
	synced := m.startSync(ctx, backend, fs)
	if synced == nil {
		return m.mem.Score(ctx, backend, sp, hashes)
	}
	before := fs.changes.Load()
	ms, err := m.mem.Score(ctx, backend, sp, hashes)
	if serr := m.await(ctx, backend, fs, synced); serr != nil {
		return nil, serr
	}
	if err != nil || fs.changes.Load() == before {
		return ms, err
	}
	return m.mem.Score(ctx, backend, sp, hashes)
}

// await waits for a sync of fs (its result on synced) and says whether
// the model may answer: after the sync; or, when Redis cannot be read (a
// master's failover, CLUSTERDOWN) or not within MaxSyncWait, as last
// synced, if that was at most MaxStaleOnError ago and no read of the
// whole backend is under way, rather than no answer (a router would route
// blind): it then misses at most the changes acked between that sync and
// the failure. A model never synced waits for its first read (a replica
// reads every backend before it is ready, see Preload), bounded by ctx.
func (m *readModel) await(ctx context.Context, backend kvindex.BackendRef, fs *feedState, synced <-chan error) error {
	var serr error
	bound := MaxSyncWait
	if fs.syncedAt.Load() == 0 {
		bound = time.Duration(1<<63 - 1)
	}
	wait := time.NewTimer(bound)
	defer wait.Stop()
	select {
	case serr = <-synced:
	case <-ctx.Done():
		serr = ctx.Err()
	case <-wait.C:
		serr = fmt.Errorf("the feed of %s not read in %s", backend, MaxSyncWait)
	}
	if serr == nil {
		return nil
	}
	if at := fs.syncedAt.Load(); at == 0 || time.Since(time.Unix(0, at)) > MaxStaleOnError || fs.loading.Load() {
		return serr
	}
	return nil
}

// startSync starts a sync of fs for a caller that asks now and returns
// the channel its result comes on (see await); nil when the model is
// younger than Options.ReadModelMaxLag and the caller answers as it is.
func (m *readModel) startSync(ctx context.Context, backend kvindex.BackendRef, fs *feedState) <-chan error {
	if lag := m.s.opt.ReadModelMaxLag; lag > 0 && time.Since(time.Unix(0, fs.syncedAt.Load())) < lag {
		return nil
	}
	ticket := fs.asked.Add(1)
	synced := make(chan error, 1)
	go func() { synced <- m.syncFrom(ctx, backend, fs, ticket) }()
	return synced
}

// podRecords answers Pods from the model, as score answers Score.
func (m *readModel) podRecords(ctx context.Context, backend kvindex.BackendRef) ([]kvindex.PodRecord, error) {
	fs := m.feed(backend)
	if synced := m.startSync(ctx, backend, fs); synced != nil {
		if err := m.await(ctx, backend, fs, synced); err != nil {
			return nil, err
		}
	}
	fs.podsMu.RLock()
	defer fs.podsMu.RUnlock()
	out := make([]kvindex.PodRecord, 0, len(fs.pods))
	for _, rec := range fs.pods {
		out = append(out, rec)
	}
	return out, nil
}

// setPod keeps (rec != "") or drops a pod's record in the model.
func (fs *feedState) setPod(backend kvindex.BackendRef, uid, rec string) {
	fs.podsMu.Lock()
	defer fs.podsMu.Unlock()
	if rec == "" {
		delete(fs.pods, uid)
		return
	}
	var r kvindex.PodRecord
	if err := json.Unmarshal([]byte(rec), &r); err != nil {
		return // as Pods skips a record it cannot read
	}
	r.Backend = backend
	if fs.pods == nil {
		fs.pods = map[string]kvindex.PodRecord{}
	}
	fs.pods[uid] = r
}

func (m *readModel) feed(backend kvindex.BackendRef) *feedState {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.started {
		m.started = true
		go m.follow()
	}
	fs := m.feeds[backend]
	if fs == nil {
		fs = &feedState{}
		m.feeds[backend] = fs
	}
	return fs
}

// sync brings the model of backend up to where its feed stands now: a
// sync already running when it was called may have read the feed before
// the caller's change was acked, so it waits for one that started after.
func (m *readModel) sync(ctx context.Context, backend kvindex.BackendRef) error {
	fs := m.feed(backend)
	return m.syncFrom(ctx, backend, fs, fs.asked.Add(1))
}

// syncFrom is sync for the caller that took ticket.
func (m *readModel) syncFrom(ctx context.Context, backend kvindex.BackendRef, fs *feedState, ticket uint64) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.synced >= ticket {
		return nil
	}
	covers, began := fs.asked.Load(), time.Now()
	if err := m.catchUp(ctx, backend, fs); err != nil {
		return fmt.Errorf("following the index's feed of %s in redis: %w", backend, err)
	}
	fs.synced = covers
	fs.syncedAt.Store(began.UnixNano())
	return nil
}

// catchUp applies the feed's entries up to the last one it had when
// catchUp began, reading the backend again first when the model has not
// read it yet, or has lost the feed's thread; fs.mu held.
func (m *readModel) catchUp(ctx context.Context, backend kvindex.BackendRef, fs *feedState) error {
	p := prefix(backend)
	var target uint64
	targetSet := false
	for reloads := 0; ; {
		if !fs.loaded {
			if reloads++; reloads > 3 {
				return errors.New("the feed moved on while the backend was read, three times")
			}
			if err := m.load(ctx, backend, fs); err != nil {
				return err
			}
		}
		pipe := m.s.rdb.Pipeline()
		meta := pipe.HMGet(ctx, p+"feedn", "n", "gen")
		read := pipe.XRead(ctx, &redis.XReadArgs{Streams: []string{p + "feed", strconv.FormatUint(fs.last, 10) + "-0"}, Count: feedBatch, Block: -1})
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		n, gen := feedMeta(meta.Val())
		if gen != fs.gen || n < fs.last {
			// Begun anew (the backend's keys went and came back): read it
			// again, up to where the new feed stands then.
			fs.loaded, targetSet = false, false
			continue
		}
		if !targetSet {
			target, targetSet = n, true
		}
		got := 0
		for _, st := range read.Val() {
			got += len(st.Messages)
			for _, msg := range st.Messages {
				k, ok := strings.CutSuffix(msg.ID, "-0")
				seq, err := strconv.ParseUint(k, 10, 64)
				if !ok || err != nil || seq != fs.last+1 {
					fs.loaded = false // trimmed past what the model read
					break
				}
				if uid, ok := msg.Values["p"].(string); ok {
					rec, _ := msg.Values["r"].(string)
					fs.setPod(backend, uid, rec)
					fs.last = seq
					continue
				}
				inst, _ := msg.Values["i"].(string)
				members, _ := msg.Values["m"].(string)
				err = m.apply(backend, inst, members)
				fs.changes.Add(1) // after the change: see score
				if err != nil {
					return fmt.Errorf("feed entry %s: %w", msg.ID, err)
				}
				fs.last = seq
			}
		}
		switch {
		case fs.loaded && (fs.last >= target || fs.last >= n):
			return nil
		case fs.loaded && got < feedBatch && fs.last < n:
			fs.loaded = false // the entries up to n were trimmed
		}
	}
}

// feedMeta reads P feedn's n and gen (0 and "" without a feed).
func feedMeta(vals []any) (uint64, string) {
	var n uint64
	var gen string
	if len(vals) == 2 {
		if v, ok := vals[0].(string); ok {
			n, _ = strconv.ParseUint(v, 10, 64)
		}
		gen, _ = vals[1].(string)
	}
	return n, gen
}

// apply sets one feed entry's masks in the model.
func (m *readModel) apply(backend kvindex.BackendRef, inst, members string) error {
	uid, rank, err := parseInstance(inst)
	if err != nil {
		return err
	}
	if len(members)%feedRecord != 0 {
		return fmt.Errorf("members of %d bytes, not records of %d", len(members), feedRecord)
	}
	rs := make([]memstore.Residency, 0, len(members)/feedRecord)
	for i := 0; i < len(members); i += feedRecord {
		r := members[i : i+feedRecord]
		h, err := strconv.ParseUint(r[17:33], 16, 64)
		if err != nil || r[16] != ':' || r[33] < '0' || r[33] > '7' {
			return fmt.Errorf("member %q", r)
		}
		rs = append(rs, memstore.Residency{Space: modelSpace(r[:16]), Hash: h, Mask: (r[33] - '0') << 1})
	}
	m.mem.SetResidencies(backend, uid, rank, rs)
	return nil
}

func parseInstance(inst string) (string, uint32, error) {
	uid, r, ok := strings.Cut(inst, "|")
	rank, err := strconv.ParseUint(r, 10, 32)
	if !ok || err != nil {
		return "", 0, fmt.Errorf("instance %q", inst)
	}
	return uid, uint32(rank), nil
}

// load reads backend whole from its pods' states, and notes where its
// feed stood just before: the entries after that are applied over it
// (each sets a member's mask as its flush left it, so an entry the read
// already saw sets the same, or a mask a later entry sets again).
func (m *readModel) load(ctx context.Context, backend kvindex.BackendRef, fs *feedState) error {
	p := prefix(backend)
	vals, err := m.s.rdb.HMGet(ctx, p+"feedn", "n", "gen").Result()
	if err != nil {
		return err
	}
	n, gen := feedMeta(vals)
	// Counted after the changes (see score), whether or not the read ends.
	defer fs.changes.Add(1)
	fs.loading.Store(true)
	defer fs.loading.Store(false)
	m.mem.DropBackend(backend)
	recs, err := m.s.rdb.HGetAll(ctx, p+"pods").Result()
	if err != nil {
		return err
	}
	fs.podsMu.Lock()
	fs.pods = nil
	fs.podsMu.Unlock()
	for uid, rec := range recs {
		fs.setPod(backend, uid, rec)
	}
	// Not the feed from its first entry, though it may still hold it:
	// changes made before it began (by an index of an earlier version)
	// are only in the pods' states. The pods: those with a lease, a
	// record, or blocks counted.
	var uids []string
	for _, key := range []string{"pods", "podblocks"} {
		ks, err := m.s.rdb.HKeys(ctx, p+key).Result()
		if err != nil {
			return err
		}
		uids = append(uids, ks...)
	}
	leased, err := m.s.rdb.ZRange(ctx, p+"leases", 0, -1).Result()
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, uid := range append(uids, leased...) {
		if seen[uid] {
			continue
		}
		seen[uid] = true
		q := podPrefix(backend, uid)
		ranks, err := m.s.rdb.SMembers(ctx, q+"ranks").Result()
		if err != nil {
			return err
		}
		for _, r := range ranks {
			rank, err := strconv.ParseUint(r, 10, 32)
			if err != nil {
				continue
			}
			if err := m.loadRank(ctx, backend, uid, uint32(rank), q+"own:"+r); err != nil {
				return err
			}
		}
	}
	fs.loaded, fs.gen, fs.last = true, gen, n
	return nil
}

// loadRank reads one rank's state (member -> "g c d") into the model.
func (m *readModel) loadRank(ctx context.Context, backend kvindex.BackendRef, uid string, rank uint32, key string) error {
	for cursor := uint64(0); ; {
		kv, next, err := m.s.rdb.HScan(ctx, key, cursor, "", 4096).Result()
		if err != nil {
			return err
		}
		rs := make([]memstore.Residency, 0, len(kv)/2)
		for i := 0; i+1 < len(kv); i += 2 {
			sid, hx, ok := strings.Cut(kv[i], ":")
			h, err := strconv.ParseUint(hx, 16, 64)
			if !ok || err != nil {
				continue
			}
			var mask uint8
			for t, f := range strings.Fields(kv[i+1]) {
				if t < 3 && f != "0" {
					mask |= kvindex.TierBit(kvindex.TierGPU + kvindex.Tier(t))
				}
			}
			rs = append(rs, memstore.Residency{Space: modelSpace(sid), Hash: h, Mask: mask})
		}
		m.mem.SetResidencies(backend, uid, rank, rs)
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// preload follows every backend the store has a lease for and reads it
// into the model; it returns how many.
func (m *readModel) preload(ctx context.Context) (int, error) {
	refs, err := m.backends(ctx)
	if err != nil {
		return 0, err
	}
	for _, ref := range refs {
		if err := m.sync(ctx, ref); err != nil {
			return 0, err
		}
	}
	return len(refs), nil
}

// backends lists the backends with a lease (the reaper's list).
func (m *readModel) backends(ctx context.Context) ([]kvindex.BackendRef, error) {
	names, err := m.s.rdb.SMembers(ctx, backendsKey).Result()
	if err != nil {
		return nil, fmt.Errorf("listing backends in redis: %w", err)
	}
	var out []kvindex.BackendRef
	for _, b := range names {
		if ns, name, ok := strings.Cut(b, "/"); ok {
			out = append(out, kvindex.BackendRef{Namespace: ns, Name: name})
		}
	}
	return out, nil
}

// discoverEvery: the follower looks for backends it does not follow yet
// every this many intervals.
const discoverEvery = 10

// follow syncs every followed backend each Options.ReadModelInterval, so
// that none falls further behind than the feed keeps between queries,
// follows the backends other replicas created (every discoverEvery
// intervals), and stops following a backend whose feed is gone (its last
// pod expired).
func (m *readModel) follow() {
	defer close(m.stopped)
	t := time.NewTicker(m.s.opt.ReadModelInterval)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		if tick%discoverEvery == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			refs, err := m.backends(ctx)
			cancel()
			if err == nil {
				for _, ref := range refs {
					m.feed(ref)
				}
			}
		}
		m.mu.Lock()
		refs := make([]kvindex.BackendRef, 0, len(m.feeds))
		for ref := range m.feeds {
			refs = append(refs, ref)
		}
		m.mu.Unlock()
		for _, ref := range refs {
			// Long enough to read a large backend again.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			err := m.sync(ctx, ref)
			cancel()
			if err != nil {
				continue // the next query reports it
			}
			m.forgetIfGone(ref)
		}
	}
}

// forgetIfGone stops following a backend that has no feed and no blocks
// in the model.
func (m *readModel) forgetIfGone(ref kvindex.BackendRef) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fs := m.feeds[ref]
	if fs == nil || !fs.mu.TryLock() {
		return
	}
	defer fs.mu.Unlock()
	if fs.gen == "" && fs.last == 0 {
		if tiers, _ := m.mem.TierBlocks(context.Background(), ref); tiers == ([kvindex.NumTiers]uint64{}) {
			delete(m.feeds, ref)
		}
	}
}

func (m *readModel) close() {
	m.mu.Lock()
	started, closed := m.started, m.closed
	m.started, m.closed = true, true // no follower starts after this
	m.mu.Unlock()
	if closed {
		return
	}
	close(m.stop)
	if started {
		<-m.stopped
	}
}
