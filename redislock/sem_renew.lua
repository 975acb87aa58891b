-- sem_renew extends every permit in the batch that its owner token still
-- holds.
--
-- KEYS[2i-1]  Z of permit i, KEYS[2i]  its H (one hash slot on Cluster)
-- ARGV[2i-1]  the owner token of permit i
-- ARGV[2i]    its new TTL in milliseconds
--
-- Reply: one integer per permit, 1 when renewed, 0 when it expired, was
-- released or forced out, or the key holds something else.
local nowms = server_time()
local res = {}
local extended = {}
for i = 1, #KEYS / 2 do
  local z, h, tok, ttl = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local s = redis.pcall('ZSCORE', z, tok)
  if type(s) == 'string' and tonumber(s) > nowms then
    redis.call('ZADD', z, 'XX', fmt_int(nowms + ttl), tok)
    if (extended[z] or 0) < ttl then
      sem_extend(z, h, ttl)
      extended[z] = ttl
    end
    res[i] = 1
  else
    res[i] = 0
  end
end
return res
