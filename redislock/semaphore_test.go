package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/benchtest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/redislock"
)

// semClients returns n Redis clients on the shared server, each acting as
// a separate process, and a fresh prefix.
func semClients(t *testing.T, n int) ([]redis.UniversalClient, string) {
	t.Helper()
	cs := make([]redis.UniversalClient, n)
	for i := range cs {
		cs[i] = sharedRedis(t)
	}
	return cs, testenv.Name("dislocktest-sem-")
}

func acq(key, otoken string, limit int, ttl time.Duration) core.AcquireRequest {
	return core.AcquireRequest{Key: key, Owner: "owner-" + otoken, OwnerToken: otoken, TTL: ttl, Limit: limit}
}

// Rule: a mutex lease whose key now holds a semaphore (it was forced free
// and claimed as one) is reported gone by Renew without failing the other
// leases of the batch; its Release changes nothing and says so (Gone); and
// a Release without Limit
// (core's undo of a claim in doubt) frees a permit by its owner token.
func TestSemaphoreMutexLeaseOnSemaphoreKey(t *testing.T) {
	cs, prefix := semClients(t, 1)
	b := newBackend(t, cs[0], prefix)
	ctx := testenv.Context(t, 10*time.Second)
	for _, k := range []string{"mx/a", "mx/b", "mx/c"} {
		if _, err := b.TryAcquire(ctx, acq(k, "m-"+k, 0, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := b.ForceRelease(ctx, "mx/b"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := b.TryAcquire(ctx, acq("mx/b", "p", 3, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	res, err := b.Renew(ctx, []core.RenewRequest{
		{Key: "mx/a", OwnerToken: "m-mx/a", TTL: 10 * time.Second},
		{Key: "mx/b", OwnerToken: "m-mx/b", TTL: 10 * time.Second},
		{Key: "mx/c", OwnerToken: "m-mx/c", TTL: 10 * time.Second},
		{Key: "mx/b", OwnerToken: "p", TTL: 10 * time.Second, Limit: 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != nil || !errors.Is(res[1], core.ErrLeaseGone) || res[2] != nil || res[3] != nil {
		t.Fatalf("renew: %v", res)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "mx/b", OwnerToken: "m-mx/b"}); !errors.Is(err, core.ErrLeaseGone) {
		t.Fatalf("release of a mutex lease on a semaphore key = %v, want ErrLeaseGone", err)
	}
	if hs, _ := b.Holders(ctx, "mx/b"); len(hs) != 1 {
		t.Fatalf("holders %+v", hs)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "mx/b", OwnerToken: "p"}); err != nil {
		t.Fatalf("release of a permit without Limit: %v", err)
	}
	if hs, _ := b.Holders(ctx, "mx/b"); len(hs) != 0 {
		t.Fatalf("holders after release %+v", hs)
	}
}

// Rule: renewing 1,000 permits (of one key and of many, mixed with mutex
// leases) is one Renew call and one round trip; min hold keeps a permit.
func TestSemaphoreRenew1000OneRoundTrip(t *testing.T) {
	p := startPrivateRedis(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	hook := &countHook{}
	c.AddHook(hook)
	b := newBackend(t, c, "sem1000")
	ctx := testenv.Context(t, 30*time.Second)
	var reqs []core.RenewRequest
	for i := range 1000 {
		key, limit := "one", 1000
		if i%2 == 1 {
			key, limit = fmt.Sprint("many/", i%10), 100
		}
		tok := fmt.Sprint("t", i)
		if _, err := b.TryAcquire(ctx, acq(key, tok, limit, 5*time.Second)); err != nil {
			t.Fatal(i, err)
		}
		reqs = append(reqs, core.RenewRequest{Key: key, OwnerToken: tok, TTL: 20 * time.Second, Limit: limit})
	}
	for i := range 10 {
		k := fmt.Sprint("mutex/", i)
		if _, err := b.TryAcquire(ctx, acq(k, k, 0, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, core.RenewRequest{Key: k, OwnerToken: k, TTL: 20 * time.Second})
	}
	admin := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { admin.Close() })
	if _, err := b.Renew(ctx, reqs); err != nil { // loads the scripts
		t.Fatal(err)
	}
	before, trips := commandCalls(t, admin), hook.n.Load()
	res, err := b.Renew(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	after, trips2 := commandCalls(t, admin), hook.n.Load()
	for i, r := range res {
		if r != nil {
			t.Fatalf("lease %d: %v", i, r)
		}
	}
	if n := trips2 - trips; n != 1 {
		t.Errorf("%d round trips for one Renew of %d leases", n, len(reqs))
	}
	// 1,000 permits in chunks of 256, and one call for the mutexes.
	if n := scriptCalls(before, after); n != 5 {
		t.Errorf("%d script calls", n)
	}
	hs, err := b.Holders(ctx, "one")
	if err != nil || len(hs) != 500 {
		t.Fatalf("holders: %d %v", len(hs), err)
	}
	for _, h := range hs {
		if h.Remaining < 15*time.Second {
			t.Fatalf("permit not renewed: %+v", h)
		}
	}
	// Min hold: the permit stays until now + Keep.
	if err := b.Release(ctx, core.ReleaseRequest{Key: "one", OwnerToken: "t0", Keep: 300 * time.Millisecond, Limit: 1000}); err != nil {
		t.Fatal(err)
	}
	hs, _ = b.Holders(ctx, "one")
	if len(hs) != 500 || hs[0].Remaining > 300*time.Millisecond {
		t.Fatalf("kept permit: %d %+v", len(hs), hs[0])
	}
}

// Rule: on Redis Cluster, permits of keys in many slots are claimed,
// renewed in one Renew call, read and released like on one server
// (TestCluster runs it).
func testSemaphoreCluster(t *testing.T, c redis.UniversalClient) {
	b := newBackend(t, c, testenv.Name("dislocktest-semc-"))
	ctx := testenv.Context(t, 30*time.Second)
	var reqs []core.RenewRequest
	for i := range 300 {
		key := fmt.Sprint("c/", i%30)
		tok := fmt.Sprint("t", i)
		if _, err := b.TryAcquire(ctx, acq(key, tok, 10, 5*time.Second)); err != nil {
			t.Fatal(i, err)
		}
		reqs = append(reqs, core.RenewRequest{Key: key, OwnerToken: tok, TTL: 20 * time.Second, Limit: 10})
	}
	if _, err := b.TryAcquire(ctx, acq("c/0", "eleventh", 10, time.Second)); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("eleventh permit: %v", err)
	}
	if _, err := b.TryAcquire(ctx, acq("c/0", "mutex", 0, time.Second)); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("mutex claim: %v", err)
	}
	benchtest.RenewAll(t, ctx, b, reqs)
	list, err := b.List(ctx, "c/")
	if err != nil || len(list) != 300 {
		t.Fatalf("list: %d %v", len(list), err)
	}
	for _, r := range reqs {
		if err := b.Release(ctx, core.ReleaseRequest{Key: r.Key, OwnerToken: r.OwnerToken, Limit: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := b.List(ctx, "c/"); err != nil || len(list) != 0 {
		t.Fatalf("list after release: %d %v", len(list), err)
	}
}

// BenchmarkSemaphoreAcquireRelease: one TryAcquire + Release of a permit of
// a semaphore of 4 (with no other permit held, and with 3 held elsewhere),
// against a mutex, in the same run, each as a ratio to PING (x-ping):
//
//	go test -run '^$' -bench SemaphoreAcquireRelease -benchtime 2000x ./redislock/
func BenchmarkSemaphoreAcquireRelease(b *testing.B) {
	opt := benchRedis(b)
	ctx := context.Background()
	for _, bc := range []struct {
		name         string
		limit, other int
	}{{"mutex", 1, 0}, {"limit=4", 4, 0}, {"limit=4/held=3", 4, 3}} {
		b.Run(bc.name, func(b *testing.B) {
			c := benchClient(b, opt)
			l := newLocker(b, c, "bench", core.Limit(bc.limit))
			key := "sem/" + bc.name
			for range bc.other {
				s, err := l.TryAcquire(ctx, key, core.TTL(time.Minute))
				if err != nil {
					b.Fatal(err)
				}
				defer s.Release(ctx)
			}
			admin := benchClient(b, opt)
			before := commandCalls(b, admin)
			interleaved(b, c, func() error {
				s, err := l.TryAcquire(ctx, key)
				if err != nil {
					return err
				}
				return s.Release(ctx)
			})
			after := commandCalls(b, admin)
			// PINGs included (one per iteration), and the warm-up's.
			b.ReportMetric(float64(serverCalls(before, after)-after["ping"]+before["ping"])/float64(b.N), "server-cmds/op")
		})
	}
}

// BenchmarkSemaphoreHold1000: one Locker holds 1,000 permits (10 keys of
// limit 100, TTL 1.5s, renewed every 500ms). Each iteration is one renew
// interval; reported per interval: script calls and client round trips.
func BenchmarkSemaphoreHold1000(b *testing.B) {
	st := hold(b, 1000, func(i int) string { return fmt.Sprint("semhold/", i%10) }, core.Limit(100))
	b.ReportMetric(float64(scriptCalls(st.before, st.after))/st.intervals, "scripts/interval")
	b.ReportMetric(float64(st.trips)/st.intervals, "roundtrips/interval")
}

// Rule: a mutex claim on a key whose semaphore has only expired permits
// left (not yet dropped) takes the key, with a larger token.
func TestSemaphoreExpiredPermitsThenMutex(t *testing.T) {
	cs, prefix := semClients(t, 1)
	b := newBackend(t, cs[0], prefix)
	ctx := testenv.Context(t, 10*time.Second)
	if _, err := b.TryAcquire(ctx, acq("em", "long", 3, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	short, err := b.TryAcquire(ctx, acq("em", "short", 3, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "em", OwnerToken: "long", Limit: 3}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // the short permit's TTL
	m, err := b.TryAcquire(ctx, acq("em", "m", 0, time.Second))
	if err != nil {
		t.Fatalf("mutex claim after the permits expired: %v", err)
	}
	if m.Token <= short.Token {
		t.Fatalf("mutex token %d after permit token %d", m.Token, short.Token)
	}
}

// Rule: a permit claim of a key with no record counts on from the fencing
// counter the earlier lock layout (a hash and "<lock key>:fence") left.
func TestSemaphoreLegacyFence(t *testing.T) {
	cs, prefix := semClients(t, 1)
	b := newBackend(t, cs[0], prefix)
	ctx := testenv.Context(t, 10*time.Second)
	const ahead = uint64(1) << 52 // above the server time in µs, exact in Lua
	if err := cs[0].Set(ctx, redislock.LockKey(prefix, "legacy")+":fence", ahead, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := b.TryAcquire(ctx, acq("legacy", "p", 2, time.Second))
	if err != nil || l.Token != ahead+1 {
		t.Fatalf("permit after the legacy counter %d: %+v %v", ahead, l, err)
	}
}
