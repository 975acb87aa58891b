package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
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

// Rule: a full semaphore answers Busy with the permit that expires first;
// a permit that is not renewed frees within its TTL; renewing or releasing
// it afterwards reports it gone and touches no other permit.
func TestSemaphoreExpiry(t *testing.T) {
	cs, prefix := semClients(t, 1)
	b := newBackend(t, cs[0], prefix)
	ctx := ctxT(t, 10*time.Second)
	long, err := b.TryAcquire(ctx, acq("exp", "long", 2, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	short, err := b.TryAcquire(ctx, acq("exp", "short", 2, 400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if short.Token <= long.Token {
		t.Fatalf("tokens %d then %d", long.Token, short.Token)
	}
	start := time.Now()
	_, err = b.TryAcquire(ctx, acq("exp", "third", 2, time.Second))
	var na *core.NotAcquiredError
	if !errors.As(err, &na) || na.Holder == nil {
		t.Fatalf("full semaphore: %v", err)
	}
	if h := na.Holder; h.Token != short.Token || h.Owner != "owner-short" || h.Limit != 2 ||
		h.Remaining <= 0 || h.Remaining > 400*time.Millisecond {
		t.Fatalf("busy holder %+v, want the short permit (token %d)", *h, short.Token)
	}
	// Retrying the same claim is idempotent: the same permit.
	again, err := b.TryAcquire(ctx, acq("exp", "long", 2, 30*time.Second))
	if err != nil || again.Token != long.Token {
		t.Fatalf("retry of a held permit: %+v %v", again, err)
	}
	for {
		_, err = b.TryAcquire(ctx, acq("exp", "third", 2, time.Second))
		if err == nil {
			break
		}
		if !errors.Is(err, core.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Since(start) > 3*time.Second {
			t.Fatal("the expired permit was not freed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("freed after %v, before its TTL", took)
	}
	res, err := b.Renew(ctx, []core.RenewRequest{
		{Key: "exp", OwnerToken: "short", TTL: time.Second, Limit: 2},
		{Key: "exp", OwnerToken: "long", TTL: 30 * time.Second, Limit: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res[0], core.ErrLeaseGone) || res[1] != nil {
		t.Fatalf("renew expired, live: %v", res)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "exp", OwnerToken: "short", Limit: 2}); !errors.Is(err, core.ErrLeaseGone) {
		t.Fatalf("release of an expired permit = %v, want ErrLeaseGone", err)
	}
	hs, err := b.Holders(ctx, "exp")
	if err != nil || len(hs) != 2 || hs[0].Token != long.Token {
		t.Fatalf("holders %+v %v", hs, err)
	}
}

// Rule: Holders lists every permit oldest first with its limit; Inspect
// returns the oldest; List returns one Info per permit, among mutexes;
// ForceRelease frees every permit.
func TestSemaphoreAdmin(t *testing.T) {
	cs, prefix := semClients(t, 1)
	b := newBackend(t, cs[0], prefix)
	ctx := ctxT(t, 10*time.Second)
	var toks []uint64
	for i := range 3 {
		l, err := b.TryAcquire(ctx, acq("adm/sem", fmt.Sprint("p", i), 5, time.Duration(10-i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, l.Token)
	}
	m, err := b.TryAcquire(ctx, acq("adm/mutex", "m", 0, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	hs, err := b.Holders(ctx, "adm/sem")
	if err != nil || len(hs) != 3 {
		t.Fatalf("holders %+v %v", hs, err)
	}
	for i, h := range hs {
		if h.Token != toks[i] || h.Owner != fmt.Sprint("owner-p", i) || h.Limit != 5 || h.Key != "adm/sem" ||
			h.AcquiredAt.IsZero() || h.Remaining <= 0 || h.ExpiresAt.IsZero() {
			t.Errorf("holder %d: %+v", i, h)
		}
	}
	hm, err := b.Holders(ctx, "adm/mutex")
	if err != nil || len(hm) != 1 || hm[0].Token != m.Token || hm[0].Limit != 0 {
		t.Fatalf("holders of a mutex: %+v %v", hm, err)
	}
	if hf, err := b.Holders(ctx, "adm/free"); err != nil || len(hf) != 0 {
		t.Fatalf("holders of a free key: %+v %v", hf, err)
	}
	info, ok, err := b.Inspect(ctx, "adm/sem")
	if err != nil || !ok || info.Token != toks[0] || info.Limit != 5 {
		t.Fatalf("inspect: %+v %v %v", info, ok, err)
	}
	list, err := b.List(ctx, "adm/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, i := range list {
		got = append(got, fmt.Sprint(i.Key, "#", i.Token))
	}
	want := []string{fmt.Sprint("adm/mutex#", m.Token)}
	for _, tok := range toks {
		want = append(want, fmt.Sprint("adm/sem#", tok))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("list %v, want %v", got, want)
	}
	ok, err = b.ForceRelease(ctx, "adm/sem")
	if err != nil || !ok {
		t.Fatalf("force release: %v %v", ok, err)
	}
	if hs, err := b.Holders(ctx, "adm/sem"); err != nil || len(hs) != 0 {
		t.Fatalf("holders after force release: %+v %v", hs, err)
	}
	if _, ok, err := b.Inspect(ctx, "adm/sem"); ok || err != nil {
		t.Fatalf("inspect after force release: %v %v", ok, err)
	}
	res, err := b.Renew(ctx, []core.RenewRequest{{Key: "adm/sem", OwnerToken: "p0", TTL: time.Second, Limit: 5}})
	if err != nil || !errors.Is(res[0], core.ErrLeaseGone) {
		t.Fatalf("renew of a forced-out permit: %v %v", res, err)
	}
	// The key is free for any kind now, with a larger token.
	l, err := b.TryAcquire(ctx, acq("adm/sem", "new", 2, time.Second))
	if err != nil || l.Token <= toks[2] {
		t.Fatalf("claim after force release: %+v %v", l, err)
	}
}

// Rule: a mutex lease whose key now holds a semaphore (it was forced free
// and claimed as one) is reported gone by Renew without failing the other
// leases of the batch; its Release changes nothing and says so (Gone); and
// a Release without Limit
// (core's undo of a claim in doubt) frees a permit by its owner token.
func TestSemaphoreMutexLeaseOnSemaphoreKey(t *testing.T) {
	cs, prefix := semClients(t, 1)
	b := newBackend(t, cs[0], prefix)
	ctx := ctxT(t, 10*time.Second)
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
	ctx := ctxT(t, 30*time.Second)
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

// Rule: the semaphore scripts run on miniredis too (unit tests without a
// server).
func TestSemaphoreMiniredis(t *testing.T) {
	m := newMiniredis(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	l := newLocker(t, c, "mini", core.TTL(5*time.Second), core.Limit(2))
	ctx := ctxT(t, 10*time.Second)
	s1, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	s2, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if s2.Token() <= s1.Token() {
		t.Fatalf("tokens %d, %d", s1.Token(), s2.Token())
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, core.ErrNotAcquired) {
		t.Fatalf("third permit: %v", err)
	}
	if _, err := l.TryAcquire(ctx, "k", core.Limit(1)); !errors.Is(err, core.ErrLimitMismatch) {
		t.Fatalf("mutex on a semaphore: %v", err)
	}
	if err := s1.Check(ctx); err != nil {
		t.Fatal(err)
	}
	hs, err := l.Holders(ctx, "k")
	if err != nil || len(hs) != 2 || hs[0].Token != s1.Token() {
		t.Fatalf("holders %+v %v", hs, err)
	}
	s1.Release(ctx)
	s3, err := l.TryAcquire(ctx, "k")
	if err != nil || s3.Token() <= s2.Token() {
		t.Fatalf("after release: %v", err)
	}
}

// Rule: on Redis Cluster, permits of keys in many slots are claimed,
// renewed in one Renew call, read and released like on one server
// (TestCluster runs it).
func testSemaphoreCluster(t *testing.T, c redis.UniversalClient) {
	b := newBackend(t, c, testenv.Name("dislocktest-semc-"))
	ctx := ctxT(t, 30*time.Second)
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
	res, err := b.Renew(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r != nil {
			t.Fatalf("permit %d: %v", i, r)
		}
	}
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
	ttl := 1500 * time.Millisecond
	interval := ttl / 3
	opt := benchRedis(b)
	admin := benchClient(b, opt)
	c := benchClient(b, opt)
	hook := &countHook{}
	c.AddHook(hook)
	l := newLocker(b, c, "bench", core.TTL(ttl), core.Limit(100))
	ctx := context.Background()
	var before map[string]int64
	var trips int64
	intervals := benchtest.Hold(b, 1000, interval, func(i int) (core.Session, error) {
		return l.TryAcquire(ctx, fmt.Sprint("semhold/", i%10))
	}, func() { before, trips = commandCalls(b, admin), hook.n.Load() })
	after, trips2 := commandCalls(b, admin), hook.n.Load()
	b.ReportMetric(float64(scriptCalls(before, after))/intervals, "scripts/interval")
	b.ReportMetric(float64(trips2-trips)/intervals, "roundtrips/interval")
}

// Rule: a mutex claim on a key whose semaphore has only expired permits
// left (not yet dropped) takes the key, with a larger token.
func TestSemaphoreExpiredPermitsThenMutex(t *testing.T) {
	cs, prefix := semClients(t, 1)
	b := newBackend(t, cs[0], prefix)
	ctx := ctxT(t, 10*time.Second)
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

// Rule: the waiters of a semaphore wait in the key's queue: a freed permit
// is the first live waiter's turn, nobody without a place (or further back)
// takes a permit that waiters ahead of it may claim, a grant that leaves a
// permit free tells the next waiter, Leave of the first waiter passes the
// turn on, ForceRelease tells the first waiter, and a release with nobody
// in line publishes only when someone was answered busy.
func TestSemaphoreQueue(t *testing.T) {
	e := newQueueEnv(t)
	const ttl = 10 * time.Second
	sem := func(otoken, waiter string) core.AcquireRequest {
		r := acq("q", otoken, 2, ttl)
		r.Waiter, r.WaiterTTL = waiter, ttl
		return r
	}
	rel := func(otoken string) {
		t.Helper()
		if err := e.b.Release(e.ctx, core.ReleaseRequest{Key: "q", OwnerToken: otoken, Limit: 2}); err != nil {
			t.Fatal(err)
		}
	}
	e.grant(sem("p1", ""))
	e.grant(sem("p2", ""))
	e.busy(sem("w1", "w1"), true)
	e.busy(sem("w2", "w2"), true)
	rel("p1")
	e.wantTurn("q", "w1")
	e.busy(sem("c", ""), false)    // a permit is free, but w1 is ahead
	e.busy(sem("w2", "w2"), false) // and ahead of w2
	e.grant(sem("w1", "w1"))
	noTurn(t, e.c, e.prefix, e.turns) // no permit left free
	rel("p2")
	e.wantTurn("q", "w2")
	e.grant(sem("w2", "w2"))

	rel("w1")
	noTurn(t, e.c, e.prefix, e.turns) // nobody in line, nobody answered busy
	e.grant(sem("c2", ""))
	e.busy(sem("c3", ""), true)
	rel("c2")
	e.wantTurn("q", "") // c3 was answered busy without a place

	// Two permits free at once: the first grant tells the next waiter.
	e.grant(sem("c4", ""))
	e.busy(sem("w3", "w3"), true)
	e.busy(sem("w4", "w4"), true)
	rel("c4")
	e.wantTurn("q", "w3")
	rel("w2")
	e.wantTurn("q", "w3") // still first in line
	e.grant(sem("w3", "w3"))
	e.wantTurn("q", "w4") // a permit is still free
	e.grant(sem("w4", "w4"))

	// Leave of the first waiter when a permit is free.
	e.busy(sem("w5", "w5"), true)
	e.busy(sem("w6", "w6"), true)
	rel("w3")
	e.wantTurn("q", "w5")
	if err := e.b.Leave(e.ctx, "q", "w5"); err != nil {
		t.Fatal(err)
	}
	e.wantTurn("q", "w6")
	e.grant(sem("w6", "w6"))

	// ForceRelease tells the first live waiter.
	e.busy(sem("w7", "w7"), true)
	if ok, err := e.b.ForceRelease(e.ctx, "q"); !ok || err != nil {
		t.Fatalf("force release: %v %v", ok, err)
	}
	e.wantTurn("q", "w7")
	if hs, err := e.b.Holders(e.ctx, "q"); err != nil || len(hs) != 0 {
		t.Fatalf("holders after force release: %+v %v", hs, err)
	}
	e.grant(sem("w7", "w7"))
}

// Example_semaphore lets at most two holders of a key run at once: a third
// claim is turned away until a permit is released.
func Example_semaphore() {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	locker, err := redislock.New(rdb, redislock.WithPrefix("myapp"))
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	ctx := context.Background()
	a, err := locker.TryAcquire(ctx, "exports", core.Limit(2))
	if err != nil {
		panic(err)
	}
	b, err := locker.TryAcquire(ctx, "exports", core.Limit(2))
	if err != nil {
		panic(err)
	}
	_, err = locker.TryAcquire(ctx, "exports", core.Limit(2))
	fmt.Println("third permit busy:", errors.Is(err, core.ErrNotAcquired))
	holders, err := locker.Holders(ctx, "exports")
	if err != nil {
		panic(err)
	}
	fmt.Println("holders:", len(holders), "of", holders[0].Limit, "- tokens increase:", b.Token() > a.Token())

	a.Release(ctx)
	c, err := locker.TryAcquire(ctx, "exports", core.Limit(2))
	fmt.Println("after a release:", err == nil)
	if err == nil {
		c.Release(ctx)
	}
	b.Release(ctx)
	// Output:
	// third permit busy: true
	// holders: 2 of 2 - tokens increase: true
	// after a release: true
}

// Rule: a permit claim of a key with no record counts on from the fencing
// counter the earlier lock layout (a hash and "<lock key>:fence") left.
func TestSemaphoreLegacyFence(t *testing.T) {
	cs, prefix := semClients(t, 1)
	b := newBackend(t, cs[0], prefix)
	ctx := ctxT(t, 10*time.Second)
	const ahead = uint64(1) << 52 // above the server time in µs, exact in Lua
	if err := cs[0].Set(ctx, redislock.LockKey(prefix, "legacy")+":fence", ahead, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := b.TryAcquire(ctx, acq("legacy", "p", 2, time.Second))
	if err != nil || l.Token != ahead+1 {
		t.Fatalf("permit after the legacy counter %d: %+v %v", ahead, l, err)
	}
}
