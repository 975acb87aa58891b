package main

import (
	"errors"
	"log/slog"
	"strings"

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
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	l, err := etcdlock.New(cli, etcdlock.WithClientOptions(copts...))
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	return l, func() error {
		err := l.Close()
		return errors.Join(err, cli.Close())
	}, nil
}
