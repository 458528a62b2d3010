//! The test VM image: `packaging/vm/build-initramfs.sh`, built from this
//! tree.

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
