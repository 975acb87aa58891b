package core

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Election campaigns for leadership of a key in the background: whoever
// holds the key's lock is the leader. IsLeader is an in-memory check that
// costs no I/O and no allocation and turns false the moment the local
// deadline passes, even before the renewer notices.
//
// Create it with Campaign; Close resigns (so a standby takes over at once)
// and stops the campaign goroutine.
type Election struct {
	l    Locker
	key  string
	cfg  electionConfig
	ctx  context.Context
	stop context.CancelFunc
	done chan struct{}

	cur     atomic.Pointer[leaderState]
	resign  chan *leaderState // a resign request names the term it ends
	closeMu sync.Mutex
	closed  bool
}

type leaderState struct {
	s Session
}

type electionConfig struct {
	lockOpts  []Option
	retry     time.Duration
	onElected func(Session)
	onRevoked func(error)
	admin     Admin
}

// ElectionOption configures an Election.
type ElectionOption func(*electionConfig)

// WithLockOptions sets the options of the leader lock (TTL, renew interval,
// owner...).
func WithLockOptions(opts ...Option) ElectionOption {
	return func(c *electionConfig) { c.lockOpts = append(c.lockOpts, opts...) }
}

// WithRetry sets the pause between campaign attempts while someone else leads
// (default 1s, jittered ±50%). Release notifications cut it short.
func WithRetry(d time.Duration) ElectionOption {
	return func(c *electionConfig) {
		if d > 0 {
			c.retry = d
		}
	}
}

// OnElected is called, from the campaign goroutine, when this process becomes
// leader; OnRevoked when it stops being leader (the cause: ErrLeaseLost,
// ErrReleased on resign, ErrClosed). Keep them short.
func OnElected(fn func(Session)) ElectionOption {
	return func(c *electionConfig) { c.onElected = fn }
}

// OnRevoked: see OnElected.
func OnRevoked(fn func(error)) ElectionOption {
	return func(c *electionConfig) { c.onRevoked = fn }
}

// WithAdmin sets the Admin used by Leader to look up the current leader
// (default: the Locker itself, when it implements Admin).
func WithAdmin(a Admin) ElectionOption {
	return func(c *electionConfig) { c.admin = a }
}

// Campaign starts campaigning for key on l. Invalid keys and options are
// reported at once.
func Campaign(l Locker, key string, opts ...ElectionOption) (*Election, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	cfg := electionConfig{retry: time.Second}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if _, err := resolve(nil, cfg.lockOpts); err != nil {
		return nil, err
	}
	if cfg.admin == nil {
		cfg.admin, _ = l.(Admin)
	}
	ctx, stop := context.WithCancel(context.Background())
	e := &Election{l: l, key: key, cfg: cfg, ctx: ctx, stop: stop,
		done: make(chan struct{}), resign: make(chan *leaderState, 1)}
	go e.run()
	return e, nil
}

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

// Close resigns, stops campaigning and waits for the campaign goroutine.
func (e *Election) Close() error {
	e.closeMu.Lock()
	if e.closed {
		e.closeMu.Unlock()
		return nil
	}
	e.closed = true
	e.closeMu.Unlock()
	e.stop()
	<-e.done
	return nil
}

func (e *Election) run() {
	defer close(e.done)
	for {
		s, err := e.l.Acquire(e.ctx, e.key, e.cfg.lockOpts...)
		if err != nil {
			if e.ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrClosed) {
				return
			}
			// Backend trouble: pause, then campaign again.
			if sleepCtx(e.ctx, jittered(e.cfg.retry)) != nil {
				return
			}
			continue
		}
		st := &leaderState{s: s}
		e.cur.Store(st)
		if e.cfg.onElected != nil {
			e.cfg.onElected(s)
		}
		resigned := e.await(st)
		e.cur.Store(nil)
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
			if e.ctx.Err() != nil {
				cause = ErrClosed
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
