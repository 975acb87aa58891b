-- batch runs the claims and releases of a batch of calls (lane.go) in one
-- script call, each as fast.lua's common case: one TIME for all, and one
-- script call's cost on the server for the batch instead of one per call.
--
-- KEYS[2i-1], KEYS[2i]  call i's lock record and its waiter queue
-- ARGV[1]   the calls' kinds, a letter each: "c" a plain claim (acquire.lua
--           with ARGV[1] to ARGV[3]), "r" a release whose lease's token is
--           known (release.lua with ARGV[1], ARGV[2])
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]  call i's: a claim's owner token, owner
--           and TTL in milliseconds; a release's owner token and fencing
--           token, then ""
--
-- Reply: per call, the reply acquire.lua or release.lua would give, or
-- nil where fast.lua leaves it to the general path (or the key holds no
-- string): that call is then sent on its own script.
local now, t = clock()
local kinds = ARGV[1]
local out = {}
for i = 1, #kinds do
  local k = KEYS[2 * i - 1]
  local ot, a, b = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local v = redis.pcall('GET', k)
  local r = false
  if type(v) ~= 'table' then -- not an error (a key of another type)
    if string.byte(kinds, i) == 99 then -- "c"
      r = fast_claim(k, KEYS[2 * i], v, ot, a, b, now) or v and fast_busy(k, v, ot, t) or false
    elseif v then
      r = fast_release(k, v, ot, a) or false
    end
  end
  out[i] = r
end
return out
