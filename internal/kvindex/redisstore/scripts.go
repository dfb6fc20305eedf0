package redisstore

import (
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The pod-slot library every change script shares. ARGV: Q (the pod's
// key prefix), rank, me (the caller's owner id), the flush lease (ms),
// the key TTL margin (ms), ack (the version the caller flushed, or ”),
// direct ('1' on one server: see attach; '2' there without placements,
// Options.NoPlacements), P (the backend's prefix), the
// namespace count key, a placement key's parts before and after the
// block hash, the pod's UID, then the script's own from ARGV[13].
//
// own:rank is the rank's authoritative state: member "S:H" -> "g c d",
// its references in the GPU, CPU and disk tiers. A call changes it and
// records what the placement keys and the backend's counts must learn
// (see pend) instead of writing them: those live in other cluster slots.
var lib = writes + `
local Q, rank, me, L, margin, ack = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local direct, placed, P, NSK, blkPre, blkSuf, uid = ARGV[7] ~= '0', ARGV[7] ~= '2', ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local ownKey = Q .. 'own:' .. rank
local pendKey = Q .. 'pend:' .. rank
local progKey = Q .. 'prog:' .. rank
local posKey = Q .. 'pos'
local ranksKey = Q .. 'ranks'
local versKey = Q .. 'vers'
local leaseKey = Q .. 'lease'
local now = redis.call('TIME')
local nowUs = tonumber(now[1]) * 1000000 + tonumber(now[2])
local nowMs = math.floor(nowUs / 1000)
local TB = {1, 2, 4}
local clist, cmask = {}, {}
local dblocks, dt = 0, {0, 0, 0}
local function keepTTL(key)
  local until_ = redis.call('GET', leaseKey)
  if until_ and redis.call('PTTL', key) == -1 then redis.call('PEXPIREAT', key, math.floor(tonumber(until_) + margin)) end
end
local function maskOf(r)
  local m = 0
  for i = 1, 3 do if r[i] > 0 then m = m + TB[i] end end
  return m
end
-- cache holds the references of the members this call read (one HMGET
-- for a step's members, or HSCAN's values), orig their masks then; the
-- changed ones are written back once, by writeOwn.
local cache, orig, dirty = {}, {}, {}
local function parseRefs(v)
  if not v then return {0, 0, 0} end
  local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
  return {tonumber(a), tonumber(b), tonumber(c)}
end
local function load(ms)
  local need, asked = {}, {}
  for _, m in ipairs(ms) do
    if not cache[m] and not asked[m] then
      need[#need + 1] = m
      asked[m] = true
    end
  end
  if #need == 0 then return end
  local vs = redis.call('HMGET', ownKey, unpack(need))
  for i, m in ipairs(need) do
    local r = parseRefs(vs[i])
    cache[m], orig[m] = r, maskOf(r)
  end
end
local function refsOf(m)
  if not cache[m] then load({m}) end
  return cache[m]
end
-- put sets member m's references r (its mask was before) and notes a
-- change of its mask for the flush.
local function put(m, r, before)
  if not dirty[m] then
    dirty[m] = true
    dirty[#dirty + 1] = m
  end
  cache[m] = r
  local after = maskOf(r)
  if after == before then return end
  for i = 1, 3 do
    local was, is = bit.band(before, TB[i]) ~= 0, bit.band(after, TB[i]) ~= 0
    if is and not was then dt[i] = dt[i] + 1 elseif was and not is then dt[i] = dt[i] - 1 end
  end
  if before == 0 then dblocks = dblocks + 1 elseif after == 0 then dblocks = dblocks - 1 end
  if not cmask[m] then clist[#clist + 1] = m end
  cmask[m] = after
end
-- writeOwn writes the changed members back: one HSET, one HDEL.
local function writeOwn()
  local set, del = {}, {}
  for _, m in ipairs(dirty) do
    local r = cache[m]
    if maskOf(r) == 0 then
      if orig[m] ~= 0 then del[#del + 1] = m end
    else
      set[#set + 1] = m
      set[#set + 1] = string.format('%d %d %d', r[1], r[2], r[3])
    end
  end
  if #set > 0 then redis.call('HSET', ownKey, unpack(set)) end
  if #del > 0 then redis.call('HDEL', ownKey, unpack(del)) end
  if #set > 0 then keepTTL(ownKey) end
end
local function add(m, tier, n)
  local r = refsOf(m)
  local before = maskOf(r)
  r[tier] = r[tier] + n
  put(m, r, before)
end
-- remove drops one reference of m in tier (0: in each tier it is in).
local function remove(m, tier)
  local r = refsOf(m)
  local before = maskOf(r)
  if before == 0 then return end
  if tier == 0 then
    for t = 1, 3 do if r[t] > 0 then r[t] = r[t] - 1 end end
  else
    if r[tier] == 0 then return end
    r[tier] = r[tier] - 1
  end
  put(m, r, before)
end
-- clearSome clears up to count members (one tier or all) from an HSCAN
-- cursor and returns the next cursor ('0': done).
local function clearSome(only, cursor, count)
  local res = redis.call('HSCAN', ownKey, cursor, 'COUNT', count)
  local kv = res[2]
  for i = 1, #kv, 2 do
    local m = kv[i]
    if not cache[m] then
      cache[m] = parseRefs(kv[i + 1])
      orig[m] = maskOf(cache[m])
    end
    local r = {cache[m][1], cache[m][2], cache[m][3]}
    local before = maskOf(r)
    if only == 0 then r = {0, 0, 0} else r[only] = 0 end
    if maskOf(r) ~= before then put(m, r, before) end
  end
  return res[1]
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
local function reply(st, a, b, c)
  return {st, a or '', b or '', c or '', '', ''}
end
-- pending: the flush a call left (pend: its version, owner, lease end,
-- count changes and changed members). The caller that flushed it acks it
-- with its next call; another waits while the owner's lease lasts, then
-- takes the flush over: the members' masks are read again from own, so a
-- flush done twice writes the same.
local function pending()
  local p = redis.call('HMGET', pendKey, 'owner', 'until', 'ver', 'd', 'members')
  if not p[1] then return nil end
  if p[1] == me and ack == p[3] then
    redis.call('DEL', pendKey)
    return nil
  end
  if p[1] ~= me and tonumber(p[2]) > nowMs then return reply('wait', string.format('%d', tonumber(p[2]) - nowMs)) end
  redis.call('HSET', pendKey, 'owner', me, 'until', string.format('%d', nowMs + L))
  local out, ms = {'flush', '', '', '', p[3], p[4]}, {}
  for m in string.gmatch(p[5], '[^,]+') do ms[#ms + 1] = m end
  load(ms)
  for _, m in ipairs(ms) do
    out[#out + 1] = m
    out[#out + 1] = tostring(maskOf(refsOf(m)))
  end
  return out
end
-- attach records this call's changes as the pending flush (a new version
-- of the rank's) and puts them in the reply; on one server (direct), where
-- a script may write any key, it writes the placements and counts itself,
-- in the same atomic step, and leaves nothing to flush.
local function attach(out)
  writeOwn()
  if #clist == 0 then return out end
  if direct then
    local inst = uid .. '|' .. rank
    if placed then
      for _, m in ipairs(clist) do
        local i = string.find(m, ':', 1, true)
        place(blkPre .. string.sub(m, i + 1) .. blkSuf .. string.sub(m, 1, i - 1), inst, cmask[m])
      end
    end
    addCounts(P, NSK, uid, dblocks, dt)
    local ms = {}
    for j, m in ipairs(clist) do ms[j] = m .. cmask[m] end
    feed(P, inst, table.concat(ms))
    return out
  end
  local ver = math.max(tonumber(redis.call('HGET', versKey, rank) or '0') + 1, nowUs)
  local vs = string.format('%d', ver)
  local d = string.format('%d %d %d %d', dblocks, dt[1], dt[2], dt[3])
  redis.call('HSET', versKey, rank, vs)
  redis.call('HSET', pendKey, 'owner', me, 'until', string.format('%d', nowMs + L), 'ver', vs, 'd', d, 'members', table.concat(clist, ','))
  keepTTL(versKey)
  keepTTL(pendKey)
  out[5], out[6] = vs, d
  for _, m in ipairs(clist) do
    out[#out + 1] = m
    out[#out + 1] = tostring(cmask[m])
  end
  return out
end
`

// step is the part of the change scripts: ARGV after lib's twelve: epoch,
// sequence, token, step k, steps, count, the pod's, backend's and
// namespace's limits, the blocks each holds (on a cluster, read by the
// caller before the change),
// adding, then step k's payload from ARGV[26].
//
// A change (a delta or a snapshot) runs as steps, one script call each
// (a clear step as many calls as its HSCAN takes). Step 0 checks the
// position and the limits and writes the in-progress record prog:rank
// (token, step, cursor); each call does its step's bounded work and
// advances the record atomically with it; the last one sets the position
// and deletes the record. A call whose step the record has passed does
// nothing and says where the record stands ('at'), so a delta resent
// after a crash, or the same delta applied by a second replica, resumes
// and each step is done once. While a record of another change is left
// (a crash mid-change), the rank's state is partial: only a change that
// drops it first (a snapshot, or sequence 1 of a newer epoch) applies.
const step = `
local epoch, seqs, token = ARGV[13], ARGV[14], ARGV[15]
local k, nsteps, count = tonumber(ARGV[16]), tonumber(ARGV[17]), tonumber(ARGV[18])
local function over(ownDropped)
  local adding = tonumber(ARGV[25])
  if adding == 0 then return nil end
  local own = 0
  if ownDropped then own = redis.call('HLEN', ownKey) end
  local names = {'pod', 'backend', 'namespace'}
  -- On one server the counts are read here, atomically with the change;
  -- on a cluster they are in the backend's slot, read by the caller just
  -- before.
  local counts = {ARGV[22], ARGV[23], ARGV[24]}
  if direct then counts = {redis.call('HGET', P .. 'podblocks', uid), redis.call('GET', P .. 'blocks'), redis.call('GET', NSK)} end
  for i = 1, 3 do
    local lim, held = tonumber(ARGV[18 + i]), tonumber(counts[i] or '0')
    local h = math.max(held - own, 0)
    if lim > 0 and h + adding > lim then
      return {'over', names[i], string.format('%d', lim), string.format('%d', h), '', '', string.format('%d', adding)}
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
  if not done then
    redis.call('HSET', progKey, 'cursor', cursor)
    return reply('more')
  end
  if k + 1 < nsteps then
    redis.call('HSET', progKey, 'step', tostring(k + 1), 'cursor', '0')
    return reply('next')
  end
  redis.call('HSET', posKey, rank, epoch .. ':' .. seqs)
  redis.call('DEL', progKey)
  keepTTL(posKey)
  return reply('ok', epoch, seqs)
end
`

// ARGV: step's, then for a clear step "C", tier, and for an ops step per
// op: kind (S, R), tier, space id, n, n block hashes. Step 0 is never a
// clear: a delta that fits one chunk is one call.
var applyScript = redis.NewScript(lib + step + `
local function main()
  local seq = tonumber(seqs)
  local known, ce, cs = position()
  if known and ce == epoch and seq <= tonumber(cs) then return reply('dup', ce, cs) end
  local prog = redis.call('HMGET', progKey, 'token', 'step', 'cursor', 'restart')
  local cursor, restart = '0', prog[4] == '1'
  if prog[1] == token then
    if k ~= tonumber(prog[2]) then return reply('at', ce, cs, prog[2]) end
    cursor = prog[3]
  else
    if k ~= 0 then return reply('lost', ce, cs) end
    restart = seq == 1 and ((not known) or newer(epoch, ce))
    if not restart and (prog[1] or not (known and ce == epoch and seq == tonumber(cs) + 1)) then return reply('snap', ce, cs) end
    local o = over(restart)
    if o then
      o[8], o[9] = ce, cs
      return o
    end
    begin(restart and '1' or '0')
  end
  -- Step 0 drops the rank first for a restart (a clear of as many calls
  -- as it takes), then does its payload like any other step.
  if k == 0 and restart then
    local c = clearSome(0, cursor, count)
    if c ~= '0' then return finish(false, c) end
  end
  local i = 26
  if ARGV[i] == 'C' then
    local c = clearSome(tonumber(ARGV[i + 1]), cursor, count)
    return finish(c == '0', c)
  end
  local ms = {}
  local j = i
  while j <= #ARGV do
    local space, n = ARGV[j + 2], tonumber(ARGV[j + 3])
    for h = j + 4, j + 3 + n do ms[#ms + 1] = space .. ':' .. ARGV[h] end
    j = j + 4 + n
  end
  load(ms)
  while i <= #ARGV do
    local kind, tier, space, n = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], tonumber(ARGV[i + 3])
    i = i + 4
    for j = i, i + n - 1 do
      local m = space .. ':' .. ARGV[j]
      if kind == 'S' then
        if tier >= 1 and tier <= 3 then add(m, tier, 1) end
      elseif tier <= 3 then
        remove(m, tier)
      end
    end
    i = i + n
  end
  return finish(true, '0')
end
local p = pending()
if p then return p end
return attach(main())
`)

// ARGV: step's, then for step 0 nothing (it clears the rank), for the
// others per entry: tier, space id, hash, refs.
var replaceScript = redis.NewScript(lib + step + `
local function main()
  local known, ce, cs = position()
  local prog = redis.call('HMGET', progKey, 'token', 'step', 'cursor')
  local cursor = '0'
  if prog[1] == token then
    if k ~= tonumber(prog[2]) then return reply('at', ce, cs, prog[2]) end
    cursor = prog[3]
  else
    if k ~= 0 then return reply('lost', ce, cs) end
    if known and newer(ce, epoch) then return reply('stale', ce, cs) end
    local o = over(true)
    if o then return o end
    begin('1')
  end
  if k == 0 then
    local c = clearSome(0, cursor, count)
    return finish(c == '0', c)
  end
  local ms = {}
  for i = 26, #ARGV, 4 do ms[#ms + 1] = ARGV[i + 1] .. ':' .. ARGV[i + 2] end
  load(ms)
  for i = 26, #ARGV, 4 do
    local tier, n = tonumber(ARGV[i]), tonumber(ARGV[i + 3])
    if tier >= 1 and tier <= 3 and n > 0 then add(ARGV[i + 1] .. ':' .. ARGV[i + 2], tier, n) end
  end
  return finish(true, '0')
end
local p = pending()
if p then return p end
return attach(main())
`)

// ackScript acks the caller's flush (lib's ARGV only).
var ackScript = redis.NewScript(lib + `
local p = pending()
if p then return p end
return reply('acked')
`)

// ARGV: lib's, then now (unix ms), cursor, count: clears up to count
// blocks of one rank of a pod whose lease ended, from cursor; replies
// 'more' with the next cursor, 'done' when the rank is gone, or 'alive'.
var expireRankScript = redis.NewScript(lib + `
local function main()
  local until_ = redis.call('GET', leaseKey)
  if until_ and tonumber(until_) >= tonumber(ARGV[13]) then return reply('alive') end
  local c = clearSome(0, ARGV[14], tonumber(ARGV[15]))
  if c ~= '0' then return reply('more', c) end
  redis.call('DEL', ownKey, progKey)
  redis.call('HDEL', posKey, rank)
  return reply('done')
end
local p = pending()
if p then return p end
return attach(main())
`)

// countScript adds one flush's count changes to the backend's and
// namespace's counts, and its masks to the backend's feed, once per
// version of the rank's. KEYS: the backend's seen hash. ARGV: P, the
// namespace count key, uid, rank, version, blocks, GPU, CPU and disk
// residencies gained (or lost), the feed's members (see feed).
var countScript = redis.NewScript(writes + `
local P, NSK, uid, inst, ver = ARGV[1], ARGV[2], ARGV[3], ARGV[3] .. '|' .. ARGV[4], ARGV[5]
local seen = redis.call('HGET', P .. 'seen', inst)
if seen and tonumber(seen) >= tonumber(ver) then return 0 end
redis.call('HSET', P .. 'seen', inst, ver)
addCounts(P, NSK, uid, tonumber(ARGV[6]), {tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])})
feed(P, inst, ARGV[10])
return 1
`)

// ARGV: Q, now (unix ms): 1 if the pod's lease ended.
var expireScript = redis.NewScript(`
local until_ = redis.call('GET', ARGV[1] .. 'lease')
if until_ and tonumber(until_) >= tonumber(ARGV[2]) then return 0 end
return 1
`)

// finishExpireScript removes what is left of an expired pod in its
// backend's slot, if its lease still ended (a subscriber may have come
// back meanwhile), and the backend's own keys with its last pod. ARGV: P,
// uid, now, the pod's ranks. It returns {removed, pods left}.
var finishExpireScript = redis.NewScript(writes + `
local P, uid, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local until_ = redis.call('ZSCORE', P .. 'leases', uid)
if not until_ or tonumber(until_) >= now then return {0, redis.call('HLEN', P .. 'pods')} end
redis.call('ZREM', P .. 'leases', uid)
if redis.call('HDEL', P .. 'pods', uid) == 1 then feedAdd(P, 'p', uid, 'r', '') end
redis.call('HDEL', P .. 'podblocks', uid)
for i = 4, #ARGV do redis.call('HDEL', P .. 'seen', uid .. '|' .. ARGV[i]) end
local left = redis.call('HLEN', P .. 'pods')
if left == 0 and redis.call('ZCARD', P .. 'leases') == 0 then
  redis.call('DEL', P .. 'tiers', P .. 'podblocks', P .. 'blocks', P .. 'seen', P .. 'feed', P .. 'feedn')
end
return {1, left}
`)

// dropPodScript removes an expired pod's own keys, if its lease still
// ended and no rank is left. ARGV: Q, now (unix ms).
var dropPodScript = redis.NewScript(`
local Q = ARGV[1]
local until_ = redis.call('GET', Q .. 'lease')
if until_ and tonumber(until_) >= tonumber(ARGV[2]) then return 0 end
if redis.call('HLEN', Q .. 'pos') > 0 then return 0 end
redis.call('DEL', Q .. 'pos', Q .. 'ranks', Q .. 'vers', Q .. 'lease')
return 1
`)

// putPodScript stores a pod's record and lease in its backend's slot and
// moves the expiry of the backend's keys and its namespace count's to at
// least the lease's end plus the margin. ARGV: P, uid, record, lease end
// (ms), namespace count key, margin (ms), now (ms; PTTL, not Redis 7's
// PEXPIRETIME, so that Redis 6.2 serves).
var putPodScript = redis.NewScript(writes + extend + `
local P, uid, rec, lease, NSK = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
redis.call('HSET', P .. 'pods', uid, rec)
feedAdd(P, 'p', uid, 'r', rec)
redis.call('ZADD', P .. 'leases', lease, uid)
for _, k in ipairs({P .. 'pods', P .. 'leases', P .. 'tiers', P .. 'podblocks', P .. 'blocks', P .. 'seen', P .. 'feed', P .. 'feedn', NSK}) do extend(k) end
return 1
`)

// putLeaseScript keeps the pod's lease in its own slot too, for the
// scripts there, and moves the expiry of its keys like putPodScript's.
// ARGV: Q, "", "", lease end (ms), "", margin (ms), now (ms).
var putLeaseScript = redis.NewScript(extend + `
local Q, lease = ARGV[1], tonumber(ARGV[4])
redis.call('SET', Q .. 'lease', ARGV[4])
for _, k in ipairs({Q .. 'lease', Q .. 'pos', Q .. 'ranks', Q .. 'vers'}) do extend(k) end
for _, r in ipairs(redis.call('SMEMBERS', Q .. 'ranks')) do
  extend(Q .. 'own:' .. r)
  extend(Q .. 'prog:' .. r)
  extend(Q .. 'pend:' .. r)
end
return 1
`)

// extend: ARGV[4] the lease end, [6] the margin, [7] now (all ms).
const extend = `
local at = math.floor(tonumber(ARGV[4]) + tonumber(ARGV[6]))
local nowMs = tonumber(ARGV[7])
local function extend(key)
  local t = redis.call('PTTL', key)
  if t == -1 or (t >= 0 and nowMs + t < at) then redis.call('PEXPIREAT', key, at) end
end
`

// placeScript writes one flush's placements on one server, in as many
// slots as that server holds (a script without declared keys may touch
// several slots of its own node; a key another node serves fails it, and
// the caller writes those one command each). ARGV: the instance, then
// per block its placement key and mask ('0': not held).
var placeScript = redis.NewScript(writes + `
local inst = ARGV[1]
for i = 2, #ARGV, 2 do place(ARGV[i], inst, tonumber(ARGV[i + 1])) end
return 1
`)

// writes are the writes a change's outcome makes outside the rank's own
// state, shared by the step scripts on one server (attach) and the
// flush's scripts on a cluster: place sets (or, for mask 0, removes) an
// instance's tier mask in a block's placement; addCounts adds blocks and
// per-tier residencies gained (or lost) to the pod's, backend's and
// namespace's counts; feed appends the flush's masks to the backend's
// feed, which the index replicas' read models follow (readmodel.go).
var writes = strings.ReplaceAll(writesLua, "FEEDLEN", strconv.Itoa(FeedLength))

// FeedLength is about how many flushes a backend's feed keeps (Redis
// trims it to about this many with XADD's MAXLEN ~): a read model that
// falls further behind reads the backend again from the pods' states.
const FeedLength = 8192

// The feed: P feed is a stream of the backend's flushes and pod records,
// entry n-0 the backend's n-th: a flush's has fields i (the instance)
// and m (each changed member "S:H" followed by its new mask digit, 34
// bytes each), a pod record's p (the pod's UID) and r (the record as P
// pods holds it; "": removed); P feedn holds n
// and gen, the feed's lifetime (the server's time when its first entry
// was added): a read model that sees another gen, or n going back, reads
// the backend again.
const writesLua = `
local function feedAdd(P, ...)
  local meta, key = P .. 'feedn', P .. 'feed'
  local n = redis.call('HINCRBY', meta, 'n', 1)
  if n == 1 then
    local t = redis.call('TIME')
    redis.call('DEL', key)
    redis.call('HSET', meta, 'gen', t[1] .. string.format('%06d', tonumber(t[2])))
  end
  redis.call('XADD', key, 'MAXLEN', '~', FEEDLEN, string.format('%d-0', n), ...)
end
local function feed(P, inst, ms) feedAdd(P, 'i', inst, 'm', ms) end
local function place(key, inst, mask)
  if mask == 0 then redis.call('HDEL', key, inst) else redis.call('HSET', key, inst, mask) end
end
local function addCounts(P, NSK, uid, n, dt)
  if n ~= 0 then
    redis.call('HINCRBY', P .. 'podblocks', uid, n)
    redis.call('INCRBY', P .. 'blocks', n)
    redis.call('INCRBY', NSK, n)
  end
  for t = 1, 3 do
    if dt[t] ~= 0 then redis.call('HINCRBY', P .. 'tiers', t, dt[t]) end
  end
end
`
