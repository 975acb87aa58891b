package etcdlock

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
)

// DefaultPrefix is the etcd key prefix used unless WithPrefix says otherwise.
const DefaultPrefix = "dislock/"

// MaxLeaseTTL is the longest lease etcd grants (the server's
// lease.MaxLeaseTTL, 9,000,000,000 seconds). Longer TTLs, slots and minimum
// holds are rejected with core.ErrInvalidOption.
const MaxLeaseTTL = 9_000_000_000 * time.Second

// defaultMaxTxnOps is the most operations one renewal transaction carries:
// etcd's default --max-txn-ops.
const defaultMaxTxnOps = 128

// Option configures a Backend.
type Option func(*options)

type options struct {
	prefix     string
	clientOpts []core.ClientOption
	maxTxnOps  int
	optcheck.Errs
}

// invalidOption returns the error of an invalid value given to option name.
var invalidOption = optcheck.Prefix("etcdlock.").Invalid

// WithPrefix sets the prefix of every etcd key the backend writes (default
// "dislock/"): lock k is the etcd key prefix+k. Lockers that should see each
// other's locks use the same prefix. It must be non-empty; end it with "/"
// so that no other prefix starts with it.
func WithPrefix(prefix string) Option {
	return func(o *options) {
		if prefix == "" {
			o.RecordErr(invalidOption("WithPrefix", "empty"))
			return
		}
		o.prefix = prefix
	}
}

// WithMaxTxnOps sets how many reads one renewal transaction may carry
// (default 128, etcd's default --max-txn-ops). Renewing more leases than
// that sends several transactions at once; on a server started with a
// larger --max-txn-ops, raise this to match so that a renewal stays one
// transaction. It also bounds the claims and releases that share one
// transaction (see "How calls are sent").
func WithMaxTxnOps(n int) Option {
	return func(o *options) {
		if n < 1 {
			o.RecordErr(invalidOption("WithMaxTxnOps", "must be at least 1, got %d", n))
			return
		}
		o.maxTxnOps = n
	}
}

// WithClientOptions passes options to core.New when New builds the Locker.
// NewBackend ignores them.
func WithClientOptions(opts ...core.ClientOption) Option {
	return func(o *options) { o.clientOpts = append(o.clientOpts, opts...) }
}

// New returns a Locker (which also implements core.Admin) on cli. The client
// stays the caller's: Close on the Locker does not close it.
func New(cli *clientv3.Client, opts ...Option) (*core.Client, error) {
	b, o, err := newBackend(cli, opts)
	if err != nil {
		return nil, err
	}
	return core.New(b, o.clientOpts...)
}

// Backend is the etcd store for core's lease engine. It implements
// core.Backend, core.Queuer (and so core.Watcher), core.Admin and
// core.SemaphoreBackend, and is
// safe for concurrent use.
// Most programs use New; NewBackend is for wrapping or composing backends.
type Backend struct {
	cli       *clientv3.Client
	prefix    string
	maxTxnOps int
	ka        *keepalives
	txns      *txnSender

	mu        sync.Mutex
	held      map[string]held                 // by owner token: what this backend acquired
	current   map[int64]*shared               // by TTL in seconds: the lease new claims take
	leaseByID map[int64]*shared               // every shared lease in use, current or retired
	granting  map[int64]*grantCall            // by TTL in seconds: the grant of a shared lease in flight
	views     map[string]semView              // by key: what this backend last saw of a semaphore
	busy      map[string]struct{}             // keys last seen held by another owner: claims read first
	waits     map[string]map[string]*ownPlace // by key, then waiter: this backend's waiters in line
	wleases   map[int64]waiterLease           // by TTL in seconds: the lease waiter keys are bound to
	told      map[string]struct{}             // waiter keys of this backend's waiters told their turn since their last attempt
	id        string                          // names this backend's waiters in the grants of releases (grant.go)
	idJSON    []byte                          // id as a JSON string, as a grant's record has it
	firsts    map[string]waiterState          // by key: its first waiter, as the watch saw it
	grants    map[string]*mvccpb.KeyValue     // by waiter key: a release's grant to a waiter of this backend, not taken yet

	// Background deletions of waiter keys (deleteWaiter): Close stops
	// them (stop) and waits.
	bgMu    sync.Mutex
	bg      sync.WaitGroup
	closed  bool
	stopCtx context.Context
	stop    context.CancelFunc
}

