package pg

import (
	"context"
	"fmt"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/jackc/pgx/v5"
)

// listenSetupTimeout bounds connecting and subscribing, so that an
// unavailable LISTEN is an error (the engine then polls) rather than a hang.
const listenSetupTimeout = 10 * time.Second

// Watch implements core.Watcher. It opens one dedicated connection (not
// taken from the pool, so it never starves it), LISTENs on the table's
// channel and calls fn with the key of each release. It returns an error
// when the connection or LISTEN fails, and ctx's error when ctx ends; the
// engine polls meanwhile and retries. Under WithoutListen it returns
// core.ErrUnsupported at once.
//
// Before calling ready it checks that notifications arrive: it LISTENs on
// a private channel too, NOTIFYs it through the pool and waits up to 2s.
// When the probe does not arrive, not even with the reply to a round
// trip made on the connection after that wait (the LISTEN connection goes
// through a transaction pooler), it warns once (WithLogger,
// ListenObserver), closes the connection and returns an error matching
// ErrListenUnavailable and core.ErrUnsupported, so the engine polls; later
// calls return it at once.
//
// A release notifies only when a waiter is queued (see WatchTurns, which the
// engine uses): fn sees those releases, not every one.
func (b *Backend) Watch(ctx context.Context, ready func(), fn func(key string)) error {
	return b.watch(ctx, ready, func(payload string) {
		key, _ := parseTurn(payload)
		fn(key)
	})
}

// watch is Watch and WatchTurns: fn gets each notification's payload.
func (b *Backend) watch(ctx context.Context, ready func(), fn func(payload string)) error {
	if b.cfg.NoListen {
		return core.ErrUnsupported
	}
	if b.listen.dead.Load() {
		return listenFallback
	}
	cc := b.cfg.listenConfig
	if cc == nil {
		cc = b.pool.Config().ConnConfig
	}
	cc = cc.Copy()
	setup, cancel := context.WithTimeout(ctx, listenSetupTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(setup, cc)
	if err != nil {
		return fmt.Errorf("pg: listen: connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	probe := probeChannel()
	if _, err := conn.Exec(setup, "LISTEN "+pgx.Identifier{b.channel}.Sanitize()+"; LISTEN "+pgx.Identifier{probe}.Sanitize(),
		pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("pg: listen: %w", err)
	}
	// A transaction pooler accepts LISTEN but drops the notifications:
	// make sure one arrives before telling the engine to rely on them.
	if err := b.probeListen(ctx, setup, conn, probe, fn); err != nil {
		return err
	}
	cancel()
	ready()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("pg: listen: %w", err)
		}
		if n.Channel == b.channel {
			fn(n.Payload)
		}
	}
}
