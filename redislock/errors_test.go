package redislock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/redislock"
)

// Rule: errors carry one prefix per layer: core's "dislock: redis: acquire
// "k": " (or release, or the store clock) wraps the driver's error, and the
// backend adds no "redislock:" layer of its own.
func TestErrorPrefixOnce(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	l, err := redislock.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for _, opts := range [][]core.Option{{core.TTL(time.Second)}, {core.ForSlot(core.Every(time.Hour))}} {
		_, err = l.TryAcquire(ctx, "prefix-once", opts...)
		if err == nil {
			t.Fatal("acquired on an unreachable server")
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, `dislock: redis: `) || strings.Count(msg, "redis") != 1 || strings.Count(msg, "dislock") != 1 {
			t.Errorf("error %q: want one dislock: redis: prefix and no other layer naming the backend", msg)
		}
	}
}
