-- sem_release gives up a permit held by an owner token.
--
-- KEYS[1]  Z, KEYS[2]  H
-- ARGV[1]  the owner token of the permit
-- ARGV[2]  keep in milliseconds: "0" frees the permit; more keeps it held
--          until the server's now + keep (min hold)
-- ARGV[3]  release channel
-- ARGV[4]  message: the lock's key
--
-- Reply: 1 freed (and published), 2 kept, 0 not held by this owner token.
local t, nowms = sem_now()
local z, h = KEYS[1], KEYS[2]
local s = redis.pcall('ZSCORE', z, ARGV[1])
if type(s) ~= 'string' then
  return 0 -- not a permit of this set, or the key holds a mutex
end
if tonumber(s) <= nowms then
  sem_sweep(z, h, nowms)
  return 0
end
local keep = tonumber(ARGV[2])
if keep > 0 then
  redis.call('ZADD', z, 'XX', sem_fmt(nowms + keep), ARGV[1])
  sem_extend(z, h, keep)
  return 2
end
redis.call('ZREM', z, ARGV[1])
redis.call('HDEL', h, 'p:' .. ARGV[1])
if redis.call('ZCARD', z) == 0 then
  redis.call('DEL', h)
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
