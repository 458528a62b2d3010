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
