//! Removing a directory tree a tenant shaped.
//!
//! A tenant decides the depth, width and kinds of what it leaves: a chain of
//! 100,000 directories, 30,000 siblings, FIFOs, sockets, links to anywhere,
//! directories of mode 0. [`remove_at`] and [`empty_dir`] remove any such
//! tree with
//! - no recursion: an explicit stack, so the thread's stack size does not
//!   matter;
//! - at most [`MAX_OPEN_DIRS`] directories open at once, whatever the depth:
//!   a directory deeper than that is first moved up to the top of the tree
//!   being removed (a rename, "flattening" the chain), so the walk never
//!   needs its parents again and never climbs by `..`;
//! - never following a link nor opening anything but a directory
//!   (`O_NOFOLLOW | O_DIRECTORY`; FIFOs, sockets and devices are unlinked
//!   by name);
//! - the first error returned, with the path it happened at.
//!
//! A tree on one filesystem is assumed (a mount point inside it cannot be
//! removed by anyone but its owner's unmount, and a rename across it fails
//! with `EXDEV`, returned as an error).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

/// Most directories one removal holds open at once (a fixed bound: with the
/// transient handle of a mode change, a removal never needs more than
/// `MAX_OPEN_DIRS + 1` descriptors).
pub const MAX_OPEN_DIRS: usize = 32;

/// How often a directory found not empty after its walk (a writer still at
/// work in it) is walked again before the removal gives up.
const MAX_REWALKS: u32 = 8;

/// Why a tree could not be removed: what was being done, where, and the
/// system's answer.
#[derive(Debug)]
pub struct RemoveError {
    pub what: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl std::fmt::Display for RemoveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.what, self.path.display(), self.source)
    }
}

impl std::error::Error for RemoveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// An I/O error of the removal's kind that keeps its path and cause.
impl From<RemoveError> for io::Error {
    fn from(e: RemoveError) -> io::Error {
        io::Error::new(e.source.kind(), e)
    }
}

impl RemoveError {
    fn new(what: &'static str, path: PathBuf, e: Errno) -> RemoveError {
        RemoveError {
            what,
            path,
            source: io::Error::from_raw_os_error(e.raw_os_error()),
        }
    }
}

/// Removes `name` in `parent`, a whole tree if it is a directory. `path`
/// only names it in errors. A name already gone is not an error.
pub fn remove_at(parent: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<(), RemoveError> {
    Remover::default().remove_at(parent, name, path)
}

/// Removes everything in the directory `dir`, which stays. `path` only
/// names it in errors.
pub fn empty_dir(dir: BorrowedFd<'_>, path: &Path) -> Result<(), RemoveError> {
    Remover::default().empty_dir(dir, path)
}

/// Removes the tree at `path` (its parent is resolved as usual, the last
/// component is never followed). A path already gone is not an error.
pub fn remove_path(path: &Path) -> Result<(), RemoveError> {
    let (parent, name) = split(path)?;
    let pfd = match rustix::fs::open(
        parent,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(RemoveError::new("opening", parent.to_owned(), e)),
    };
    remove_at(pfd.as_fd(), name, path)
}

/// Empties the directory at `path` (never followed if it is a link: then
/// it is an error).
pub fn empty_path(path: &Path) -> Result<(), RemoveError> {
    let fd = rustix::fs::open(
        path,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RemoveError::new("opening", path.to_owned(), e))?;
    empty_dir(fd.as_fd(), path)
}

fn split(path: &Path) -> Result<(&Path, &OsStr), RemoveError> {
    let bad = || RemoveError {
        what: "removing",
        path: path.to_owned(),
        source: io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a path to a removable name",
        ),
    };
    let name = path.file_name().ok_or_else(bad)?;
    let parent = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => return Err(bad()),
    };
    Ok((parent, name))
}

/// A removal with its bound on open directories (tests use small ones).
#[derive(Debug, Clone, Copy)]
pub struct Remover {
    max_open: usize,
}

impl Default for Remover {
    fn default() -> Self {
        Remover {
            max_open: MAX_OPEN_DIRS,
        }
    }
}

/// A directory being emptied: its stream (which owns its handle) and its
/// name in the level above.
struct Level {
    dir: Dir,
    name: OsString,
    /// Entries were moved into it (the top level) since its last rewind.
    moved_in: bool,
    rewalks: u32,
}

impl Level {
    fn new(fd: OwnedFd, name: OsString) -> Result<Level, Errno> {
        Ok(Level {
            dir: Dir::new(fd)?,
            name,
            moved_in: false,
            rewalks: 0,
        })
    }
    fn fd(&self) -> Result<BorrowedFd<'_>, Errno> {
        self.dir.fd()
    }
}

/// One entry read from the top level: its name and whether it is known
/// not to be a directory.
struct Entry {
    name: OsString,
    dir: bool,
}

