-- sem_holders reads every live permit of a semaphore.
--
-- KEYS[1]  Z, KEYS[2]  H, KEYS[3]  q (sem_common.lua)
--
-- Reply {1, limit, time_s, time_us, expiry_ms, entry, ...} with one
-- expiry (Unix ms) and H entry ("<token> <acquired_us> <owner>") per
-- permit, {0} when the key is free, {-1} when a lock holds it. Owner
-- tokens never leave the server.
local nowms, _, t = server_time()
local n = sem_sweep(KEYS[1], KEYS[2], nowms)
if not n then
  local r = rec_parse(redis.call('GET', KEYS[1]))
  if r.held then
    return {-1}
  end
  return {0}
end
if n == 0 then
  sem_vacate(KEYS[1], KEYS[2], KEYS[3])
  return {0}
end
local r = {1, redis.call('HGET', KEYS[2], 'limit') or '0', t[1], t[2]}
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  r[#r + 1] = all[i + 1]
  r[#r + 1] = redis.call('HGET', KEYS[2], 'p:' .. all[i]) or ''
end
return r
