#!/usr/bin/env bash
# Runs the whole test suite against real servers. Installs what is missing,
# points the tests at the machine's shared Redis, Postgres and MariaDB when
# they answer, and lets the fixtures (tests/fixtures) start their own
# servers otherwise (etcd always). Without this script the tests pass as
# well: every fixture then starts a server of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

# Tests and examples keep their scratch files (the README's SQLite files
# among them: its examples also run as doctests) in a temporary directory
# of the run's own, removed at the end.
# Open to every user as /tmp is: fixtures run servers as their own users
# (initdb and postgres as `postgres` when run as root).
run_tmp=$(mktemp -d)
chmod 1777 "$run_tmp"
export TMPDIR="$run_tmp"
trap 'rm -rf "$run_tmp"' EXIT

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [ -z "${MOLTLOCK_REDIS_URL:-}" ] && port_open 6379; then
  export MOLTLOCK_REDIS_URL=redis://127.0.0.1:6379/
fi
if [ -z "${MOLTLOCK_POSTGRES_URL:-}" ] && port_open 5432; then
  export MOLTLOCK_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test
fi
if [ -z "${MOLTLOCK_MYSQL_URL:-}" ] && port_open 3306; then
  export MOLTLOCK_MYSQL_URL=mysql://root@127.0.0.1:3306/test
fi
echo "shared stores: redis=${MOLTLOCK_REDIS_URL:-fixture} postgres=${MOLTLOCK_POSTGRES_URL:-fixture} mysql=${MOLTLOCK_MYSQL_URL:-fixture}"

# The declared minimum Rust version against the locked dependencies (what
# it checks and what it cannot: scripts/msrv.sh).
bash scripts/msrv.sh

# The API documentation builds without a warning (broken or private links,
# two crates writing one page).
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --workspace --all-features --no-deps

# Every crate we publish ships the README and both license files (the
# facade's documentation is its README, included from inside the package).
for crate in moltlock moltlock-core moltlock-sql moltlock-redis moltlock-etcd moltlock-cli moltlock-conformance; do
  files=$(cargo package --list --allow-dirty -p "$crate")
  for file in README.md LICENSE-MIT LICENSE-APACHE; do
    if ! grep -qx "$file" <<<"$files"; then
      echo "the package of $crate lacks $file" >&2
      exit 1
    fi
  done
done

# A default build (SQLite only) compiles no TLS stack: TLS comes with the
# network stores' features.
for crate in moltlock moltlock-cli; do
  tls=$(cargo tree -p "$crate" -e no-dev --prefix none |
    grep -Ei '^(rustls|ring|rustls-webpki|webpki-roots|openssl|native-tls)[^ ]* v' |
    sed 's/ (\*)$//' | sort -u || true)
  if [ -n "$tls" ]; then
    echo "$crate with default features pulls in a TLS stack:" >&2
    echo "$tls" >&2
    exit 1
  fi
done

cargo test --workspace --all-features --no-fail-fast "$@"
# The facade once more with its default features (SQLite only), so URLs of
# backends that are not compiled in are checked to name their feature.
cargo test -p moltlock --test connect "$@"
# The guides' examples run as the guides say, and the README's examples
# run pasted into fresh crates with the README's dependency lines.
bash scripts/examples.sh
if [ -n "${MOLTLOCK_ETCD_URL:-}" ]; then
  bash scripts/readme-crate.sh
else
  # A private etcd for the README's etcd example, stopped afterwards.
  for port in $(seq 23900 2 23998); do
    port_open "$port" || port_open $((port + 1)) || break
  done
  etcd_dir=$(mktemp -d)
  peer="http://127.0.0.1:$((port + 1))"
  etcd --data-dir "$etcd_dir/data" --name readme \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "readme=$peer" >"$etcd_dir/log" 2>&1 &
  etcd_pid=$!
  # (set -e holds inside the trap: a stopped etcd's status must not become ours.)
  trap 'kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; rm -rf "$etcd_dir" "$run_tmp"' EXIT
  for _ in $(seq 100); do port_open "$port" && break; sleep 0.1; done
  MOLTLOCK_ETCD_URL="etcd://127.0.0.1:$port" bash scripts/readme-crate.sh
fi
