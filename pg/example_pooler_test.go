package pg_test

import (
	"context"
	"log"
	"os"

	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Behind PgBouncer in transaction mode (pool_mode = transaction): the pool
// sends no prepared statements, and LISTEN gets a direct connection to the
// database server. Without one, use pg.WithoutListen() instead: waiters then
// poll.
func ExampleNew_pgBouncer() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL")) // through PgBouncer
	if err != nil {
		log.Fatal(err)
	}
	// Or default_query_exec_mode=exec in the URL; simple_protocol works too.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	direct, err := pgx.ParseConfig(os.Getenv("DATABASE_DIRECT_URL")) // the server itself, for LISTEN
	if err != nil {
		log.Fatal(err)
	}
	locker, err := pg.New(ctx, pool, pg.WithListenConfig(direct))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
}
