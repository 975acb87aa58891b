package zklock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/zklock"
)

// Rule: New fails at once, naming the cause, when no server takes
// connections, instead of waiting out ctx with "no ZooKeeper session
// established: context deadline exceeded" (15 s and more before).
func TestNewFailsFastOnConnectionRefused(t *testing.T) {
	t.Parallel()
	a, b := testenv.ClosedAddr(t), testenv.ClosedAddr(t)
	for _, connect := range []string{a, a + "," + b} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		l, err := zklock.New(ctx, connect)
		cancel()
		took := time.Since(start)
		if err == nil {
			l.Close()
			t.Fatalf("New(%s) connected to nothing", connect)
		}
		msg := err.Error()
		if took > 5*time.Second || !strings.Contains(msg, "no ZooKeeper server reachable") || !strings.Contains(msg, "connection refused") {
			t.Fatalf("New(%s) = %q after %v, want a refusal named within 5s", connect, msg, took)
		}
		for _, addr := range strings.Split(connect, ",") {
			if !strings.Contains(msg, addr) {
				t.Errorf("New(%s) = %q: the refusal of %s is not named", connect, msg, addr)
			}
		}
	}
}

// A server that takes the connection but gives no session (an ensemble
// without quorum) is waited for until ctx ends, as before.
func TestNewWaitsForASessionFromAServerThatAnswers(t *testing.T) {
	t.Parallel()
	silent := testenv.SilentServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	l, err := zklock.New(ctx, silent, zklock.WithSessionTimeout(time.Second))
	if err == nil {
		l.Close()
		t.Fatal("New got a session from a silent server")
	}
	if took := time.Since(start); took < time.Second || !strings.Contains(err.Error(), "no ZooKeeper session established") {
		t.Fatalf("New = %v after %v, want to wait for ctx", err, took)
	}
}

// Rule: errors carry one prefix per layer: core's "dislock: zookeeper:
// acquire "k": " wraps the client's error, and the backend adds no
// "zklock:" layer of its own.
func TestErrorPrefixOnce(t *testing.T) {
	conn, _, err := zk.Connect([]string{"127.0.0.1:1"}, 4*time.Second, zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	l, err := zklock.NewFromConn(conn, 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = l.TryAcquire(ctx, "prefix-once", core.TTL(2*time.Second))
	if err == nil {
		t.Fatal("acquired with no server")
	}
	msg := err.Error()
	if !strings.Contains(msg, `dislock: zookeeper: acquire "prefix-once": `) || strings.Contains(msg, "zklock") {
		t.Errorf("error %q: want one dislock: zookeeper: prefix and no other layer naming the backend", msg)
	}
}

const urlSecret = "SENTINEL-pw"

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		raw, connect string
		nopts        int
	}{
		{"zk://h1:2181", "h1:2181", 0},
		{"ZK://h1:2181,h2:2182/app/jobs", "h1:2181,h2:2182/app/jobs", 0},
		{"zk://h1:2181/", "h1:2181/", 0},
		{"zk://h1:2181?session_timeout=12.5", "h1:2181", 1},
		{"zk://u:" + urlSecret + "@h1:2181,h2:2181/c?session_timeout=30", "h1:2181,h2:2181/c", 2},
		{"zk://u%40x:p%3Aw%40d@h1:2181", "h1:2181", 1},
	} {
		connect, opts, err := zklock.ParseURL(c.raw)
		if err != nil || connect != c.connect || len(opts) != c.nopts {
			t.Errorf("ParseURL(%q) = %q, %d options, %v; want %q, %d options", c.raw, connect, len(opts), err, c.connect, c.nopts)
		}
		if _, _, err := zklock.ParseServers(connect); err != nil {
			t.Errorf("ParseServers(%q): %v", connect, err)
		}
	}
	for _, c := range []struct{ raw, want string }{
		{"h1:2181", "scheme"},
		{"etcd://h1:2379", "scheme"},
		{"zk://", "names no server"},
		{"zk:///chroot", "names no server"},
		{"zk://u:" + urlSecret + "@", "names no server"},
		{"zk://u@h1:2181", "needs a password"},
		{"zk://:" + urlSecret + "@h1:2181", "user information"},
		{"zk://h1:2181,,h2:2181", "bad host"},
		{"zk://h1:2181/a/", "chroot"},
		{"zk://h1:2181?session_timeout=0", "session_timeout"},
		{"zk://h1:2181?session_timeout=x", "session_timeout"},
		{"zk://h1:2181?password=" + urlSecret, "unknown parameter"},
		{"zk://h1:2181#" + urlSecret, "fragment"},
	} {
		_, _, err := zklock.ParseURL(c.raw)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseURL(%q) = %v, want an error saying %q", c.raw, err, c.want)
		} else if strings.Contains(err.Error(), urlSecret) || strings.Contains(err.Error(), "h1") {
			t.Errorf("ParseURL(%q): the error quotes the URL: %v", c.raw, err)
		}
	}
	// A connect string is not a URL, and the error says what it is.
	if _, _, err := zklock.ParseServers("zk://h1:2181"); err == nil || !strings.Contains(err.Error(), "host:port[,host:port][/chroot], not a URL") {
		t.Errorf("ParseServers of a URL: %v", err)
	}
}

