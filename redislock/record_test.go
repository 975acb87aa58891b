package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/redislock"
)

// commandDelta counts the commands a private server ran between two
// INFO commandstats reads, INFO itself left out.
func commandDelta(before, after map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 && k != "info" {
			out[k] = d
		}
	}
	return out
}

func total(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func acquireReq(key string, i int) core.AcquireRequest {
	return core.AcquireRequest{Key: key, Owner: "o", OwnerToken: ownerToken(i), TTL: 10 * time.Second}
}

// TestCommandsPerAcquireRelease counts, on a private server, the commands
// of an uncontended acquire + release: at most 7 (EVALSHA, GET, TIME, SET;
// EVALSHA, GET, SET) once the key has a record, and no PUBLISH. The
// release reads the record before it writes, so that a value that is not
// this lease's is never touched (TestReleaseLeavesForeignValue): one
// command more than a blind SET ... XX GET, inside the same script call,
// about 0.5 µs of server time.
func TestCommandsPerAcquireRelease(t *testing.T) {
	const rule = "an uncontended acquire + release costs at most 7 server commands and publishes nothing"
	c := privateClient(t)
	ctx := testenv.Context(t, 30*time.Second)
	b := newBackend(t, c, testenv.Name("dislocktest-"))

	before := commandCalls(t, c)
	if _, err := b.TryAcquire(ctx, acquireReq("k", 0)); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: ownerToken(0)}); err != nil {
		t.Fatal(err)
	}
	first := commandDelta(before, commandCalls(t, c))
	// A key without a record also looks for a queue; scripts loaded by
	// EVAL after NOSCRIPT are not counted here.
	if first["publish"] != 0 || total(first)-first["eval"]-first["evalsha"] > 7 {
		t.Errorf("rule %q: first claim of a key ran %v", rule, first)
	}

	const n = 20
	before = commandCalls(t, c)
	for i := 1; i <= n; i++ {
		if _, err := b.TryAcquire(ctx, acquireReq("k", i)); err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: ownerToken(i)}); err != nil {
			t.Fatal(err)
		}
	}
	d := commandDelta(before, commandCalls(t, c))
	if got := total(d); got > 7*n || d["publish"] != 0 || d["evalsha"] != 2*n {
		t.Errorf("rule %q: %d acquire+release ran %v (%.1f per pair)", rule, n, d, float64(got)/n)
	}

	// Through the engine: the same.
	l, err := core.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before = commandCalls(t, c)
	for range n {
		s := testenv.Hold(t, ctx, l, "k")
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d = commandDelta(before, commandCalls(t, c))
	d["subscribe"], d["ping"] = 0, 0 // the Locker's release watch, if any
	if got := total(d); got > 7*n || d["publish"] != 0 {
		t.Errorf("rule %q: %d Locker TryAcquire+Release ran %v (%.1f per pair)", rule, n, d, float64(got)/n)
	}
}

// TestBusyMarksOnce: a busy answer marks the record once, so that only a
// release somebody was turned away from publishes.
func TestBusyMarksOnce(t *testing.T) {
	const rule = "a busy answer writes at most once per holder; the release then publishes, once"
	c := privateClient(t)
	ctx := testenv.Context(t, 30*time.Second)
	b := newBackend(t, c, testenv.Name("dislocktest-"))
	if _, err := b.TryAcquire(ctx, acquireReq("k", 0)); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, c)
	for range 5 {
		_, err := b.TryAcquire(ctx, acquireReq("k", 1))
		var na *core.NotAcquiredError
		if !errors.As(err, &na) || na.Holder == nil || na.Holder.Remaining <= 0 || na.Holder.ExpiresAt.IsZero() {
			t.Fatalf("busy TryAcquire = %v", err)
		}
	}
	d := commandDelta(before, commandCalls(t, c))
	if d["set"] != 1 {
		t.Errorf("rule %q: 5 busy tries ran %v", rule, d)
	}
	before = commandCalls(t, c)
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: ownerToken(0)}); err != nil {
		t.Fatal(err)
	}
	if d := commandDelta(before, commandCalls(t, c)); d["publish"] != 1 {
		t.Errorf("rule %q: release after busy tries ran %v", rule, d)
	}
	// The next holder starts unmarked.
	if _, err := b.TryAcquire(ctx, acquireReq("k", 2)); err != nil {
		t.Fatal(err)
	}
	before = commandCalls(t, c)
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: ownerToken(2)}); err != nil {
		t.Fatal(err)
	}
	if d := commandDelta(before, commandCalls(t, c)); d["publish"] != 0 {
		t.Errorf("rule %q: release nobody waited for ran %v", rule, d)
	}
}

