package mysqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/go-sql-driver/mysql"
)

// defaultWatchPoll is how long the watcher's wait lasts when no release
// interrupts it: the longest a turn can take to be seen when the releasing
// side could not wake the watcher (see wake in procs.go).
const defaultWatchPoll = 2 * time.Second

// Leave implements core.Queuer: one CALL takes waiter out of key's line;
// when waiter was first in line and the key can be claimed, the next live
// waiter is told in the same call.
func (b *Backend) Leave(ctx context.Context, key, waiter string) error {
	if waiter == "" {
		return nil
	}
	if _, err := b.db.ExecContext(ctx, "CALL "+b.n.proc("leave")+"(?, ?)", []byte(key), []byte(waiter)); err != nil {
		return fmt.Errorf("mysqllock: leave: %w", err)
	}
	return nil
}

// Watch implements core.Watcher: WatchTurns without the waiter's name.
func (b *Backend) Watch(ctx context.Context, ready func(), fn func(key string)) error {
	return b.WatchTurns(ctx, ready, func(key, _ string) { fn(key) })
}

// WatchTurns implements core.Queuer. It takes two connections of the pool
// for as long as it runs: one holds a lock (see holdWaitLock), the other
// runs one CALL of watch that, in a loop, sends the turns of the table's
// log not read yet and then waits for that lock; the waiting one holds a
// named lock of its own, registered in the table's watchers table and
// named, while the watcher runs, by the places this Backend's waiters
// take. A release (ForceRelease, Leave, a grant that leaves a permit free)
// that tells a waiter its turn writes it to the log and, after its commit
// and in the same CALL, ends the wait of the watcher the waiter's place
// names with KILL QUERY (which needs no privilege for the user's own
// connections), or of every watcher of the table when the place names none
// or one that is gone: the loop reads the new turns and waits again, in
// the same CALL (a server that ends the CALL on the kill instead gets the
// next CALL, which reads them first). When the kill is refused (a watcher
// connected as another user) the wait ends by itself within
// defaultWatchPoll. Under WithoutListen it returns core.ErrUnsupported at
// once.
func (b *Backend) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	if b.cfg.NoListen {
		return core.ErrUnsupported
	}
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("mysqllock: watch: %w", err)
	}
	defer conn.Close()
	hold, name, err := b.holdWaitLock(ctx)
	if err != nil {
		return fmt.Errorf("mysqllock: watch: %w", err)
	}
	defer releaseWaitLock(hold, name)
	// The waiting connection holds a lock of its own, registered for the
	// releases to find it by (see wake in procs.go).
	self, err := lockOwnName(ctx, conn)
	if err != nil {
		return fmt.Errorf("mysqllock: watch: %w", err)
	}
	mine := &self
	defer func() {
		b.watching.CompareAndSwap(mine, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		b.db.ExecContext(ctx, "DELETE FROM "+b.n.watchers+" WHERE name = ?", self)
		releaseNamed(conn, self)
	}()
	// From now on this Backend's waiters name this watcher when they
	// queue (and the engine's ready, once the first CALL has registered
	// the watcher, makes every waiter try again, which rewrites the
	// places that named none or an earlier one), so that their turns wake
	// it alone. A turn of theirs before the CALL reads the log is read
	// by it.
	b.watching.Store(mine)
	last := int64(-1) // the first CALL registers the watcher and starts at the log's end
	started := false
	onReady := func(at int64) {
		if !started {
			started = true
			last = at
			ready()
		}
	}
	// Turns commit in an order their ids (AUTO_INCREMENT, taken at the
	// insert) need not follow: each read looks back turnLookback ids for
	// those it has not seen (the gaps below the last id it read).
	seen := map[int64]bool{}
	poll := strconv.FormatFloat(b.cfg.watchPoll.Seconds(), 'f', 3, 64)
	life := strconv.FormatFloat(b.cfg.watchLife.Seconds(), 'f', 3, 64)
	for {
		low := max(last-turnLookback, 0)
		if !started {
			last = -1
		}
		// One CALL (see watch in procs.go) streams the turns not seen yet
		// and waits for more, in a loop that a wake-up does not end: no
		// request per wake-up. Its arguments are the server's ids and the
		// watcher's lock name, formatted into the statement (no user
		// data): no prepare.
		call := "CALL " + b.n.proc("watch") + "(" + strconv.FormatInt(low, 10) + ", " + strconv.FormatInt(last, 10) +
			", '" + gaps(seen, low, last) + "', '" + name + "', " + poll + ", " + life + ", '" + self + "')"
		var gone bool
		var err error
		last, gone, err = b.watchCall(ctx, conn, call, last, seen, onReady, fn)
		if gone {
			// The lock's holding connection is gone.
			conn.ExecContext(ctx, "DO RELEASE_LOCK('"+name+"')")
			return errors.New("mysqllock: watch: the connection holding the watcher's wait lock was lost")
		}
		switch {
		case err == nil, interrupted(err):
			// The CALL's life is over; or a server ended it on a kill, or
			// at its limit on a statement's time: call again.
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			return fmt.Errorf("mysqllock: watch: %w", err)
		}
	}
}

