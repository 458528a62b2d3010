//! Writing a directory tree as a tar archive.
//!
//! The walk goes through directory handles with `O_NOFOLLOW`, never through
//! paths, so a process that swaps a directory for a symlink while the dump
//! runs cannot make the agent read outside the tree. Entries are sorted by
//! name (reproducible archives). Paths are `./`-relative; long and non-UTF-8
//! names use GNU long-name headers and sizes over 8 GiB GNU binary size
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

/// Appends an entry named exactly `path` (keeping the `./` prefix that the
/// tar crate strips from short names; long names go through its GNU
/// long-name records, which keep the bytes as given).
fn append<W: Write>(
    b: &mut tar::Builder<W>,
    h: &mut tar::Header,
    path: &Path,
    data: impl Read,
) -> Result<(), ArchiveError> {
    let raw = path.as_os_str().as_bytes();
    let r = if raw.len() <= 100 {
        let name = &mut h.as_old_mut().name;
        name.fill(0);
        name[..raw.len()].copy_from_slice(raw);
        h.set_cksum();
        b.append(h, data)
    } else {
        b.append_data(h, path, data)
    };
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
    let mut reader = Exact {
        file: File::from(fd),
        left: size,
        short: false,
        cancelled: opts.cancelled,
    };
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
fn open_file(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    stats: &mut PackStats,
) -> Result<Option<(OwnedFd, rustix::fs::Stat)>, ArchiveError> {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
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
    if target.as_bytes().len() <= 100 && name.as_os_str().len() <= 100 {
        let link = &mut h.as_old_mut().linkname;
        link.fill(0);
        link[..target.as_bytes().len()].copy_from_slice(target.as_bytes());
        append(b, &mut h, &name, io::empty())?;
    } else {
        let target = Path::new(OsStr::from_bytes(target.as_bytes()));
        b.append_link(&mut h, &name, target)
            .map_err(|e| ArchiveError::io(format!("archiving {}", path.display()), e))?;
    }
    stats.symlinks += 1;
    Ok(())
}

/// Reads exactly `left` bytes: a file that shrank is padded with zeros, one
/// that grew is cut, so the header's size stays true.
struct Exact<'a> {
    file: File,
    left: u64,
    short: bool,
    /// Checked on every read: a big file stops mid-way when the dump is
    /// cancelled.
    cancelled: Option<&'a AtomicBool>,
}

