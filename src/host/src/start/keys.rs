//! The key that signs transfer URLs and tokens.

use anyhow::Context;

/// A signing key every replica shares (`--signing-key-file`): at least 32
/// bytes, the file's own.
pub(super) fn shared_signing_key(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let k = std::fs::read(path)
        .with_context(|| format!("reading --signing-key-file {}", path.display()))?;
    anyhow::ensure!(
        k.len() >= 32,
        "--signing-key-file {}: the key is {} bytes; use at least 32 random bytes (head -c 32 /dev/urandom)",
        path.display(),
        k.len()
    );
    Ok(k)
}

/// The key that signs transfer URLs: random, kept in the data dir so URLs
/// stay valid across a restart.
pub(super) fn signing_key(dir: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("signing.key");
    if let Ok(k) = std::fs::read(&path) {
        return Ok(k);
    }
    let k = sandbox_client::random::bytes::<32>()
        .context("making the key that signs transfer URLs")?
        .to_vec();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    std::io::Write::write_all(&mut f, &k)?;
    Ok(k)
}
