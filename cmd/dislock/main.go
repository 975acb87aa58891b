package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
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
	admin          core.Admin // the run's backend, once its locks are taken: names a holder found at release
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
	c.level.Set(inv.level)
	c.setRedactor(newRedactor(inv.urlEnv, inv.url))
	if inv.levelWarn != "" {
		c.log.Warn(inv.levelWarn)
	}
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

// open connects to the backend within a bounded time; errors carry their
// exit code.
func (c *cli) open(ctx context.Context, inv *invocation) (locker, func() error, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	use := tableRun
	switch {
	case inv.sub != subRun:
		use = tableAdmin
	case inv.create:
		use = tableCreate
	}
	permits := inv.sub == subRun && inv.run.limit > 1
	l, closeFn, err := openLocker(ctx, inv.urlEnv, inv.url, inv.table, use, permits, c.log)
	var ue *usageError
	switch {
	case err == nil:
		return l, closeFn, nil
	case errors.As(err, &ue):
		return nil, nil, err
	}
	return nil, nil, exitWith(exitFailure, fmt.Errorf("connect to the backend in %s: %w", inv.urlEnv, err))
}

// connectTimeout bounds connecting and each operator call.
const connectTimeout = 30 * time.Second

// operate opens the backend for an operator subcommand and runs fn on it,
// bounded by connectTimeout.
func (c *cli) operate(inv *invocation, fn func(ctx context.Context, l locker) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
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
	return fmt.Sprintf("%s\theld\towner=%s\ttoken=%d\tacquired_at=%s\texpires_at=%s\tremaining=%s%s\n",
		info.Key, info.Owner, info.Token, fmtTime(info.AcquiredAt), fmtTime(info.ExpiresAt), info.Remaining.Round(time.Millisecond), limit)
}

func (c *cli) status(inv *invocation) error {
	return c.operate(inv, func(ctx context.Context, l locker) error {
		return c.printStatus(ctx, l, inv.args[0])
	})
}

// printStatus prints the status of key on l: a line per holder, or free.
func (c *cli) printStatus(ctx context.Context, l locker, key string) error {
	info, ok, err := l.Inspect(ctx, key)
	if err != nil {
		return exitWith(exitFailure, fmt.Errorf("status %q: %w", key, err))
	}
	if !ok {
		fmt.Fprintf(c.stdout, "%s\tfree\n", key)
		return nil
	}
	holders := []core.Info{info}
	if info.Limit > 1 && hasSemaphores(l) {
		// A semaphore: a line for every permit, oldest first.
		hs, err := l.Holders(ctx, key)
		if err != nil {
			return exitWith(exitFailure, fmt.Errorf("status %q: %w", key, err))
		}
		if len(hs) == 0 {
			fmt.Fprintf(c.stdout, "%s\tfree\n", key)
			return nil
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
	return c.operate(inv, func(ctx context.Context, l locker) error {
		prefix := ""
		if len(inv.args) > 0 {
			prefix = inv.args[0]
		}
		infos, err := l.List(ctx, prefix)
		if err != nil {
			return exitWith(exitFailure, fmt.Errorf("list: %w", err))
		}
		for _, info := range infos {
			io.WriteString(c.stdout, heldLine(info))
		}
		return nil
	})
}

func (c *cli) release(inv *invocation) error {
	return c.operate(inv, func(ctx context.Context, l locker) error {
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
			return exitWith(exitFailure, fmt.Errorf("release %q: %w", key, err))
		}
		if released {
			fmt.Fprintf(c.stdout, "%s\treleased\n", key)
		} else {
			fmt.Fprintf(c.stdout, "%s\tfree\n", key)
		}
		return nil
	})
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
postgres://, postgresql://, redis://, rediss://, redis+sentinel://h1:p1,h2:p2/db?master_name=NAME,
redis+cluster://h1:p1,h2:p2, zk://[user:password@]h1:p1,h2:p2[/chroot][?session_timeout=SECONDS],
etcd://[user:password@]h1:p1,h2:p2 (etcds:// for TLS). The URL is never
printed, not even when it is passed in place of the variable's name.

Logs go to stderr. At the default level, WARNING, a run that succeeds and a
run skipped because the lock is held print nothing, so cron mails only about
problems; CRONJOB_LOCK_LOG_LEVEL=INFO logs each start, exit and skip.

On PostgreSQL the locks live in the table ` + pg.DefaultTable + `, which the first run
creates. A table named by LOCK_TABLE must exist (exit 2 shows the CREATE
statement), unless DISLOCK_CREATE_TABLE=1 lets the run create it; status,
list and release never create a table.

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

Exit codes: 0 the command succeeded, or the lock is held elsewhere and the
command did not start (see --busy-exit-code); 1 runtime failure (for example
the backend is unreachable; the command did not start); 2 bad configuration or
usage; 75 the lease was lost and the command terminated; otherwise the
command's own exit code (128+N when a signal N ended it). A command that
cannot be started (not found, not executable) is a runtime failure: 1.

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
		"for a free lock. A lease taken with LOCK_LIMIT above 1 has a line per running instance, ending\n" +
		"in limit=N; release --force frees all of them.\n")
	io.WriteString(w, b.String())
}
