-- acquire claims a lock for an owner token, or reports who holds it.
--
-- KEYS[1]  the lock record (record.lua)
-- KEYS[2]  the key's waiter queue, KEYS[3] its deadlines (queue.lua)
-- ARGV[1]  owner token: random per session, guards renew and release
-- ARGV[2]  owner: human-readable metadata
-- ARGV[3]  TTL in milliseconds (used when ARGV[4] is "0" or absent)
-- ARGV[4]  absolute expiry in Unix milliseconds on this server's clock, or "0"
-- ARGV[5]  waiter id of a waiting Acquire, or ""
-- ARGV[6]  how long the waiter keeps its place, in milliseconds
-- A plain claim (no slot end, no waiter) sends ARGV[1] to ARGV[3] only.
--
-- Replies:
--   "n"  (a string of digits) the caller holds a lease claimed now,
--     expiring after the TTL asked for; n is both its fencing token and
--     its acquired_us, the server time in µs
--   {1, token, acquired_us}  the same, with a token above the server time
--     (the last token was not below it)
--   {1, token, acquired_us, pttl, time_s, time_us}  the caller holds the lock
--     (pttl is -3 for a fresh claim: the expiry is the one asked for)
--   {0, token, acquired_us, pttl, time_s, time_us, owner}  another owner
--     token holds it
--   {2}  the absolute expiry asked for is already past (a slot that is over)
--   {3}  the key is free, but it is another waiter's turn
--
-- A claim is GET, TIME, SET; the waiter queue is read only when the record
-- says someone may be queued, or when there is no record. The two common
-- cases, a plain claim of a key nobody waits for and a try on a lock whose
-- holder already knows to publish its release, are fast.lua's, before the
-- prelude (scripts.go).
local now, t = clock()
local v = redis.call('GET', KEYS[1])
if not ARGV[4] then
  local r = fast_claim(KEYS[1], KEYS[2], v, ARGV[1], ARGV[2], ARGV[3], now)
  if r then
    return r
  end
end
if v and (ARGV[5] or '') == '' then
  local r = fast_busy(KEYS[1], v, ARGV[1], t)
  if r then
    return r
  end
end
--@prelude

local r = rec_parse(v)
local waiter = ARGV[5] or ''
local nowms, nowus = server_time(t)

if r and r.held then
  local pttl = redis.call('PTTL', KEYS[1])
  if r.otoken == ARGV[1] then
    -- A retry of an acquire that already succeeded: same lease.
    return {1, r.token, r.acq, pttl, t[1], t[2]}
  end
  -- Busy. Mark the record once so that its release tells the waiters: a
  -- waiter with an id queues and is told its turn; any other caller asks
  -- for the plain release message.
  local flags = r.flags
  if waiter ~= '' then
    queue_ops().push(KEYS[2], KEYS[3], waiter, nowms, tonumber(ARGV[6]))
    flags = rec_with(flags, REC_QUEUED)
  else
    flags = rec_with(flags, REC_NOTIFY)
  end
  if flags ~= r.flags then
    redis.call('SET', KEYS[1], rec_reflag(v, flags), 'KEEPTTL', 'XX')
  end
  return {0, r.token, r.acq, pttl, t[1], t[2], r.owner}
end

local expat = tonumber(ARGV[4] or '0')
if expat > 0 and expat <= nowms then
  -- The slot this claim is for is already over on the server clock:
  -- whoever held it let it expire, so the claim is refused, not granted.
  return {2}
end

-- A free key: the queue, when there may be one, decides whose turn it is.
-- A key with no record may have a queue whose holder's lease expired.
local flags = 0
if not r or rec_has(r.flags, REC_QUEUED) then
  local head = queue_ops().head(KEYS[2], KEYS[3], nowms)
  if head and head ~= waiter then
    if waiter ~= '' then
      queue_ops().push(KEYS[2], KEYS[3], waiter, nowms, tonumber(ARGV[6]))
    end
    return {3}
  end
  if head then
    queue_ops().remove(KEYS[2], KEYS[3], waiter)
    if queue_ops().any(KEYS[2]) then
      flags = REC_QUEUED
    end
  end
end

-- Fencing token: above the last one of this key (the tombstone's), and at
-- least the server time in microseconds, so that it still grows when the
-- record is gone, or when a failover lost the last claims.
local token = nowus
if r and tonumber(r.token) >= token then
  token = tonumber(r.token) + 1
end
token = fmt_int(token)
local acq = fmt_int(nowus)
if expat > 0 then
  redis.call('SET', KEYS[1], rec_held(flags, token, acq, ARGV[1], ARGV[2]), 'PXAT', ARGV[4])
else
  redis.call('SET', KEYS[1], rec_held(flags, token, acq, ARGV[1], ARGV[2]), 'PX', ARGV[3])
end
return {1, token, acq, -3, t[1], t[2]}