// TestTokensAcrossTombstones: tokens increase by one while the tombstone
// keeps the counter, and stay larger once it is gone.
func TestTokensAcrossTombstones(t *testing.T) {
	const rule = "tokens strictly increase across releases, ForceRelease and a deleted record"
	c, ctx, prefix := onShared(t)
	b := newBackend(t, c, prefix)
	var last uint64
	claim := func(i int) {
		t.Helper()
		l, err := b.TryAcquire(ctx, acquireReq("k", i))
		if err != nil {
			t.Fatal(err)
		}
		if l.Token <= last {
			t.Fatalf("rule %q: token %d after %d", rule, l.Token, last)
		}
		last = l.Token
	}
	claim(0)
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: ownerToken(0)}); err != nil {
		t.Fatal(err)
	}
	claim(1)
	if ok, err := b.ForceRelease(ctx, "k"); err != nil || !ok {
		t.Fatalf("ForceRelease = %v %v", ok, err)
	}
	claim(2)
	// A release by another Backend (no known token) reads the record.
	other := newBackend(t, c, prefix)
	if err := other.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: ownerToken(2)}); err != nil {
		t.Fatal(err)
	}
	if _, held, err := b.Inspect(ctx, "k"); err != nil || held {
		t.Fatalf("rule %q: after release by another Backend: held=%v err=%v", rule, held, err)
	}
	claim(3)
	if err := c.Del(ctx, redislock.LockKey(prefix, "k")).Err(); err != nil {
		t.Fatal(err)
	}
	claim(4)
	// A tombstone ahead of the clock (a clock that stepped back) is
	// counted on from.
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: ownerToken(4)}); err != nil {
		t.Fatal(err)
	}
	const ahead = 4_000_000_000_000_000
	if err := c.Set(ctx, redislock.LockKey(prefix, "k"), "0|4000000000000000", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	claim(5)
	if last != ahead+1 {
		t.Errorf("rule %q: token %d after a tombstone of %d", rule, last, uint64(ahead))
	}
}

// TestStaleReleaseRestores: a release whose lease was taken over puts the
// new holder's record back untouched, TTL included.
func TestStaleReleaseRestores(t *testing.T) {
	const rule = "a stale release leaves the new holder's record and TTL as they were"
	c, ctx, prefix := onShared(t)
	b := newBackend(t, c, prefix)
	if _, err := b.TryAcquire(ctx, acquireReq("k", 0)); err != nil {
		t.Fatal(err)
	}
	if ok, err := redislock.Steal(ctx, c, prefix, "k"); err != nil || !ok {
		t.Fatalf("Steal = %v %v", ok, err)
	}
	k := redislock.LockKey(prefix, "k")
	was, err := c.Get(ctx, k).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: ownerToken(0)}); !errors.Is(err, core.ErrLeaseGone) {
		t.Fatalf("rule %q: stale Release = %v, want ErrLeaseGone", rule, err)
	}
	now, err := c.Get(ctx, k).Result()
	if err != nil || now != was {
		t.Fatalf("rule %q: record %q after stale release, was %q (%v)", rule, now, was, err)
	}
	if ttl, err := c.PTTL(ctx, k).Result(); err != nil || ttl <= 0 {
		t.Fatalf("rule %q: PTTL %v %v after stale release", rule, ttl, err)
	}
	info, held, err := b.Inspect(ctx, "k")
	if err != nil || !held || info.Owner != "thief" {
		t.Fatalf("rule %q: Inspect = %+v %v %v", rule, info, held, err)
	}
	// Releasing twice, and releasing a tombstone, change nothing either.
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "stolen"}); err != nil {
		t.Fatal(err)
	}
	tomb, _ := c.Get(ctx, k).Result()
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "stolen"}); !errors.Is(err, core.ErrLeaseGone) {
		t.Fatalf("rule %q: Release of a tombstone = %v, want ErrLeaseGone", rule, err)
	}
	if again, _ := c.Get(ctx, k).Result(); again != tomb {
		t.Fatalf("rule %q: tombstone %q became %q", rule, tomb, again)
	}
}

