// Command quickstart shows dislock's core loop: two workers race for the
// same job, one runs it under the lock, the other sees it busy and then waits
// its turn.
//
// With no environment it runs on the in-process memlock backend. With
// DATABASE_URL set (postgres://…) it uses PostgreSQL; with MYSQL_URL set
// (mysql://user:password@host:port/db) MySQL or MariaDB; with REDIS_URL set
// (redis://…) it uses Redis; with ETCD_URL set (etcd://host:port) it uses
// etcd; with ZK_URL set (zk://host:port[,host:port][/chroot]) it uses
// ZooKeeper. The examples are a module of their own (examples/go.mod): from the
// repository's root,
//
//	go -C examples run ./quickstart
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go -C examples run ./quickstart
//	MYSQL_URL=mysql://root@127.0.0.1:3306/test go -C examples run ./quickstart
//	REDIS_URL=redis://127.0.0.1:6379/0 go -C examples run ./quickstart
//	ETCD_URL=etcd://127.0.0.1:2379 go -C examples run ./quickstart
//	ZK_URL=zk://127.0.0.1:2181 go -C examples run ./quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/examples/internal/exenv"
)

func main() { exenv.Main("quickstart", run) }

func run(ctx context.Context, out io.Writer) error {
	lockers, backend, closeAll, err := exenv.Lockers(ctx, 2)
	if err != nil {
		return err
	}
	a, b := lockers[0], lockers[1]
	defer closeAll()
	fmt.Fprintln(out, "backend:", backend)
	key := fmt.Sprintf("quickstart/report-%d", time.Now().UnixNano())

	// Worker A takes the lock.
	s, err := a.TryAcquire(ctx, key, core.TTL(10*time.Second), core.WithOwner("worker-a"))
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "worker-a: acquired, fencing token", s.Token())

	// Worker B finds it busy, and is told who holds it.
	_, err = b.TryAcquire(ctx, key, core.WithOwner("worker-b"))
	var busy *core.NotAcquiredError
	if errors.As(err, &busy) && busy.Holder != nil {
		fmt.Fprintln(out, "worker-b: busy, held by", busy.Holder.Owner)
	} else if !errors.Is(err, core.ErrNotAcquired) {
		return fmt.Errorf("worker-b: expected busy, got %v", err)
	}

	// Worker B waits; A finishes its work and releases.
	done := make(chan error, 1)
	go func() {
		done <- core.Do(ctx, b, key, func(ctx context.Context) error {
			s, _ := core.SessionFromContext(ctx)
			fmt.Fprintln(out, "worker-b: acquired after waiting, fencing token", s.Token())
			return nil
		}, core.WithOwner("worker-b"))
	}()
	time.Sleep(100 * time.Millisecond) // A's "work"
	fmt.Fprintln(out, "worker-a: releasing")
	if err := s.Release(ctx); err != nil {
		return err
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Fprintln(out, "done")
	return nil
}
