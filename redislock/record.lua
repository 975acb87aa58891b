-- record.lua: the lock record, shared by every script (scripts.go puts this
-- file, then queue.lua, in front of each script's own source).
--
-- A lock is one string at its lock key:
--
--   held  "<flags>|<token>|<acquired_us>|<otoken>|<owner>"  PX the lease
--   free  "<flags>|<token>"  a tombstone: the last fencing token, kept for
--         the rest of the released lease's TTL (KEEPTTL), so the next claim
--         continues the per-key counter even if the server clock stepped
--         back
--
-- A write that keeps the record's TTL (KEEPTTL) says XX too: the script
-- read the key just before, so on Redis, whose scripts see no key expire
-- while they run, it is there; a server whose keys can expire in the middle
-- of a script (miniredis) would otherwise bring the key back with no TTL,
-- held for ever.
--
-- flags is one digit, the sum of REC_NOTIFY (someone was answered
-- busy: the release publishes the key) and REC_QUEUED (the key's waiter
-- queue may hold waiters: the release, and a claim, look at it). A
-- missing key is free with flags 0 and no last token. The owner token never
-- contains "|" (the backend checks), the owner may.
local REC_NOTIFY = 1
local REC_QUEUED = 2

local function rec_has(flags, bit)
  return math.floor(flags / bit) % 2 == 1
end

local function rec_with(flags, bit)
  if rec_has(flags, bit) then
    return flags
  end
  return flags + bit
end

-- rec_parse reads a record: nil for a missing key, else a table with flags,
-- token (a string of digits) and, when held, held = true, acq, otoken and
-- owner. flags is one digit, so the fields start at byte 3.
local function rec_parse(v)
  if not v then
    return nil
  end
  local flags = string.byte(v, 1) - 48
  local b = string.find(v, '|', 3, true)
  if flags < 0 or flags > 9 or string.byte(v, 2) ~= 124 then
    error('dislock: unexpected value at a lock key')
  end
  if not b then
    return {flags = flags, token = string.sub(v, 3)}
  end
  local c = string.find(v, '|', b + 1, true)
  local d = c and string.find(v, '|', c + 1, true)
  if not d then
    error('dislock: unexpected value at a lock key')
  end
  return {
    held = true, flags = flags,
    token = string.sub(v, 3, b - 1),
    acq = string.sub(v, b + 1, c - 1),
    otoken = string.sub(v, c + 1, d - 1),
    owner = string.sub(v, d + 1),
  }
end

-- rec_held_by tells whether v is a record held by owner token ot, without
-- taking it apart (renew checks many).
local function rec_held_by(v, ot)
  if not v then
    return false
  end
  local b = string.find(v, '|', 3, true)
  local c = b and string.find(v, '|', b + 1, true)
  if not c then
    return false
  end
  local e = c + #ot + 1
  return string.byte(v, e) == 124 and string.sub(v, c + 1, e - 1) == ot
end

-- rec_reflag is the record v with other flags.
local function rec_reflag(v, flags)
  return flags .. string.sub(v, 2)
end

local function rec_held(flags, token, acq, otoken, owner)
  return flags .. '|' .. token .. '|' .. acq .. '|' .. otoken .. '|' .. owner
end

local function rec_free(flags, token)
  return flags .. '|' .. token
end

-- server_time returns the server clock in ms and µs, and the TIME reply,
-- read now or passed as t.
local function server_time(t)
  t = t or redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us, t
end

-- fmt_int formats an integer-valued number without exponent.
local function fmt_int(n)
  return string.format('%.0f', n)
end
