-- inspect reads the holder of a lock.
--
-- KEYS[1]  the lock record
--
-- Reply {1, owner, token, acquired_us, pttl, time_s, time_us} when held,
-- {0} when free (no record, or a tombstone).
local r = rec_parse(redis.call('GET', KEYS[1]))
if not r or not r.held then
  return {0}
end
local pttl = redis.call('PTTL', KEYS[1])
local _, _, t = server_time()
return {1, r.owner, r.token, r.acq, pttl, t[1], t[2]}
