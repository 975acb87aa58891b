package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
)

// Run a job on one machine at a time. (Compiled, not run: it needs an etcd
// server.)
func Example() {
	cfg, err := etcdlock.ParseURL(os.Getenv("ETCD_URL")) // etcd://127.0.0.1:2379
	if err != nil {
		log.Fatal(err)
	}
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	locker, err := etcdlock.New(cli)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	ctx := context.Background()
	s, err := locker.TryAcquire(ctx, "nightly-report", core.TTL(10e9))
	if errors.Is(err, core.ErrNotAcquired) {
		fmt.Println("another process runs it")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer s.Release(context.Background())
	// Work under s.Context(), which ends if the lock is lost; pass
	// s.Token() to the resources the job writes.
	fmt.Println("running with token", s.Token())
}

// WithPrefix separates the locks of different applications on one cluster.
func ExampleWithPrefix() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, Logger: zap.NewNop()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	locker, err := etcdlock.New(cli, etcdlock.WithPrefix("billing/locks/"),
		etcdlock.WithClientOptions(core.WithDefaults(core.TTL(15e9))))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
}

// A Locker on a three-member cluster (the README's etcd snippet).
// Compiled, not run: it needs an etcd cluster.
func Example_cluster() {
	if err := lockOnCluster(context.Background()); err != nil {
		log.Print(err)
	}
}

func lockOnCluster(ctx context.Context) error {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"etcd1:2379", "etcd2:2379", "etcd3:2379"},
		DialOptions: etcdlock.StaticWindows(), // no gRPC ping per watch event (ParseURL sets it)
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	locker, err := etcdlock.New(cli, etcdlock.WithPrefix("myapp/locks/"))
	if err != nil {
		return err
	}
	defer locker.Close()
	s, err := locker.TryAcquire(ctx, "reports/daily", core.TTL(15*time.Second)) // a lease of 15 s
	if err != nil {
		return err
	}
	return s.Release(ctx)
}
