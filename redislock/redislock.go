package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/internal/optcheck"
)

// DefaultPrefix is the Redis key prefix used unless WithPrefix says otherwise.
const DefaultPrefix = "dislock"

// fenceKeep is how long a lock's fencing counter outlives the lock. Tokens
// keep growing without it (they are at least the server time in µs); it
// covers a server clock that steps back.
const fenceKeep = 24 * time.Hour

// renewChunk is the most leases one renew script call extends, so that one
// call never blocks the server for long.
const renewChunk = 256

// Option configures a Backend.
type Option func(*options)

type options struct {
	prefix     string
	clientOpts []core.ClientOption
	subTimeout time.Duration
	optcheck.Errs
}

// invalidOption returns the error of an invalid value given to option name.
var invalidOption = optcheck.Prefix("redislock.").Invalid

// WithPrefix sets the prefix of every Redis key and of the release channel
// (default "dislock"). Lockers that should see each other's locks use the
// same prefix. It must be non-empty and may contain neither "{" nor "}" (the
// hash tag that keeps a lock's keys in one Cluster slot follows it).
func WithPrefix(prefix string) Option {
	return func(o *options) {
		switch {
		case prefix == "":
			o.RecordErr(invalidOption("WithPrefix", "empty"))
		case strings.ContainsAny(prefix, "{}"):
			o.RecordErr(invalidOption("WithPrefix", "%q contains a brace", prefix))
		default:
			o.prefix = prefix
		}
	}
}

// WithClientOptions passes options to core.New when New builds the Locker.
// NewBackend ignores them.
func WithClientOptions(opts ...core.ClientOption) Option {
	return func(o *options) { o.clientOpts = append(o.clientOpts, opts...) }
}

// WithSubscribeTimeout bounds how long Watch waits for Redis to confirm the
// release subscription (default 5s). When it is not confirmed in time the
// Locker polls instead, and tries to subscribe again later. go-redis bounds
// opening the pub/sub connection by the client's DialTimeout and
// ReadTimeout rather than by this timeout.
func WithSubscribeTimeout(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.RecordErr(invalidOption("WithSubscribeTimeout", "must be positive, got %v", d))
			return
		}
		o.subTimeout = d
	}
}

// New returns a Locker (which also implements core.Admin) on client. The
// client stays the caller's: Close on the Locker does not close it.
func New(client redis.UniversalClient, opts ...Option) (*core.Client, error) {
	b, o, err := newBackend(client, opts)
	if err != nil {
		return nil, err
	}
	return core.New(b, o.clientOpts...)
}

// Backend is the Redis store for core's lease engine. It implements
// core.Backend, core.Watcher, core.Queuer, core.SemaphoreBackend
// (semaphore.go) and core.Admin, and is safe for concurrent use.
// Most programs use New; NewBackend is for wrapping or composing backends.
type Backend struct {
	client     redis.UniversalClient
	lane       *lane // claims and releases
	prefix     string
	channel    string
	group      grouping
	subTimeout time.Duration
}

var (
	_ core.Backend = (*Backend)(nil)
	_ core.Watcher = (*Backend)(nil)
	_ core.Admin   = (*Backend)(nil)
	_ core.Queuer  = (*Backend)(nil)

	_ core.ContextBound = (*Backend)(nil)
)

// grouping says which leases one renew script call may cover.
type grouping int

const (
	groupAll  grouping = iota // one server: any keys
	groupSlot                 // Redis Cluster: keys of one hash slot
	groupTag                  // other sharding clients: keys of one hash tag
)

// NewBackend returns a Backend on client. client may be a *redis.Client
// (single node or Sentinel failover), a *redis.ClusterClient or any other
// redis.UniversalClient that routes keys by hash tag.
func NewBackend(client redis.UniversalClient, opts ...Option) (*Backend, error) {
	b, _, err := newBackend(client, opts)
	return b, err
}

func newBackend(client redis.UniversalClient, opts []Option) (*Backend, options, error) {
	o := options{prefix: DefaultPrefix, subTimeout: 5 * time.Second}
	if err := optcheck.Apply(&o, opts); err != nil {
		return nil, o, err
	}
	if client == nil {
		return nil, o, invalidOption("New", "nil redis client")
	}
	b := &Backend{
		client:     client,
		lane:       newLane(client),
		prefix:     o.prefix,
		channel:    o.prefix + ":released",
		subTimeout: o.subTimeout,
	}
	switch client.(type) {
	case *redis.Client:
		b.group = groupAll
	case *redis.ClusterClient:
		b.group = groupSlot
	default:
		b.group = groupTag
	}
	b.lane.combine = b.group == groupAll
	return b, o, nil
}

