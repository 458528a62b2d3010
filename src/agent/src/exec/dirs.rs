//! The executions' directories, the agent's own: checked, and emptied or
//! removed by handles, never through a symlink a tenant planted.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::Mode;

use super::DIR_FLAGS;

/// Checks that the directory `fd` is the agent's (its owner is the agent's
/// uid) and makes it writable by its owner only.
pub(super) fn check_agent_dir(fd: &OwnedFd) -> std::io::Result<()> {
    let st = rustix::fs::fstat(fd)?;
    let me = rustix::process::geteuid().as_raw();
    if st.st_uid != me {
        return Err(std::io::Error::other(format!(
            "it belongs to uid {}, not the agent's ({me}); the tenant must never own it",
            st.st_uid
        )));
    }
    if st.st_mode & 0o7777 != 0o755 {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(0o755))?;
    }
    Ok(())
}

/// Removes everything inside `dir` (which may not exist) by handles, never
/// following a symlink.
pub(super) fn clear_dir(dir: &Path) -> std::io::Result<()> {
    let fd = match rustix::fs::open(dir, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    check_agent_dir(&fd)?;
    let mut first = None;
    for name in sandbox_archive::confine::list(fd.as_fd())? {
        if let Err(e) = remove_entry(&fd, &name, &dir.join(&name)) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Removes `path` (an entry of exec.root, `root`) by handles, never
/// following a symlink.
pub(super) fn remove_tree(root: &std::path::Path, path: &std::path::Path) -> std::io::Result<()> {
    let Some(name) = path.file_name() else {
        return Ok(());
    };
    let fd: OwnedFd = rustix::fs::open(root, DIR_FLAGS, Mode::empty())?;
    match rustix::fs::statat(&fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
        Ok(_) => {}
    }
    remove_entry(&fd, name, path)
}

/// Removes entry `name` of `dir` (at `path`). An upload that lost the race
/// to a Release removes its own staging directory at the same time: an
/// entry that is gone is what was wanted, and one still there is tried
/// again (the other remover took what this one was about to).
fn remove_entry(dir: &OwnedFd, name: &std::ffi::OsStr, path: &Path) -> std::io::Result<()> {
    let mut last = None;
    for _ in 0..3 {
        match sandbox_archive::confine::remove_at(dir.as_fd(), name, path) {
            Ok(()) => return Ok(()),
            Err(_) if gone(dir, name) => return Ok(()),
            Err(e) => last = Some(std::io::Error::other(e.to_string())),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("not removed")))
}

/// Whether `name` in `dir` no longer exists.
fn gone(dir: &OwnedFd, name: &std::ffi::OsStr) -> bool {
    matches!(
        rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW),
        Err(rustix::io::Errno::NOENT)
    )
}
