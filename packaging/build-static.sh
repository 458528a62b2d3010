#!/usr/bin/env bash
# The workspace's static release builds, each one cargo command, so that
# every dependency is compiled once, with one set of features.
#
#   packaging/build-static.sh           the guest's binaries: sandbox-agent,
#                                       sandboxctl and the test VM's MCP
#                                       server mcp_notes (the VM images, the
#                                       static check)
#   packaging/build-static.sh --bench   every release binary: those, and
#                                       sandbox-host with its kubernetes
#                                       backend; then the benchmarks'
#                                       binary (`cargo bench --no-run`)
#   packaging/build-static.sh --print   the --bench mode's two commands
#
# SANDBOX_STATIC_PROFILE=light (the test command's short mode, through
# .ci/lib.sh light_static_env; the VM tests' image scripts inherit it)
# builds what CI checks of the guest (it links statically, carries no test
# hook, boots as the VMs' init and serves their tests), not the shipped
# binaries' speed or size: the release profile at opt-level 0 for every
# package (zstd's C code too), without LTO. 2.5 CPU-minutes instead of
# 9.6 (docs/testing.md). Into the same
# directory: a light build replaces a shipped one, and back.
# The binaries land in target/x86_64-unknown-linux-musl/release/. Cargo
# unifies a dependency's features over the packages of one command, so a
# build of another subset (the agent alone) resolves some of them
# differently (tracing, tokio-util, tower, regex, …) and compiles most of
# the tree again. The VM images' scripts (packaging/vm/) and .ci/ build
# through this script, never with a cargo command of their own. The bench
# command names the same packages as the build before it; the suite's
# dev-dependencies add no feature to theirs (`--unit-graph` of both: the
# same units), so it compiles the bench binary alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=x86_64-unknown-linux-musl
guest=(-p sandbox-agent -p sandboxctl -p mcp-notes)
all=("${guest[@]}" -p sandbox-host)
build=(cargo build --locked --release --target $target)
case "${SANDBOX_STATIC_PROFILE:-shipped}" in
  shipped) ;;
  light)
    # Every package at opt-level 0, the ones Cargo.toml raises included.
    for c in profile.release.lto=false profile.release.codegen-units=16 profile.release.opt-level=0 \
      profile.release.package.{zstd-sys,zlib-rs,sha2,tar,flate2,sandbox-archive}.opt-level=0; do
      build+=(--config "$c")
    done
    ;;
  *)
    echo "SANDBOX_STATIC_PROFILE: '$SANDBOX_STATIC_PROFILE' is neither 'shipped' nor 'light'" >&2
    exit 2
    ;;
esac
bench=(cargo bench --locked --target $target -p sandbox-suite "${all[@]}" --features kubernetes)

mode=${1:-}
case "$mode" in
  --print)
    echo "${build[*]} ${all[*]} --features sandbox-host/kubernetes"
    echo "${bench[*]}"
    exit 0
    ;;
  --bench | "") ;;
  *)
    echo "usage: $0 [--bench | --print]" >&2
    exit 2
    ;;
esac
cd "$root"
# Never linted, whoever calls (a test run's clippy driver would change
# every workspace crate's fingerprint): the debug build is. Nor with
# RUSTC_BOOTSTRAP, which a test process may carry (.ci/test-runner): it too
# changes every fingerprint.
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS RUSTC_BOOTSTRAP
if [ "$mode" = --bench ]; then
  "${build[@]}" "${all[@]}" --features sandbox-host/kubernetes
  "${bench[@]}" --no-run
else
  "${build[@]}" "${guest[@]}"
fi
