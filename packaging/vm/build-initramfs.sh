#!/usr/bin/env bash
# Builds a bootable initramfs from the current tree:
#
#   packaging/vm/build-initramfs.sh OUT.cpio.gz [--node-servers DIR] [--python]
#
# Contents: the static musl sandbox-agent as /init (PID 1), busybox-static
# (for debugging from the console), the virtio/vsock modules of Debian's
# linux-image-amd64 (loaded by the agent at boot, in dependency order), and
# one small stdio MCP server, `notes` (tests/mcp-notes, built on the
# official Rust MCP SDK). The agent serves gRPC on vsock port 1024 and the
# MCP data plane on 1025; its workspace is /workspace.
#
# --node-servers DIR adds the npm MCP servers that packaging/install-servers.sh
# put under DIR (filesystem and localmemory, those of them installed there,
# with only the packages they need),
# with this machine's node and the shared libraries it links. The image is
# then about 40 MB larger and wants 1 GiB of guest memory (run-qemu.sh
# --memory 1024), since an initramfs lives in RAM.
#
# --python adds this machine's Debian python3 (/usr/bin/python3.X, the
# shared libraries it links, and its standard library without tests, IDLE,
# tkinter and bytecode caches; about 25 MB), so the image can run script
# executions (the Exec service: `python -m venv`, then main.py).
#
# The kernel package is downloaded, not installed (apt-get download +
# dpkg-deb -x) into $SANDBOX_AGENT_VM_CACHE (default target/vm), and its
# vmlinuz is copied next to OUT as OUT's name with .vmlinuz (run-qemu.sh
# finds it there). Needs: cargo with the x86_64-unknown-linux-musl target,
# apt-get/dpkg-deb, gzip, flock (util-linux), and busybox-static (or `busybox`
# on PATH).
set -euo pipefail

die() { echo "build-initramfs: $*" >&2; exit 1; }
usage="usage: $0 OUT.cpio.gz [--node-servers DIR] [--python]"
out="" node_servers="" python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --node-servers) [ $# -ge 2 ] || die "$usage"; node_servers=$2; shift 2 ;;
    --python) python=1; shift ;;
    -*) die "unknown option $1; $usage" ;;
    *) [ -z "$out" ] || die "$usage"; out=$1; shift ;;
  esac
done
[ -n "$out" ] || die "$usage"
if [ -n "$node_servers" ]; then
  [ -d "$node_servers/node/node_modules" ] \
    || die "--node-servers $node_servers: no node/node_modules there (packaging/install-servers.sh --prefix $node_servers filesystem)"
  command -v node >/dev/null || die "--node-servers needs node on this machine"
fi
if [ -n "$python" ]; then
  pybin=$(readlink -f /usr/bin/python3 2>/dev/null || true)
  [ -x "$pybin" ] || die "--python needs Debian's python3 at /usr/bin/python3 (apt-get install python3)"
  pyver=$(basename "$pybin")
  [ -d "/usr/lib/$pyver" ] || die "--python: no standard library at /usr/lib/$pyver"
fi
case "$out" in *.cpio.gz) ;; *) die "OUT must end in .cpio.gz (got $out)";; esac
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${SANDBOX_AGENT_VM_CACHE:-$root/target/vm}
mkdir -p "$cache" "$(dirname "$out")"
# One build at a time per cache: concurrent builds (tests run in parallel)
# would replace each other's downloaded kernel while it is being read.
exec 9>"$cache/.lock"
flock 9
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

# Kernel modules for virtio-pci and virtio-vsock. Their load order is
# worked out below from each module's own `depends=` (kernels differ: in
# some, virtio needs virtio_ring first).
modules=(
  kernel/drivers/virtio/virtio.ko
  kernel/drivers/virtio/virtio_ring.ko
  kernel/drivers/virtio/virtio_pci_legacy_dev.ko
  kernel/drivers/virtio/virtio_pci_modern_dev.ko
  kernel/drivers/virtio/virtio_pci.ko
  kernel/net/vmw_vsock/vsock.ko
  kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko
  kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko
)

echo "build-initramfs: static binaries" >&2
target=x86_64-unknown-linux-musl
# The workspace's one static build (packaging/build-static.sh): the agent
# and the test server with the other static binaries, every dependency
# compiled once (a build of the agent alone resolves features differently
# and compiles most of the tree again); the same agent as build-rootfs.sh's
# and the static check's.
"$root/packaging/build-static.sh" >/dev/null
agent=$root/target/$target/release/sandbox-agent
notes=$root/target/$target/release/mcp_notes

