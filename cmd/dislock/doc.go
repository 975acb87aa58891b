// Command dislock runs a command under a distributed lock, so that a crontab
// installed on many machines runs each job once.
//
//	dislock [flags] URL_ENV [--] command [args…]
//	dislock status|list|release --force …
//
// URL_ENV names the environment variable that holds the backend URL
// (PostgreSQL, Redis, etcd or ZooKeeper; the URL is never printed). The settings and their
// environment variables are those of the older Python cronjob-lock tool;
// dislock --help lists them. The strategy schedule runs the command at most
// once per slot of CRON_SCHEDULE, lease keeps a renewed lease while it runs,
// and schedule,lease does both. At the default log level, WARNING, a run
// that succeeds and a run skipped because the lock is held print nothing.
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
// The locks are released only once the whole process group is gone: after a
// loss the store keeps the key until its TTL runs out, and dislock's release
// is what frees it early. Processes the command leaves running in its group
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
