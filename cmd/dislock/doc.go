// Command dislock runs a command under a distributed lock, so that a crontab
// installed on many machines runs each job once.
//
//	dislock [flags] URL_ENV [--] command [args…]
//	dislock status|list|release --force …
//
// URL_ENV names the environment variable that holds the backend URL
// (PostgreSQL or Redis; the URL is never printed). The settings and their
// environment variables are those of the older Python cronjob-lock tool;
// dislock --help lists them. The strategy schedule runs the command at most
// once per slot of CRON_SCHEDULE, lease keeps a renewed lease while it runs,
// and schedule,lease does both.
//
// The command runs in its own process group. When the lease is lost, the
// group gets SIGTERM, then SIGKILL after the grace period or earlier, so that
// it is dead before the server could give the lock to another holder; dislock
// then exits 75. Signals sent to dislock are forwarded to the group, and the
// lock is released once the command has exited.
package main
