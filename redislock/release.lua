-- release gives up a lock held by an owner token.
--
-- KEYS[1]  the lock record
-- KEYS[2]  the key's waiter queue, KEYS[3] its deadlines
-- ARGV[1]  the owner token expected in KEYS[1]
-- ARGV[2]  keep in milliseconds: "0" frees the lock; more keeps it held
--          until the server's now + keep (min hold)
-- ARGV[3]  release channel
-- ARGV[4]  the lock's key
-- ARGV[5]  the lease's fencing token when the caller knows it, or ""
--
-- Reply: 1 freed, 2 kept, 0 not held by this owner token (already
-- released, expired, taken over, or a value that is no lock record:
-- nothing was changed; the backend answers core.Gone).
--
-- Freeing writes the tombstone (record.lua) over the lease, keeping its
-- TTL. The record is read first and written only when it is this lease's:
-- a value that is not (another owner's record, a tombstone, or something
-- that is no dislock record at all) is never touched. With the token known
-- the common release comes first, before the prelude (scripts.go), and is
-- checked without taking the record apart: GET, then SET (and PUBLISH when
-- someone was answered busy). The release channel hears of it only when
-- the record says someone waits.
local v = redis.call('GET', KEYS[1])
if ARGV[2] == '0' and ARGV[5] ~= '' and v and string.byte(v, 2) == 124 then
  -- This lease's, and nobody queued (flags 0, or REC_NOTIFY alone).
  local f, n = string.byte(v, 1), #ARGV[5]
  local b = 3 + n
  if (f == 48 or f == 49) and string.byte(v, b) == 124 and string.sub(v, 3, b - 1) == ARGV[5] then
    local c = string.find(v, '|', b + 1, true)
    local e = c and c + #ARGV[1] + 1
    if e and string.byte(v, e) == 124 and string.sub(v, c + 1, e - 1) == ARGV[1] then
      redis.call('SET', KEYS[1], '0|' .. ARGV[5], 'KEEPTTL', 'XX')
      if f == 49 then
        redis.call('PUBLISH', ARGV[3], ARGV[4])
      end
      return 1
    end
  end
end
--@prelude

local keep = tonumber(ARGV[2])
-- Only a value that names this owner token is parsed: anything else is
-- not this lease's, whatever it is.
if not rec_held_by(v, ARGV[1]) then
  return 0
end
local r = rec_parse(v)
if not r.held or r.otoken ~= ARGV[1] or (ARGV[5] ~= '' and r.token ~= ARGV[5]) then
  return 0
end
if keep > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 2
end

if rec_has(r.flags, REC_QUEUED) then
  local head = queue_ops().head(KEYS[2], KEYS[3], (server_time()))
  if head then
    redis.call('SET', KEYS[1], rec_free(REC_QUEUED, r.token), 'KEEPTTL', 'XX')
    redis.call('PUBLISH', ARGV[3], queue_ops().turn(ARGV[4], head))
    return 1
  end
end
redis.call('SET', KEYS[1], rec_free(0, r.token), 'KEEPTTL', 'XX')
if rec_has(r.flags, REC_NOTIFY) then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return 1
