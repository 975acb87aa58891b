package core

import (
	"context"
	"errors"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultCampaignWait bounds how long Campaign, and gocronlock's
// Elector.IsLeader before the campaign's first answer, wait for the first
// attempt of a campaign to be answered.
const DefaultCampaignWait = 2 * time.Second

// Election campaigns for leadership of a key in the background: whoever
// holds the key's lock is the leader. IsLeader is an in-memory check that
// costs no I/O and no allocation and turns false the moment the local
// deadline passes, even before the renewer notices.
//
// Create it with CampaignContext; Close resigns (so a standby takes over at
// once) and stops the campaign goroutine.
//
// A campaign tries the key once (TryAcquire) and, while someone else leads,
// waits for it (Acquire), woken by the leader's release. A wait is cut
// short once per lock TTL by a fresh attempt, so that a store that fails
// while this process waits is reported (OnError) within one TTL. Every
// attempt that fails for another reason than a busy key goes to OnError.
// A failure that no retry can mend (a bad key or option, an option the
// backend rejects, ErrUnsupported, ErrLimitMismatch, a closed Locker) ends
// the campaign: CampaignContext returns it when it is the first attempt's
// answer, and OnError gets it otherwise.
type Election struct {
	l    Locker
	key  string
	cfg  electionConfig
	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}
	obs  sync.WaitGroup // Observe goroutines

	ready    chan struct{} // closed when the first attempt was answered
	firstMu  sync.Mutex
	firstErr error // the first attempt's error, when no retry can mend it and CampaignContext returns it
	detached bool  // CampaignContext has returned the Election

	cur     atomic.Pointer[leaderState]
	resign  chan *leaderState // a resign request names the term it ends
	closeMu sync.Mutex
	closed  bool

	changeMu sync.Mutex
	changed  chan struct{} // closed and replaced when this process's leadership changes
}

type leaderState struct {
	s Session
}

type electionConfig struct {
	lockOpts  []Option
	retry     time.Duration
	onElected func(Session)
	onRevoked func(error)
	onError   func(error)
	admin     Admin
	round     time.Duration // the lock TTL: a wait is cut short this often
}

// ElectionOption configures an Election.
type ElectionOption func(*electionConfig)

// WithLockOptions sets the options of the leader lock (TTL, renew interval,
// owner...).
func WithLockOptions(opts ...Option) ElectionOption {
	return func(c *electionConfig) { c.lockOpts = append(c.lockOpts, opts...) }
}

// WithRetry sets the pause between campaign attempts after a failure or a
// resignation (default 1s, jittered ±50%). While someone else leads, the
// campaign waits for the key and is woken by its release.
func WithRetry(d time.Duration) ElectionOption {
	return func(c *electionConfig) {
		if d > 0 {
			c.retry = d
		}
	}
}

// OnElected is called, from the campaign goroutine, when this process becomes
// leader; OnRevoked when it stops being leader, with the cause: an error
// matching ErrLeaseLost when the lease was lost (even if a Resign or Close
// raced the loss), ErrReleased after Resign, ErrElectionClosed after the
// Election's Close, ErrClosed when the Locker was closed. Keep them short.
func OnElected(fn func(Session)) ElectionOption {
	return func(c *electionConfig) { c.onElected = fn }
}

// OnRevoked: see OnElected.
func OnRevoked(fn func(error)) ElectionOption {
	return func(c *electionConfig) { c.onRevoked = fn }
}

// OnError is called, from the campaign goroutine, with the error of every
// campaign attempt that failed for another reason than a busy key: a store
// failure (the campaign tries again after the retry pause), or a failure no
// retry can mend, which ends the campaign (an option the backend rejects,
// ErrLimitMismatch, ErrClosed when the Locker was closed). Keep it short.
// By default the failure is logged at level WARN through the Locker's
// logger (WithLogger, when the Locker is a *Client; else slog.Default()).
// The first attempt's answer, when no retry can mend it, is returned by
// CampaignContext instead.
func OnError(fn func(error)) ElectionOption {
	return func(c *electionConfig) { c.onError = fn }
}

// WithAdmin sets the Admin used by Leader and Observe to look up the
// current leader (default: the Locker itself, when it implements Admin).
func WithAdmin(a Admin) ElectionOption {
	return func(c *electionConfig) { c.admin = a }
}

// Campaign is CampaignContext with a background context that bounds the
// wait for the first attempt by DefaultCampaignWait.
//
// Deprecated: use CampaignContext, which takes the caller's context.
func Campaign(l Locker, key string, opts ...ElectionOption) (*Election, error) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultCampaignWait)
	defer cancel()
	return CampaignContext(ctx, l, key, opts...)
}

