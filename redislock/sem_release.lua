-- sem_release gives up a permit held by an owner token.
--
-- KEYS[1]  Z, KEYS[2]  H, KEYS[3]  q, KEYS[4]  qd (sem_common.lua)
-- ARGV[1]  the owner token of the permit
-- ARGV[2]  keep in milliseconds: "0" frees the permit; more keeps it held
--          until the server's now + keep (min hold)
-- ARGV[3]  release channel
-- ARGV[4]  the lock's key
--
-- Reply: 1 freed, 2 kept, 0 not held by this owner token. A freed permit
-- is the first live waiter's turn; with nobody in line the key is
-- published only when someone without a place was answered busy.
local z, h, q, qd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local nowms = server_time()
local s = redis.pcall('ZSCORE', z, ARGV[1])
if type(s) ~= 'string' then
  return 0 -- not a permit of this set, or the key holds a lock
end
if tonumber(s) <= nowms then
  if sem_sweep(z, h, nowms) == 0 then
    sem_vacate(z, h, q)
  end
  return 0
end
local keep = tonumber(ARGV[2])
if keep > 0 then
  redis.call('ZADD', z, 'XX', fmt_int(nowms + keep), ARGV[1])
  sem_extend(z, h, keep)
  return 2
end
redis.call('ZREM', z, ARGV[1])
redis.call('HDEL', h, 'p:' .. ARGV[1])
local queued = sem_tell(h, q, qd, nowms, ARGV[3], ARGV[4])
if redis.call('ZCARD', z) == 0 then
  sem_vacate(z, h, q, queued)
end
return 1
