# Sourced by scripts/test.sh: start_private_mariadb starts a MariaDB of this
# run's own (a fresh data directory, a free loopback port, root without a
# password, database `test`), exports MOLTLOCK_MYSQL_URL and stops the server
# when the calling shell exits.

start_private_mariadb() {
  local server dir port
  server=$(command -v mariadbd || command -v mysqld || echo /usr/sbin/mariadbd)
  dir=$(mktemp -d /tmp/moltlock-mariadb.XXXXXX)
  port=13306
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  local as_user=()
  [ "$(id -u)" = 0 ] && as_user=(--user=root)
  mariadb-install-db --no-defaults "${as_user[@]}" --datadir="$dir/data" \
    --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 || {
    cat "$dir/install.log"
    return 1
  }
  "$server" --no-defaults "${as_user[@]}" --datadir="$dir/data" --port="$port" \
    --bind-address=127.0.0.1 --socket="$dir/mysqld.sock" --skip-log-bin \
    >"$dir/server.log" 2>&1 &
  MOLTLOCK_MARIADB_PID=$!
  MOLTLOCK_MARIADB_DIR=$dir
  trap 'kill "$MOLTLOCK_MARIADB_PID" 2>/dev/null; wait "$MOLTLOCK_MARIADB_PID" 2>/dev/null; rm -rf "$MOLTLOCK_MARIADB_DIR"' EXIT
  local tries=0
  until mariadb --no-defaults -uroot -h127.0.0.1 -P"$port" -e "CREATE DATABASE IF NOT EXISTS test" 2>/dev/null; do
    tries=$((tries + 1))
    if [ "$tries" -gt 120 ]; then
      echo "the private MariaDB did not start; its log:" >&2
      tail -20 "$dir/server.log" >&2
      return 1
    fi
    sleep 0.5
  done
  export MOLTLOCK_MYSQL_URL="mysql://root@127.0.0.1:$port/test"
  echo "started a private MariaDB on 127.0.0.1:$port ($dir)"
}
