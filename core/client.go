package core

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"
)

// Client is the lease engine over a Backend. It implements Locker and Admin.
//
// A Client runs one renewer goroutine for all of its sessions, which batches
// every renewal due within half a renew interval (or within the interval of
// the leases due, for leases of that interval) into one Backend.Renew call,
// and, while anyone waits in Acquire, one Watcher goroutine. Close stops both
// and waits for them.
type Client struct {
	b       Backend
	name    string
	cfg     clientConfig
	base    config // cfg.defaults resolved: the config of an acquisition without options of its own
	obs     Observer
	watcher Watcher
	queuer  Queuer // the store keeps waiters in line (nil: it does not)
	// endsWithCtx: the backend's calls end with their ctx (ContextBound),
	// so an acquisition makes them on its own goroutine (calls.go).
	endsWithCtx bool

	ctx    context.Context // cancelled by Close once every session is released
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closing     context.Context // cancelled when Close starts: ends waits and cuts claims short
	stopAcquire context.CancelFunc
	bgOpCtx     context.Context // the opContext of context.Background(), made once
	acquiring   sync.WaitGroup  // acquisitions in flight (the store calls they leave running are counted in calls)

	mu         sync.Mutex
	closed     bool
	sessions   map[*session]struct{}
	held       map[string]*session   // the mutex session of each key this client holds (see heldHere)
	owed       map[*session]struct{} // ended, but the store may still hold the key: Close releases them
	owedSwept  time.Time             // when owed was last swept of sessions the store has surely dropped
	undos      []*pendingUndo        // ambiguous claims whose undo is still owed (undo.go)
	undoing    bool                  // the undo goroutine runs
	undoWake   chan struct{}
	calls      int                    // store calls that may outlive their acquisition (calls.go)
	callsIdle  chan struct{}          // closed when calls drops to 0; made only when waitCalls waits
	callsCut   bool                   // Close no longer waits for such calls: their late results are dropped
	work       chan runner            // store calls for an idle call worker (calls.go)
	workStop   chan struct{}          // closed by Close: idle call workers exit
	groupSeq   uint64                 // last renewal group handed out (renewer goroutine only)
	waiters    map[string][]*waiter   // per key, oldest first
	echoes     map[string][]time.Time // own releases whose notification is due back
	renewing   bool                   // renewer goroutine started
	nextWake   time.Time              // when the renewer plans to wake next (zero: it is busy)
	idle       time.Duration          // the renewer wakes at least this often: the shortest renew interval seen
	watching   bool                   // watcher goroutine started
	subscribed bool                   // the watcher's subscription is in place (ready was called)
	swept      time.Time              // when echoes were last swept
	wake       chan struct{}
}

var (
	_ Locker = (*Client)(nil)
	_ Admin  = (*Client)(nil)
)

// New returns a Client over b. Options given by WithDefaults are validated
// here, so a bad default fails now rather than at the first acquisition.
func New(b Backend, opts ...ClientOption) (*Client, error) {
	if b == nil {
		return nil, invalidOption("Backend", "nil")
	}
	cfg := clientConfig{releaseTimeout: DefaultReleaseTimeout}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if len(cfg.errs) > 0 {
		return nil, cfg.errs[0]
	}
	base, err := resolve(cfg.defaults, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	closing, stopAcquire := context.WithCancel(context.Background())
	c := &Client{
		b: b, name: b.Name(), cfg: cfg, base: base, obs: cfg.observer,
		ctx: ctx, cancel: cancel, closing: closing, stopAcquire: stopAcquire,
		sessions: make(map[*session]struct{}),
		held:     make(map[string]*session),
		owed:     make(map[*session]struct{}),
		waiters:  make(map[string][]*waiter),
		echoes:   make(map[string][]time.Time),
		wake:     make(chan struct{}, 1),
		undoWake: make(chan struct{}, 1),
		work:     make(chan runner),
		workStop: make(chan struct{}),
	}
	c.bgOpCtx = closingCtx{context.Background(), closing}
	c.watcher, _ = b.(Watcher)
	c.queuer, _ = QueuerOf(b)
	if cb, ok := b.(ContextBound); ok {
		c.endsWithCtx = cb.EndsWithContext()
	}
	return c, nil
}

// Backend returns the backend the client runs on.
func (c *Client) Backend() Backend { return c.b }

// Logger returns the logger set by WithLogger, or slog.Default().
func (c *Client) Logger() *slog.Logger {
	if c.cfg.logger != nil {
		return c.cfg.logger
	}
	return slog.Default()
}

// TryAcquire implements Locker.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...Option) (Session, error) {
	return c.acquire(ctx, key, opts, ModeTry)
}

