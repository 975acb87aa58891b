-- sem_acquire claims one permit of a semaphore for an owner token, or
-- reports why it cannot.
--
-- KEYS[1]  Z, KEYS[2]  H, KEYS[3]  q, KEYS[4]  qd (sem_common.lua)
-- KEYS[5]  the fencing counter of the earlier lock layout (a hash per lock
--          and "<lock key>:fence"), read only, for a key with no record
-- ARGV[1]  owner token
-- ARGV[2]  owner: human-readable metadata
-- ARGV[3]  TTL in milliseconds (used when ARGV[4] is "0")
-- ARGV[4]  absolute expiry in Unix milliseconds on this server's clock, or "0"
-- ARGV[5]  waiter id of a waiting Acquire, or ""
-- ARGV[6]  how long the waiter keeps its place, in milliseconds
-- ARGV[7]  the semaphore's limit (> 1)
-- ARGV[8]  release channel, ARGV[9] the lock's key
--
-- Replies:
--   {1, token, acquired_us, pttl, time_s, time_us}  the caller holds a
--     permit (pttl is -3 for a fresh claim)
--   {0, token, acquired_us, pttl, time_s, time_us, owner}  every permit is
--     taken: the one that expires first
--   {2}  the absolute expiry asked for is already past (a slot that is over)
--   {3, limit}  the key is held with another limit (1: a lock holds it)
--   {4}  a permit is free, but it is other waiters' turn
--
-- A claim takes a free permit only when fewer live waiters are queued
-- before it than there are free permits; a grant that leaves a permit free
-- tells the next waiter.
local z, h, q, qd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local waiter, limit = ARGV[5], tonumber(ARGV[7])
local nowms, nowus, t = server_time()
local last, tomb = 0, false
local n = sem_sweep(z, h, nowms)
if not n then
  local r = rec_parse(redis.call('GET', z))
  if r.held then
    return {3, 1}
  end
  last, tomb, n = tonumber(r.token), true, 0 -- a lock's tombstone: free
end

if n > 0 then
  local mine = redis.call('ZSCORE', z, ARGV[1])
  if mine then
    -- A retry of a claim that already succeeded: the same permit.
    local tok, acq = sem_meta(redis.call('HGET', h, 'p:' .. ARGV[1]))
    return {1, tok, acq, fmt_int(tonumber(mine) - nowms), t[1], t[2]}
  end
  local have = tonumber(redis.call('HGET', h, 'limit')) or 0
  if have ~= limit then
    return {3, have}
  end
  if n >= limit then
    if waiter ~= '' then
      queue_ops().push(q, qd, waiter, nowms, tonumber(ARGV[6]))
    else
      redis.call('HSET', h, 'notify', '1')
    end
    local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    local tok, acq, owner = sem_meta(redis.call('HGET', h, 'p:' .. first[1]))
    return {0, tok, acq, fmt_int(tonumber(first[2]) - nowms), t[1], t[2], owner}
  end
end

local expat = tonumber(ARGV[4])
local life = tonumber(ARGV[3])
if expat > 0 then
  life = expat - nowms
  if life <= 0 then
    return {2} -- the slot is over on the server clock
  end
end

local ahead, queued = sem_ahead(q, qd, waiter, nowms, limit - n)
if ahead >= limit - n then
  if waiter ~= '' then
    queue_ops().push(q, qd, waiter, nowms, tonumber(ARGV[6]))
  end
  return {4}
end
if waiter ~= '' then
  queue_ops().remove(q, qd, waiter)
end

-- Fencing token: above the last one of this key (any permit's, or the
-- lock's tombstone's), and at least the server time in microseconds.
if n > 0 then
  last = tonumber(redis.call('HGET', h, 'last')) or 0
elseif not tomb then
  -- No record: h may be left over from a semaphore whose set was deleted,
  -- and the earlier layout's counter may outlive its lock.
  last = math.max(tonumber(redis.call('HGET', h, 'last')) or 0,
    tonumber(redis.call('GET', KEYS[5])) or 0)
  redis.call('DEL', h)
end
local token = nowus
if last >= token then
  token = last + 1
end
token = fmt_int(token)
local acquired = fmt_int(nowus)

if tomb then
  redis.call('DEL', z)
end
redis.call('ZADD', z, fmt_int(nowms + life), ARGV[1])
redis.call('HSET', h, 'limit', ARGV[7], 'last', token, 'p:' .. ARGV[1], token .. ' ' .. acquired .. ' ' .. ARGV[2])
sem_extend(z, h, life)
if n + 1 < limit and queued then
  local head = queue_ops().head(q, qd, nowms)
  if head then
    redis.call('PUBLISH', ARGV[8], queue_ops().turn(ARGV[9], head))
  end
end
return {1, token, acquired, -3, t[1], t[2]}
