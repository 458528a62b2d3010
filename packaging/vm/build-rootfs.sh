#!/usr/bin/env bash
# Recipe for a full VM root file system, the production alternative to the
# test initramfs: Debian (debootstrap) with the kernel, the MCP servers from
# packaging/install-servers.sh, the static agent, and the systemd unit
# packaging/systemd/sandbox-agent.service.
#
#   packaging/vm/build-rootfs.sh OUT.ext4 [SIZE]     (SIZE default 8G; run as root)
#
# Boot it with a kernel and initrd from its /boot and root=/dev/vda, e.g.
#   qemu-system-x86_64 ... -drive file=OUT.ext4,if=virtio,format=raw \
#     -kernel ROOT/boot/vmlinuz-* -initrd ROOT/boot/initrd.img-* -append "root=/dev/vda console=ttyS0"
# plus the vsock device of run-qemu.sh. The agent then listens on vsock
# ports 1024 (gRPC) and 1025 (MCP) as in the initramfs.
#
# Needs: debootstrap, e2fsprogs (mkfs.ext4 -d), and network access to the
# Debian, npm and PyPI registries.
set -euo pipefail

die() { echo "build-rootfs: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 OUT.ext4 [SIZE]"
[ "$(id -u)" = 0 ] || die "run as root (debootstrap and chroot)"
out=$1 size=${2:-8G}
root=$(cd "$(dirname "$0")/../.." && pwd)
suite=${SANDBOX_AGENT_SUITE:-bookworm}
mirror=${SANDBOX_AGENT_MIRROR:-http://deb.debian.org/debian}
command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 not found (apt-get install e2fsprogs)"

target=x86_64-unknown-linux-musl
# The workspace's one static build (the agent and the rest, compiled once).
"$root/packaging/build-static.sh"

dir=$(mktemp -d)
cleanup() {
  for m in dev/pts dev proc sys; do umount "$dir/$m" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

echo "build-rootfs: debootstrap $suite" >&2
debootstrap --variant=minbase \
  --include=systemd-sysv,udev,kmod,ca-certificates,linux-image-amd64,nodejs,npm,python3,python3-venv,python3-pip,git,chromium,dovecot-imapd \
  "$suite" "$dir" "$mirror"
for m in proc sys dev dev/pts; do mount --bind "/$m" "$dir/$m"; done

install -D -m 0755 "$root/target/$target/release/sandbox-agent" "$dir/usr/local/bin/sandbox-agent"
install -D -m 0644 "$root/packaging/systemd/sandbox-agent.service" "$dir/etc/systemd/system/sandbox-agent.service"
install -D -m 0644 "$root/packaging/servers.toml" "$dir/etc/sandbox-agent/servers.toml"
install -D -m 0755 "$root/packaging/install-servers.sh" "$dir/tmp/install-servers.sh"
install -D -m 0755 "$root/packaging/launchers/emails-mcp-env" "$dir/tmp/launchers/emails-mcp-env"
install -D -m 0755 "$root/packaging/launchers/sandbox-mail" "$dir/tmp/launchers/sandbox-mail"
install -D -m 0755 "$root/packaging/launchers/desktop-commander-env.mjs" "$dir/tmp/launchers/desktop-commander-env.mjs"
install -D -m 0755 "$root/packaging/launchers/canvas-data" "$dir/tmp/launchers/canvas-data"
install -D -m 0755 "$root/packaging/launchers/google-cloud-data" "$dir/tmp/launchers/google-cloud-data"
install -D -m 0755 "$root/packaging/launchers/memory-data" "$dir/tmp/launchers/memory-data"
# The locks install-servers.sh installs from (packaging/locks/).
cp -r "$root/packaging/locks" "$dir/tmp/locks"
cat > "$dir/etc/sandbox-agent/agent.toml" <<'TOML'
# sandbox-agent in a full VM image (packaging/vm/build-rootfs.sh)
listen = ["vsock://any:1024"]
mcp_listen = ["vsock://any:1025"]
workspace = "/workspace"
data_path = "/data"
data_link = "bind"
manifest = "/etc/sandbox-agent/servers.toml"
TOML
printf 'vsock\nvmw_vsock_virtio_transport\n' > "$dir/etc/modules-load.d/sandbox-agent.conf"
mkdir -p "$dir/workspace" "$dir/var/lib/sandbox-agent"
echo sandbox > "$dir/etc/hostname"

echo "build-rootfs: MCP servers" >&2
chroot "$dir" /tmp/install-servers.sh --prefix /opt/sandbox-agent/servers
rm -rf "$dir/tmp/install-servers.sh" "$dir/tmp/launchers" "$dir/tmp/locks"
chroot "$dir" systemctl enable sandbox-agent.service
chroot "$dir" systemctl mask getty@tty1.service
chroot "$dir" apt-get clean

for m in dev/pts dev proc sys; do umount "$dir/$m"; done
echo "build-rootfs: $out ($size)" >&2
rm -f "$out"
mkfs.ext4 -q -L sandbox-root -d "$dir" "$out" "$size"
echo "build-rootfs: kernel and initrd are in the image's /boot" >&2