// Acquire implements Locker.
func (c *Client) Acquire(ctx context.Context, key string, opts ...Option) (Session, error) {
	return c.acquire(ctx, key, opts, ModeWait)
}

func (c *Client) acquire(ctx context.Context, key string, opts []Option, mode Mode) (s Session, err error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	cfg := c.base
	if len(opts) > 0 {
		if cfg, err = resolve(c.cfg.defaults, opts); err != nil {
			return nil, err
		}
	}
	if cfg.limit > 1 {
		if _, ok := c.b.(SemaphoreBackend); !ok {
			return nil, fmt.Errorf("%w: semaphores (Limit %d) on %s", ErrUnsupported, cfg.limit, c.name)
		}
	}
	// Close waits for acquisitions in flight, and for the undo of their
	// claims, before it closes the backend.
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.acquiring.Add(1)
	c.mu.Unlock()
	defer c.acquiring.Done()

	slot := cfg.schedule != nil
	obsCtx := ctx
	start := time.Now()
	attempts := 0
	var busy *NotAcquiredError // the last busy answer
	var busyAt time.Time
	var woken Wake // what woke the wait for the latest attempt
	if c.obs != nil {
		obsCtx = c.obs.AcquireStart(ctx, AcquireStartEvent{Backend: c.name, Key: key, Mode: mode, Slot: slot})
		defer func() {
			e := AcquireEndEvent{Backend: c.name, Key: key, Mode: mode, Slot: slot,
				Session: s, Attempts: attempts, Wait: time.Since(start), Err: err, Wake: woken}
			if busy != nil {
				e.Holder = busy.Holder
			}
			c.obs.AcquireEnd(obsCtx, e)
		}()
	}
	// Store calls run on opCtx: the caller's ctx, also cut short by Close.
	// None keeps the caller past bud: DeadlineSlack after opCtx ends.
	opCtx, cancel, stop := c.opContext(obsCtx)
	defer cancel()
	defer stop()
	bud := &budget{ctx: opCtx}
	// ended builds the error of an acquisition that ctx or Close cut short.
	// failure is the store's last word when that was a failure, not busy:
	// only a busy last word matches ErrNotAcquired.
	ended := func(failure error) error {
		if c.closing.Err() != nil {
			return ErrClosed
		}
		waited := time.Since(start)
		if dl, ok := ctx.Deadline(); ok && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			waited = min(waited, dl.Sub(start)) // the caller's budget, not the slack
		}
		if failure == nil && busy != nil {
			return notAcquiredWithin(ctx, key, busy, busyAt, waited)
		}
		return acquireFailed(ctx, key, attempts > 0, busy, busyAt, waited, failure)
	}
	if ctxEnded(ctx) {
		return nil, ended(nil) // ctx is over: not worth a round trip
	}
	if cfg.jitter > 0 {
		if sleepCtx(opCtx, mrand.N(cfg.jitter+1)) != nil {
			return nil, ended(nil)
		}
	}
	var wake chan Wake
	var queued string // this wait's place in the store's queue, once it may have one
	if mode == ModeWait {
		w := c.addWaiter(key)
		wake = w.ch
		defer func() {
			c.removeWaiter(key, w, s != nil)
			if s == nil && queued != "" {
				c.leave(bud, ctx, key, queued)
			}
		}()
		if w.id != "" {
			cfg.waiter = w.id
		}
	}
	var timer *time.Timer
	// failure is the store's last word when it was a failure rather than
	// busy (nil after a busy answer): it decides what a wait that ctx ends
	// reports.
	var failure error
	for {
		attempts++
		if mode == ModeTry && cfg.limit <= 1 {
			if h := c.heldHere(key); h != nil {
				busy = &NotAcquiredError{Key: key, Holder: h}
				return nil, busy
			}
		}
		queued = cfg.waiter
		ss, err := c.attempt(bud, ctx, key, cfg)
		if err == nil {
			return ss, nil
		}
		var b *NotAcquiredError
		if errors.As(err, &b) {
			busy, busyAt = b, time.Now()
			failure = nil
		}
		if b == nil && ctxEnded(opCtx) {
			// Cut short by ctx or Close: the attempt got no word from the
			// store, so the last word decides; when there was none, this
			// attempt's failure is the report.
			if busy == nil && failure == nil {
				failure = err
			}
			return nil, ended(failure)
		}
		if mode == ModeTry || (b == nil && !retryable(err)) {
			return nil, err
		}
		// Busy, or the store failed (a restart, a cut connection): wait
		// and try again until ctx ends. The claim of a failed attempt was
		// undone by attempt.
		if b == nil {
			failure = err
		}
		d := backoffWait(cfg.backoffMin, cfg.backoffMax, attempts-1)
		if b != nil && cfg.waiter != "" && c.isSubscribed() {
			// In line, with the store's turns arriving: a poll is needed
			// only at the holder's expiry (a lease that runs out sends no
			// turn) and to keep the place.
			d = queueTTL / 3
		}
		if b != nil {
			if h := b.Holder; h != nil && h.Remaining > 0 && h.Remaining < d {
				d = h.Remaining + time.Millisecond
			}
		}
		if cfg.waiter != "" && d > queueTTL/3 {
			d = queueTTL / 3 // keep the place in line
		}
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-opCtx.Done():
			return nil, ended(failure)
		case woken = <-wake:
		case <-timer.C:
			woken = WakePoll
		}
	}
}

