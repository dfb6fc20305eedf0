// Package redisstore is the Redis/Valkey kvindex.Store, for index replicas
// that share one state, on one server or a Redis Cluster / Valkey cluster.
//
// Key schema, in three kinds of cluster slot (P is "kvi2:{namespace}:name:",
// the backend's slot; Q is "kvi2:{namespace/name/podUID}:", a pod's slot; S
// a space id, the FNV-64a of model, LoRA and hash scheme; H a block hash
// in 16 hex digits; I an instance "podUID|rank"):
//
//	Q own:rank       HASH  "S:H" -> "g c d": the rank's references in the
//	                       GPU, CPU and disk tiers (the rank's state)
//	Q prog:rank      HASH  the change in progress: token, step, cursor
//	Q pend:rank      HASH  the flush in progress: version, owner, lease
//	                       end, count changes, the members it changed
//	Q vers           HASH  rank -> the last flush's version
//	Q pos            HASH  rank -> "epoch:sequence" applied
//	Q ranks          SET   ranks a change began for (the reaper's list)
//	Q lease          STRING the pod's lease end (unix ms)
//	kvi2:{H}:blk:namespace/name:S
//	                 HASH  I -> tier mask (1 GPU, 2 CPU, 4 disk): the
//	                       placement Score reads, in the block's slot
//	P tiers          HASH  tier -> residencies in the backend
//	P podblocks      HASH  podUID -> blocks held (any tier)
//	P blocks         STRING the backend's blocks (podblocks summed)
//	P seen           HASH  I -> the last flush version counted
//	P feed           STREAM the backend's flushes, entry n-0 the n-th: the
//	                       instance and each changed member's new mask,
//	                       trimmed to about FeedLength entries
//	P feedn          HASH  n (the last entry's) and gen (the feed's
//	                       lifetime); the index replicas' read models
//	                       follow the feed (readmodel.go)
//	P pods           HASH  podUID -> pod record (JSON)
//	P leases         ZSET  podUID scored by lease end (unix ms)
//	kvi2:{ns}:_blocks STRING the namespace's blocks
//	kvi2:backends     SET   "namespace/name" of every backend with a lease
//	                       (the reaper's list; shrinks with a backend's
//	                       last pod)
//
// So on a cluster one backend's blocks spread over every master by block
// hash, and its pods' states by pod; the backend's slot takes one small
// script per change. A change (a delta, a snapshot, a lease expiry) runs
// as Lua scripts in the pod's slot of at most Options.ChunkHashes hashes
// each, so that no script holds Redis for more than a few milliseconds;
// a per-rank record of the change in progress, checked and advanced by
// each script, keeps deltas exactly once across crashes and replicas
// (see step). On one server a script may write any key, so each script
// writes the placements and counts it changed itself (see attach). On a
// cluster each script that changed the rank's state leaves a pending
// flush (pend) instead: the placements of the members it changed, written
// as absolute masks (so writing them twice is harmless), and its count
// changes, counted once per version by a script in the backend's slot.
// The caller that ran the script owns the flush for Options.FlushLease
// and acks it with the rank's next call (or after Options.AckDelay); any
// other call on the rank waits for the ack or the lease's end, then takes
// the flush over. An owner sends no flush write after half its lease, so
// two never interleave. Every
// key but the placements and kvi2:backends expires Options.KeyTTLMargin
// after the last lease PutPod set for it; a placement is emptied, and so
// removed, by the clears of its holders.
//
// Score walks a read model: the placements of the backends (every one
// with a live pod, and those a replica was asked about), mirrored in its memory (a memstore) from their feeds, each
// query reading its backend's feed first (Options.NoReadModel asks Redis
// for each block's placement instead).
package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inferencecache/operator/internal/kvindex"
)

// Store is the Redis store.
type Store struct {
	rdb redis.UniversalClient
	// cluster is rdb on a Redis Cluster, nil on one server (or a
	// Sentinel's master), where a script may write every key.
	cluster *redis.ClusterClient
	// single is rdb on one server or a Sentinel's master (go-redis'
	// failover client is a *redis.Client), nil on a cluster.
	single *redis.Client
	opt    Options
	// id owns the flushes this store's calls leave.
	id string
	// onCall, when set (tests), hears each change script call that did
	// its step's work (not one that waited for or took over a flush), with
	// the step, before its flush; an error stops the change there, as a
	// crash would.
	onCall func(step int) error

	mu    sync.Mutex
	ranks map[string]*rankState // by pod prefix and rank

	// model is the read model Score walks; nil with Options.NoReadModel.
	model *readModel
}

// rankState serializes this store's changes of one rank and keeps the
// version it flushed and has not acked yet: the rank's next call acks it,
// or a timer after Options.AckDelay, so that a stream of deltas costs no
// ack call of its own and another replica waits at most that long for it.
type rankState struct {
	change sync.Mutex // held for a change (or an expiry) of the rank
	src    kvindex.Source
	// Guarded by Store.mu.
	users int
	ack   string
	timer *time.Timer
}

// DefaultAckDelay is Options.AckDelay's default: longer than the gap
// between two deltas of a busy engine (vLLM publishes a batch a
// scheduler step), short against a subscriber's reconnect.
const DefaultAckDelay = 250 * time.Millisecond

