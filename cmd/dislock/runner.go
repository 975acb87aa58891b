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
	defer func() {
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
	code, runErr := c.runChild(cfg, env, lease, sigs)
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
	cfg := &inv.run
	l, closeFn, err := c.open(ctx, inv)
	if err != nil {
		return nil, nil, nil, err
	}
	fail := func(err error) (core.Session, core.Session, func() error, error) {
		c.releaseAll(lease, sched)
		closeFn()
		return nil, nil, nil, err
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
		s, err := c.try(ctx, l, key, opts, cfg, inv.urlEnv)
		if err != nil {
			return fail(err)
		}
		lease = s
		c.log.Debug("lease taken", "key", key, "token", s.Token(), "ttl", cfg.ttl, "renew_interval", cfg.interval)
	}
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
		attrs := []any{"key", key}
		if h := busy.Holder; h != nil {
			attrs = append(attrs, "holder", h.Owner, "holder_token", h.Token, "remaining", h.Remaining.Round(time.Millisecond))
		}
		c.log.Info("lock held elsewhere; the command does not run", attrs...)
		return nil, exitWith(cfg.busyExit, nil)
	case context.Cause(ctx) != nil && errors.As(context.Cause(ctx), new(signalError)):
		return nil, exitWith(exitFailure, context.Cause(ctx))
	case errors.Is(err, core.ErrInvalidOption), errors.Is(err, core.ErrInvalidKey):
		return nil, exitWith(exitUsage, fmt.Errorf("lock %q: %w", key, err))
	}
	return nil, exitWith(exitFailure, fmt.Errorf("lock %q on the backend in %s: %w", key, urlEnv, err))
}

// releaseAll releases the lease, then the schedule lock (which stays held
// until its slot ends).
func (c *cli) releaseAll(lease, sched core.Session) {
	for _, s := range []core.Session{lease, sched} {
		if s == nil {
			continue
		}
		if err := s.Release(context.Background()); err != nil {
			c.log.Warn("release failed; the lock expires on its own", "key", s.Key(), "err", err)
		} else {
			c.log.Debug("released", "key", s.Key())
		}
	}
}

// runChild runs the command in its own process group and waits for it. It
// forwards signals to the group and, when the lease is lost under the
// terminate policy, terminates the group (exit 75).
func (c *cli) runChild(cfg *runConfig, env []string, lease core.Session, sigs <-chan os.Signal) (int, error) {
	cmd := exec.Command(cfg.command[0], cfg.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		// A command that cannot start (not found, not executable) is a
		// runtime failure like an unreachable backend: exit 1.
		return 0, exitWith(exitFailure, fmt.Errorf("start the command: %w", err))
	}
	pgid := cmd.Process.Pid
	c.log.Info("command started", "pid", pgid, "command", cfg.command[0])
	waited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(waited)
	}()

	var lost <-chan struct{}
	if lease != nil {
		lost = lease.Done()
	}
	var (
		terminating bool
		killAt      time.Time
		killTimer   *time.Timer
		killC       <-chan time.Time
		killed      bool
	)
	for {
		select {
		case <-waited:
			code := exitStatus(cmd.ProcessState)
			if !terminating {
				if groupLingers(pgid) {
					c.log.Warn("processes the command started are still running in its process group", "pgid", pgid)
				}
				c.log.Info("command exited", "exit_code", code)
				return code, nil
			}
			if killTimer != nil {
				killTimer.Stop()
			}
			c.finishGroup(pgid, killAt, killed)
			return 0, exitWith(exitLeaseLost, fmt.Errorf("lease lost; the command was terminated (its own exit status %d)", code))
		case sig := <-sigs:
			c.log.Info("forwarding signal to the command's process group", "signal", sig.String(), "pgid", pgid)
			if s, ok := sig.(syscall.Signal); ok {
				syscall.Kill(-pgid, s)
			}
		case <-lost:
			lost = nil
			cause := context.Cause(lease.Context())
			if cfg.onLossCont {
				c.log.Error("lease lost; the command continues (LOCK_ON_LEASE_LOSS=continue) and another instance may start", "key", lease.Key(), "err", cause)
				continue
			}
			terminating = true
			now := time.Now()
			killAt = killDeadline(now, lease.Deadline(), cfg)
			c.log.Error("lease lost; terminating the command's process group", "key", lease.Key(), "err", cause,
				"pgid", pgid, "kill_in", killAt.Sub(now).Round(time.Millisecond))
			syscall.Kill(-pgid, syscall.SIGTERM)
			killTimer = time.NewTimer(time.Until(killAt))
			killC = killTimer.C
		case <-killC:
			killC = nil
			killed = true
			c.log.Warn("the command's process group outlived the grace period; sending SIGKILL", "pgid", pgid)
			syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}
}

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

// finishGroup waits, after the group's leader exited, for the rest of the
// group to exit until killAt, then kills what is left.
func (c *cli) finishGroup(pgid int, killAt time.Time, killed bool) {
	for !killed && groupAlive(pgid) && time.Now().Before(killAt) {
		time.Sleep(groupPoll)
	}
	if !groupAlive(pgid) {
		return
	}
	if !killed {
		c.log.Warn("processes of the command's group outlived the grace period; sending SIGKILL", "pgid", pgid)
	}
	syscall.Kill(-pgid, syscall.SIGKILL)
	for end := time.Now().Add(afterKillWait); groupAlive(pgid) && time.Now().Before(end); {
		time.Sleep(groupPoll)
	}
}

// groupLingers reports whether members of the group outlive its leader by
// more than a moment (signalled processes take a little while to exit).
func groupLingers(pgid int) bool {
	for end := time.Now().Add(lingerWait); groupAlive(pgid); time.Sleep(groupPoll) {
		if time.Now().After(end) {
			return true
		}
	}
	return false
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
