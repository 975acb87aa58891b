package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/mysqllock"
)

// A job that must not run twice at once across machines, on a pool the
// Locker makes for itself from a URL (MYSQL_URL, say
// mysql://app:secret@db:3306/app).
func Example() {
	ctx := context.Background()
	locker, err := mysqllock.Open(ctx, os.Getenv("MYSQL_URL"), mysqllock.WithAutoMigrate())
	if err != nil {
		log.Fatal(err) // never quotes the URL or its password
	}
	defer locker.Close() // closes the pool too

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

// A Locker on the program's own pool, which it keeps: Close leaves db
// open. Waiting for the key with Acquire queues the caller on the server.
func ExampleNew() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	locker, err := mysqllock.New(ctx, db, mysqllock.WithAutoMigrate())
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := locker.Acquire(wctx, "invoice-run")
	if err != nil {
		log.Fatal(err) // errors.Is(err, core.ErrNotAcquired) when still held at the deadline
	}
	defer s.Release(ctx)
	fmt.Println("held", s.Key())
}

// The program's own pool made as Open makes its pool: a statement whose
// ctx ends is cut short by closing its socket, without the driver's
// watcher goroutine per statement.
func ExampleConnector() {
	ctx := context.Background()
	cfg, err := mysqllock.ParseDSN(os.Getenv("MYSQL_URL"))
	if err != nil {
		log.Fatal(err)
	}
	conn, err := mysqllock.Connector(cfg)
	if err != nil {
		log.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	locker, err := mysqllock.New(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
}
