#!/usr/bin/env bash
# What the etcd tests need: they run embedded etcd servers (the
# go.etcd.io/etcd/server/v3 module, pinned in etcdlock/etcdtest/go.mod), so
# the install is the module download. Idempotent and quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
(cd etcdlock/etcdtest && go mod download)
