package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core/locktest"
	"github.com/dislock/dislock/internal/redistest"
	"github.com/dislock/dislock/internal/testenv"
)

// harness is the conformance harness over clients made by newClient, each
// acting as a separate process. Steal and Delete act with plain Redis
// commands on the documented layout, as another process or an operator
// would.
func harness(t *testing.T, prefix string, newClient func(t testing.TB, dial redistest.Dial) redis.UniversalClient) locktest.Harness {
	return redistest.Harness("redislock:", prefix, newClient(t, nil), newClient)
}

func TestConformanceRedis(t *testing.T) {
	t.Parallel() // each suite has its own keys; the suites mostly wait on timers
	opt, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Name("dislocktest-")
	locktest.Run(t, harness(t, prefix, redistest.Clients(func(dial redistest.Dial) *redis.Client {
		o := *opt
		o.Dialer = dial
		return redis.NewClient(&o)
	})))
}

func TestConformanceMiniredis(t *testing.T) {
	t.Parallel() // each suite has its own keys; the suites mostly wait on timers
	m := newMiniredis(t)
	prefix := testenv.Name("dislocktest-")
	locktest.Run(t, harness(t, prefix, redistest.Clients(func(dial redistest.Dial) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: m.Addr(), Dialer: dial})
	})))
}

// TestCluster runs against a 3-master Redis Cluster (see clusterAddrs).
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	addrs := clusterAddrs(t)
	newClient := redistest.Clients(func(dial redistest.Dial) *redis.ClusterClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Dialer: dial})
	})
	t.Run("Conformance", func(t *testing.T) {
		h := harness(t, testenv.Name("dislocktest-"), newClient)
		h.TTL = time.Second
		locktest.Run(t, h)
	})
	t.Run("ScriptFlush", func(t *testing.T) {
		c := newClient(t, nil).(*redis.ClusterClient)
		testScriptFlush(t, c, func(ctx context.Context) error {
			return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				return n.ScriptFlush(ctx).Err()
			})
		})
	})
	t.Run("Semaphores", func(t *testing.T) { testSemaphoreCluster(t, newClient(t, nil)) })
	t.Run("OddKeys", func(t *testing.T) {
		c := newClient(t, nil)
		testOddKeys(t, c, func(key string) int64 {
			n, err := c.ClusterKeySlot(context.Background(), key).Result()
			if err != nil {
				t.Fatal(err)
			}
			return n
		})
	})
}
