#!/usr/bin/env bash
# Runs the comparative benchmarks of the nested module bench/ (dislock vs
# bsm/redislock, redsync, a plain TTL-row lock, PostgreSQL advisory locks,
# MySQL GET_LOCK, etcd's concurrency.Mutex and go-zookeeper's zk.Lock)
# and prints the machine, the server versions, the raw `go test -bench`
# output and a summary. Results are also written to bench/results/ (ignored
# by git), and bench/chart.svg (shown in BENCHMARKS.md) is redrawn from
# them. Takes about 3 minutes.
#
# PostgreSQL: DISLOCK_BENCH_PG, else DISLOCK_TEST_PG (the benchmarks create a
# private database on it for the run and drop it at the end).
# MySQL / MariaDB: DISLOCK_BENCH_MYSQL, else DISLOCK_TEST_MYSQL (the
# benchmarks' tables and procedures carry the run's name and are dropped at
# the end; statement counts are the client's).
# Redis: DISLOCK_BENCH_REDIS; when unset, a private redis-server on a free
# loopback port, so that INFO commandstats and CPU counts see only this run.
# etcd: DISLOCK_BENCH_ETCD (an etcd:// URL); when unset, the benchmarks start
# a private embedded etcd (go.etcd.io/etcd/server/v3, the client's version)
# in a process of their own on loopback ports, stopped at the end.
# ZooKeeper: DISLOCK_BENCH_ZK (host:port); when unset, the benchmarks start
# a private standalone server (when installed: scripts/zookeeper.sh).
# Extra arguments go to `go test` (e.g. -bench Handoff, -benchtime 2s).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/port.sh

bash scripts/services.sh

PG_URL=${DISLOCK_BENCH_PG:-${DISLOCK_TEST_PG:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}}
export DISLOCK_BENCH_PG=$PG_URL

redis_pid=""
cleanup() { if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT

if [ -z "${DISLOCK_BENCH_REDIS:-}" ]; then
  if command -v redis-server >/dev/null; then
    port=$(free_port 16379 16399) || { echo "bench: no free port in 16379-16399 for a private redis-server" >&2; exit 1; }
    dir=$(mktemp -d)
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" \
      --logfile "$dir/redis.log" >/dev/null &
    redis_pid=$!
    for _ in $(seq 1 50); do
      timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null && break
      sleep 0.1
    done
    export DISLOCK_BENCH_REDIS="redis://127.0.0.1:$port/0"
  else
    export DISLOCK_BENCH_REDIS=${DISLOCK_TEST_REDIS:-redis://127.0.0.1:6379/0}
  fi
fi

redis_version() {
  local u=${DISLOCK_BENCH_REDIS#*://}; u=${u#*@}; u=${u%%/*}
  redis-cli -h "${u%%:*}" -p "${u##*:}" info server 2>/dev/null | tr -d '\r' | sed -n 's/^redis_version://p'
}

mysql_version() {
  local u=${DISLOCK_BENCH_MYSQL:-${DISLOCK_TEST_MYSQL-mysql://root@127.0.0.1:3306/test}}
  [[ $u == mysql://* || $u == mariadb://* ]] || return 1
  u=${u#*://}; local cred=""; [[ $u == *@* ]] && { cred=${u%%@*}; u=${u#*@}; }
  local hp=${u%%/*} user=${cred%%:*}; local port=${hp##*:}; [ "$port" = "$hp" ] && port=3306
  local cli; cli=$(command -v mariadb || command -v mysql) || return 1
  MYSQL_PWD=$([[ $cred == *:* ]] && echo "${cred#*:}") "$cli" -h "${hp%%:*}" -P "$port" -u "${user:-root}" -N -e 'SELECT VERSION()' 2>/dev/null
}

mkdir -p bench/results
out=bench/results/bench-$(date -u +%Y%m%dT%H%M%SZ).txt
{
  echo "date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine:  $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(uname -sr)"
  echo "load:     $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
  echo "go:       $(go version | cut -d' ' -f3-)"
  echo "postgres: $(psql "$PG_URL" -Atc 'SHOW server_version' 2>/dev/null || echo unknown)"
  echo "mysql:    $(mysql_version || echo unknown)"
  echo "redis:    $(redis_version || echo unknown)$([ -n "$redis_pid" ] && echo ' (private instance for this run)')"
  if [ -n "${DISLOCK_BENCH_ETCD:-}" ]; then
    echo "etcd:     DISLOCK_BENCH_ETCD"
  else
    echo "etcd:     $(cd bench && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3) (embedded, private for this run, no fsync)"
  fi
  if [ -n "${DISLOCK_BENCH_ZK:-}" ]; then
    echo "zk:       DISLOCK_BENCH_ZK"
  else
    echo "zk:       $(dpkg-query -W -f '${Version}' zookeeper 2>/dev/null || echo unknown) (private for this run, forceSync=no)"
  fi
  echo
} | tee "$out"

(cd bench && go test -run '^$' -bench . -benchtime 1s -count 1 -timeout 10m "$@" .) | tee -a "$out"

# Summary: each benchmark's own metrics, ratios first.
{
  echo
  echo "summary (x-rtt = ratio to the raw round trip measured in the same benchmark):"
  awk '/^Benchmark/ {
    name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
    line = sprintf("  %-34s", name)
    for (i = 5; i < NF; i += 2) if ($(i+1) != "ns/op") line = line sprintf("  %s %s", $i, $(i+1))
    print line
  }' "$out"
} | tee "$out.summary"
cat "$out.summary" >>"$out"
rm "$out.summary"
# The chart BENCHMARKS.md shows: dislock beside the peers, redrawn from a
# full run (one narrowed by arguments leaves it alone).
if [ "$#" -eq 0 ] && (cd bench && go run ./cmd/benchchart -o chart.svg "../$out"); then
  echo "chart written to bench/chart.svg"
fi
echo "results written to $out"
