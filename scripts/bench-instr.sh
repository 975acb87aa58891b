#!/usr/bin/env bash
# Counts the Redis server's instructions per uncontended acquire + release
# for dislock, bsm/redislock, redsync and a raw SET NX PX + DEL, beside a
# PING's (BenchmarkServerInstructions in bench/). The server runs under
# valgrind's callgrind, so the counts do not move with the machine's load,
# as the times of scripts/bench.sh do. Needs valgrind (apt-get install
# valgrind) and redis-server. Extra arguments go to `go test` (default
# -benchtime 1000x).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/port.sh

command -v valgrind >/dev/null || { echo "bench-instr: valgrind not found (apt-get install valgrind)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "bench-instr: redis-server not found" >&2; exit 1; }

port=$(free_port 16400 16420) || { echo "bench-instr: no free port in 16400-16420" >&2; exit 1; }
dir=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
  redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --hz 1 --dir "$dir" \
  --logfile "$dir/redis.log" >"$dir/valgrind.log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
for _ in $(seq 1 300); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done

echo "redis: $(redis-cli -p "$port" info server | tr -d '\r' | sed -n 's/^redis_version://p') under callgrind (pid $pid)"
[ $# -gt 0 ] || set -- -benchtime 1000x
(cd bench && DISLOCK_BENCH_REDIS="redis://127.0.0.1:$port/0" DISLOCK_BENCH_CALLGRIND=$pid \
  DISLOCK_BENCH_CALLGRIND_OUT="$dir/cg.out" \
  go test -run '^$' -bench 'ServerInstructions' -count 1 -timeout 20m "$@" .)
