-- sem_acquire claims one permit of a semaphore for an owner token, or
-- reports why it cannot.
--
-- KEYS[1]  Z, KEYS[2]  H, KEYS[3]  F (see sem_common)
-- ARGV[1]  owner token
-- ARGV[2]  owner: human-readable metadata
-- ARGV[3]  TTL in milliseconds (used when ARGV[4] is "0")
-- ARGV[4]  absolute expiry in Unix milliseconds on this server's clock, or "0"
-- ARGV[5]  how long the fencing counter outlives the permit, in milliseconds
-- ARGV[6]  the semaphore's limit (> 1)
--
-- Reply {1, token, acquired_us, pttl, time_s, time_us} when the caller holds
-- a permit (pttl is -3 for a fresh claim), {0, token, acquired_us, pttl,
-- time_s, time_us, owner} with the permit that expires first when all are
-- taken, {2} when the absolute expiry is already past, {3, limit} when the
-- key is held with another limit (1: a mutex holds it). Only a claim writes.
local t, nowms, nowus = sem_now()
local z, h = KEYS[1], KEYS[2]
local n = sem_sweep(z, h, nowms)
if not n then
  return {3, 1}
end
local limit = tonumber(ARGV[6])
if n > 0 then
  local mine = redis.call('ZSCORE', z, ARGV[1])
  if mine then
    -- A retry of a claim that already succeeded: the same permit.
    local tok, acq = sem_meta(redis.call('HGET', h, 'p:' .. ARGV[1]))
    return {1, tok, acq, sem_fmt(tonumber(mine) - nowms), t[1], t[2]}
  end
  local have = tonumber(redis.call('HGET', h, 'limit')) or 0
  if have ~= limit then
    return {3, have}
  end
  if n >= limit then
    local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    local tok, acq, owner = sem_meta(redis.call('HGET', h, 'p:' .. first[1]))
    return {0, tok, acq, sem_fmt(tonumber(first[2]) - nowms), t[1], t[2], owner}
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

-- Fencing token: above the last one minted for this key by any permit or
-- mutex, and at least the server time in microseconds.
local token = nowus
local last = tonumber(redis.call('GET', KEYS[3]))
if last and last >= token then
  token = last + 1
end
token = sem_fmt(token)
local acquired = sem_fmt(nowus)

redis.call('ZADD', z, sem_fmt(nowms + life), ARGV[1])
redis.call('HSET', h, 'limit', ARGV[6], 'p:' .. ARGV[1], token .. ' ' .. acquired .. ' ' .. ARGV[2])
sem_extend(z, h, life)
redis.call('SET', KEYS[3], token, 'PX', sem_fmt(life + tonumber(ARGV[5])))
return {1, token, acquired, -3, t[1], t[2]}
