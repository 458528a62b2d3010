#!/usr/bin/env bash
# Installs what the test suite needs, each thing only when it is missing:
# Debian packages (QEMU, busybox-static, musl-tools, pigz, zstd, node, …),
# the Rust musl target and components, the Python and Node MCP clients, the
# cargo tools (cargo-fuzz, vhost-device-vsock), and the real MCP servers the
# tests run (packaging/install-servers.sh). Called by .ci/test-all.sh; safe
# to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi

# --all-servers: every shipped MCP server only (test-all.sh runs it in the
# background, once the rest is installed).
if [ "${1:-}" = --all-servers ]; then
  exec $SUDO packaging/install-servers.sh --prefix "${SANDBOX_AGENT_SERVERS_DIR:-/opt/sandbox-agent/servers}"
fi

apt_pkgs=()
command -v readelf >/dev/null || apt_pkgs+=(binutils)
command -v python3 >/dev/null || apt_pkgs+=(python3 python3-pip)
command -v musl-gcc >/dev/null || apt_pkgs+=(musl-tools)   # zstd's C code, static build
command -v pigz >/dev/null || apt_pkgs+=(pigz)             # benchmark reference
command -v zstd >/dev/null || apt_pkgs+=(zstd)             # tests read zstd dumps with GNU tar
command -v tar >/dev/null || apt_pkgs+=(tar)
command -v curl >/dev/null || apt_pkgs+=(curl)            # raw HTTP checks of the MCP data plane
command -v jq >/dev/null || apt_pkgs+=(jq)                # packages.txt of the execution test
command -v git >/dev/null || apt_pkgs+=(git)              # the git MCP server
command -v node >/dev/null || apt_pkgs+=(nodejs npm)        # npm MCP servers
# PyPI MCP servers: install-servers.sh makes their venvs with the system's
# interpreter, whichever python3 is first on PATH.
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || apt_pkgs+=(python3 python3-venv)
# The sandbox's own PATH (no host PATH reaches it) finds `python` for
# code runners as the benchmarks' images have it.
[ -x /usr/bin/python ] || apt_pkgs+=(python-is-python3)
command -v qemu-system-x86_64 >/dev/null || apt_pkgs+=(qemu-system-x86)  # the VM test
compgen -G '/usr/lib/llvm-*/lib/libFuzzer.a' >/dev/null || apt_pkgs+=(libfuzzer-14-dev)  # the fuzz build links LLVM's libFuzzer
dpkg -s busybox-static >/dev/null 2>&1 || apt_pkgs+=(busybox-static)   # the VM image
command -v pgrep >/dev/null || apt_pkgs+=(procps)
command -v chromium >/dev/null || apt_pkgs+=(chromium)    # the playwright MCP server
command -v openssl >/dev/null || apt_pkgs+=(openssl)      # a test's service-account key
command -v etcd >/dev/null || apt_pkgs+=(etcd-server)     # the real kube-apiserver's store (src/kube/tests)
command -v xz >/dev/null || apt_pkgs+=(xz-utils)          # ../shared/tools/kube-apiserver-*.xz
# The mail service (IMAP; dovecot-lda, in dovecot-core, delivers) behind
# poste_email_toolathlon. Debian starts a system-wide Dovecot on install;
# the sandbox runs its own.
dpkg -s dovecot-imapd >/dev/null 2>&1 || apt_pkgs+=(dovecot-imapd)
# The host's isolated process backend: bubblewrap (mount, pid, ipc, uts,
# cgroup, network namespaces), uidmap (newuidmap for the user namespace),
# passt (pasta: the sandboxes' outbound network), iproute2 (closing
# link-local addresses there).
command -v bwrap >/dev/null || apt_pkgs+=(bubblewrap)
command -v newuidmap >/dev/null || apt_pkgs+=(uidmap)
command -v pasta >/dev/null || apt_pkgs+=(passt)
command -v ip >/dev/null || apt_pkgs+=(iproute2)
# The VM image takes Debian's kernel package (apt-get download): the
# package lists must know linux-image-amd64.
if [ ${#apt_pkgs[@]} -gt 0 ] || ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
  $SUDO apt-get update -qq
fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_pkgs[@]}"
fi
# Subordinate ids for the isolated sandboxes: 64 slots of 65536 ids each
# (sandbox-host --isolation namespaces; see docs/security.md).
me=$(id -un)
for f in /etc/subuid /etc/subgid; do
  grep -q "^$me:" "$f" 2>/dev/null || echo "$me:1000000:4194304" | $SUDO tee -a "$f" >/dev/null
done
# The tests' tenants (uid 1000: scripts) run the Python the tests
# installed their packages into; under pyenv that is below $HOME, which
# they must be able to pass through (not list: o+x only). The MCP servers'
# venvs do not need it (the system's interpreter).
if [ -d "$HOME/.pyenv" ] && [ "$(stat -c %a "$HOME")" = 700 ]; then
  chmod o+x "$HOME"
fi
rustup target list --installed | grep -qx x86_64-unknown-linux-musl \
  || rustup target add x86_64-unknown-linux-musl
for c in rustfmt clippy; do
  rustup component list --installed | grep -q "^$c" || rustup component add "$c"
done
python3 -c 'import grpc, grpc_reflection, grpc_health, mcp, klavis' 2>/dev/null \
  || python3 -m pip install -q -r tests/clients/requirements.txt \
  || python3 -m pip install -q --break-system-packages -r tests/clients/requirements.txt

# uv, which executions use for their venvs when it is on PATH (PyPI wheel).
command -v uv >/dev/null \
  || python3 -m pip install -q uv==0.13.9 \
  || python3 -m pip install -q --break-system-packages uv==0.13.9
# Wheels the execution tests install offline (PIP_FIND_LINKS/UV_FIND_LINKS).
SANDBOX_AGENT_WHEELS=${SANDBOX_AGENT_WHEELS:-/opt/sandbox-agent/wheels}
ls "$SANDBOX_AGENT_WHEELS"/psutil-7.2.2-*.whl "$SANDBOX_AGENT_WHEELS"/requests-2.34.2-*.whl >/dev/null 2>&1 \
  || $SUDO python3 -m pip download -q -d "$SANDBOX_AGENT_WHEELS" requests==2.34.2 psutil==7.2.2
# And the wheels MCP_Atlas's workspace project resolves to, which the
# tests' install-benchmark-data.sh syncs offline.
ls "$SANDBOX_AGENT_WHEELS"/pandas-2.3.1-*.whl "$SANDBOX_AGENT_WHEELS"/scipy-1.16.0-*.whl >/dev/null 2>&1 \
  || $SUDO python3 -m pip download -q -d "$SANDBOX_AGENT_WHEELS" --no-deps --require-hashes \
       -r packaging/benchmark-data/MCP_Atlas-wheels.txt

command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
# The host side of the test VM's virtio-vsock device.
command -v vhost-device-vsock >/dev/null || cargo install --locked vhost-device-vsock

# The official TypeScript MCP SDK client (pinned in its package-lock.json).
[ -d tests/clients/node/node_modules/@modelcontextprotocol/sdk ] \
  || (cd tests/clients/node && npm ci --no-audit --no-fund --loglevel=error)

# The official Python MCP SDK 2.x client (the session-less 2026-07-28
# revision), in its own venv: it cannot share one with the 1.x client.
SANDBOX_AGENT_MCP2_PYTHON=${SANDBOX_AGENT_MCP2_PYTHON:-/opt/sandbox-agent/clients/mcp2/bin/python}
"$SANDBOX_AGENT_MCP2_PYTHON" -c 'import mcp.client.client' 2>/dev/null || {
  $SUDO python3 -m venv "$(dirname "$(dirname "$SANDBOX_AGENT_MCP2_PYTHON")")"
  $SUDO "$SANDBOX_AGENT_MCP2_PYTHON" -m pip install -q -r tests/clients/mcp2/requirements.txt
}

# The real MCP servers most tests run, from packaging/locks/ (kept when the
# installed tree matches its lock); the others come with --all-servers.
SANDBOX_AGENT_SERVERS_DIR=${SANDBOX_AGENT_SERVERS_DIR:-/opt/sandbox-agent/servers}
$SUDO packaging/install-servers.sh --prefix "$SANDBOX_AGENT_SERVERS_DIR" filesystem git terminal localmemory excel