// TestReleaseLeavesForeignValue: a lock key that holds a value that is no
// lock record (another program's, under a clashing prefix) is read, never
// written, by a release, with the lease's token known (the common release)
// or not (another process's Release), without keep or with it, and by a
// permit's release (a semaphore's set lives at the same key).
func TestReleaseLeavesForeignValue(t *testing.T) {
	const rule = "a release leaves a foreign value at the lock key as it was, TTL included, and answers lease lost"
	c, ctx, prefix := onShared(t)
	b, other := newBackend(t, c, prefix), newBackend(t, c, prefix)
	k := redislock.LockKey(prefix, "k")
	defer c.Del(ctx, k)
	for i, tc := range []struct {
		name  string
		b     *redislock.Backend
		keep  time.Duration
		limit int
	}{{"token known", b, 0, 0}, {"token unknown", other, 0, 0}, {"min hold", b, time.Minute, 0}, {"permit", b, 0, 3}} {
		if _, err := b.TryAcquire(ctx, acquireReq("k", i)); err != nil {
			t.Fatal(err)
		}
		const foreign = "not a lock record"
		if err := c.Set(ctx, k, foreign, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		err := tc.b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: ownerToken(i), Keep: tc.keep, Limit: tc.limit})
		if !errors.Is(err, core.ErrLeaseLost) || !errors.Is(err, core.ErrLeaseGone) {
			t.Errorf("rule %q: %s: Release = %v", rule, tc.name, err)
		}
		if v, err := c.Get(ctx, k).Result(); err != nil || v != foreign {
			t.Errorf("rule %q: %s: value %q (%v) after the release, was %q", rule, tc.name, v, err, foreign)
		}
		if ttl, err := c.PTTL(ctx, k).Result(); err != nil || ttl < 59*time.Minute {
			t.Errorf("rule %q: %s: PTTL %v (%v) after the release, was 1h", rule, tc.name, ttl, err)
		}
		if err := c.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOldRecordFailsLoudly: a lock hash of the previous layout is an error,
// never a second grant.
func TestOldRecordFailsLoudly(t *testing.T) {
	const rule = "a lock hash of the old layout makes acquire fail, not grant"
	c, ctx, prefix := onShared(t)
	k := redislock.LockKey(prefix, "k")
	if err := c.HSet(ctx, k, "otoken", "old", "owner", "old", "token", "7").Err(); err != nil {
		t.Fatal(err)
	}
	defer c.Del(ctx, k)
	b := newBackend(t, c, prefix)
	_, err := b.TryAcquire(ctx, acquireReq("k", 0))
	if err == nil || errors.Is(err, core.ErrNotAcquired) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("rule %q: TryAcquire on an old hash = %v", rule, err)
	}
}

// TestOwnerTokenWithSeparator: the record cannot hold an owner token with
// its separator.
func TestOwnerTokenWithSeparator(t *testing.T) {
	b := newBackend(t, newClientOn(t, newMiniredis(t).Addr()), testenv.Name("dislocktest-"))
	req := acquireReq("k", 0)
	req.OwnerToken = "a|b"
	if _, err := b.TryAcquire(context.Background(), req); err == nil {
		t.Fatal("owner token with | accepted")
	}
}

