#!/usr/bin/env bash
# Checks the workspace's minimum supported Rust version (rust-version in
# Cargo.toml):
#   1. no package in Cargo.lock declares a rust-version above ours (so no
#      locked dependency has told its users it needs a newer compiler);
#   2. the whole workspace (all features, all targets, the locked
#      dependencies) compiles with that exact toolchain (`cargo check`,
#      installed through rustup when missing), in a target directory of its
#      own;
#   3. clippy's `incompatible_msrv` lint (denied in the workspace lints,
#      run by CI's clippy step) refuses any standard-library item that was
#      stabilised after our rust-version, with the newer toolchain too.
# Not checked: code generation with the old toolchain (`check` stops before
# it), which the language never makes depend on the version.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v jq >/dev/null 2>&1 || { echo "msrv: jq is needed (scripts/install-deps.sh)" >&2; exit 1; }

metadata=$(cargo metadata --format-version 1 --locked --all-features)
ours=$(jq -r '[.packages[] | select(.id as $id | $ARGS.named.ws | index($id)) | .rust_version] | unique | .[]' \
  --argjson ws "$(jq -c '.workspace_members' <<<"$metadata")" <<<"$metadata")
if [ "$(wc -l <<<"$ours")" != 1 ] || [ -z "$ours" ] || [ "$ours" = null ]; then
  echo "msrv: the workspace members must all declare one rust-version, got: $ours" >&2
  exit 1
fi

# Versions as comparable numbers: 1.89 -> 1008900000, 1.89.1 -> 1008900001.
too_new=$(jq -r --arg ours "$ours" '
  def num: split(".") | map(tonumber) | .[0] * 1000000000 + (.[1] // 0) * 100000 + (.[2] // 0);
  ($ours | num) as $limit
  | .workspace_members as $ws
  | .packages[]
  | select(.rust_version != null)
  | select(.id as $id | $ws | index($id) | not)
  | select((.rust_version | num) > $limit)
  | "\(.name) \(.version) needs rust \(.rust_version)"' <<<"$metadata")
if [ -n "$too_new" ]; then
  echo "msrv: these locked dependencies need a newer Rust than our rust-version $ours:" >&2
  echo "$too_new" >&2
  exit 1
fi
count=$(jq '[.packages[] | select(.rust_version != null)] | length' <<<"$metadata")
echo "msrv: rust-version $ours; no locked package (of $count declaring one) asks for more"

command -v rustup >/dev/null 2>&1 || { echo "msrv: rustup is needed to compile with Rust $ours" >&2; exit 1; }
if ! rustup run "$ours" rustc --version >/dev/null 2>&1; then
  rustup toolchain install "$ours" --profile minimal
fi
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/msrv" \
  cargo "+$ours" check --quiet --workspace --all-features --all-targets --locked
echo "msrv: the workspace compiles with Rust $ours"