impl Remover {
    /// A remover that holds at most `max_open` directories open (at least
    /// 2: the top one, where deeper ones move, and one below it).
    pub fn with_max_open(max_open: usize) -> Remover {
        Remover {
            max_open: max_open.max(2),
        }
    }

    pub fn remove_at(
        &self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        path: &Path,
    ) -> Result<(), RemoveError> {
        match writable(parent, || {
            rustix::fs::unlinkat(parent, name, AtFlags::empty())
        }) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::ISDIR) | Err(Errno::PERM) => {}
            Err(e) => return Err(RemoveError::new("removing", path.to_owned(), e)),
        }
        let root = match open_dir(parent, name) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(RemoveError::new("opening", path.to_owned(), e)),
        };
        self.walk(root, name.to_owned(), path)?;
        match writable(parent, || {
            rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
        }) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(RemoveError::new("removing", path.to_owned(), e)),
        }
    }

    pub fn empty_dir(&self, dir: BorrowedFd<'_>, path: &Path) -> Result<(), RemoveError> {
        let fd = rustix::fs::openat(
            dir,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| RemoveError::new("opening", path.to_owned(), e))?;
        self.walk(fd, OsString::new(), path)
    }

    /// Empties the directory `root` (named `path`), leaving it.
    fn walk(&self, root: OwnedFd, name: OsString, path: &Path) -> Result<(), RemoveError> {
        let top =
            Level::new(root, name).map_err(|e| RemoveError::new("reading", path.into(), e))?;
        let mut w = Walk {
            stack: vec![top],
            path,
            moved: 0,
            // Moving up from the top level itself would go round for ever.
            max_open: self.max_open.max(2),
        };
        loop {
            match w.next_entry()? {
                Some(e) => w.take(e)?,
                None if w.stack.len() == 1 => {
                    let top = &mut w.stack[0];
                    if !top.moved_in {
                        return Ok(());
                    }
                    // What was moved up since the last pass may have been
                    // listed already or not: one more pass sees it.
                    top.moved_in = false;
                    top.dir.rewind();
                }
                None => w.close_level()?,
            }
        }
    }
}

/// One removal in progress: the open levels, top first.
struct Walk<'a> {
    stack: Vec<Level>,
    path: &'a Path,
    moved: u64,
    max_open: usize,
}

impl Walk<'_> {
    /// The path of `n` in the first `levels` levels (for errors).
    fn at_in(&self, levels: usize, n: &OsStr) -> PathBuf {
        let mut p = self.path.to_owned();
        for l in self.stack[..levels].iter().skip(1) {
            p.push(&l.name);
        }
        p.push(n);
        p
    }

    /// The path of `n` in the deepest level (for errors).
    fn at(&self, n: &OsStr) -> PathBuf {
        self.at_in(self.stack.len(), n)
    }

    /// The deepest level's next entry (`None`: it is exhausted).
    fn next_entry(&mut self) -> Result<Option<Entry>, RemoveError> {
        let depth = self.stack.len();
        loop {
            let Some(top) = self.stack.last_mut() else {
                return Ok(None);
            };
            return match top.dir.read() {
                None => Ok(None),
                Some(Ok(e)) => {
                    let n = e.file_name().to_bytes();
                    if n == b"." || n == b".." {
                        continue;
                    }
                    Ok(Some(Entry {
                        name: OsStr::from_bytes(n).to_owned(),
                        dir: matches!(e.file_type(), FileType::Directory | FileType::Unknown),
                    }))
                }
                Some(Err(e)) => {
                    let p = self.at_in(depth - 1, OsStr::new(""));
                    Err(RemoveError::new("listing", p, e))
                }
            };
        }
    }

    /// Removes entry `e` of the deepest level: unlinked when it is not a
    /// directory, moved up when the bound is reached, else opened as the
    /// next level.
    fn take(&mut self, e: Entry) -> Result<(), RemoveError> {
        let depth = self.stack.len();
        let fd = self.stack[depth - 1]
            .fd()
            .map_err(|err| RemoveError::new("reading", self.at(&e.name), err))?;
        if !e.dir || depth >= self.max_open {
            match writable(fd, || rustix::fs::unlinkat(fd, &e.name, AtFlags::empty())) {
                Ok(()) | Err(Errno::NOENT) => return Ok(()),
                Err(Errno::ISDIR) | Err(Errno::PERM) => {}
                Err(err) => return Err(RemoveError::new("removing", self.at(&e.name), err)),
            }
        }
        if depth >= self.max_open {
            // Too deep to hold one more level: up to the top it goes, to be
            // walked from there.
            move_up(&self.stack, &e.name, &mut self.moved)
                .map_err(|err| RemoveError::new("moving", self.at(&e.name), err))?;
            self.stack[0].moved_in = true;
            return Ok(());
        }
        match open_dir(fd, &e.name) {
            Ok(sub) => {
                let l = Level::new(sub, e.name.clone())
                    .map_err(|err| RemoveError::new("reading", self.at(&e.name), err))?;
                self.stack.push(l);
                Ok(())
            }
            Err(Errno::NOENT) => Ok(()),
            // Not a directory after all (d_type unknown, or swapped
            // meanwhile): its name goes.
            Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
                match rustix::fs::unlinkat(fd, &e.name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => Ok(()),
                    Err(err) => Err(RemoveError::new("removing", self.at(&e.name), err)),
                }
            }
            Err(err) => Err(RemoveError::new("opening", self.at(&e.name), err)),
        }
    }

    /// The deepest level is exhausted: closed and removed from its parent,
    /// or walked again when something wrote into it meanwhile.
    fn close_level(&mut self) -> Result<(), RemoveError> {
        let Some(done) = self.stack.pop() else {
            return Ok(());
        };
        let Level {
            dir, name, rewalks, ..
        } = done;
        drop(dir);
        let Some(parent) = self.stack.last() else {
            return Ok(());
        };
        let pfd = parent
            .fd()
            .map_err(|err| RemoveError::new("reading", self.at(&name), err))?;
        match writable(pfd, || rustix::fs::unlinkat(pfd, &name, AtFlags::REMOVEDIR)) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(Errno::NOTEMPTY) if rewalks < MAX_REWALKS => {
                let sub = open_dir(pfd, &name)
                    .map_err(|err| RemoveError::new("opening", self.at(&name), err))?;
                let mut l = Level::new(sub, name.clone())
                    .map_err(|err| RemoveError::new("reading", self.at(&name), err))?;
                l.rewalks = rewalks + 1;
                self.stack.push(l);
                Ok(())
            }
            Err(err) => Err(RemoveError::new("removing", self.at(&name), err)),
        }
    }
}