impl Read for Exact<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        if self.cancelled.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(io::Error::other("the dump was cancelled"));
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = if self.short {
            0
        } else {
            self.file.read(&mut buf[..want])?
        };
        let n = if n == 0 {
            self.short = true;
            buf[..want].fill(0);
            want
        } else {
            n
        };
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::codec::Compression;
    use crate::extract::{ExtractOptions, extract};
    use crate::limits::ArchiveLimits;

    fn pack_dir_at(
        root: &Path,
        opts: &PackOptions<'_>,
    ) -> Result<(Vec<u8>, PackStats), ArchiveError> {
        let dir = fs::File::open(root).expect("open");
        pack(dir.as_fd(), opts, Vec::new())
    }

    /// The paths of an archive's entries, in order.
    fn names(tar: &[u8]) -> Vec<String> {
        let mut a = tar::Archive::new(tar);
        a.entries()
            .expect("entries")
            .map(|e| String::from_utf8_lossy(&e.expect("entry").path_bytes()).into_owned())
            .collect()
    }

    #[test]
    fn a_tree_packs_and_extracts_back_the_same() {
        let src = tempfile::tempdir().expect("tempdir");
        let s = src.path();
        fs::create_dir_all(s.join("a/b")).expect("mkdir");
        fs::write(s.join("a/b/file"), b"content").expect("write");
        fs::set_permissions(s.join("a/b/file"), fs::Permissions::from_mode(0o640)).expect("chmod");
        fs::create_dir(s.join("empty")).expect("mkdir");
        let long = "l".repeat(150);
        fs::write(s.join(&long), b"long name").expect("write");
        let far = format!("../{}", "t".repeat(150));
        std::os::unix::fs::symlink("a/b/file", s.join("near")).expect("symlink");
        std::os::unix::fs::symlink(&far, s.join("far")).expect("symlink");
        nix::unistd::mkfifo(&s.join("fifo"), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");

        let (tar, stats) = pack_dir_at(s, &PackOptions::default()).expect("pack");
        assert_eq!(
            (
                stats.files,
                stats.dirs,
                stats.symlinks,
                stats.skipped_special
            ),
            (2, 3, 2, 1)
        );
        assert_eq!(stats.content_bytes, 16);
        assert!(stats.changed.is_empty());
        let listed = names(&tar);
        assert_eq!(listed[0], "./");
        // A symlink with a long target goes through the tar crate's
        // `append_link`, which drops the "./" of its name.
        assert!(
            listed.iter().all(|n| n.starts_with("./") || n == "far"),
            "{listed:?}"
        );
        assert!(listed.contains(&"./a/b/".to_owned()), "{listed:?}");

        let dst = tempfile::tempdir().expect("tempdir");
        let d = dst.path();
        let root = fs::File::open(d).expect("open");
        let limits = ArchiveLimits::default();
        let opts = ExtractOptions {
            limits: &limits,
            compression: Compression::Auto,
            owner: None,
            merge: false,
        };
        extract(std::io::Cursor::new(tar), root.as_fd(), &opts).expect("extract");
        assert_eq!(fs::read(d.join("a/b/file")).expect("read"), b"content");
        let mode = fs::metadata(d.join("a/b/file"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        assert_eq!(fs::read(d.join(&long)).expect("read"), b"long name");
        assert!(d.join("empty").is_dir());
        assert_eq!(
            fs::read_link(d.join("near")).expect("link"),
            Path::new("a/b/file")
        );
        assert_eq!(fs::read_link(d.join("far")).expect("link"), Path::new(&far));
        assert!(!d.join("fifo").exists());
    }

    #[test]
    fn max_depth_bounds_the_walk() {
        let src = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(src.path().join("a/b/c")).expect("mkdir");
        let opts = |max_depth| PackOptions {
            max_depth,
            ..PackOptions::default()
        };
        pack_dir_at(src.path(), &opts(3)).expect("3 deep");
        match pack_dir_at(src.path(), &opts(2)) {
            Err(ArchiveError::Limit { limit, detail }) => {
                assert_eq!(limit, "max_depth");
                assert!(detail.contains("'a/b/c'"), "{detail}");
            }
            other => panic!("expected a max_depth limit, got {other:?}"),
        }
    }

    #[test]
    fn hidden_and_excluded_names_are_left_out_with_what_is_below() {
        let src = tempfile::tempdir().expect("tempdir");
        let s = src.path();
        fs::create_dir_all(s.join(".state/x")).expect("mkdir");
        fs::create_dir_all(s.join("sub/.state")).expect("mkdir");
        fs::create_dir_all(s.join("skip/deep")).expect("mkdir");
        fs::write(s.join("skip/deep/f"), b"x").expect("write");
        fs::write(s.join("keep"), b"x").expect("write");
        let exclude = |p: &Path| p == Path::new("skip");
        let opts = PackOptions {
            hidden: Some(OsStr::new(".state")),
            exclude: Some(&exclude),
            ..PackOptions::default()
        };
        let (tar, _) = pack_dir_at(s, &opts).expect("pack");
        assert_eq!(names(&tar), vec!["./", "./keep", "./sub/", "./sub/.state/"]);
    }

    #[test]
    fn a_cancelled_walk_ends_with_cancelled() {
        let src = tempfile::tempdir().expect("tempdir");
        fs::create_dir(src.path().join("d")).expect("mkdir");
        let cancelled = AtomicBool::new(true);
        let opts = PackOptions {
            cancelled: Some(&cancelled),
            ..PackOptions::default()
        };
        assert!(matches!(
            pack_dir_at(src.path(), &opts),
            Err(ArchiveError::Cancelled(_))
        ));
    }

    #[test]
    fn a_cancelled_dump_stops_inside_a_file() {
        let src = tempfile::tempdir().expect("tempdir");
        let p = src.path().join("f");
        fs::write(&p, b"abc").expect("write");
        let cancelled = AtomicBool::new(true);
        let mut r = Exact {
            file: File::open(&p).expect("open"),
            left: 3,
            short: false,
            cancelled: Some(&cancelled),
        };
        let e = r.read(&mut [0; 8]).expect_err("cancelled");
        assert_eq!(e.to_string(), "the dump was cancelled");
    }

    #[test]
    fn a_file_that_shrank_is_padded_to_its_size() {
        let src = tempfile::tempdir().expect("tempdir");
        let p = src.path().join("f");
        fs::write(&p, b"abc").expect("write");
        let mut r = Exact {
            file: File::open(&p).expect("open"),
            left: 6,
            short: false,
            cancelled: None,
        };
        let mut out = Vec::new();
        r.read_to_end(&mut out).expect("read");
        assert_eq!(out, b"abc\0\0\0");
        assert!(r.short);
    }
}
