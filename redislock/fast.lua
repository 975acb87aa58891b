-- fast.lua: the common claim, losing try and release, shared by
-- acquire.lua, release.lua and batch.lua (scripts.go puts this file before
-- each of them). Each takes the record v its caller read with GET, and
-- returns the script's reply, or nil when the general path must decide.
-- They come before the prelude (record.lua, queue.lua), whose functions
-- cost the server more to define than this work does, and take the record
-- apart with one match each, since every Lua operation costs the server
-- about as much as a small command.

-- clock returns the server's TIME as microseconds in decimal digits, and
-- TIME's reply.
local function clock()
  local t = redis.call('TIME')
  local us = t[2]
  if #us < 6 then
    us = string.sub('00000', #us) .. us
  end
  return t[1] .. us, t
end

-- fast_claim claims lock key k (its queue at kq) for owner token ot and
-- owner, for ttl milliseconds, when nobody holds it or waits for it: a
-- tombstone with no flags, or no record and no queue. now is clock()'s.
-- The fencing token is now, or the tombstone's + 1 when that is not below
-- now, and the reply formats no number: now's digits alone, or
-- {1, token, now}.
local function fast_claim(k, kq, v, ot, owner, ttl, now)
  local last = v and string.match(v, '^0|(%d+)$')
  if not last and (v or redis.call('EXISTS', kq) == 1) then
    return nil
  end
  -- Both are decimal digits without leading zeros.
  if last and (#last > #now or #last == #now and last >= now) then
    local token = string.format('%d', tonumber(last) + 1)
    redis.call('SET', k, '0|' .. token .. '|' .. now .. '|' .. ot .. '|' .. owner, 'PX', ttl)
    return {1, token, now}
  end
  redis.call('SET', k, '0|' .. now .. '|' .. now .. '|' .. ot .. '|' .. owner, 'PX', ttl)
  return now
end

-- fast_busy answers a try (no waiter id) by owner token ot that loses to a
-- holder whose record is flagged to publish its release already: it writes
-- nothing. t is TIME's reply.
local function fast_busy(k, v, ot, t)
  local token, acq, otoken, owner = string.match(v, '^[13]|(%d+)|(%d+)|([^|]*)|(.*)$')
  if otoken and otoken ~= ot then
    return {0, token, acq, redis.call('PTTL', k), t[1], t[2], owner}
  end
  return nil
end

-- release_names returns the release channel and the lock's key, read from
-- the record's Redis key lk, "<prefix>:{<k'>}" (keys.go): the prefix has no
-- braces, and k' is the key with "%" written "%25" and "}" written "%7D".
local function release_names(lk)
  local i = string.find(lk, '{', 1, true)
  local k = string.gsub(string.sub(lk, i + 1, -2), '%%7D', '}')
  return string.sub(lk, 1, i - 2) .. ':released', (string.gsub(k, '%%25', '%%'))
end

-- fast_release frees the lease of owner token ot and fencing token token
-- at k when nobody waits in its queue (flags 0, or REC_NOTIFY alone): SET
-- of the tombstone, keeping the TTL, and PUBLISH when someone was answered
-- busy. It returns 1.
local function fast_release(k, v, ot, token)
  local f, tok, otoken = string.match(v, '^([01])|(%d+)|%d+|([^|]*)|')
  if tok ~= token or otoken ~= ot then
    return nil
  end
  redis.call('SET', k, '0|' .. tok, 'KEEPTTL', 'XX')
  if f == '1' then
    redis.call('PUBLISH', release_names(k))
  end
  return 1
end