// Options configure a Store.
type Options struct {
	// Limits the store enforces (kvindex.Limits). On one server the
	// pod's, backend's and namespace's blocks are read atomically with the
	// change; on a cluster, just before it, so that changes of different
	// pods that race may pass a backend's or namespace's limit together
	// by one change each.
	Limits kvindex.Limits
	// ChunkHashes bounds the hashes (or snapshot entries, or members of a
	// clear) one Lua script handles, so that no script holds Redis for
	// more than a few milliseconds. Default DefaultChunkHashes.
	ChunkHashes int
	// KeyTTLMargin: a pod's keys, and its backend's and namespace's, expire
	// this long after the last lease that PutPod set for them, so that the
	// state goes even when no index replica is left to reap it. Default
	// DefaultKeyTTLMargin.
	KeyTTLMargin time.Duration
	// AckDelay is how long a flushed version waits for the rank's next
	// call to ack it before a call of its own does; another replica's
	// call on the rank waits for it that long at most. Default
	// DefaultAckDelay.
	AckDelay time.Duration
	// FlushLease is how long a caller owns the flush its script left
	// before another may take it over; the owner sends nothing after half
	// of it. Default DefaultFlushLease.
	FlushLease time.Duration
	// WaitReplicas, when above 0, makes every write of a change wait, on
	// the connection that sent it (Redis' WAIT), until that many replicas
	// of its master hold it (or every replica the master has, when it has
	// fewer; none: no wait), for at most WaitTimeout; a write that reaches
	// fewer fails the change with ErrNotReplicated, so that nothing is
	// acked to a subscriber that a master's crash and its replica's
	// promotion could lose (the subscriber sends it again). 0: writes are
	// acked once their master has them (Redis' asynchronous replication).
	WaitReplicas int
	// WaitTimeout bounds each wait of WaitReplicas. Default
	// DefaultWaitTimeout.
	WaitTimeout time.Duration
	// NoReadModel makes Score ask Redis for each block of the prompt (one
	// HGETALL of its placement) instead of walking the store's read model:
	// the placements of every backend with a live pod, mirrored in this
	// process's memory (about as much as the memory store holds for them)
	// and kept current from each backend's feed (see readmodel.go).
	NoReadModel bool
	// NoPlacements leaves out the placement keys (kvi2:{H}:blk:…), which
	// only a Score without the read model reads: each block update then
	// costs Redis one write less, and a cluster no per-master placement
	// script per change. Every replica on the Redis must then use the read
	// model; with NoReadModel it is ignored.
	NoPlacements bool
	// ReadModelInterval is how often the read model follows the feeds of
	// its backends between queries. Default DefaultReadModelInterval.
	ReadModelInterval time.Duration
	// ReadModelMaxLag, when above 0, lets Score answer from the read model
	// without a round trip to Redis while the model's last sync began less
	// than this long ago: a query may then miss a change acked up to that
	// long before it. 0: every Score reads the feed first (one round trip,
	// beside the walk), so that it sees every change acked before it,
	// whichever replica applied it.
	ReadModelMaxLag time.Duration
}

// DefaultWaitTimeout is Options.WaitTimeout's default.
const DefaultWaitTimeout = time.Second

// ErrNotReplicated: a write reached fewer replicas than
// Options.WaitReplicas within Options.WaitTimeout.
var ErrNotReplicated = errors.New("the write reached too few replicas")

// DefaultChunkHashes is Options.ChunkHashes' default: about 1 ms of script
// work on a 2-core machine (docs/performance.md).
const DefaultChunkHashes = 256

// DefaultKeyTTLMargin is Options.KeyTTLMargin's default.
const DefaultKeyTTLMargin = 10 * time.Minute

// DefaultFlushLease is Options.FlushLease's default.
const DefaultFlushLease = 4 * time.Second

var _ kvindex.Store = (*Store)(nil)

// New returns a store on rdb without limits.
func New(rdb redis.UniversalClient) *Store { return NewWithOptions(rdb, Options{}) }

// NewWithOptions returns a store on rdb.
func NewWithOptions(rdb redis.UniversalClient, opt Options) *Store {
	if opt.ChunkHashes <= 0 {
		opt.ChunkHashes = DefaultChunkHashes
	}
	if opt.KeyTTLMargin <= 0 {
		opt.KeyTTLMargin = DefaultKeyTTLMargin
	}
	if opt.FlushLease <= 0 {
		opt.FlushLease = DefaultFlushLease
	}
	if opt.AckDelay <= 0 {
		opt.AckDelay = DefaultAckDelay
	}
	if opt.WaitTimeout <= 0 {
		opt.WaitTimeout = DefaultWaitTimeout
	}
	if opt.ReadModelInterval <= 0 {
		opt.ReadModelInterval = DefaultReadModelInterval
	}
	if opt.NoReadModel {
		opt.NoPlacements = false // its Score reads them
	}
	cluster, _ := rdb.(*redis.ClusterClient)
	single, _ := rdb.(*redis.Client)
	s := &Store{rdb: rdb, cluster: cluster, single: single, opt: opt, id: newOwner(), ranks: map[string]*rankState{}}
	if !opt.NoReadModel {
		s.model = newReadModel(s)
	}
	return s
}

// Preload reads every backend that has a pod with a lease into the read
// model, so that the replica's first queries need not wait for it; it
// returns how many (0 without the read model). The read model then keeps
// following them, and the backends created later.
func (s *Store) Preload(ctx context.Context) (int, error) {
	if s.model == nil {
		return 0, nil
	}
	return s.model.preload(ctx)
}

// Close implements kvindex.Store: the acks still waiting are sent first.
func (s *Store) Close() error {
	s.mu.Lock()
	var due []func()
	for key, rs := range s.ranks {
		if rs.timer != nil && rs.timer.Stop() {
			due = append(due, func() { s.ackLater(key, rs) })
		}
	}
	s.mu.Unlock()
	for _, f := range due {
		f()
	}
	if s.model != nil {
		s.model.close()
	}
	return s.rdb.Close()
}

