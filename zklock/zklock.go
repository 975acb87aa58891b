package zklock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
)

// DefaultRoot is the znode under which every lock lives unless WithRoot says
// otherwise.
const DefaultRoot = "/dislock"

// DefaultSessionTimeout is the session timeout New and NewBackend ask the
// server for. The server clamps it into its [minSessionTimeout,
// maxSessionTimeout] (4 s to 40 s with the default tickTime of 2 s).
const DefaultSessionTimeout = 30 * time.Second

// Option configures a Backend.
type Option func(*options)

type options struct {
	root           string
	sessionTimeout time.Duration
	dialer         zk.Dialer
	logger         zk.Logger
	clientOpts     []core.ClientOption
	auth           []authCred
	acl            []zk.ACL
	optcheck.Errs
}

// authCred is one WithAuth: never formatted into an error or a log line.
type authCred struct {
	scheme string
	auth   []byte
}

// invalidOption returns the error of an invalid value given to option name.
var invalidOption = optcheck.Prefix("zklock.").Invalid

// checked is an Option that applies set, or records err when the value
// given was invalid (optcheck.Checked).
func checked(err error, set Option) Option { return optcheck.Checked(err, set) }

// WithRoot sets the znode under which locks live (default "/dislock").
// Lockers that should see each other's locks use the same root. It must be
// an absolute path other than "/" and may not end in "/".
func WithRoot(root string) Option {
	var err error
	if root == "" || root[0] != '/' || root == "/" || strings.HasSuffix(root, "/") || path.Clean(root) != root ||
		strings.ContainsRune(root, 0) {
		err = invalidOption("WithRoot", "%q is not an absolute znode path", root)
	}
	return checked(err, func(o *options) { o.root = root })
}

// WithSessionTimeout sets the session timeout New and NewBackend ask for
// (default 30 s). The server may grant less; the TTL of every lock must stay
// within 2/3 of what it grants. NewBackendFromConn ignores it.
func WithSessionTimeout(d time.Duration) Option {
	var err error
	if d <= 0 {
		err = invalidOption("WithSessionTimeout", "must be positive, got %v", d)
	}
	return checked(err, func(o *options) { o.sessionTimeout = d })
}

// WithDialer sets how New and NewBackend open TCP connections to servers
// (zk.WithDialer).
func WithDialer(d zk.Dialer) Option {
	return func(o *options) { o.dialer = d }
}

// WithLogger receives the ZooKeeper client's log lines (default: none).
// They name server addresses, never credentials.
func WithLogger(l zk.Logger) Option {
	return func(o *options) { o.logger = l }
}

// WithClientOptions passes options to core.New when New or NewFromConn
// builds the Locker, after the backend's own default TTL.
func WithClientOptions(opts ...core.ClientOption) Option {
	return func(o *options) { o.clientOpts = append(o.clientOpts, opts...) }
}

// WithAuth adds credentials to the session New and NewBackend dial
// (zk.Conn.AddAuth): scheme "digest" with auth "user:password" is
// ZooKeeper's user and password authentication. The credentials are sent
// once the session is established, before New or NewBackend returns (a
// server that refuses them fails the call), and go-zookeeper sends them
// again on every reconnect and new session before any other request.
// Give it more than once for several identities. With WithAuth and no
// WithACL, the nodes the backend creates get CreatorAllACL instead of
// world:anyone. The credentials never appear in errors or log lines.
// NewBackendFromConn refuses it: add credentials to your own connection
// with its AddAuth.
func WithAuth(scheme string, auth []byte) Option {
	var err error
	switch {
	case scheme == "" || strings.ContainsAny(scheme, "\x00:"):
		err = invalidOption("WithAuth", "scheme %q is not a ZooKeeper authentication scheme", scheme)
	case len(auth) == 0:
		err = invalidOption("WithAuth", "empty credentials for scheme %q", scheme)
	case scheme == "digest" && !strings.Contains(string(auth), ":"):
		err = invalidOption("WithAuth", `digest credentials must be "user:password"`)
	}
	cred := authCred{scheme: scheme, auth: append([]byte(nil), auth...)}
	return checked(err, func(o *options) { o.auth = append(o.auth, cred) })
}

