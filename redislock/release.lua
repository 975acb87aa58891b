-- release gives up a lock held by an owner token.
--
-- KEYS[1]  the lock record
-- KEYS[2]  the key's waiter queue, KEYS[3] its deadlines
-- ARGV[1]  the owner token expected in KEYS[1]
-- ARGV[2]  the lease's fencing token when the caller knows it, or ""
-- ARGV[3]  keep in milliseconds, absent (or "0") to free the lock; more
--          keeps it held until the server's now + keep (min hold)
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
-- checked with one match: GET, then SET (and PUBLISH when someone was
-- answered busy). The release channel hears of it only when
-- the record says someone waits.

local v = redis.call('GET', KEYS[1])
if v and not ARGV[3] then
  local r = fast_release(KEYS[1], v, ARGV[1], ARGV[2])
  if r then
    return r
  end
end
--@prelude

local keep = tonumber(ARGV[3] or '0')
-- Only a value that names this owner token is parsed: anything else is
-- not this lease's, whatever it is.
if not rec_held_by(v, ARGV[1]) then
  return 0
end
local r = rec_parse(v)
if not r.held or r.otoken ~= ARGV[1] or (ARGV[2] ~= '' and r.token ~= ARGV[2]) then
  return 0
end
if keep > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 2
end

if rec_has(r.flags, REC_QUEUED) then
  local head = queue_ops().head(KEYS[2], KEYS[3], (server_time()))
  if head then
    redis.call('SET', KEYS[1], rec_free(REC_QUEUED, r.token), 'KEEPTTL', 'XX')
    local channel, key = release_names(KEYS[1])
    redis.call('PUBLISH', channel, queue_ops().turn(key, head))
    return 1
  end
end
redis.call('SET', KEYS[1], rec_free(0, r.token), 'KEEPTTL', 'XX')
if rec_has(r.flags, REC_NOTIFY) then
  redis.call('PUBLISH', release_names(KEYS[1]))
end
return 1
