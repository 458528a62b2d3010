#!/usr/bin/env bash
# The release builds of the test command's later steps, at the lowest CPU
# priority (`.ci/test-all.sh` runs this beside the tests): the guest's
# static binaries (as the VM test's image and the static check build
# them), the benchmarks' (unless SKIP_BENCH=1), and the fuzz target (as
# `cargo fuzz run` builds it). Each command is the later step's own, so
# that step finds it built.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
musl=x86_64-unknown-linux-musl
build() {
  printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"
  nice -n 19 "$@"
}
# packaging/vm/build-initramfs.sh's two, then the static check's.
build cargo build --locked --release --target $musl -p sandbox-agent --bin sandbox-agent
build cargo build --locked --release --target $musl -p sandbox-suite -p sandbox-host \
  --example mcp_notes
build cargo build --locked --release --target $musl -p sandbox-agent -p sandboxctl
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  build cargo build --locked --release --target $musl -p sandbox-suite -p sandbox-host \
    --bin sandbox-host --example mcp_notes
  build cargo bench --locked --target $musl -p sandbox-suite -p sandbox-host --no-run
fi
(cd fuzz && export RUSTC_BOOTSTRAP=1 && build cargo fuzz build extract)
printf '==> [%d:%02d] done\n' $((SECONDS / 60)) $((SECONDS % 60))
