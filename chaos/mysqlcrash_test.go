package chaos

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/mysqllock"
)

// TestChaosMySQLCrash kills a private MariaDB server with SIGKILL while
// holders, waiters and a witness taking a fresh lock every 10 ms run,
// restarts it on the same data directory, and checks what durable commits
// (innodb_flush_log_at_trx_commit=1) promise: every acknowledged
// acquisition is still in the table with its holder and token, no two
// holders overlap, fencing tokens keep increasing across the crash, and
// every holder either keeps its lock or is told it lost it.
func TestChaosMySQLCrash(t *testing.T) {
	srv := startMySQLServer(t, true)
	ctx := context.Background()
	prefix := runPrefix("mysql-crash")
	const table = "dislock_crash"
	keys := []string{prefix + "hot-0", prefix + "hot-1"}
	logs := &sink{}
	rec := NewRecorder(0)

	adminDB := srv.open(srv.config(sentinelPW))
	defer adminDB.Close()
	admin, err := mysqllock.New(ctx, adminDB, mysqllock.WithTable(table), mysqllock.WithAutoMigrate())
	if err != nil {
		t.Fatalf("lock table: %v", err)
	}
	defer admin.Close()
	dsn := srv.config(sentinelPW).FormatDSN()
	newLocker := func(ctx context.Context, opts ...core.ClientOption) (core.Locker, func() error, error) {
		l, err := mysqllock.Open(ctx, dsn, mysqllock.WithTable(table), mysqllock.WithClientOptions(opts...))
		if err != nil {
			return nil, nil, err
		}
		return l, l.Close, nil
	}
	env := &backendEnv{name: "mysql-crash", admin: admin, keyPrefix: prefix, newLocker: newLocker}
	env.probe = func(ctx context.Context) error {
		db := srv.open(srv.config(sentinelPW))
		defer db.Close()
		_, err := db.ExecContext(ctx, "SELECT 1")
		return err
	}
	defer withRegister(t, env, keys)() // the fenced register lives elsewhere: it survives the crash

	w, endWitness := startWitness(t, rec, logs, prefix, 10*time.Millisecond, newLocker)
	defer endWitness()

	crash, cc := crashStep("mysql-crash", false, srv.crash, srv.start)
	cfg := runConfig{contenders: 3, keys: len(keys), timing: shortTiming}
	rep, allowed := runSteps(t, cfg, env, keys, rec, logs, 2*time.Second, []stepFault{crash})
	if len(allowed) > 0 {
		t.Errorf("durable commits: a crash must not let two holders in, but %d violations came from it", len(allowed))
	}

	// Every witness holder has renewed (or been refused) since the restart.
	w.halt()
	look := func(ctx context.Context, keys []string) (map[string]uint64, error) {
		args := make([]any, len(keys))
		for i, k := range keys {
			args[i] = k
		}
		// Held rows only: a lock the crash lost is missing or ended.
		rows, err := adminDB.QueryContext(ctx, "SELECT `key`, token FROM "+table+" WHERE holder <> '' AND `key` IN "+inList(len(keys)), args...)
		if err != nil {
			return nil, err
		}
		return scanTokens(rows)
	}
	figs := w.measure(t, rec.History(), look)
	if len(figs) != 1 {
		t.Fatalf("want the figures of one crash, got %d", len(figs))
	}
	f := figs[0]
	var before int
	if err := adminDB.QueryRowContext(ctx, "SELECT count(*) FROM "+table+" WHERE holder <> '' AND acquired_at < ?", cc.killedAt.UnixMicro()).Scan(&before); err != nil {
		t.Fatal(err)
	}
	regressions := f.Regressions + tokenRegressions(rep)
	figure(t, "MariaDB crash (kill -9, durable commits): %v; server down %v; %d held rows from before the crash left; %d token regressions in the contenders' history",
		f, cc.down.Round(time.Millisecond), before, tokenRegressions(rep))
	checkCrash(t, f, regressions)
	if f.Lost != 0 {
		t.Errorf("durable commits: %d acknowledged acquisitions were lost in the crash, want 0", f.Lost)
	}
	checkNoSecret(t, "mysql crash", logs.String(), libLogs.String())
}

// scanTokens reads (key, token) rows into a map.
func scanTokens(rows *sql.Rows) (map[string]uint64, error) {
	out := map[string]uint64{}
	if err := eachToken(rows, func(k string, tok uint64) { out[k] = tok }); err != nil {
		return nil, err
	}
	return out, nil
}

// eachToken calls add with each (key, token) row of rows, and closes rows.
func eachToken(rows *sql.Rows, add func(key string, token uint64)) error {
	defer rows.Close()
	for rows.Next() {
		var k string
		var tok int64
		if err := rows.Scan(&k, &tok); err != nil {
			return err
		}
		add(k, uint64(tok))
	}
	return rows.Err()
}
