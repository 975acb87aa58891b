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
# lanes of about the same length: lane a runs the chaos suite, which mostly
# waits on its faults' timers, then the examples; lane b the others one after
# another (the CLI and the etcd suites are its long ones). Each lane's output
# is printed when it ends.
lane_a_mods=" chaos examples "
nested_module() {
  phase "$1 (nested module)"
  (cd "$1" && go vet ./... && go test -race -count=1 -timeout 10m ./...)
}
# lane runs the nested modules of lane a ("a") or of lane b ("b") in order.
lane() {
  local rc=0 modfile mod
  for mod in $lane_a_mods; do
    if [ "$1" = a ] && [ -f "$mod/go.mod" ]; then nested_module "$mod" || rc=1; fi
  done
  for modfile in $mods; do
    mod=$(dirname "$modfile")
    if [ "$1" = b ] && [[ $lane_a_mods != *" $mod "* ]]; then nested_module "$mod" || rc=1; fi
  done
  return $rc
}
lanes=$(mktemp -d)
trap 'rm -rf "$lanes"' EXIT
mods=$(git ls-files '*/go.mod' 2>/dev/null || find . -mindepth 2 -name go.mod)
lane a >"$lanes/a" 2>&1 &
lane_a=$!
lane_b_rc=0
lane b >"$lanes/b" 2>&1 || lane_b_rc=1
lane_a_rc=0
wait "$lane_a" || lane_a_rc=1
cat "$lanes/b" "$lanes/a"
phase done
if [ "$lane_a_rc" -ne 0 ] || [ "$lane_b_rc" -ne 0 ]; then
  echo "nested modules failed" >&2
  exit 1
fi