// CreatorAllACL is ZooKeeper's CREATOR_ALL_ACL (zk.AuthACL(zk.PermAll)):
// every right for the identities the creating session authenticated as
// (WithAuth), none for anyone else. It is the default ACL under WithAuth.
func CreatorAllACL() []zk.ACL { return zk.AuthACL(zk.PermAll) }

// WithACL sets the ACL of every node the backend creates: the root and its
// missing ancestors, the locks and clock nodes, each key's container, claim
// and hold nodes. The default is zk.WorldACL(zk.PermAll) (world:anyone,
// every right), or CreatorAllACL under WithAuth; zk.DigestACL names a user
// explicitly. Every identity the Lockers of a root run as needs READ,
// WRITE, CREATE and DELETE on these nodes. ZooKeeper checks a node's ACL
// for reading, writing and creating children, and its parent's for
// deleting it; ACLs are set only when a node is created, so nodes that
// exist already (a root made by an earlier, unauthenticated run, say) keep
// theirs: move to a new root, or set them with zk.Conn.SetACL.
func WithACL(acl []zk.ACL) Option {
	var err error
	if len(acl) == 0 {
		err = invalidOption("WithACL", "empty ACL")
	}
	for _, a := range acl {
		if err == nil && (a.Scheme == "" || a.Perms&^zk.PermAll != 0 || a.Perms == 0) {
			err = invalidOption("WithACL", "entry with scheme %q and perms %#x is not valid", a.Scheme, a.Perms)
		}
	}
	acl = append([]zk.ACL(nil), acl...)
	return checked(err, func(o *options) { o.acl = acl })
}

// Backend is the ZooKeeper store for core's lease engine. It implements
// core.Backend, core.Queuer, core.Admin and core.SemaphoreBackend, and is
// safe for concurrent use.
type Backend struct {
	conn    *zk.Conn
	ownConn bool
	acl     []zk.ACL // of every node the backend creates
	root    string
	locks   string // root + "/locks"
	clock   string // root + "/clock"

	timeoutMs atomic.Int64 // negotiated session timeout

	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
	nudging   atomic.Bool // a nudge's read is in flight

	mu      sync.Mutex
	claims  map[string]*claim        // owner token -> claim made by this backend
	watches map[string]*watched      // watched claim path -> what is known of it
	held    map[string]*held         // key -> a lock this backend holds
	trying  map[string]chan struct{} // keys with an acquisition in flight: closed when it ends
	subs    map[int]func(key string) // Watch subscribers
	nextSub int

	places   map[string]*place                // placeKey(key, waiter) -> its place in line
	noKeepOn map[string]*place                // a place's noKeep node -> the place (see onEvent)
	leaving  map[string]chan struct{}         // placeKey -> closed once the expired place's node is deleted
	turnSubs map[int]func(key, waiter string) // WatchTurns subscribers
	busyAt   map[string]time.Time             // key -> when an attempt last found it busy

	parents map[string]bool // container nodes of keys this backend claimed

	skewMs  atomic.Int64 // server clock minus local, as of the last write's reply
	skewSet atomic.Bool

	// watchHook, set by tests before the first acquire, is called when a
	// waiting place's watch on path fires, before the event is acted on;
	// the function it returns is called once it has been. (A turn that
	// onEvent told is not the watch's to act on.)
	watchHook func(path string) func()
	// expireHook, set by tests, runs before the deletion of an expired
	// place's node; the function it returns runs once it is done.
	expireHook func() func()
	// evaluateHook, set by tests, runs when a place is judged (evaluate),
	// before any store call of the judgement.
	evaluateHook func()
	// armHook, set by tests, runs before a waiting place's watch on path
	// is armed (a data watch when data; its own node's too); the function
	// it returns runs once the store answered and the watch is recorded.
	armHook func(path string, data bool) func()
}

// claim is a lock node this backend created and still tracks.
type claim struct {
	key      string
	path     string // claim node; "" once converted to a hold (slot)
	hold     string // hold node of a slot lock
	owner    string
	sid      int64 // session the claim node belongs to
	token    uint64
	acqMs    int64     // server time of the claim's creation
	acqLocal time.Time // local time when the acquire was sent
	limit    int       // a permit's semaphore limit; 0 or 1 for a mutex
	// tokenData: a permit whose token is its grant's zxid, which every
	// renewal writes into its data (grantData, tokenData).
	tokenData bool
}

