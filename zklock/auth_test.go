package zklock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/zklock"
)

// digest returns fresh digest credentials "user:password" and the ACL
// ZooKeeper gives a CreatorAll node made by a session authenticated with
// them.
func digest() (cred string, created []zk.ACL) {
	user, pw := testenv.Name("u"), testenv.Name("pw")
	return user + ":" + pw, zk.DigestACL(zk.PermAll, user, pw)
}

// authBackend is a backend on the single server with digest credentials
// of its own (cred), which dials through dial, with the session timeout
// given.
func authBackend(t *testing.T, dial zk.Dialer, session time.Duration) (b *zklock.Backend, connect, cred string) {
	t.Helper()
	connect = singleConnect(t)
	cred, _ = digest()
	b = newBackend(t, connect, testRoot(), zklock.WithAuth("digest", []byte(cred)), zklock.WithDialer(dial),
		zklock.WithSessionTimeout(session))
	return b, connect, cred
}

// nodes returns every node at and under p.
func nodes(t *testing.T, c *zk.Conn, p string) []string {
	t.Helper()
	out := []string{p}
	kids, _, err := c.Children(p)
	if err != nil {
		t.Fatalf("children of %s: %v", p, err)
	}
	for _, k := range kids {
		out = append(out, nodes(t, c, p+"/"+k)...)
	}
	return out
}

// Rule: with digest auth and the default (CreatorAll) ACL, every node the
// backend creates (root ancestors, locks, clock, containers, claims,
// permits, holds) belongs to the authenticated identity: a session without
// the credentials, or with others, can neither read, take, change nor
// delete the locks, and its failures are errors, never "busy". The admin
// calls work with the credentials.
func TestAuthCreatorAll(t *testing.T) {
	connect := singleConnect(t)
	top := testRoot()
	root := top + "/nested/root"
	cred, want := digest()
	b := newBackend(t, connect, root, zklock.WithAuth("digest", []byte(cred)))
	l := newLocker(t, b, core.TTL(time.Second))
	ctx := ctxT(t, 30*time.Second)

	s, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(context.Background())
	p, err := l.TryAcquire(ctx, "sem", core.Limit(2))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(context.Background())
	if _, err := l.TryAcquire(ctx, "slot", core.ForSlot(core.Every(time.Hour))); err != nil {
		t.Fatal(err)
	}

	admin := rawConn(t, connect)
	if err := admin.AddAuth("digest", []byte(cred)); err != nil {
		t.Fatal(err)
	}
	all := nodes(t, admin, top)
	var claims, holds []string
	for _, n := range all {
		acl, _, err := admin.GetACL(n)
		if err != nil {
			t.Fatalf("ACL of %s: %v", n, err)
		}
		if !slices.Equal(acl, want) {
			t.Errorf("ACL of %s = %v, want %v", n, acl, want)
		}
		base := n[strings.LastIndexByte(n, '/')+1:]
		switch {
		case strings.HasPrefix(base, "l-") || strings.HasPrefix(base, "p-"):
			claims = append(claims, n)
		case strings.HasPrefix(base, "h-") || strings.HasPrefix(base, "q-"):
			holds = append(holds, n)
		}
	}
	if len(claims) != 2 || len(holds) != 1 || !slices.Contains(all, root+"/clock") {
		t.Fatalf("nodes under %s: %v (claims %v, holds %v)", top, all, claims, holds)
	}

	// A session without the credentials.
	anon := rawConn(t, connect)
	for _, n := range append(claims, holds...) {
		if err := anon.Delete(n, -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("anonymous delete of %s: %v, want ErrNoAuth", n, err)
		}
		if _, err := anon.Set(n, []byte("x"), -1); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("anonymous write of %s: %v, want ErrNoAuth", n, err)
		}
	}
	if err := anon.Delete(b.KeyPath("k"), -1); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("anonymous delete of the key node: %v, want ErrNoAuth", err)
	}
	if _, _, err := anon.Children(b.KeyPath("k")); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("anonymous read of the key node: %v, want ErrNoAuth", err)
	}
	if _, err := anon.Create(b.KeyPath("k")+"/l-thief-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("anonymous claim: %v, want ErrNoAuth", err)
	}

	// Lockers without the credentials, or with other ones, fail: they do
	// not read the lock as busy.
	other, _ := digest()
	for name, opts := range map[string][]zklock.Option{
		"anonymous":   nil,
		"other users": {zklock.WithAuth("digest", []byte(other))},
	} {
		ol := newLocker(t, newBackend(t, connect, root, opts...), core.TTL(time.Second))
		for _, key := range []string{"k", "new-key"} {
			_, err := ol.TryAcquire(ctx, key)
			if !errors.Is(err, zk.ErrNoAuth) || errors.Is(err, core.ErrNotAcquired) {
				t.Errorf("%s: TryAcquire(%s) = %v, want ErrNoAuth and not ErrNotAcquired", name, key, err)
			}
		}
		if _, _, err := ol.Inspect(ctx, "k"); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s: Inspect = %v, want ErrNoAuth", name, err)
		}
		if ok, err := ol.ForceRelease(ctx, "k"); ok || !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s: ForceRelease = %v %v, want ErrNoAuth", name, ok, err)
		}
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("the holder lost its lock to an unauthenticated session: %v", err)
	}

	// The admin calls, with the credentials.
	al := newLocker(t, newBackend(t, connect, root, zklock.WithAuth("digest", []byte(cred))), core.TTL(time.Second))
	if info, ok, err := al.Inspect(ctx, "k"); err != nil || !ok || info.Token != s.Token() {
		t.Errorf("Inspect = %+v %v %v", info, ok, err)
	}
	if hs, err := al.Holders(ctx, "sem"); err != nil || len(hs) != 1 {
		t.Errorf("Holders = %v %v", hs, err)
	}
	if infos, err := al.List(ctx, ""); err != nil || len(infos) != 3 {
		t.Errorf("List = %v %v", infos, err)
	}
	if ok, err := al.ForceRelease(ctx, "k"); !ok || err != nil {
		t.Fatalf("ForceRelease = %v %v", ok, err)
	}
	select {
	case <-s.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not learn of the forced release")
	}
}

