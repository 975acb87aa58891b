#!/usr/bin/env bash
# Makes sure the PostgreSQL, Redis and MariaDB servers the tests use answer:
# starts them when they do not, and installs them with apt-get when they are
# missing and this runs as root. Reads DISLOCK_TEST_PG / DISLOCK_TEST_REDIS /
# DISLOCK_TEST_MYSQL (set empty: MySQL is not tested, nor started).
set -euo pipefail

PG_URL=${DISLOCK_TEST_PG:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
REDIS_URL=${DISLOCK_TEST_REDIS:-redis://127.0.0.1:6379/0}
MYSQL_URL=${DISLOCK_TEST_MYSQL-mysql://root@127.0.0.1:3306/test}

log() { printf 'services: %s\n' "$*" >&2; }

# host and port from a URL, without printing credentials.
url_host() { local u=${1#*://}; u=${u#*@}; u=${u%%/*}; u=${u%%\?*}; echo "${u%%:*}"; }
url_port() { local u=${1#*://}; u=${u#*@}; u=${u%%/*}; u=${u%%\?*}; [[ $u == *:* ]] && echo "${u##*:}" || echo "$2"; }

reachable() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

wait_for() { # host port name
  for _ in $(seq 1 60); do reachable "$1" "$2" && return 0; sleep 0.5; done
  log "$3 did not come up on $1:$2"; return 1
}

apt_updated=""
apt_install() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "cannot install $* here: install it (Debian/Ubuntu: apt-get install $*) and start it, or point ${ENV_HINT} at a running server"
    return 1
  fi
  if [ -z "$apt_updated" ]; then DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_redis() {
  local host port; host=$(url_host "$REDIS_URL"); port=$(url_port "$REDIS_URL" 6379)
  if reachable "$host" "$port"; then return 0; fi
  case $host in 127.*|localhost) ;; *) log "Redis at $host:$port is not reachable and is not local; start it"; return 1 ;; esac
  ENV_HINT=DISLOCK_TEST_REDIS
  command -v redis-server >/dev/null || apt_install redis-server redis-tools
  log "starting redis-server on port $port"
  mkdir -p /tmp/dislock-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    --dir /tmp/dislock-redis --logfile /tmp/dislock-redis/redis.log
  wait_for "$host" "$port" Redis
}

ensure_pg() {
  local host port; host=$(url_host "$PG_URL"); port=$(url_port "$PG_URL" 5432)
  if ! reachable "$host" "$port"; then
    case $host in 127.*|localhost) ;; *) log "PostgreSQL at $host:$port is not reachable and is not local; start it"; return 1 ;; esac
    ENV_HINT=DISLOCK_TEST_PG
    if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then apt_install postgresql; fi
    if command -v pg_ctlcluster >/dev/null && [ -n "$(ls /etc/postgresql 2>/dev/null)" ]; then
      local ver; ver=$(ls /etc/postgresql | sort -V | tail -1)
      log "starting PostgreSQL $ver cluster main"
      pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
    else
      log "no PostgreSQL cluster found; install postgresql-common and create one (pg_createcluster)"
      return 1
    fi
    wait_for "$host" "$port" PostgreSQL
  fi
  # Trust auth for local TCP and the test database (a fresh Debian install uses
  # scram for TCP and has no database "test").
  local db; db=${PG_URL##*/}; db=${db%%\?*}; db=${db:-test}
  if [ "$(id -u)" = 0 ] && command -v psql >/dev/null && id postgres >/dev/null 2>&1; then
    if ! psql "$PG_URL" -Atc 'select 1' >/dev/null 2>&1; then
      local hba; hba=$(su postgres -c "psql -Atc 'show hba_file'" 2>/dev/null || true)
      if [ -n "$hba" ] && ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
        log "allowing trust auth for 127.0.0.1 in $hba"
        sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
        su postgres -c "psql -Atc 'select pg_reload_conf()'" >/dev/null
      fi
      su postgres -c "psql -Atc \"select 1 from pg_database where datname='$db'\"" | grep -q 1 ||
        su postgres -c "createdb '$db'" || true
    fi
  fi
}

# host, port and database of a mysql:// URL or a go-sql-driver DSN
# (user:password@tcp(host:port)/db), without printing credentials; empty
# for a Unix socket DSN.
mysql_part() { # url part(host|port|db)
  local u=$1 hp db
  if [[ $u == mysql://* || $u == mariadb://* ]]; then
    u=${u#*://}; hp=${u%%/*}; hp=${hp##*@}; db=${u#*/}; [[ $u == */* ]] || db=""
  elif [[ $u == *"tcp("* ]]; then
    hp=${u##*tcp(}; hp=${hp%%)*}; db=${u##*)/}
  else
    return 0
  fi
  db=${db%%\?*}
  case $2 in
    host) echo "${hp%%:*}" ;;
    port) [[ $hp == *:* ]] && echo "${hp##*:}" || echo 3306 ;;
    db) echo "${db:-test}" ;;
  esac
}

ensure_mysql() {
  if [ -z "$MYSQL_URL" ]; then log "DISLOCK_TEST_MYSQL is set empty: MySQL is not tested"; return 0; fi
  local host port db; host=$(mysql_part "$MYSQL_URL" host); port=$(mysql_part "$MYSQL_URL" port); db=$(mysql_part "$MYSQL_URL" db)
  if [ -z "$host" ]; then return 0; fi # a Unix socket: the tests say when it does not answer
  ENV_HINT=DISLOCK_TEST_MYSQL
  if ! reachable "$host" "$port"; then
    case $host in 127.*|localhost) ;; *) log "MySQL at $host:$port is not reachable and is not local; start it"; return 1 ;; esac
    [ -x /usr/sbin/mariadbd ] || [ -x /usr/sbin/mysqld ] || apt_install mariadb-server
    local bin=/usr/sbin/mariadbd; [ -x $bin ] || bin=/usr/sbin/mysqld
    log "starting $(basename $bin) on port $port"
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    if [ ! -d /var/lib/mysql/mysql ] && command -v mariadb-install-db >/dev/null; then
      mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    start-stop-daemon --start --oknodo --background --exec "$bin" -- --user=mysql --bind-address=127.0.0.1 --port="$port"
    wait_for "$host" "$port" MariaDB
  fi
  # A fresh Debian install lets root in only through the Unix socket: let the
  # tests' root in over TCP from 127.0.0.1 without a password, and create
  # the test database.
  local cli; cli=$(command -v mariadb || command -v mysql || true)
  if [ "$(id -u)" = 0 ] && [ -n "$cli" ] && [ "$port" = 3306 ] && [[ $host == 127.* || $host == localhost ]]; then
    if [[ $MYSQL_URL == mysql://root@* || $MYSQL_URL == mariadb://root@* || $MYSQL_URL == root@tcp* ]] &&
      ! "$cli" -uroot -h127.0.0.1 -P"$port" -e 'select 1' >/dev/null 2>&1; then
      log "allowing root over TCP from 127.0.0.1 without a password"
      "$cli" -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY ''; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION" || true
    fi
    "$cli" -e "CREATE DATABASE IF NOT EXISTS \`$db\`" 2>/dev/null ||
      "$cli" -uroot -h127.0.0.1 -P"$port" -e "CREATE DATABASE IF NOT EXISTS \`$db\`" >/dev/null 2>&1 || true
  fi
}

ensure_tools() {
  # The Redis Cluster tests start private redis-server processes and need redis-cli.
  if ! command -v redis-cli >/dev/null || ! command -v redis-server >/dev/null; then
    ENV_HINT=DISLOCK_TEST_REDIS apt_install redis-server redis-tools || true
  fi
  # The chaos crash tier initdbs a private PostgreSQL server of its own.
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
    ENV_HINT=DISLOCK_TEST_PG apt_install postgresql || true
  fi
  # The chaos tier starts private MariaDB servers of its own (faults, kill -9).
  if [ ! -x /usr/sbin/mariadbd ] && [ ! -x /usr/sbin/mysqld ]; then
    ENV_HINT=DISLOCK_TEST_MYSQL apt_install mariadb-server || true
  fi
}

ensure_redis
ensure_pg
ensure_mysql
ensure_tools
log "PostgreSQL, Redis and MariaDB answer"
