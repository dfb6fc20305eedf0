// Package redisstore is the Redis/Valkey kvindex.Store, for index replicas
// that share one state.
//
// Key schema (P is "kvi:{namespace}:name:", the CacheBackend with its
// namespace as the hash tag, so a namespace's keys share a cluster slot
// and a script keeps the namespace's count with the backend's; S a space
// id, the FNV-64a of model, LoRA and hash scheme; H a block hash in 16 hex
// digits; I an instance "podUID|rank"):
//
//	P blk:S:H        HASH  "I|tier" -> reference count
//	P rev:I          SET   "S:H" the instance holds (reverse index: clears
//	                       and lease expiry cost the pod's blocks, no SCAN)
//	P prog:I         HASH  the change in progress: token, step, cursor
//	P ranks:podUID   SET   ranks a change began for (the reaper's list)
//	P pos:podUID     HASH  rank -> "epoch:sequence" applied
//	P tiers          HASH  tier -> residencies in the backend
//	P podblocks      HASH  podUID -> blocks held (any tier)
//	P blocks         STRING the backend's blocks (podblocks summed)
//	P pods           HASH  podUID -> pod record (JSON)
//	P leases         ZSET  podUID scored by lease end (unix ms)
//	kvi:{ns}:_blocks STRING the namespace's blocks
//	kvi:backends     SET   "namespace/name" of every backend with a lease
//	                       (the reaper's list; shrinks with a backend's
//	                       last pod)
//
// A change (a delta, a snapshot, a lease expiry) runs as Lua scripts of
// at most Options.ChunkHashes hashes each, so that no script holds Redis
// for more than a few milliseconds; a per-rank record of the change in
// progress, checked and advanced by each script, keeps deltas exactly
// once across crashes and replicas (see step). Every key but the blocks
// and kvi:backends expires Options.KeyTTLMargin after the last lease
// PutPod set for it; a block key is emptied, and so removed, by the
// clears of its holders.
package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inferencecache/operator/internal/kvindex"
)

// Store is the Redis store.
type Store struct {
	rdb redis.UniversalClient
	opt Options
	// onCall, when set (tests), hears each change script call with its
	// step; an error stops the change there, as a crash would.
	onCall func(step int) error
}

// Options configure a Store.
type Options struct {
	// Limits the store enforces (kvindex.Limits).
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
}

// DefaultChunkHashes is Options.ChunkHashes' default: about 1 ms of script
// work on a 2-core machine (docs/performance.md).
const DefaultChunkHashes = 256

// DefaultKeyTTLMargin is Options.KeyTTLMargin's default.
const DefaultKeyTTLMargin = 10 * time.Minute

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
	return &Store{rdb: rdb, opt: opt}
}

// Close implements kvindex.Store.
func (s *Store) Close() error { return s.rdb.Close() }

const backendsKey = "kvi:backends"

// prefix is a backend's key prefix. The namespace is the hash tag: a
// namespace's backends share a cluster slot, so a script can keep the
// namespace's block count with the backend's.
func prefix(b kvindex.BackendRef) string { return "kvi:{" + b.Namespace + "}:" + b.Name + ":" }

// nsKey counts a namespace's blocks. '_' is in no Kubernetes name, so no
// backend's prefix meets it.
func nsKey(namespace string) string { return "kvi:{" + namespace + "}:_blocks" }

func spaceID(sp kvindex.Space) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(kvindex.SpaceKey(sp)))
	return fmt.Sprintf("%016x", h.Sum64())
}

func hashHex(h uint64) string { return fmt.Sprintf("%016x", h) }

