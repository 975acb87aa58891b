package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/dislock/dislock/core"
	"github.com/dislock/dislock/pg"
)

func main() {
	c := newCLI(os.Stdout, os.Stderr, os.LookupEnv)
	os.Exit(c.exitCode(c.run(os.Args[1:])))
}

// exitError carries the process's exit code. A nil err means there is
// nothing left to log (the command's own exit code, or a busy lock).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

// cli holds the process's outputs, environment and logger.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) (string, bool)
	level          *slog.LevelVar
	red            *redactor
	log            *slog.Logger
	locker         locker         // the run's backend, once open
	jobSigs        chan os.Signal // the job-control signals dislock catches
	admin          core.Admin     // the run's backend, once its locks are taken: names a holder found at release
}

func newCLI(stdout, stderr io.Writer, getenv func(string) (string, bool)) *cli {
	c := &cli{stdout: stdout, stderr: stderr, getenv: getenv, level: new(slog.LevelVar)}
	c.setRedactor(newRedactor("", ""))
	return c
}

// setRedactor installs r in front of the log output. It is called before
// any goroutine logs.
func (c *cli) setRedactor(r *redactor) {
	c.red = r
	c.log = slog.New(&redactHandler{r: r, next: slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: c.level})})
}

// exitCode logs err (redacted) and returns the exit code it stands for.
func (c *cli) exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	code := exitFailure
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		err = ee.err
	}
	var ue *usageError
	if errors.As(err, &ue) {
		code = exitUsage
	}
	if err != nil {
		c.log.Error(err.Error(), "exit_code", code)
	}
	return code
}

func (c *cli) run(args []string) error {
	inv, err := parseArgs(args, c.getenv)
	if err != nil {
		return err
	}
	if inv.help {
		c.usage(c.stdout)
		return nil
	}
	if inv.version {
		fmt.Fprintln(c.stdout, versionLine())
		return nil
	}
	c.level.Set(inv.level)
	c.setRedactor(newRedactor(inv.urlEnv, inv.url))
	switch inv.sub {
	case subStatus:
		return c.status(inv)
	case subList:
		return c.list(inv)
	case subRelease:
		return c.release(inv)
	}
	return c.runLocked(inv)
}

// versionLine is what --version prints: the module version from the build
// information ("(devel)" for a build from a clone) and the Go version.
func versionLine() string {
	v := "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
	}
	return fmt.Sprintf("dislock %s (%s)", v, runtime.Version())
}

// open connects to the backend within a bounded time; errors carry their
// exit code.
func (c *cli) open(ctx context.Context, inv *invocation) (locker, func() error, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, inv.timeout, errTimeout{inv.timeout})
	defer cancel()
	use := tableRun
	switch {
	case inv.sub != subRun:
		use = tableAdmin
	case inv.create:
		use = tableCreate
	}
	permits := inv.sub == subRun && inv.run.limit > 1
	l, closeFn, err := openLocker(ctx, inv.urlEnv, inv.url, inv.table, use, permits, c.releaseTimeout(inv), c.log)
	var ue *usageError
	switch {
	case err == nil:
		return l, closeFn, nil
	case errors.As(err, &ue), errors.Is(err, errNoTable):
		return nil, nil, err
	}
	return nil, nil, exitWith(exitFailure, fmt.Errorf("connect to the backend in %s: %w", inv.urlEnv, outage(ctx, err)))
}

// errTimeout is the cause of a store call cut short by DISLOCK_TIMEOUT_SECONDS.
type errTimeout struct{ d time.Duration }

func (e errTimeout) Error() string {
	return fmt.Sprintf("no answer within %v (%s)", e.d, specTimeout.name())
}

