package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/pg"
)

// Timing of the group's termination.
const (
	groupPoll     = 20 * time.Millisecond
	afterKillWait = 2 * time.Second        // how long to wait for a SIGKILLed group to vanish
	lingerWait    = 200 * time.Millisecond // how long the group may outlive its leader unremarked
)

// signalError is the cause of an acquisition cut short by a signal.
type signalError struct{ sig os.Signal }

func (e signalError) Error() string { return "interrupted by " + e.sig.String() }

func signalCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return exitFailure
}

// runLocked takes the locks, runs the command and releases the locks.
func (c *cli) runLocked(inv *invocation) error {
	cfg := &inv.run
	// A command that cannot be found is a failure found before any lock
	// is taken: it must not use up a schedule slot.
	path, err := exec.LookPath(cfg.command[0])
	if err != nil {
		return exitWith(exitFailure, fmt.Errorf("start the command: %w", err))
	}
	becomeSubreaper()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	// Job-control signals must not stop dislock: stopped, it would stop
	// renewing while the command (in its own process group) runs on, and
	// the lease would pass to another run. Catching them (rather than
	// ignoring them) leaves their default action to the command, since an
	// exec resets caught signals but keeps ignored ones ignored. Until the
	// command starts they are dropped; then SIGTSTP and SIGCONT are
	// forwarded to the command's group (see runChild).
	jobSigs := make(chan os.Signal, 8)
	c.jobSigs = jobSigs
	signal.Notify(jobSigs, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGCONT)
	defer signal.Stop(jobSigs)

	// Until the command starts, a signal abandons the attempt.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stopWatch := make(chan struct{})
	watched := make(chan os.Signal, 1)
	go func() {
		select {
		case sig := <-sigs:
			cancel(signalError{sig})
			watched <- sig
		case <-stopWatch:
			watched <- nil
		}
	}()
	sched, lease, closeFn, err := c.acquire(ctx, inv)
	close(stopWatch)
	if sig := <-watched; sig != nil {
		c.releaseAll(lease, sched)
		if closeFn != nil {
			c.closeBounded(inv, closeFn)
		}
		c.log.Warn("interrupted before the command started", "signal", sig.String())
		return exitWith(signalCode(sig), nil)
	}
	if err != nil {
		return err
	}
	keep := false // the command's group survived: leave the locks to their TTL
	defer func() {
		if keep {
			return // closing would release the lease
		}
		c.closeBounded(inv, closeFn)
	}()

	primary := lease
	if primary == nil {
		primary = sched
	}
	env := append(os.Environ(),
		"DISLOCK_KEY="+primary.Key(),
		"DISLOCK_TOKEN="+strconv.FormatUint(primary.Token(), 10),
		"DISLOCK_DEADLINE="+primary.Deadline().UTC().Format(time.RFC3339),
	)
	// The locks are released only once the command's whole process group is
	// gone: after a loss, the store may keep the key until its TTL, and the
	// release is what tells it the work has stopped.
	drain(jobSigs) // dropped before the command started
	code, gone, runErr := c.runChild(cfg, path, env, lease, sigs, jobSigs)
	if errors.Is(runErr, errNotStarted) && sched != nil {
		// Nothing ran: the slot is given back for another run to take.
		c.giveBack(inv, sched)
	}
	if !gone {
		keep = true
		return runErr
	}
	c.releaseAll(lease, sched)
	if runErr != nil {
		return runErr
	}
	if code != exitOK {
		return exitWith(code, nil)
	}
	return nil
}

// acquire opens the backend and takes the lease, then the schedule lock.
// A busy lock is an *exitError with the busy exit code and nothing to log.
func (c *cli) acquire(ctx context.Context, inv *invocation) (sched, lease core.Session, closeFn func() error, err error) {
	l, closeFn, err := c.open(ctx, inv)
	if err != nil {
		return nil, nil, nil, err
	}
	c.locker = l
	return c.take(ctx, inv, l, closeFn)
}

// fitTTL fits the lease's TTL to a backend whose sessions bound it
// (ZooKeeper): the default TTL is cut to what the granted session allows;
// a TTL that was asked for and does not fit is a configuration error.
func fitTTL(cfg *runConfig, l locker, urlEnv, rawURL string) error {
	m, ok := l.Backend().(maxTTLer)
	if !ok || !cfg.useLease || cfg.ttl <= m.MaxTTL() {
		return nil
	}
	if !cfg.ttlSet {
		return cfg.setTTL(m.MaxTTL())
	}
	return badSetting(specTTL, "%v does not fit the %s session the server in %s granted: %v (of the %v asked), which allows a TTL of at most %v; set %s to at most %v, or raise the server's maxSessionTimeout and ask for a longer session with ?session_timeout=SECONDS",
		cfg.ttl, l.Backend().Name(), urlEnv, m.SessionTimeout(), zkAsked(rawURL), m.MaxTTL(), specTTL.env, m.MaxTTL().Seconds())
}

