package etcdlock

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dislock/dislock/core"
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

// maxSpares is how many unused leases of one TTL a Backend keeps for reuse.
const maxSpares = 64

// Option configures a Backend.
type Option func(*options)

type options struct {
	prefix     string
	clientOpts []core.ClientOption
	maxTxnOps  int
	errs       []error
}

func invalidOption(name, format string, args ...any) error {
	return fmt.Errorf("%w: etcdlock.%s: %s", core.ErrInvalidOption, name, fmt.Sprintf(format, args...))
}

// WithPrefix sets the prefix of every etcd key the backend writes (default
// "dislock/"): lock k is the etcd key prefix+k. Lockers that should see each
// other's locks use the same prefix. It must be non-empty; end it with "/"
// so that no other prefix starts with it.
func WithPrefix(prefix string) Option {
	return func(o *options) {
		if prefix == "" {
			o.errs = append(o.errs, invalidOption("WithPrefix", "empty"))
			return
		}
		o.prefix = prefix
	}
}

// WithMaxTxnOps sets how many reads one renewal transaction may carry
// (default 128, etcd's default --max-txn-ops). Renewing more leases than
// that sends several transactions at once; on a server started with a
// larger --max-txn-ops, raise this to match so that a renewal stays one
// transaction.
func WithMaxTxnOps(n int) Option {
	return func(o *options) {
		if n < 1 {
			o.errs = append(o.errs, invalidOption("WithMaxTxnOps", "must be at least 1, got %d", n))
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
// core.Backend, core.Watcher, core.Admin and core.SemaphoreBackend, and is
// safe for concurrent use.
// Most programs use New; NewBackend is for wrapping or composing backends.
type Backend struct {
	cli       *clientv3.Client
	prefix    string
	maxTxnOps int
	ka        *keepalives

	mu     sync.Mutex
	held   map[string]held    // by owner token: what this backend acquired
	spares map[int64][]spare  // by TTL in seconds: live leases bound to no key
	views  map[string]semView // by key: what this backend last saw of a semaphore
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
}

// spare is a lease this backend granted that no key is bound to any more:
// a released lock's, or one a busy claim did not use. The next claim with
// the same TTL takes it instead of granting a new one, refreshing it in
// the same round trip as its claim.
type spare struct {
	id        int64
	refreshed time.Time
}

// takeSpare returns a spare lease of the given TTL refreshed within the
// last half of it; older ones are dropped (they expire by themselves).
func (b *Backend) takeSpare(seconds int64) (spare, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	list := b.spares[seconds]
	for len(list) > 0 {
		sp := list[len(list)-1]
		list = list[:len(list)-1]
		if time.Since(sp.refreshed) < time.Duration(seconds)*time.Second/2 {
			b.spares[seconds] = list
			return sp, true
		}
	}
	delete(b.spares, seconds)
	return spare{}, false
}

func (b *Backend) putSpare(seconds int64, sp spare) bool {
	if seconds <= 0 || time.Since(sp.refreshed) >= time.Duration(seconds)*time.Second/2 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.spares[seconds]) >= maxSpares {
		return false
	}
	b.spares[seconds] = append(b.spares[seconds], sp)
	return true
}

var (
	_ core.Backend = (*Backend)(nil)
	_ core.Watcher = (*Backend)(nil)
	_ core.Admin   = (*Backend)(nil)
)

// NewBackend returns a Backend on cli.
func NewBackend(cli *clientv3.Client, opts ...Option) (*Backend, error) {
	b, _, err := newBackend(cli, opts)
	return b, err
}

func newBackend(cli *clientv3.Client, opts []Option) (*Backend, options, error) {
	o := options{prefix: DefaultPrefix, maxTxnOps: defaultMaxTxnOps}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if len(o.errs) > 0 {
		return nil, o, o.errs[0]
	}
	if cli == nil {
		return nil, o, invalidOption("New", "nil etcd client")
	}
	return &Backend{cli: cli, prefix: o.prefix, maxTxnOps: o.maxTxnOps, ka: newKeepalives(cli),
		held: make(map[string]held), spares: make(map[int64][]spare), views: make(map[string]semView)}, o, nil
}

// Name implements core.Backend.
func (b *Backend) Name() string { return "etcd" }

// Close implements core.Backend: it ends the keepalive stream and revokes
// the spare leases (within 2 s; any left expire by themselves). It does not
// close the etcd client, which belongs to the caller. It is safe to call
// more than once.
func (b *Backend) Close() error {
	b.ka.close()
	b.mu.Lock()
	var ids []int64
	for _, list := range b.spares {
		for _, sp := range list {
			ids = append(ids, sp.id)
		}
	}
	clear(b.spares)
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

// record is the value of a lock key.
type record struct {
	Owner      string `json:"owner"`
	OwnerToken string `json:"otoken"`
	Acquired   int64  `json:"acquired_ms"`        // acquirer's clock, Unix ms
	SlotEnd    int64  `json:"slot_end,omitempty"` // slot locks: the slot's end, Unix ms
	Limit      int    `json:"limit,omitempty"`    // permits: the semaphore's limit
}

func decode(v []byte) (record, bool) {
	var r record
	if err := json.Unmarshal(v, &r); err != nil {
		return record{}, false
	}
	return r, true
}

// slotOver reports whether r is a slot lock whose slot has ended at now.
func (r record) slotOver(now time.Time) bool {
	return r.SlotEnd != 0 && r.SlotEnd <= now.UnixMilli()
}

func (b *Backend) etcdKey(key string) string { return b.prefix + key }

// permitKey is the etcd key of the permit of key held with ownerToken:
// <prefix><key> NUL <ownerToken>. Lock keys cannot contain NUL, so no lock
// key is a permit key, and the permits of key are exactly the etcd keys in
// permitRange(key).
func (b *Backend) permitKey(key, ownerToken string) string {
	return b.prefix + key + "\x00" + ownerToken
}

// permitRange is the etcd key range [lo, hi) of the permits of key.
func (b *Backend) permitRange(key string) (lo, hi string) {
	return b.prefix + key + "\x00", b.prefix + key + "\x01"
}

// recordKey is the etcd key a claim with limit writes.
func (b *Backend) recordKey(key, ownerToken string, limit int) string {
	if limit > 1 {
		return b.permitKey(key, ownerToken)
	}
	return b.etcdKey(key)
}

// lockKey returns the lock key of an etcd key under the prefix: for a
// permit key, the key of its semaphore.
func (b *Backend) lockKey(ekey string) (string, bool) {
	key, ok := strings.CutPrefix(ekey, b.prefix)
	if !ok {
		return "", false
	}
	if i := strings.IndexByte(key, 0); i >= 0 {
		key = key[:i]
	}
	return key, true
}

// leaseSeconds rounds d up to whole seconds, at least 1, and rejects what
// etcd would refuse.
func leaseSeconds(option string, d time.Duration) (int64, error) {
	if d <= 0 {
		return 1, nil
	}
	if d > MaxLeaseTTL {
		return 0, invalidOption(option, "%v exceeds etcd's longest lease (%d s)", d, int64(MaxLeaseTTL/time.Second))
	}
	s := int64(math.Ceil(d.Seconds()))
	return s, nil
}

// newLeaseID returns a random positive lease ID. The backend chooses lease
// IDs itself so that it knows a lease's ID before the grant is answered:
// a grant whose reply is lost is undone like any other claim.
func newLeaseID() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := int64(binary.BigEndian.Uint64(b[:]) >> 1)
	if id == 0 {
		id = 1
	}
	return id
}

func (b *Backend) remember(ownerToken string, h held) {
	b.mu.Lock()
	b.held[ownerToken] = h
	b.mu.Unlock()
}

func (b *Backend) lookup(ownerToken string) (held, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.held[ownerToken]
	return h, ok
}

// refreshed notes that a keepalive of lease, sent at t, succeeded.
func (b *Backend) refreshed(ownerToken string, lease int64, t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h, ok := b.held[ownerToken]; ok && h.lease == lease && t.After(h.refreshed) {
		h.refreshed = t
		b.held[ownerToken] = h
	}
}

func (b *Backend) forget(ownerToken string) {
	b.mu.Lock()
	delete(b.held, ownerToken)
	b.mu.Unlock()
}

func (b *Backend) leases() etcdserverpb.LeaseClient {
	return etcdserverpb.NewLeaseClient(b.cli.ActiveConnection())
}

// grant creates a lease with the ID h.lease (a fresh ID when another lease
// has it), recording every ID tried under ownerToken before it is sent.
func (b *Backend) grant(ctx context.Context, ownerToken string, h held, seconds int64) (held, error) {
	h.seconds = seconds
	for range 3 {
		b.remember(ownerToken, h)
		sent := time.Now()
		_, err := b.leases().LeaseGrant(ctx, &etcdserverpb.LeaseGrantRequest{ID: h.lease, TTL: seconds})
		if err == nil {
			h.refreshed = sent
			return h, nil
		}
		if !errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseExist) {
			return h, err
		}
		h.lease = newLeaseID() // taken by someone else: 1 in 2^63
	}
	return h, errors.New("lease IDs keep colliding")
}

// revoke revokes a lease; a lease that no longer exists is not an error.
func (b *Backend) revoke(ctx context.Context, id int64) error {
	if id == 0 {
		return nil
	}
	_, err := b.cli.Revoke(ctx, clientv3.LeaseID(id))
	if err != nil && !isLeaseNotFound(err) {
		return err
	}
	return nil
}

func isLeaseNotFound(err error) bool {
	return err != nil && errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound)
}

