package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dislock/dislock/etcdlock/etcdtest"
	"github.com/dislock/dislock/internal/zktest"
)

// TestSmoke checks that every contender acquires and releases once against
// the real servers (the benchmarks themselves only run under -bench; etcd
// and ZooKeeper on private servers started for the run), and that a second
// try on a held key reads as busy (zk.Lock has no try).
func TestSmoke(t *testing.T) {
	for _, s := range stores {
		for _, which := range all[s] {
			t.Run(s+"/"+which, func(t *testing.T) {
				var st *store
				switch s {
				case "redis":
					st = redisStore(t, nil)
				case "mysql":
					st = mysqlStore(t, nil)
				case "etcd":
					st = etcdStore(t, &etcdtest.Counter{})
				case "zk":
					st = zkStore(t, &zktest.Counter{})
				default:
					st = pgStore(t, serverURL(t, "pg"), nil)
				}
				c := contenderFor(t, st, which)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				key := name(which, "smoke")
				u, err := c.try(ctx, key)
				if err != nil {
					t.Fatalf("try: %v", err)
				}
				// zk.Lock has no try: its "try" waits in line.
				if s != "zk" || which != "zklock" {
					if _, err := contenderFor(t, st, which).try(ctx, key); !errors.Is(err, errBusy) {
						t.Errorf("second try on a held key: %v, want busy", err)
					}
				}
				if err := u(ctx); err != nil {
					t.Fatalf("release: %v", err)
				}
				if c.wait != nil {
					u, err := c.wait(ctx, key)
					if err != nil {
						t.Fatalf("wait: %v", err)
					}
					if err := u(ctx); err != nil {
						t.Fatalf("release after wait: %v", err)
					}
				}
			})
		}
	}
}