// Rule: the credentials outlive the connection. ZooKeeper keeps a
// session's authentication per connection: after go-zookeeper reconnects,
// and after it opens a new session, the backend still creates and renews
// protected nodes.
func TestAuthAfterReconnect(t *testing.T) {
	t.Parallel()
	var d dropper
	b, connect, _ := authBackend(t, d.dial, 4*time.Second)
	ctx := ctxT(t, 30*time.Second)
	acquire := func(key string) {
		t.Helper()
		if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: key, Owner: "o", OwnerToken: "tok-" + key, TTL: 2 * time.Second}); err != nil {
			t.Fatalf("acquire %s: %v", key, err)
		}
	}
	acquire("a")
	sid := b.Conn().SessionID()
	d.drop()
	if !testenv.WaitFor(15*time.Second, func() bool { return d.dials.Load() >= 2 && b.Conn().State() == zk.StateHasSession }) {
		t.Fatal("no reconnection after the drop")
	}
	if b.Conn().SessionID() != sid {
		t.Fatal("the drop ended the session; the test needs a reconnection within it")
	}
	acquire("b") // a new container under the protected locks node
	res, err := b.Renew(ctx, []core.RenewRequest{{Key: "a", OwnerToken: "tok-a", TTL: 2 * time.Second}})
	if err != nil || errors.Join(res...) != nil {
		t.Fatalf("renew after the reconnection: %v %v", res, err)
	}
	anon := rawConn(t, connect)
	if _, _, err := anon.Children(b.KeyPath("b")); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("the node created after the reconnection is readable without credentials: %v", err)
	}
}