// Name implements core.Backend.
func (b *Backend) Name() string { return "redis" }

// Close implements core.Backend. It does not close the Redis client, which
// belongs to the caller.
func (b *Backend) Close() error {
	b.lane.close()
	return nil
}

// TryAcquire implements core.Backend.
func (b *Backend) TryAcquire(ctx context.Context, req core.AcquireRequest) (core.Lease, error) {
	if err := core.ValidateKey(req.Key); err != nil {
		return core.Lease{}, err
	}
	if req.OwnerToken == "" || strings.Contains(req.OwnerToken, "|") {
		return core.Lease{}, fmt.Errorf("redislock: owner token must be non-empty and without %q", "|")
	}
	if req.Limit > 1 {
		return b.semAcquire(ctx, req) // semaphore.go
	}
	var expireAt int64
	if !req.ExpireAt.IsZero() {
		expireAt = req.ExpireAt.UnixMilli()
		if expireAt <= 0 {
			expireAt = 1
		}
	}
	ttl := max(req.TTL.Milliseconds(), 1)
	args := []any{req.OwnerToken, req.Owner, ttl}
	if expireAt != 0 || req.Waiter != "" {
		// A plain claim leaves these out: the server then builds fewer
		// script arguments, and the script knows it has the common case.
		args = append(args, expireAt, req.Waiter, max(req.WaiterTTL.Milliseconds(), 1))
	}
	keys := b.keys(req.Key)
	var fast fastCall
	if len(args) == 3 {
		fast = fastCall{kind: 'c', lock: keys[0], queue: keys[1], a: args[0], b: args[1], c: args[2]}
	}
	cmd := acquireScript.claim(ctx, b.lane, req.OwnerToken, fast, keys, args...)
	reply, err := cmd.Result()
	if isWrongType(err) {
		return b.heldAsSemaphore(ctx, req) // semaphore.go
	}
	if err != nil {
		return core.Lease{}, err
	}
	if s, ok := reply.(string); ok {
		// A fresh claim whose token and acquired-at are both s, the
		// server's clock in µs.
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return core.Lease{}, fmt.Errorf("unexpected script reply %q", s)
		}
		now := time.UnixMicro(n)
		return core.Lease{Token: uint64(n), AcquiredAt: now, ExpiresAt: now.Add(time.Duration(ttl) * time.Millisecond)}, nil
	}
	vals, ok := reply.([]any)
	if !ok {
		return core.Lease{}, fmt.Errorf("unexpected script reply %v", reply)
	}
	if len(vals) == 1 {
		switch code, _ := vals[0].(int64); code {
		case 2: // the slot is over
			return core.Lease{}, core.Busy(req.Key, nil)
		case 3: // free, but another waiter's turn
			return core.Lease{}, core.Busy(req.Key, nil)
		}
	}
	r, err := parseHolder(vals)
	if err != nil {
		return core.Lease{}, err
	}
	if !r.mine {
		info := r.info(req.Key)
		return core.Lease{}, core.Busy(req.Key, &info)
	}
	lease := core.Lease{Token: r.token, AcquiredAt: r.acquired}
	switch {
	case r.pttl >= 0:
		lease.ExpiresAt = r.now.Add(time.Duration(r.pttl) * time.Millisecond)
	case !req.ExpireAt.IsZero():
		lease.ExpiresAt = time.UnixMilli(expireAt)
	case !r.now.IsZero():
		lease.ExpiresAt = r.now.Add(time.Duration(ttl) * time.Millisecond)
	}
	return lease, nil
}

// holder is a parsed acquire reply.
type holder struct {
	mine     bool
	token    uint64
	acquired time.Time
	pttl     int64     // -3: fresh claim, -1: no expiry
	now      time.Time // zero when the script did not read the clock
	owner    string
}

func (h holder) info(key string) core.Info {
	i := core.Info{Key: key, Owner: h.owner, Token: h.token, AcquiredAt: h.acquired}
	if h.pttl >= 0 && !h.now.IsZero() {
		i.Remaining = time.Duration(h.pttl) * time.Millisecond
		i.ExpiresAt = h.now.Add(i.Remaining)
	}
	return i
}

