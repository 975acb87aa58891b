package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/redislock"
)

// harness builds a locktest harness over clients made by newClient, each
// acting as a separate process. Steal and Delete act with plain Redis
// commands, as another process or an operator would.
func harness(t *testing.T, prefix string, newClient func(t testing.TB) redis.UniversalClient) locktest.Harness {
	admin := newClient(t)
	// The key layout is the backend's: ask it for the Redis key.
	lockKey := func(key string) string { return redislock.LockKey(prefix, key) }
	return locktest.Harness{
		NewBackend: func(t testing.TB) core.Backend {
			b, err := redislock.NewBackend(newClient(t), redislock.WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Steal: func(ctx context.Context, key string) error {
			k := lockKey(key)
			n, err := admin.Exists(ctx, k).Result()
			if err != nil || n == 0 {
				return err
			}
			_, err = admin.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.HIncrBy(ctx, k, "token", 1)
				p.HSet(ctx, k, "otoken", "stolen", "owner", "thief")
				return nil
			})
			return err
		},
		Delete: func(ctx context.Context, key string) error {
			return admin.Del(ctx, lockKey(key)).Err()
		},
		KeyPrefix: "redislock:",
	}
}

func TestConformanceRedis(t *testing.T) {
	opt, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Name("dislocktest-")
	locktest.Run(t, harness(t, prefix, func(t testing.TB) redis.UniversalClient {
		c := redis.NewClient(opt)
		t.Cleanup(func() { c.Close() })
		return c
	}))
}

func TestConformanceMiniredis(t *testing.T) {
	m := newMiniredis(t)
	prefix := testenv.Name("dislocktest-")
	locktest.Run(t, harness(t, prefix, func(t testing.TB) redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { c.Close() })
		return c
	}))
}

func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	addrs := clusterAddrs(t)
	prefix := testenv.Name("dislocktest-")
	h := harness(t, prefix, func(t testing.TB) redis.UniversalClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { c.Close() })
		return c
	})
	h.TTL = time.Second
	locktest.Run(t, h)
}
