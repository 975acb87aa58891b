package pg

import (
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// promptCut is the longest wait after a ctx ends before a pool
// connection's context watcher cuts the call (sets the connection's
// deadline) that still lets the engine count on the Backend to end its
// calls with their ctx (core.ContextBound): well inside core.DeadlineSlack.
const promptCut = 20 * time.Millisecond

// cutsPromptly reports whether pool's connections end a call within
// promptCut of its ctx's end, whatever the server does: pgx's default
// context watcher sets the connection's deadline at once, and a
// pgconn.CancelRequestContextWatcherHandler does after its DeadlineDelay.
// A handler of another kind, or a builder that fails on the zero PgConn it
// is shown, is not counted on.
func cutsPromptly(pool *pgxpool.Pool) (prompt bool) {
	build := pool.Config().ConnConfig.BuildContextWatcherHandler
	if build == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			prompt = false
		}
	}()
	switch h := build(new(pgconn.PgConn)).(type) {
	case *pgconn.DeadlineContextWatcherHandler:
		return h.DeadlineDelay <= promptCut
	case *pgconn.CancelRequestContextWatcherHandler:
		return h.DeadlineDelay <= promptCut
	}
	return false
}