# busybox-static: the installed package, else downloaded into the cache.
if dpkg -s busybox-static >/dev/null 2>&1; then
  busybox=/bin/busybox
else
  if [ ! -x "$cache/busybox/bin/busybox" ]; then
    echo "build-initramfs: downloading busybox-static" >&2
    (cd "$cache" && rm -f busybox-static_*.deb && apt-get download -q busybox-static >/dev/null \
      && dpkg-deb -x busybox-static_*.deb busybox) || die "cannot get busybox-static (apt-get download busybox-static)"
  fi
  busybox=$cache/busybox/bin/busybox
fi

pkg=${SANDBOX_AGENT_KERNEL_PKG:-$(apt-cache depends linux-image-amd64 2>/dev/null \
  | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')}
[ -n "$pkg" ] || die "cannot resolve linux-image-amd64 (run apt-get update, or set SANDBOX_AGENT_KERNEL_PKG)"
kdir=$cache/$pkg
if [ ! -d "$kdir/boot" ]; then
  echo "build-initramfs: downloading $pkg" >&2
  tmp=$(mktemp -d "$cache/dl.XXXXXX")
  (cd "$tmp" && apt-get download -q "$pkg" >/dev/null && dpkg-deb -x "$pkg"_*.deb x) \
    || { rm -rf "$tmp"; die "cannot download $pkg"; }
  rm -rf "$kdir" && mv "$tmp/x" "$kdir" && rm -rf "$tmp"
fi
kver=$(ls "$kdir/lib/modules" | head -n1)
kernel=$kdir/boot/vmlinuz-$kver
[ -f "$kernel" ] || die "no kernel image in $kdir/boot"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,etc/sandbox-agent,opt/mcp,proc,sys,dev,run,tmp,root,workspace} \
  "$stage/var/lib/sandbox-agent" "$stage/lib/modules/$kver"
install -m 0755 "$agent" "$stage/sbin/sandbox-agent"
ln -s sbin/sandbox-agent "$stage/init"
install -m 0755 "$notes" "$stage/opt/mcp/mcp_notes"
install -m 0755 "$busybox" "$stage/bin/busybox"
for applet in $("$busybox" --list); do
  [ -e "$stage/bin/$applet" ] || ln -s busybox "$stage/bin/$applet"
done
# Dependencies first: a depth-first walk over the modules' `depends=`
# (every dependency must be one of the listed modules).
module_list="" ordered=" "
mod_path() {
  local m
  for m in "${modules[@]}"; do
    [ "$(basename "$m" .ko | tr - _)" = "$1" ] && { echo "$m"; return 0; }
  done
  return 1
}
add_module() {
  local m=$1 name dep deps
  name=$(basename "$m" .ko | tr - _)
  case "$ordered" in *" $name "*) return 0 ;; esac
  [ -f "$kdir/lib/modules/$kver/$m" ] || die "$pkg has no $m"
  deps=$(grep -aom1 'depends=[a-z0-9_,-]*' "$kdir/lib/modules/$kver/$m" | cut -d= -f2 | tr ',-' ' _')
  for dep in $deps; do
    dep=$(mod_path "$dep") || die "$m needs $dep, which is not in the module list"
    add_module "$dep"
  done
  ordered+="$name "
  install -D -m 0644 "$kdir/lib/modules/$kver/$m" "$stage/lib/modules/$kver/$m"
  module_list+="  \"/lib/modules/$kver/$m\",\n"
}
for m in "${modules[@]}"; do add_module "$m"; done
# The sandbox's own users: root, the tenant (the agent's tenant_user
# "auto", its home under the state root) and nobody.
printf 'root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/var/lib/sandbox-agent/home:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$stage/etc/passwd"
printf 'root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n' > "$stage/etc/group"
printf '%b' "# sandbox-agent as the VM's init (generated by packaging/vm/build-initramfs.sh)
listen = [\"vsock://any:1024\"]
mcp_listen = [\"vsock://any:1025\"]
workspace = \"/workspace\"
data_path = \"/data\"
data_link = \"bind\"
manifest = \"/etc/sandbox-agent/servers.toml\"

[init]
hostname = \"sandbox\"
modules = [
$module_list]
" > "$stage/etc/sandbox-agent/agent.toml"
cat > "$stage/etc/sandbox-agent/servers.toml" <<'TOML'
# The VM image's MCP servers (generated by packaging/vm/build-initramfs.sh).
install_dir = "/opt/sandbox-agent/servers"

[servers.notes]
command = "/opt/mcp/mcp_notes"
TOML

if [ -n "$python" ]; then
  install -D -m 0755 "$pybin" "$stage/usr/bin/$pyver"
  ln -s "$pyver" "$stage/usr/bin/python3"
  for lib in $(ldd "$pybin" | grep -o '/[^ ]*'); do
    [ -e "$stage$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$stage$lib"
  done
  mkdir -p "$stage/usr/lib/$pyver"
  (cd "/usr/lib/$pyver" && tar -cf - --exclude=test --exclude=tests --exclude=__pycache__ \
      --exclude=idlelib --exclude=tkinter --exclude=turtledemo --exclude=lib2to3 \
      --exclude='config-*' --exclude=pydoc_data .) | tar -xf - -C "$stage/usr/lib/$pyver"
fi

if [ -n "$node_servers" ]; then
  # node and the libraries the dynamic loader resolves for it, at the same
  # paths (symlinks resolved).
  nodebin=$(readlink -f "$(command -v node)")
  install -D -m 0755 "$nodebin" "$stage/usr/bin/node"
  for lib in $(ldd "$nodebin" | grep -o '/[^ ]*'); do
    install -D -m 0755 "$(readlink -f "$lib")" "$stage$lib"
  done
  # Only filesystem and localmemory and the packages they need (resolved as
  # node resolves them): the prefix may hold every shipped server, hundreds
  # of MB that would fill the RAM the initramfs lives in.
  needed=$(cd "$node_servers/node" && node -e '
    const fs = require("fs"), path = require("path");
    const seen = new Set(), todo = [];
    const add = (from, name) => {
      for (let dir = from; ; dir = path.dirname(dir)) {
        const p = path.join(dir, "node_modules", name);
        if (fs.existsSync(path.join(p, "package.json"))) {
          if (!seen.has(p)) { seen.add(p); todo.push(p); }
          return;
        }
        if (path.dirname(dir) === dir) return;
      }
    };
    for (const n of process.argv.slice(1)) add(".", n);
    while (todo.length) {
      const p = todo.pop();
      const j = JSON.parse(fs.readFileSync(path.join(p, "package.json"), "utf8"));
      const deps = { ...j.dependencies, ...j.optionalDependencies, ...j.peerDependencies };
      for (const d of Object.keys(deps)) add(p, d);
    }
    for (const p of seen) console.log(path.relative(".", p));
  ' @modelcontextprotocol/server-filesystem @modelcontextprotocol/server-memory)
  mkdir -p "$stage/opt/sandbox-agent/servers/node"
  if [ -n "$needed" ]; then
    # shellcheck disable=SC2086
    (cd "$node_servers/node" && cp -a --parents $needed "$stage/opt/sandbox-agent/servers/node/")
  fi
  mods=$stage/opt/sandbox-agent/servers/node/node_modules
  if [ -d "$mods/@modelcontextprotocol/server-filesystem" ]; then
    cat >> "$stage/etc/sandbox-agent/servers.toml" <<'TOML'

[servers.filesystem]
description = "Read, write, search and edit files in the workspace"
command = "/usr/bin/node"
args = ["${install_dir}/node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js", "${workspace}"]
ready_timeout_ms = 120000
TOML
  fi
  if [ -d "$mods/@modelcontextprotocol/server-memory" ]; then
    cat >> "$stage/etc/sandbox-agent/servers.toml" <<'TOML'

[servers.localmemory]
description = "Knowledge-graph memory kept for the lease"
command = "/usr/bin/node"
args = ["${install_dir}/node/node_modules/@modelcontextprotocol/server-memory/dist/index.js"]
env = { MEMORY_FILE_PATH = "/var/lib/sandbox-agent/memory/memory.jsonl" }
state_paths = ["/var/lib/sandbox-agent/memory"]
ready_timeout_ms = 120000
TOML
  fi
fi

# gzip's default level: the node image's 179 MB in 7 s of CPU to 59.2 MB;
# -9 took 23 s for 58.8 MB (0.7 % smaller), -1 2.5 s for 66.8 MB.
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | "$busybox" cpio -o -H newc 2>/dev/null) \
  | gzip -6 > "$out.tmp"
mv "$out.tmp" "$out"
cp "$kernel" "${out%.cpio.gz}.vmlinuz"
echo "build-initramfs: $out ($(du -h "$out" | cut -f1)), kernel ${out%.cpio.gz}.vmlinuz ($kver)" >&2