// parseHolder reads {mine, token, acquired_us, pttl, time_s, time_us[, owner]},
// or {1, token, acquired_us}: a fresh claim made at acquired_us.
func parseHolder(v []any) (holder, error) {
	var h holder
	if len(v) == 3 {
		mine, err1 := toInt(v[0])
		tok, err2 := toInt(v[1])
		acq, err3 := toInt(v[2])
		if err := errors.Join(err1, err2, err3); err != nil || mine != 1 {
			return h, fmt.Errorf("unexpected script reply %v", v)
		}
		h.mine, h.token, h.pttl = true, uint64(tok), -3
		h.acquired = time.UnixMicro(acq)
		h.now = h.acquired
		return h, nil
	}
	if len(v) < 6 {
		return h, fmt.Errorf("unexpected script reply %v", v)
	}
	mine, err1 := toInt(v[0])
	tok, err2 := toInt(v[1])
	acq, err3 := toInt(v[2])
	pttl, err4 := toInt(v[3])
	sec, err5 := toInt(v[4])
	usec, err6 := toInt(v[5])
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return h, fmt.Errorf("unexpected script reply: %w", err)
	}
	h.mine = mine == 1
	h.token = uint64(tok)
	if acq > 0 {
		h.acquired = time.UnixMicro(acq)
	}
	h.pttl = pttl
	if sec > 0 {
		h.now = time.Unix(sec, usec*1000)
	}
	if len(v) > 6 {
		h.owner, _ = v[6].(string)
	}
	return h, nil
}

// toInt reads an integer or a decimal string reply element.
func toInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		if x == "" {
			return 0, nil
		}
		return strconv.ParseInt(x, 10, 64)
	case nil:
		return 0, nil
	}
	return 0, fmt.Errorf("not an integer: %T", v)
}

// Renew implements core.Backend. Leases are grouped into as few renew script
// calls as the topology allows (all keys in one call on a single server, one
// call per hash slot on Cluster) and the calls go out in one pipeline, which
// a Cluster client sends as one pipeline per node.
func (b *Backend) Renew(ctx context.Context, reqs []core.RenewRequest) ([]error, error) {
	results := make([]error, len(reqs))
	type group struct {
		c   *call
		idx []int
	}
	var groups []*group
	byID := map[string]*group{}
	for i, r := range reqs {
		var id string
		switch b.group {
		case groupAll:
		case groupSlot:
			id = strconv.Itoa(hashSlot(escapeKey(r.Key)))
		case groupTag:
			id = r.Key
		}
		s, keys := renewScript, []string{b.lockKey(r.Key)}
		if r.Limit > 1 { // a permit: semaphore.go
			id += semSuffix
			s, keys = semRenewScript, b.semRenewKeys(r)
		}
		g := byID[id]
		if g == nil || len(g.idx) == renewChunk {
			g = &group{c: &call{s: s}}
			byID[id] = g
			groups = append(groups, g)
		}
		ttl := r.TTL.Milliseconds()
		if ttl < 1 {
			ttl = 1
		}
		g.c.keys = append(g.c.keys, keys...)
		g.c.args = append(g.c.args, r.OwnerToken, ttl)
		g.idx = append(g.idx, i)
	}
	calls := make([]*call, len(groups))
	for i, g := range groups {
		calls[i] = g.c
	}
	runBatch(ctx, b.client, calls)
	failed := 0
	var firstErr error
	for _, g := range groups {
		vals, err := g.c.cmd.Slice()
		if isWrongType(err) && g.c.s == renewScript {
			// A key of the batch holds a semaphore now (semaphore.go).
			b.renewApart(ctx, reqs, g.idx, results)
			continue
		}
		if err == nil && len(vals) != len(g.idx) {
			err = fmt.Errorf("unexpected script reply of %d items for %d leases", len(vals), len(g.idx))
		}
		if err != nil {
			err = fmt.Errorf("redislock: renew: %w", err)
			if firstErr == nil {
				firstErr = err
			}
			for _, i := range g.idx {
				results[i] = err
				failed++
			}
			continue
		}
		for j, i := range g.idx {
			if n, _ := toInt(vals[j]); n != 1 {
				results[i] = core.Gone(reqs[i].Key, "held by another owner or gone")
			}
		}
	}
	if failed == len(reqs) && firstErr != nil {
		return nil, firstErr
	}
	return results, nil
}

// Release implements core.Backend.
func (b *Backend) Release(ctx context.Context, req core.ReleaseRequest) error {
	if req.Limit > 1 {
		return b.semRelease(ctx, req) // semaphore.go
	}
	var token string // the release script checks the lease by it when known
	if req.Token != 0 {
		token = strconv.FormatUint(req.Token, 10)
	}
	args := []any{req.OwnerToken, token}
	if req.Keep > 0 {
		args = append(args, max(req.Keep.Milliseconds(), 1))
	}
	if err := b.lane.after(ctx, req.OwnerToken); err != nil {
		return err
	}
	keys := b.keys(req.Key)
	var fast fastCall
	if token != "" && len(args) == 2 {
		fast = fastCall{kind: 'r', lock: keys[0], queue: keys[1], a: args[0], b: args[1], c: ""}
	}
	cmd, _ := releaseScript.send(ctx, b.lane, keys, args, "", fast)
	n, err := cmd.Int()
	if isWrongType(err) {
		// The key holds a semaphore: the token may be one of its permits
		// (a Release without Limit).
		return b.semRelease(ctx, req)
	}
	return releaseResult(req.Key, n, err)
}