var (
	_ core.Backend = (*Backend)(nil)
	_ core.Watcher = (*Backend)(nil)
	_ core.Admin   = (*Backend)(nil)
)

func resolve(opts []Option) (options, error) {
	o := options{root: DefaultRoot, sessionTimeout: DefaultSessionTimeout}
	if err := optcheck.Apply(&o, opts); err != nil {
		return o, err
	}
	if o.acl == nil {
		o.acl = zk.WorldACL(zk.PermAll)
		if len(o.auth) > 0 {
			o.acl = CreatorAllACL()
		}
	}
	return o, nil
}

// ParseServers splits a connect string "host:port[,host:port...][/chroot]"
// into the server list and the chroot ("" when absent). go-zookeeper has no
// chroot of its own: use the chroot as WithRoot's argument.
// A URL (zk://…) is ParseURL's to read: ParseServers refuses it.
func ParseServers(connect string) (servers []string, chroot string, err error) {
	if strings.Contains(connect, "://") {
		return nil, "", invalidOption("New", "the connect string is host:port[,host:port][/chroot], not a URL: New and NewBackend take a zk:// URL, and ParseURL reads one")
	}
	s := connect
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s, chroot = s[:i], s[i:]
		if chroot == "/" {
			chroot = ""
		}
	}
	for _, h := range strings.Split(s, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		servers = append(servers, h)
	}
	if len(servers) == 0 {
		return nil, "", invalidOption("New", "connect string names no server")
	}
	return servers, chroot, nil
}

// timeoutLogger captures the session timeout the server granted from the
// client's "authenticated" log line (go-zookeeper v1.0.4 exposes it nowhere
// else) and passes every line on.
type timeoutLogger struct {
	next zk.Logger
	got  func(ms int64)
}

const authLine = "authenticated: id=%d, timeout=%d"

func (l *timeoutLogger) Printf(format string, args ...any) {
	if format == authLine && len(args) == 2 {
		if ms, ok := args[1].(int32); ok && ms > 0 {
			l.got(int64(ms))
		}
	}
	if l.next != nil {
		l.next.Printf(format, args...)
	}
}

// NewBackend dials ZooKeeper and returns a Backend on its own session, once
// the session is established (bounded by ctx). connect is a connect string,
// "host:port[,host:port...][/chroot]", or a zk:// URL (see ParseURL), whose
// options come before opts. When every server has refused the connection
// (or could not be dialled) once, it fails at once, naming the dial
// errors, rather than wait for ctx. Close closes the session, which deletes
// the session's claim nodes at once.
func NewBackend(ctx context.Context, connect string, opts ...Option) (*Backend, error) {
	b, _, err := dial(ctx, connect, opts)
	return b, err
}

// New dials ZooKeeper (see NewBackend) and returns a Locker (which also
// implements core.Admin) whose default TTL is 2/3 of the session timeout
// the server granted.
func New(ctx context.Context, connect string, opts ...Option) (*core.Client, error) {
	b, o, err := dial(ctx, connect, opts)
	if err != nil {
		return nil, err
	}
	c, err := core.New(b, append([]core.ClientOption{core.WithDefaults(core.TTL(b.MaxTTL()))}, o.clientOpts...)...)
	if err != nil {
		b.Close()
		return nil, err
	}
	return c, nil
}

