package bench

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/zklock"
)

// ZooKeeper: dislock's zklock beside go-zookeeper's own recipe, zk.Lock
// (v1.0.4: no try-lock, no context, no loss signal; it waits in line, each
// waiter watching its predecessor), with Exists as the raw round trip.
// writes counts the server's transactions (the zxid, read with the srvr
// four-letter command): every create, delete, setData and multi, failed
// ones included, and session creations and closes.

var zkContenders = []string{"dislock", "zklock"}

// zkSession is the session timeout of the benchmarks' ZooKeeper clients:
// dislock's TTL (30 s) must be within 2/3 of it.
const zkSession = 60 * time.Second

var zkRun struct {
	once    sync.Once
	connect string
	err     error
}

// zkConnect returns the connect string of the benchmark's ZooKeeper:
// DISLOCK_BENCH_ZK ("host:port[,host:port]") when set, else a private
// standalone server started once per run (zktest: tickTime 100 ms, no
// fsync, as the zklock tests run it) and stopped at exit.
func zkConnect(tb testing.TB) string {
	tb.Helper()
	if s := os.Getenv("DISLOCK_BENCH_ZK"); s != "" {
		return s
	}
	zkRun.once.Do(func() {
		if err := zktest.Installed(); err != nil {
			zkRun.err = err
			return
		}
		dir, err := os.MkdirTemp("", "dlbench-zk-")
		if err != nil {
			zkRun.err = err
			return
		}
		e, err := zktest.Start(dir, 1, 60*time.Second)
		if err != nil {
			os.RemoveAll(dir)
			zkRun.err = err
			return
		}
		atExit(func() { e.Stop(); os.RemoveAll(dir) })
		zkRun.connect = e.Connect()
	})
	if zkRun.err != nil {
		if testenv.CI() {
			tb.Fatal(zkRun.err)
		}
		tb.Skip(zkRun.err)
	}
	return zkRun.connect
}

var zxidLine = regexp.MustCompile(`Zxid: 0x([0-9a-f]+)`)

// zkWrites returns the server's transactions so far (the low 32 bits of
// its zxid: the count within the leader's epoch).
func zkWrites(tb testing.TB, connect string) func() int64 {
	servers, _, err := zklock.ParseServers(connect)
	if err != nil {
		tb.Fatal(err)
	}
	return func() int64 {
		out, err := zktest.FourLetter(servers[0], "srvr")
		if err != nil {
			panic(err)
		}
		m := zxidLine.FindStringSubmatch(out)
		if m == nil {
			panic("no Zxid in srvr: " + out)
		}
		z, err := strconv.ParseInt(m[1], 16, 64)
		if err != nil {
			panic(err)
		}
		return z & 0xffffffff
	}
}

// zkStore connects to the benchmark's ZooKeeper; its contenders' sessions
// are counted by cnt.
func zkStore(tb testing.TB, cnt *zktest.Counter) *store {
	tb.Helper()
	connect := zkConnect(tb)
	raw := zktest.Session(tb, connect, zkSession, nil)
	return &store{name: "zk", url: connect, zk: cnt, writes: zkWrites(tb, connect),
		rt: func(context.Context) error {
			_, _, err := raw.Exists("/")
			return err
		}}
}

// zkContenderFor builds the named ZooKeeper contender, on a session of its
// own, under this run's root node.
func zkContenderFor(tb testing.TB, st *store, which string) *contender {
	tb.Helper()
	root := "/" + run.id
	switch which {
	case "dislock":
		return dislockContender(tb, newDislockZK(tb, st))
	case "zklock":
		return zkLockContender(zktest.Session(tb, st.url, zkSession, st.zk), root+"/zklock")
	}
	tb.Fatalf("no contender zk/%s", which)
	return nil
}

// newDislockZK is a zklock Locker under this run's root node, on a session
// of its own counted by st, closed when tb ends.
func newDislockZK(tb testing.TB, st *store) *core.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := zklock.New(ctx, st.url, zklock.WithRoot("/"+run.id), zklock.WithSessionTimeout(zkSession),
		zklock.WithDialer(st.zk.Dial), zklock.WithLogger(zktest.Quiet{}))
	return kept(tb, "zklock.New", l, err)
}

// zkLockContender is go-zookeeper's zk.Lock on c, a lock node per key under
// base. It has no try-lock: try is Lock, for the benchmarks whose keys are
// free (uncontended, distinct keys). Lock takes no context either. Its
// locks need no renewal: they live with the session.
func zkLockContender(c *zk.Conn, base string) *contender {
	lock := func(ctx context.Context, key string) (unlockFunc, error) {
		l := zk.NewLock(c, base+"/"+key, zk.WorldACL(zk.PermAll))
		if err := l.Lock(); err != nil {
			return nil, err
		}
		return func(context.Context) error { return l.Unlock() }, nil
	}
	return &contender{try: lock, wait: lock,
		lease: func(ctx context.Context, key string, _ time.Duration) (func(context.Context) error, error) {
			_, err := lock(ctx, key)
			return func(context.Context) error { return nil }, err
		}}
}

// zkHold is hold's ZooKeeper part: 1,000 locks held, by dislock (renewed by
// its renewer, one multi per interval) or by zk.Lock (nothing to renew).
// It reports per renew interval the client's requests and pings and the
// server's writes.
func zkHold(b *testing.B, which string) {
	ctx := bg(b)
	cnt := &zktest.Counter{}
	st := zkStore(b, cnt)
	if which == "dislock" {
		takeHeld(ctx, b, which, tryHeld(newDislockZK(b, st)))
	} else {
		c := zkContenderFor(b, st, which) // one session for all 1,000
		takeHeld(ctx, b, which, func(ctx context.Context, key string) error {
			_, err := c.lease(ctx, key, holdTTL)
			return err
		})
	}
	reportHeld(b, perInterval{"srv-writes/interval", st.writes}, perInterval{"client-reqs/interval", cnt.Reqs.Load},
		perInterval{"client-pings/interval", cnt.Pings.Load})
}
