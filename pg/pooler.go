package pg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Transaction poolers (PgBouncer in pool_mode = transaction, and others
// like it) hand each transaction to whichever server connection is free.
// Two things then break: prepared statements (a connection's statement
// cache names statements that another server connection has, or that this
// one lacks), and LISTEN (the server connection that subscribed goes back
// to the pooler's pool, which drops its notifications). This file detects
// both and says what to set.

// ErrListenUnavailable is matched (errors.Is) by the error a Backend's Watch
// returns, and reports to ListenObservers, when its LISTEN connection is
// accepted but notifications do not reach it, as through a transaction
// pooler. The Backend then stops listening and waiters poll.
var ErrListenUnavailable = errors.New("pg: LISTEN is accepted but notifications do not arrive")

// listenFix is what the warning and the error tell the user to do.
const listenFix = "the LISTEN connection probably goes through a transaction pooler (PgBouncer pool_mode = transaction); " +
	"give it a direct connection to the database server with WithListenConfig, or turn it off with WithoutListen"

// listenProbeTimeout is how long Watch waits for its probe notification
// after the NOTIFY committed. On a connection that receives notifications
// it arrives within a round trip.
const listenProbeTimeout = 2 * time.Second

// ListenObserver is implemented by Observers (given with WithObserver) that
// want to know when a Backend's release notifications cannot work. It is
// called once per Backend, from the Locker's watcher goroutine, and must be
// fast and safe for concurrent use.
type ListenObserver interface {
	ListenUnavailable(ctx context.Context, e ListenUnavailableEvent)
}

// ListenUnavailableEvent reports that a Backend found its LISTEN connection
// deaf and fell back to polling.
type ListenUnavailableEvent struct {
	Backend string // "pg"
	Table   string // the lock table, as quoted in statements
	Err     error  // matches ErrListenUnavailable and core.ErrUnsupported; says what to set
}

// WithLogger sets the logger for the Backend's warnings (default
// slog.Default()): the one warning there is says that its release
// notifications cannot work (see ErrListenUnavailable). No connection
// string, host or password is ever logged. Pass
// slog.New(slog.DiscardHandler) to silence it; nil is rejected.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.Invalid("WithLogger", "nil logger")
			return
		}
		c.pooler.logger = l
	}
}

// WithObserver adds o to the Locker New builds (as
// WithClientOptions(core.WithObserver(o)) does) and, when o implements
// ListenObserver, reports the Backend's own events to it. NewBackend keeps
// only the latter: pass o to core.New as well when building the Locker
// yourself.
func WithObserver(o core.Observer) Option {
	return func(c *config) {
		if o == nil {
			return
		}
		c.ClientOpts = append(c.ClientOpts, core.WithObserver(o))
		if lo, ok := o.(ListenObserver); ok {
			c.pooler.observers = append(c.pooler.observers, lo)
		}
	}
}

// poolerConfig holds the options of this file.
type poolerConfig struct {
	logger    *slog.Logger     // WithLogger; nil: slog.Default()
	observers []ListenObserver // WithObserver
}

// listenState remembers that the Backend's LISTEN cannot work, so that it
// warns once and no later subscription opens a useless connection.
type listenState struct {
	dead atomic.Bool
	once sync.Once
}

// listenFallback is what Watch returns once LISTEN is known not to work:
// core.ErrUnsupported makes the engine poll without resubscribing.
var listenFallback = fmt.Errorf("pg: listen: %w: %w; waiters poll: %s", core.ErrUnsupported, ErrListenUnavailable, listenFix)

func (b *Backend) logger() *slog.Logger {
	if b.cfg.pooler.logger != nil {
		return b.cfg.pooler.logger
	}
	return slog.Default()
}

// probeChannel returns a channel name no other subscription uses.
func probeChannel() string {
	var r [8]byte
	_, _ = rand.Read(r[:])
	return "dislock_probe_" + hex.EncodeToString(r[:])
}

// probeListen checks that conn, which LISTENs on probe and the table's
// channel, receives notifications: it sends a NOTIFY on probe through the
// pool, the way releases notify, and waits for it. Notifications of the
// table's channel that arrive meanwhile go to fn. It returns
// listenFallback, after warning once, when the probe does not arrive.
//
// A slow connection is not a deaf one: when the wait times out, a round
// trip on conn collects any notification the server sent it before its
// reply (the NOTIFY had committed before the wait began). Only when that
// round trip succeeds without the probe is LISTEN known not to work; when
// it fails, the error is an ordinary one and the engine subscribes again.
func (b *Backend) probeListen(ctx, setup context.Context, conn *pgx.Conn, probe string, fn func(string)) error {
	if _, err := b.pool.Exec(setup, "NOTIFY "+pgx.Identifier{probe}.Sanitize(), pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("pg: listen: probe: %w", err)
	}
	wait, cancel := context.WithTimeout(ctx, listenProbeTimeout)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wait)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && wait.Err() != nil:
			return b.probeRoundTrip(ctx, setup, conn, probe, fn)
		case err != nil:
			return fmt.Errorf("pg: listen: %w", err)
		case n.Channel == probe:
			return nil
		case n.Channel == b.channel:
			fn(n.Payload)
		}
	}
}

// probeRoundTrip ends a probe that timed out: see probeListen.
func (b *Backend) probeRoundTrip(ctx, setup context.Context, conn *pgx.Conn, probe string, fn func(string)) error {
	if _, err := conn.Exec(setup, "SELECT 1", pgx.QueryExecModeSimpleProtocol); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("pg: listen: probe: %w", err)
	}
	// What the round trip received is buffered in conn: an ended ctx
	// reads only that.
	done, cancel := context.WithCancel(ctx)
	cancel()
	found := false
	for {
		n, err := conn.WaitForNotification(done)
		if err != nil || n == nil {
			break
		}
		switch n.Channel {
		case probe:
			found = true
		case b.channel:
			fn(n.Payload)
		}
	}
	if found {
		return nil
	}
	return b.listenUnavailable(ctx)
}

// listenUnavailable records that LISTEN does not work, warns once through
// the logger and the ListenObservers, and returns listenFallback.
func (b *Backend) listenUnavailable(ctx context.Context) error {
	b.listen.dead.Store(true)
	b.listen.once.Do(func() {
		b.logger().LogAttrs(ctx, slog.LevelWarn,
			"dislock/pg: release notifications do not arrive on the LISTEN connection; waiters poll instead, so hand-offs are slower",
			slog.String("table", b.table),
			slog.String("fix", listenFix))
		e := ListenUnavailableEvent{Backend: b.Name(), Table: b.table, Err: listenFallback}
		for _, o := range b.cfg.pooler.observers {
			o.ListenUnavailable(ctx, e)
		}
	})
	return listenFallback
}

// poolerHint adds what to set to the error of a statement that failed
// because a prepared statement of the connection's cache is missing
// (26000) or already exists (42P05) on the server: the signature of a
// transaction pooler that does not keep prepared statements per client.
func poolerHint(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (pe.Code != "42P05" && pe.Code != "26000") {
		return err
	}
	return fmt.Errorf("%w; the server connection does not keep this connection's prepared statements, as behind a transaction pooler "+
		"(PgBouncer pool_mode = transaction): set the pool's ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeExec or "+
		"pgx.QueryExecModeSimpleProtocol (default_query_exec_mode=exec in the connection string)", err)
}