/// A process-wide sequence for the names of moved-up directories.
static MOVED: AtomicU64 = AtomicU64::new(0);

/// Moves the directory `name` of the deepest level to the top level under
/// a name nothing has there.
fn move_up(stack: &[Level], name: &OsStr, moved: &mut u64) -> Result<(), Errno> {
    let (Some(top), Some(from)) = (stack.first(), stack.last()) else {
        return Err(Errno::INVAL);
    };
    let (to, from) = (top.fd()?, from.fd()?);
    for _ in 0..64 {
        *moved += 1;
        let fresh = format!(
            ".sandbox-tree-{}-{}-{}",
            std::process::id(),
            MOVED.fetch_add(1, Ordering::Relaxed),
            moved
        );
        let rename =
            || rustix::fs::renameat_with(from, name, to, fresh.as_str(), RenameFlags::NOREPLACE);
        let r = match rename() {
            // Without the root's bypass: both directories writable, and the
            // moved one too (its `..` changes).
            Err(Errno::ACCESS) => open_up(from, name)
                .and_then(|()| chmod_owner(from))
                .and_then(|()| chmod_owner(to))
                .and_then(|()| rename()),
            r => r,
        };
        match r {
            Err(Errno::EXIST) => continue,
            r => return r,
        }
    }
    Err(Errno::EXIST)
}

/// Opens the directory `name` in `parent`, never following a link; one
/// that cannot be read (mode 0) is opened up first.
fn open_dir(parent: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(parent, name, flags, Mode::empty()) {
        Err(Errno::ACCESS) => {
            open_up(parent, name)?;
            rustix::fs::openat(parent, name, flags, Mode::empty())
        }
        r => r,
    }
}

/// Runs `op` (a change inside the directory `dir`); if it is refused for
/// want of permission, gives the owner full access to `dir` and runs it
/// once more. A non-root remover can so remove a tree a tenant made
/// read-only (root needs no such help).
fn writable<T>(dir: BorrowedFd<'_>, op: impl Fn() -> Result<T, Errno>) -> Result<T, Errno> {
    match op() {
        Err(Errno::ACCESS) => {
            chmod_owner(dir)?;
            op()
        }
        r => r,
    }
}

fn chmod_owner(dir: BorrowedFd<'_>) -> Result<(), Errno> {
    let st = rustix::fs::fstat(dir)?;
    rustix::fs::fchmod(dir, Mode::from_raw_mode((st.st_mode | 0o700) & 0o7777))
}

/// Gives the owner full access to the directory `name` in `parent`, which
/// cannot be opened for reading (mode 0 or write-only). Through the
/// `/proc` link of an `O_PATH` handle, so a name swapped for a symlink
/// meanwhile is never followed.
fn open_up(parent: BorrowedFd<'_>, name: &OsStr) -> Result<(), Errno> {
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::chmod(link, Mode::from_raw_mode((st.st_mode | 0o700) & 0o7777))
}

/// Names in a directory, without `.` and `..`, sorted bytewise.
pub fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut d = Dir::read_from(dir).map_err(io::Error::from)?;
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let e = e.map_err(io::Error::from)?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_owned());
        }
    }
    out.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(out)
}

#[cfg(test)]
mod tests;