// TryAcquire implements core.Backend and core.SemaphoreBackend: one
// transaction that puts the key (for Limit > 1: a permit key) bound to the
// session's lease if the key is free and otherwise reads the holders. The
// lease is a spare one, refreshed by a keepalive sent with the
// transaction, or else one granted first.
func (b *Backend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if err := core.ValidateKey(req.Key); err != nil {
		return core.Lease{}, err
	}
	if req.Limit > core.MaxLimit {
		return core.Lease{}, invalidOption("Limit", "must be at most %d, got %d", core.MaxLimit, req.Limit)
	}
	ctx = clientv3.WithRequireLeader(ctx)
	now := time.Now()
	rec := record{Owner: req.Owner, OwnerToken: req.OwnerToken, Acquired: now.UnixMilli()}
	if req.Limit > 1 {
		rec.Limit = req.Limit
	}
	var (
		seconds int64
		err     error
	)
	if !req.ExpireAt.IsZero() {
		if !req.ExpireAt.After(now) {
			return core.Lease{}, core.Busy(req.Key, nil) // the slot is over
		}
		rec.SlotEnd = req.ExpireAt.UnixMilli()
		// The lease only collects the key after the slot; the slot's end
		// is the one in the value.
		seconds, err = leaseSeconds("ForSlot", req.ExpireAt.Sub(now)+time.Second)
	} else {
		seconds, err = leaseSeconds("TTL", req.TTL)
	}
	if err != nil {
		return core.Lease{}, err
	}
	value, err := json.Marshal(rec)
	if err != nil {
		return core.Lease{}, err
	}
	c := &claim{b: b, req: req, seconds: seconds, slot: !req.ExpireAt.IsZero(), spareOK: true}
	if err := c.start(ctx); err != nil {
		return core.Lease{}, err
	}
	if req.Limit > 1 {
		return c.permit(ctx, string(value), now)
	}
	return c.mutex(ctx, string(value), now)
}

