#!/usr/bin/env bash
# The whole test suite: starts the servers the tests need, then vets and runs
# every test with the race detector, including the nested modules.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/services.sh
# Stores whose tests start private servers: these scripts only make sure
# the server binaries are installed (apt-get when missing).
for s in scripts/etcd.sh scripts/zookeeper.sh scripts/pgbouncer.sh; do
  if [ -f "$s" ]; then bash "$s"; fi
done

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted"; exit 1; fi

echo "== go vet"
go vet ./...

echo "== go test -race"
go test -race -count=1 -timeout 15m "$@" ./...

echo "== asynqlock drain benchmark (one run each, real Redis)"
go test -run '^$' -bench Drain -benchtime 1x -count=1 ./integrations/asynqlock/

# Every nested module (etcdlock, chaos, bench, ...), each on its own.
for modfile in $(git ls-files '*/go.mod' 2>/dev/null || find . -mindepth 2 -name go.mod); do
  mod=$(dirname "$modfile")
  echo "== $mod (nested module)"
  (cd "$mod" && go vet ./... && go test -race -count=1 -timeout 10m ./...)
done
