//! The test VM image: `packaging/vm/build-initramfs.sh`, built from this
//! tree. Shared by the VM tests and the benches (which use only part of it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Builds `dir/NAME.cpio.gz` (and its `.vmlinuz`) with `extra` arguments;
/// returns the image's path.
pub fn build_initramfs(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("{name}.cpio.gz"));
    let r = Command::new(format!("{ROOT}/packaging/vm/build-initramfs.sh"))
        .arg(&out)
        .args(extra)
        .output()
        .expect("build-initramfs.sh");
    assert!(
        r.status.success(),
        "build-initramfs.sh failed:\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    out
}

/// The VM tests' one image, built once per test process (both VM tests
/// boot it): the npm filesystem and memory servers of `servers`, python3,
/// and the `notes` example server. `SANDBOX_AGENT_VM_NODE_INITRAMFS` names
/// a prebuilt one (its `.vmlinuz` beside it) to skip the build.
pub fn node_image(servers: &str) -> PathBuf {
    static IMAGE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(|| {
            if let Ok(p) = std::env::var("SANDBOX_AGENT_VM_NODE_INITRAMFS") {
                return PathBuf::from(p);
            }
            // Under target/tmp, one directory per test process; those of
            // processes gone are removed.
            let dir = super::bench_data::process_dir("vm-image");
            build_initramfs(&dir, "node", &["--node-servers", servers, "--python"])
        })
        .clone()
}

/// The kernel beside an image (`NAME.cpio.gz` → `NAME.vmlinuz`).
pub fn kernel_of(image: &Path) -> PathBuf {
    image.with_extension("").with_extension("vmlinuz")
}
