package zklock_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/internal/zktest"
	"github.com/dislock/dislock/zklock"
)

// Servers the tests start are shared by the package's tests and stopped by
// TestMain, by PID.
var (
	serversMu sync.Mutex
	servers   = map[int]*zktest.Ensemble{} // size -> ensemble
	serverDir string
)

// ensemble returns the private ensemble of n nodes (1: standalone),
// starting it on first use. Under CI a missing ZooKeeper install fails the
// test; elsewhere it skips it.
func ensemble(t testing.TB, n int) *zktest.Ensemble {
	t.Helper()
	serversMu.Lock()
	defer serversMu.Unlock()
	if e := servers[n]; e != nil {
		return e
	}
	zktest.Need(t)
	if serverDir == "" {
		d, err := os.MkdirTemp("", "zklocktest-")
		if err != nil {
			t.Fatal(err)
		}
		serverDir = d
	}
	dir, err := os.MkdirTemp(serverDir, "ens")
	if err != nil {
		t.Fatal(err)
	}
	e, err := zktest.Start(dir, n, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	servers[n] = e
	return e
}

// stopServers stops the servers; when the tests failed, it first prints
// the end of the ensembles' logs.
func stopServers(failed bool) {
	serversMu.Lock()
	defer serversMu.Unlock()
	for n, e := range servers {
		if failed {
			fmt.Fprintf(os.Stderr, "ZooKeeper servers (%d):\n%s", n, e.LogTail(40))
		}
		e.Stop()
		delete(servers, n)
	}
	if serverDir != "" {
		os.RemoveAll(serverDir)
	}
}

// singleConnect is the connect string of the single-server runs:
// DISLOCK_TEST_ZK (zk://host:port[,host:port][/chroot]) when set, otherwise
// a private standalone server.
func singleConnect(t testing.TB) string {
	t.Helper()
	if raw := os.Getenv("DISLOCK_TEST_ZK"); raw != "" {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != "zk" || u.Host == "" {
			t.Fatal("DISLOCK_TEST_ZK is not a zk://host:port URL")
		}
		c := u.Host + strings.TrimSuffix(u.Path, "/")
		if _, _, err := rawConn(t, c).Exists("/"); err != nil {
			msg := "DISLOCK_TEST_ZK: server not reachable: " + err.Error()
			if testenv.CI() {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		return c
	}
	return ensemble(t, 1).Connect()
}

type nopLogger struct{}

func (nopLogger) Printf(string, ...any) {}

// rawConn is a plain client connection (an operator, another process),
// closed when t ends.
func rawConn(t testing.TB, connect string) *zk.Conn {
	t.Helper()
	servers, _, err := zklock.ParseServers(connect)
	if err != nil {
		t.Fatal(err)
	}
	conn, _, err := zk.Connect(servers, 5*time.Second, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}

// ctxT is testenv.Context: a context that ends after d, or with the test.
func ctxT(t testing.TB, d time.Duration) context.Context { return testenv.Context(t, d) }

// testRoot is a root znode unique to one test.
func testRoot() string { return "/" + testenv.Name("dislocktest-") }

// newBackend dials a Backend for a test, closed when t ends.
func newBackend(t testing.TB, connect, root string, opts ...zklock.Option) *zklock.Backend {
	t.Helper()
	all := append([]zklock.Option{zklock.WithRoot(root), zklock.WithSessionTimeout(2 * time.Second)}, opts...)
	b, err := zklock.NewBackend(ctxT(t, 30*time.Second), connect, all...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