// leave takes a wait that ended without the lock out of the store's queue,
// on a context detached from the caller's, bounded by the release timeout;
// the caller waits for it within bud only. It is best effort: a place left
// behind expires within the queue TTL.
func (c *Client) leave(bud *budget, ctx context.Context, key, waiter string) {
	_, _ = storeCall(c, bud, func() (struct{}, error) {
		lctx, cancel := context.WithTimeout(detach(ctx), c.cfg.releaseTimeout)
		defer cancel()
		return struct{}{}, c.queuer.Leave(lctx, key, waiter)
	}, nil)
}

// opContext returns the context of an acquisition's store calls: ctx,
// also ended by Close; cancel and stop free it once the acquisition ends.
func (c *Client) opContext(ctx context.Context) (opCtx context.Context, cancel func(), stop func() bool) {
	if ctx == context.Background() {
		return c.bgOpCtx, func() {}, func() bool { return false }
	}
	if neverEnds(ctx) {
		return closingCtx{ctx, c.closing}, func() {}, func() bool { return false }
	}
	opCtx, cancel = context.WithCancel(ctx)
	return opCtx, cancel, context.AfterFunc(c.closing, cancel)
}

// closingCtx is the context of the store calls of an acquisition whose
// caller's ctx never ends: the caller's values, ended by Close alone. It
// costs less than a cancelCtx ended by an AfterFunc of Close.
type closingCtx struct {
	context.Context // the caller's: its values; no deadline, never done
	closing         context.Context
}

func (x closingCtx) Done() <-chan struct{} { return x.closing.Done() }
func (x closingCtx) Err() error            { return x.closing.Err() }

// AfterFunc lets a context derived from x follow it without a goroutine
// of its own (see context.AfterFunc).
func (x closingCtx) AfterFunc(f func()) func() bool { return context.AfterFunc(x.closing, f) }

// ctxEnded reports whether ctx has ended, or its deadline has passed and
// its timer has not ended it yet: the runtime may run a deadline's timer
// some milliseconds late on a loaded machine, while a store call bounded
// by the same deadline (a dial, a socket's read) has already failed with a
// timeout of its own.
func ctxEnded(ctx context.Context) bool { return ctx.Err() != nil || deadlinePassed(ctx) }