// The functions every script shares. ARGV: P, uid, rank, the namespace's
// count key, then the script's own. add and remove one tier reference of
// one block for instance I, clearSome clears up to count of its blocks
// (one tier or all) from an SSCAN cursor and returns the next cursor
// ('0': done); each keeps the pod's, backend's and namespace's counts.
const lib = `
local P, uid, rank, NSK = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local inst = uid .. '|' .. rank
local revKey = P .. 'rev:' .. inst
local progKey = P .. 'prog:' .. inst
local ranksKey = P .. 'ranks:' .. uid
local tiersKey = P .. 'tiers'
local pbKey = P .. 'podblocks'
local beKey = P .. 'blocks'
local posKey = P .. 'pos:' .. uid
local gained = 0
local function counted(n) gained = gained + n end
-- flushCounts writes the blocks gained (or lost) to the three counts, once
-- a script: every script that changes blocks calls it before it returns.
local function flushCounts()
  if gained == 0 then return end
  redis.call('HINCRBY', pbKey, uid, gained)
  redis.call('INCRBY', beKey, gained)
  redis.call('INCRBY', NSK, gained)
  gained = 0
end
local function anyTier(bk)
  local v = redis.call('HMGET', bk, inst .. '|1', inst .. '|2', inst .. '|3')
  return v[1] or v[2] or v[3]
end
local function add(member, tier, n)
  local bk = P .. 'blk:' .. member
  local had = anyTier(bk)
  local v = redis.call('HINCRBY', bk, inst .. '|' .. tier, n)
  if v == n then redis.call('HINCRBY', tiersKey, tier, 1) end
  if not had and redis.call('SADD', revKey, member) == 1 then counted(1) end
end
local function remove(member, tier)
  local bk = P .. 'blk:' .. member
  local f = inst .. '|' .. tier
  local v = redis.call('HGET', bk, f)
  v = v and tonumber(v) or 0
  if v == 0 then return end
  if v > 1 then
    redis.call('HINCRBY', bk, f, -1)
    return
  end
  redis.call('HDEL', bk, f)
  redis.call('HINCRBY', tiersKey, tier, -1)
  if not anyTier(bk) and redis.call('SREM', revKey, member) == 1 then counted(-1) end
end
local function clearSome(only, cursor, count)
  local r = redis.call('SSCAN', revKey, cursor, 'COUNT', count)
  for _, m in ipairs(r[2]) do
    local bk = P .. 'blk:' .. m
    for t = 1, 3 do
      if only == 0 or only == t then
        if redis.call('HDEL', bk, inst .. '|' .. t) == 1 then redis.call('HINCRBY', tiersKey, t, -1) end
      end
    end
    if not anyTier(bk) and redis.call('SREM', revKey, m) == 1 then counted(-1) end
  end
  return r[1]
end
local function newer(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local function position()
  local cur = redis.call('HGET', posKey, rank)
  if not cur then return nil, '0', '0' end
  local i = string.find(cur, ':', 1, true)
  return true, string.sub(cur, 1, i - 1), string.sub(cur, i + 1)
end
`

// step is the part of the change scripts: ARGV after lib's four: epoch,
// sequence, token, step k, steps, count, the pod, backend and namespace
// limits, adding, the key TTL margin (ms), then step k's payload.
//
// A change (a delta or a snapshot) runs as steps, one script call each
// (a clear step as many calls as its SSCAN takes). Step 0 checks the
// position and the limits and writes the in-progress record prog:I
// (token, step, cursor); each call does its step's bounded work and
// advances the record atomically with it; the last one sets the position
// and deletes the record. A call whose step the record has passed does
// nothing and says where the record stands ('at'), so a delta resent
// after a crash, or the same delta applied by a second replica, resumes
// and each step is done once. While a record of another change is left
// (a crash mid-change), the rank's state is partial: only a change that
// drops it first (a snapshot, or sequence 1 of a newer epoch) applies.
const step = `
local epoch, seqs, token = ARGV[5], ARGV[6], ARGV[7]
local k, nsteps, count = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local margin = tonumber(ARGV[15])
local function keepTTL(key)
  local until_ = redis.call('ZSCORE', P .. 'leases', uid)
  if until_ and redis.call('PTTL', key) == -1 then redis.call('PEXPIREAT', key, math.floor(tonumber(until_) + margin)) end
end
local function over(ownDropped)
  local adding = tonumber(ARGV[14])
  if adding == 0 then return nil end
  local own = 0
  if ownDropped then own = redis.call('SCARD', revKey) end
  local held = {tonumber(redis.call('HGET', pbKey, uid) or '0'), tonumber(redis.call('GET', beKey) or '0'), tonumber(redis.call('GET', NSK) or '0')}
  local names = {'pod', 'backend', 'namespace'}
  for i = 1, 3 do
    local lim = tonumber(ARGV[10 + i])
    local h = math.max(held[i] - own, 0)
    if lim > 0 and h + adding > lim then
      return {'over', names[i], string.format('%d', lim), string.format('%d', h), string.format('%d', adding)}
    end
  end
  return nil
end
local function begin(extra)
  redis.call('HSET', progKey, 'token', token, 'step', '0', 'cursor', '0', 'restart', extra)
  redis.call('SADD', ranksKey, rank)
  keepTTL(progKey)
  keepTTL(ranksKey)
end
-- finish ends step k: done or not (a clear's cursor), the last step sets
-- the position.
local function finish(done, cursor)
  flushCounts()
  if not done then
    redis.call('HSET', progKey, 'cursor', cursor)
    return {'more'}
  end
  if k + 1 < nsteps then
    redis.call('HSET', progKey, 'step', tostring(k + 1), 'cursor', '0')
    return {'next'}
  end
  redis.call('HSET', posKey, rank, epoch .. ':' .. seqs)
  redis.call('DEL', progKey)
  keepTTL(posKey)
  keepTTL(revKey)
  return {'ok', epoch, seqs}
end
`

