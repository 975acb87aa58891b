package zklock

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// maxURLSessionTimeout bounds a URL's session_timeout parameter.
const maxURLSessionTimeout = time.Hour

// ParseURL reads a ZooKeeper URL, the form the README and the dislock CLI
// use:
//
//	zk://[user:password@]host:port[,host:port…][/chroot][?session_timeout=SECONDS]
//
// It returns the connect string ("host:port[,host:port…][/chroot]", as
// NewBackend takes it) and the options the URL stands for: WithAuth with
// digest credentials when it carries a user and password (percent-encoded
// as in any URL), and WithSessionTimeout when it gives session_timeout
// (seconds, in (0, 3600]). New and NewBackend accept such a URL in place
// of a connect string and call ParseURL themselves; options given to them
// after the URL's win. Errors never contain the URL, which may hold a
// password.
func ParseURL(raw string) (connect string, opts []Option, err error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !strings.EqualFold(scheme, "zk") {
		return "", nil, errors.New("zklock: invalid ZooKeeper URL: the scheme must be zk://")
	}
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		return "", nil, errors.New("zklock: invalid ZooKeeper URL: a fragment is not supported")
	}
	rest, query, _ := strings.Cut(rest, "?")
	authority, chroot := rest, ""
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		authority, chroot = rest[:i], rest[i:]
	}
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		u, perr := url.Parse("x://" + authority[:i] + "@h")
		if perr != nil || u.User == nil || u.User.Username() == "" {
			return "", nil, errors.New("zklock: invalid ZooKeeper URL: bad user information (zk://user:password@host:port)")
		}
		pw, ok := u.User.Password()
		if !ok || pw == "" {
			return "", nil, errors.New("zklock: invalid ZooKeeper URL: the user information needs a password (zk://user:password@host:port)")
		}
		opts = append(opts, WithAuth("digest", []byte(u.User.Username()+":"+pw)))
		authority = authority[i+1:]
	}
	if authority == "" {
		return "", nil, errors.New("zklock: invalid ZooKeeper URL: it names no server (zk://host:port[,host:port][/chroot])")
	}
	for _, h := range strings.Split(authority, ",") {
		if strings.TrimSpace(h) == "" || strings.ContainsAny(h, " @") {
			return "", nil, errors.New("zklock: invalid ZooKeeper URL: bad host in the host list (zk://host:port[,host:port][/chroot])")
		}
	}
	if chroot != "" && chroot != "/" {
		if err := validRoot(chroot); err != nil {
			return "", nil, errors.New("zklock: invalid ZooKeeper URL: the chroot is not a valid znode path")
		}
	}
	for _, kv := range strings.Split(query, "&") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "session_timeout":
			secs, perr := strconv.ParseFloat(v, 64)
			if perr != nil || !(secs > 0) || secs > maxURLSessionTimeout.Seconds() {
				return "", nil, errors.New("zklock: invalid ZooKeeper URL: session_timeout must be a number of seconds in (0, 3600]")
			}
			opts = append(opts, WithSessionTimeout(time.Duration(secs*float64(time.Second))))
		default:
			if len(k) > 32 || strings.ContainsAny(k, "%@:") {
				k = "?"
			}
			return "", nil, errors.New("zklock: invalid ZooKeeper URL: unknown parameter " + strconv.Quote(k) + " (known: session_timeout)")
		}
	}
	return authority + chroot, opts, nil
}
