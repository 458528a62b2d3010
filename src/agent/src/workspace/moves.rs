//! Moving the top-level entries of a swap between the workspace and the
//! state directory, and what a non-root agent needs first: a directory
//! moved to another parent has its `..` rewritten, which needs write
//! permission on it.

use std::ffi::{OsStr, OsString};
use std::os::fd::BorrowedFd;
use std::path::Path;

use rustix::fs::{AtFlags, Mode};

use super::confine::list;
use super::error::{WorkspaceError, ctx, sys};
use super::fault::fault_point;

/// The top-level directories of `dir` (but `skip`) that this process
/// cannot rename to another directory: that rewrites a directory's `..`,
/// which needs write permission on it unless privileged. Always none for
/// root.
pub(super) fn unmovable(
    dir: BorrowedFd<'_>,
    skip: Option<&OsStr>,
) -> Result<Vec<(OsString, rustix::fs::Stat)>, WorkspaceError> {
    if rustix::process::geteuid().is_root() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for name in list(dir).map_err(ctx("listing a directory to move"))? {
        if Some(name.as_os_str()) == skip {
            continue;
        }
        let st = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| {
            WorkspaceError::io(format!("inspecting {}", Path::new(&name).display()), sys(e))
        })?;
        let is_dir =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory;
        if is_dir
            && rustix::fs::accessat(dir, &name, rustix::fs::Access::WRITE_OK, AtFlags::empty())
                .is_err()
        {
            out.push((name, st));
        }
    }
    Ok(out)
}

/// Adds owner write permission to `dirs` (found by [`unmovable`]).
pub(super) fn open_up(
    dir: BorrowedFd<'_>,
    dirs: &[(OsString, rustix::fs::Stat)],
) -> Result<(), WorkspaceError> {
    for (name, st) in dirs {
        rustix::fs::chmodat(
            dir,
            name,
            Mode::from_raw_mode((st.st_mode | 0o700) & 0o7777),
            AtFlags::empty(),
        )
        .map_err(|e| {
            WorkspaceError::io(
                format!("making {} movable", Path::new(name).display()),
                sys(e),
            )
        })?;
    }
    Ok(())
}

/// Gives `dirs` their recorded modes back (best effort: a directory left
/// writable by its owner is the only cost of a failure).
pub(super) fn restore_modes(dir: BorrowedFd<'_>, dirs: &[(OsString, rustix::fs::Stat)]) {
    for (name, st) in dirs {
        let mode = Mode::from_raw_mode(st.st_mode & 0o7777);
        if let Err(e) = rustix::fs::chmodat(dir, name, mode, AtFlags::empty()) {
            tracing::warn!(entry = %Path::new(name).display(), error = %e, "could not restore a directory's mode");
        }
    }
}

/// Renames every entry of `from` (but `skip`) into `to`; returns how many.
/// `fault` names the test fault point hit after the first move.
pub(super) fn move_entries(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    skip: Option<&OsStr>,
    direction: &str,
    fault: &str,
) -> Result<u64, WorkspaceError> {
    let mut n = 0;
    for name in list(from).map_err(ctx("listing a directory to move"))? {
        if Some(name.as_os_str()) == skip {
            continue;
        }
        rustix::fs::renameat(from, &name, to, &name).map_err(|e| {
            WorkspaceError::io(
                format!(
                    "moving {} {direction} the workspace",
                    Path::new(&name).display()
                ),
                sys(e),
            )
        })?;
        n += 1;
        if n == 1 {
            fault_point(fault);
        }
    }
    Ok(n)
}
