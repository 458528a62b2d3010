//! Writing a directory tree as a tar archive.
//!
//! The walk goes through directory handles with `O_NOFOLLOW`, never through
//! paths, so a process that swaps a directory for a symlink while the dump
//! runs cannot make the agent read outside the tree. Entries are sorted by
//! name (reproducible archives). Paths are `./`-relative; long and non-UTF-8
//! names (and link targets) use GNU long-name (long-link) records and sizes over 8 GiB GNU binary size
//! fields (what GNU tar reads and writes). Files that change while they are
//! read never break the archive: a short read is padded and the file is
//! reported as changed.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::confine::list;
use super::error::{ArchiveError, sys};
use exact::Exact;

/// At most this many changed paths are reported in a trailer.
pub const MAX_CHANGED_REPORTED: usize = 1000;
/// Deepest directory nesting packed or extracted, unless configured
/// (`ArchiveLimits::max_depth`). The walk holds one open directory per
/// level, so this also bounds its descriptors.
pub const MAX_DEPTH: usize = 256;

pub struct PackOptions<'a> {
    /// Which paths (relative, without `./`) to leave out; a directory left
    /// out goes with everything below it. The caller decides how paths
    /// match (the agent: a glob set).
    pub exclude: Option<&'a (dyn Fn(&Path) -> bool + Sync)>,
    /// A top-level name to leave out (the workspace's inner state dir).
    pub hidden: Option<&'a OsStr>,
    /// Set by the consumer when it stops reading; the walk then ends with
    /// `Cancelled`.
    pub cancelled: Option<&'a AtomicBool>,
    /// A directory nested deeper than this ends the walk with a `Limit`
    /// error (`max_depth`).
    pub max_depth: usize,
}