// take takes the locks of the run on l; on failure it releases what it took
// and calls closeFn.
func (c *cli) take(ctx context.Context, inv *invocation, l locker, closeFn func() error) (sched, lease core.Session, _ func() error, err error) {
	cfg := &inv.run
	fail := func(err error) (core.Session, core.Session, func() error, error) {
		c.releaseAll(lease, sched)
		c.closeBounded(inv, closeFn)
		return nil, nil, nil, err
	}
	// Checked before any lock is taken, so that no slot is used up.
	if cfg.limit > 1 && !hasSemaphores(l) {
		return fail(noSemaphores(cfg, l.Backend().Name(), inv.urlEnv))
	}
	if err := fitTTL(cfg, l, inv.urlEnv, inv.url); err != nil {
		return fail(err)
	}
	if cfg.intervalWarn != "" {
		c.log.Warn(cfg.intervalWarn)
	}
	jitter := cfg.jitter
	jitterOpt := func() []core.Option {
		if jitter == 0 {
			return nil
		}
		j := jitter
		jitter = 0 // only before the first attempt
		return []core.Option{core.Jitter(j)}
	}
	if cfg.useLease {
		key := cfg.leaseKey()
		opts := append(jitterOpt(), core.TTL(cfg.ttl), core.RenewInterval(cfg.interval), core.RenewDeadline(cfg.renewDeadline))
		if cfg.limit > 1 {
			opts = append(opts, core.Limit(cfg.limit))
		}
		s, err := c.try(ctx, l, key, opts, inv, cfg.wait)
		if err != nil {
			return fail(err)
		}
		lease = s
		c.log.Debug("lease taken", "key", key, "token", s.Token(), "ttl", cfg.ttl, "renew_interval", cfg.interval)
	}
	// The schedule lock comes second: a run that finds the lease held
	// leaves the slot to the runs that can start.
	if cfg.useSchedule {
		key := cfg.scheduleKey()
		s, err := c.try(ctx, l, key, append(jitterOpt(), core.ForSlot(cfg.schedule), core.SlotTolerance(cfg.slotTolerance)), inv, 0)
		if err != nil {
			return fail(err)
		}
		sched = s
		c.log.Debug("schedule slot taken", "key", key, "token", s.Token(), "slot_end", s.Deadline().UTC().Format(time.RFC3339))
	}
	return sched, lease, closeFn, nil
}

// errWaitOver is the cause of a wait (LOCK_WAIT_SECONDS) that ran out.
var errWaitOver = fmt.Errorf("the wait (%s) ran out", specWait.env)

