-- sem_common: the semaphore's functions, after record.lua and queue.lua in
-- every semaphore script.
--
-- A semaphore on lock key k (Limit > 1) is stored at the lock's own Redis
-- key as a sorted set, a type the lock record (a string) never has, so
-- each kind sees the other:
--
--   Z   "<prefix>:{k'}"      a sorted set: owner token -> the permit's
--                             expiry, Unix ms on the server clock
--   H   "<prefix>:{k'}:sem"  a hash: limit -> n; last -> the last fencing
--                             token; notify -> 1 when someone without a
--                             place in line was answered busy; "p:" .. owner
--                             token -> "<token> <acquired_us> <owner>"
--   q, qd                    the key's waiter queue (queue.lua), shared
--                             with the mutex
--
-- Z and H carry a PEXPIRE no earlier than their last permit's expiry. A
-- permit whose expiry is past is dropped by the next script that reads the
-- key. When the last permit goes, the tombstone of record.lua takes the
-- key's place with the last token, so that a later claim of either kind
-- counts on from it.

-- sem_sweep drops the permits of z (and their entries in h) that expired
-- by nowms. It returns the number of live permits, or nil when z is not a
-- sorted set (a lock record, or its tombstone).
local function sem_sweep(z, h, nowms)
  local gone = redis.pcall('ZRANGEBYSCORE', z, '-inf', fmt_int(nowms))
  if gone.err then
    return nil
  end
  for i = 1, #gone, 500 do
    local part = {unpack(gone, i, math.min(i + 499, #gone))}
    redis.call('ZREM', z, unpack(part))
    for j = 1, #part do
      part[j] = 'p:' .. part[j]
    end
    redis.call('HDEL', h, unpack(part))
  end
  return redis.call('ZCARD', z)
end

-- sem_vacate ends the semaphore whose last permit is gone from z: the
-- tombstone keeps the last token for the rest of h's TTL (marked queued
-- when waiters may be in line: queued is true, or nil for "look"), and h
-- goes.
local function sem_vacate(z, h, q, queued)
  local last = redis.call('HGET', h, 'last')
  local pttl = redis.call('PTTL', h)
  redis.call('DEL', h)
  if last and pttl > 0 then
    if queued == nil then
      queued = queue_ops().any(q)
    end
    local flags = 0
    if queued then
      flags = REC_QUEUED
    end
    redis.call('SET', z, rec_free(flags, last), 'PX', pttl)
  end
end

-- sem_extend makes z and h live at least ms more.
local function sem_extend(z, h, ms)
  if redis.call('PTTL', z) < ms then
    redis.call('PEXPIRE', z, fmt_int(ms))
    redis.call('PEXPIRE', h, fmt_int(ms))
  end
end

-- sem_meta splits a permit's entry in h into token, acquired_us and owner.
local function sem_meta(v)
  local tok, acq, owner = string.match(v or '', '^(%d+) (%d+) (.*)$')
  return tok or '0', acq or '0', owner or ''
end

-- sem_ahead counts the live waiters queued before w (all of them when w is
-- not queued), up to most, dropping the expired ones it passes. The second
-- result is false when the queue was found empty.
local function sem_ahead(q, qd, w, nowms, most)
  local n, start = 0, 0
  while n < most do
    local ids = redis.call('ZRANGE', q, start, start + most - n - 1)
    if #ids == 0 then
      return n, start > 0
    end
    for _, id in ipairs(ids) do
      if id == w then
        return n, true
      end
      local d = tonumber(redis.call('HGET', qd, id))
      if d and d > nowms then
        n = n + 1
        start = start + 1
      else
        queue_ops().remove(q, qd, id)
      end
    end
  end
  return n, true
end

-- sem_tell tells the first live waiter of the key its turn; with nobody in
-- line, it publishes the key when someone without a place was answered
-- busy (h's notify). It returns whether a waiter is in line.
local function sem_tell(h, q, qd, nowms, channel, key)
  local head = queue_ops().head(q, qd, nowms)
  if head then
    redis.call('PUBLISH', channel, queue_ops().turn(key, head))
    return true
  end
  if redis.call('HDEL', h, 'notify') == 1 then
    redis.call('PUBLISH', channel, key)
  end
  return false
end
