//! Cloning a tree by handles (a Reset's copy of the workspace): an
//! explicit stack to any depth, never following a link, each directory's
//! metadata applied once everything below it is done.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

use super::confine::list;
use super::error::{ArchiveError, WorkspaceError, ctx, sys};

/// How the swap opens a directory of the workspace.
pub(super) fn dir_flags() -> OFlags {
    OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC
}

pub(super) fn clone_dir(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    skip: Option<&OsStr>,
    max_depth: usize,
) -> Result<(), WorkspaceError> {
    /// One directory being cloned: both handles, its path, the names left,
    /// and its own metadata, applied once everything below it is done.
    struct Level {
        src: OwnedFd,
        dst: OwnedFd,
        rel: PathBuf,
        names: std::vec::IntoIter<OsString>,
        st: Option<rustix::fs::Stat>,
    }
    let open = |fd: BorrowedFd<'_>, name: &OsStr, path: &Path| {
        rustix::fs::openat(fd, name, dir_flags() | OFlags::NOFOLLOW, Mode::empty())
            .map_err(|e| WorkspaceError::io(format!("opening {}", path.display()), sys(e)))
    };
    let dup = |fd: BorrowedFd<'_>| {
        rustix::io::dup(fd).map_err(|e| WorkspaceError::io("opening the workspace", sys(e)))
    };
    let names = list(src).map_err(ctx("listing the workspace"))?;
    // An explicit stack, not recursion: a deep tree cannot overflow the
    // thread's stack.
    let mut stack = vec![Level {
        src: dup(src)?,
        dst: dup(dst)?,
        rel: PathBuf::new(),
        names: names.into_iter(),
        st: None,
    }];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.names.next() else {
            if let Some(done) = stack.pop()
                && let Some(st) = done.st
            {
                copy_dir_metadata(&done.dst, &st, &done.rel)?;
            }
            continue;
        };
        if stack.len() == 1 && Some(name.as_os_str()) == skip {
            continue;
        }
        let top = &stack[stack.len() - 1];
        let path = top.rel.join(&name);
        let st = rustix::fs::statat(&top.src, &name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| WorkspaceError::io(format!("stat {}", path.display()), sys(e)))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory {
            if stack.len() > max_depth {
                return Err(ArchiveError::Limit {
                    limit: "max_depth",
                    detail: format!(
                        "the workspace's '{}' is nested more than {max_depth} directories deep",
                        path.display()
                    ),
                }
                .into());
            }
            rustix::fs::mkdirat(&top.dst, &name, Mode::from_raw_mode(0o700))
                .map_err(|e| WorkspaceError::io(format!("creating {}", path.display()), sys(e)))?;
            let s = open(top.src.as_fd(), &name, &path)?;
            let d = open(top.dst.as_fd(), &name, &path)?;
            let names = list(s.as_fd()).map_err(ctx(format!("listing {}", path.display())))?;
            stack.push(Level {
                src: s,
                dst: d,
                rel: path,
                names: names.into_iter(),
                st: Some(st),
            });
        } else {
            rustix::fs::linkat(&top.src, &name, &top.dst, &name, AtFlags::empty())
                .map_err(|e| WorkspaceError::io(format!("linking {}", path.display()), sys(e)))?;
        }
    }
    Ok(())
}

/// A cloned directory takes its original's owner, mode and times.
fn copy_dir_metadata(
    d: &OwnedFd,
    st: &rustix::fs::Stat,
    path: &Path,
) -> Result<(), WorkspaceError> {
    let _ = rustix::fs::fchown(
        d,
        Some(rustix::fs::Uid::from_raw(st.st_uid)),
        Some(rustix::fs::Gid::from_raw(st.st_gid)),
    );
    rustix::fs::fchmod(d, Mode::from_raw_mode(st.st_mode & 0o7777))
        .map_err(|e| WorkspaceError::io(format!("chmod {}", path.display()), sys(e)))?;
    let t = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec as _,
        },
    };
    let _ = rustix::fs::futimens(d, &t);
    Ok(())
}
