// Package redisstore is the Redis/Valkey kvindex.Store, for index replicas
// that share one state.
//
// Key schema (P is "kvi:{namespace/name}:", the CacheBackend as a hash tag,
// so one backend's keys share a cluster slot; S a space id, the FNV-64a of
// model, LoRA and hash scheme; H a block hash in 16 hex digits; I an
// instance "podUID|rank"):
//
//	P blk:S:H        HASH  "I|tier" -> reference count
//	P rev:I          SET   "S:H" the instance holds (reverse index: clears
//	                       and lease expiry cost the pod's blocks, no SCAN)
//	P pos:podUID     HASH  rank -> "epoch:sequence" applied
//	P tiers          HASH  tier -> residencies in the backend
//	P podblocks      HASH  podUID -> blocks held (any tier)
//	P pods           HASH  podUID -> pod record (JSON)
//	P leases         ZSET  podUID scored by lease end (unix ms)
//	kvi:backends     SET   "namespace/name" of every backend (the reaper's
//	                       list; one small set, never a keyspace scan)
//
// Every delta is one Lua script: the epoch and sequence check, the block
// changes and the new position happen atomically, so replicas that receive
// the same delta (a subscriber reconnecting to another replica) apply it
// once. Snapshots and lease expiry are one script each too.
package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inferencecache/operator/internal/kvindex"
)

// Store is the Redis store.
type Store struct {
	rdb redis.UniversalClient
}

var _ kvindex.Store = (*Store)(nil)

// New returns a store on rdb.
func New(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

// Close implements kvindex.Store.
func (s *Store) Close() error { return s.rdb.Close() }

const backendsKey = "kvi:backends"

func prefix(b kvindex.BackendRef) string { return "kvi:{" + b.Namespace + "/" + b.Name + "}:" }

func spaceID(sp kvindex.Space) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(kvindex.SpaceKey(sp)))
	return fmt.Sprintf("%016x", h.Sum64())
}

func hashHex(h uint64) string { return fmt.Sprintf("%016x", h) }

// The functions every script shares: add and remove one tier reference of
// one block for instance I, and clear the instance (one tier or all).
const lib = `
local P, uid, rank = ARGV[1], ARGV[2], ARGV[3]
local inst = uid .. '|' .. rank
local revKey = P .. 'rev:' .. inst
local tiersKey = P .. 'tiers'
local pbKey = P .. 'podblocks'
local function anyTier(bk)
  return redis.call('HEXISTS', bk, inst .. '|1') == 1 or redis.call('HEXISTS', bk, inst .. '|2') == 1 or redis.call('HEXISTS', bk, inst .. '|3') == 1
end
local function add(member, tier, n)
  local bk = P .. 'blk:' .. member
  local had = anyTier(bk)
  local v = redis.call('HINCRBY', bk, inst .. '|' .. tier, n)
  if v == n then redis.call('HINCRBY', tiersKey, tier, 1) end
  if not had then
    redis.call('SADD', revKey, member)
    redis.call('HINCRBY', pbKey, uid, 1)
  end
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
  if not anyTier(bk) then
    redis.call('SREM', revKey, member)
    redis.call('HINCRBY', pbKey, uid, -1)
  end
end
local function clear(only)
  for _, m in ipairs(redis.call('SMEMBERS', revKey)) do
    local bk = P .. 'blk:' .. m
    for t = 1, 3 do
      if only == 0 or only == t then
        if redis.call('HDEL', bk, inst .. '|' .. t) == 1 then redis.call('HINCRBY', tiersKey, t, -1) end
      end
    end
    if not anyTier(bk) then
      redis.call('SREM', revKey, m)
      redis.call('HINCRBY', pbKey, uid, -1)
    end
  end
end
local function newer(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local posKey = P .. 'pos:' .. uid
local function position()
  local cur = redis.call('HGET', posKey, rank)
  if not cur then return nil, '0', '0' end
  local i = string.find(cur, ':', 1, true)
  return true, string.sub(cur, 1, i - 1), string.sub(cur, i + 1)
end
`

// ARGV: P, uid, rank, epoch, sequence, then per op: kind (S, R, C), tier,
// space id, n, n block hashes.
var applyScript = redis.NewScript(lib + `
local epoch, seqs = ARGV[4], ARGV[5]
local seq = tonumber(seqs)
local known, ce, cs = position()
if known and ce == epoch and seq <= tonumber(cs) then return {'dup', ce, cs} end
if known and ce == epoch and seq == tonumber(cs) + 1 then
elseif seq == 1 and ((not known) or newer(epoch, ce)) then
  clear(0)
else
  return {'snap', ce, cs}
end
local i = 6
while i <= #ARGV do
  local kind, tier, space, n = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], tonumber(ARGV[i + 3])
  i = i + 4
  if kind == 'C' then
    clear(tier)
  else
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
  end
  i = i + n
end
redis.call('HSET', posKey, rank, epoch .. ':' .. seqs)
return {'ok', epoch, seqs}
`)

// ARGV: P, uid, rank, epoch, sequence, then per entry: tier, space id,
// hash, refs.
var replaceScript = redis.NewScript(lib + `
local epoch, seqs = ARGV[4], ARGV[5]
local known, ce, cs = position()
if known and newer(ce, epoch) then return {'stale', ce, cs} end
clear(0)
for i = 6, #ARGV, 4 do
  local tier, n = tonumber(ARGV[i]), tonumber(ARGV[i + 3])
  if tier >= 1 and tier <= 3 and n > 0 then add(ARGV[i + 1] .. ':' .. ARGV[i + 2], tier, n) end
end
redis.call('HSET', posKey, rank, epoch .. ':' .. seqs)
return {'ok', epoch, seqs}
`)