// claim is one TryAcquire in progress: the lease it binds its key to.
type claim struct {
	b       *Backend
	req     core.AcquireRequest
	seconds int64
	slot    bool
	h       held
	reused  bool // h.lease is a spare, refreshed with the first transaction
	kaDone  bool // the spare's refresh succeeded
	spareOK bool // the lease may serve as a spare if the claim fails
}

// start takes a spare lease of the claim's TTL or grants one. Slot leases
// are not reused.
func (c *claim) start(ctx context.Context) error {
	b, req := c.b, c.req
	h := held{key: req.Key, ekey: b.recordKey(req.Key, req.OwnerToken, req.Limit), seconds: c.seconds}
	if sp, ok := b.takeSpare(c.seconds); ok && !c.slot {
		h.lease, h.refreshed = sp.id, sp.refreshed
		b.remember(req.OwnerToken, h) // before the claim is sent: an undo revokes it
		c.h, c.reused = h, true
		return nil
	} else if ok {
		b.putSpare(c.seconds, sp)
	}
	h.lease = newLeaseID()
	h, err := b.grant(ctx, req.OwnerToken, h, c.seconds)
	c.h = h
	if err != nil {
		return c.grantFailed(err)
	}
	return nil
}

// grantFailed is the error of a claim whose lease grant failed, before
// the claim's transaction was sent. When the grant itself never left (no
// connection to any endpoint: refused, unknown host), the store has
// neither the lease nor the key, and the engine owes no undo.
func (c *claim) grantFailed(err error) error {
	err = fmt.Errorf("lease grant: %w", err)
	if notSent(err) {
		c.b.forget(c.req.OwnerToken)
		return core.Unclaimed(err)
	}
	return err
}

