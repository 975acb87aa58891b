#!/usr/bin/env bash
# Makes sure the ZooKeeper server (Debian's zookeeper package: ZooKeeper 3.8
# on Java 17) is installed. The zklock tests start private servers from it on
# loopback ports; nothing is started here, and systemd is not used.
# Idempotent and quiet; installing needs root.
set -euo pipefail

if command -v java >/dev/null 2>&1 && [ -f /usr/share/java/zookeeper.jar ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "zookeeper.sh: ZooKeeper is not installed and this is not root: run apt-get install zookeeper" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq zookeeper >/dev/null
