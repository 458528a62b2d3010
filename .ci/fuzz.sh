#!/usr/bin/env bash
# The archive extractor's fuzz target (fuzz/), built and run with the same
# flags, so the run finds the build done:
#
#   .ci/fuzz.sh build          (.ci/test-all.sh runs it beside the tests,
#                              at nice 19)
#   .ci/fuzz.sh run [SECONDS]  fuzzes for SECONDS (default 30), asserting
#                              confinement (fuzz_targets/extract.rs)
#
# The fuzz workspace's own release profile, whatever the static build's:
# fuzzing at opt-level 0 runs five times fewer inputs in the same seconds.
# 16 codegen units, zstd's C code at -O0 (fuzz/Cargo.toml) and Debian's
# prebuilt libFuzzer (libfuzzer-14-dev, through libfuzzer-sys's
# CUSTOM_LIBFUZZER_PATH) instead of compiling its C++: 82 CPU-seconds
# instead of 155 (zstd at -O1: 37; libFuzzer: 40), at the same rate of
# inputs (docs/testing.md).
# Never linted: the debug build is. cargo-fuzz wants nightly features;
# RUSTC_BOOTSTRAP enables them on the machine's stable toolchain.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
export RUSTC_BOOTSTRAP=1
if [ -z "${CUSTOM_LIBFUZZER_PATH:-}" ]; then
  lib=$(compgen -G '/usr/lib/llvm-*/lib/libFuzzer.a' | sort -V | tail -1 || true)
  [ -n "$lib" ] || { echo "no /usr/lib/llvm-*/lib/libFuzzer.a: apt-get install libfuzzer-14-dev (.ci/install-prereqs.sh)" >&2; exit 1; }
  export CUSTOM_LIBFUZZER_PATH=$lib
fi
flags=(extract --codegen-units 16)
say() { printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
case "${1:-}" in
  build)
    say "cargo fuzz build ${flags[*]}"
    cargo fuzz build "${flags[@]}"
    say done
    ;;
  run)
    # Leak checks are off: the decoder thread of an aborted extraction is
    # detached by design and may still be exiting when the check runs (a
    # 32-byte thread-local registration).
    corpus=$(mktemp -d)
    trap 'rm -rf "$corpus"' EXIT
    ASAN_OPTIONS=detect_leaks=0 cargo fuzz run "${flags[@]}" "$corpus" seeds/extract -- \
      -max_total_time="${2:-30}" -rss_limit_mb=2048 -detect_leaks=0 -print_final_stats=1
    ;;
  *)
    echo "usage: $0 build | run [SECONDS]" >&2
    exit 2
    ;;
esac