func dial(ctx context.Context, connect string, opts []Option) (*Backend, options, error) {
	if strings.Contains(connect, "://") {
		c, urlOpts, err := ParseURL(connect)
		if err != nil {
			return nil, options{}, fmt.Errorf("%w: %w", core.ErrInvalidOption, err)
		}
		connect, opts = c, append(urlOpts, opts...)
	}
	o, err := resolve(opts)
	if err != nil {
		return nil, o, err
	}
	servers, chroot, err := ParseServers(connect)
	if err != nil {
		return nil, o, err
	}
	if chroot != "" {
		root := chroot + o.root
		if err := validRoot(root); err != nil {
			return nil, o, err
		}
		o.root = root
	}
	b := newBackend(o.root, o.acl)
	got := make(chan struct{})
	var once sync.Once
	logger := zk.WithLogger(&timeoutLogger{next: o.logger, got: func(ms int64) {
		b.timeoutMs.Store(ms)
		once.Do(func() { close(got) })
	}})
	tries := newFirstRound(o.dialer)
	conn, _, err := zk.Connect(servers, o.sessionTimeout, zk.WithLogInfo(true), logger,
		zk.WithDialer(tries.dial), zk.WithHostProvider(tries), zk.WithEventCallback(b.onEvent))
	if err != nil {
		return nil, o, fmt.Errorf("zklock: connect: %w", err)
	}
	b.conn, b.ownConn = conn, true
	select {
	case <-got:
	case <-ctx.Done():
		conn.Close()
		return nil, o, fmt.Errorf("zklock: no ZooKeeper session established: %w%s", ctx.Err(), tries.failures())
	case <-tries.over:
		select {
		case <-got: // established just as the round ended
		default:
			conn.Close()
			return nil, o, fmt.Errorf("zklock: no ZooKeeper server reachable%s", tries.failures())
		}
	}
	// go-zookeeper keeps the credentials and sends them again, first thing,
	// whenever it reconnects or opens a new session.
	for _, c := range o.auth {
		var err error
		if cerr := b.call(ctx, func() { err = conn.AddAuth(c.scheme, c.auth) }, nil); cerr != nil {
			err = cerr
		}
		if err != nil {
			b.Close()
			return nil, o, fmt.Errorf("zklock: authentication (scheme %q): %w", c.scheme, err)
		}
	}
	return b, o, nil
}

// firstRound watches the client's first round over the servers: it closes
// over when every server has refused the connection (or could not be
// dialled: an unknown host) once, where the client would pause and start
// again, and keeps the dial errors, so that New fails at once, naming the
// cause, instead of waiting for ctx. A server that takes the connection
// but gives no session (an ensemble without quorum) is waited for, until
// ctx ends, as before.
type firstRound struct {
	zk.HostProvider
	dialer zk.Dialer
	over   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	errs   map[string]error // the last dial error per server
	order  []string
	dialed bool // a server took the connection (the session may still fail)
}

func newFirstRound(d zk.Dialer) *firstRound {
	if d == nil {
		d = func(network, address string, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout(network, address, timeout)
		}
	}
	return &firstRound{HostProvider: zk.NewDNSHostProvider(), dialer: d,
		over: make(chan struct{}), errs: make(map[string]error)}
}

// Next implements zk.HostProvider.
func (r *firstRound) Next() (string, bool) {
	server, retryStart := r.HostProvider.Next()
	r.mu.Lock()
	refused := !r.dialed
	r.mu.Unlock()
	if retryStart && refused {
		r.once.Do(func() { close(r.over) })
	}
	return server, retryStart
}

func (r *firstRound) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := r.dialer(network, address, timeout)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.dialed = true
		delete(r.errs, address)
		return &bufConn{Conn: c, r: bufio.NewReaderSize(c, 16<<10)}, nil
	}
	if _, seen := r.errs[address]; !seen {
		r.order = append(r.order, address)
	}
	r.errs[address] = err
	return c, err
}

// failures returns ": " and the dial errors seen, or "" when there were none.
func (r *firstRound) failures() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var msgs []string
	for _, a := range r.order {
		if err, ok := r.errs[a]; ok {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) == 0 {
		return ""
	}
	return ": " + strings.Join(msgs, "; ")
}

func validRoot(root string) error {
	var o options
	WithRoot(root)(&o)
	return o.Err()
}

// NewBackendFromConn returns a Backend on an existing connection. The
// connection stays the caller's: Close does not close it. Its limits:
//
//   - go-zookeeper does not reveal the session timeout the server granted,
//     so the caller states it as sessionTimeout; a value larger than the
//     granted one voids the loss-before-takeover guarantee.
//   - Claim nodes outlive Close when their release failed, until the
//     caller's session ends or another acquirer finds them expired.
//   - Close waits for calls still in flight on the connection.
func NewBackendFromConn(conn *zk.Conn, sessionTimeout time.Duration, opts ...Option) (*Backend, error) {
	o, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	if conn == nil {
		return nil, invalidOption("NewBackendFromConn", "nil *zk.Conn")
	}
	if sessionTimeout <= 0 {
		return nil, invalidOption("NewBackendFromConn", "session timeout must be positive, got %v", sessionTimeout)
	}
	if len(o.auth) > 0 {
		return nil, invalidOption("WithAuth", "NewBackendFromConn uses the caller's connection: add the credentials to it with zk.Conn.AddAuth")
	}
	b := newBackend(o.root, o.acl)
	b.conn = conn
	b.timeoutMs.Store(sessionTimeout.Milliseconds())
	return b, nil
}