impl Default for PackOptions<'_> {
    fn default() -> Self {
        PackOptions {
            exclude: None,
            hidden: None,
            cancelled: None,
            max_depth: MAX_DEPTH,
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct PackStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub skipped_special: u64,
    pub content_bytes: u64,
    pub changed: Vec<String>,
    pub changed_truncated: bool,
}

impl PackStats {
    fn changed(&mut self, p: &Path) {
        if self.changed.len() < MAX_CHANGED_REPORTED {
            self.changed.push(p.display().to_string());
        } else {
            self.changed_truncated = true;
        }
    }
}

/// Appends the tree under `root` to `out`, then the end-of-archive marker.
pub fn pack<W: Write>(
    root: BorrowedFd<'_>,
    opts: &PackOptions<'_>,
    out: W,
) -> Result<(W, PackStats), ArchiveError> {
    let mut b = tar::Builder::new(out);
    let mut stats = PackStats::default();
    let st = rustix::fs::fstat(root)
        .map_err(|e| ArchiveError::io("stat of the dumped directory", sys(e)))?;
    append_dir_header(&mut b, &st, Path::new("./"))?;
    walk(&mut b, root, opts, &mut stats)?;
    let out = b
        .into_inner()
        .map_err(|e| ArchiveError::io("finishing the archive", e))?;
    Ok((out, stats))
}

fn archive_path(rel: &Path, dir: bool) -> PathBuf {
    let mut p = PathBuf::from(".");
    p.push(rel);
    if dir {
        let mut s = p.into_os_string();
        s.push("/");
        p = PathBuf::from(s);
    }
    p
}

/// What a tar header's name and link name fields hold.
const NAME_LEN: usize = 100;

/// A GNU long-name (`L`) or long-link (`K`) record holding `bytes` whole,
/// for the entry that follows, written with the tar crate's own header.
fn append_long<W: Write>(
    b: &mut tar::Builder<W>,
    kind: tar::EntryType,
    bytes: &[u8],
) -> io::Result<()> {
    let mut h = tar::Header::new_gnu();
    let name = b"././@LongLink";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(bytes.len() as u64 + 1);
    h.set_cksum();
    b.append(&h, bytes.chain(&[0u8][..]))
}

fn header(st: &rustix::fs::Stat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_size(size);
    h
}

fn append_dir_header<W: Write>(
    b: &mut tar::Builder<W>,
    st: &rustix::fs::Stat,
    path: &Path,
) -> Result<(), ArchiveError> {
    let mut h = header(st, tar::EntryType::Directory, 0);
    append(b, &mut h, path, io::empty())
}

/// Appends an entry named exactly `path`, its `./` prefix kept (the tar
/// crate drops it, and writes a GNU long-name record only for what does not
/// fit once it is dropped, so names of 101–102 bytes would lose it).
fn append<W: Write>(
    b: &mut tar::Builder<W>,
    h: &mut tar::Header,
    path: &Path,
    data: impl Read,
) -> Result<(), ArchiveError> {
    let raw = path.as_os_str().as_bytes();
    let r = (|| {
        if raw.len() > NAME_LEN {
            append_long(b, tar::EntryType::GNULongName, raw)?;
        }
        let shown = &raw[..raw.len().min(NAME_LEN)];
        let name = &mut h.as_old_mut().name;
        name.fill(0);
        name[..shown.len()].copy_from_slice(shown);
        h.set_cksum();
        b.append(h, data)
    })();
    r.map_err(|e| ArchiveError::io(format!("archiving {}", path.display()), e))
}

/// One directory being walked: its handle, its path and the names still
/// to visit.
struct Level {
    dir: OwnedFd,
    rel: PathBuf,
    names: std::vec::IntoIter<std::ffi::OsString>,
}

fn listed(dir: OwnedFd, rel: PathBuf) -> Result<Level, ArchiveError> {
    let names = list(dir.as_fd()).map_err(|e| {
        ArchiveError::io(format!("listing {}", archive_path(&rel, true).display()), e)
    })?;
    Ok(Level {
        dir,
        rel,
        names: names.into_iter(),
    })
}

/// Walks the tree depth-first in name order with an explicit stack (no
/// recursion: a deep tree cannot overflow the thread's stack).
fn walk<W: Write>(
    b: &mut tar::Builder<W>,
    root: BorrowedFd<'_>,
    opts: &PackOptions<'_>,
    stats: &mut PackStats,
) -> Result<(), ArchiveError> {
    let root = rustix::io::dup(root)
        .map_err(|e| ArchiveError::io("opening the dumped directory", sys(e)))?;
    let mut stack = vec![listed(root, PathBuf::new())?];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.names.next() else {
            stack.pop();
            continue;
        };
        if opts.cancelled.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(ArchiveError::Cancelled(
                "the receiver of the archive went away".into(),
            ));
        }
        let depth = stack.len() - 1;
        let top = &stack[depth];
        if depth == 0 && Some(name.as_os_str()) == opts.hidden {
            continue;
        }
        let path = top.rel.join(&name);
        if opts.exclude.is_some_and(|leave_out| leave_out(&path)) {
            continue;
        }
        let dir = top.dir.as_fd();
        if let Some(sub) = entry(b, dir, &name, &path, opts, stats, depth)? {
            stack.push(listed(sub, path)?);
        }
    }
    Ok(())
}

/// Archives one entry of `dir`; returns the handle of a directory to walk
/// into. What vanished since the listing is left out; what changed kind is
/// left out and reported as changed; special files are counted and skipped.
fn entry<W: Write>(
    b: &mut tar::Builder<W>,
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    opts: &PackOptions<'_>,
    stats: &mut PackStats,
    depth: usize,
) -> Result<Option<OwnedFd>, ArchiveError> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        // Deleted between listing and stat: it is simply not in the dump.
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(ArchiveError::io(format!("stat {}", path.display()), sys(e))),
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => {
            check_depth(path, depth, opts.max_depth)?;
            return pack_dir(b, dir, name, path, &st, stats);
        }
        FileType::RegularFile => pack_file(b, dir, name, path, opts, stats)?,
        FileType::Symlink => pack_symlink(b, dir, name, path, &st, stats)?,
        _ => stats.skipped_special += 1,
    }
    Ok(None)
}

/// Refuses a directory at `depth` (its parent's) nested deeper than
/// `max_depth`.
fn check_depth(path: &Path, depth: usize, max_depth: usize) -> Result<(), ArchiveError> {
    if depth + 1 > max_depth {
        return Err(ArchiveError::Limit {
            limit: "max_depth",
            detail: format!(
                "'{}' is nested more than {} directories deep",
                path.display(),
                max_depth
            ),
        });
    }
    Ok(())
}

