package mysqllock_test

import (
	"context"
	"database/sql"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/mysqllock"
	"github.com/go-sql-driver/mysql"
)

// countingDB is a pool whose connections count the packets they write.
func countingDB(t *testing.T, writes *atomic.Int64) *sql.DB {
	t.Helper()
	cfg, err := mysqllock.ParseDSN(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	name := "dislock-counting-" + t.Name()
	addr := cfg.Addr
	mysql.RegisterDialContext(name, func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, writes: writes}, nil
	})
	cfg.Net = name
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// Rule: an acquire and a release are one request each (one packet written:
// COM_STMT_EXECUTE of a CALL prepared on the connection), once the
// connection has prepared them; a renewal of several leases is one too.
func TestOneRequestPerOperation(t *testing.T) {
	table := freshTable(t)
	var writes atomic.Int64
	db := countingDB(t, &writes)
	ctx := ctxT(t)
	b, err := mysqllock.NewBackend(ctx, db, mysqllock.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	req := core.AcquireRequest{Key: "k", Owner: "o", OwnerToken: "t1", TTL: time.Minute}
	// Warm the connection: its statements are prepared at first use.
	if _, err := b.TryAcquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "t1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Renew(ctx, []core.RenewRequest{{Key: "k", OwnerToken: "t1", TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	count := func(what string, f func() error) {
		t.Helper()
		before := writes.Load()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := writes.Load() - before; n != 1 {
			t.Errorf("%s: %d requests, want 1", what, n)
		}
		t.Logf("%s: 1 request, %v", what, time.Since(start))
	}
	count("acquire", func() error { _, err := b.TryAcquire(ctx, req); return err })
	req2 := core.AcquireRequest{Key: "k2", Owner: "o", OwnerToken: "t2", TTL: time.Minute}
	count("acquire", func() error { _, err := b.TryAcquire(ctx, req2); return err })
	count("renew of 2", func() error {
		res, err := b.Renew(ctx, []core.RenewRequest{{Key: "k", OwnerToken: "t1", TTL: time.Minute}, {Key: "k2", OwnerToken: "t2", TTL: time.Minute}})
		for _, e := range res {
			if e != nil {
				return e
			}
		}
		return err
	})
	count("release", func() error { return b.Release(ctx, core.ReleaseRequest{Key: "k", OwnerToken: "t1"}) })
	count("release", func() error { return b.Release(ctx, core.ReleaseRequest{Key: "k2", OwnerToken: "t2"}) })
}
