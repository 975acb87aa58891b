-- forcerelease deletes a lock whoever holds it and tells waiters.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  release channel
-- ARGV[2]  message: the lock's key
--
-- Reply: 1 deleted, 0 the lock was free.
if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