// releaseResult is a release script's reply (1 freed, 2 kept, 0 nothing of
// this owner token's) as Release's answer.
func releaseResult(key string, n int, err error) error {
	if err == nil && n == 0 {
		return core.Gone(key, "held by another owner or gone")
	}
	return err
}

// Now implements core.Backend with TIME, read on the node that holds key
// (on Cluster, the master of the key's slot), so a slot end is computed on
// the clock of the node that will expire the lock.
func (b *Backend) Now(ctx context.Context, key string) (time.Time, error) {
	cmd := redis.NewTimeCmd(ctx, "time")
	var err error
	if cc, ok := b.client.(*redis.ClusterClient); ok {
		// The node's client is not the lane's: the call is made on a
		// goroutine of its own, which the caller leaves when ctx ends.
		err = untilDone(ctx, func() {
			node, err := cc.MasterForKey(ctx, b.lockKey(key))
			if err != nil {
				cmd.SetErr(err)
				return
			}
			sendOnce(ctx, node, cmd) // a refused connection fails at once
		})
	} else {
		_, err = b.lane.send(ctx, cmd, true, "", fastCall{})
	}
	if err != nil {
		return time.Time{}, err
	}
	t, err := cmd.Result()
	if err != nil {
		return time.Time{}, authErr(err)
	}
	return t, nil
}

// untilDone runs f on a goroutine of its own and waits until it returns
// or ctx ends, and then returns ctx's error.
func untilDone(ctx context.Context, f func()) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// EndsWithContext implements core.ContextBound: the claims and clock reads
// of a *redis.Client, *redis.ClusterClient or *redis.Ring return when their
// ctx ends, whatever the server does (see lane), so the engine makes them
// on the caller's goroutine. Other clients report false, and the engine
// hands their claims to a call worker that it can leave behind.
func (b *Backend) EndsWithContext() bool { return b.lane.batch }

// Watch implements core.Watcher with one subscription to the release
// channel ("<prefix>:released"). It returns an error rather than wait when
// Redis does not confirm the subscription within the subscribe timeout
// (pub/sub unavailable, e.g. behind some proxies), and when the connection
// fails; the engine then polls and calls Watch again. A turn message (see
// WatchTurns) reaches fn as its key alone.
func (b *Backend) Watch(ctx context.Context, ready func(), fn func(key string)) error {
	return b.watch(ctx, ready, func(key, _ string) { fn(key) })
}

// WatchTurns implements core.Queuer on the same subscription as Watch. A
// message on the release channel is either a key (a release with nobody
// queued but someone answered busy, or a ForceRelease), which reaches fn
// with waiter "", or a turn: the key, NUL, and the id of the first live
// waiter.
func (b *Backend) WatchTurns(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	return b.watch(ctx, ready, fn)
}

func (b *Backend) watch(ctx context.Context, ready func(), fn func(key, waiter string)) error {
	// The connection set-up, SUBSCRIBE and its confirmation share one
	// bound.
	sctx, cancel := context.WithTimeout(ctx, b.subTimeout)
	defer cancel()
	ps := b.client.Subscribe(sctx, b.channel)
	defer ps.Close()
	// go-redis does not interrupt a blocked read when ctx ends: closing the
	// subscription does.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()

	msg, err := ps.ReceiveTimeout(sctx, b.subTimeout)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("redislock: subscribe: %w", err)
	}
	if _, ok := msg.(*redis.Subscription); !ok {
		return fmt.Errorf("redislock: subscribe: unexpected reply %T", msg)
	}
	ready()

	// Between messages the connection is checked with PING; a PING not
	// answered by the next check ends the watch.
	idle := 30 * time.Second
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, idle)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged {
				if err := ps.Ping(ctx); err != nil {
					return fmt.Errorf("redislock: subscription: %w", err)
				}
				pinged = true
				continue
			}
			return fmt.Errorf("redislock: subscription: %w", err)
		}
		pinged = false
		if m, ok := msg.(*redis.Message); ok && m.Channel == b.channel {
			key, waiter, _ := strings.Cut(m.Payload, "\x00")
			fn(key, waiter)
		}
	}
}

