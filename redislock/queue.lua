-- queue.lua: a key's FIFO queue of waiters, shared by every script (after
-- record.lua). Two keys in the lock's hash slot:
--
--   q   a sorted set: waiter id -> place (1, 2, ... in arrival order)
--   qd  a hash: waiter id -> deadline, Unix ms on the server clock
--
-- Both carry a PEXPIRE at least as long as the latest deadline, so an
-- abandoned queue vanishes by itself. A waiter whose deadline passed is
-- dropped by whoever finds it at the head.
--
-- The functions are made on first use (queue_ops), so that a script that
-- does not look at the queue does not pay for building them.

local queue_ops_made

local function queue_ops()
  if queue_ops_made then
    return queue_ops_made
  end
  local ops = {}
  -- head returns the first live waiter, or false when there is none,
  -- dropping the expired waiters ahead of it.
  ops.head = function(q, qd, now)
    while true do
      local h = redis.call('ZRANGE', q, 0, 0)[1]
      if not h then
        return false
      end
      local d = tonumber(redis.call('HGET', qd, h))
      if d and d > now then
        return h
      end
      redis.call('ZREM', q, h)
      redis.call('HDEL', qd, h)
    end
  end

  -- push puts w at the tail, or keeps its place, and sets its deadline to
  -- now + ttl (ms).
  ops.push = function(q, qd, w, now, ttl)
    if not redis.call('ZSCORE', q, w) then
      local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')[2]
      local place = 1
      if last then
        place = tonumber(last) + 1
      end
      redis.call('ZADD', q, place, w)
    end
    redis.call('HSET', qd, w, fmt_int(now + ttl))
    if redis.call('PTTL', q) < ttl then
      redis.call('PEXPIRE', q, ttl)
      redis.call('PEXPIRE', qd, ttl)
    end
  end

  -- remove takes w out of the queue.
  ops.remove = function(q, qd, w)
    redis.call('ZREM', q, w)
    redis.call('HDEL', qd, w)
  end

  -- any tells whether anyone, live or not yet dropped, is queued.
  ops.any = function(q)
    return redis.call('ZCARD', q) > 0
  end

  -- turn is what the release channel carries for a turn: the lock's
  -- key, NUL, the waiter whose turn it is (keys never contain NUL).
  ops.turn = function(key, w)
    return key .. '\0' .. w
  end

  queue_ops_made = ops
  return ops
end
