#!/usr/bin/env bash
# Pastes every example of README.md into fresh crates, as a newcomer would,
# and runs it. Each ```rust block goes into the crate made of the nearest
# ```toml block above it that names `moltlock` or `moltlock-core`: those
# dependency lines exactly, with the version of our own crates pointed at
# this checkout (the only edit). The examples use SQLite files, and Redis,
# Postgres or etcd where MOLTLOCK_REDIS_URL / MOLTLOCK_POSTGRES_URL /
# MOLTLOCK_ETCD_URL name one (scripts/test.sh starts an etcd for them).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
# The workspace's dependencies build without debug info (Cargo.toml): the
# fresh crates' builds do the same, so they reuse what they can and add
# little to the target directory.
export CARGO_PROFILE_DEV_DEBUG=false
out="$CARGO_TARGET_DIR/readme-crates"
rm -rf "$out"
mkdir -p "$out"
# The examples keep their SQLite files in the temporary directory, as a
# reader's would: here one of the run's own, removed at the end.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# One directory per dependency block: deps.toml and examples/readme_<line>.rs.
awk -v out="$out" '
  /^```/ {
    if (!open) { open = 1; lang = substr($0, 4); start = NR; text = ""; next }
    open = 0
    if (lang == "toml" && text ~ /(^|\n)moltlock(-core)? = /) {
      crate = out "/crate_" start
      system("mkdir -p " crate "/examples")
      printf "%s", text > (crate "/deps.toml"); close(crate "/deps.toml")
    } else if (lang == "rust" && crate != "") {
      file = crate "/examples/readme_" start ".rs"
      printf "%s", text > file; close(file)
    }
    next
  }
  open { text = text $0 "\n" }
' README.md

ran=0
for crate in "$out"/crate_*; do
  [ -n "$(ls "$crate/examples")" ] || continue
  deps=$(sed -e "s|^moltlock = { version = \"0.1\"|moltlock = { path = \"$root/moltlock\"|" \
             -e "s|^moltlock-core = \"0.1\"|moltlock-core = { path = \"$root/moltlock-core\" }|" \
             -e "s|^moltlock-conformance = \"0.1\"|moltlock-conformance = { path = \"$root/tests/conformance\" }|" \
             "$crate/deps.toml")
  if grep -Eq '^moltlock[a-z-]* = ("0|\{ version)' <<<"$deps"; then
    echo "README.md: a dependency line of ours this script cannot point at the checkout:" >&2
    grep -E '^moltlock' <<<"$deps" >&2
    exit 1
  fi
  name=$(basename "$crate" | tr _ -)
  printf '[package]\nname = "readme-%s"\nversion = "0.0.0"\nedition = "2024"\npublish = false\n\n[workspace]\n\n%s\n' \
    "$name" "$deps" > "$crate/Cargo.toml"
  # The checkout's versions of every dependency, so nothing new is fetched.
  cp "$root/Cargo.lock" "$crate/Cargo.lock"
  for example in "$crate"/examples/*.rs; do
    example=$(basename "$example" .rs)
    echo "README.md line ${example#readme_}, with the dependencies of line ${name#crate-}:"
    (cd "$crate" && TMPDIR="$scratch" cargo run --quiet --example "$example")
    ran=$((ran + 1))
  done
done
[ "$ran" -gt 0 ] || { echo "README.md: no example found" >&2; exit 1; }
echo "$ran README examples ran in fresh crates"