// notSent reports whether err is gRPC's answer to a call that it could not
// send because no connection could be made: Unavailable, with the dial
// error as its description.
func notSent(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unavailable && strings.Contains(st.Message(), "Error while dialing")
}

// commit sends the transaction txn builds, together with a keepalive of a
// reused lease. A reused lease found expired is replaced by a granted one
// and the transaction sent again.
func (c *claim) commit(ctx context.Context, txn func() clientv3.Txn) (*clientv3.TxnResponse, error) {
	for {
		var (
			wg     sync.WaitGroup
			kaErr  error
			kaSent time.Time
		)
		if c.reused && !c.kaDone {
			kaSent = time.Now()
			lease := c.h.lease
			wg.Go(func() {
				ttls, err := c.b.ka.keepAlive(ctx, []int64{lease}, false)
				switch {
				case err != nil:
					kaErr = err
				case ttls[0] <= 0:
					kaErr = errors.New("lease expired")
				}
			})
		}
		resp, err := txn().Commit()
		wg.Wait()
		if err != nil {
			if c.reused && isLeaseNotFound(err) {
				// The spare expired: nothing was written. Claim with a
				// lease of its own.
				c.reused = false
				h := c.h
				h.lease, h.rev, h.refreshed = newLeaseID(), 0, time.Time{}
				if c.h, err = c.b.grant(ctx, c.req.OwnerToken, h, c.seconds); err != nil {
					return nil, c.grantFailed(err)
				}
				continue
			}
			return nil, err
		}
		if c.reused && !c.kaDone {
			if kaErr == nil {
				c.h.refreshed = kaSent
				c.kaDone = true // refreshed after the engine sent the claim: once is enough
			} else {
				c.spareOK = false
				if resp.Succeeded {
					// The key is bound to a lease whose refresh is not
					// confirmed: it might expire before this session's
					// deadline. The engine undoes the claim.
					return nil, fmt.Errorf("refresh the lease: %w", kaErr)
				}
			}
		}
		return resp, nil
	}
}

// succeed records the claim as held with fencing token rev.
func (c *claim) succeed(rev int64, now time.Time) core.Lease {
	c.h.rev = rev
	c.b.keep(c.req, c.h)
	return c.b.lease(rev, now, c.req)
}

// own is a claim that finds its own record, written by an earlier attempt
// with the same owner token: it holds the key with that record's lease.
func (c *claim) own(ctx context.Context, kv *mvccpb.KeyValue, now time.Time) core.Lease {
	if kv.Lease != c.h.lease {
		_ = c.b.revoke(ctx, c.h.lease)
	}
	c.h.lease = kv.Lease
	return c.succeed(kv.CreateRevision, now)
}

// giveUp forgets a claim that took nothing and keeps its unused lease for
// the next claim, or revokes it; wait waits for that revoke.
func (c *claim) giveUp(ctx context.Context) (wait func()) {
	c.b.forget(c.req.OwnerToken)
	var wg sync.WaitGroup
	if !c.spareOK || c.slot || !c.b.putSpare(c.seconds, spare{id: c.h.lease, refreshed: c.h.refreshed}) {
		lease := c.h.lease
		wg.Go(func() { _ = c.b.revoke(ctx, lease) })
	}
	return wg.Wait
}