// deadlinePassed reports whether ctx has a deadline and it has passed.
func deadlinePassed(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// neverEnds reports whether ctx has no deadline and can never be cancelled.
func neverEnds(ctx context.Context) bool {
	_, ok := ctx.Deadline()
	return !ok && ctx.Done() == nil
}

// detach returns a context with ctx's values that is never cancelled and
// has no deadline: ctx itself when it can never end, which saves
// context.WithoutCancel an allocation.
func detach(ctx context.Context) context.Context {
	if neverEnds(ctx) {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// retryable reports whether Acquire keeps waiting after err: anything but
// a bad key or option, an unsupported request, a closed Locker or a limit
// other than the key's holders', which no retry can mend.
func retryable(err error) bool {
	return !errors.Is(err, ErrInvalidKey) && !errors.Is(err, ErrInvalidOption) &&
		!errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrLimitMismatch)
}

// backoffWait is the n-th (0-based) polling wait: uniform in
// [min, min(max, min·2^n)]. It depends only on its arguments (and randomness).
func backoffWait(min, max time.Duration, n int) time.Duration {
	hi := min
	for i := 0; i < n && hi < max; i++ {
		hi *= 2
	}
	if hi > max {
		hi = max
	}
	if hi <= min {
		return min
	}
	return min + mrand.N(hi-min+1)
}

// attempt makes one claim of key. Store calls run under bud.ctx (the
// caller's ctx as the observer returned it, cut short by Close) and keep
// the caller within bud; the session keeps the values of userCtx.
func (c *Client) attempt(bud *budget, userCtx context.Context, key string, cfg config) (*session, error) {
	ctx := bud.ctx
	req := AcquireRequest{Key: key, Owner: cfg.owner, OwnerToken: rand.Text(), TTL: cfg.ttl}
	if cfg.schedule == nil {
		// A claim kept for somewhat less than the TTL brings the session's
		// deadline and first renewal forward by as much (see Lease): by at
		// most half a renew interval, so the first renewal still comes at
		// least half an interval after the claim.
		req.Slack = cfg.renewInterval / 2
		req.MinHold = cfg.minHold // a slot's session never releases
	}
	if cfg.limit > 1 {
		req.Limit = cfg.limit
	}
	if cfg.waiter != "" {
		req.Waiter, req.WaiterTTL = cfg.waiter, queueTTL
	}
	var serverNow time.Time
	if cfg.schedule != nil {
		now, err := ctxCall(c, bud, func() (time.Time, error) { return c.b.Now(ctx, key) }, nil)
		if err != nil {
			return nil, fmt.Errorf("dislock: %s: read store clock: %w", c.name, err)
		}
		serverNow = now
		req.ExpireAt = SlotEnd(cfg.schedule, now, cfg.tolerance)
		if !req.ExpireAt.After(now) {
			return nil, invalidOption("ForSlot", "schedule has no slot after %v", now)
		}
	}
	sent := time.Now()
	life := cfg.ttl // how long the store keeps the claim if nobody renews it
	if cfg.schedule != nil {
		life = req.ExpireAt.Sub(serverNow)
	}
	// undo releases the claim by owner token, so that nothing stays held
	// until its TTL; the caller waits for it within bud only.
	undo := func() { bud.wait(c.undo(ctx, key, req.OwnerToken, req.Limit, sent, life)) }
	var late func(Lease, error) // for a call worker's call that the caller left
	if !c.endsWithCtx {
		late = func(_ Lease, err error) {
			// The caller has left: whatever the store did is undone.
			if !claimedNothing(err) && !isUnclaimed(err) {
				c.undo(ctx, key, req.OwnerToken, req.Limit, sent, life)
			}
		}
	}
	lease, err := ctxCall(c, bud, func() (Lease, error) { return c.b.TryAcquire(ctx, req) }, late)
	if err != nil {
		if claimedNothing(err) {
			return nil, err
		}
		if !errors.As(err, new(errNoReply)) && !isUnclaimed(err) {
			// The claim may have been applied before the failure, unless
			// the backend knows it was not. (A call left running undoes
			// its claim when it returns.)
			undo()
		}
		return nil, fmt.Errorf("dislock: %s: acquire %q: %w", c.name, key, err)
	}
	s := &session{
		c: c, key: key, owner: cfg.owner, ownerToken: req.OwnerToken, token: lease.Token, limit: req.Limit,
		slot: cfg.schedule != nil, ttl: cfg.ttl, interval: cfg.renewInterval,
		renewDeadline: cfg.renewDeadline, minHold: cfg.minHold,
		acquiredAt: sent, userCtx: userCtx,
		done: make(chan struct{}),
	}
	if c.obs != nil {
		s.obsCtx = context.WithoutCancel(ctx)
	}
	if s.slot {
		base := lease.AcquiredAt
		if base.IsZero() {
			base = serverNow
		}
		s.deadline = sent.Add(lease.ExpiresAt.Sub(base))
	} else {
		// The store keeps the claim for the TTL from its send, or, when
		// the lease says it keeps it for less, for that long: the session
		// counts from as much earlier than the send (see Lease).
		base := sent
		if short := cfg.ttl - lease.life(); short > 0 {
			base = sent.Add(-short)
		}
		s.deadline = base.Add(cfg.renewDeadline)
		s.nextRenew = base.Add(cfg.renewInterval)
	}
	if took := time.Since(sent); took >= s.deadline.Sub(sent) {
		// The reply came so late that the lease may already be over: do
		// not hand out a session that is dead on arrival.
		undo()
		return nil, fmt.Errorf("dislock: %s: acquire %q: the reply took %v, past the renew deadline: %w",
			c.name, key, took.Round(time.Millisecond), ErrLeaseLost)
	}
	if !c.register(s) {
		undo()
		return nil, ErrClosed
	}
	return s, nil
}

// claimedNothing reports whether an acquire that returned err surely left
// nothing in the store: it answered busy or refused the limit.
func claimedNothing(err error) bool {
	return errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrLimitMismatch)
}

// register adds s to the renewer; false when the client is closed.
func (c *Client) register(s *session) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.sessions[s] = struct{}{}
	if s.limit <= 1 {
		c.held[s.key] = s
	}
	if !c.renewing {
		c.renewing = true
		c.wg.Add(1)
		go c.renewLoop()
	}
	// Wake the renewer only when this session needs it sooner than it
	// planned to wake anyway: most acquisitions cost the renewer nothing.
	if !s.slot && (c.idle == 0 || s.interval < c.idle) {
		c.idle = s.interval
	}
	due := s.deadline
	if !s.slot && s.nextRenew.Before(due) {
		due = s.nextRenew
	}
	if due.Before(c.nextWake) {
		c.kick()
	}
	return true
}