const backendsKey = "kvi2:backends"

// prefix is a backend's key prefix (its slot): its counts, pods and
// leases. The namespace is the hash tag: a namespace's backends share a
// cluster slot, so one script keeps the namespace's block count with the
// backend's.
func prefix(b kvindex.BackendRef) string { return "kvi2:{" + b.Namespace + "}:" + b.Name + ":" }

// podPrefix is a pod's key prefix (its slot): its ranks' states.
func podPrefix(b kvindex.BackendRef, uid string) string {
	return "kvi2:{" + b.Namespace + "/" + b.Name + "/" + uid + "}:"
}

// blockKey is the placement of a block: the hash is the hash tag, so a
// backend's blocks spread over a cluster's slots.
func blockKey(b kvindex.BackendRef, space, hash string) string {
	pre, suf := blockKeyParts(b)
	return pre + hash + suf + space
}

// blockKeyParts are a placement key's parts before and after the hash
// (the space follows): the scripts build keys from them.
func blockKeyParts(b kvindex.BackendRef) (pre, suf string) {
	return "kvi2:{", "}:blk:" + b.Namespace + "/" + b.Name + ":"
}

// nsKey counts a namespace's blocks. '_' is in no Kubernetes name, so no
// backend's prefix meets it.
func nsKey(namespace string) string { return "kvi2:{" + namespace + "}:_blocks" }

func spaceID(sp kvindex.Space) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(kvindex.SpaceKey(sp)))
	return fmt.Sprintf("%016x", h.Sum64())
}

// hashHex is h in 16 hex digits (fmt's %016x, without fmt's cost: it is
// called for every block of every change).
func hashHex(h uint64) string {
	var v [8]byte
	var b [16]byte
	binary.BigEndian.PutUint64(v[:], h)
	hex.Encode(b[:], v[:])
	return string(b[:])
}

// newOwner names a store as the owner of the flushes its calls leave.
func newOwner() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// errLeasePassed stops a flush its owner could no longer finish inside
// its lease: the change resumes on its resend, whose flush is taken over.
var errLeasePassed = errors.New("the flush outlived half its lease")

// caller runs one change's script calls on one rank: it flushes what each
// call leaves and acks it with the next call.
type caller struct {
	s    *Store
	src  kvindex.Source
	q    string
	key  string
	rs   *rankState
	ack  string // the version flushed and not acked yet
	base []any  // lib's ARGV
}

// newCaller starts a change of src's rank: it waits for this store's
// other change of the rank, if any, and takes over its unacked version.
// The caller must release it.
func (s *Store) newCaller(src kvindex.Source) *caller {
	key := podPrefix(src.Backend, src.PodUID) + strconv.FormatUint(uint64(src.Rank), 10)
	s.mu.Lock()
	rs := s.ranks[key]
	if rs == nil {
		rs = &rankState{src: src}
		s.ranks[key] = rs
	}
	rs.users++
	s.mu.Unlock()
	rs.change.Lock()
	s.mu.Lock()
	if rs.timer != nil {
		rs.timer.Stop()
		rs.timer = nil
	}
	c := s.callerOf(key, rs)
	s.mu.Unlock()
	return c
}

// callerOf is a caller on rs's rank that takes over its unacked version;
// s.mu and rs.change held.
func (s *Store) callerOf(key string, rs *rankState) *caller {
	q := podPrefix(rs.src.Backend, rs.src.PodUID)
	c := &caller{s: s, src: rs.src, q: q, key: key, rs: rs, ack: rs.ack}
	rs.ack = ""
	direct := "1"
	switch {
	case s.cluster != nil:
		direct = "0"
	case s.opt.NoPlacements:
		direct = "2"
	}
	pre, suf := blockKeyParts(rs.src.Backend)
	c.base = []any{q, strconv.FormatUint(uint64(rs.src.Rank), 10), s.id, s.opt.FlushLease.Milliseconds(), s.opt.KeyTTLMargin.Milliseconds(), "",
		direct, prefix(rs.src.Backend), nsKey(rs.src.Backend.Namespace), pre, suf, rs.src.PodUID}
	return c
}

// leave drops rs from the store's ranks once no change uses it and no
// ack waits; s.mu held.
func (s *Store) leave(key string, rs *rankState) {
	rs.users--
	if rs.users == 0 && rs.ack == "" {
		delete(s.ranks, key)
	}
}

// release ends the change: a version flushed and not acked yet waits for
// the rank's next call, or Options.AckDelay.
func (c *caller) release() {
	s, rs := c.s, c.rs
	s.mu.Lock()
	if c.ack != "" {
		rs.ack = c.ack
		rs.timer = time.AfterFunc(s.opt.AckDelay, func() { s.ackLater(c.key, rs) })
	}
	s.leave(c.key, rs)
	s.mu.Unlock()
	rs.change.Unlock()
}

// ackLater acks a rank's version that no call took over in AckDelay. An
// ack that fails leaves the flush to be taken over after its lease.
func (s *Store) ackLater(key string, rs *rankState) {
	rs.change.Lock()
	s.mu.Lock()
	rs.timer = nil
	rs.users++
	c := s.callerOf(key, rs)
	s.mu.Unlock()
	if c.ack != "" {
		ctx, cancel := context.WithTimeout(context.Background(), s.opt.FlushLease)
		_, _ = c.call(ctx, ackScript, slices.Clone(c.base), 0)
		cancel()
	}
	s.mu.Lock()
	s.leave(key, rs)
	s.mu.Unlock()
	rs.change.Unlock()
}