// mutex claims the lock key: if neither it nor any permit key of the same
// key exists, put it bound to the claim's lease; otherwise read both.
func (c *claim) mutex(ctx context.Context, value string, now time.Time) (core.Lease, error) {
	b, key := c.b, c.req.Key
	k := b.etcdKey(key)
	lo, hi := b.permitRange(key)
	for attempt := 0; attempt < 3; attempt++ {
		resp, err := c.commit(ctx, func() clientv3.Txn {
			return b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0),
					clientv3.Compare(clientv3.CreateRevision(lo), "=", 0).WithRange(hi)). // no permits
				Then(clientv3.OpPut(k, value, clientv3.WithLease(clientv3.LeaseID(c.h.lease)))).
				Else(clientv3.OpGet(k),
					clientv3.OpGet(lo, clientv3.WithRange(hi), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)))
		})
		if err != nil {
			return core.Lease{}, err
		}
		if resp.Succeeded {
			// The transaction's only write created the key: its create
			// revision is the transaction's revision.
			return c.succeed(resp.Header.Revision, now), nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			// Permits of a semaphore hold the key, or held it: a slot
			// semaphore whose slot ended leaves its permits to their
			// leases, which only collect them.
			live, ended := splitPermits(resp.Responses[1].GetResponseRange().Kvs, time.Now())
			if len(live) > 0 {
				c.giveUp(ctx)()
				return core.Lease{}, core.LimitMismatch(key, live[0].limit(), 1)
			}
			if len(ended) > 0 && attempt == 0 {
				kvs := make([]*mvccpb.KeyValue, len(ended))
				for i, p := range ended {
					kvs[i] = p.kv
				}
				if _, err := b.deleteIncarnations(ctx, kvs); err != nil {
					return core.Lease{}, fmt.Errorf("delete an ended slot: %w", err)
				}
			}
			continue
		}
		kv := kvs[0]
		cur, ok := decode(kv.Value)
		if ok && cur.OwnerToken == c.req.OwnerToken {
			return c.own(ctx, kv, now), nil // our own claim, by an earlier attempt
		}
		if ok && cur.slotOver(time.Now()) && attempt == 0 {
			// A slot lock whose slot has ended is free; its lease only
			// keeps it for garbage collection. Delete exactly that
			// incarnation and claim again.
			_, err := b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)).
				Then(clientv3.OpDelete(k)).
				Commit()
			if err != nil {
				return core.Lease{}, fmt.Errorf("delete an ended slot: %w", err)
			}
			continue
		}
		// Busy: keep the unused lease for the next claim (or revoke it) and
		// say who holds the key.
		wait := c.giveUp(ctx)
		var info *core.Info
		if ok {
			info = b.holderInfo(ctx, key, kv, cur)
		}
		wait()
		return core.Lease{}, core.Busy(key, info)
	}
	c.giveUp(ctx)()
	return core.Lease{}, errors.New("the key changed under every attempt")
}

// keep records a claim that succeeded. The engine neither renews nor
// releases slot locks, so those are not kept: an undo finds them by owner
// token in the key's value.
func (b *Backend) keep(req core.AcquireRequest, h held) {
	if req.ExpireAt.IsZero() {
		b.remember(req.OwnerToken, h)
	} else {
		b.forget(req.OwnerToken)
	}
}

func (b *Backend) lease(rev int64, now time.Time, req core.AcquireRequest) core.Lease {
	l := core.Lease{Token: uint64(rev), AcquiredAt: now}
	if !req.ExpireAt.IsZero() {
		l.ExpiresAt = req.ExpireAt
	} else {
		l.ExpiresAt = now.Add(req.TTL)
	}
	return l
}

// holderInfo describes the holder of kv. For a lease lock the remaining
// time is read from the holder's lease: etcd reports it in whole seconds,
// rounded down, so Remaining is that plus half a second, at most the
// lease's granted TTL. It is 0 (unknown) when the lease cannot be read.
func (b *Backend) holderInfo(ctx context.Context, key string, kv *mvccpb.KeyValue, rec record) *core.Info {
	now := time.Now()
	info := &core.Info{Key: key, Owner: rec.Owner, Token: uint64(kv.CreateRevision)}
	if rec.Limit > 1 {
		info.Limit = rec.Limit
	}
	if rec.Acquired != 0 {
		info.AcquiredAt = time.UnixMilli(rec.Acquired)
	}
	if rec.SlotEnd != 0 {
		info.ExpiresAt = time.UnixMilli(rec.SlotEnd)
		info.Remaining = info.ExpiresAt.Sub(now)
		return info
	}
	if kv.Lease == 0 {
		return info
	}
	ttl, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil || ttl.TTL < 0 {
		return info
	}
	rem := time.Duration(ttl.TTL)*time.Second + 500*time.Millisecond
	if g := time.Duration(ttl.GrantedTTL) * time.Second; g > 0 && rem > g {
		rem = g
	}
	info.Remaining = rem
	info.ExpiresAt = now.Add(rem)
	return info
}

