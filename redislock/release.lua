-- release gives up a lock held by an owner token.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  the owner token expected in KEYS[1]
-- ARGV[2]  keep in milliseconds: "0" deletes the lock; more keeps it held
--          until the server's now + keep (min hold)
-- ARGV[3]  release channel
-- ARGV[4]  message: the lock's key
--
-- Reply: 1 deleted (and published), 2 kept, 0 not held by this owner token
-- (already released, expired or taken over: nothing to do).
if redis.call('HGET', KEYS[1], 'otoken') ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 2
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
