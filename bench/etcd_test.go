package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/benchtest"
	"github.com/dislock/dislock/internal/testenv"
)

// etcd: dislock's etcdlock beside etcd's own recipe, concurrency.Mutex (the
// client version etcdlock uses: one Session, that is one lease kept alive,
// per contender; TryLock, Lock and Unlock), with a linearizable Get as the
// raw round trip. writes counts the Raft entries the server applied (its
// applied index, read with the Maintenance Status call): every put, delete
// and transaction, failed ones included, and lease grants and revokes;
// keepalives and reads are none. The revision would leave out transactions
// that wrote nothing and the leases' grants and revokes.

var etcdContenders = []string{"dislock", "mutex"}

// etcdServeEnv, set in the environment of a copy of the test binary, makes
// its TestMain serve etcd (serveEtcd) in the directory it names instead of
// running tests.
const etcdServeEnv = "DISLOCK_BENCH_ETCD_SERVE"

var etcdRun struct {
	once sync.Once
	url  string
	pid  int // the private server's process; 0 on DISLOCK_BENCH_ETCD
	err  error
}

// etcdURL returns the etcd:// URL of the benchmark's etcd: DISLOCK_BENCH_ETCD
// when set (checked to accept connections: failing under CI=true, skipping
// otherwise), else a private one-member server started once per run and
// stopped at exit. The private server is go.etcd.io/etcd/server/v3's
// embedded server, the version of etcdlock's client, in a process of its
// own (this test binary, re-run with etcdServeEnv: see serveEtcd), on
// loopback ports, with etcdtest's settings (TickMs 10, ElectionMs 100, no
// fsync), so that the client's CPU time and the server's are apart, as for
// ZooKeeper and Redis.
func etcdURL(tb testing.TB) string {
	tb.Helper()
	if raw := os.Getenv("DISLOCK_BENCH_ETCD"); raw != "" {
		cfg, err := etcdlock.ParseURL(raw)
		if err != nil {
			tb.Fatal(err) // ParseURL's errors never hold the URL
		}
		host := strings.TrimPrefix(strings.TrimPrefix(cfg.Endpoints[0], "http://"), "https://")
		conn, err := net.DialTimeout("tcp", host, 3*time.Second)
		if err != nil {
			msg := "DISLOCK_BENCH_ETCD: the server does not accept connections"
			if testenv.CI() {
				tb.Fatal(msg)
			}
			tb.Skip(msg)
		}
		conn.Close()
		deleteEtcdAtExit(raw)
		return raw
	}
	etcdRun.once.Do(func() { etcdRun.url, etcdRun.pid, etcdRun.err = startEtcd() })
	if etcdRun.err != nil {
		tb.Fatalf("private etcd: %v", etcdRun.err)
	}
	return etcdRun.url
}

// startEtcd starts the private server (serveEtcd in a copy of this
// binary), waits until it serves, and stops it at exit by closing its
// standard input.
func startEtcd() (url string, pid int, err error) {
	dir, err := os.MkdirTemp("", "dlbench-etcd-")
	if err != nil {
		return "", 0, err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), etcdServeEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		os.RemoveAll(dir)
		return "", 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		os.RemoveAll(dir)
		return "", 0, err
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", 0, err
	}
	stop := func() {
		stdin.Close()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-ready:
		u, ok := strings.CutPrefix(line, "ready ")
		if !ok {
			stop()
			return "", 0, errors.New("the server exited before serving")
		}
		atExit(stop)
		return u, cmd.Process.Pid, nil
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		stop()
		return "", 0, errors.New("not serving within 60s")
	}
}

// serveEtcd is the private server's process: a one-member etcd in dir on
// free loopback ports. It writes "ready etcd://host:port" to its standard
// output once it serves, and stops when its standard input ends (the
// benchmark's exit, or its death).
func serveEtcd(dir string) int {
	ports, err := testenv.LoopbackPorts(2)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench etcd:", err)
		return 1
	}
	at := func(p int) *url.URL {
		return &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))}
	}
	cu, pu := at(ports[0]), at(ports[1])
	cfg := embed.NewConfig()
	cfg.Name = "bench"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench etcd:", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "bench etcd:", err)
		return 1
	}
	fmt.Printf("ready etcd://%s\n", cu.Host)
	stdinDone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinDone)
	}()
	select {
	case <-stdinDone:
		return 0
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "bench etcd:", err)
		return 1
	}
}

