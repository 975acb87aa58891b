#!/usr/bin/env bash
# The whole test suite: starts the servers the tests need, then vets and runs
# every test with the race detector, including the nested modules.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/services.sh

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted"; exit 1; fi

echo "== go vet"
go vet ./...

echo "== go test -race"
go test -race -count=1 -timeout 15m "$@" ./...

for mod in chaos bench; do
  if [ -f "$mod/go.mod" ]; then
    echo "== $mod (nested module)"
    (cd "$mod" && go vet ./... && go test -race -count=1 -timeout 10m ./...)
  fi
done