// ARGV: step's, then for a clear step "C", tier, and for an ops step per
// op: kind (S, R), tier, space id, n, n block hashes. Step 0 is never a
// clear: a delta that fits one chunk is one call.
var applyScript = redis.NewScript(lib + step + `
local seq = tonumber(seqs)
local known, ce, cs = position()
if known and ce == epoch and seq <= tonumber(cs) then return {'dup', ce, cs} end
local prog = redis.call('HMGET', progKey, 'token', 'step', 'cursor', 'restart')
local cursor, restart = '0', prog[4] == '1'
if prog[1] == token then
  if k ~= tonumber(prog[2]) then return {'at', ce, cs, prog[2]} end
  cursor = prog[3]
else
  if k ~= 0 then return {'lost', ce, cs} end
  restart = seq == 1 and ((not known) or newer(epoch, ce))
  if not restart and (prog[1] or not (known and ce == epoch and seq == tonumber(cs) + 1)) then return {'snap', ce, cs} end
  local o = over(restart)
  if o then
    o[6], o[7] = ce, cs
    return o
  end
  begin(restart and '1' or '0')
end
-- Step 0 drops the rank first for a restart (a clear of as many calls as
-- it takes), then does its payload like any other step.
if k == 0 and restart then
  local c = clearSome(0, cursor, count)
  if c ~= '0' then return finish(false, c) end
end
local i = 16
if ARGV[i] == 'C' then
  local c = clearSome(tonumber(ARGV[i + 1]), cursor, count)
  return finish(c == '0', c)
end
while i <= #ARGV do
  local kind, tier, space, n = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], tonumber(ARGV[i + 3])
  i = i + 4
  for j = i, i + n - 1 do
    local m = space .. ':' .. ARGV[j]
    if kind == 'S' then
      if tier >= 1 and tier <= 3 then add(m, tier, 1) end
    elseif tier == 0 then
      for t = 1, 3 do remove(m, t) end
    elseif tier <= 3 then
      remove(m, tier)
    end
  end
  i = i + n
end
return finish(true, '0')
`)

// ARGV: step's, then for step 0 nothing (it clears the rank), for the
// others per entry: tier, space id, hash, refs.
var replaceScript = redis.NewScript(lib + step + `
local known, ce, cs = position()
local prog = redis.call('HMGET', progKey, 'token', 'step', 'cursor')
local cursor = '0'
if prog[1] == token then
  if k ~= tonumber(prog[2]) then return {'at', ce, cs, prog[2]} end
  cursor = prog[3]
else
  if k ~= 0 then return {'lost', ce, cs} end
  if known and newer(ce, epoch) then return {'stale', ce, cs} end
  local o = over(true)
  if o then return o end
  begin('1')
end
if k == 0 then
  local c = clearSome(0, cursor, count)
  return finish(c == '0', c)
end
for i = 16, #ARGV, 4 do
  local tier, n = tonumber(ARGV[i]), tonumber(ARGV[i + 3])
  if tier >= 1 and tier <= 3 and n > 0 then add(ARGV[i + 1] .. ':' .. ARGV[i + 2], tier, n) end
end
return finish(true, '0')
`)

