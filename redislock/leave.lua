-- leave takes a waiter out of a key's queue.
--
-- KEYS[1]  the lock record
-- KEYS[2]  the key's waiter queue, KEYS[3] its deadlines
-- ARGV[1]  the waiter id
-- ARGV[2]  release channel
-- ARGV[3]  the lock's key
--
-- Reply: 1 it was queued, 0 it was not. When it was the first live waiter
-- and the key is free, the next live waiter is told its turn.
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
local now = server_time()
local head = queue_ops().head(KEYS[2], KEYS[3], now)
queue_ops().remove(KEYS[2], KEYS[3], ARGV[1])
if head == ARGV[1] then
  local r = rec_parse(redis.call('GET', KEYS[1]))
  if not r or not r.held then
    local nxt = queue_ops().head(KEYS[2], KEYS[3], now)
    if nxt then
      redis.call('PUBLISH', ARGV[2], queue_ops().turn(ARGV[3], nxt))
    end
  end
end
return 1
