# Sourced by the scripts that make sure a Debian package the tests use is
# installed (pgbouncer.sh, zookeeper.sh).

# apt_need SCRIPT WHAT PACKAGE installs PACKAGE quietly, with its services
# kept from starting (policy-rc.d) so that it holds no port; without root it
# exits 1 saying what to run.
apt_need() {
  local script=$1 what=$2 pkg=$3
  if [ "$(id -u)" -ne 0 ]; then
    echo "$script: $what is not installed and this is not root: run apt-get install $pkg" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  local policy=/usr/sbin/policy-rc.d created=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
  fi
  apt-get install -y -qq "$pkg" >/dev/null
  if [ -n "$created" ]; then rm -f "$policy"; fi
}
