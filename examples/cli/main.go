// Command cli is a sample job to run under the dislock CLI. It shows what a
// command gets from dislock: the lock's key, its fencing token and its
// deadline in the environment, and SIGTERM when the lease is lost (or when
// dislock itself is asked to stop).
//
// Run it under dislock (see README.md):
//
//	LOCK_KEY=report LOCK_STRATEGY=lease dislock DATABASE_URL go -C examples run ./cli -work 2s
//
// Run alone, it says that it holds no lock, names the dislock command line
// that would run it under a lock on the server in DATABASE_URL (or
// MYSQL_URL, REDIS_URL, ETCD_URL, ZK_URL, whichever is set first), and does
// its work
// anyway. It never connects to a server itself: dislock does.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "job:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("job", flag.ContinueOnError)
	work := fs.Duration("work", time.Second, "how long the job works")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// dislock sends SIGTERM to the whole process group when the lease is
	// lost, and SIGKILL after its grace period: stop promptly.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()

	key := os.Getenv("DISLOCK_KEY")
	if key == "" {
		fmt.Fprintln(out, "job: not running under dislock; no lock held")
		urlVar := ""
		for _, v := range []string{"DATABASE_URL", "MYSQL_URL", "REDIS_URL", "ETCD_URL", "ZK_URL"} {
			if os.Getenv(v) != "" {
				urlVar = v
				break
			}
		}
		if urlVar == "" {
			fmt.Fprintln(out, "job: set DATABASE_URL (or MYSQL_URL, REDIS_URL, ETCD_URL, ZK_URL) and run me under dislock to hold a lock there")
		} else {
			fmt.Fprintf(out, "job: to hold a lock on the server in %s: LOCK_KEY=report LOCK_STRATEGY=lease dislock %s go -C examples run ./cli\n", urlVar, urlVar)
		}
	} else {
		token, err := strconv.ParseUint(os.Getenv("DISLOCK_TOKEN"), 10, 64)
		if err != nil {
			return fmt.Errorf("DISLOCK_TOKEN: %w", err)
		}
		deadline, err := time.Parse(time.RFC3339, os.Getenv("DISLOCK_DEADLINE"))
		if err != nil {
			return fmt.Errorf("DISLOCK_DEADLINE: %w", err)
		}
		// Pass the token to whatever the job writes to, and have it refuse
		// writes carrying a smaller token than one it has seen: a lease is
		// not a fence. The deadline is when the lock would lapse without a
		// renewal; a job under the schedule strategy alone can use it as the
		// end of its slot.
		fmt.Fprintf(out, "job: holding %s, fencing token %d, deadline %s\n", key, token, deadline.Format(time.RFC3339))
	}
	select {
	case <-time.After(*work):
		fmt.Fprintln(out, "job: done")
		return nil
	case <-ctx.Done():
		fmt.Fprintln(out, "job: stopping early")
		return ctx.Err()
	}
}
