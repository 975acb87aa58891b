package redislock

import (
	"strings"

	"github.com/dislock/dislock/core"
)

// Key layout. Lock key k under prefix p is stored as
//
//	p:{esc(k)}     the lock record, a string (record.lua): the holder, or
//	               a tombstone with the last fencing token
//	p:{esc(k)}:q   the queue of waiters, a sorted set (queue.lua)
//	p:{esc(k)}:qd  the waiters' deadlines, a hash
//
// esc replaces "%" with "%25" and "}" with "%7D", so the hash tag (the text
// between the first "{" and the first "}" after it) is always exactly esc(k):
// non-empty, and the same for all keys of one lock, which therefore share a
// Cluster slot whatever bytes k holds. The prefix may contain neither brace.

var (
	escaper   = strings.NewReplacer("%", "%25", "}", "%7D")
	unescaper = strings.NewReplacer("%25", "%", "%7D", "}")
	globber   = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)
)

const (
	queueSuffix     = ":q"
	deadlinesSuffix = queueSuffix + "d" // keys counts on the queue's suffix being its prefix
)

func escapeKey(key string) string {
	if !strings.ContainsAny(key, "%}") {
		return key
	}
	return escaper.Replace(key)
}

// lockKey is the Redis key of the lock record.
func (b *Backend) lockKey(key string) string {
	return b.prefix + ":{" + escapeKey(key) + "}"
}

// keys returns the Redis keys of key: its lock record, its waiter queue and
// the waiters' deadlines, in the order the scripts take them. Each is a
// prefix of the next, so the three share one string.
func (b *Backend) keys(key string) []string {
	d := b.prefix + ":{" + escapeKey(key) + "}" + deadlinesSuffix
	n := len(d) - len(deadlinesSuffix)
	return []string{d[:n], d[:n+len(queueSuffix)], d}
}

// userKey recovers the lock key from a Redis key of a lock record; ok is
// false for any other Redis key.
func (b *Backend) userKey(redisKey string) (string, bool) {
	head := b.prefix + ":{"
	if !strings.HasPrefix(redisKey, head) || !strings.HasSuffix(redisKey, "}") {
		return "", false
	}
	esc := redisKey[len(head) : len(redisKey)-1]
	if esc == "" || strings.Contains(esc, "}") {
		return "", false
	}
	key := unescaper.Replace(esc)
	if escapeKey(key) != esc || core.ValidateKey(key) != nil {
		return "", false
	}
	return key, true
}

// scanPattern is the SCAN MATCH pattern for lock records whose key starts
// with keyPrefix.
func (b *Backend) scanPattern(keyPrefix string) string {
	return globber.Replace(b.prefix+":{"+escapeKey(keyPrefix)) + "*}"
}

// hashSlot is the Redis Cluster slot of a key whose hash tag is tag.
func hashSlot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for j := 0; j < 8; j++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) & 16383
}