// Renew implements core.Backend. One call is one round trip: one message
// per lease on the Backend's LeaseKeepAlive stream, and, at the same time, transactions of up to 128 Gets that check each key is still bound
// to its session's lease with its fencing token — a live lease does not
// prove the key is still there.
func (b *Backend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	// One attempt waits at most a sixth of the shortest TTL (at least
	// 100 ms): a member that hangs without closing the connection then
	// costs one attempt, and the engine's retry, before the deadline, goes
	// on a new keepalive stream and to the next member.
	attempt := time.Duration(math.MaxInt64)
	for _, r := range reqs {
		attempt = min(attempt, r.TTL/6)
	}
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), max(attempt, 100*time.Millisecond))
	defer cancel()
	sent := time.Now()
	results := make([]error, len(reqs))
	hs := make([]held, len(reqs))
	var idx []int // requests to send
	for i, r := range reqs {
		h, ok := b.lookup(r.OwnerToken)
		if !ok || h.key != r.Key || h.ekey != b.recordKey(r.Key, r.OwnerToken, r.Limit) || h.rev == 0 {
			results[i] = core.Gone(r.Key, "not held by this backend")
			continue
		}
		hs[i] = h
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return results, nil
	}

	var (
		wg     sync.WaitGroup
		ttls   []int64
		kaErr  error
		chunks = (len(idx) + b.maxTxnOps - 1) / b.maxTxnOps
		kvs    = make([]*mvccpb.KeyValue, len(reqs))
		txErrs = make([]error, chunks)
	)
	wg.Go(func() {
		ids := make([]int64, len(idx))
		for j, i := range idx {
			ids[j] = hs[i].lease
		}
		ttls, kaErr = b.ka.keepAlive(ctx, ids, true)
	})
	for c := range chunks {
		part := idx[c*b.maxTxnOps : min(len(idx), (c+1)*b.maxTxnOps)]
		wg.Go(func() {
			ops := make([]clientv3.Op, len(part))
			for j, i := range part {
				ops[j] = clientv3.OpGet(hs[i].ekey) // WithKeysOnly would drop the lease ID
			}
			resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				txErrs[c] = err
				return
			}
			for j, i := range part {
				if r := resp.Responses[j].GetResponseRange(); r != nil && len(r.Kvs) > 0 {
					kvs[i] = r.Kvs[0]
				}
			}
		})
	}
	wg.Wait()

	if kaErr != nil {
		return nil, fmt.Errorf("etcdlock: renew: keepalive: %w", kaErr)
	}
	failed := 0
	var firstErr error
	for j, i := range idx {
		if err := txErrs[j/b.maxTxnOps]; err != nil {
			results[i] = fmt.Errorf("etcdlock: renew: %w", err)
			firstErr = results[i]
			failed++
			continue
		}
		h, kv := hs[i], kvs[i]
		switch {
		case ttls[j] <= 0:
			results[i] = core.Gone(reqs[i].Key, "lease expired or revoked")
		case kv == nil:
			results[i] = core.Gone(reqs[i].Key, "key deleted")
		case kv.Lease != h.lease || kv.CreateRevision != h.rev:
			results[i] = core.Gone(reqs[i].Key, "held by another owner")
		}
		if results[i] != nil {
			// The lease holds no key of ours any more: nothing to undo.
			b.forget(reqs[i].OwnerToken)
		} else {
			b.refreshed(reqs[i].OwnerToken, h.lease, sent)
		}
	}
	if failed == len(reqs) {
		return nil, firstErr
	}
	return results, nil
}

