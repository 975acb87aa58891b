#!/usr/bin/env bash
# Makes sure the ZooKeeper server (Debian's zookeeper package: ZooKeeper 3.8
# on Java 17) is installed. The zklock tests start private servers from it on
# loopback ports; nothing is started here, and systemd is not used.
# Idempotent and quiet; installing needs root.
set -euo pipefail
. "$(dirname "$0")/apt.sh"

if command -v java >/dev/null 2>&1 && [ -f /usr/share/java/zookeeper.jar ]; then
  exit 0
fi
apt_need zookeeper.sh ZooKeeper zookeeper