// Rule: New and NewBackend take the zk:// URL the README and the CLI use,
// credentials included; a URL of another scheme is refused before any
// dialling, without quoting it.
func TestNewTakesURL(t *testing.T) {
	connect := singleConnect(t)
	ctx := ctxT(t, 30*time.Second)
	root := testRoot()
	l, err := zklock.New(ctx, "zk://"+connect+"?session_timeout=6", zklock.WithRoot(root))
	if err != nil {
		t.Fatalf("New with a zk:// URL: %v", err)
	}
	defer l.Close()
	b := l.Backend().(*zklock.Backend)
	if got := b.SessionTimeout(); got != 6*time.Second {
		t.Errorf("session timeout from the URL: %v, want 6s", got)
	}
	if _, err := l.TryAcquire(ctx, "k"); err != nil {
		t.Fatal(err)
	}

	cred, _ := digest()
	user, pw, _ := strings.Cut(cred, ":")
	pb, err := zklock.NewBackend(ctx, "zk://"+user+":"+pw+"@"+connect, zklock.WithRoot(root+"-auth"))
	if err != nil {
		t.Fatalf("NewBackend with credentials in the URL: %v", err)
	}
	defer pb.Close()
	if _, err := pb.TryAcquire(ctx, core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: "t", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rawConn(t, connect).Children(pb.KeyPath("k")); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("a node made with the URL's credentials is readable without them: %v", err)
	}

	for _, bad := range []string{"etcd://u:" + urlSecret + "@h1:2181", "zk://u:" + urlSecret + "@h1:2181?x=1"} {
		_, err := zklock.New(ctx, bad)
		if !errors.Is(err, core.ErrInvalidOption) || strings.Contains(err.Error(), urlSecret) {
			t.Errorf("New(%q) = %v, want ErrInvalidOption without the URL", bad, err)
		}
	}
}

// TestRepliesReadWhole: a reply is read from the socket in one read (a
// buffer under the client), not its length and then its body.
func TestRepliesReadWhole(t *testing.T) {
	t.Parallel()
	var wire wireLog
	b := newBackend(t, singleConnect(t), testRoot(), zklock.WithDialer(wire.dialer(0)))
	ctx := ctxT(t, 30*time.Second)
	const n = 20
	wire.start()
	for i := range n {
		if _, _, err := b.Inspect(ctx, "replies-read-whole-"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	var writes, reads int
	for _, f := range wire.stop() {
		if f.write {
			writes++
		} else {
			reads++
		}
	}
	// Unbuffered, every reply would take two reads; a ping's reply may
	// come in between.
	if writes < n || reads > writes+2 {
		t.Errorf("%d requests, %d reads of the socket: want one read per reply", writes, reads)
	}
}