// deleteEtcdAtExit removes this run's keys from the server at raw (a shared
// one: DISLOCK_BENCH_ETCD) at exit.
func deleteEtcdAtExit(raw string) {
	cleanAtExit("etcd "+raw, func(ctx context.Context) {
		cfg, err := etcdlock.ParseURL(raw)
		if err != nil {
			return
		}
		cfg.Logger = zap.NewNop()
		cli, err := clientv3.New(cfg)
		if err != nil {
			return
		}
		defer cli.Close()
		if _, err := cli.Delete(ctx, run.id+"/", clientv3.WithPrefix()); err != nil {
			fmt.Fprintf(os.Stderr, "bench: delete etcd keys %s/: %v\n", run.id, err)
		}
	})
}

// etcdClient is a client on raw (an etcd:// URL), counted by cnt when not
// nil, closed when tb ends: one per contender, as a process has one.
func etcdClient(tb testing.TB, raw string, cnt *etcdtest.Counter) *clientv3.Client {
	tb.Helper()
	cfg, err := etcdlock.ParseURL(raw)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.Logger = zap.NewNop()
	if cnt != nil {
		cfg.DialOptions = append(cfg.DialOptions, cnt.DialOptions()...)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		tb.Fatalf("etcd client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// etcdStore connects to the benchmark's etcd; its contenders' clients are
// counted by cnt. The round trip (a linearizable Get of a key of this run)
// and the applied-index reads go through a client of their own, not
// counted.
func etcdStore(tb testing.TB, cnt *etcdtest.Counter) *store {
	tb.Helper()
	u := etcdURL(tb)
	raw := etcdClient(tb, u, nil)
	rttKey := run.id + "/rtt"
	st := &store{name: "etcd", url: u, etcd: cnt,
		rt: func(ctx context.Context) error {
			_, err := raw.Get(ctx, rttKey)
			return err
		},
		writes: func() int64 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := raw.Status(ctx, raw.Endpoints()[0])
			if err != nil {
				panic(fmt.Sprintf("etcd status: %v", err))
			}
			return int64(s.RaftAppliedIndex)
		}}
	if os.Getenv("DISLOCK_BENCH_ETCD") == "" {
		revokeLeftLeases(tb, raw)
	}
	if pid := etcdRun.pid; pid != 0 && os.Getenv("DISLOCK_BENCH_ETCD") == "" {
		if _, ok := benchtest.ProcCPU(pid); ok {
			st.serverCPU = func(context.Context) (time.Duration, error) {
				d, _ := benchtest.ProcCPU(pid)
				return d, nil
			}
		}
	}
	return st
}

// revokeLeftLeases revokes, when tb ends, the leases granted on the private
// server since now that are still there once the store's contenders are
// closed (cleanups run last-in first-out: this one after theirs). A lease
// left to expire would be a server write (its revoke) in a later
// benchmark. (Before etcdlock granted one shared lease per TTL at a time,
// a Locker's concurrent first claims each granted a lease, and Close
// revoked only the one it still shared: TryAcquire on 16 goroutines left
// up to 15 to expire. Now neither contender leaves any when it closes
// cleanly: this is a guard.) The count goes to the log.
func revokeLeftLeases(tb testing.TB, cli *clientv3.Client) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cli.Leases(ctx)
	if err != nil {
		tb.Fatalf("etcd leases: %v", err)
	}
	before := map[clientv3.LeaseID]bool{}
	for _, l := range r.Leases {
		before[l.ID] = true
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := cli.Leases(ctx)
		if err != nil {
			tb.Errorf("etcd leases: %v", err)
			return
		}
		n := 0
		for _, l := range r.Leases {
			if before[l.ID] {
				continue
			}
			if _, err := cli.Revoke(ctx, l.ID); err == nil {
				n++
			}
		}
		if n > 0 {
			tb.Logf("revoked %d leases the contenders left", n)
		}
	})
}

