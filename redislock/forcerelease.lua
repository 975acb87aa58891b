-- forcerelease frees a lock whoever holds it and tells waiters.
--
-- KEYS[1]  the lock record
-- KEYS[2]  the key's waiter queue, KEYS[3] its deadlines
-- ARGV[1]  release channel
-- ARGV[2]  the lock's key
--
-- Reply: 1 freed, 0 the lock was free. The tombstone keeps the fencing
-- counter; the first live waiter is told its turn, or, with nobody queued,
-- the plain release message goes out.
local r = rec_parse(redis.call('GET', KEYS[1]))
if not r or not r.held then
  return 0
end
local head = false
if rec_has(r.flags, REC_QUEUED) then
  head = queue_ops().head(KEYS[2], KEYS[3], (server_time()))
end
if head then
  redis.call('SET', KEYS[1], rec_free(REC_QUEUED, r.token), 'KEEPTTL', 'XX')
  redis.call('PUBLISH', ARGV[1], queue_ops().turn(ARGV[2], head))
else
  redis.call('SET', KEYS[1], rec_free(0, r.token), 'KEEPTTL', 'XX')
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return 1