// Release implements core.Backend. Without Keep it deletes the key if it is
// still bound to the session's lease at the session's create revision, so
// it can never delete a newer holder's key, and keeps the lease as a spare;
// a key already gone, or another's, is answered core.Gone (nothing was
// released). A claim whose outcome is unknown is undone
// by revoking its lease. With Keep it moves the key, owner-checked, to a
// new lease of Keep (rounded up to whole seconds) and revokes the old one:
// three round trips.
func (b *Backend) Release(ctx context.Context, req core.ReleaseRequest) error {
	ctx = clientv3.WithRequireLeader(ctx)
	h, ok := b.lookup(req.OwnerToken)
	own := ok && h.key == req.Key // the lease is this backend's own record, never a spare
	if !own {
		// Not acquired through this backend: find the lease by reading
		// the key and checking its owner token. An undo does not say
		// whether it claimed a lock or a permit: read both.
		resp, err := b.cli.Txn(ctx).Then(clientv3.OpGet(b.etcdKey(req.Key)),
			clientv3.OpGet(b.permitKey(req.Key, req.OwnerToken))).Commit()
		if err != nil {
			return err
		}
		found := false
		for _, r := range resp.Responses {
			kvs := r.GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			kv := kvs[0]
			if rec, ok := decode(kv.Value); ok && rec.OwnerToken == req.OwnerToken {
				h = held{key: req.Key, ekey: string(kv.Key), lease: kv.Lease, rev: kv.CreateRevision}
				found = true
				break
			}
		}
		if !found {
			return core.Gone(req.Key, "held by another owner or gone")
		}
	}
	k := h.ekey
	if h.rev == 0 {
		// The claim's outcome is unknown (its reply was lost, or it may
		// still be on its way): revoking the lease deletes the key if the
		// claim was applied, and makes it fail if it arrives later.
		if err := b.revoke(ctx, h.lease); err != nil {
			return err
		}
		b.forget(req.OwnerToken)
		return nil
	}
	if req.Keep <= 0 {
		// Delete exactly this incarnation of the key, bound to this
		// lease, and keep the lease for the next claim.
		resp, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.LeaseValue(k), "=", h.lease),
				clientv3.Compare(clientv3.CreateRevision(k), "=", h.rev)).
			Then(clientv3.OpDelete(k)).
			Commit()
		if err != nil {
			return err
		}
		b.forget(req.OwnerToken)
		if resp.Succeeded && k != b.etcdKey(req.Key) {
			b.permitFreed(req.Key, h.rev, resp.Header.Revision)
		}
		if !own {
			// A lease read from the key may by now serve another key of
			// the process that holds it: never revoke it from here.
			return releasedIf(req.Key, resp.Succeeded)
		}
		if !resp.Succeeded || !b.putSpare(h.seconds, spare{id: h.lease, refreshed: h.refreshed}) {
			_ = b.revoke(ctx, h.lease) // no key of ours on it; it would expire anyway
		}
		return releasedIf(req.Key, resp.Succeeded)
	}
	seconds, err := leaseSeconds("MinHold", req.Keep)
	if err != nil {
		return err
	}
	keep := newLeaseID()
	if _, err := b.leases().LeaseGrant(ctx, &etcdserverpb.LeaseGrantRequest{ID: keep, TTL: seconds}); err != nil {
		return fmt.Errorf("lease grant: %w", err)
	}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(k), "=", h.lease),
			clientv3.Compare(clientv3.CreateRevision(k), "=", h.rev)).
		Then(clientv3.OpPut(k, "", clientv3.WithIgnoreValue(), clientv3.WithLease(clientv3.LeaseID(keep)))).
		Commit()
	if err != nil {
		// The move may have been applied: revoking keep could then free
		// the key before the min hold ends. Left alone, keep expires by
		// itself if nothing was moved onto it, and a retry of this
		// release finds the key on keep no longer bound to h.lease.
		return err
	}
	if !resp.Succeeded {
		_ = b.revoke(ctx, keep) // not ours any more: nothing to keep
	}
	if err := b.revoke(ctx, h.lease); err != nil {
		return err
	}
	b.forget(req.OwnerToken)
	return releasedIf(req.Key, resp.Succeeded)
}

// releasedIf is a release's answer: nil when the key was still the lease's
// (deleted, or moved to the min hold's lease), else core.Gone.
func releasedIf(key string, ours bool) error {
	if !ours {
		return core.Gone(key, "held by another owner, expired or deleted")
	}
	return nil
}

