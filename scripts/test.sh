#!/usr/bin/env bash
# The whole test suite: starts the servers the tests need, then vets and runs
# every test with the race detector, including the nested modules.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# phase prints a phase's heading with the seconds since the start.
phase() { echo "== $* (at $(($(date +%s) - start))s)"; }

bash scripts/services.sh
# Stores whose tests start private servers: these scripts only make sure
# the server binaries are installed (apt-get when missing).
for s in scripts/etcd.sh scripts/zookeeper.sh scripts/pgbouncer.sh; do
  if [ -f "$s" ]; then bash "$s"; fi
done

phase gofmt
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted"; exit 1; fi

phase go vet
go vet ./...

phase go test -race
go test -race -count=1 -timeout 15m "$@" ./...

phase "asynqlock drain benchmark (one run each, real Redis)"
go test -run '^$' -bench Drain -benchtime 1x -count=1 ./integrations/asynqlock/

# Every nested module (etcdlock, chaos, bench, ...), each on its own, in two
# lanes: the chaos suite, which mostly waits on its faults' timers, beside
# the others one after another. Each lane's output is printed when it ends.
nested_module() {
  phase "$1 (nested module)"
  (cd "$1" && go vet ./... && go test -race -count=1 -timeout 10m ./...)
}
lanes=$(mktemp -d)
trap 'rm -rf "$lanes"' EXIT
mods=$(git ls-files '*/go.mod' 2>/dev/null || find . -mindepth 2 -name go.mod)
(
  rc=0
  for modfile in $mods; do
    mod=$(dirname "$modfile")
    if [ "$mod" = chaos ]; then nested_module "$mod" || rc=1; fi
  done
  exit $rc
) >"$lanes/a" 2>&1 &
lane_a=$!
lane_b_rc=0
(
  rc=0
  for modfile in $mods; do
    mod=$(dirname "$modfile")
    if [ "$mod" != chaos ]; then nested_module "$mod" || rc=1; fi
  done
  exit $rc
) >"$lanes/b" 2>&1 || lane_b_rc=1
lane_a_rc=0
wait "$lane_a" || lane_a_rc=1
cat "$lanes/b" "$lanes/a"
phase done
if [ "$lane_a_rc" -ne 0 ] || [ "$lane_b_rc" -ne 0 ]; then
  echo "nested modules failed" >&2
  exit 1
fi
