#!/usr/bin/env bash
# Makes sure PgBouncer (Debian's pgbouncer package) is installed. The pg tests
# start a private pgbouncer from it, in transaction pooling mode on a loopback
# port, in front of DISLOCK_TEST_PG's server; nothing is started here, and the
# package's own service is stopped and disabled so it holds no port.
# Idempotent and quiet; installing needs root.
set -euo pipefail

if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "pgbouncer.sh: PgBouncer is not installed and this is not root: run apt-get install pgbouncer" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
# policy-rc.d keeps the package's service from starting during the install.
policy=/usr/sbin/policy-rc.d
created=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
fi
apt-get install -y -qq pgbouncer >/dev/null
if [ -n "$created" ]; then rm -f "$policy"; fi