// NewFromConn is NewBackendFromConn followed by core.New, with the default
// TTL at 2/3 of sessionTimeout.
func NewFromConn(conn *zk.Conn, sessionTimeout time.Duration, opts ...Option) (*core.Client, error) {
	b, err := NewBackendFromConn(conn, sessionTimeout, opts...)
	if err != nil {
		return nil, err
	}
	o, _ := resolve(opts)
	c, err := core.New(b, append([]core.ClientOption{core.WithDefaults(core.TTL(b.MaxTTL()))}, o.clientOpts...)...)
	if err != nil {
		b.Close()
		return nil, err
	}
	return c, nil
}

func newBackend(root string, acl []zk.ACL) *Backend {
	return &Backend{
		acl:     acl,
		root:    root,
		locks:   root + "/locks",
		clock:   root + "/clock",
		done:    make(chan struct{}),
		claims:  make(map[string]*claim),
		watches: make(map[string]*watched),
		held:    make(map[string]*held),
		trying:  make(map[string]chan struct{}),
		subs:    make(map[int]func(string)),

		places:   make(map[string]*place),
		noKeepOn: make(map[string]*place),
		leaving:  make(map[string]chan struct{}),
		turnSubs: make(map[int]func(string, string)),
		busyAt:   make(map[string]time.Time),
		parents:  make(map[string]bool),
	}
}

// SessionTimeout is the session timeout the server granted (or, for
// NewBackendFromConn, the one the caller stated).
func (b *Backend) SessionTimeout() time.Duration {
	return time.Duration(b.timeoutMs.Load()) * time.Millisecond
}

// MaxTTL is the longest lock TTL the session allows: 2/3 of its timeout.
// It is the default TTL of New and NewFromConn.
func (b *Backend) MaxTTL() time.Duration {
	d := b.SessionTimeout() * 2 / 3
	return d.Truncate(time.Millisecond)
}

// Conn returns the ZooKeeper connection the backend uses.
func (b *Backend) Conn() *zk.Conn { return b.conn }

// Name implements core.Backend.
func (b *Backend) Name() string { return "zookeeper" }

var _ core.ContextBound = (*Backend)(nil)

// EndsWithContext implements core.ContextBound: a call returns soon after
// its ctx ends, whatever the ensemble does (each request to ZooKeeper is
// waited for apart from the caller, who leaves when ctx ends), so the
// engine makes claims on the caller's goroutine.
func (b *Backend) EndsWithContext() bool { return true }

// Close implements core.Backend. It closes the connection when the backend
// dialed it (ending the session and deleting its claim nodes), and waits for
// the backend's goroutines.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		if !b.ownConn {
			b.leaveAll() // the caller's session outlives the backend
		}
		b.mu.Lock()
		for pk, pl := range b.places {
			b.dropPlaceLocked(pk, pl)
		}
		b.mu.Unlock()
		close(b.done)
		if b.ownConn {
			b.conn.Close()
		}
	})
	b.wg.Wait()
	return nil
}

var errClosed = errors.New("zklock: backend closed")

// get reads node p within ctx (see call): its data and stat, or the error
// of the read or of the call.
func (b *Backend) get(ctx context.Context, p string) ([]byte, *zk.Stat, error) {
	var data []byte
	var st *zk.Stat
	var err error
	if cerr := b.call(ctx, func() { data, st, err = b.conn.Get(p) }, nil); cerr != nil {
		return nil, nil, cerr
	}
	return data, st, err
}

