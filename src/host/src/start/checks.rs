//! What start refuses: a configuration that cannot work, named with what
//! to change.

use std::path::PathBuf;

use anyhow::Context;

use crate::config::Args;
use crate::pool;

/// The numeric flags that must be at least 1.
pub(super) fn check_limits(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.time_scale > 0.0, "--time-scale must be positive");
    anyhow::ensure!(
        args.max_upload_bytes > 0
            && args.max_executions_per_sandbox > 0
            && args.max_stored_bytes_per_sandbox > 0
            && args.max_stored_bytes_per_key > 0
            && args.max_multipart_bytes > 0,
        "--max-upload-bytes, --max-executions-per-sandbox, --max-stored-bytes-per-sandbox, \
         --max-stored-bytes-per-key and --max-multipart-bytes must be at least 1"
    );
    anyhow::ensure!(
        args.max_connections > 0,
        "--max-connections must be at least 1"
    );
    anyhow::ensure!(
        args.slot_start_timeout != Some(0),
        "--slot-start-timeout must be at least 1 second"
    );
    anyhow::ensure!(
        args.max_slots.is_none_or(|m| m >= args.pool_size.max(1)),
        "--max-slots must be at least --pool-size (and 1)"
    );
    anyhow::ensure!(
        args.header_timeout_ms > 0,
        "--header-timeout-ms must be at least 1"
    );
    Ok(())
}

/// The longest unix socket path the kernel takes (`sun_path` less its NUL).
pub(super) const MAX_SOCKET_PATH: usize = 107;

/// The data dir can hold slots: the sockets the host dials in a slot's
/// directory fit in a unix socket address, and the host can write there.
pub(super) fn check_data_dir(
    data: &std::path::Path,
    backend: &pool::Backend,
) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let slots = pool::slots_dir(data);
    // A slot's directory is named by 32 hex digits.
    let slot = slots.join("0".repeat(32));
    let sockets = backend.slot_sockets();
    for s in sockets {
        let p = slot.join(s);
        let len = p.as_os_str().as_bytes().len();
        anyhow::ensure!(
            len <= MAX_SOCKET_PATH,
            "--data-dir {} is too long for this backend's sockets: a slot's {} would be {} ({len} bytes), past the {MAX_SOCKET_PATH}-byte limit of a unix socket path; use a data dir of at most {} bytes",
            data.display(),
            s,
            p.display(),
            data.as_os_str().as_bytes().len() - (len - MAX_SOCKET_PATH),
        );
    }
    if sockets.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(&slots)
        .with_context(|| format!("--data-dir: creating {}", slots.display()))?;
    let probe = slots.join(format!(".probe-{}", std::process::id()));
    std::fs::create_dir(&probe)
        .and_then(|()| std::fs::remove_dir(&probe))
        .with_context(|| {
            format!(
                "--data-dir {}: the host cannot make a slot's directory in {}",
                data.display(),
                slots.display()
            )
        })
}

/// The pool fits in the subordinate id blocks this host may use (one per
/// slot).
pub(super) fn check_blocks(args: &Args, blocks: u32) -> anyhow::Result<()> {
    let blocks = blocks as usize;
    anyhow::ensure!(
        args.pool_size <= blocks,
        "--pool-size {} needs {} subordinate id blocks (one per isolated sandbox); this host may use {blocks} (65,536 ids each, from /etc/subuid and /etc/subgid): lower --pool-size or grant more ids",
        args.pool_size,
        args.pool_size
    );
    if let Some(m) = args.max_slots {
        anyhow::ensure!(
            m <= blocks,
            "--max-slots {m} is more than the {blocks} subordinate id blocks this host may use (one per isolated sandbox): lower --max-slots or grant more ids in /etc/subuid and /etc/subgid"
        );
    }
    Ok(())
}

/// The data dir and what in it only this host may read: the database,
/// the signing key and the uploads are its user's alone; isolated agents
/// only pass through the data dir to their own slot's directories.
/// Returns the uploads directory.
pub(super) fn private_dirs(data: &std::path::Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
            .with_context(|| format!("chmod {m:o} {}", p.display()))
    };
    std::fs::create_dir_all(data).with_context(|| format!("creating {}", data.display()))?;
    mode(data, 0o711)?;
    let uploads = data.join("uploads");
    std::fs::create_dir_all(&uploads)?;
    mode(&uploads, 0o700)?;
    for f in ["host.db", "host.db-wal", "host.db-shm", "signing.key"] {
        let p = data.join(f);
        if p.exists() {
            mode(&p, 0o600)?;
        } else if f == "host.db" {
            // SQLite creates its WAL and shm files with the database's mode.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&p)
                .with_context(|| format!("creating {}", p.display()))?;
        }
    }
    Ok(uploads)
}