// etcdContenderFor builds the named etcd contender on a client of its own,
// under this run's keys. goroutines is how many goroutines will drive it at
// once: concurrency.Mutex gets as many sessions (see mutexContender).
func etcdContenderFor(tb testing.TB, st *store, which string, goroutines int) *contender {
	tb.Helper()
	switch which {
	case "dislock":
		return dislockContender(tb, newDislockEtcd(tb, st))
	case "mutex":
		cli := etcdClient(tb, st.url, st.etcd)
		sessions := make([]*concurrency.Session, goroutines)
		for i := range sessions {
			sessions[i] = etcdSession(tb, cli, ttl)
		}
		return mutexContender(sessions, run.id+"/mutex/")
	}
	tb.Fatalf("no contender etcd/%s", which)
	return nil
}

// newDislockEtcd is an etcdlock Locker on a client of its own counted by
// st, under this run's prefix, closed when tb ends.
func newDislockEtcd(tb testing.TB, st *store) *core.Client {
	tb.Helper()
	cli := etcdClient(tb, st.url, st.etcd)
	l, err := etcdlock.New(cli, etcdlock.WithPrefix(run.id+"/dislock/"))
	return kept(tb, "etcdlock.New", l, err)
}

// etcdSession is a concurrency.Session (a lease of the given TTL, kept
// alive by the client) on cli, closed (its lease revoked) when tb ends.
func etcdSession(tb testing.TB, cli *clientv3.Client, ttl time.Duration) *concurrency.Session {
	tb.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl.Seconds())))
	if err != nil {
		tb.Fatalf("etcd session: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// mutexContender is etcd's concurrency.Mutex on sessions, a lock prefix
// per key under base. try is TryLock (a transaction that puts the
// session's key and reads the owner; when another owns the lock, a delete
// of the key it put), wait is Lock (the key stays, and the waiter watches
// the key created before its own), and the release is Unlock (a delete).
// Its locks need no renewal: they live with the session's lease.
//
// A Mutex excludes sessions, not goroutines: two goroutines locking one key
// on one session would both hold it. So each call takes a session no other
// call of this contender is using, and keeps it while it holds the lock, as
// a program sharing one contender among goroutines has to; there must be a
// session for every goroutine that drives the contender at once.
func mutexContender(sessions []*concurrency.Session, base string) *contender {
	free := make(chan *concurrency.Session, len(sessions))
	for _, s := range sessions {
		free <- s
	}
	lock := func(ctx context.Context, key string, wait bool) (unlockFunc, error) {
		var s *concurrency.Session
		select {
		case s = <-free:
		default:
			return nil, errors.New("bench: more goroutines on a Mutex contender than it has sessions")
		}
		m := concurrency.NewMutex(s, base+key)
		var err error
		if wait {
			err = m.Lock(ctx)
		} else {
			err = m.TryLock(ctx)
		}
		if err != nil {
			free <- s
			if errors.Is(err, concurrency.ErrLocked) {
				return nil, errBusy
			}
			return nil, err
		}
		return func(ctx context.Context) error {
			defer func() { free <- s }()
			return m.Unlock(ctx)
		}, nil
	}
	return &contender{
		try: func(ctx context.Context, key string) (unlockFunc, error) { return lock(ctx, key, false) },
		wait: func(ctx context.Context, key string) (unlockFunc, error) {
			return lock(ctx, key, true)
		},
	}
}

// etcdHold is hold's etcd part: 1,000 locks held, by dislock (one Locker:
// the sessions of one TTL share a lease, kept alive on one stream, and its
// renewer checks the owners with transactions of up to 128 reads) or by
// concurrency.Mutex (all 1,000 on one Session of the TTL, as one process
// holds them: the session's lease keepalives are their renewal). It
// reports per renew interval the server's writes, and the client's
// requests (unary calls, streams opened and messages on streams) and, of
// those, the messages on streams (keepalives).
func etcdHold(b *testing.B, which string) {
	ctx := bg(b)
	cnt := &etcdtest.Counter{}
	st := etcdStore(b, cnt)
	if which == "dislock" {
		takeHeld(ctx, b, which, tryHeld(newDislockEtcd(b, st)))
	} else {
		s := etcdSession(b, etcdClient(b, st.url, cnt), holdTTL)
		takeHeld(ctx, b, which, func(ctx context.Context, key string) error {
			return concurrency.NewMutex(s, run.id+"/mutex/"+key).TryLock(ctx)
		})
	}
	reportHeld(b, perInterval{"srv-writes/interval", st.writes}, perInterval{"client-reqs/interval", cnt.All},
		perInterval{"client-stream-msgs/interval", cnt.StreamMsgs.Load})
}
