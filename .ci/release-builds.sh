#!/usr/bin/env bash
# The release builds of the test command's later steps (`.ci/test-all.sh`
# runs this beside the debug build and the tests): the workspace's
# one static build (packaging/build-static.sh, the same command the VM
# images are built with; with the benchmarks' binaries for BENCH=full),
# then the fuzz target (as `cargo fuzz run` builds it). Never linted: the
# debug build is.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
say() { printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
# The full benchmarks' binaries too (BENCH=full); the short mode runs on
# the debug build.
if [ "${BENCH:-short}" != short ] && [ "${SKIP_BENCH:-0}" != 1 ]; then
  say "packaging/build-static.sh --bench"
  packaging/build-static.sh --bench
else
  say "packaging/build-static.sh"
  packaging/build-static.sh
fi
# The fuzz target with its own release profile, whatever the static build's
# (test-all.sh lightens that one in the short mode): fuzzing at opt-level 0
# or 1 runs several times fewer inputs in the same seconds.
say "cargo fuzz build extract"
(cd fuzz && unset CARGO_PROFILE_RELEASE_LTO CARGO_PROFILE_RELEASE_CODEGEN_UNITS CARGO_PROFILE_RELEASE_OPT_LEVEL \
  && RUSTC_BOOTSTRAP=1 cargo fuzz build extract)
say done
