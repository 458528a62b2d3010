#!/usr/bin/env bash
# The whole test suite: installs what it needs when missing, then runs
# formatting and lint checks, the unit and integration tests (real binaries
# over real sockets; some need root, e.g. to mount a tmpfs workspace), the
# static musl build check, a short fuzz run of the archive extractor, and
# the benchmarks.
#
#   ./.ci/test-all.sh                 everything
#   SKIP_BENCH=1 ./.ci/test-all.sh    without the benchmarks
#   FUZZ_SECONDS=600 ./.ci/test-all.sh   a longer fuzz run (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

# Each step says when it starts (minutes:seconds since the start), so a run's
# log shows where the time goes.
step() { printf '\n==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi

step "prerequisites"
apt_pkgs=()
command -v readelf >/dev/null || apt_pkgs+=(binutils)
command -v python3 >/dev/null || apt_pkgs+=(python3 python3-pip)
command -v musl-gcc >/dev/null || apt_pkgs+=(musl-tools)   # zstd's C code, static build
command -v pigz >/dev/null || apt_pkgs+=(pigz)             # benchmark reference
command -v zstd >/dev/null || apt_pkgs+=(zstd)             # tests read zstd dumps with GNU tar
command -v tar >/dev/null || apt_pkgs+=(tar)
command -v curl >/dev/null || apt_pkgs+=(curl)            # raw HTTP checks of the MCP data plane
command -v git >/dev/null || apt_pkgs+=(git)              # the git MCP server
command -v node >/dev/null || apt_pkgs+=(nodejs npm)        # npm MCP servers
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_pkgs+=(python3-venv)  # PyPI MCP servers
command -v qemu-system-x86_64 >/dev/null || apt_pkgs+=(qemu-system-x86)  # the VM test
dpkg -s busybox-static >/dev/null 2>&1 || apt_pkgs+=(busybox-static)   # the VM image
command -v pgrep >/dev/null || apt_pkgs+=(procps)
# The VM image takes Debian's kernel package (apt-get download): the
# package lists must know linux-image-amd64.
if [ ${#apt_pkgs[@]} -gt 0 ] || ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
  $SUDO apt-get update -qq
fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_pkgs[@]}"
fi
rustup target list --installed | grep -qx x86_64-unknown-linux-musl \
  || rustup target add x86_64-unknown-linux-musl
for c in rustfmt clippy; do
  rustup component list --installed | grep -q "^$c" || rustup component add "$c"
done
python3 -c 'import grpc, grpc_reflection, grpc_health, mcp' 2>/dev/null \
  || python3 -m pip install -q -r tests/clients/requirements.txt \
  || python3 -m pip install -q --break-system-packages -r tests/clients/requirements.txt

command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
# The host side of the test VM's virtio-vsock device.
command -v vhost-device-vsock >/dev/null || cargo install --locked vhost-device-vsock

# The official TypeScript MCP SDK client (pinned in its package-lock.json).
[ -d tests/clients/node/node_modules/@modelcontextprotocol/sdk ] \
  || (cd tests/clients/node && npm ci --no-audit --no-fund --loglevel=error)

# The official Python MCP SDK 2.x client (the session-less 2026-07-28
# revision), in its own venv: it cannot share one with the 1.x client.
export SANDBOX_AGENT_MCP2_PYTHON=${SANDBOX_AGENT_MCP2_PYTHON:-/opt/sandbox-agent/clients/mcp2/bin/python}
"$SANDBOX_AGENT_MCP2_PYTHON" -c 'import mcp.client.client' 2>/dev/null || {
  $SUDO python3 -m venv "$(dirname "$(dirname "$SANDBOX_AGENT_MCP2_PYTHON")")"
  $SUDO "$SANDBOX_AGENT_MCP2_PYTHON" -m pip install -q -r tests/clients/mcp2/requirements.txt
}

# The real MCP servers the tests run (pinned; skipped when installed).
export SANDBOX_AGENT_SERVERS_DIR=${SANDBOX_AGENT_SERVERS_DIR:-/opt/sandbox-agent/servers}
$SUDO packaging/install-servers.sh --prefix "$SANDBOX_AGENT_SERVERS_DIR" filesystem git terminal localmemory excel

step "cargo fmt --check"
cargo fmt --check
(cd fuzz && cargo fmt --check)

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings

step "cargo test"
cargo test --locked

step "static build (x86_64-unknown-linux-musl, the guest's binaries)"
# As the VM image builds them (so the tests' image build is reused here).
cargo build --locked --release --no-default-features --features agent --target x86_64-unknown-linux-musl \
  --bin sandbox-agent --bin sandboxctl
for bin in sandbox-agent sandboxctl; do
  f=target/x86_64-unknown-linux-musl/release/$bin
  if readelf -lW "$f" | grep -q INTERP || readelf -dW "$f" | grep -q NEEDED; then
    echo "$f is dynamically linked" >&2
    exit 1
  fi
  echo "$f: statically linked, $(stat -c %s "$f") bytes"
done

step "fuzz the archive extractor (${FUZZ_SECONDS:-60} s, asserting confinement)"
# cargo-fuzz wants nightly features; RUSTC_BOOTSTRAP enables them on the
# machine's stable toolchain. Leak checks are off: the decoder thread of an
# aborted extraction is detached by design and may still be exiting when
# the check runs (a 32-byte thread-local registration).
corpus=$(mktemp -d)
(cd fuzz && ASAN_OPTIONS=detect_leaks=0 RUSTC_BOOTSTRAP=1 cargo fuzz run extract "$corpus" seeds/extract -- \
  -max_total_time="${FUZZ_SECONDS:-60}" -rss_limit_mb=2048 -detect_leaks=0 -print_final_stats=1)
rm -rf "$corpus"

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  step "cargo bench (static binary; the workspace bench needs ~6 GB of disk)"
  cargo bench --locked --target x86_64-unknown-linux-musl
fi

step "all checks passed"
