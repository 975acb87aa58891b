package etcdlock

import (
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// ParseURL reads an etcd URL into a client configuration:
//
//	etcd://[user:password@]host:port[,host:port…]   plain gRPC
//	etcds://[user:password@]host:port[,host:port…]  TLS, verified against the system roots
//
// The port defaults to 2379. A user name and password, when present, are
// used for etcd's authentication. The returned Config has a 5 s dial
// timeout; set Logger (clientv3 logs to stderr by default) before calling
// clientv3.New. Errors never contain the URL, which may hold a password.
func ParseURL(raw string) (clientv3.Config, error) {
	var cfg clientv3.Config
	schemeName, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return cfg, errors.New("etcdlock: invalid etcd URL: the scheme must be etcd:// or etcds://")
	}
	var scheme string
	switch strings.ToLower(schemeName) {
	case "etcd":
		scheme = "http://"
	case "etcds":
		scheme = "https://"
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	default:
		return cfg, errors.New("etcdlock: invalid etcd URL: the scheme must be etcd:// or etcds://")
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	if tail != "" && tail != "/" {
		if strings.HasPrefix(tail, "/") && !strings.ContainsAny(tail, "?#") {
			return cfg, errors.New("etcdlock: invalid etcd URL: a path is not supported")
		}
		return cfg, errors.New("etcdlock: invalid etcd URL: query parameters are not supported")
	}
	var user *url.Userinfo
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		u, err := url.Parse("x://" + authority[:i] + "@h")
		if err != nil || u.User == nil {
			return cfg, errors.New("etcdlock: invalid etcd URL: bad user information")
		}
		user, authority = u.User, authority[i+1:]
	}
	if authority == "" {
		return cfg, errors.New("etcdlock: invalid etcd URL: no host")
	}
	for _, h := range strings.Split(authority, ",") {
		if h == "" {
			return cfg, errors.New("etcdlock: invalid etcd URL: empty host in the host list")
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = strings.Trim(h, "[]"), "2379"
		}
		if host == "" || strings.ContainsAny(host, "/@ ") {
			return cfg, errors.New("etcdlock: invalid etcd URL: bad host in the host list")
		}
		cfg.Endpoints = append(cfg.Endpoints, scheme+net.JoinHostPort(host, port))
	}
	if user != nil {
		cfg.Username = user.Username()
		cfg.Password, _ = user.Password()
	}
	cfg.DialTimeout = 5 * time.Second
	cfg.DialOptions = append(cfg.DialOptions, StaticWindows()...)
	return cfg, nil
}

// StaticWindows returns the gRPC dial options of a client for locks: fixed
// flow-control windows (4 MiB a stream, 16 MiB a connection) instead of
// gRPC's estimate of the link's bandwidth-delay product. That estimate
// pings the server at every message that arrives after the last ping's
// answer: on a connection of small messages spaced in time, a lock
// client's, that is a write and one more read for every watch event and
// reply. ParseURL's configurations have them; add them to the DialOptions
// of a clientv3.Config of your own.
func StaticWindows() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStaticStreamWindowSize(4 << 20), grpc.WithStaticConnWindowSize(16 << 20)}
}
