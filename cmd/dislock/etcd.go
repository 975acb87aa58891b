package main

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/etcdlock"
)

// openEtcd opens a Locker on etcd://[user:password@]host:port[,host:port…]
// (etcds:// for TLS). The etcd client's own logging is off: failures reach
// the user through the calls that failed.
func openEtcd(urlEnv, rawURL, table string, copts []core.ClientOption, log *slog.Logger) (locker, func() error, error) {
	if table != "" {
		log.Debug("LOCK_TABLE is ignored by the etcd backend")
	}
	cfg, err := etcdlock.ParseURL(rawURL)
	if err != nil {
		// ParseURL's messages never quote the URL.
		return nil, nil, badURL(urlEnv, "%s", strings.TrimPrefix(err.Error(), "etcdlock: invalid etcd URL: "))
	}
	cfg.Logger = zap.NewNop()
	if err := reachable(cfg.Endpoints, cfg.DialTimeout); err != nil {
		return nil, nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	l, err := etcdlock.New(cli, etcdlock.WithClientOptions(copts...))
	return onClient(l, err, cli.Close)
}

// reachable fails, naming the dial errors, when no endpoint takes a TCP
// connection. clientv3.New with a user name authenticates with a call that
// waits for a connection until the dial timeout and then only says
// "context deadline exceeded"; a refused connection is thus told at once.
func reachable(endpoints []string, timeout time.Duration) error {
	var errs []string
	for _, ep := range endpoints {
		_, hostPort, _ := strings.Cut(ep, "://")
		c, err := net.DialTimeout("tcp", hostPort, timeout)
		if err == nil {
			c.Close()
			return nil
		}
		errs = append(errs, err.Error())
	}
	return fmt.Errorf("etcd: no endpoint reachable: %s", strings.Join(errs, "; "))
}
