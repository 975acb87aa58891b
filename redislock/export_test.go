package redislock

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// LockKey is the Redis key of the lock record of key under prefix.
func LockKey(prefix, key string) string {
	return (&Backend{prefix: prefix}).lockKey(key)
}

// QueueKeys are the Redis keys of key's waiter queue and deadlines.
func QueueKeys(prefix, key string) (queue, deadlines string) {
	k := (&Backend{prefix: prefix}).keys(key)
	return k[1], k[2]
}

// HashSlot exposes hashSlot to tests.
var HashSlot = hashSlot

// AcquireSHA is the SHA1 of the acquire script.
var AcquireSHA = acquireScript.sha

var stealScript = newScript(`
local v = redis.call('GET', KEYS[1])
local r = rec_parse(v)
if not r or not r.held then
  return 0
end
redis.call('SET', KEYS[1], rec_held(r.flags, fmt_int(tonumber(r.token) + 1), r.acq, ARGV[1], ARGV[2]), 'KEEPTTL')
return 1
`)

// Steal makes the lock of key, when held, another owner's (owner token
// "stolen", owner "thief", next token), as another process or an operator
// could; it keeps the TTL. It reports whether the key was held.
func Steal(ctx context.Context, c redis.UniversalClient, prefix, key string) (bool, error) {
	n, err := stealScript.run(ctx, c, []string{LockKey(prefix, key)}, "stolen", "thief").Int()
	return n == 1, err
}