// Watch implements core.Watcher with one watch on the prefix that reports
// deletions only: a release, a revoked or expired lease, a forced release.
// It requires a leader, so a member cut off from the cluster ends the watch
// instead of going silent, and the engine falls back to polling.
func (b *Backend) Watch(ctx context.Context, ready func(), fn func(key string)) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	ch := b.cli.Watch(wctx, b.prefix, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	for resp := range ch {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("etcdlock: watch: %w", err)
		}
		if resp.Created {
			ready()
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE {
				if key, ok := b.lockKey(string(ev.Kv.Key)); ok {
					fn(key) // a lock, or one permit of a semaphore
				}
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("etcdlock: watch: closed")
}

// Inspect implements core.Admin: a read of the key and of its permits,
// and a read of the holder's lease. For a semaphore it describes the
// oldest permit.
func (b *Backend) Inspect(ctx context.Context, key string) (core.Info, bool, error) {
	if err := core.ValidateKey(key); err != nil {
		return core.Info{}, false, err
	}
	list, err := b.holders(clientv3.WithRequireLeader(ctx), key, true)
	if err != nil {
		return core.Info{}, false, fmt.Errorf("etcdlock: inspect: %w", err)
	}
	if len(list) == 0 {
		return core.Info{}, false, nil
	}
	return list[0], true, nil
}

// info describes a lock or permit key; false when it no longer holds a
// lock (an ended slot, or a lease that just expired).
func (b *Backend) info(ctx context.Context, key string, kv *mvccpb.KeyValue) (core.Info, bool) {
	rec, _ := decode(kv.Value)
	if rec.slotOver(time.Now()) {
		return core.Info{}, false
	}
	i := b.holderInfo(ctx, key, kv, rec)
	if rec.SlotEnd == 0 && kv.Lease != 0 && i.Remaining == 0 {
		if ttl, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL < 0 {
			return core.Info{}, false
		}
	}
	return *i, true
}

// infoParallel is how many lease reads infos has in flight at once.
const infoParallel = 32

// infos describes each of kvs (lock or permit keys of key, or of the key
// keyOf names), in order, leaving out those that no longer hold a lock.
// The lease reads run in parallel.
func (b *Backend) infos(ctx context.Context, kvs []*mvccpb.KeyValue, keyOf func(*mvccpb.KeyValue) string) []core.Info {
	out := make([]core.Info, len(kvs))
	ok := make([]bool, len(kvs))
	sem := make(chan struct{}, infoParallel)
	var wg sync.WaitGroup
	for i, kv := range kvs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], ok[i] = b.info(ctx, keyOf(kv), kv)
		})
	}
	wg.Wait()
	list := out[:0]
	for i := range out {
		if ok[i] {
			list = append(list, out[i])
		}
	}
	return list
}

// listPage is how many keys one List read returns.
const listPage = 500

// List implements core.Admin: prefix reads of up to 500 keys, and one lease
// read per lease lock or permit (32 at a time). The result is sorted by
// key, and a semaphore's permits by token (oldest first), one Info each.
// Locks taken or freed during the walk may or may not appear.
func (b *Backend) List(ctx context.Context, prefix string) ([]core.Info, error) {
	ctx = clientv3.WithRequireLeader(ctx)
	start := b.etcdKey(prefix)
	end := clientv3.GetPrefixRangeEnd(start)
	keyOf := func(kv *mvccpb.KeyValue) string { k, _ := b.lockKey(string(kv.Key)); return k }
	var list []core.Info
	for {
		resp, err := b.cli.Get(ctx, start, clientv3.WithRange(end), clientv3.WithLimit(listPage),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return nil, fmt.Errorf("etcdlock: list: %w", err)
		}
		list = append(list, b.infos(ctx, resp.Kvs, keyOf)...)
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	slices.SortStableFunc(list, func(x, y core.Info) int {
		return cmp.Or(strings.Compare(x.Key, y.Key), cmp.Compare(x.Token, y.Token))
	})
	return list, nil
}

// ForceRelease implements core.Admin: it deletes exactly the incarnation of
// the key it read (same lease, same create revision), or of each permit of
// a semaphore, which wakes waiters. It never revokes a holder's lease: a
// released lease may already serve another key of the holder's process as
// a spare. A holder learns of the loss at its next renewal, which finds
// its key gone.
func (b *Backend) ForceRelease(ctx context.Context, key string) (bool, error) {
	if err := core.ValidateKey(key); err != nil {
		return false, err
	}
	ctx = clientv3.WithRequireLeader(ctx)
	k := b.etcdKey(key)
	lo, hi := b.permitRange(key)
	resp, err := b.cli.Txn(ctx).Then(clientv3.OpGet(k), clientv3.OpGet(lo, clientv3.WithRange(hi))).Commit()
	if err != nil {
		return false, fmt.Errorf("etcdlock: force release: %w", err)
	}
	kvs := append(resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs...)
	if len(kvs) == 0 {
		return false, nil
	}
	now := time.Now()
	live := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		rec, _ := decode(kv.Value)
		live[string(kv.Key)] = !rec.slotOver(now)
	}
	deleted, err := b.deleteIncarnations(ctx, kvs)
	if err != nil {
		return false, fmt.Errorf("etcdlock: force release: %w", err)
	}
	released := false
	for _, ekey := range deleted {
		released = released || live[ekey]
	}
	return released, nil
}
