// Package redistest is the conformance harness of redislock for dislock's
// tests, over any kind of Redis client (a single node, Sentinel, Cluster).
// It reads and changes lock records with plain Redis commands on the key
// and record layout redislock documents, as another process or an operator
// would.
package redistest

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/redislock"
)

var keyEscaper = strings.NewReplacer("%", "%25", "}", "%7D")

// LockKey is the Redis key of lock key under prefix (redislock's documented
// layout: "<prefix>:{<key>}", with % and } escaped).
func LockKey(prefix, key string) string {
	return prefix + ":{" + keyEscaper.Replace(key) + "}"
}

// steal makes a held lock another owner's, with the next token, keeping the
// TTL: the record is "<flags>|<token>|<acquired>|<owner token>|<owner>"
// (redislock's documented layout); a tombstone ("<flags>|<token>") is left.
var steal = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local f, at = {}, 1
while #f < 4 do
  local bar = string.find(v, '|', at, true)
  if not bar then return 0 end
  f[#f + 1] = string.sub(v, at, bar - 1)
  at = bar + 1
end
local tok = string.format('%.0f', tonumber(f[2]) + 1)
redis.call('SET', KEYS[1], f[1] .. '|' .. tok .. '|' .. f[3] .. '|stolen|thief', 'KEEPTTL')
return 1
`)

// Steal makes the lock of key under prefix, when held, another owner's
// (owner token "stolen", owner "thief", next token); it keeps the TTL. It
// reports whether the lock was held.
func Steal(ctx context.Context, c redis.UniversalClient, prefix, key string) (bool, error) {
	n, err := steal.Run(ctx, c, []string{LockKey(prefix, key)}).Int()
	return n == 1, err
}

// Dial is a client's dialer (the Dialer of go-redis's options); nil is
// go-redis's own.
type Dial = func(ctx context.Context, network, addr string) (net.Conn, error)

// Clients returns a newClient for Harness: each call makes a client with
// mk, which dials with dial, closed when the test that asked for it ends.
func Clients[C redis.UniversalClient](mk func(dial Dial) C) func(t testing.TB, dial Dial) redis.UniversalClient {
	return func(t testing.TB, dial Dial) redis.UniversalClient {
		c := mk(dial)
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// Harness is the conformance harness of redislock, under prefix, over
// clients made by newClient, each acting as a separate process; Steal and
// Delete act through admin. keyPrefix is the harness's KeyPrefix. Its
// Stall makes a client whose connections go through a
// testenv.StallDialer.
func Harness(keyPrefix, prefix string, admin redis.UniversalClient, newClient func(t testing.TB, dial Dial) redis.UniversalClient) locktest.Harness {
	newBackend := func(t testing.TB, dial Dial) core.Backend {
		b, err := redislock.NewBackend(newClient(t, dial), redislock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return locktest.Harness{
		NewBackend: func(t testing.TB) core.Backend { return newBackend(t, nil) },
		Stall: func(t testing.TB) (core.Backend, func(), func()) {
			d := testenv.NewStallDialer(t)
			return newBackend(t, d.Dial), d.Stall, d.Resume
		},
		Steal: func(ctx context.Context, key string) error {
			_, err := Steal(ctx, admin, prefix, key)
			return err
		},
		Delete: func(ctx context.Context, key string) error {
			return admin.Del(ctx, LockKey(prefix, key)).Err()
		},
		KeyPrefix: keyPrefix,
	}
}

// ClusterPort returns a loopback port that is free now, and whose Cluster
// bus port (port + 10000) is free too: a port for a private Cluster node.
func ClusterPort(t testing.TB) int {
	t.Helper()
	for range 100 {
		port := testenv.FreePort(t)
		if port+10000 > 65535 {
			continue
		}
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free port pair for a Cluster node")
	return 0
}
