package gocronlock

import (
	"context"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dislock/dislock/core"
)

// ErrNotLeader is what Elector.IsLeader returns on a scheduler that does not
// lead; gocron then skips the run. It matches core.ErrNotAcquired.
var ErrNotLeader = fmt.Errorf("gocronlock: not the leader: %w", core.ErrNotAcquired)

// Elector implements gocron.Elector on a core.Locker: the scheduler that
// holds the leader lock runs every job, the others run none. Pass it to
// gocron.WithDistributedElector; gocron then ignores any Locker.
//
// It campaigns in the background from NewElector until Close. Standbys wait
// on the leader lock and take over as soon as it is released (Close, Resign)
// or has expired (a leader that died, about one TTL later). It is safe for
// concurrent use.
type Elector struct {
	e *core.Election
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector starts campaigning for prefix + key on l and waits, at most
// core.DefaultCampaignWait, for the first attempt's answer
// (core.CampaignContext). Invalid keys and options are reported at once,
// and so are options the store rejects (a TTL longer than a ZooKeeper
// session allows, say) and other failures no retry can mend; a busy key or
// an unreachable store are not errors: the campaign goes on, and OnError
// hears of every failed attempt. Close it when done, after shutting down
// the scheduler that uses it.
func NewElector(l core.Locker, key string, opts ...Option) (*Elector, error) {
	cfg, err := resolveConfig(forElector, l, opts)
	if err != nil {
		return nil, err
	}
	eopts := []core.ElectionOption{
		core.WithLockOptions(cfg.coreOptions(0)...),
		core.WithRetry(cfg.retry),
	}
	if cfg.onElected != nil {
		eopts = append(eopts, core.OnElected(cfg.onElected))
	}
	if cfg.onRevoked != nil {
		eopts = append(eopts, core.OnRevoked(cfg.onRevoked))
	}
	if fn := cfg.onError; fn != nil {
		k := cfg.prefix + key
		eopts = append(eopts, core.OnError(func(err error) { fn(k, err) }))
	}
	ctx, cancel := context.WithTimeout(context.Background(), core.DefaultCampaignWait)
	defer cancel()
	e, err := core.CampaignContext(ctx, l, cfg.prefix+key, eopts...)
	if err != nil {
		return nil, err
	}
	return &Elector{e: e}, nil
}

// IsLeader implements gocron.Elector: nil while this scheduler leads,
// ErrNotLeader otherwise. It is an in-memory check (no I/O, no allocation)
// that turns false the moment the lease's local deadline passes or the lease
// is lost, before any other scheduler can be elected.
//
// Until the campaign's first attempt has been answered (NewElector usually
// returns after it; not when the store is slow), IsLeader waits for that
// answer, at most until ctx ends or core.DefaultCampaignWait has passed, so
// that a job that starts immediately runs on the scheduler the store
// elected instead of being skipped everywhere.
func (e *Elector) IsLeader(ctx context.Context) error {
	if e.e.IsLeader() {
		return nil
	}
	select {
	case <-e.e.Ready():
		return ErrNotLeader
	default:
	}
	return e.waitFirstAnswer(ctx)
}

// waitFirstAnswer is IsLeader before the first answer of the campaign.
func (e *Elector) waitFirstAnswer(ctx context.Context) error {
	t := time.NewTimer(core.DefaultCampaignWait)
	defer t.Stop()
	select {
	case <-e.e.Ready():
	case <-ctx.Done():
	case <-t.C:
	}
	if e.e.IsLeader() {
		return nil
	}
	return ErrNotLeader
}

// Observe reports who leads, as the store sees it, each time it changes
// (see core.Election.Observe): the current leader first, then each new one,
// a zero core.Info while nobody leads. It needs a core.Locker that
// implements core.Admin, as *core.Client does; otherwise the error matches
// core.ErrUnsupported. The channel is closed when ctx ends or the Elector
// closes.
func (e *Elector) Observe(ctx context.Context) (<-chan core.Info, error) {
	return e.e.Observe(ctx)
}

// Session returns the leader session (owner, fencing token, a context
// cancelled when leadership ends) while this scheduler leads, else nil.
// Jobs that write to a shared resource can pass its Token along as a fence.
func (e *Elector) Session() core.Session { return e.e.Session() }

// Leader returns the current leader as the store sees it (owner, token,
// since when); ok is false when nobody leads. It needs a core.Locker that
// implements core.Admin, as *core.Client does; otherwise the error matches
// core.ErrUnsupported.
func (e *Elector) Leader(ctx context.Context) (info core.Info, ok bool, err error) {
	return e.e.Leader(ctx)
}

// Resign gives up leadership now, if held, so that a standby takes over, and
// campaigns again after a pause (Retry).
func (e *Elector) Resign() { e.e.Resign() }

// Close resigns, so that a standby takes over at once, stops campaigning
// and waits for the campaign goroutine. Later IsLeader calls return
// ErrNotLeader. It does not close the core.Locker.
func (e *Elector) Close() error { return e.e.Close() }