// try makes one attempt at key, or with wait above 0 waits up to that long
// in the store's queue, and maps the outcome to an exit code. Only the
// store's answer that the lock is held takes the busy path: a store that
// fails or does not answer within the timeout is exit 1.
func (c *cli) try(ctx context.Context, l locker, key string, opts []core.Option, inv *invocation, wait time.Duration) (core.Session, error) {
	cfg, urlEnv := &inv.run, inv.urlEnv
	var (
		s   core.Session
		err error
	)
	actx, cancel := context.WithTimeoutCause(ctx, cfg.jitter+inv.timeout, errTimeout{inv.timeout})
	defer cancel()
	if wait > 0 {
		wctx, wcancel := context.WithTimeoutCause(ctx, cfg.jitter+wait, errWaitOver)
		defer wcancel()
		actx = wctx // a wait is bounded by its own end
		c.log.Debug("waiting for the lock", "key", key, "wait", wait)
		s, err = l.Acquire(wctx, key, opts...)
	} else {
		s, err = l.TryAcquire(actx, key, opts...)
	}
	busy, isBusy := busyAnswer(err, wait > 0)
	switch {
	case err == nil:
		return s, nil
	case isBusy:
		msg := busyMessage(key, cfg, busy.Holder)
		if wait > 0 {
			msg = fmt.Sprintf("waited %v (%s): %s", wait, specWait.env, msg)
		}
		c.log.Info(msg)
		return nil, exitWith(cfg.busyExit, nil)
	case context.Cause(ctx) != nil && errors.As(context.Cause(ctx), new(signalError)):
		return nil, exitWith(exitFailure, context.Cause(ctx))
	case errors.Is(err, core.ErrInvalidOption), errors.Is(err, core.ErrInvalidKey):
		return nil, exitWith(exitUsage, fmt.Errorf("lock %q: %w", key, err))
	case errors.Is(err, core.ErrLimitMismatch):
		// Other runs hold the key under another LOCK_LIMIT: the machines'
		// settings disagree.
		return nil, exitWith(exitUsage, badSetting(specLimit, "%d: %v; every run of %s must use the same %s",
			cfg.limit, err, specKey.env+"="+cfg.key, specLimit.env))
	case cfg.limit > 1 && errors.Is(err, core.ErrUnsupported):
		hint := ""
		if errors.Is(err, pg.ErrSchema) {
			hint = fmt.Sprintf("; or let dislock create what is missing with %s=1 (--%s)", specCreate.env, specCreate.flag)
		}
		return nil, exitWith(exitUsage, badSetting(specLimit, "%d: the backend in %s cannot hold it: %v%s", cfg.limit, urlEnv, err, hint))
	}
	var na *core.NotAcquiredError
	if errors.As(err, &na) && na.Err != nil {
		// Cut short while the store had not answered: say why, with the
		// last attempt's failure when there was one.
		cause := error(errTimeout{inv.timeout})
		if wait > 0 {
			cause = fmt.Errorf("the wait of %v (%s) ended with the store failing", wait, specWait.name())
		}
		if f := lastFailure(na.Err); f != nil {
			err = fmt.Errorf("%w: %w", cause, f)
		} else {
			err = fmt.Errorf("%w: %s %q", cause, l.Backend().Name(), key)
		}
	}
	// err names the key and the backend: "dislock: pg: acquire \"k\": …".
	return nil, exitWith(exitFailure, fmt.Errorf("the backend in %s: %w", urlEnv, outage(actx, err)))
}

// lastFailure is the store failure in the error of an acquisition that its
// ctx cut short (ctx's error, its cause, then the failure), or nil.
func lastFailure(err error) error {
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		if es := u.Unwrap(); len(es) == 2 && es[1] != errWaitOver && !errors.As(es[1], new(errTimeout)) {
			return es[1]
		}
	}
	return nil
}

// busyAnswer returns the store's answer that the lock is held, from err: a
// *NotAcquiredError the store gave, or the end of a wait whose last
// attempt found the lock held. An acquisition cut short while the store
// had not answered, or a wait whose last attempt failed, is no busy answer.
func busyAnswer(err error, waited bool) (*core.NotAcquiredError, bool) {
	var na *core.NotAcquiredError
	if !errors.As(err, &na) {
		return nil, false
	}
	if na.Err == nil {
		return na, true
	}
	if !waited || !errors.Is(na.Err, errWaitOver) {
		return nil, false
	}
	// The wait's end: ctx's error and its cause, then the last attempt's
	// failure when there was one.
	if lastFailure(na.Err) != nil {
		return nil, false
	}
	return na, true
}

// giveBack frees the schedule slot sched holds, for a run whose command
// could not start: the slot belongs to runs that started. The slot is the
// run's until it ends, so what the store holds under its key is this run's
// claim when the token and owner are sched's.
func (c *cli) giveBack(inv *invocation, sched core.Session) {
	l := c.locker
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.releaseTimeout(inv))
	defer cancel()
	sched.Release(ctx)
	info, ok, err := l.Inspect(ctx, sched.Key())
	if err == nil && ok && info.Token == sched.Token() && info.Owner == sched.Owner() {
		_, err = l.ForceRelease(ctx, sched.Key())
	}
	if err != nil {
		c.log.Warn("the command did not start, and its schedule slot could not be given back; the slot is used up", "key", sched.Key(), "err", err)
		return
	}
	c.log.Info("the command did not start: its schedule slot is given back", "key", sched.Key())
}

// noSemaphores is the configuration error of a LOCK_LIMIT above 1 on a
// backend without semaphores.
func noSemaphores(cfg *runConfig, backend, urlEnv string) error {
	return badSetting(specLimit, "%d: the %s backend in %s has no semaphores, so it cannot let %d instances run at once; unset %s or use a backend that has them",
		cfg.limit, backend, urlEnv, cfg.limit, specLimit.env)
}