// leaseEnded is true when pod uid's lease ended before now (unix ms).
const leaseEnded = `
local function leaseEnded(P, uid, now)
  local until_ = redis.call('ZSCORE', P .. 'leases', uid)
  return until_ and tonumber(until_) < tonumber(now)
end
`

// ARGV: P, uid, "", now (unix ms): 1 if the pod's lease ended.
var expireScript = redis.NewScript(leaseEnded + `
if leaseEnded(ARGV[1], ARGV[2], ARGV[4]) then return 1 end
return 0
`)

// ARGV: P, uid, rank, namespace count key, now, cursor, count: clears up
// to count blocks of one rank of a pod whose lease ended, from cursor;
// returns the next cursor ('0': the rank is gone) or 'alive'.
var expireRankScript = redis.NewScript(lib + leaseEnded + `
if not leaseEnded(P, uid, ARGV[5]) then return 'alive' end
local c = clearSome(0, ARGV[6], tonumber(ARGV[7]))
flushCounts()
if c ~= '0' then return c end
redis.call('DEL', revKey, progKey)
redis.call('HDEL', posKey, rank)
return '0'
`)

// finishExpireScript removes what is left of an expired pod, if its lease
// still ended (a subscriber may have come back meanwhile), and the
// backend's own keys with its last pod. It returns {removed, pods left}.
var finishExpireScript = redis.NewScript(`
local P, uid, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local until_ = redis.call('ZSCORE', P .. 'leases', uid)
if not until_ or tonumber(until_) >= now then return {0, redis.call('HLEN', P .. 'pods')} end
redis.call('ZREM', P .. 'leases', uid)
redis.call('HDEL', P .. 'pods', uid)
redis.call('HDEL', P .. 'podblocks', uid)
redis.call('DEL', P .. 'pos:' .. uid, P .. 'ranks:' .. uid)
local left = redis.call('HLEN', P .. 'pods')
if left == 0 and redis.call('ZCARD', P .. 'leases') == 0 then
  redis.call('DEL', P .. 'tiers', P .. 'podblocks', P .. 'blocks')
end
return {1, left}
`)

// putPodScript stores a pod's record and lease and moves the expiry of its
// keys, its backend's and its namespace count's to at least the lease's
// end plus the margin. ARGV: P, uid, record, lease end (ms), namespace
// count key, margin (ms), now (ms; PTTL, not Redis 7's PEXPIRETIME, so
// that Redis 6.2 serves).
var putPodScript = redis.NewScript(`
local P, uid, rec, lease, NSK, margin, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('HSET', P .. 'pods', uid, rec)
redis.call('ZADD', P .. 'leases', lease, uid)
local at = math.floor(lease + margin)
local function extend(key)
  local t = redis.call('PTTL', key)
  if t == -1 or (t >= 0 and now + t < at) then redis.call('PEXPIREAT', key, at) end
end
for _, k in ipairs({P .. 'pods', P .. 'leases', P .. 'tiers', P .. 'podblocks', P .. 'blocks', NSK, P .. 'pos:' .. uid, P .. 'ranks:' .. uid}) do extend(k) end
for _, r in ipairs(redis.call('SMEMBERS', P .. 'ranks:' .. uid)) do
  extend(P .. 'rev:' .. uid .. '|' .. r)
  extend(P .. 'prog:' .. uid .. '|' .. r)
end
return 1
`)

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
	return &kvindex.LimitError{Scope: kvindex.LimitScope(res[1]), Limit: n(res[2]), Held: n(res[3]), Adding: n(res[4])}
}

// maxLost bounds how often a change starts over because another took the
// rank meanwhile (each start re-checks the position).
const maxLost = 3