/// A directory: its header, and its handle to walk into.
fn pack_dir<W: Write>(
    b: &mut tar::Builder<W>,
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    st: &rustix::fs::Stat,
    stats: &mut PackStats,
) -> Result<Option<OwnedFd>, ArchiveError> {
    let sub = match rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        // Replaced by a symlink or file since the stat.
        Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::NOTDIR) => {
            stats.changed(path);
            return Ok(None);
        }
        Err(e) => {
            return Err(ArchiveError::io(
                format!("opening {}", path.display()),
                sys(e),
            ));
        }
    };
    append_dir_header(b, st, &archive_path(path, true))?;
    stats.dirs += 1;
    Ok(Some(sub))
}

/// A regular file, read by its handle: exactly the size it had when
/// opened (see [`Exact`]); reported as changed if it changed meanwhile.
fn pack_file<W: Write>(
    b: &mut tar::Builder<W>,
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    opts: &PackOptions<'_>,
    stats: &mut PackStats,
) -> Result<(), ArchiveError> {
    let Some((fd, before)) = open_file(dir, name, path, stats)? else {
        return Ok(());
    };
    let size = before.st_size.max(0) as u64;
    let mut h = header(&before, tar::EntryType::Regular, size);
    let mut reader = Exact::new(File::from(fd), size, opts.cancelled);
    if let Err(e) = append(b, &mut h, &archive_path(path, false), &mut reader) {
        if opts.cancelled.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(ArchiveError::Cancelled(
                "the receiver of the archive went away".into(),
            ));
        }
        return Err(e);
    }
    let after = rustix::fs::fstat(&reader.file)
        .map_err(|e| ArchiveError::io(format!("stat {}", path.display()), sys(e)))?;
    if reader.short
        || after.st_size != before.st_size
        || after.st_mtime != before.st_mtime
        || after.st_mtime_nsec != before.st_mtime_nsec
    {
        stats.changed(path);
    }
    stats.files += 1;
    stats.content_bytes += size;
    Ok(())
}

/// Opens a regular file without following a symlink, with its stat; `None`
/// if it is gone or no longer a regular file (then reported as changed).
/// `O_NONBLOCK`: a file swapped for a FIFO after the walk's stat (a tenant
/// writes the tree) never blocks the open; `fstat` then refuses it.
fn open_file(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    stats: &mut PackStats,
) -> Result<Option<(OwnedFd, rustix::fs::Stat)>, ArchiveError> {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(rustix::io::Errno::LOOP) => {
            stats.changed(path);
            return Ok(None);
        }
        Err(e) => {
            return Err(ArchiveError::io(
                format!("opening {}", path.display()),
                sys(e),
            ));
        }
    };
    let st = rustix::fs::fstat(&fd)
        .map_err(|e| ArchiveError::io(format!("stat {}", path.display()), sys(e)))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        stats.changed(path);
        return Ok(None);
    }
    Ok(Some((fd, st)))
}

/// A symlink, its target as it is (GNU long-link records past 100 bytes).
fn pack_symlink<W: Write>(
    b: &mut tar::Builder<W>,
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    st: &rustix::fs::Stat,
    stats: &mut PackStats,
) -> Result<(), ArchiveError> {
    let target = match rustix::fs::readlinkat(dir, name, Vec::new()) {
        Ok(t) => t,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => {
            return Err(ArchiveError::io(
                format!("reading link {}", path.display()),
                sys(e),
            ));
        }
    };
    let mut h = header(st, tar::EntryType::Symlink, 0);
    let name = archive_path(path, false);
    let target = target.as_bytes();
    if target.len() > NAME_LEN {
        append_long(b, tar::EntryType::GNULongLink, target)
            .map_err(|e| ArchiveError::io(format!("archiving {}", path.display()), e))?;
    }
    let shown = &target[..target.len().min(NAME_LEN)];
    let link = &mut h.as_old_mut().linkname;
    link.fill(0);
    link[..shown.len()].copy_from_slice(shown);
    append(b, &mut h, &name, io::empty())?;
    stats.symlinks += 1;
    Ok(())
}

mod exact;
#[cfg(test)]
mod tests;
