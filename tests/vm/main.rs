//! Tests that boot our own VM (QEMU with TCG, a Debian kernel, a busybox
//! initramfs, vhost-user-vsock) with the static agent inside: the agent over
//! real vsock, and the host's qemu backend. They skip, saying why, where
//! QEMU or the image's tools are missing.

#[path = "../common/mod.rs"]
mod common;

mod host_vm;
mod vm;