// call runs script with args (lib's first, whose ack it sets) and flushes
// what it left; a 'wait' for another owner's flush and a flush taken over
// are dealt with here, and the call repeated. It returns the reply's
// status and arguments.
func (c *caller) call(ctx context.Context, script *redis.Script, args []any, step int) ([]string, error) {
	keys := []string{c.q + "pos"}
	for {
		args[5] = c.ack
		sent := time.Now()
		res, err := c.s.run(ctx, nil, script, keys, args...).StringSlice()
		if err != nil {
			return nil, err
		}
		c.ack = ""
		if c.s.onCall != nil && script != ackScript && res[0] != "wait" && res[0] != "flush" {
			if err := c.s.onCall(step); err != nil {
				return nil, err
			}
		}
		if res[0] != "over" && res[4] != "" {
			if err := c.flush(ctx, sent, res[4], res[5], res[6:]); err != nil {
				return nil, err
			}
			c.ack = res[4]
		}
		switch res[0] {
		case "wait":
			ms, _ := strconv.Atoi(res[1])
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(min(max(ms, 1), 5)) * time.Millisecond):
			}
		case "flush":
		default:
			return res, nil
		}
	}
}

// flush writes a call's placements (absolute masks: a flush done twice
// writes the same) and its count changes (counted once per version),
// unless half the lease has passed since the call was sent.
func (c *caller) flush(ctx context.Context, sent time.Time, ver, d string, pairs []string) error {
	if time.Since(sent) > c.s.opt.FlushLease/2 {
		return errLeasePassed
	}
	counts := strings.Fields(d)
	if len(counts) != 4 {
		return fmt.Errorf("flush %s: counts %q", ver, d)
	}
	// The placements and the counts are in different slots and
	// independent: both at once.
	inst := c.src.PodUID + "|" + c.base[1].(string)
	var countErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		p := prefix(c.src.Backend)
		if err := c.s.run(ctx, nil, countScript, []string{p + "seen"}, p, nsKey(c.src.Backend.Namespace), c.src.PodUID, c.base[1], ver, counts[0], counts[1], counts[2], counts[3], feedMembers(pairs)).Err(); err != nil {
			countErr = fmt.Errorf("counting: %w", err)
		}
	})
	var placeErr error
	if !c.s.opt.NoPlacements {
		placeErr = c.s.place(ctx, c.src.Backend, inst, pairs)
	}
	wg.Wait()
	if placeErr != nil {
		return fmt.Errorf("writing placements: %w", placeErr)
	}
	return countErr
}

// feedMembers is a flush's members as the feed holds them: each member
// followed by its mask digit.
func feedMembers(pairs []string) string {
	var b strings.Builder
	b.Grow(len(pairs) / 2 * feedRecord)
	for i := 0; i+1 < len(pairs); i += 2 {
		b.WriteString(pairs[i])
		b.WriteString(pairs[i+1])
	}
	return b.String()
}

// deltaSteps splits d into the payloads of its steps (see step): each
// clear is a step, and the hashes of consecutive store and remove ops are
// cut into steps of at most chunk hashes; step 0 (the begin) carries the
// first of these when the delta does not start with a clear.
func deltaSteps(d kvindex.Delta, chunk int) [][]any {
	steps := [][]any{nil}
	var cur []any
	n := 0
	flush := func() {
		if cur != nil {
			steps = append(steps, cur)
			cur, n = nil, 0
		}
	}
	for _, op := range d.Ops {
		switch op.Kind {
		case kvindex.OpClear:
			flush()
			steps = append(steps, []any{"C", int(op.Tier)})
		case kvindex.OpStore, kvindex.OpRemove:
			kind := "S"
			if op.Kind == kvindex.OpRemove {
				kind = "R"
			}
			id := spaceID(op.Space)
			for hs := op.Hashes; len(hs) > 0; {
				if n == chunk {
					flush()
				}
				take := min(len(hs), chunk-n)
				cur = append(cur, kind, int(op.Tier), id, take)
				for _, h := range hs[:take] {
					cur = append(cur, hashHex(h))
				}
				n += take
				hs = hs[take:]
			}
		}
	}
	flush()
	if len(steps) > 1 && steps[1][0] != "C" {
		steps = steps[1:]
	}
	return steps
}

// steps are a change's arguments after the common ones, step by step:
// runSteps asks for step k when it runs it, so that a snapshot's are
// built one at a time, not held all at once.
type steps interface {
	count() int
	appendStep(dst []any, k int) []any
}

// fixedSteps are steps built beforehand (a delta's: at most one message).
type fixedSteps [][]any

func (f fixedSteps) count() int                        { return len(f) }
func (f fixedSteps) appendStep(dst []any, k int) []any { return append(dst, f[k]...) }

// entrySteps are a snapshot's steps: step 0 clears the rank, then each
// adds at most chunk entries.
type entrySteps struct {
	snap  *kvindex.Snapshot
	chunk int
	ids   map[kvindex.Space]string
}

func newEntrySteps(snap *kvindex.Snapshot, chunk int) *entrySteps {
	return &entrySteps{snap: snap, chunk: chunk, ids: map[kvindex.Space]string{}}
}

func (s *entrySteps) count() int { return 1 + (s.snap.Len()+s.chunk-1)/s.chunk }

func (s *entrySteps) appendStep(dst []any, k int) []any {
	if k == 0 {
		return dst
	}
	for e := range s.snap.Range((k-1)*s.chunk, k*s.chunk) {
		id, ok := s.ids[e.Space]
		if !ok {
			id = spaceID(e.Space)
			s.ids[e.Space] = id
		}
		dst = append(dst, int(e.Tier), id, hashHex(e.Hash), e.Refs)
	}
	return dst
}

