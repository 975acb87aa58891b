-- sem_leave tells the first live waiter of a semaphore its turn when a
-- permit is free: the waiter that left the queue (leave.lua, which stops
-- at a key that holds no lock record) may have been first in line.
--
-- KEYS[1]  Z, KEYS[2]  H, KEYS[3]  q, KEYS[4]  qd (sem_common.lua)
-- ARGV[1]  the waiter that left
-- ARGV[2]  release channel
-- ARGV[3]  the lock's key
local z, h, q, qd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local nowms = server_time()
queue_ops().remove(q, qd, ARGV[1])
local n = sem_sweep(z, h, nowms)
if n and n < (tonumber(redis.call('HGET', h, 'limit')) or 0) then
  local head = queue_ops().head(q, qd, nowms)
  if head then
    redis.call('PUBLISH', ARGV[2], queue_ops().turn(ARGV[3], head))
  end
end
return 1
