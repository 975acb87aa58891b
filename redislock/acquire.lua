-- acquire claims a lock for an owner token, or reports who holds it.
--
-- KEYS[1]  the lock record (record.lua)
-- KEYS[2]  the key's waiter queue, KEYS[3] its deadlines (queue.lua)
-- ARGV[1]  owner token: random per session, guards renew and release
-- ARGV[2]  owner: human-readable metadata
-- ARGV[3]  TTL in milliseconds (used when ARGV[4] is "0")
-- ARGV[4]  absolute expiry in Unix milliseconds on this server's clock, or "0"
-- ARGV[5]  waiter id of a waiting Acquire, or ""
-- ARGV[6]  how long the waiter keeps its place, in milliseconds
--
-- Replies:
--   {1, token, acquired_us, pttl, time_s, time_us}  the caller holds the lock
--     (pttl is -3 for a fresh claim: the expiry is the one asked for;
--     time_s is "0" when the server clock was not read)
--   {0, token, acquired_us, pttl, time_s, time_us, owner}  another owner
--     token holds it
--   {2}  the absolute expiry asked for is already past (a slot that is over)
--   {3}  the key is free, but it is another waiter's turn
--
-- The common claim reads the record and writes it (GET, SET): a free key's
-- tombstone carries the last fencing token, so the server clock is read only
-- for a key with no record (the token is then seeded from it), for a slot
-- claim, and when waiters are queued.
local v = redis.call('GET', KEYS[1])
local r = rec_parse(v)
local waiter = ARGV[5]

if r and r.held then
  local pttl = redis.call('PTTL', KEYS[1])
  local nowms, _, t = server_time()
  if r.otoken == ARGV[1] then
    -- A retry of an acquire that already succeeded: same lease.
    return {1, r.token, r.acq, pttl, t[1], t[2]}
  end
  -- Busy. Mark the record once so that its release tells the waiters: a
  -- waiter with an id queues and is told its turn; any other caller asks
  -- for the plain release message.
  local flags = r.flags
  if waiter ~= '' then
    q_push(KEYS[2], KEYS[3], waiter, nowms, tonumber(ARGV[6]))
    flags = rec_with(flags, REC_QUEUED)
  else
    flags = rec_with(flags, REC_NOTIFY)
  end
  if flags ~= r.flags then
    redis.call('SET', KEYS[1], rec_reflag(v, flags), 'KEEPTTL')
  end
  return {0, r.token, r.acq, pttl, t[1], t[2], r.owner}
end

local expat = tonumber(ARGV[4])
local nowms, nowus, t
if expat > 0 or not r then
  nowms, nowus, t = server_time()
  if expat > 0 and expat <= nowms then
    -- The slot this claim is for is already over on the server clock:
    -- whoever held it let it expire, so the claim is refused, not granted.
    return {2}
  end
end

-- A free key: the queue, when there may be one, decides whose turn it is.
-- A key with no record may have a queue whose holder's lease expired.
local flags = 0
if not r or rec_has(r.flags, REC_QUEUED) then
  if not t then
    nowms, nowus, t = server_time()
  end
  local head = q_head(KEYS[2], KEYS[3], nowms)
  if head and head ~= waiter then
    if waiter ~= '' then
      q_push(KEYS[2], KEYS[3], waiter, nowms, tonumber(ARGV[6]))
    end
    return {3}
  end
  if head then
    q_remove(KEYS[2], KEYS[3], waiter)
    if q_any(KEYS[2]) then
      flags = REC_QUEUED
    end
  end
end

-- Fencing token: one above the last one of this key, or, when the key has
-- no record, the server time in microseconds.
local token
if r then
  token = fmt_int(tonumber(r.token) + 1)
else
  token = fmt_int(nowus)
end
local acq = ''
if expat > 0 then
  acq = fmt_int(nowus)
  redis.call('SET', KEYS[1], rec_held(flags, token, acq, ARGV[1], ARGV[2]), 'PXAT', ARGV[4])
else
  redis.call('SET', KEYS[1], rec_held(flags, token, acq, ARGV[1], ARGV[2]), 'PX', ARGV[3])
end
if t then
  return {1, token, acq, -3, t[1], t[2]}
end
return {1, token, acq, -3, '0', '0'}
