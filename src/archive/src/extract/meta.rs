//! What is set on an extracted file once its data is written (mode, owner,
//! mtime), shared by the extractor and its writers.

use std::os::fd::BorrowedFd;
use std::path::Path;

use rustix::fs::{Mode, Timespec, Timestamps};

use crate::error::{ArchiveError, sys};

/// What a writer sets on a file once its data is written.
#[derive(Clone, Copy)]
pub(super) struct FileMeta {
    pub mode: u32,
    pub mtime: u64,
    /// The mode needs setting (the umask took bits of it).
    pub chmod: bool,
    pub owner: Option<(u32, u32)>,
}

/// Sets `m` on the open file `fd` (`path` for messages): mode when
/// `m.chmod`, owner when given, then mtime.
pub(super) fn apply_meta(
    fd: BorrowedFd<'_>,
    m: &FileMeta,
    path: &Path,
) -> Result<(), ArchiveError> {
    if m.chmod {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(m.mode))
            .map_err(|e| ArchiveError::io(format!("chmod {}", path.display()), sys(e)))?;
    }
    if let Some((u, g)) = m.owner {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(u)),
            Some(rustix::fs::Gid::from_raw(g)),
        )
        .map_err(|e| ArchiveError::io(format!("chown {}", path.display()), sys(e)))?;
    }
    rustix::fs::futimens(fd, &times(m.mtime))
        .map_err(|e| ArchiveError::io(format!("setting mtime of {}", path.display()), sys(e)))?;
    Ok(())
}

/// The process umask, read once from /proc (reading it with umask(2)
/// would change it). 0o777 if unknown: then every mode is set explicitly.
pub(super) fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            .unwrap_or(0o777)
    })
}

pub(super) fn times(mtime: u64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime.min(i64::MAX as u64) as i64,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}
