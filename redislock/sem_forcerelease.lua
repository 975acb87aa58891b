-- sem_forcerelease frees every permit of a semaphore and tells waiters.
--
-- KEYS[1]  Z, KEYS[2]  H, KEYS[3]  q, KEYS[4]  qd (sem_common.lua)
-- ARGV[1]  release channel
-- ARGV[2]  the lock's key
--
-- Reply: 1 freed, 0 no permit was held, -1 the key holds no semaphore. The
-- first live waiter is told its turn, or, with nobody queued, the key is
-- published.
local z, h, q, qd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local nowms = server_time()
local n = sem_sweep(z, h, nowms)
if not n then
  return -1
end
if n == 0 then
  sem_vacate(z, h, q)
  return 0
end
redis.call('DEL', z)
local head = queue_ops().head(q, qd, nowms)
sem_vacate(z, h, q, head ~= false)
if head then
  redis.call('PUBLISH', ARGV[1], queue_ops().turn(ARGV[2], head))
else
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return 1
