package pg_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A job that must not run twice at once across machines.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	locker, err := pg.New(ctx, pool, pg.WithAutoMigrate())
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	s, err := locker.TryAcquire(ctx, "nightly-report", core.TTL(time.Minute))
	if errors.Is(err, core.ErrNotAcquired) {
		fmt.Println("another instance is running")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer s.Release(ctx)

	// Work under s.Context(): it is cancelled if the lease is lost. Hand
	// s.Token() to the systems you write to, so that they can reject a
	// holder whose lease has passed on.
	fmt.Println("running with fencing token", s.Token())
}

// Create the lock table in a step of its own (a migration job, a deploy
// hook), then open Lockers without WithAutoMigrate: their role then needs
// no CREATE privilege.
func ExampleMigrate() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pg.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	locker, err := pg.New(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
}

// At most 4 exports run at once across every machine: each run holds one of
// the 4 permits of the key, with its own lease and fencing token.
func ExampleNew_semaphore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// WithAutoMigrate creates the permits table too (see PermitsSchemaSQL).
	locker, err := pg.New(ctx, pool, pg.WithAutoMigrate())
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	s, err := locker.TryAcquire(ctx, "exports", core.Limit(4), core.TTL(time.Minute))
	if errors.Is(err, core.ErrNotAcquired) {
		fmt.Println("4 exports are running already")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer s.Release(ctx)

	holders, err := locker.Holders(ctx, "exports")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("export %d of at most %d, fencing token %d\n", len(holders), holders[0].Limit, s.Token())
}

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
