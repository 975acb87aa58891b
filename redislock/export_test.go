package redislock

// LockKey is the Redis key of the lock hash of key under prefix.
func LockKey(prefix, key string) string {
	return (&Backend{prefix: prefix}).lockKey(key)
}

// HashSlot exposes hashSlot to tests.
var HashSlot = hashSlot

// AcquireSHA is the SHA1 of the acquire script.
var AcquireSHA = acquireScript.sha