// gaps lists, comma-separated, the ids in (low, last] not in seen: the
// turns that may still commit (or were rolled back).
func gaps(seen map[int64]bool, low, last int64) string {
	var out []byte
	for id := low + 1; id <= last; id++ {
		if !seen[id] {
			if len(out) > 0 {
				out = append(out, ',')
			}
			out = strconv.AppendInt(out, id, 10)
		}
	}
	return string(out)
}

// watchCall runs one CALL of watch, which lasts about watchLife unless
// ctx's end (which closes the connection) or the server ends it: it hands
// each turn of each result set of three columns to fn as it arrives (once:
// seen holds the ids handed over, those turnLookback ids below the last one
// dropped), the id of a row ('ready', id) of a first CALL to ready, and
// reports a one-column row 'gone' (the wait's lock was taken: its holding
// connection is gone). It returns the last id seen.
func (b *Backend) watchCall(ctx context.Context, conn *sql.Conn, call string, last int64, seen map[int64]bool,
	ready func(last int64), fn func(key, waiter string)) (int64, bool, error) {
	b.watchCalls.Add(1)
	rows, err := conn.QueryContext(ctx, call)
	if err != nil {
		return last, false, err
	}
	defer rows.Close()
	gone := false
	for {
		cols, err := rows.Columns()
		if err != nil {
			return last, gone, err
		}
		switch len(cols) {
		case 2:
			for rows.Next() {
				var status string
				var at int64
				if err := rows.Scan(&status, &at); err != nil {
					return last, gone, err
				}
				ready(at)
				last = max(last, at)
			}
		case 3:
			for rows.Next() {
				var id int64
				var key, waiter []byte
				if err := rows.Scan(&id, &key, &waiter); err != nil {
					return last, gone, err
				}
				if seen[id] {
					continue
				}
				seen[id] = true
				last = max(last, id)
				fn(string(key), string(waiter))
			}
			for id := range seen {
				if id <= max(last-turnLookback, 0) {
					delete(seen, id)
				}
			}
		default:
			for rows.Next() {
				var status sql.NullString
				if err := rows.Scan(&status); err != nil {
					return last, gone, err
				}
				gone = gone || status.String == "gone"
			}
		}
		if !rows.NextResultSet() {
			break
		}
	}
	if err := rows.Err(); err != nil {
		return last, gone, err
	}
	return last, gone, rows.Close()
}

// holdWaitLock takes a second connection of the pool and holds on it the
// named lock the watcher's wait blocks on (GET_LOCK with a timeout): a wait
// that only ends by its timeout or by KILL QUERY. (SLEEP would do, but
// MariaDB's sleepers share one mutex, on which concurrent kills of several
// sleepers stall each other for up to two seconds; a lock wait has a mutex
// of its own per connection.)
func (b *Backend) holdWaitLock(ctx context.Context) (*sql.Conn, string, error) {
	hold, err := b.db.Conn(ctx)
	if err != nil {
		return nil, "", err
	}
	name, err := lockOwnName(ctx, hold)
	if err != nil {
		hold.Close()
		return nil, "", err
	}
	return hold, name, nil
}

// lockOwnName takes, on conn, a named lock that holds the connection's id,
// so unique on the server while the connection lives, and a random part,
// so that a connection that gets the id of a dead one after a server
// restart never takes the name a waiter's place still holds; it returns
// the name.
func lockOwnName(ctx context.Context, conn *sql.Conn) (string, error) {
	var r [8]byte
	rand.Read(r[:])
	part := hex.EncodeToString(r[:])
	// One statement: CONNECTION_ID() is the same in both places.
	var id int64
	var got sql.NullInt64
	err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID(), GET_LOCK(CONCAT('dislock-watch:', CONNECTION_ID(), ':"+part+"'), 0)").
		Scan(&id, &got)
	if err != nil {
		// Whether it took the lock is unknown: the connection goes.
		conn.Raw(func(any) error { return driver.ErrBadConn })
		return "", err
	}
	name := "dislock-watch:" + strconv.FormatInt(id, 10) + ":" + part
	if got.Int64 != 1 {
		releaseNamed(conn, name)
		return "", errors.New("the named lock " + name + " is held elsewhere")
	}
	return name, nil
}

// releaseWaitLock releases the wait lock and returns its connection to the
// pool, or drops the connection when the release failed.
func releaseWaitLock(hold *sql.Conn, name string) {
	releaseNamed(hold, name)
	hold.Close()
}

// releaseNamed releases a named lock of conn; when that fails, conn is
// marked bad, so that the pool drops it (and the server the lock) instead
// of handing out a connection that holds it.
func releaseNamed(conn *sql.Conn, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "DO RELEASE_LOCK('"+name+"')"); err != nil {
		conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

// watchLife is how long a CALL of watch runs (it ends after the first read
// past it, so at most a watch poll longer): Migrate's replacement of the
// procedure waits for the CALLs that run it, about this long.
const watchLife = 20 * time.Second

// turnLookback is how many ids before the last one read each read of the
// turns looks at again, for the turns that committed after a later one.
const turnLookback = 256

// interrupted reports a statement ended by KILL QUERY (ER_QUERY_INTERRUPTED)
// or by a limit of the server on a statement's time (MariaDB's
// max_statement_time, ER_STATEMENT_TIMEOUT; MySQL's ER_QUERY_TIMEOUT): the
// watcher calls again.
func interrupted(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1317 || me.Number == 1969 || me.Number == 3024)
}
