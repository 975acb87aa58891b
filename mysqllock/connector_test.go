package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dislock/dislock/internal/mysqltest"
	"github.com/dislock/dislock/internal/testenv"
	"github.com/dislock/dislock/mysqllock"
)

// lines is a go-sql-driver/mysql Logger that keeps what it is given.
type lines struct {
	mu sync.Mutex
	l  []string
}

func (l *lines) Print(v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.l = append(l.l, fmt.Sprint(v...))
}

func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.l...)
}

// Rule: a statement whose ctx ends while the server works on it returns at
// ctx's end with ctx's error, on a pool of Connector as on one of the
// driver's own, plain or prepared, with rows or without; its connection is not used again, and
// the pool goes on with a new one. Connector's cut is not logged. A config
// with a dial function of its own is left to the driver, whose cut it
// gets.
func TestStatementEndsWithContext(t *testing.T) {
	for _, via := range []string{"driver", "Connector", "Connector, own dial"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			mc, err := mysqllock.ParseDSN(testenv.MySQL(t))
			if err != nil {
				t.Fatal(err)
			}
			var log lines
			mc.Logger = &log
			var db *sql.DB
			switch via {
			case "Connector":
				db = mysqltest.OpenWith(t, mc, mysqllock.Connector)
			case "Connector, own dial":
				mc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, network, addr)
				}
				db = mysqltest.OpenWith(t, mc, mysqllock.Connector)
			default:
				db = mysqltest.OpenWith(t, mc, nil)
			}
			db.SetMaxOpenConns(1)
			ctx := ctxT(t)
			var first int64
			if err := db.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&first); err != nil {
				t.Fatal(err)
			}
			stmt, err := db.PrepareContext(ctx, "DO SLEEP(?)")
			if err != nil {
				t.Fatal(err)
			}
			defer stmt.Close()
			query, err := db.PrepareContext(ctx, "SELECT SLEEP(?)")
			if err != nil {
				t.Fatal(err)
			}
			defer query.Close()
			var slept int
			for _, run := range []struct {
				name string
				exec func(context.Context) error
			}{
				{"plain", func(ctx context.Context) error { _, err := db.ExecContext(ctx, "DO SLEEP(10)"); return err }},
				{"prepared", func(ctx context.Context) error { _, err := stmt.ExecContext(ctx, 10); return err }},
				{"query", func(ctx context.Context) error { return db.QueryRowContext(ctx, "SELECT SLEEP(10)").Scan(&slept) }},
				{"prepared query", func(ctx context.Context) error { return query.QueryRowContext(ctx, 10).Scan(&slept) }},
			} {
				const d = 200 * time.Millisecond
				sctx, cancel := context.WithTimeout(ctx, d)
				start := time.Now()
				err := run.exec(sctx)
				took := time.Since(start)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: a 10s statement with a %v ctx: %v, want the ctx's error", run.name, d, err)
				}
				if took > d+3*time.Second {
					t.Errorf("%s: a 10s statement with a %v ctx returned after %v", run.name, d, took)
				}
				var id int64
				if err := db.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
					t.Fatalf("%s: the pool after the cut: %v", run.name, err)
				}
				if id == first {
					t.Errorf("%s: the connection of the cut statement (%d) was used again", run.name, id)
				}
				first = id
			}
			if via == "Connector" {
				for _, l := range log.all() {
					if strings.Contains(l, "closed network connection") {
						t.Errorf("the driver logged a cut: %q", l)
					}
				}
			}
		})
	}
}
