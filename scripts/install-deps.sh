#!/usr/bin/env bash
# Installs the system packages the build and the tests need, when missing:
# etcd (server binary for test fixtures), protoc (the etcd client's build),
# redis-server and PostgreSQL binaries (fixtures start their own instances),
# libfaketime (a Postgres whose clock is skewed), MariaDB (the MySQL
# fixture starts a private server when no MOLTLOCK_MYSQL_URL is given) and
# jq (scripts/msrv.sh reads cargo metadata with it).
set -euo pipefail
missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
command -v mariadb-install-db >/dev/null 2>&1 || missing+=(mariadb-server)
command -v jq >/dev/null 2>&1 || missing+=(jq)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "installing: ${missing[*]}"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${missing[@]}"
fi