// CampaignContext starts campaigning for key on l, and waits for the first
// attempt's answer until ctx ends. It returns an error, and campaigns no
// further, when the key or an option is invalid, and when the first
// attempt fails for a reason no retry can mend, such as an option the
// backend rejects (a TTL longer than a ZooKeeper session allows, say), a
// semaphore limit on the key (ErrLimitMismatch) or a closed Locker. A busy
// key, a store failure (reported to OnError) or a ctx that ends first do
// not stop it: the campaign goes on in the background until Close, and
// IsLeader says whether this process won. ctx's values, not its
// cancellation, are kept for the campaign's store calls.
func CampaignContext(ctx context.Context, l Locker, key string, opts ...ElectionOption) (*Election, error) {
	if l == nil {
		return nil, invalidOption("Locker", "nil")
	}
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	cfg := electionConfig{retry: time.Second}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	lock, err := resolve(nil, cfg.lockOpts)
	if err != nil {
		return nil, err
	}
	cfg.round = lock.ttl
	if cfg.admin == nil {
		cfg.admin, _ = l.(Admin)
	}
	if cfg.onError == nil {
		logger := slog.Default()
		if lg, ok := l.(interface{ Logger() *slog.Logger }); ok {
			logger = lg.Logger()
		}
		cfg.onError = func(err error) {
			logger.LogAttrs(context.Background(), slog.LevelWarn, "dislock: campaign attempt failed",
				slog.String("key", key), slog.String("error", err.Error()))
		}
	}
	cctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	e := &Election{l: l, key: key, cfg: cfg, ctx: cctx, stop: stop,
		done: make(chan struct{}), ready: make(chan struct{}),
		resign: make(chan *leaderState, 1), changed: make(chan struct{})}
	go e.run()
	select {
	case <-e.ready:
	case <-ctx.Done():
	}
	e.firstMu.Lock()
	e.detached = true // from now on the campaign reports to OnError
	err = e.firstErr
	e.firstMu.Unlock()
	if err != nil {
		e.stop()
		<-e.done
		return nil, err
	}
	return e, nil
}

// Ready returns a channel that is closed once the campaign's first attempt
// has been answered: from then on IsLeader says what the store decided
// rather than "not yet". CampaignContext usually returns after it.
func (e *Election) Ready() <-chan struct{} { return e.ready }

// IsLeader reports whether this process leads now. No I/O, no allocation.
func (e *Election) IsLeader() bool {
	st := e.cur.Load()
	if st == nil {
		return false
	}
	select {
	case <-st.s.Done():
		return false
	default:
	}
	return time.Now().Before(st.s.Deadline())
}

// Session returns the leader session while this process leads, else nil.
func (e *Election) Session() Session {
	if st := e.cur.Load(); st != nil && e.IsLeader() {
		return st.s
	}
	return nil
}

// Leader returns the current leader's Info as the store sees it; ok is false
// when nobody leads. It needs an Admin (see WithAdmin).
func (e *Election) Leader(ctx context.Context) (info Info, ok bool, err error) {
	if e.cfg.admin == nil {
		return Info{}, false, ErrUnsupported
	}
	return e.cfg.admin.Inspect(ctx, e.key)
}

// Resign gives up leadership now, if held, and keeps campaigning after a
// pause of one retry interval. While this process does not lead it does
// nothing, and a Resign that races the end of a term never carries over to
// the next one.
func (e *Election) Resign() {
	st := e.cur.Load()
	if st == nil {
		return
	}
	// A request of an earlier term still queued must not block this one.
	select {
	case <-e.resign:
	default:
	}
	select {
	case e.resign <- st:
	default:
	}
}

// Close resigns, stops campaigning and waits for the campaign goroutine and
// the Observe goroutines. OnRevoked, when this process led, gets
// ErrElectionClosed.
func (e *Election) Close() error {
	if !firstClose(&e.closeMu, &e.closed) {
		return nil
	}
	e.stop()
	<-e.done
	e.obs.Wait()
	return nil
}

// Observe reports who leads, as the store sees it, each time it changes:
// the channel first receives the current leader, then every new one, and a
// zero Info (Owner "") while nobody leads. It looks the leader up (with the
// Admin, see WithAdmin) when this process wins or loses leadership and
// otherwise once per retry interval (WithRetry), so a hand-over between
// two other processes is seen within about one interval; a failed look-up
// is tried again at the next one. The channel is closed when ctx ends or
// the Election closes. Without an Admin it returns ErrUnsupported.
func (e *Election) Observe(ctx context.Context) (<-chan Info, error) {
	if e.cfg.admin == nil {
		return nil, ErrUnsupported
	}
	ch := make(chan Info)
	e.closeMu.Lock()
	if e.closed {
		e.closeMu.Unlock()
		close(ch)
		return ch, nil
	}
	e.obs.Add(1)
	e.closeMu.Unlock()
	go e.observe(ctx, ch)
	return ch, nil
}

