#!/usr/bin/env bash
# The whole test suite (the README's test command): installs what it needs
# when missing, then runs the formatting and lint checks, the unit and
# integration tests (real binaries over real sockets; some need root, e.g.
# to mount a tmpfs workspace, and skip with a message without it, or fail
# under CI=true), the
# static musl build check, a short fuzz run of the archive extractor, and
# the benchmarks.
#
#   ./.ci/test-all.sh                    everything, benchmarks in short mode
#   BENCH=full ./.ci/test-all.sh         the full benchmarks (the README's figures)
#   SKIP_BENCH=1 ./.ci/test-all.sh       without the benchmarks
#   FUZZ_SECONDS=600 ./.ci/test-all.sh   a longer fuzz run (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

# Each step says when it starts (minutes:seconds since the start), so a run's
# log shows where the time goes.
step() { printf '\n==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# In CI (CI=true) every test runs: those that need root fail instead of
# skipping (tests/common root_or_skip), so say so now rather than after
# the build.
if [[ "${CI:-}" == "true" && "$(id -u)" != 0 ]]; then
  echo "CI=true: the test suite must run as root (its lease-boundary and isolation tests need it); run it as root, or without CI=true to skip them" >&2
  exit 1
fi

# A clean clone gains nothing from incremental compilation, and pays for
# it: the workspace's own crates build 79 → 68 s without it (test build).
if [[ "${CI:-}" == "true" ]]; then
  export CARGO_INCREMENTAL=0
fi

step "prerequisites"
./.ci/install-prereqs.sh
export SANDBOX_AGENT_MCP2_PYTHON=${SANDBOX_AGENT_MCP2_PYTHON:-/opt/sandbox-agent/clients/mcp2/bin/python}
export SANDBOX_AGENT_SERVERS_DIR=${SANDBOX_AGENT_SERVERS_DIR:-/opt/sandbox-agent/servers}
export SANDBOX_AGENT_WHEELS=${SANDBOX_AGENT_WHEELS:-/opt/sandbox-agent/wheels}

# The other shipped MCP servers (every_shipped_server_starts_and_answers)
# install while the code compiles; the tests wait for them.
mkdir -p target
./.ci/install-prereqs.sh --all-servers > target/install-all-servers.log 2>&1 &
all_servers=$!

step "cargo fmt --check"
cargo fmt --all --check
(cd fuzz && cargo fmt --check)

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --locked --workspace --all-targets -- -D warnings

step "cargo test --workspace"
# Builds every package's binaries too: the integration tests in tests/ run
# them from target/debug.
cargo test --locked --workspace --no-run

# The release builds of the later steps (the guest's static binaries, which
# the VM tests' image takes too; the host and the benchmarks; the fuzz
# target) are made meanwhile at the lowest priority, in the CPU time the
# tests leave idle while they wait on servers, VMs and deadlines. Cargo
# locks each profile's directory apart, so neither waits on the other; a
# VM test's image build that comes first waits for the release lock.
./.ci/release-builds.sh > target/release-builds.log 2>&1 &
release_builds=$!

if ! wait "$all_servers"; then
  cat target/install-all-servers.log >&2
  echo "installing the shipped MCP servers failed" >&2
  exit 1
fi
cargo test --locked --workspace

step "release builds (made during the tests)"
if ! wait "$release_builds"; then
  cat target/release-builds.log >&2
  echo "the release builds failed" >&2
  exit 1
fi
grep -E '^(==>|    Finished)' target/release-builds.log || true

step "static build (x86_64-unknown-linux-musl, the guest's binaries)"
# As the VM image builds them: the agent's package alone, so none of the
# host's crates can be unified into it (the VM test's image build is reused).
musl=x86_64-unknown-linux-musl
cargo build --locked --release --target $musl -p sandbox-agent -p sandboxctl
for bin in sandbox-agent sandboxctl; do
  f=target/$musl/release/$bin
  if readelf -lW "$f" | grep -q INTERP || readelf -dW "$f" | grep -q NEEDED; then
    echo "$f is dynamically linked" >&2
    exit 1
  fi
  echo "$f: statically linked, $(stat -c %s "$f") bytes"
done
# The workspace swap's test fault points exist in debug builds only.
if grep -q SANDBOX_AGENT_TEST_FAULT target/$musl/release/sandbox-agent; then
  echo "the release agent carries the test fault hook" >&2
  exit 1
fi

step "fuzz the archive extractor (${FUZZ_SECONDS:-30} s, asserting confinement)"
# cargo-fuzz wants nightly features; RUSTC_BOOTSTRAP enables them on the
# machine's stable toolchain. Leak checks are off: the decoder thread of an
# aborted extraction is detached by design and may still be exiting when
# the check runs (a 32-byte thread-local registration).
corpus=$(mktemp -d)
(cd fuzz && ASAN_OPTIONS=detect_leaks=0 RUSTC_BOOTSTRAP=1 cargo fuzz run extract "$corpus" seeds/extract -- \
  -max_total_time="${FUZZ_SECONDS:-30}" -rss_limit_mb=2048 -detect_leaks=0 -print_final_stats=1)
rm -rf "$corpus"

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  export BENCH=${BENCH:-short}
  step "cargo bench (BENCH=$BENCH; static release binaries; the full workspace bench needs ~6 GB of disk)"
  # The benches run the release binaries: the agent and sandboxctl built
  # above (the guest's own build), the host built here. Both commands
  # resolve features as the VM test's example server build did (-p
  # sandbox-suite -p sandbox-host, dev-dependencies on), so the shared
  # dependencies are compiled once.
  cargo build --locked --release --target $musl -p sandbox-suite -p sandbox-host \
    --bin sandbox-host --example mcp_notes
  cargo bench --locked --target $musl -p sandbox-suite -p sandbox-host
fi

step "all checks passed"
# The CPU time of every step (user, system; this shell's, then its
# children's): against twice the wall time, how busy the two cores were.
times
