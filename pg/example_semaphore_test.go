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