// Leave implements core.Queuer: it takes waiter out of key's queue and,
// when waiter was first in line and the key is free, tells the next live
// waiter its turn.
func (b *Backend) Leave(ctx context.Context, key, waiter string) error {
	if err := core.ValidateKey(key); err != nil {
		return err
	}
	if waiter == "" {
		return nil
	}
	err := leaveScript.run(ctx, b.client, b.keys(key), waiter, b.channel, key).Err()
	if isWrongType(err) {
		err = b.semLeave(ctx, key, waiter) // the key holds a semaphore: semaphore.go
	}
	if err != nil {
		return fmt.Errorf("redislock: leave: %w", err)
	}
	return nil
}

// Inspect implements core.Admin.
func (b *Backend) Inspect(ctx context.Context, key string) (core.Info, bool, error) {
	if err := core.ValidateKey(key); err != nil {
		return core.Info{}, false, err
	}
	c := &call{s: inspectScript, keys: []string{b.lockKey(key)}}
	runBatch(ctx, b.client, []*call{c})
	if isWrongType(c.cmd.Err()) {
		return b.semInspect(ctx, key) // semaphore.go
	}
	info, ok, err := parseInspect(key, c.cmd)
	if err != nil {
		return core.Info{}, false, fmt.Errorf("redislock: inspect: %w", err)
	}
	return info, ok, nil
}

func parseInspect(key string, cmd *redis.Cmd) (core.Info, bool, error) {
	v, err := cmd.Slice()
	if err != nil {
		return core.Info{}, false, err
	}
	if len(v) == 1 {
		return core.Info{}, false, nil
	}
	if len(v) != 7 {
		return core.Info{}, false, fmt.Errorf("unexpected script reply %v", v)
	}
	owner, _ := v[1].(string)
	h, err := parseHolder(append([]any{int64(0)}, v[2:]...))
	if err != nil {
		return core.Info{}, false, err
	}
	h.owner = owner
	return h.info(key), true, nil
}

// List implements core.Admin. It walks the keyspace with SCAN (on every
// master of a Cluster), never KEYS, and reads each lock found; the result is
// sorted by key. Locks taken or freed during the walk may or may not appear.
func (b *Backend) List(ctx context.Context, prefix string) ([]core.Info, error) {
	var (
		mu    sync.Mutex
		found []string
	)
	pattern := b.scanPattern(prefix)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, k := range keys {
				if key, ok := b.userKey(k); ok && strings.HasPrefix(key, prefix) {
					found = append(found, key)
				}
			}
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	switch c := b.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	default:
		err = scan(ctx, c)
	}
	if err != nil {
		return nil, fmt.Errorf("redislock: list: SCAN: %w", err)
	}
	slices.Sort(found)
	found = slices.Compact(found) // SCAN may return a key twice
	list := make([]core.Info, 0, len(found))
	var sems []string // keys that hold semaphores (semaphore.go)
	for start := 0; start < len(found); start += 512 {
		end := min(start+512, len(found))
		calls := make([]*call, end-start)
		for i := range calls {
			calls[i] = &call{s: inspectScript, keys: []string{b.lockKey(found[start+i])}}
		}
		runBatch(ctx, b.client, calls)
		for i, c := range calls {
			if isWrongType(c.cmd.Err()) {
				sems = append(sems, found[start+i])
				continue
			}
			info, ok, err := parseInspect(found[start+i], c.cmd)
			if err != nil {
				return nil, fmt.Errorf("redislock: list: %w", err)
			}
			if ok {
				list = append(list, info)
			}
		}
	}
	if len(sems) > 0 {
		permits, err := b.semList(ctx, sems)
		if err != nil {
			return nil, fmt.Errorf("redislock: list: %w", err)
		}
		list = append(list, permits...)
		slices.SortStableFunc(list, func(a, b core.Info) int { return strings.Compare(a.Key, b.Key) })
	}
	return list, nil
}

// ForceRelease implements core.Admin: it frees the lock whoever holds it
// (leaving the tombstone that keeps its fencing counter) and tells the
// first live waiter its turn, or publishes the plain release when nobody is
// queued. The holder learns of it at its next renewal.
func (b *Backend) ForceRelease(ctx context.Context, key string) (bool, error) {
	if err := core.ValidateKey(key); err != nil {
		return false, err
	}
	n, err := forceReleaseScript.run(ctx, b.client, b.keys(key), b.channel, key).Int()
	if isWrongType(err) {
		n, err = b.semForceRelease(ctx, key) // the key holds a semaphore: semaphore.go
	}
	if err != nil {
		return false, fmt.Errorf("redislock: force release: %w", err)
	}
	return n == 1, nil
}
