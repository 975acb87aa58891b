#!/bin/sh
# Runs two dislock instances on the same key at once: one runs the command,
# the other finds the lock busy and exits 0 without running it. Then it shows
# the lock with "dislock list".
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable examples/cli/demo.sh
#   DATABASE_URL=redis://127.0.0.1:6379/0 examples/cli/demo.sh
set -eu
cd "$(dirname "$0")/../.."
: "${DATABASE_URL:=postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
export DATABASE_URL

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go -C cmd/dislock build -o "$bin/dislock" .
go -C examples build -o "$bin/job" ./cli

export LOCK_KEY="demo-$$" LOCK_STRATEGY=schedule,lease CRON_SCHEDULE='* * * * *'
"$bin/dislock" DATABASE_URL "$bin/job" -work 2s &
sleep 0.5
echo "--- second instance, same key (at log level INFO, to say why it does not run):"
CRONJOB_LOCK_LOG_LEVEL=INFO "$bin/dislock" DATABASE_URL "$bin/job" -work 2s
echo "--- second instance exited $?"
echo "--- dislock list cronjob-lock:schedule:demo-$$"
"$bin/dislock" list cronjob-lock:schedule:demo-$$
wait
echo "--- first instance done; the schedule lock stays until the minute ends:"
"$bin/dislock" status cronjob-lock:schedule:demo-$$
"$bin/dislock" status cronjob-lock:lease:demo-$$
