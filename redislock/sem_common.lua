-- sem_common is prepended to every semaphore script.
--
-- A semaphore on lock key k (Limit > 1) is stored under the lock's own
-- Redis key, as a type a mutex never uses, so that each kind can tell the
-- other is there:
--
--   Z  "<prefix>:{k'}"        a sorted set: owner token -> the permit's
--                              expiry, Unix milliseconds on the server clock
--   H  "<prefix>:{k'}:sem"    a hash: limit -> n; "p:" .. owner token ->
--                              "<token> <acquired_us> <owner>"
--   F  "<prefix>:{k'}:fence"  the last fencing token, shared with the mutex
--
-- Z and H carry a PEXPIRE no earlier than their last permit's expiry, so
-- they vanish when every permit ran out. A permit whose expiry is past is
-- dropped by the next script that reads the key.

local function sem_fmt(n)
  return string.format('%.0f', n)
end

-- sem_now returns TIME, now in milliseconds and now in microseconds.
local function sem_now()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return t, s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- sem_sweep drops the permits of z (and their entries in h) that expired
-- by nowms, and h itself when no permit is left. It returns the number of
-- live permits, or nil when z holds another type: a mutex holds the key.
local function sem_sweep(z, h, nowms)
  local gone = redis.pcall('ZRANGEBYSCORE', z, '-inf', sem_fmt(nowms))
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
  local n = redis.call('ZCARD', z)
  if n == 0 then
    redis.call('DEL', h) -- left over from a deleted or expired set
  end
  return n
end

-- sem_extend makes z and h live at least ms more.
local function sem_extend(z, h, ms)
  if redis.call('PTTL', z) < ms then
    redis.call('PEXPIRE', z, sem_fmt(ms))
    redis.call('PEXPIRE', h, sem_fmt(ms))
  end
end

-- sem_meta splits a permit's entry in h into token, acquired_us and owner.
local function sem_meta(v)
  local tok, acq, owner = string.match(v or '', '^(%d+) (%d+) (.*)$')
  return tok or '0', acq or '0', owner or ''
end
