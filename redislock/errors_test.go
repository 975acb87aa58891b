package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/redislock"
)

// lockerAt is a Locker with the default prefix on a client of its own made
// with opts; both are closed when the test ends.
func lockerAt(t *testing.T, opts *redis.Options) *core.Client {
	t.Helper()
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	return newLocker(t, rdb, redislock.DefaultPrefix)
}

// Rule: errors carry one prefix per layer: core's "dislock: redis: acquire
// "k": " (or release, or the store clock) wraps the driver's error, and the
// backend adds no "redislock:" layer of its own.
func TestErrorPrefixOnce(t *testing.T) {
	l := lockerAt(t, &redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	ctx := context.Background()
	for _, opts := range [][]core.Option{{core.TTL(time.Second)}, {core.ForSlot(core.Every(time.Hour))}} {
		_, err := l.TryAcquire(ctx, "prefix-once", opts...)
		if err == nil {
			t.Fatal("acquired on an unreachable server")
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, `dislock: redis: `) || strings.Count(msg, "redis") != 1 || strings.Count(msg, "dislock") != 1 {
			t.Errorf("error %q: want one dislock: redis: prefix and no other layer naming the backend", msg)
		}
	}
}

// Rule: a server that wants a password the client did not send is named
// as such: "authentication required", not the server's "ERR Protocol
// error: unauthenticated multibulk length" (what it answers a script call
// from a client that has not authenticated), and never busy; the password
// itself appears in no message.
func TestAuthenticationRequiredIsNamed(t *testing.T) {
	t.Parallel()
	const password = "s3cret-pw"
	p := startPrivateRedis(t, "--requirepass", password)
	for _, c := range []struct {
		name string
		opts redis.Options
		want string
	}{
		{"no password", redis.Options{}, "authentication required"},
		{"no password, RESP2", redis.Options{Protocol: 2}, "authentication required"},
		{"wrong password", redis.Options{Password: "not-" + password}, "WRONGPASS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Addr = p.Addr()
			l := lockerAt(t, &c.opts)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			for _, opts := range [][]core.Option{nil, {core.ForSlot(core.Every(time.Hour))}, {core.Limit(2)}} {
				_, err := l.TryAcquire(ctx, "auth", opts...)
				if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, core.ErrNotAcquired) || strings.Contains(err.Error(), password) {
					t.Errorf("%v: TryAcquire = %v, want %q", opts, err, c.want)
				}
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("%v to fail, want at once", took)
			}
		})
	}
	// With the password it works.
	s, err := lockerAt(t, &redis.Options{Addr: p.Addr(), Password: password}).TryAcquire(context.Background(), "auth")
	if err != nil {
		t.Fatal(err)
	}
	s.Release(context.Background())
}

// Rule: with a caller's default client (go-redis's default retries), a
// refused connection fails an acquisition in about what one attempt's
// dials cost (DialerRetries: five dials 100 ms apart), not after go-redis's
// MaxRetries further attempts and an undo of a claim that never left, and
// its error names the refusal and is never busy.
func TestConnectionRefusedFailsFast(t *testing.T) {
	l := lockerAt(t, &redis.Options{Addr: "127.0.0.1:1"})
	for _, c := range []struct {
		name string
		opts []core.Option
	}{{"lock", nil}, {"semaphore", []core.Option{core.Limit(2)}}, {"slot", []core.Option{core.ForSlot(core.Every(time.Hour))}}} {
		start := time.Now()
		_, err := l.TryAcquire(context.Background(), "refused", c.opts...) // no deadline
		took := time.Since(start)
		t.Logf("%s: %v: %v", c.name, took, err)
		if err == nil || errors.Is(err, core.ErrNotAcquired) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("%s: TryAcquire = %v, want the refused connection, not busy", c.name, err)
		}
		if took > time.Second {
			t.Errorf("%s: %v to fail on a refused connection, want about 0.4 s", c.name, took)
		}
	}
}