// token names a delta's run of steps: its position and a digest of its
// steps, so that a resend of the same delta resumes the run and anything
// else under the same position does not.
func token(d kvindex.Delta, steps [][]any) string {
	h := fnv.New64a()
	for _, st := range steps {
		for _, a := range st {
			_, _ = fmt.Fprint(h, a, "\x00")
		}
		_, _ = h.Write([]byte{1})
	}
	return fmt.Sprintf("D:%d:%d:%016x", d.Epoch, d.Sequence, h.Sum64())
}

func parsePos(epoch, seq string) kvindex.Position {
	e, _ := strconv.ParseUint(epoch, 10, 64)
	s, _ := strconv.ParseUint(seq, 10, 64)
	return kvindex.Position{Epoch: e, Sequence: s}
}

func parseLimit(res []string) error {
	n := func(s string) uint64 { v, _ := strconv.ParseUint(s, 10, 64); return v }
	return &kvindex.LimitError{Scope: kvindex.LimitScope(res[1]), Limit: n(res[2]), Held: n(res[3]), Adding: n(res[6])}
}

// place writes placements (pairs: member "S:H", mask): one script per
// server that holds some of them, so that a block update costs a command
// inside a script, not a command of its own. On a cluster each master's
// script runs on that master; a master that refuses it (its slots moved
// meanwhile) has its placements written one command each through the
// cluster client, which follows MOVED and ASK.
func (s *Store) place(ctx context.Context, b kvindex.BackendRef, inst string, pairs []string) error {
	args := func(n int) []any { return append(make([]any, 0, 1+n), inst) }
	cc := s.cluster
	if cc == nil {
		all := args(len(pairs))
		for i := 0; i+1 < len(pairs); i += 2 {
			space, hash, _ := strings.Cut(pairs[i], ":")
			all = append(all, blockKey(b, space, hash), pairs[i+1])
		}
		return s.run(ctx, nil, placeScript, nil, all...).Err()
	}
	type group struct {
		node *redis.Client
		args []any
	}
	var groups []*group
	for i := 0; i+1 < len(pairs); i += 2 {
		space, hash, _ := strings.Cut(pairs[i], ":")
		key := blockKey(b, space, hash)
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		var g *group
		for _, x := range groups {
			if x.node == node {
				g = x
				break
			}
		}
		if g == nil {
			g = &group{node: node, args: args(len(pairs))}
			groups = append(groups, g)
		}
		g.args = append(g.args, key, pairs[i+1])
	}
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() {
			err := s.run(ctx, g.node, placeScript, nil, g.args...).Err()
			if err == nil {
				return
			}
			if s.opt.WaitReplicas > 0 {
				// Not the per-key fallback below: its writes go out
				// through the cluster's own routing, which WAIT cannot
				// follow.
				errs[i] = err
				return
			}
			pipe := cc.Pipeline()
			for j := 1; j+1 < len(g.args); j += 2 {
				if g.args[j+1] == "0" {
					pipe.HDel(ctx, g.args[j].(string), inst)
				} else {
					pipe.HSet(ctx, g.args[j].(string), inst, g.args[j+1])
				}
			}
			_, errs[i] = pipe.Exec(ctx)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// run runs script on node (nil: the master of keys[0] on a cluster, the
// server otherwise). With Options.WaitReplicas it then waits, on the same
// connection (Redis' WAIT counts what that connection wrote), until
// WaitReplicas replicas of that master hold its writes, or as many as the
// master has when it has fewer (ROLE, read with the script: a master left
// without a replica, such as one just promoted after its master's crash,
// acks alone and waits for nothing); fewer in Options.WaitTimeout fail the
// call with ErrNotReplicated.
func (s *Store) run(ctx context.Context, node *redis.Client, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.opt.WaitReplicas <= 0 {
		if node == nil {
			return script.Run(ctx, s.rdb, keys, args...)
		}
		return script.Run(ctx, node, keys, args...)
	}
	failed := func(err error) *redis.Cmd {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	if node == nil {
		node = s.single
		if s.cluster != nil && len(keys) > 0 {
			master, err := s.cluster.MasterForKey(ctx, keys[0])
			if err != nil {
				return failed(err)
			}
			node = master
		}
	}
	if node == nil {
		return failed(fmt.Errorf("waiting for replicas needs a Redis server, a Sentinel's master or a Redis Cluster, not a %T", s.rdb))
	}
	conn := node.Conn()
	defer func() { _ = conn.Close() }()
	for loaded := false; ; loaded = true {
		var cmd, role *redis.Cmd
		_, _ = conn.Pipelined(ctx, func(p redis.Pipeliner) error {
			cmd = p.EvalSha(ctx, script.Hash(), keys, args...)
			role = p.Do(ctx, "ROLE")
			return nil
		})
		if err := cmd.Err(); err != nil {
			if !loaded && redis.HasErrorPrefix(err, "NOSCRIPT") {
				if err := script.Load(ctx, conn).Err(); err == nil {
					continue
				}
			}
			return cmd
		}
		need, err := replicasToWait(role, s.opt.WaitReplicas)
		if err != nil {
			cmd.SetErr(err)
			return cmd
		}
		if need == 0 {
			return cmd
		}
		n, err := conn.Do(ctx, "WAIT", need, s.opt.WaitTimeout.Milliseconds()).Int()
		switch {
		case err != nil:
			cmd.SetErr(fmt.Errorf("waiting for %d replica(s): %w", need, err))
		case n < need:
			cmd.SetErr(fmt.Errorf("%w: %d of %d in %s", ErrNotReplicated, n, need, s.opt.WaitTimeout))
		}
		return cmd
	}
}

// replicasToWait is want, or the replicas the master has (its ROLE reply)
// when it has fewer.
func replicasToWait(role *redis.Cmd, want int) (int, error) {
	r, err := role.Slice()
	if err != nil {
		return 0, fmt.Errorf("reading the master's replicas (ROLE): %w", err)
	}
	if len(r) < 3 || r[0] != "master" {
		return 0, fmt.Errorf("reading the master's replicas: ROLE answered %v, not a master's", r)
	}
	replicas, _ := r[2].([]any)
	return min(want, len(replicas)), nil
}

// maxLost bounds how often a change starts over because another took the
// rank meanwhile (each start re-checks the position).
const maxLost = 3

// held reads the blocks the pod, its backend and its namespace hold, for
// the limits on a cluster: one round trip to the backend's slot (on one
// server the step script reads them itself).
func (s *Store) held(ctx context.Context, src kvindex.Source) ([3]uint64, error) {
	p := prefix(src.Backend)
	pipe := s.rdb.Pipeline()
	cmds := []*redis.StringCmd{pipe.HGet(ctx, p+"podblocks", src.PodUID), pipe.Get(ctx, p+"blocks"), pipe.Get(ctx, nsKey(src.Backend.Namespace))}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return [3]uint64{}, fmt.Errorf("reading block counts in redis: %w", err)
	}
	var out [3]uint64
	for i, c := range cmds {
		n, _ := c.Int64()
		out[i] = uint64(max(n, 0))
	}
	return out, nil
}

// runSteps runs a change's steps with script until one ends it and
// returns the last reply: 'ok', 'dup', 'snap', 'stale', 'over' or 'lost'.
func (s *Store) runSteps(ctx context.Context, script *redis.Script, src kvindex.Source, pos kvindex.Position, tok string, adding uint64, steps steps, restartOnLost bool) ([]string, error) {
	var held [3]uint64
	if s.cluster != nil && adding > 0 {
		var err error
		if held, err = s.held(ctx, src); err != nil {
			return nil, err
		}
	}
	c := s.newCaller(src)
	defer c.release()
	base := append(slices.Clone(c.base), strconv.FormatUint(pos.Epoch, 10), strconv.FormatUint(pos.Sequence, 10), tok, 0, steps.count(), s.opt.ChunkHashes,
		s.opt.Limits.PodBlocks, s.opt.Limits.BackendBlocks, s.opt.Limits.NamespaceBlocks, held[0], held[1], held[2], adding)
	const kArg = 15
	args := make([]any, 0, len(base)+4*s.opt.ChunkHashes+8)
	for k, lost := 0, 0; ; {
		base[kArg] = k
		args = steps.appendStep(append(args[:0], base...), k)
		res, err := c.call(ctx, script, args, k)
		if err != nil {
			return nil, err
		}
		switch res[0] {
		case "next":
			k++
		case "more":
		case "at":
			k, _ = strconv.Atoi(res[3])
		case "lost":
			if lost++; !restartOnLost || lost > maxLost {
				return res, nil
			}
			k = 0
		default:
			return res, nil
		}
	}
}

// Apply implements kvindex.Store. A delta runs as steps of at most
// Options.ChunkHashes hashes (see step).
func (s *Store) Apply(ctx context.Context, src kvindex.Source, d kvindex.Delta) (kvindex.Outcome, kvindex.Position, error) {
	steps := deltaSteps(d, s.opt.ChunkHashes)
	var adding uint64 // 0: the script reads no counts
	if s.opt.Limits != (kvindex.Limits{}) {
		adding = kvindex.StoredHashes(d)
	}
	res, err := s.runSteps(ctx, applyScript, src, kvindex.Position{Epoch: d.Epoch, Sequence: d.Sequence}, token(d, steps), adding, fixedSteps(steps), true)
	if err != nil {
		return 0, kvindex.Position{}, fmt.Errorf("applying delta in redis: %w", err)
	}
	if res[0] == "over" {
		return 0, parsePos(res[7], res[8]), fmt.Errorf("delta %d of %s rank %d: %w", d.Sequence, src.PodUID, src.Rank, parseLimit(res))
	}
	if res[0] == "lost" {
		return 0, kvindex.Position{}, fmt.Errorf("applying delta %d of %s rank %d in redis: another change took the rank %d times", d.Sequence, src.PodUID, src.Rank, maxLost)
	}
	pos := parsePos(res[1], res[2])
	switch res[0] {
	case "ok":
		return kvindex.Applied, pos, nil
	case "dup":
		return kvindex.Duplicate, pos, nil
	}
	return kvindex.NeedSnapshot, pos, nil
}

// Replace implements kvindex.Store. The rank is cleared, then the entries
// added, in steps of at most Options.ChunkHashes (see step), under a token
// of this call: a snapshot is never resumed, a resend starts over.
func (s *Store) Replace(ctx context.Context, src kvindex.Source, pos kvindex.Position, snap *kvindex.Snapshot) error {
	var adding uint64
	if s.opt.Limits != (kvindex.Limits{}) {
		adding = snap.DistinctBlocks()
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	tok := fmt.Sprintf("R:%d:%d:%x", pos.Epoch, pos.Sequence, nonce)
	res, err := s.runSteps(ctx, replaceScript, src, pos, tok, adding, newEntrySteps(snap, s.opt.ChunkHashes), false)
	if err != nil {
		return fmt.Errorf("replacing rank %d of pod %s in redis: %w", src.Rank, src.PodUID, err)
	}
	switch res[0] {
	case "stale":
		return fmt.Errorf("replace %s rank %d with epoch %d (holding %s): %w", src.PodUID, src.Rank, pos.Epoch, res[1], kvindex.ErrStaleEpoch)
	case "over":
		return fmt.Errorf("replacing %s rank %d: %w", src.PodUID, src.Rank, parseLimit(res))
	case "lost":
		return fmt.Errorf("replacing rank %d of pod %s in redis: another change took the rank meanwhile", src.Rank, src.PodUID)
	}
	return nil
}

// Positions implements kvindex.Store.
func (s *Store) Positions(ctx context.Context, pod kvindex.PodKey) (map[uint32]kvindex.Position, error) {
	m, err := s.rdb.HGetAll(ctx, podPrefix(pod.Backend, pod.UID)+"pos").Result()
	if err != nil {
		return nil, fmt.Errorf("reading positions in redis: %w", err)
	}
	out := make(map[uint32]kvindex.Position, len(m))
	for k, v := range m {
		r, err := strconv.ParseUint(k, 10, 32)
		e, sq, ok := strings.Cut(v, ":")
		if err != nil || !ok {
			continue
		}
		out[uint32(r)] = parsePos(e, sq)
	}
	return out, nil
}

// scoreChunk is how many blocks one pipelined round trip looks up; the walk
// stops at the first chunk where no instance is left.
const scoreChunk = 256

// Score implements kvindex.Store.
func (s *Store) Score(ctx context.Context, backend kvindex.BackendRef, space kvindex.Space, hashes []uint64) ([]kvindex.Match, error) {
	if len(hashes) == 0 {
		return nil, nil
	}
	if s.model != nil {
		return s.model.score(ctx, backend, space, hashes)
	}
	sid := spaceID(space)
	ids := map[string]uint32{}
	var names []string
	w := kvindex.NewPrefixWalk(16)
	defer w.Release()
	alive := true
	for start := 0; start < len(hashes) && alive; start += scoreChunk {
		end := min(start+scoreChunk, len(hashes))
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, 0, end-start)
		for _, h := range hashes[start:end] {
			cmds = append(cmds, pipe.HGetAll(ctx, blockKey(backend, sid, hashHex(h))))
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("looking up blocks in redis: %w", err)
		}
		for _, c := range cmds {
			masks := map[uint32]uint8{}
			for inst, v := range c.Val() {
				m, err := strconv.ParseUint(v, 10, 8)
				if err != nil || m == 0 || m > 7 {
					continue
				}
				id, ok := ids[inst]
				if !ok {
					id = uint32(len(names))
					ids[inst] = id
					names = append(names, inst)
				}
				for t := kvindex.TierGPU; t <= kvindex.TierDisk; t++ {
					if m&(1<<(t-1)) != 0 {
						masks[id] |= kvindex.TierBit(t)
					}
				}
			}
			for id, m := range masks {
				w.Visit(id, m)
			}
			if !w.Next() {
				alive = false
				break
			}
		}
	}
	var out []kvindex.Match
	w.Results(func(id uint32, l [5]uint32) {
		if int(id) >= len(names) {
			return
		}
		uid, rank, _ := strings.Cut(names[id], "|")
		r, _ := strconv.ParseUint(rank, 10, 32)
		out = append(out, kvindex.MatchFrom(uid, uint32(r), l))
	})
	return out, nil
}

// TierBlocks implements kvindex.Store.
func (s *Store) TierBlocks(ctx context.Context, backend kvindex.BackendRef) ([4]uint64, error) {
	var out [4]uint64
	vals, err := s.rdb.HMGet(ctx, prefix(backend)+"tiers", "1", "2", "3").Result()
	if err != nil {
		return out, fmt.Errorf("reading tier counts in redis: %w", err)
	}
	for i, v := range vals {
		if str, ok := v.(string); ok {
			n, _ := strconv.ParseInt(str, 10, 64)
			out[i+1] = uint64(max(n, 0))
		}
	}
	return out, nil
}

// PodBlocks implements kvindex.Store.
func (s *Store) PodBlocks(ctx context.Context, pod kvindex.PodKey) (uint64, error) {
	n, err := s.rdb.HGet(ctx, prefix(pod.Backend)+"podblocks", pod.UID).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading pod blocks in redis: %w", err)
	}
	return uint64(max(n, 0)), nil
}

// PutPod implements kvindex.Store.
func (s *Store) PutPod(ctx context.Context, rec kvindex.PodRecord, leaseUntil time.Time) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding pod record: %w", err)
	}
	p, q := prefix(rec.Backend), podPrefix(rec.Backend, rec.UID)
	lease, margin, now := leaseUntil.UnixMilli(), s.opt.KeyTTLMargin.Milliseconds(), time.Now().UnixMilli()
	if err := putLeaseScript.Run(ctx, s.rdb, []string{q + "lease"}, q, "", "", lease, "", margin, now).Err(); err != nil {
		return fmt.Errorf("storing pod lease in redis: %w", err)
	}
	if err := putPodScript.Run(ctx, s.rdb, []string{p + "pods"}, p, rec.UID, b, lease, nsKey(rec.Backend.Namespace), margin, now).Err(); err != nil {
		return fmt.Errorf("storing pod record in redis: %w", err)
	}
	if err := s.rdb.SAdd(ctx, backendsKey, rec.Backend.Namespace+"/"+rec.Backend.Name).Err(); err != nil {
		return fmt.Errorf("registering backend in redis: %w", err)
	}
	return nil
}