// outage is err, a store call's failure, said in one line: when ctx ran
// out, with what cut it short first.
func outage(ctx context.Context, err error) error {
	var te errTimeout
	if errors.As(context.Cause(ctx), &te) && !errors.As(err, &te) {
		err = fmt.Errorf("%w: %w", te, err)
	}
	if said, _ := driverSaid.Load().(string); said != "" && ctx.Err() != nil && !strings.Contains(err.Error(), said) {
		err = fmt.Errorf("%w (the driver last said: %s)", err, said)
	}
	return oneLine{err}
}

// oneLine is an error printed on one line.
type oneLine struct{ err error }

func (e oneLine) Error() string {
	return strings.ReplaceAll(strings.TrimSpace(e.err.Error()), "\n", "; ")
}
func (e oneLine) Unwrap() error { return e.err }

// releaseTimeout bounds each release and the undo of a claim: the store
// timeout, and for a run at most a third of the lease's margin (TTL minus
// renew deadline), so that a run that lost its lease exits before the
// store could give the key to another holder.
func (c *cli) releaseTimeout(inv *invocation) time.Duration {
	d := inv.timeout
	if inv.sub == subRun && inv.run.useLease {
		d = min(d, max((inv.run.ttl-inv.run.renewDeadline)/3, 100*time.Millisecond))
	}
	return d
}

// operate opens the backend for an operator subcommand and runs fn on it,
// bounded by the store timeout.
func (c *cli) operate(inv *invocation, fn func(ctx context.Context, l locker) error) error {
	ctx, cancel := context.WithTimeoutCause(context.Background(), inv.timeout, errTimeout{inv.timeout})
	defer cancel()
	l, closeFn, err := c.open(ctx, inv)
	if err != nil {
		return err
	}
	defer closeFn()
	return fn(ctx, l)
}

// heldLine is the line status and list print for a held lock: the key,
// "held", then the holder's fields. Every time in it comes from the one read
// of the store that returned info (remaining is expires_at minus the store's
// clock at that read). A permit of a semaphore (LOCK_LIMIT) ends with
// limit=N; each permit has a line of its own.
func heldLine(info core.Info) string {
	limit := ""
	if info.Limit > 1 {
		limit = fmt.Sprintf("\tlimit=%d", info.Limit)
	}
	key := info.Key
	if strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		key = strconv.Quote(key) // one line per lock, whatever a key holds
	}
	return fmt.Sprintf("%s\theld\towner=%s\ttoken=%d\tacquired_at=%s\texpires_at=%s\tremaining=%s%s\n",
		key, info.Owner, info.Token, fmtTime(info.AcquiredAt), fmtTime(info.ExpiresAt), info.Remaining.Round(time.Millisecond), limit)
}

// status prints the status of a key: exit 0 when it is held, exitFree
// when it is free.
func (c *cli) status(inv *invocation) error {
	key := inv.args[0]
	err := c.operate(inv, func(ctx context.Context, l locker) error {
		return c.printStatus(ctx, l, key)
	})
	if errors.Is(err, errNoTable) {
		// A fresh database: no run has created the default table yet.
		c.printFree(key)
		return exitWith(exitFree, nil)
	}
	return err
}

// printFree prints that key is free, with a hint when key looks like a
// LOCK_KEY value rather than a stored key.
func (c *cli) printFree(key string) {
	fmt.Fprintf(c.stdout, "%s\tfree\n", key)
	if !strings.HasPrefix(key, keyPrefix) {
		c.log.Warn(fmt.Sprintf("%s is the key as stored: the locks of %s=%s are %s and %s", key, specKey.env, key,
			schedulePrefix+key, leasePrefix+key))
	}
}

// printStatus prints the status of key on l: a line per holder (exit 0), or
// free (exitFree).
func (c *cli) printStatus(ctx context.Context, l locker, key string) error {
	info, ok, err := l.Inspect(ctx, key)
	if err != nil {
		return exitWith(exitFailure, fmt.Errorf("status %q: %w", key, outage(ctx, err)))
	}
	if !ok {
		c.printFree(key)
		return exitWith(exitFree, nil)
	}
	holders := []core.Info{info}
	if info.Limit > 1 && hasSemaphores(l) {
		// A semaphore: a line for every permit, oldest first.
		hs, err := l.Holders(ctx, key)
		if err != nil {
			return exitWith(exitFailure, fmt.Errorf("status %q: %w", key, outage(ctx, err)))
		}
		if len(hs) == 0 {
			c.printFree(key)
			return exitWith(exitFree, nil)
		}
		holders = hs
	}
	for _, h := range holders {
		h.Key = key
		io.WriteString(c.stdout, heldLine(h))
	}
	return nil
}