// runSteps runs a change's steps with script until one ends it and
// returns the last reply: 'ok', 'dup', 'snap', 'stale', 'over' or 'lost'.
func (s *Store) runSteps(ctx context.Context, script *redis.Script, src kvindex.Source, pos kvindex.Position, tok string, adding uint64, steps steps, restartOnLost bool) ([]string, error) {
	p := prefix(src.Backend)
	keys := []string{p + "pos:" + src.PodUID}
	base := []any{p, src.PodUID, strconv.FormatUint(uint64(src.Rank), 10), nsKey(src.Backend.Namespace),
		strconv.FormatUint(pos.Epoch, 10), strconv.FormatUint(pos.Sequence, 10), tok, 0, steps.count(), s.opt.ChunkHashes,
		s.opt.Limits.PodBlocks, s.opt.Limits.BackendBlocks, s.opt.Limits.NamespaceBlocks, adding, s.opt.KeyTTLMargin.Milliseconds()}
	args := make([]any, 0, len(base)+4*s.opt.ChunkHashes+8)
	for k, lost := 0, 0; ; {
		base[7] = k
		args = steps.appendStep(append(args[:0], base...), k)
		res, err := script.Run(ctx, s.rdb, keys, args...).StringSlice()
		if err != nil {
			return nil, err
		}
		if s.onCall != nil {
			if err := s.onCall(k); err != nil {
				return nil, err
			}
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
		return 0, parsePos(res[5], res[6]), fmt.Errorf("delta %d of %s rank %d: %w", d.Sequence, src.PodUID, src.Rank, parseLimit(res))
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
	m, err := s.rdb.HGetAll(ctx, prefix(pod.Backend)+"pos:"+pod.UID).Result()
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
	p := prefix(backend) + "blk:" + spaceID(space) + ":"
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
			cmds = append(cmds, pipe.HGetAll(ctx, p+hashHex(h)))
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("looking up blocks in redis: %w", err)
		}
		for _, c := range cmds {
			masks := map[uint32]uint8{}
			for field := range c.Val() {
				i := strings.LastIndexByte(field, '|')
				if i < 0 {
					continue
				}
				t, err := strconv.Atoi(field[i+1:])
				if err != nil || t < 1 || t > 3 {
					continue
				}
				inst := field[:i]
				id, ok := ids[inst]
				if !ok {
					id = uint32(len(names))
					ids[inst] = id
					names = append(names, inst)
				}
				masks[id] |= kvindex.TierBit(kvindex.Tier(t))
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
	p := prefix(rec.Backend)
	if err := putPodScript.Run(ctx, s.rdb, []string{p + "pods"}, p, rec.UID, b, leaseUntil.UnixMilli(), nsKey(rec.Backend.Namespace), s.opt.KeyTTLMargin.Milliseconds(), time.Now().UnixMilli()).Err(); err != nil {
		return fmt.Errorf("storing pod record in redis: %w", err)
	}
	if err := s.rdb.SAdd(ctx, backendsKey, rec.Backend.Namespace+"/"+rec.Backend.Name).Err(); err != nil {
		return fmt.Errorf("registering backend in redis: %w", err)
	}
	return nil
}

// Pods implements kvindex.Store.
func (s *Store) Pods(ctx context.Context, backend kvindex.BackendRef) ([]kvindex.PodRecord, error) {
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
	p := prefix(ref)
	key := []string{p + "pos:" + uid}
	due, err := expireScript.Run(ctx, s.rdb, key, p, uid, "", ms).Int()
	if err != nil || due == 0 {
		if err != nil {
			return false, fmt.Errorf("checking the lease of pod %s in redis: %w", uid, err)
		}
		return false, nil
	}
	ranks, err := s.rdb.HKeys(ctx, p+"pos:"+uid).Result()
	if err != nil {
		return false, fmt.Errorf("listing ranks of pod %s in redis: %w", uid, err)
	}
	begun, err := s.rdb.SMembers(ctx, p+"ranks:"+uid).Result()
	if err != nil {
		return false, fmt.Errorf("listing ranks of pod %s in redis: %w", uid, err)
	}
	for _, r := range slices.Compact(slices.Sorted(slices.Values(append(ranks, begun...)))) {
		for cursor := "0"; ; {
			next, err := expireRankScript.Run(ctx, s.rdb, key, p, uid, r, nsKey(ref.Namespace), ms, cursor, s.opt.ChunkHashes).Text()
			if err != nil {
				return false, fmt.Errorf("clearing rank %s of pod %s in redis: %w", r, uid, err)
			}
			if next == "alive" {
				return false, nil
			}
			if next == "0" {
				break
			}
			cursor = next
		}
	}
	res, err := finishExpireScript.Run(ctx, s.rdb, key, p, uid, ms).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("removing pod %s in redis: %w", uid, err)
	}
	return res[0] == 1, nil
}
