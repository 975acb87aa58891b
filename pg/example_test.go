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