// heldHere returns the holder of key when a mutex session of this client
// holds it: not ended, not being released, and before its renew deadline,
// until which the store keeps the key for it (see Session). A TryAcquire of
// such a key is answered busy with that holder and no store call, since the
// store's answer could only be busy; its times are on this process's clock.
// (Acquire asks the store, which keeps its waiters in line.)
func (c *Client) heldHere(key string) *Info {
	c.mu.Lock()
	s := c.held[key]
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	left := time.Until(s.deadline)
	if s.err != nil || s.releasing || left <= 0 {
		return nil
	}
	return &Info{Key: key, Owner: s.owner, Token: s.token, AcquiredAt: s.acquiredAt, ExpiresAt: time.Now().Add(left), Remaining: left}
}

func (c *Client) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// unregister takes an ended session off the renewer. owe is true when the
// store may still hold its key: Close then releases it unless its holder
// does first.
func (c *Client) unregister(s *session, owe bool) {
	c.mu.Lock()
	delete(c.sessions, s)
	if c.held[s.key] == s {
		delete(c.held, s.key)
	}
	c.mu.Unlock()
	if owe {
		c.owe(s)
	}
}

// owe remembers a session whose key the store may still hold, so that Close
// releases it; sessions whose lease the store has surely dropped by now are
// forgotten (swept at most once a second, so that a mass loss stays linear).
func (c *Client) owe(s *session) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Sub(c.owedSwept) > time.Second {
		c.owedSwept = now
		for o := range c.owed {
			if o.storeExpiry().Before(now) {
				delete(c.owed, o)
			}
		}
	}
	c.owed[s] = struct{}{}
}

// forget drops s from the sessions Close must release.
func (c *Client) forget(s *session) {
	c.mu.Lock()
	delete(c.owed, s)
	c.mu.Unlock()
}

// releaseDetached releases key by owner token on a context that ignores the
// caller's cancellation but keeps its values, bounded by the release timeout.
// A store that holds nothing of ownerToken's (Gone) has nothing to undo:
// that is done, not an error.
func (c *Client) releaseDetached(ctx context.Context, key, ownerToken string, limit int) error {
	rctx, cancel := context.WithTimeout(detach(ctx), c.cfg.releaseTimeout)
	defer cancel()
	err := c.b.Release(rctx, ReleaseRequest{Key: key, OwnerToken: ownerToken, Limit: limit})
	switch {
	case err == nil:
		c.notify(key)
	case errors.Is(err, ErrLeaseGone):
		return nil
	}
	return err
}