// Pods implements kvindex.Store.
func (s *Store) Pods(ctx context.Context, backend kvindex.BackendRef) ([]kvindex.PodRecord, error) {
	if s.model != nil {
		return s.model.podRecords(ctx, backend)
	}
	m, err := s.rdb.HGetAll(ctx, prefix(backend)+"pods").Result()
	if err != nil {
		return nil, fmt.Errorf("reading pod records in redis: %w", err)
	}
	out := make([]kvindex.PodRecord, 0, len(m))
	for _, v := range m {
		var rec kvindex.PodRecord
		if err := json.Unmarshal([]byte(v), &rec); err != nil {
			continue
		}
		rec.Backend = backend
		out = append(out, rec)
	}
	return out, nil
}

// ExpireLeases implements kvindex.Store. A backend leaves the reaper's
// list with its last pod (a PutPod racing that puts it back: each PutPod
// adds it again).
func (s *Store) ExpireLeases(ctx context.Context, now time.Time) ([]kvindex.PodKey, error) {
	backends, err := s.rdb.SMembers(ctx, backendsKey).Result()
	if err != nil {
		return nil, fmt.Errorf("listing backends in redis: %w", err)
	}
	ms := strconv.FormatInt(now.UnixMilli(), 10)
	var gone []kvindex.PodKey
	for _, b := range backends {
		ns, name, ok := strings.Cut(b, "/")
		if !ok {
			continue
		}
		ref := kvindex.BackendRef{Namespace: ns, Name: name}
		p := prefix(ref)
		uids, err := s.rdb.ZRangeByScore(ctx, p+"leases", &redis.ZRangeBy{Min: "-inf", Max: "(" + ms}).Result()
		if err != nil {
			return gone, fmt.Errorf("listing expired leases in redis: %w", err)
		}
		for _, uid := range uids {
			ok, err := s.expire(ctx, ref, uid, ms)
			if err != nil {
				return gone, err
			}
			if ok {
				gone = append(gone, kvindex.PodKey{Backend: ref, UID: uid})
			}
		}
		// The backend's last pod is gone, or its keys expired.
		if n, err := s.rdb.ZCard(ctx, p+"leases").Result(); err == nil && n == 0 {
			if err := s.rdb.SRem(ctx, backendsKey, b).Err(); err != nil {
				return gone, fmt.Errorf("unregistering backend in redis: %w", err)
			}
		}
	}
	return gone, nil
}

