#!/bin/sh
# Runs two dislock instances on the same key at once: one runs the command,
# the other finds the lock busy and exits 0 without running it. Then it shows
# the lock with "dislock list", and lets a third instance wait for the lease
# (--wait) instead of skipping. Runs on any of the four backends with stock
# server settings:
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable examples/cli/demo.sh
#   DATABASE_URL=mysql://root@127.0.0.1:3306/test examples/cli/demo.sh
#   DATABASE_URL=redis://127.0.0.1:6379/0 examples/cli/demo.sh
#   DATABASE_URL=zk://127.0.0.1:2181 examples/cli/demo.sh
#   DATABASE_URL=etcd://127.0.0.1:2379 examples/cli/demo.sh
set -eu
cd "$(dirname "$0")/../.."
: "${DATABASE_URL:=postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
export DATABASE_URL

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go -C cmd/dislock build -o "$bin/dislock" .
go -C examples build -o "$bin/job" ./cli

export LOCK_KEY="demo-$$" LOCK_STRATEGY=schedule,lease CRON_SCHEDULE='* * * * *'
"$bin/dislock" DATABASE_URL "$bin/job" -work 3s &
first=$!
# Wait until the first instance holds the lease (status exits 0 when held).
until "$bin/dislock" status "cronjob-lock:lease:demo-$$" >/dev/null 2>&1; do sleep 0.1; done
echo "--- second instance, same key (at log level INFO, to say why it does not run):"
CRONJOB_LOCK_LOG_LEVEL=INFO "$bin/dislock" DATABASE_URL "$bin/job" -work 2s
echo "--- second instance exited $?"
# The lease is held while the first instance works (the schedule lock only
# until the minute ends, which may come first).
echo "--- dislock list cronjob-lock:lease:demo-$$"
"$bin/dislock" list cronjob-lock:lease:demo-$$
echo "--- third instance, lease only, waits up to 30s for the lease (--wait 30s):"
LOCK_STRATEGY=lease "$bin/dislock" --wait 30s DATABASE_URL "$bin/job" -work 0s
echo "--- third instance exited $?"
wait "$first"
echo "--- first instance done; the schedule lock stays until the minute ends (status exits 0 while held):"
"$bin/dislock" status cronjob-lock:schedule:demo-$$ || echo "--- status exited $? (the minute has ended)"
echo "--- the lease is free (status exits 3: free):"
"$bin/dislock" status cronjob-lock:lease:demo-$$ || echo "--- status exited $?"
