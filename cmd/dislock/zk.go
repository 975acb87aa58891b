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

// openZK opens a Locker on zk://host:port[,host:port...][/chroot]
// [?session_timeout=SECONDS]. The chroot, when given, holds the locks'
// root znode (/chroot/dislock).
func openZK(ctx context.Context, urlEnv, rawURL, table string, copts []core.ClientOption, log *slog.Logger) (locker, func() error, error) {
	if table != "" {
		log.Debug("LOCK_TABLE is ignored by the ZooKeeper backend")
	}
	rest := rawURL[len("zk://"):]
	rest, query, _ := strings.Cut(rest, "?")
	if strings.Contains(rest, "@") {
		return nil, nil, badURL(urlEnv, "the ZooKeeper URL may not carry credentials")
	}
	if rest == "" || rest[0] == '/' {
		return nil, nil, badURL(urlEnv, "the ZooKeeper URL names no server (zk://host:port[,host:port][/chroot])")
	}
	session := zkSessionTimeout
	for _, kv := range strings.Split(query, "&") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "session_timeout":
			secs, err := strconv.ParseFloat(v, 64)
			if err != nil || secs <= 0 || secs > 3600 {
				return nil, nil, badURL(urlEnv, "session_timeout must be a number of seconds in (0, 3600]")
			}
			session = time.Duration(secs * float64(time.Second))
		default:
			if len(k) > 32 {
				k = "?"
			}
			return nil, nil, badURL(urlEnv, "unknown ZooKeeper URL parameter %q (known: session_timeout)", k)
		}
	}
	if _, _, err := zklock.ParseServers(rest); err != nil {
		return nil, nil, badURL(urlEnv, "the ZooKeeper URL names no server (zk://host:port[,host:port][/chroot])")
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	b, err := zklock.NewBackend(dctx, rest, zklock.WithSessionTimeout(session))
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
