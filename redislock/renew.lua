-- renew extends every lock in KEYS that its owner token still holds.
--
-- KEYS[i]      a lock record (all in one hash slot on Redis Cluster)
-- ARGV[2i-1]   the owner token expected in KEYS[i]
-- ARGV[2i]     the new TTL of KEYS[i] in milliseconds
--
-- Reply: one integer per key, 1 when renewed, 0 when the lock is free, gone
-- or held by another owner token.
local res = {}
for i = 1, #KEYS do
  if rec_held_by(redis.call('GET', KEYS[i]), ARGV[2 * i - 1]) then
    res[i] = redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
  else
    res[i] = 0
  end
end
return res
