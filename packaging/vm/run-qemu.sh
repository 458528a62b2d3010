#!/usr/bin/env bash
# Boots an initramfs from build-initramfs.sh under QEMU, in the foreground,
# until the VM powers off:
#
#   packaging/vm/run-qemu.sh --initramfs FILE --vsock-uds PATH [--kernel FILE] [--memory MiB] [--cpus N]
#
# The guest's virtio-vsock device is vhost-user-vsock-pci, served by
# vhost-device-vsock (`cargo install vhost-device-vsock`), which this script
# starts and stops. The host reaches the guest through PATH with the
# hybrid-vsock handshake ("CONNECT <port>\n"): sandboxctl --agent
# hvsock://PATH:1024. KVM is used when /dev/kvm works, TCG otherwise
# (SANDBOX_AGENT_ACCEL=kvm|tcg forces one). The guest gets --cpus vCPUs:
# by default 2 under KVM and 1 under TCG, where every vCPU is a host thread
# emulating a CPU, and a second one only makes the guest's CPUs wait on
# each other (spinlocks, IPIs) when the host is busy: on a loaded 2-core
# host, 2-vCPU TCG guests were seen stuck in the kernel for minutes (soft
# lockups) and never served. The serial console goes to stderr.
#
# With --probe-accel it boots nothing: it prints the accelerator it would
# use (kvm or tcg) and exits 0, so a caller starting many VMs probes once.
#
# Exit status: 0 when the guest powered off cleanly; 1 on a guest kernel
# panic (pvpanic), or when QEMU or vhost-device-vsock fails; 2 on bad usage.
set -euo pipefail

die() { echo "run-qemu: $*" >&2; exit 2; }
initramfs="" uds="" kernel="" memory=512 cpus="" probe_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --initramfs) initramfs=${2:-}; shift 2 ;;
    --vsock-uds) uds=${2:-}; shift 2 ;;
    --kernel) kernel=${2:-}; shift 2 ;;
    --memory) memory=${2:-}; shift 2 ;;
    --cpus) cpus=${2:-}; shift 2 ;;
    --probe-accel) probe_only=1; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[ -f "$initramfs" ] || die "--initramfs FILE is required and must exist"
[ -n "$uds" ] || [ "$probe_only" = 1 ] || die "--vsock-uds PATH is required"
[ -n "$kernel" ] || kernel=${initramfs%.cpio.gz}.vmlinuz
[ -f "$kernel" ] || die "no kernel at $kernel (give --kernel FILE; build-initramfs.sh puts one next to the initramfs)"
[[ "$memory" =~ ^[0-9]+$ ]] && [ "$memory" -ge 128 ] || die "--memory must be a number of MiB, at least 128"
[ -z "$cpus" ] || { [[ "$cpus" =~ ^[0-9]+$ ]] && [ "$cpus" -ge 1 ] && [ "$cpus" -le 64 ]; } \
  || die "--cpus must be a number of vCPUs from 1 to 64"
qemu=$(command -v qemu-system-x86_64) || die "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
vhost=$(command -v vhost-device-vsock || true)
[ -n "$vhost" ] || { [ -x "$HOME/.cargo/bin/vhost-device-vsock" ] && vhost=$HOME/.cargo/bin/vhost-device-vsock; } \
  || die "vhost-device-vsock not found (cargo install vhost-device-vsock)"

work=$(mktemp -d)
vhost_pid="" qemu_pid="" probe_pid=""
# QEMU and vhost-device-vsock never outlive this script: they run in the
# background so a TERM/INT is handled at once, and the EXIT trap stops both.
cleanup() {
  for p in $probe_pid $qemu_pid $vhost_pid; do
    kill "$p" 2>/dev/null || true
  done
  for p in $probe_pid $qemu_pid $vhost_pid; do
    wait "$p" 2>/dev/null || true
  done
  if [ -n "$uds" ]; then rm -f "$uds" "${uds}_"* 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# KVM only when a guest really runs under it: some nested setups open
# /dev/kvm and create VMs, then never get a kernel past its first
# instructions. The probe boots the kernel itself until it prints its banner
# (in the background, like everything here, so a TERM is handled at once).
kvm_boots() {
  [ -w /dev/kvm ] || return 1
  local log=$work/probe.log
  "$qemu" -machine q35,accel=kvm -cpu host -m 256M -kernel "$kernel" \
    -append "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1" \
    -nodefaults -no-user-config -display none -serial "file:$log" -monitor none -no-reboot \
    </dev/null >/dev/null 2>&1 &
  probe_pid=$!
  for _ in $(seq 100); do
    grep -aqs "Linux version" "$log" && break
    kill -0 "$probe_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$probe_pid" 2>/dev/null || true
  wait "$probe_pid" 2>/dev/null || true
  probe_pid=""
  grep -aqs "Linux version" "$log"
}
accel=${SANDBOX_AGENT_ACCEL:-}
if [ -z "$accel" ]; then
  if kvm_boots; then accel=kvm; else accel=tcg; fi
fi
case "$accel" in kvm|tcg) ;; *) die "SANDBOX_AGENT_ACCEL must be kvm or tcg" ;; esac
if [ "$probe_only" = 1 ]; then
  echo "$accel"
  exit 0
fi
cpu=max
[ "$accel" = kvm ] && cpu=host
if [ -z "$cpus" ]; then
  if [ "$accel" = kvm ]; then cpus=2; else cpus=1; fi
fi

rm -f "$uds"
ctl=$work/vhost.sock
# The guest CID only names the guest inside vhost-device-vsock; nothing on
# this machine's own vsock device is used.
"$vhost" --guest-cid 42 --socket "$ctl" --uds-path "$uds" &
vhost_pid=$!
for _ in $(seq 100); do
  [ -S "$ctl" ] && break
  kill -0 "$vhost_pid" 2>/dev/null || { echo "run-qemu: vhost-device-vsock exited" >&2; exit 1; }
  sleep 0.05
done
[ -S "$ctl" ] || { echo "run-qemu: vhost-device-vsock did not create $ctl" >&2; exit 1; }

echo "run-qemu: booting $(basename "$kernel") + $(basename "$initramfs") with $accel, ${cpus} vCPU(s), ${memory} MiB; vsock at $uds" >&2
"$qemu" \
  -machine q35,accel="$accel" -cpu "$cpu" -smp "$cpus" -m "${memory}M" \
  -object memory-backend-memfd,id=mem,size="${memory}M",share=on \
  -numa node,memdev=mem \
  -chardev socket,id=vsock,path="$ctl" \
  -device vhost-user-vsock-pci,chardev=vsock \
  -device pvpanic \
  -action panic=exit-failure -action reboot=shutdown \
  -kernel "$kernel" -initrd "$initramfs" \
  -append "console=ttyS0 panic=-1 quiet loglevel=4" \
  -nodefaults -no-user-config -display none -serial stdio -monitor none \
  </dev/null 1>&2 &
qemu_pid=$!
rc=0
wait "$qemu_pid" || rc=$?
qemu_pid=""
if [ $rc -ne 0 ]; then
  echo "run-qemu: QEMU exited with status $rc (a guest panic exits 1)" >&2
  exit 1
fi
echo "run-qemu: the guest powered off" >&2
