//! Path confinement: every path the workspace code opens is resolved
//! beneath a directory handle without following any symlink.
//!
//! The mechanism is `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`. On kernels without openat2 (before 5.6) it falls
//! back to opening one component at a time with `O_NOFOLLOW`, which the
//! kernel enforces just the same. Callers also reject `..` and absolute paths
//! up front, so a message can say which entry was wrong.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use std::ffi::OsStr;

use super::error::{ArchiveError, sys};

static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Opens directory `rel` (relative, no `..`) beneath `root`. A symlink
/// anywhere on the way fails with ELOOP, a non-directory with ENOTDIR.
pub fn open_dir(root: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    open(root, rel, OFlags::DIRECTORY | OFlags::RDONLY)
}

/// Opens `rel` beneath `root` with `flags` (O_NOFOLLOW and O_CLOEXEC added).
pub fn open(root: BorrowedFd<'_>, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match rustix::fs::openat2(root, rel, flags, Mode::empty(), resolve) {
            Ok(fd) => return Ok(fd),
            Err(rustix::io::Errno::NOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
            Err(e) => return Err(sys(e)),
        }
    }
    // Fallback: one component at a time, each with O_NOFOLLOW.
    let mut cur: Option<OwnedFd> = None;
    let comps: Vec<Component<'_>> = rel
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect();
    if comps.is_empty() {
        return rustix::fs::openat(root, ".", flags, Mode::empty()).map_err(sys);
    }
    for (i, c) in comps.iter().enumerate() {
        let Component::Normal(name) = c else {
            return Err(io::Error::from_raw_os_error(nix::libc::EXDEV));
        };
        let last = i + 1 == comps.len();
        let f = if last {
            flags
        } else {
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW
        };
        let dir = cur.as_ref().map(|d| d.as_fd()).unwrap_or(root);
        cur = Some(rustix::fs::openat(dir, *name, f, Mode::empty()).map_err(sys)?);
    }
    cur.ok_or_else(|| io::Error::from_raw_os_error(nix::libc::EINVAL))
}

/// Why an archive path cannot be used; the message completes "path X …".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("contains a '..' component")]
    ParentDir,
    #[error("is absolute")]
    Absolute,
    #[error("contains a NUL byte")]
    Nul,
}

/// Checks an archive path: relative, no `..`. Returns the components left
/// after removing `.` ones (possibly none).
pub fn normalize(path: &Path) -> Result<Vec<&std::ffi::OsStr>, PathError> {
    use std::os::unix::ffi::OsStrExt;
    // No system call takes it, so it is the request's fault, said here.
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(PathError::Nul);
    }
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(PathError::ParentDir),
            Component::RootDir | Component::Prefix(_) => return Err(PathError::Absolute),
        }
    }
    Ok(out)
}

/// Removes `name` in `dir` (a whole tree if it is a directory), never
/// following symlinks, without recursion and with a bounded number of open
/// directories whatever the depth ([`sandbox_tree`]).
pub fn remove_at(dir: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<(), ArchiveError> {
    sandbox_tree::remove_at(dir, name, path)
        .map_err(|e| ArchiveError::io(format!("{} {}", e.what, e.path.display()), e.source))
}

/// Names in a directory, without `.` and `..`, sorted bytewise.
pub fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<std::ffi::OsString>> {
    sandbox_tree::list(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clear and Release remove a tenant's tree: FIFOs, sockets and links
    /// in it are unlinked, never opened (a FIFO would block), never
    /// followed.
    #[test]
    fn remove_at_never_opens_a_fifo_nor_follows_a_link() {
        let t = tempfile::tempdir().unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        nix::unistd::mkfifo(&tree.join("a/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        nix::unistd::mkfifo(&tree.join("a/b/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(tree.join("a/sock")).unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "keep").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/b/link")).unwrap();
        let dir = std::fs::File::open(t.path()).unwrap();
        remove_at(dir.as_fd(), OsStr::new("tree"), &tree).unwrap();
        assert!(!tree.exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "keep"
        );
    }
}
