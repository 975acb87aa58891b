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
	if cfg.intervalWarn != "" {
		c.log.Warn(cfg.intervalWarn)
	}
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
			closeFn()
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
		if err := closeFn(); err != nil {
			c.log.Warn("closing the backend connection failed", "err", err)
		}
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
	code, gone, runErr := c.runChild(cfg, env, lease, sigs, jobSigs)
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

// acquire opens the backend and takes the schedule lock, then the lease.
// A busy lock is an *exitError with the busy exit code and nothing to log.
func (c *cli) acquire(ctx context.Context, inv *invocation) (sched, lease core.Session, closeFn func() error, err error) {
	l, closeFn, err := c.open(ctx, inv)
	if err != nil {
		return nil, nil, nil, err
	}
	return c.take(ctx, inv, l, closeFn)
}

// take takes the locks of the run on l; on failure it releases what it took
// and calls closeFn.
func (c *cli) take(ctx context.Context, inv *invocation, l locker, closeFn func() error) (sched, lease core.Session, _ func() error, err error) {
	cfg := &inv.run
	fail := func(err error) (core.Session, core.Session, func() error, error) {
		c.releaseAll(lease, sched)
		closeFn()
		return nil, nil, nil, err
	}
	if cfg.limit > 1 && !hasSemaphores(l) {
		// Checked before any lock is taken, so that no slot is used up.
		return fail(noSemaphores(cfg, l.Backend().Name(), inv.urlEnv))
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
	if cfg.useSchedule {
		key := cfg.scheduleKey()
		s, err := c.try(ctx, l, key, append(jitterOpt(), core.ForSlot(cfg.schedule), core.SlotTolerance(cfg.slotTolerance)), cfg, inv.urlEnv)
		if err != nil {
			return fail(err)
		}
		sched = s
		c.log.Debug("schedule slot taken", "key", key, "token", s.Token(), "slot_end", s.Deadline().UTC().Format(time.RFC3339))
	}
	if cfg.useLease {
		key := cfg.leaseKey()
		opts := append(jitterOpt(), core.TTL(cfg.ttl), core.RenewInterval(cfg.interval), core.RenewDeadline(cfg.renewDeadline))
		if cfg.limit > 1 {
			opts = append(opts, core.Limit(cfg.limit))
		}
		s, err := c.try(ctx, l, key, opts, cfg, inv.urlEnv)
		if err != nil {
			return fail(err)
		}
		lease = s
		c.log.Debug("lease taken", "key", key, "token", s.Token(), "ttl", cfg.ttl, "renew_interval", cfg.interval)
	}
	c.admin = l
	return sched, lease, closeFn, nil
}

// try makes one attempt at key and maps the outcome to an exit code.
func (c *cli) try(ctx context.Context, l core.Locker, key string, opts []core.Option, cfg *runConfig, urlEnv string) (core.Session, error) {
	actx, cancel := context.WithTimeout(ctx, cfg.jitter+connectTimeout)
	defer cancel()
	s, err := l.TryAcquire(actx, key, opts...)
	var busy *core.NotAcquiredError
	switch {
	case err == nil:
		return s, nil
	case errors.As(err, &busy):
		c.log.Info(busyMessage(key, cfg, busy.Holder))
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
	// err names the key and the backend: "dislock: pg: acquire \"k\": …".
	return nil, exitWith(exitFailure, fmt.Errorf("the backend in %s: %w", urlEnv, err))
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

// holderAttrs names key's holder as the store has it now, for a log line.
func (c *cli) holderAttrs(key string) []any {
	if c.admin == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	info, ok, err := c.admin.Inspect(ctx, key)
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
func (c *cli) runChild(cfg *runConfig, env []string, lease core.Session, sigs, jobSigs <-chan os.Signal) (code int, gone bool, err error) {
	cmd := exec.Command(cfg.command[0], cfg.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	waited, err := startChild(cmd)
	if err != nil {
		// A command that cannot start (not found, not executable) is a
		// runtime failure like an unreachable backend: exit 1.
		return 0, true, exitWith(exitFailure, fmt.Errorf("start the command: %w", err))
	}
	g := &group{c: c, pgid: cmd.Process.Pid}
	c.log.Info("command started", "pid", g.pgid, "command", cfg.command[0])

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
			c.log.Warn("processes the command started are still running in its process group; terminating them", "pgid", g.pgid,
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
	killAt   time.Time // when SIGKILL is due; zero while none is
	killed   bool      // SIGKILL was sent
	killedAt time.Time
}

// terminate sends SIGTERM (once) and makes SIGKILL due at killAt, or at the
// earlier time already set.
func (g *group) terminate(killAt time.Time, timer *time.Timer) {
	if !g.termSent {
		g.termSent = true
		syscall.Kill(-g.pgid, syscall.SIGTERM)
		// A group paused by a forwarded SIGTSTP acts on SIGTERM only once
		// it runs again.
		syscall.Kill(-g.pgid, syscall.SIGCONT)
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
	g.c.log.Warn("the command's process group outlived the grace period; sending SIGKILL", "pgid", g.pgid)
	syscall.Kill(-g.pgid, syscall.SIGKILL)
}

func (g *group) alive() bool { return groupAlive(g.pgid) }

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
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false, false
	}
	want := strconv.Itoa(pgid)
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
		if len(f) >= 3 && f[2] == want && f[0] != "Z" && f[0] != "X" {
			return true, true
		}
	}
	return false, true
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