// held is one lock or permit this backend claimed (or tried to): its key, its lease
// and, once known, the key's create revision (the fencing token), the
// lease's TTL and the send time of its last successful grant or keepalive.
type held struct {
	key       string
	ekey      string // the etcd key: the lock key, or the permit key
	lease     int64
	rev       int64
	seconds   int64
	refreshed time.Time
	seen      time.Time // the claim's send, or the last Renew that asked for it
}

var (
	_ core.Backend = (*Backend)(nil)
	_ core.Watcher = (*Backend)(nil)
	_ core.Admin   = (*Backend)(nil)

	_ core.ContextBound = (*Backend)(nil)
)

// NewBackend returns a Backend on cli.
func NewBackend(cli *clientv3.Client, opts ...Option) (*Backend, error) {
	b, _, err := newBackend(cli, opts)
	return b, err
}

func newBackend(cli *clientv3.Client, opts []Option) (*Backend, options, error) {
	o := options{prefix: DefaultPrefix, maxTxnOps: defaultMaxTxnOps}
	if err := optcheck.Apply(&o, opts); err != nil {
		return nil, o, err
	}
	if cli == nil {
		return nil, o, invalidOption("New", "nil etcd client")
	}
	stopCtx, stop := context.WithCancel(context.Background())
	id := newBackendID()
	return &Backend{cli: cli, prefix: o.prefix, stopCtx: stopCtx, stop: stop, maxTxnOps: o.maxTxnOps, ka: newKeepalives(cli), txns: newTxnSender(cli, o.maxTxnOps),
		held: make(map[string]held), current: make(map[int64]*shared), leaseByID: make(map[int64]*shared), granting: make(map[int64]*grantCall), views: make(map[string]semView), busy: make(map[string]struct{}),
		waits: make(map[string]map[string]*ownPlace), wleases: make(map[int64]waiterLease), told: make(map[string]struct{}),
		id: id, idJSON: []byte(`"` + id + `"`), firsts: make(map[string]waiterState), grants: make(map[string]*mvccpb.KeyValue)}, o, nil
}

// Name implements core.Backend.
func (b *Backend) Name() string { return "etcd" }

// EndsWithContext implements core.ContextBound: a call returns soon after
// its ctx ends, whatever the cluster does (gRPC ends a call when its ctx
// ends, and the Backend's own waits, for a lease grant in flight, say,
// watch ctx), so the engine makes claims on the caller's goroutine.
func (b *Backend) EndsWithContext() bool { return true }

// Close implements core.Backend: it ends the keepalive stream and revokes
// the shared leases that no session of this backend is bound to any more
// (within 2 s; any left expire by themselves). A lease that still carries
// a session — one whose release failed — is left to expire, so that the
// holder keeps its margin. It does not close the etcd client, which
// belongs to the caller. It is safe to call more than once.
func (b *Backend) Close() error {
	b.bgMu.Lock()
	b.closed = true
	b.bgMu.Unlock()
	b.stop()
	b.bg.Wait()
	b.ka.close()
	b.txns.close()
	b.mu.Lock()
	for key, m := range b.waits {
		for waiter := range m {
			b.dropWaitLocked(key, waiter)
		}
	}
	var ids []int64
	for id, sh := range b.leaseByID {
		if sh.users <= 0 {
			ids = append(ids, id)
			delete(b.leaseByID, id)
		}
	}
	clear(b.current)
	for _, wl := range b.wleases {
		ids = append(ids, wl.id)
	}
	clear(b.wleases)
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() { _ = b.revoke(ctx, id) })
	}
	wg.Wait()
	return nil
}

// Now implements core.Backend. etcd exposes no clock, so this is the local
// clock: see the package documentation for what that means for slots.
func (b *Backend) Now(context.Context, string) (time.Time, error) { return time.Now(), nil }
