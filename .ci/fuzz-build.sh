#!/usr/bin/env bash
# The fuzz target's build, as `cargo fuzz run` builds it (`.ci/test-all.sh`
# runs this beside the tests, at nice 19), with its own release profile
# whatever the static build's (test-all.sh lightens that one in the short
# mode): fuzzing at opt-level 0 runs five times fewer inputs in the same
# seconds (docs/testing.md). Never linted: the debug build is.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS CARGO_PROFILE_RELEASE_LTO CARGO_PROFILE_RELEASE_CODEGEN_UNITS \
  CARGO_PROFILE_RELEASE_OPT_LEVEL
say() { printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
say "cargo fuzz build extract"
RUSTC_BOOTSTRAP=1 cargo fuzz build extract
say done