// busyMessage says why the command does not run. A busy schedule lock means
// the slot has already run (its holder may have exited long ago: the lock
// is kept until the slot ends); a busy lease means a run is going on.
func busyMessage(key string, cfg *runConfig, h *core.Info) string {
	if key == cfg.scheduleKey() {
		if h == nil {
			return fmt.Sprintf("this schedule slot has already run; the command runs again in the next slot (key %s)", key)
		}
		return fmt.Sprintf("this schedule slot has already run: started %sby %s (token %d); the command runs again in the next slot, from %s (key %s)",
			startedAt(h), h.Owner, h.Token, fmtTime(h.ExpiresAt), key)
	}
	if cfg.limit > 1 {
		if h == nil {
			return fmt.Sprintf("%d instances already run, the most %s allows; the command does not run (key %s)", cfg.limit, specLimit.env, key)
		}
		return fmt.Sprintf("%d instances already run, the most %s allows; the lease that ends first was started %sby %s (token %d), for %s more unless renewed; the command does not run (key %s)",
			cfg.limit, specLimit.env, startedAt(h), h.Owner, h.Token, h.Remaining.Round(time.Millisecond), key)
	}
	if h == nil {
		return fmt.Sprintf("the lease is held by another run; the command does not run (key %s)", key)
	}
	return fmt.Sprintf("the lease is held by another run, started %sby %s (token %d), for %s more unless renewed; the command does not run (key %s)",
		startedAt(h), h.Owner, h.Token, h.Remaining.Round(time.Millisecond), key)
}

// startedAt is "at TIME " when the store knows when h was acquired.
func startedAt(h *core.Info) string {
	if h.AcquiredAt.IsZero() {
		return ""
	}
	return "at " + fmtTime(h.AcquiredAt) + " "
}

// closeBounded closes the backend, waiting at most the release timeout:
// after a loss dislock must exit within the lease's margin, and a store
// that does not answer could hold the close up. Whatever is left is ended
// by the process's exit.
func (c *cli) closeBounded(inv *invocation, closeFn func() error) {
	done := make(chan error, 1)
	go func() { done <- closeFn() }()
	t := time.NewTimer(c.releaseTimeout(inv))
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			// After a failure the store's error has been said already.
			c.log.Debug("closing the backend connection failed", "err", err)
		}
	case <-t.C:
		c.log.Debug("closing the backend connection takes too long; exiting without waiting", "wait", c.releaseTimeout(inv))
	}
}

// releaseAll releases the lease, then the schedule lock (which stays held
// until its slot ends).
func (c *cli) releaseAll(lease, sched core.Session) {
	for _, s := range []core.Session{lease, sched} {
		if s == nil {
			continue
		}
		err := s.Release(context.Background())
		switch {
		case errors.Is(err, core.ErrLeaseLost):
			// No renewal noticed it: the command may not have run alone.
			c.log.Warn("lease lost: the store no longer held the lease when it was released; the command may not have run alone",
				append([]any{"key", s.Key(), "token", s.Token()}, c.holderAttrs(s.Key())...)...)
		case err != nil:
			c.log.Warn("release failed; the lock expires on its own", "key", s.Key(), "err", err)
		default:
			c.log.Debug("released", "key", s.Key())
		}
	}
}

// inspectTimeout bounds the look-up of a holder for a log line.
const inspectTimeout = 5 * time.Second

// holderAttrs names key's holder as the store has it now, for a log line.
func (c *cli) holderAttrs(key string) []any {
	if c.locker == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	defer cancel()
	info, ok, err := c.locker.Inspect(ctx, key)
	switch {
	case err != nil:
		return []any{"holder", "unknown", "inspect_err", err}
	case !ok:
		return []any{"holder", "none"}
	}
	return []any{"holder", info.Owner, "holder_token", info.Token}
}

