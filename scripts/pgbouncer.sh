#!/usr/bin/env bash
# Makes sure PgBouncer (Debian's pgbouncer package) is installed. The pg tests
# start a private pgbouncer from it, in transaction pooling mode on a loopback
# port, in front of DISLOCK_TEST_PG's server; nothing is started here, and the
# package's own service is kept from starting so it holds no port.
# Idempotent and quiet; installing needs root.
set -euo pipefail
. "$(dirname "$0")/apt.sh"

if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
  exit 0
fi
apt_need pgbouncer.sh PgBouncer pgbouncer
