// Package exenv picks the backend the examples run on: PostgreSQL when
// DATABASE_URL is set, Redis when REDIS_URL is set, etcd when ETCD_URL is
// set (etcd://host:port[,host:port]), ZooKeeper when ZK_URL is set
// (zk://[user:password@]host:port[,host:port][/chroot]), and otherwise the
// in-process memlock backend, so that every example runs with no server.
// Main and Printer are what the example programs share besides.
package exenv

import (
	"context"
	"errors"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/core/memlock"
	"github.com/dislock/dislock/etcdlock"
	"github.com/dislock/dislock/pg"
	"github.com/dislock/dislock/redislock"
	"github.com/dislock/dislock/zklock"
)

// Lockers returns n Lockers that act as n separate processes on the
// backend the environment selects, its name, and a function that closes
// them all. opts are given to every Locker.
func Lockers(ctx context.Context, n int, opts ...core.ClientOption) (lockers []core.Locker, backend string, closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	open, backend, err := opener(ctx, &closers, opts)
	if err != nil {
		return nil, "", nil, err
	}
	for range n {
		c, err := open()
		if err != nil {
			closeAll()
			return nil, "", nil, err
		}
		lockers = append(lockers, c)
		closers = append(closers, func() { _ = c.Close() })
	}
	return lockers, backend, closeAll, nil
}

// opener returns what opens one Locker (one process) on the backend the
// environment selects, and the backend's description. A connection the
// Locker does not own goes on closers, to be closed after it.
func opener(ctx context.Context, closers *[]func(), opts []core.ClientOption) (open func() (*core.Client, error), backend string, err error) {
	switch {
	case os.Getenv("DATABASE_URL") != "":
		return func() (*core.Client, error) {
			// Each Locker owns its pool; Client.Close closes it.
			return pg.Open(ctx, os.Getenv("DATABASE_URL"), pg.WithAutoMigrate(), pg.WithClientOptions(opts...))
		}, Chosen("PostgreSQL", "DATABASE_URL"), nil
	case os.Getenv("REDIS_URL") != "":
		opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
		if err != nil {
			return nil, "", errors.New("REDIS_URL is not a valid redis:// URL")
		}
		return func() (*core.Client, error) {
			rdb := redis.NewClient(opt)
			*closers = append(*closers, func() { _ = rdb.Close() })
			return redislock.New(rdb, redislock.WithClientOptions(opts...))
		}, Chosen("Redis", "REDIS_URL"), nil
	case os.Getenv("ETCD_URL") != "":
		cfg, err := etcdlock.ParseURL(os.Getenv("ETCD_URL"))
		if err != nil {
			return nil, "", errors.New("ETCD_URL is not a valid etcd:// URL")
		}
		cfg.Logger = zap.NewNop()
		return func() (*core.Client, error) {
			cli, err := clientv3.New(cfg)
			if err != nil {
				return nil, err
			}
			*closers = append(*closers, func() { _ = cli.Close() })
			return etcdlock.New(cli, etcdlock.WithClientOptions(opts...))
		}, Chosen("etcd", "ETCD_URL"), nil
	case os.Getenv("ZK_URL") != "":
		connect, zkOpts, err := zklock.ParseURL(os.Getenv("ZK_URL"))
		if err != nil {
			return nil, "", errors.New("ZK_URL is not a zk://[user:password@]host:port[,host:port][/chroot] URL")
		}
		return func() (*core.Client, error) {
			// Each Locker dials its own session; Client.Close closes it.
			return zklock.New(ctx, connect, append(zkOpts, zklock.WithClientOptions(opts...))...)
		}, Chosen("ZooKeeper", "ZK_URL"), nil
	}
	store := memlock.NewStore()
	return func() (*core.Client, error) { return store.Locker(opts...) },
		"memlock (in-process; set DATABASE_URL, REDIS_URL, ETCD_URL or ZK_URL for a server)", nil
}

// Variables lists the environment variables that select a server, in the
// order Lockers tries them: the first one set wins.
var Variables = []string{"DATABASE_URL", "REDIS_URL", "ETCD_URL", "ZK_URL"}

// Chosen describes the server picked from the variable used, naming the
// other variables of Variables that are set too and are not used, so that
// a run with several set says which one it took.
func Chosen(name, used string) string {
	var ignored []string
	for _, v := range Variables {
		if v != used && os.Getenv(v) != "" {
			ignored = append(ignored, v)
		}
	}
	desc := name + " (" + used + ")"
	if len(ignored) > 0 {
		desc += "; " + strings.Join(ignored, ", ") + " also set, not used"
	}
	return desc
}
