package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/zklock"
)

// Example takes a lock on a ZooKeeper ensemble, does the job under it and
// releases it. It needs a server, so it is compiled but not run.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The default TTL is 2/3 of the session timeout the server grants.
	l, err := zklock.New(ctx, "zk1:2181,zk2:2181,zk3:2181", zklock.WithRoot("/myapp/locks"))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	err = core.Do(ctx, l, "nightly-report", func(ctx context.Context) error {
		s, _ := core.SessionFromContext(ctx)
		fmt.Println("running with fencing token", s.Token())
		return nil // ctx is cancelled if the lease is lost
	})
	if errors.Is(err, core.ErrNotAcquired) {
		fmt.Println("another process holds it")
	}
}

// ExampleNewFromConn uses a connection the program already has. The session
// timeout must be the one the server granted: go-zookeeper does not reveal
// it.
func ExampleNewFromConn() {
	conn, _, err := zk.Connect([]string{"127.0.0.1:2181"}, 15*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	l, err := zklock.NewFromConn(conn, 15*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close() // does not close conn
	s, err := l.TryAcquire(context.Background(), "migrations", core.TTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Release(context.Background())
}