// leaseEnded is true when the pod's lease (ARGV[2] in backend ARGV[1])
// ended before ARGV[4] (unix ms).
const leaseEnded = `
local function leaseEnded()
  local until_ = redis.call('ZSCORE', ARGV[1] .. 'leases', ARGV[2])
  return until_ and tonumber(until_) < tonumber(ARGV[4])
end
`

// ARGV: P, uid, "", now (unix ms): 1 if the pod's lease ended.
var expireScript = redis.NewScript(leaseEnded + `
if leaseEnded() then return 1 end
return 0
`)

// ARGV: P, uid, rank, now: clears one rank of a pod whose lease ended.
var expireRankScript = redis.NewScript(lib + leaseEnded + `
if not leaseEnded() then return 0 end
clear(0)
redis.call('DEL', revKey)
redis.call('HDEL', posKey, rank)
return 1
`)

// finishExpireScript removes what is left of an expired pod, if its lease
// still ended (a subscriber may have come back meanwhile).
var finishExpireScript = redis.NewScript(`
local P, uid, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local until_ = redis.call('ZSCORE', P .. 'leases', uid)
if not until_ or tonumber(until_) >= now then return 0 end
redis.call('ZREM', P .. 'leases', uid)
redis.call('HDEL', P .. 'pods', uid)
redis.call('HDEL', P .. 'podblocks', uid)
redis.call('DEL', P .. 'pos:' .. uid)
return 1
`)

func opArgs(d kvindex.Delta) []any {
	args := make([]any, 0, 8)
	for _, op := range d.Ops {
		switch op.Kind {
		case kvindex.OpClear:
			args = append(args, "C", int(op.Tier), "", 0)
		case kvindex.OpStore, kvindex.OpRemove:
			kind := "S"
			if op.Kind == kvindex.OpRemove {
				kind = "R"
			}
			args = append(args, kind, int(op.Tier), spaceID(op.Space), len(op.Hashes))
			for _, h := range op.Hashes {
				args = append(args, hashHex(h))
			}
		}
	}
	return args
}

func parsePos(epoch, seq string) kvindex.Position {
	e, _ := strconv.ParseUint(epoch, 10, 64)
	s, _ := strconv.ParseUint(seq, 10, 64)
	return kvindex.Position{Epoch: e, Sequence: s}
}

// Apply implements kvindex.Store.
func (s *Store) Apply(ctx context.Context, src kvindex.Source, d kvindex.Delta) (kvindex.Outcome, kvindex.Position, error) {
	p := prefix(src.Backend)
	args := append([]any{p, src.PodUID, strconv.FormatUint(uint64(src.Rank), 10), strconv.FormatUint(d.Epoch, 10), strconv.FormatUint(d.Sequence, 10)}, opArgs(d)...)
	res, err := applyScript.Run(ctx, s.rdb, []string{p + "pos:" + src.PodUID}, args...).StringSlice()
	if err != nil {
		return 0, kvindex.Position{}, fmt.Errorf("applying delta in redis: %w", err)
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

// Replace implements kvindex.Store.
func (s *Store) Replace(ctx context.Context, src kvindex.Source, pos kvindex.Position, entries []kvindex.Entry) error {
	p := prefix(src.Backend)
	args := make([]any, 0, 5+4*len(entries))
	args = append(args, p, src.PodUID, strconv.FormatUint(uint64(src.Rank), 10), strconv.FormatUint(pos.Epoch, 10), strconv.FormatUint(pos.Sequence, 10))
	ids := map[kvindex.Space]string{}
	for _, e := range entries {
		id, ok := ids[e.Space]
		if !ok {
			id = spaceID(e.Space)
			ids[e.Space] = id
		}
		args = append(args, int(e.Tier), id, hashHex(e.Hash), e.Refs)
	}
	res, err := replaceScript.Run(ctx, s.rdb, []string{p + "pos:" + src.PodUID}, args...).StringSlice()
	if err != nil {
		return fmt.Errorf("replacing rank %d of pod %s in redis: %w", src.Rank, src.PodUID, err)
	}
	if res[0] == "stale" {
		return fmt.Errorf("replace %s rank %d with epoch %d (holding %s): %w", src.PodUID, src.Rank, pos.Epoch, res[1], kvindex.ErrStaleEpoch)
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
	pipe := s.rdb.TxPipeline()
	pipe.HSet(ctx, p+"pods", rec.UID, b)
	pipe.ZAdd(ctx, p+"leases", redis.Z{Score: float64(leaseUntil.UnixMilli()), Member: rec.UID})
	if _, err := pipe.Exec(ctx); err != nil {
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

// ExpireLeases implements kvindex.Store.
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
			ok, err := s.expire(ctx, p, uid, ms)
			if err != nil {
				return gone, err
			}
			if ok {
				gone = append(gone, kvindex.PodKey{Backend: ref, UID: uid})
			}
		}
	}
	return gone, nil
}

// expire removes one pod whose lease ended: each rank in its own script (a
// pod's ranks can be large), then the pod itself; each step re-checks the
// lease, so a pod that came back keeps what it has.
func (s *Store) expire(ctx context.Context, p, uid, ms string) (bool, error) {
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
	for _, r := range ranks {
		if err := expireRankScript.Run(ctx, s.rdb, key, p, uid, r, ms).Err(); err != nil {
			return false, fmt.Errorf("clearing rank %s of pod %s in redis: %w", r, uid, err)
		}
	}
	done, err := finishExpireScript.Run(ctx, s.rdb, key, p, uid, ms).Int()
	if err != nil {
		return false, fmt.Errorf("removing pod %s in redis: %w", uid, err)
	}
	return done == 1, nil
}