func (e *Election) observe(ctx context.Context, ch chan<- Info) {
	defer e.obs.Done()
	defer close(ch)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.ctx, cancel)()
	var last Info
	first := true
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		changed := e.changes()
		info, ok, err := e.cfg.admin.Inspect(ctx, e.key)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			if !ok {
				info = Info{}
			}
			if first || !sameLeader(info, last) {
				select {
				case ch <- info:
				case <-ctx.Done():
					return
				}
				last, first = info, false
			}
		}
		t.Reset(jittered(e.cfg.retry))
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

// sameLeader reports whether a and b name the same term of the same leader.
func sameLeader(a, b Info) bool {
	return a.Owner == b.Owner && a.Token == b.Token && a.AcquiredAt.Equal(b.AcquiredAt)
}

// changes returns a channel closed at this process's next change of
// leadership.
func (e *Election) changes() <-chan struct{} {
	e.changeMu.Lock()
	defer e.changeMu.Unlock()
	return e.changed
}

func (e *Election) notifyChange() {
	e.changeMu.Lock()
	close(e.changed)
	e.changed = make(chan struct{})
	e.changeMu.Unlock()
}

// attempt makes one campaign attempt: a try, and while someone else leads
// (after settle, since the first answer is in) a wait for the key, cut
// short after one round. s and err are nil when a round of waiting ended
// without the key and without a failure to report.
func (e *Election) attempt(settle func(error) bool) (s Session, err error) {
	s, err = e.l.TryAcquire(e.ctx, e.key, e.cfg.lockOpts...)
	if err == nil || !errors.Is(err, ErrNotAcquired) {
		return s, err
	}
	settle(nil) // busy: someone else leads
	rctx, cancel := context.WithTimeout(e.ctx, e.cfg.round)
	defer cancel()
	s, err = e.l.Acquire(rctx, e.key, e.cfg.lockOpts...)
	if err != nil && rctx.Err() != nil && e.ctx.Err() == nil {
		return nil, nil // the round is over: try again, and report a failure then
	}
	return s, err
}

func (e *Election) run() {
	defer close(e.done)
	settled := false
	// settle ends the first round. It reports whether CampaignContext, still
	// waiting, takes firstErr to return it.
	settle := func(firstErr error) bool {
		if settled {
			return false
		}
		settled = true
		e.firstMu.Lock()
		taken := firstErr != nil && !e.detached
		if taken {
			e.firstErr = firstErr
		}
		e.firstMu.Unlock()
		close(e.ready)
		return taken
	}
	defer settle(nil)
	for {
		if e.ctx.Err() != nil {
			return
		}
		s, err := e.attempt(settle)
		if s == nil {
			if err == nil {
				continue // a round of waiting ended: campaign again at once
			}
			if e.ctx.Err() != nil {
				return
			}
			if !retryable(err) {
				if !settle(err) { // else CampaignContext returns it
					e.cfg.onError(err)
				}
				return
			}
			settle(nil)
			e.cfg.onError(err)
			// Backend trouble: pause, then campaign again.
			if sleepCtx(e.ctx, jittered(e.cfg.retry)) != nil {
				return
			}
			continue
		}
		st := &leaderState{s: s}
		e.cur.Store(st)
		settle(nil)
		e.notifyChange()
		if e.cfg.onElected != nil {
			e.cfg.onElected(s)
		}
		resigned := e.await(st)
		e.cur.Store(nil)
		e.notifyChange()
		// A resign request of this term that came too late is dropped.
		select {
		case <-e.resign:
		default:
		}
		// A loss wins over a Resign or a Close that raced it: the leader's
		// work stops with OnRevoked before the key is freed.
		lost := errors.Is(s.Err(), ErrLeaseLost)
		if !lost {
			_ = s.Release(context.Background()) // bounded by the client's release timeout
		}
		if e.cfg.onRevoked != nil {
			cause := s.Err()
			if !lost && e.ctx.Err() != nil {
				cause = ErrElectionClosed
			}
			e.cfg.onRevoked(cause)
		}
		if lost {
			// The leader's work stopped when OnRevoked returned: only now
			// may the store hand the key on before its TTL.
			_ = s.Release(context.Background())
		}
		if e.ctx.Err() != nil {
			return
		}
		if resigned || !errors.Is(s.Err(), ErrReleased) {
			if sleepCtx(e.ctx, jittered(e.cfg.retry)) != nil {
				return
			}
		}
	}
}

// await waits for the end of the term st: a loss, a Resign of this term or
// Close. It reports whether this term was resigned.
func (e *Election) await(st *leaderState) bool {
	for {
		select {
		case <-st.s.Done():
			return false
		case r := <-e.resign:
			if r == st {
				return true
			}
		case <-e.ctx.Done():
			return false
		}
	}
}

func jittered(d time.Duration) time.Duration {
	return d/2 + mrand.N(d+1)
}
