-- acquire claims a lock for an owner token, or reports who holds it.
--
-- KEYS[1]  the lock hash (fields: otoken, owner, token, acquired)
-- KEYS[2]  the lock's fencing counter (same hash slot)
-- ARGV[1]  owner token: random per session, guards renew and release
-- ARGV[2]  owner: human-readable metadata
-- ARGV[3]  TTL in milliseconds (used when ARGV[4] is "0")
-- ARGV[4]  absolute expiry in Unix milliseconds on this server's clock, or "0"
-- ARGV[5]  how long the counter outlives the lock, in milliseconds
--
-- Reply {1, token, acquired_us, pttl, time_s, time_us} when the caller holds
-- the lock (pttl is -3 for a fresh claim: the expiry is the one asked for),
-- {0, token, acquired_us, pttl, time_s, time_us, owner} when another owner
-- token holds it, {2} when the absolute expiry asked for is already past (a
-- slot that is over). A busy lock is answered by reads only.
local cur = redis.call('HMGET', KEYS[1], 'otoken', 'owner', 'token', 'acquired')
local t = redis.call('TIME')
if cur[1] then
  local pttl = redis.call('PTTL', KEYS[1])
  if cur[1] == ARGV[1] then
    -- A retry of an acquire that already succeeded: same lease.
    return {1, cur[3], cur[4], pttl, t[1], t[2]}
  end
  return {0, cur[3] or '0', cur[4] or '0', pttl, t[1], t[2], cur[2] or ''}
end

local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local expat = tonumber(ARGV[4])
local life = tonumber(ARGV[3])
if expat > 0 then
  life = expat - nowms
  if life <= 0 then
    -- The slot this claim is for is already over on the server clock:
    -- whoever held it let it expire, so the claim is refused, not granted.
    return {2}
  end
end

-- Fencing token: above the last one minted for this key, and at least the
-- server time in microseconds, so it still grows when the counter is gone.
local token = nowus
local last = tonumber(redis.call('GET', KEYS[2]))
if last and last >= token then
  token = last + 1
end
token = string.format('%.0f', token)
local acquired = string.format('%.0f', nowus)

redis.call('HSET', KEYS[1], 'otoken', ARGV[1], 'owner', ARGV[2], 'token', token, 'acquired', acquired)
if expat > 0 then
  redis.call('PEXPIREAT', KEYS[1], ARGV[4])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
redis.call('SET', KEYS[2], token, 'PX', string.format('%.0f', life + tonumber(ARGV[5])))
return {1, token, acquired, -3, t[1], t[2]}
