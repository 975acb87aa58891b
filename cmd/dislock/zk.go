package main

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/zklock"
)

// zkSessionTimeout is the session timeout the CLI asks ZooKeeper for unless
// the URL says otherwise: 1.5 × the default TTL, so that the default TTL
// fits (TTL ≤ 2/3 of the session timeout) where the server allows it.
// Servers grant at most 20 × tickTime (40 s by default); a TTL that does not
// fit what the server granted is refused with a message naming both.
const zkSessionTimeout = defaultTTL * 3 / 2

// openZK opens a Locker on zk://[user:password@]host:port[,host:port...]
// [/chroot][?session_timeout=SECONDS], as zklock.ParseURL reads it. The
// chroot, when given, holds the locks' root znode (/chroot/dislock). A user
// and password authenticate the session (digest) and close the nodes it
// creates to everyone else.
func openZK(ctx context.Context, urlEnv, rawURL, table string, copts []core.ClientOption, log *slog.Logger) (locker, func() error, error) {
	if table != "" {
		log.Debug("LOCK_TABLE is ignored by the ZooKeeper backend")
	}
	connect, urlOpts, err := zklock.ParseURL(rawURL)
	if err != nil {
		// ParseURL's errors never quote the URL.
		return nil, nil, badURL(urlEnv, "%s", strings.TrimPrefix(err.Error(), "zklock: "))
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	// The URL's session_timeout, when given, comes after the default.
	b, err := zklock.NewBackend(dctx, connect, append([]zklock.Option{zklock.WithSessionTimeout(zkSessionTimeout)}, urlOpts...)...)
	if err != nil {
		if strings.Contains(err.Error(), "WithRoot") {
			return nil, nil, badURL(urlEnv, "the ZooKeeper chroot is not a valid znode path")
		}
		return nil, nil, err
	}
	log.Debug("ZooKeeper session", "session_timeout", b.SessionTimeout(), "max_ttl", b.MaxTTL())
	l, err := core.New(b, copts...)
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	return l, l.Close, nil
}

// zkAsked is the session timeout a zk:// URL asks for.
func zkAsked(rawURL string) time.Duration {
	_, query, _ := strings.Cut(rawURL, "?")
	for _, kv := range strings.Split(query, "&") {
		if v, ok := strings.CutPrefix(kv, "session_timeout="); ok {
			if secs, err := strconv.ParseFloat(v, 64); err == nil {
				return time.Duration(secs * float64(time.Second))
			}
		}
	}
	return zkSessionTimeout
}