// Close implements Locker. It ends waits in Acquire (ErrClosed), cuts
// acquisitions in flight short and waits for them, for the store calls they
// left running (up to 10s) and for the undo of their claims (for a
// ClaimBounder backend, until the claim bound has passed),
// releases every session — also lost ones whose holder has not
// released them yet — stops the renewer and the watcher, waits for them, and
// then closes the Backend (which frees only what the backend opened itself,
// never the caller's pool or client).
func (c *Client) Close() error {
	if !firstClose(&c.mu, &c.closed) {
		return nil
	}
	c.stopAcquire()
	c.acquiring.Wait()
	// Store calls that acquisitions left running (calls.go), with their
	// undo: a call that does not return by closeUndoWait is cut loose, and
	// what it claims after that expires at its TTL.
	c.waitCalls(closeUndoWait)
	c.cutCalls()
	close(c.workStop) // no store call is handed to a worker from now on

	c.mu.Lock()
	list := make([]*session, 0, len(c.sessions)+len(c.owed))
	for s := range c.sessions {
		list = append(list, s)
	}
	for s := range c.owed {
		list = append(list, s)
	}
	c.mu.Unlock()

	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 16)
	)
	for _, s := range list {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			// A session found lost says so itself (Err, Context): only
			// a failure to release is Close's.
			if err := s.release(context.Background(), ErrClosed); err != nil && !errors.Is(err, ErrLeaseLost) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	c.cancel()
	c.wg.Wait()
	if err := c.b.Close(); err != nil {
		errs = append(errs, err)
	}
	c.waitCalls(closeUndoWait) // a call cut loose returns once its backend is closed
	return errors.Join(errs...)
}

// firstClose sets closed under mu and reports whether it was not set yet:
// whether this call is the first Close, the one that does the work.
func firstClose(mu *sync.Mutex, closed *bool) bool {
	mu.Lock()
	defer mu.Unlock()
	first := !*closed
	*closed = true
	return first
}

// Inspect implements Admin when the backend does.
func (c *Client) Inspect(ctx context.Context, key string) (Info, bool, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, false, err
	}
	a, ok := c.b.(Admin)
	if !ok {
		return Info{}, false, ErrUnsupported
	}
	return a.Inspect(ctx, key)
}

// List implements Admin when the backend does.
func (c *Client) List(ctx context.Context, prefix string) ([]Info, error) {
	a, ok := c.b.(Admin)
	if !ok {
		return nil, ErrUnsupported
	}
	return a.List(ctx, prefix)
}

// Holders lists every holder of key, oldest first: each permit of a
// semaphore, or the one holder of a mutex; empty when the key is free. It
// returns ErrUnsupported unless the backend is a SemaphoreBackend.
func (c *Client) Holders(ctx context.Context, key string) ([]Info, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	sb, ok := c.b.(SemaphoreBackend)
	if !ok {
		return nil, ErrUnsupported
	}
	return sb.Holders(ctx, key)
}

// ForceRelease implements Admin when the backend does. Waiters are woken.
func (c *Client) ForceRelease(ctx context.Context, key string) (bool, error) {
	if err := ValidateKey(key); err != nil {
		return false, err
	}
	a, ok := c.b.(Admin)
	if !ok {
		return false, ErrUnsupported
	}
	echo := c.expectEcho(key) // before the call: its echo may beat the reply
	released, err := a.ForceRelease(ctx, key)
	if released {
		c.notify(key)
	} else {
		c.dropEcho(key, echo)
	}
	return released, err
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errJoin is errors.Join, except that a lone error comes back as itself.
func errJoin(errs ...error) error {
	var only error
	n := 0
	for _, e := range errs {
		if e != nil {
			only = e
			n++
		}
	}
	if n > 1 {
		return errors.Join(errs...)
	}
	return only
}

func isReleased(err error) bool { return errors.Is(err, ErrReleased) || errors.Is(err, ErrClosed) }