func newClientOn(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRenewChecksWholeOwnerToken: renew matches the owner token exactly,
// not a prefix of it nor one it is a prefix of.
func TestRenewChecksWholeOwnerToken(t *testing.T) {
	c, ctx, prefix := onShared(t)
	b := newBackend(t, c, prefix)
	req := acquireReq("k", 0)
	req.OwnerToken, req.Owner = "token", "owner|with|bars"
	if _, err := b.TryAcquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tok string
		ok  bool
	}{{"tok", false}, {"tokenx", false}, {"token|", false}, {"owner", false}, {"token", true}} {
		res, err := b.Renew(ctx, []core.RenewRequest{{Key: "k", OwnerToken: tc.tok, TTL: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		if (res[0] == nil) != tc.ok {
			t.Errorf("renew with owner token %q: %v", tc.tok, res[0])
		}
	}
}

// watchTurns runs b.WatchTurns until the test ends and returns its turns.
func watchTurns(t *testing.T, b *redislock.Backend) <-chan testenv.Turn {
	turns, _ := testenv.WatchTurns(t, b)
	return turns
}

func nextTurn(t *testing.T, turns <-chan testenv.Turn) testenv.Turn {
	t.Helper()
	select {
	case tn := <-turns:
		return tn
	case <-time.After(5 * time.Second):
		t.Fatal("no turn published")
	}
	return testenv.Turn{}
}

// noTurn checks that nothing was published by the calls made so far: it
// publishes a marker of its own and expects it first.
func noTurn(t *testing.T, c redis.UniversalClient, prefix string, turns <-chan testenv.Turn) {
	t.Helper()
	if err := c.Publish(context.Background(), prefix+":released", "marker").Err(); err != nil {
		t.Fatal(err)
	}
	if tn := nextTurn(t, turns); tn.Key != "marker" {
		t.Fatalf("published %+v, want nothing", tn)
	}
}

func waitReq(key string, i int, waiter string, ttl time.Duration) core.AcquireRequest {
	r := acquireReq(key, i)
	r.Waiter, r.WaiterTTL = waiter, ttl
	return r
}

func isBusy(err error, holder bool) bool {
	var na *core.NotAcquiredError
	return errors.As(err, &na) && (na.Holder != nil) == holder
}

type queueEnv struct {
	t      *testing.T
	c      redis.UniversalClient
	b      *redislock.Backend
	prefix string
	turns  <-chan testenv.Turn
	ctx    context.Context
}

func newQueueEnv(t *testing.T) *queueEnv {
	c := sharedRedis(t)
	prefix := testenv.Name("dislocktest-")
	b := newBackend(t, c, prefix)
	return &queueEnv{t: t, c: c, b: b, prefix: prefix, turns: watchTurns(t, b), ctx: testenv.Context(t, 60*time.Second)}
}

func (e *queueEnv) grant(req core.AcquireRequest) core.Lease {
	e.t.Helper()
	l, err := e.b.TryAcquire(e.ctx, req)
	if err != nil {
		e.t.Fatalf("TryAcquire(%s, waiter %q): %v", req.Key, req.Waiter, err)
	}
	return l
}

func (e *queueEnv) busy(req core.AcquireRequest, holder bool) {
	e.t.Helper()
	_, err := e.b.TryAcquire(e.ctx, req)
	if !isBusy(err, holder) {
		e.t.Fatalf("TryAcquire(%s, waiter %q) = %v, want busy (holder known: %v)", req.Key, req.Waiter, err, holder)
	}
}

func (e *queueEnv) release(key string, i int) {
	e.t.Helper()
	if err := e.b.Release(e.ctx, core.ReleaseRequest{Key: key, OwnerToken: ownerToken(i)}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *queueEnv) wantTurn(key, waiter string) {
	e.t.Helper()
	if tn := nextTurn(e.t, e.turns); tn != (testenv.Turn{Key: key, Waiter: waiter}) {
		e.t.Fatalf("turn %+v, want %s/%s", tn, key, waiter)
	}
}

// TestQueueKeysGone: a key's queue is two Redis keys while anyone is in
// line, and none once its last waiter is served.
func TestQueueKeysGone(t *testing.T) {
	e := newQueueEnv(t)
	q, qd := redislock.QueueKeys(e.prefix, "k")
	count := func() int64 {
		t.Helper()
		n, err := e.c.Exists(e.ctx, q, qd).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	e.grant(acquireReq("k", 0))
	e.busy(waitReq("k", 1, "w1", 10*time.Second), true)
	if n := count(); n != 2 {
		t.Fatalf("%d queue keys with a waiter in line, want 2", n)
	}
	e.release("k", 0)
	e.grant(waitReq("k", 1, "w1", 10*time.Second))
	if n := count(); n != 0 {
		t.Fatalf("%d queue keys left after the last waiter's grant", n)
	}
	e.release("k", 1)
}

// TestWatchGetsKeyOfTurn: a plain Watch consumer hears a turn as its key.
func TestWatchGetsKeyOfTurn(t *testing.T) {
	c, ctx, prefix := onShared(t)
	b := newBackend(t, c, prefix)
	ctx, cancel := context.WithCancel(ctx)
	keys := make(chan string, 8)
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Watch(ctx, func() { close(ready) }, func(key string) { keys <- key })
	}()
	defer func() { cancel(); <-done }()
	<-ready
	if _, err := b.TryAcquire(ctx, acquireReq("k/1", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, waitReq("k/1", 1, "w", 10*time.Second)); !isBusy(err, true) {
		t.Fatal(err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k/1", OwnerToken: ownerToken(0)}); err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-keys:
		if k != "k/1" {
			t.Fatalf("Watch got %q, want the key", k)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no release message")
	}
}

// TestReleaseNamesOddKeys: the release script reads the release channel and
// the lock's key from the record's Redis key, so a key with the escaped
// characters reaches the watchers as it is: the plain message of a release
// someone was answered busy for (by lease token, and without it), and a
// waiter's turn.
func TestReleaseNamesOddKeys(t *testing.T) {
	const rule = "a release publishes the lock's own key on the prefix's channel"
	c := sharedRedis(t)
	prefix := testenv.Name("dislocktest-")
	b := newBackend(t, c, prefix)
	ctx, cancel := context.WithCancel(testenv.Context(t, 30*time.Second))
	type msg struct{ key, waiter string }
	msgs := make(chan msg, 8)
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.WatchTurns(ctx, func() { close(ready) }, func(key, waiter string) { msgs <- msg{key, waiter} })
	}()
	defer func() { cancel(); <-done }()
	<-ready
	want := func(m msg) {
		t.Helper()
		if got := testenv.Receive(t, msgs, 5*time.Second, "rule %q: no message, want %+v", rule, m); got != m {
			t.Fatalf("rule %q: Watch got %+v, want %+v", rule, got, m)
		}
	}
	for _, k := range []string{"odd/%7D}{%25%}", "odd/}", "odd/%"} {
		for _, byToken := range []bool{true, false} {
			l, err := b.TryAcquire(ctx, acquireReq(k, 0))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.TryAcquire(ctx, acquireReq(k, 1)); !isBusy(err, true) {
				t.Fatal(err)
			}
			rel := core.ReleaseRequest{Key: k, OwnerToken: ownerToken(0)}
			if byToken {
				rel.Token = l.Token
			}
			if err := b.Release(ctx, rel); err != nil {
				t.Fatal(err)
			}
			want(msg{k, ""})
		}
		l, err := b.TryAcquire(ctx, acquireReq(k, 0))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.TryAcquire(ctx, waitReq(k, 1, "w", 10*time.Second)); !isBusy(err, true) {
			t.Fatal(err)
		}
		if err := b.Release(ctx, core.ReleaseRequest{Key: k, OwnerToken: ownerToken(0), Token: l.Token}); err != nil {
			t.Fatal(err)
		}
		want(msg{k, "w"})
		if err := b.Leave(ctx, k, "w"); err != nil {
			t.Fatal(err)
		}
	}
}

// Rule: a permit's release with nobody in line publishes only when a claim
// was answered busy since the key was last free (such callers poll and are
// told by the bare key); the turns of waiters in line are the locktest
// Queue rules'.
func TestSemaphoreReleasePublishesForBusy(t *testing.T) {
	e := newQueueEnv(t)
	const ttl = 10 * time.Second
	rel := func(otoken string) {
		t.Helper()
		if err := e.b.Release(e.ctx, core.ReleaseRequest{Key: "q", OwnerToken: otoken, Limit: 2}); err != nil {
			t.Fatal(err)
		}
	}
	e.grant(acq("q", "p1", 2, ttl))
	rel("p1")
	noTurn(t, e.c, e.prefix, e.turns) // nobody in line, nobody answered busy
	e.grant(acq("q", "p1", 2, ttl))
	e.grant(acq("q", "p2", 2, ttl))
	e.busy(acq("q", "p3", 2, ttl), true)
	rel("p1")
	e.wantTurn("q", "") // p3 was answered busy without a place
	rel("p2")
}
