// Command dislock runs a command under a distributed lock, so that a crontab
// installed on many machines runs each job once.
//
//	dislock [flags] URL_ENV [--] command [args…]
//	dislock status|list|release --force …
//
// URL_ENV names the environment variable that holds the backend URL
// (PostgreSQL, MySQL / MariaDB, Redis, etcd or ZooKeeper; the URL is never
// printed). The settings and their environment variables are those of the
// older Python cronjob-lock tool; dislock --help lists them. The strategy
// schedule runs the command at most once per slot of CRON_SCHEDULE, lease
// keeps a renewed lease while it runs,
// and schedule,lease does both (the lease first, so that a run that finds
// it held leaves the slot to runs that can start). At the default log level,
// WARNING, a run that succeeds and a run skipped because the lock is held
// print nothing.
//
// Only the store's answer that a lock is held takes the busy path (exit 0,
// or DISLOCK_BUSY_EXIT_CODE). A store that cannot be reached, fails, or does
// not answer within DISLOCK_TIMEOUT_SECONDS (default 30) is exit 1 with one
// line naming the URL's variable, the backend and the cause. Whatever can be
// checked is checked before a lock is taken (the settings, the schedule's next
// slot, the command's executable, the TTL against the backend's limits), and
// a run whose command could not be started gives its schedule slot back: a
// slot is used up only by a run that started its command.
//
// LOCK_WAIT_SECONDS=D (--wait D), with the lease strategy, waits up to D for
// a held lease in the store's queue, first come first served, like flock -w,
// then takes the busy path. On ZooKeeper the default TTL is cut to 2/3 of the
// session the server granted; a RUN_LOCK_TTL_SECONDS that does not fit is
// exit 2. dislock status exits 0 when the lock is held and 3 when it is free.
//
// LOCK_LIMIT=N (--limit N), with the lease strategy, runs the command only
// if fewer than N instances of the key run: each instance holds one of the
// N permits of a semaphore on the lease key, renewed and lost like a lease,
// with a DISLOCK_TOKEN of its own; a run that finds all N taken does not
// start, as with a busy lock. It needs a backend with semaphores (a
// backend without them is exit 2 naming LOCK_LIMIT, before any lock is
// taken), and every run of a key must use the same N: a run whose key is
// held under another limit is exit 2. status prints a line per permit,
// ending in limit=N, list does the same, and release --force frees all
// permits. A value that is not a whole number from 1 to 10000 is exit 2.
// Under schedule,lease the schedule lock still lets one run start per slot:
// the limit then bounds the runs of successive slots that overlap. On
// PostgreSQL, a LOCK_LIMIT run that may create its table (the default one,
// or with DISLOCK_CREATE_TABLE=1) also creates what the semaphores keep
// beside it; otherwise a missing one is exit 2 that says what to create.
//
// The command runs in its own process group. When the lease is lost, the
// group gets SIGTERM, then SIGKILL after the grace period or earlier, so that
// it is dead before the server could give the lock to another holder; dislock
// then exits 75. When the store itself refused the lease (the key was deleted
// or taken over, so it may already be someone else's), SIGKILL follows
// SIGTERM after at most one second. Signals sent to dislock are forwarded to
// the group. SIGTSTP (Ctrl-Z) does not stop dislock: it is forwarded, so the
// command pauses while dislock keeps renewing the lease, and SIGCONT resumes
// it. SIGSTOP cannot be caught: it stops dislock and its renewals, the lease
// may pass to another run meanwhile, and when dislock resumes it sees the
// loss and terminates the command (exit 75).
//
// Started in the foreground of a terminal, dislock gives the terminal's
// foreground to the command's group, so that a command that reads the
// terminal is not stopped by SIGTTIN, and takes it back when the group is
// gone.
//
// The locks are released only once the whole process group is gone: after a
// loss the store keeps the key until its TTL runs out, and dislock's release
// is what frees it early. On Linux dislock is the subreaper of the command's
// descendants, so that processes that left the group (setsid) are found and
// terminated too. After a loss, the release and the close of the connection
// are each bounded by a third of the lease's margin, so that dislock exits
// before the store could give the key to another holder. Processes the command leaves running in its group
// when it exits get SIGTERM, then SIGKILL after the grace period, before the
// release. If processes of the group survive SIGKILL (uninterruptible
// sleep), dislock exits 1 without releasing, and the locks expire after their
// TTL. A release that finds the lease gone from the store (broken by
// release --force, or taken over, after the last renewal) is logged at
// WARNING with the key and the holder the store has now: the command may
// not have run alone. The command's exit code is kept.
//
// If dislock itself is killed outright (SIGKILL, the OOM killer), it can
// terminate nothing. On Linux the command is started with SIGKILL as its
// parent-death signal, so the kernel kills it at once. That signal reaches
// the command only, not the rest of its group. A command that is a shell
// script or sh -c '…' usually runs the job as the shell's child (dash does
// so even for a single command), and that child, like anything started in
// the background or in a pipeline, keeps running until it ends on its own,
// while the lease expires under it. Make the shell exec the job (sh -c 'exec
// job', or exec on the script's last line) so that the job itself is the
// command, or fence the job's writes with DISLOCK_TOKEN. On other systems
// there is no parent-death signal: the command keeps running after dislock
// is killed.
package main