func (c *cli) list(inv *invocation) error {
	err := c.operate(inv, func(ctx context.Context, l locker) error {
		prefix := ""
		if len(inv.args) > 0 {
			prefix = inv.args[0]
		}
		infos, err := l.List(ctx, prefix)
		if err != nil {
			return exitWith(exitFailure, fmt.Errorf("list: %w", outage(ctx, err)))
		}
		for _, info := range infos {
			io.WriteString(c.stdout, heldLine(info))
		}
		return nil
	})
	if errors.Is(err, errNoTable) {
		return nil // no table, no locks
	}
	return err
}

func (c *cli) release(inv *invocation) error {
	err := c.operate(inv, func(ctx context.Context, l locker) error {
		key := inv.args[0]
		if info, ok, err := l.Inspect(ctx, key); err == nil && ok {
			if info.Limit > 1 {
				c.log.Warn("force-releasing every permit of a semaphore; each holder learns of the loss at its next renewal",
					"key", key, "limit", info.Limit, "oldest_owner", info.Owner, "oldest_token", info.Token)
			} else {
				c.log.Warn("force-releasing a held lock; its holder learns of the loss at its next renewal",
					"key", key, "owner", info.Owner, "token", info.Token)
			}
		}
		released, err := l.ForceRelease(ctx, key)
		if err != nil {
			return exitWith(exitFailure, fmt.Errorf("release %q: %w", key, outage(ctx, err)))
		}
		if released {
			fmt.Fprintf(c.stdout, "%s\treleased\n", key)
		} else {
			fmt.Fprintf(c.stdout, "%s\tfree\n", key)
		}
		return nil
	})
	if errors.Is(err, errNoTable) {
		fmt.Fprintf(c.stdout, "%s\tfree\n", inv.args[0])
		return nil
	}
	return err
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// usage prints the help text, with each flag's environment variable.
func (c *cli) usage(w io.Writer) {
	var b strings.Builder
	b.WriteString(`Usage:
  dislock [flags] URL_ENV [--] command [args…]
  dislock status [flags] KEY
  dislock list [flags] [PREFIX]
  dislock release --force [flags] KEY

Runs command under a distributed lock, for crontabs: on every machine, at most
one instance per schedule slot (strategy schedule) and/or at a time (strategy
lease). URL_ENV names the environment variable that holds the backend URL:
postgres://, postgresql://, mysql://user:password@host:port/db (or mariadb://), redis://, rediss://,
redis+sentinel://h1:p1,h2:p2/db?master_name=NAME,
redis+cluster://h1:p1,h2:p2, zk://[user:password@]h1:p1,h2:p2[/chroot][?session_timeout=SECONDS],
etcd://[user:password@]h1:p1,h2:p2 (etcds:// for TLS). The URL is never
printed, not even when it is passed in place of the variable's name.

Logs go to stderr. At the default level, WARNING, a run that succeeds and a
run skipped because the lock is held print nothing, so cron mails only about
problems; CRONJOB_LOCK_LOG_LEVEL=INFO logs each start, exit and skip.

On PostgreSQL and MySQL the locks live in the table ` + pg.DefaultTable + `, which the
first run creates (on MySQL with its companion tables and procedures). A table
named by LOCK_TABLE must exist (exit 2 shows the CREATE statement), unless DISLOCK_CREATE_TABLE=1 lets the run create it; status,
list and release never create a table (without the default table, every
lock is free). On ZooKeeper the lease's TTL is at most 2/3 of the session
the server grants (40 s on a stock server): the default TTL is cut to fit,
and a RUN_LOCK_TTL_SECONDS that does not fit is exit 2.

The command runs in its own process group with DISLOCK_KEY, DISLOCK_TOKEN
(fencing token) and DISLOCK_DEADLINE (RFC 3339) added to its environment.
SIGINT, SIGTERM and SIGHUP are forwarded to the group. SIGTSTP (Ctrl-Z) and
SIGCONT are forwarded too: the command pauses while dislock keeps renewing the
lease. SIGSTOP cannot be caught: it stops dislock's renewals, the lease may
pass to another run, and the command is terminated (exit 75) once dislock
resumes. The lock is released
once the whole group is gone: processes the command leaves running get
SIGTERM, then SIGKILL after the grace period. On Linux the command gets
SIGKILL if dislock itself is killed (its children do not: exec the job).

LOCK_LIMIT=N (--limit N), with the lease strategy, lets up to N instances of
the key run at once: each holds one of N permits of the lease, with its own
DISLOCK_TOKEN, and a run that finds all N taken does not start (a busy lock).
Every run of a key must use the same LOCK_LIMIT; a run whose key is held under
another limit, or on a backend without semaphores, is exit 2.

LOCK_WAIT_SECONDS=D (--wait D), with the lease strategy, waits like flock -w:
a run that finds the lease held waits up to D for it, in the store's queue
(first come, first served: runs that wait get the lease in the order they
began to wait; a run that does not wait may still take a lease that comes
free), then takes the busy path. A schedule slot that has run is not waited
for: under schedule,lease the run waits for the lease, then claims the slot.

Only the store's answer that a lock is held is the busy path. A store that
cannot be reached, refuses the credentials, or does not answer within
DISLOCK_TIMEOUT_SECONDS (default 30; a lock table locked by a migration, a TLS
URL to a plaintext server) is exit 1 with one line naming the backend and the
cause, after at most about three times that timeout (the call, then undoing a
claim the store may have applied, then closing). Everything that can be
checked is checked before a lock is taken (the settings, the command's
executable, the TTL against the backend's limits): a schedule slot is used up
only by a run that started its command, and a run whose command could not be
started gives its slot back.

Exit codes: 0 the command succeeded, or the lock is held elsewhere and the
command did not start (see --busy-exit-code); 1 runtime failure (for example
the backend is unreachable; the command did not start); 2 bad configuration or
usage; 75 the lease was lost and the command terminated; 128+N when signal N
(SIGINT, SIGTERM, SIGHUP) reached dislock before the command starts; otherwise
the command's own exit code (128+N when a signal N ended it). A command that
cannot be started (not found, not executable) is a runtime failure: 1.
dislock status exits 0 when the lock is held and 3 when it is free.

Flags (each overrides its environment variable):
`)
	for _, sp := range specAllForHelp {
		arg := ""
		if sp.arg != "" {
			arg = " " + sp.arg
		}
		fmt.Fprintf(&b, "  --%s%s\n", sp.flag, arg)
		env := ""
		if sp.env != "" {
			env = "$" + sp.env + ". "
		}
		def := ""
		if sp.def != "" {
			def = " (default " + sp.def + ")"
		}
		fmt.Fprintf(&b, "      %s%s%s\n", env, sp.help, def)
	}
	b.WriteString("\nStatus, list and release take KEY as stored, e.g. " + schedulePrefix + "NAME or " + leasePrefix + "NAME.\n" +
		"Status and list print one line per lock, tab-separated: KEY held owner=… token=… acquired_at=…\n" +
		"expires_at=… remaining=… (times in UTC, all from one read of the store); status prints KEY free\n" +
		"for a free lock (exit 3; exit 0 when held). A lease taken with LOCK_LIMIT above 1 has a line per running instance, ending\n" +
		"in limit=N; release --force frees all of them.\n")
	io.WriteString(w, b.String())
}