// expire removes one pod whose lease ended: each rank in scripts of at
// most ChunkHashes blocks, then the pod itself; each step re-checks the
// lease, so a pod that came back keeps what it has.
func (s *Store) expire(ctx context.Context, ref kvindex.BackendRef, uid, ms string) (bool, error) {
	p, q := prefix(ref), podPrefix(ref, uid)
	due, err := expireScript.Run(ctx, s.rdb, []string{q + "lease"}, q, ms).Int()
	if err != nil || due == 0 {
		if err != nil {
			return false, fmt.Errorf("checking the lease of pod %s in redis: %w", uid, err)
		}
		return false, nil
	}
	ranks, err := s.rdb.HKeys(ctx, q+"pos").Result()
	if err != nil {
		return false, fmt.Errorf("listing ranks of pod %s in redis: %w", uid, err)
	}
	begun, err := s.rdb.SMembers(ctx, q+"ranks").Result()
	if err != nil {
		return false, fmt.Errorf("listing ranks of pod %s in redis: %w", uid, err)
	}
	ranks = slices.Compact(slices.Sorted(slices.Values(append(ranks, begun...))))
	for _, r := range ranks {
		n, err := strconv.ParseUint(r, 10, 32)
		if err != nil {
			continue
		}
		alive, err := s.expireRank(ctx, ref, uid, uint32(n), ms)
		if err != nil {
			return false, fmt.Errorf("clearing rank %s of pod %s in redis: %w", r, uid, err)
		}
		if alive {
			return false, nil
		}
	}
	args := []any{p, uid, ms}
	for _, r := range ranks {
		args = append(args, r)
	}
	res, err := finishExpireScript.Run(ctx, s.rdb, []string{p + "pods"}, args...).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("removing pod %s in redis: %w", uid, err)
	}
	if res[0] != 1 {
		return false, nil
	}
	if err := dropPodScript.Run(ctx, s.rdb, []string{q + "lease"}, q, ms).Err(); err != nil {
		return false, fmt.Errorf("removing pod %s in redis: %w", uid, err)
	}
	return true, nil
}

// expireRank clears one rank of a pod whose lease ended, in scripts of at
// most ChunkHashes blocks; alive when the lease was renewed meanwhile.
func (s *Store) expireRank(ctx context.Context, ref kvindex.BackendRef, uid string, rank uint32, ms string) (alive bool, err error) {
	c := s.newCaller(kvindex.Source{Backend: ref, PodUID: uid, Rank: rank})
	defer c.release()
	for cursor := "0"; ; {
		res, err := c.call(ctx, expireRankScript, append(slices.Clone(c.base), ms, cursor, s.opt.ChunkHashes), 0)
		if err != nil {
			return false, err
		}
		switch res[0] {
		case "alive", "done":
			// The pod's keys go next: ack now, not later.
			if c.ack != "" {
				if _, err := c.call(ctx, ackScript, slices.Clone(c.base), 0); err != nil {
					return false, err
				}
			}
			return res[0] == "alive", nil
		}
		cursor = res[1]
	}
}