// Rule: options that cannot work are refused, naming the option.
func TestAuthOptions(t *testing.T) {
	for name, opt := range map[string]zklock.Option{
		"no scheme":       zklock.WithAuth("", []byte("u:p")),
		"no credentials":  zklock.WithAuth("digest", nil),
		"digest no colon": zklock.WithAuth("digest", []byte("user")),
	} {
		if _, err := zklock.NewBackend(context.Background(), "127.0.0.1:1", opt); !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "WithAuth") {
			t.Errorf("%s: %v, want ErrInvalidOption naming WithAuth", name, err)
		}
	}
	for name, opt := range map[string]zklock.Option{
		"empty":    zklock.WithACL(nil),
		"no perms": zklock.WithACL([]zk.ACL{{Perms: 0, Scheme: "world", ID: "anyone"}}),
	} {
		if _, err := zklock.NewBackend(context.Background(), "127.0.0.1:1", opt); !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "WithACL") {
			t.Errorf("%s: %v, want ErrInvalidOption naming WithACL", name, err)
		}
	}
	// A connection the caller owns takes the caller's credentials.
	conn, _, err := zk.Connect([]string{"127.0.0.1:1"}, time.Second, zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := zklock.NewBackendFromConn(conn, 3*time.Second, zklock.WithAuth("digest", []byte("u:p"))); !errors.Is(err, core.ErrInvalidOption) || !strings.Contains(err.Error(), "AddAuth") {
		t.Errorf("NewBackendFromConn with WithAuth: %v", err)
	}
	b, err := zklock.NewBackendFromConn(conn, 3*time.Second, zklock.WithACL(zklock.CreatorAllACL()))
	if err != nil {
		t.Fatalf("NewBackendFromConn with WithACL: %v", err)
	}
	b.Close()
}

// Rule: an explicit ACL is the one every node gets.
func TestWithACL(t *testing.T) {
	connect := singleConnect(t)
	root := testRoot()
	cred, _ := digest()
	user, pw, _ := strings.Cut(cred, ":")
	readers := zk.WorldACL(zk.PermRead)
	acl := append(zk.DigestACL(zk.PermAll, user, pw), readers...)
	b := newBackend(t, connect, root, zklock.WithAuth("digest", []byte(cred)), zklock.WithACL(acl))
	ctx := ctxT(t, 30*time.Second)
	if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: "t", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	anon := rawConn(t, connect)
	admin := rawConn(t, connect) // the server shows digests to their owner only
	if err := admin.AddAuth("digest", []byte(cred)); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes(t, anon, root) { // readable by anyone
		got, _, err := admin.GetACL(n)
		if err != nil || !slices.Equal(got, acl) {
			t.Errorf("ACL of %s = %v %v, want %v", n, got, err, acl)
		}
	}
	if _, err := anon.Set(b.KeyPath("k"), nil, -1); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("anonymous write: %v, want ErrNoAuth", err)
	}
}

// Rule: after the session expires and go-zookeeper opens a new one, the
// credentials apply to the new session too.
func TestAuthAfterSessionExpiry(t *testing.T) {
	t.Parallel()
	var cut cutter
	b, connect, cred := authBackend(t, cut.dial, 1200*time.Millisecond)
	ctx := ctxT(t, 30*time.Second)
	if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "a", Owner: "o", OwnerToken: "tok-a", TTL: 700 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	admin := rawConn(t, connect)
	if err := admin.AddAuth("digest", []byte(cred)); err != nil {
		t.Fatal(err)
	}
	cut.expireSession(t, b, admin, "a", 15*time.Second)
	if _, err := b.TryAcquire(ctx, core.AcquireRequest{Key: "b", Owner: "o", OwnerToken: "tok-b", TTL: 700 * time.Millisecond}); err != nil {
		t.Fatalf("acquire in the new session: %v", err)
	}
}