// runChild runs the command in its own process group and waits for it and
// for the rest of its group. It forwards signals to the group; when the
// lease is lost under the terminate policy it terminates the group (exit
// 75); processes the command leaves behind in its group are terminated too.
// gone reports whether the whole group is gone: when it is not (processes
// survived SIGKILL), the locks must not be released.
//
// SIGTSTP sent to dislock (Ctrl-Z) is forwarded to the group, which stops,
// while dislock keeps renewing the lease: the command is paused, not gone,
// so the lock stays held. SIGCONT is forwarded to resume it. SIGTTIN and
// SIGTTOU are dropped. SIGSTOP cannot be caught: it stops dislock and its
// renewals, the lease runs out, and the command is terminated once dislock
// resumes and sees the loss.
func (c *cli) runChild(cfg *runConfig, path string, env []string, lease core.Session, sigs, jobSigs <-chan os.Signal) (code int, gone bool, err error) {
	cmd := exec.Command(path, cfg.command[1:]...)
	cmd.Args[0] = cfg.command[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	fg := foregroundTerminal()
	waited, err := startChild(cmd, fg)
	if err != nil {
		// A command that cannot start (not executable) is a runtime
		// failure like an unreachable backend: exit 1.
		return 0, true, exitWith(exitFailure, fmt.Errorf("%w: %w", errNotStarted, err))
	}
	g := &group{c: c, pgid: cmd.Process.Pid}
	c.log.Info("command started", "pid", g.pgid, "command", cfg.command[0], "foreground", fg)
	if fg {
		defer func() {
			reclaimTerminal()
			signal.Notify(c.jobSigs, syscall.SIGTTOU)
		}()
	}

	var lost <-chan struct{}
	if lease != nil {
		lost = lease.Done()
	}
	var (
		exitedAt  time.Time // when the command (the group's leader) exited
		lossErr   error     // set when the group is terminated after a loss
		killTimer = time.NewTimer(time.Hour)
		poll      = time.NewTicker(groupPoll)
	)
	killTimer.Stop()
	defer killTimer.Stop()
	defer poll.Stop()
	for {
		select {
		case <-waited:
			waited = nil
			exitedAt = time.Now()
			code = exitStatus(cmd.ProcessState)
			if lossErr == nil {
				c.log.Info("command exited", "exit_code", code)
			}
		case sig := <-sigs:
			c.log.Info("forwarding signal to the command's process group", "signal", sig.String(), "pgid", g.pgid)
			if s, ok := sig.(syscall.Signal); ok {
				syscall.Kill(-g.pgid, s)
			}
			continue
		case sig := <-jobSigs:
			switch sig {
			case syscall.SIGTSTP, syscall.SIGCONT:
				c.log.Info("forwarding signal to the command's process group; the lease is kept", "signal", sig.String(), "pgid", g.pgid)
				syscall.Kill(-g.pgid, sig.(syscall.Signal))
			}
			continue
		case <-lost:
			lost = nil
			cause := context.Cause(lease.Context())
			if cfg.onLossCont {
				c.log.Error("lease lost; the command continues (LOCK_ON_LEASE_LOSS=continue) and another instance may start", "key", lease.Key(), "err", cause)
				continue
			}
			now := time.Now()
			var killAt time.Time
			if errors.Is(cause, core.ErrLeaseGone) {
				// The store says the key is gone or someone else's: there is
				// no margin left to wait for.
				killAt = now.Add(min(cfg.grace, refusedGrace))
				c.log.Error("lease lost: the store no longer holds it for this run; terminating the command's process group at once",
					"key", lease.Key(), "err", cause, "pgid", g.pgid, "kill_in", killAt.Sub(now).Round(time.Millisecond))
			} else {
				killAt = killDeadline(now, lease.Deadline(), cfg)
				c.log.Error("lease lost; terminating the command's process group", "key", lease.Key(), "err", cause,
					"pgid", g.pgid, "kill_in", killAt.Sub(now).Round(time.Millisecond))
			}
			lossErr = errors.New("lease lost; the command was terminated")
			g.terminate(killAt, killTimer)
		case <-killTimer.C:
			g.kill()
		case <-poll.C:
		}
		if exitedAt.IsZero() && !g.killed {
			continue
		}
		if !g.alive() {
			break
		}
		now := time.Now()
		if g.killed && now.Sub(g.killedAt) > afterKillWait {
			c.log.Error("processes of the command's group survived SIGKILL; the locks are not released and expire after their TTL", "pgid", g.pgid)
			return code, false, exitWith(exitFailure, nil)
		}
		if !exitedAt.IsZero() && !g.termSent && now.Sub(exitedAt) > lingerWait {
			// The command left processes behind: they must not run on
			// after the lock is released.
			c.log.Warn("processes the command started are still running (in its process group, or having left it); terminating them", "pgid", g.pgid,
				"kill_in", cfg.grace)
			g.terminate(now.Add(cfg.grace), killTimer)
		}
	}
	if waited != nil {
		// The leader is a zombie the waiting goroutine is about to reap.
		select {
		case <-waited:
			code = exitStatus(cmd.ProcessState)
		case <-time.After(afterKillWait):
		}
	}
	if lossErr != nil {
		return 0, true, exitWith(exitLeaseLost, fmt.Errorf("%w (its own exit status %d)", lossErr, code))
	}
	return code, true, nil
}

// errNotStarted is the error of a command that could not be started.
var errNotStarted = errors.New("start the command")

// drain empties ch without blocking.
func drain(ch <-chan os.Signal) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// refusedGrace is the longest time between SIGTERM and SIGKILL after the
// store refused the lease: the key may already be someone else's.
const refusedGrace = time.Second

// group is the command's process group while dislock terminates it.
type group struct {
	c        *cli
	pgid     int
	termSent bool      // SIGTERM was sent
	termAt   time.Time // when
	killAt   time.Time // when SIGKILL is due; zero while none is
	killed   bool      // SIGKILL was sent
	killedAt time.Time
}

// terminate sends SIGTERM (once) and makes SIGKILL due at killAt, or at the
// earlier time already set.
func (g *group) terminate(killAt time.Time, timer *time.Timer) {
	if !g.termSent {
		g.termSent, g.termAt = true, time.Now()
		syscall.Kill(-g.pgid, syscall.SIGTERM)
		// A group paused by a forwarded SIGTSTP acts on SIGTERM only once
		// it runs again.
		syscall.Kill(-g.pgid, syscall.SIGCONT)
		for _, pid := range strays(g.pgid) {
			syscall.Kill(pid, syscall.SIGTERM)
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	if g.killed || (!g.killAt.IsZero() && !killAt.Before(g.killAt)) {
		return
	}
	g.killAt = killAt
	timer.Reset(time.Until(killAt))
}

// kill sends SIGKILL to the group.
func (g *group) kill() {
	if g.killed {
		return
	}
	g.killed, g.killedAt = true, time.Now()
	if g.killAt.Sub(g.termAt) < 10*time.Millisecond {
		// No grace period was left (the lease's margin, or a grace of 0):
		// SIGKILL follows SIGTERM at once, as logged with the loss.
		g.c.log.Debug("sending SIGKILL to the command's process group", "pgid", g.pgid)
	} else {
		g.c.log.Warn("the command's process group outlived the grace period; sending SIGKILL", "pgid", g.pgid)
	}
	syscall.Kill(-g.pgid, syscall.SIGKILL)
	for _, pid := range strays(g.pgid) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// alive reports whether the group, or a process that left it (found as
// dislock's descendant on Linux), still runs.
func (g *group) alive() bool { return groupAlive(g.pgid) || len(strays(g.pgid)) > 0 }

// killDeadline is when a group that received SIGTERM at now gets SIGKILL:
// after the grace period, but earlier when the lease could otherwise pass to
// another holder first. The server's lease runs until about TTL after the last
// renewal was sent, which is renewDeadline before the session's deadline; a
// quarter of the remaining margin is kept for clock drift and the kill itself.
func killDeadline(now, sessionDeadline time.Time, cfg *runConfig) time.Time {
	at := now.Add(cfg.grace)
	margin := cfg.ttl - cfg.renewDeadline
	limit := sessionDeadline.Add(margin - margin/4)
	if limit.Before(at) {
		at = limit
	}
	if at.Before(now) {
		at = now
	}
	return at
}

// groupAlive reports whether the process group still has members that are
// not zombies (exited processes whose parent has not reaped them yet).
func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	alive, ok := liveMembers(pgid)
	return alive || !ok
}

// liveMembers looks through /proc for a process of group pgid that is not a
// zombie; ok is false when /proc cannot be read.
func liveMembers(pgid int) (alive, ok bool) {
	procs := readProcs()
	if procs == nil {
		return false, false
	}
	for _, p := range procs {
		if p.pgrp == pgid && !p.zombie() {
			return true, true
		}
	}
	return false, true
}

// procStat is a process as /proc/PID/stat shows it.
type procStat struct {
	pid, ppid, pgrp int
	state           string
}

func (p procStat) zombie() bool { return p.state == "Z" || p.state == "X" }

// readProcs reads every process's stat line; nil when /proc cannot be read.
func readProcs() []procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	procs := []procStat{}
	for _, e := range entries {
		name := e.Name()
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp …; comm may contain spaces and parens.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 {
			continue
		}
		pid, _ := strconv.Atoi(name)
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		procs = append(procs, procStat{pid: pid, ppid: ppid, pgrp: pgrp, state: f[0]})
	}
	return procs
}

// exitStatus is the command's exit code, or 128+N when signal N ended it.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return exitFailure
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
