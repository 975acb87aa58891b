-- inspect reads the holder of a lock.
--
-- KEYS[1]  the lock hash
--
-- Reply {1, owner, token, acquired_us, pttl, time_s, time_us} when held,
-- {0} when free.
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token', 'acquired')
if not cur[2] then
  return {0}
end
local pttl = redis.call('PTTL', KEYS[1])
local t = redis.call('TIME')
return {1, cur[1] or '', cur[2], cur[3] or '0', pttl, t[1], t[2]}