// call runs f, which makes blocking go-zookeeper calls, and returns when f
// returns or ctx ends, whichever is first. go-zookeeper's calls take no
// context; one abandoned by ctx ends by itself when its reply arrives or the
// connection is dropped. When call gave up on f, then (if given) runs after
// f; otherwise the caller owns f's results.
func (b *Backend) call(ctx context.Context, f func(), then func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-b.done:
		return errClosed
	default:
	}
	const running, finished, abandoned = 0, 1, 2
	var state atomic.Int32
	fin := make(chan struct{})
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
		if !state.CompareAndSwap(running, finished) && then != nil {
			then()
		}
		close(fin)
	}()
	nudge := time.NewTimer(nudgeAfter)
	defer nudge.Stop()
waiting:
	for wait := nudgeAfter; ; {
		select {
		case <-fin:
			return nil
		case <-nudge.C:
			b.nudge()
			wait *= 2
			nudge.Reset(wait)
			continue
		case <-ctx.Done():
		case <-b.done:
		}
		break waiting
	}
	if !state.CompareAndSwap(running, abandoned) {
		<-fin // f finished first: its results are the caller's
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errClosed
}

// nudgeAfter is how long a call waits for its reply before it nudges the
// server, and then again at doubling intervals until the reply comes.
//
// ZooKeeper 3.6 to 3.8.0 (the version Debian 12 ships) can hold a
// committed write until another request reaches the server: a lost
// wake-up in its CommitProcessor (ZOOKEEPER-4537, fixed in 3.8.1). On a
// server with no other traffic the reply then waits for the next client's
// ping, up to a third of a session timeout, longer than a lease's
// renewal may take. Any request that reaches the server wakes the
// processor; the nudge is a read, which writes nothing.
const nudgeAfter = 250 * time.Millisecond

// nudge sends one cheap read on b's session, unless one is in flight.
// Its answer does not matter: its arrival at the server does.
func (b *Backend) nudge() {
	if !b.nudging.CompareAndSwap(false, true) {
		return
	}
	if !b.spawn(func() {
		defer b.nudging.Store(false)
		b.conn.Exists("/")
	}) {
		b.nudging.Store(false)
	}
}

// spawn runs f on a goroutine the backend owns.
func (b *Backend) spawn(f func()) bool {
	select {
	case <-b.done:
		return false
	default:
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
	return true
}

// keyPath is the container node of key.
func (b *Backend) keyPath(key string) string { return b.locks + "/" + encodeName(key) }

// KeyPath is the znode under which key's claims and holds live (see the
// package doc for the layout), for operators and tests.
func (b *Backend) KeyPath(key string) string { return b.keyPath(key) }

// maxParents bounds the container nodes a backend remembers.
const maxParents = 10000

// knownParent reports whether a claim under parent succeeded lately: the
// container node is likely there (ZooKeeper deletes an empty one about a
// minute after its last child went, and the claim then fails and creates it
// again).
func (b *Backend) knownParent(parent string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.parents[parent]
}

func (b *Backend) markParent(parent string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.parents) >= maxParents {
		clear(b.parents)
	}
	b.parents[parent] = true
}

// ensureParent creates the container node of key and, when missing, the
// persistent nodes above it.
func (b *Backend) ensureParent(ctx context.Context, parent string) error {
	var err error
	if cerr := b.call(ctx, func() { _, err = b.conn.CreateContainer(parent, nil, zk.FlagContainer, b.acl) }, nil); cerr != nil {
		return cerr
	}
	if err == nil || errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	if !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	if err := b.ensurePath(ctx, b.locks); err != nil {
		return err
	}
	if cerr := b.call(ctx, func() { _, err = b.conn.CreateContainer(parent, nil, zk.FlagContainer, b.acl) }, nil); cerr != nil {
		return cerr
	}
	if err == nil || errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	return err
}

// ensurePath creates p and its ancestors as persistent nodes.
func (b *Backend) ensurePath(ctx context.Context, p string) error {
	parts := strings.Split(p[1:], "/")
	cur := ""
	for _, part := range parts {
		cur += "/" + part
		var err error
		if cerr := b.call(ctx, func() { _, err = b.conn.Create(cur, nil, zk.FlagPersistent, b.acl) }, nil); cerr != nil {
			return cerr
		}
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// bufConn reads its connection through a buffer. The client reads each
// packet as its length and then its body; through the buffer one read of
// the socket brings both (and any packet behind them), which halves the
// reads of a session: a request's reply, a watch's event.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }
