#!/usr/bin/env bash
# Runs the guides' examples (moltlock/examples, docs/*.md) as the guides
# tell a reader to, each in a scratch directory of its own on SQLite files
# (the fencing example once more with its row in Postgres where
# MOLTLOCK_POSTGRES_URL names one), and the cron job under `moltlock run` as
# docs/CRON.md does. Any example
# that fails, or exits non-zero, fails the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
cargo build --quiet --workspace --all-features --examples --bins

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
unset MOLTLOCK_URL
for example in "$root"/moltlock/examples/*.rs; do
  name=$(basename "$example" .rs)
  [ "$name" = cron_job ] && continue
  mkdir "$scratch/$name"
  echo "moltlock/examples/$name.rs:"
  (cd "$scratch/$name" && "$bin/examples/$name")
done

if [ -n "${MOLTLOCK_POSTGRES_URL:-}" ]; then
  echo "moltlock/examples/fencing.rs with the row in Postgres:"
  (cd "$scratch" && REPORTS_URL="$MOLTLOCK_POSTGRES_URL" "$bin/examples/fencing")
fi

echo "moltlock/examples/cron_job.rs under moltlock run:"
mkdir "$scratch/cron_job"
(cd "$scratch/cron_job" &&
  JOB_DB="$scratch/cron_job/job.db" JOB_STEPS=1 "$bin/moltlock" \
    --url "sqlite://$scratch/cron_job/locks.db" run --key jobs/cron-demo --no-wait -- \
    "$bin/examples/cron_job")
