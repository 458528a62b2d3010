#!/usr/bin/env bash
# The whole test suite (the README's test command): installs what it needs
# when missing, then checks the formatting, builds the debug tree once
# (clippy linting the workspace's crates as they compile), builds and
# checks the static musl binaries, runs the unit and integration tests
# (real binaries over real sockets; some need root, e.g. to mount a tmpfs
# workspace, and skip with a message without it, or fail under CI=true)
# with the kubernetes backend's, and beside them the VM tests, the short
# benchmarks and the fuzz target's build; then fuzzes the archive
# extractor briefly. At the end: each step's wall and CPU time, and the 20
# slowest tests.
#
#   ./.ci/test-all.sh                    everything, benchmarks in short mode
#   BENCH=full ./.ci/test-all.sh         the full benchmarks (the README's figures)
#   SKIP_BENCH=1 ./.ci/test-all.sh       without the benchmarks
#   FUZZ_SECONDS=600 ./.ci/test-all.sh   a longer fuzz run (default 30)
#
# The author's fast loop is ./.ci/quick.sh (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/lib.sh
mkdir -p target/ci-times
trap 'rc=$?; if [ "$rc" != 0 ]; then end_background; fi; steps_report' EXIT

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
./.ci/install-prereqs.sh --all-servers > target/install-all-servers.log 2>&1 &
all_servers=$!

step "cargo fmt --check"
cargo fmt --all --check
(cd fuzz && cargo fmt --check)

# Every package, every target, the kubernetes backend on: the one debug
# build of the run, linted as `cargo clippy --workspace --all-targets
# --features kubernetes -- -D warnings` would.
lint_env
features=(--workspace --features kubernetes)
step "debug build, linted (clippy -D warnings on every workspace target)"
cargo test --locked "${features[@]}" --all-targets --no-run

# The static release build, alone, right after the debug build: two
# builds side by side, or one beside the tests, each take far more CPU
# than alone on these two cores (the guest's static build: 7.5
# CPU-minutes alone, 18 minutes of wall and some 15 CPU-minutes beside the
# tests; docs/benchmarks.md), and the VM tests wait for it.
#
# In the short mode it checks what CI needs of it, not the shipped
# binaries' speed or size (SANDBOX_STATIC_PROFILE=light: opt-level 0, no
# LTO; packaging/build-static.sh says more), 4.4 CPU-minutes instead of
# 9.6. Set for the VM tests too, whose image scripts build through the
# same command. BENCH=full builds and measures the shipped profile, every
# binary and the bench's.
export BENCH=${BENCH:-short}
step "static build (packaging/build-static.sh: the guest's binaries, for the static check and the VM images)"
if [ "$BENCH" = short ]; then
  light_static_env
  packaging/build-static.sh
else
  packaging/build-static.sh --bench
fi

step "static build check (x86_64-unknown-linux-musl, the guest's binaries)"
musl=x86_64-unknown-linux-musl
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

# Beside the tests, which leave CPU idle while they wait on servers,
# deadlines and VMs: the VM tests (their image build finds the static
# build done), the fuzz target's build at nice 19 (it fills idle CPU only;
# nothing waits for it but the fuzz run at the end) and, in the short
# mode, the benches (a smoke check; their figures are the full mode's).
background vm-tests target/test-vm.log \
  cargo test --locked "${features[@]}" --test vm -- "${TEST_ARGS[@]}"
background fuzz-build target/fuzz-build.log nice -n 19 .ci/fuzz.sh build
if [ "${SKIP_BENCH:-0}" != 1 ] && [ "$BENCH" = short ]; then
  # The bench binary and the binaries it runs are the debug build's.
  background benches-short target/bench-short.log \
    cargo test --locked "${features[@]}" --bench all
fi

if ! wait "$all_servers"; then
  cat target/install-all-servers.log >&2
  echo "installing the shipped MCP servers failed" >&2
  exit 1
fi
step "cargo test (all but the VM tests, which run beside)"
cargo test --locked "${features[@]}" --lib --bins --tests -- "${TEST_ARGS[@]}" \
  --skip vm::the_agent_runs_a_vm_as_init_over_real_vsock \
  --skip host_vm::the_qemu_backend_serves_the_api_from_vms 2>&1 | tee target/test-rest.log
cargo test --locked "${features[@]}" --doc

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  if [ "$BENCH" = short ]; then
    step "benchmarks, short mode (BENCH=short: every bench once, on the debug build, beside the tests; figures: BENCH=full)"
    background_wait benches-short target/bench-short.log
    cat target/bench-short.log
  else
    # The full benchmarks run alone, on the static release binaries
    # built above (packaging/build-static.sh --bench).
    step "benchmarks (BENCH=$BENCH; static release binaries; the full workspace bench needs ~6 GB of disk)"
    (unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS && $(packaging/build-static.sh --print | tail -1))
  fi
fi

step "the VM tests (run beside the others)"
background_wait vm-tests target/test-vm.log
cat target/test-vm.log

step "the fuzz target's build (made beside the tests)"
background_wait fuzz-build target/fuzz-build.log
grep -E '^(==>|    Finished)' target/fuzz-build.log || true

step "fuzz the archive extractor (${FUZZ_SECONDS:-30} s, asserting confinement)"
.ci/fuzz.sh run "${FUZZ_SECONDS:-30}"

step "all checks passed"
step_end
slow_tests target/test-rest.log target/test-vm.log
