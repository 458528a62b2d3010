//! Extracting a tar stream into a directory handle, safely.
//!
//! Every entry is created relative to an open directory of the target tree,
//! found with [`confine`](super::confine) (no symlink is ever followed), and
//! with `O_EXCL`/`O_NOFOLLOW`, so nothing can be written outside the tree:
//! - absolute paths and `..` components are refused;
//! - a path through a symlink (even one created by the same archive) is
//!   refused; symlinks themselves are created but never followed;
//! - hardlinks must point at a regular file extracted earlier from the same
//!   archive;
//! - device nodes are refused, FIFOs too unless `allow_fifos`;
//! - an entry may not replace one the archive already created (duplicates,
//!   file over directory, directory over file); in merge mode it may replace
//!   what was in the workspace before;
//! - setuid, setgid and sticky bits are dropped; files get the configured
//!   owner; directory modes and mtimes are applied last.
//!
//! Entries are resolved through a cached parent directory handle, so a
//! typical archive (entries grouped by directory) costs one `openat` per
//! file rather than a path walk.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};
use tar::EntryType;

use super::codec;
use super::codec::Compression;
use super::confine::{self, remove_at};
use super::error::{WsError, sys};
use super::limits::ArchiveLimits;

/// How to extract.
pub struct ExtractOptions<'a> {
    pub limits: &'a ArchiveLimits,
    pub compression: Compression,
    /// chown every entry to this owner (None: leave as created).
    pub owner: Option<(u32, u32)>,
    /// The tree already holds the previous workspace (merge mode): entries
    /// that were there before may be replaced.
    pub merge: bool,
}

/// What was extracted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExtractStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    pub fifos: u64,
    pub bytes_written: u64,
    pub entries: u64,
}

/// Counts bytes read through it.
struct Counted<R> {
    inner: R,
    n: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The compressed and expanded byte counters, for the bomb check.
struct Meter<'a> {
    limits: &'a ArchiveLimits,
    compressed: Arc<AtomicU64>,
    expanded: Arc<AtomicU64>,
}

impl Meter<'_> {
    fn check(&self) -> Result<(), WsError> {
        let compressed = self.compressed.load(Ordering::Relaxed);
        let expanded = self.expanded.load(Ordering::Relaxed);
        let l = self.limits;
        if expanded > l.ratio_grace_bytes
            && expanded > l.max_compression_ratio.saturating_mul(compressed.max(1))
        {
            return Err(WsError::Limit {
                limit: "max_compression_ratio",
                detail: format!(
                    "{expanded} bytes expanded from {compressed} compressed bytes is more than {}:1 (a decompression bomb?)",
                    l.max_compression_ratio
                ),
            });
        }
        Ok(())
    }
}

/// Decompressed blocks handed from the decoder thread to the extractor.
const BLOCK: usize = 256 << 10;
const BLOCKS_IN_FLIGHT: usize = 4;

/// `Read` over the decoder thread's blocks.
struct Blocks {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    cur: Vec<u8>,
    pos: usize,
}

impl Read for Blocks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            match self.rx.recv() {
                Ok(Ok(b)) => {
                    self.cur = b;
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn invalid(path: &[u8], what: impl std::fmt::Display) -> WsError {
    WsError::invalid(format!(
        "archive entry '{}' {what}",
        String::from_utf8_lossy(path)
    ))
}

/// Maps a read error from the decoder/tar parser.
fn read_error(e: io::Error, compression: Compression) -> WsError {
    let what = match compression {
        Compression::Gzip => "corrupt or truncated gzip stream",
        Compression::Zstd => "corrupt or truncated zstd stream",
        _ => "corrupt or truncated tar archive",
    };
    WsError::invalid(format!("{what}: {e}"))
}

/// Extracts `src` into the directory `root`. On error the tree may hold a
/// partial result; the caller discards it.
///
/// Decompression runs on its own thread, overlapping with file creation
/// (at most 1 MiB of decompressed data in flight). On success every byte of
/// `src` has been read; on error the decoder thread is left to finish on
/// its own (it stops when `src` ends or the extractor is gone).
pub fn extract<R: Read + Send + 'static>(
    src: R,
    root: BorrowedFd<'_>,
    opts: &ExtractOptions<'_>,
) -> Result<ExtractStats, WsError> {
    let meter = Meter {
        limits: opts.limits,
        compressed: Arc::new(AtomicU64::new(0)),
        expanded: Arc::new(AtomicU64::new(0)),
    };
    let mut compressed = codec::buffered(Counted {
        inner: src,
        n: meter.compressed.clone(),
    });
    let compression = codec::sniff(&mut compressed, opts.compression)
        .map_err(|e| read_error(e, opts.compression))?;
    let (tx, rx) = std::sync::mpsc::sync_channel(BLOCKS_IN_FLIGHT);
    let expanded = meter.expanded.clone();
    let decoder = std::thread::Builder::new()
        .name("ws-decode".into())
        .spawn(move || {
            let mut dec = match codec::decoder(compressed, compression) {
                Ok(d) => d,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            loop {
                let mut block = vec![0u8; BLOCK];
                let mut filled = 0;
                // Fill whole blocks: fewer, larger hand-offs.
                while filled < BLOCK {
                    match dec.read(&mut block[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                }
                if filled == 0 {
                    return;
                }
                block.truncate(filled);
                expanded.fetch_add(filled as u64, Ordering::Relaxed);
                if tx.send(Ok(block)).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| WsError::io("starting the decoder thread", e))?;
    let consumed = Arc::new(AtomicU64::new(0));
    let mut plain = Counted {
        inner: Blocks {
            rx,
            cur: Vec::new(),
            pos: 0,
        },
        n: consumed.clone(),
    };
    let mut x = Extractor::new(root, opts, &meter, compression);

    let mut last_end = 0u64;
    {
        let mut archive = tar::Archive::new(&mut plain);
        let entries = archive.entries().map_err(|e| read_error(e, compression))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| read_error(e, compression))?;
            meter.check()?;
            x.entry(&mut entry)?;
            let size = entry.header().entry_size().unwrap_or(0);
            last_end = entry.raw_file_position() + size.div_ceil(512) * 512;
        }
    }
    // The parser stops at the first zero block; if it stopped because the
    // input ended instead, the archive was cut short.
    if consumed.load(Ordering::Relaxed) <= last_end {
        return Err(WsError::invalid(
            "truncated tar archive: the stream ends without the end-of-archive marker",
        ));
    }
    // Drain the rest (end-of-archive padding) so compressed trailers and
    // checksums are verified and every byte is hashed.
    let mut sink = [0u8; 64 << 10];
    loop {
        match plain.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => meter.check()?,
            Err(e) => return Err(read_error(e, compression)),
        }
    }
    drop(plain);
    let _ = decoder.join();
    x.finish_dirs()?;
    Ok(x.stats)
}

struct Extractor<'a> {
    root: BorrowedFd<'a>,
    opts: &'a ExtractOptions<'a>,
    meter: &'a Meter<'a>,
    /// The stream's actual compression (after sniffing), for messages.
    compression: Compression,
    stats: ExtractStats,
    hasher: RandomState,
    /// Hashes of every path the archive created (explicit or implicit).
    seen: HashSet<u64>,
    /// Hashes of regular files, the only valid hardlink targets.
    files: HashSet<u64>,
    /// Directories whose mode and mtime are applied at the end.
    dirs: Vec<(PathBuf, u32, u64)>,
    parent: Option<(PathBuf, OwnedFd)>,
    buf: Vec<u8>,
    /// File content bytes written so far (for max_expanded_bytes).
    expanded: u64,
}

impl<'a> Extractor<'a> {
    fn new(
        root: BorrowedFd<'a>,
        opts: &'a ExtractOptions<'a>,
        meter: &'a Meter<'a>,
        compression: Compression,
    ) -> Extractor<'a> {
        Extractor {
            root,
            opts,
            meter,
            compression,
            stats: ExtractStats::default(),
            hasher: RandomState::new(),
            seen: HashSet::new(),
            files: HashSet::new(),
            dirs: Vec::new(),
            parent: None,
            buf: vec![0; 256 << 10],
            expanded: 0,
        }
    }

    fn key(&self, p: &Path) -> u64 {
        self.hasher.hash_one(p.as_os_str().as_bytes())
    }

    fn entry<R: Read>(&mut self, e: &mut tar::Entry<'_, R>) -> Result<(), WsError> {
        let limits = self.opts.limits;
        let kind = e.header().entry_type();
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) {
            return Ok(());
        }
        self.stats.entries += 1;
        if self.stats.entries > limits.max_entries {
            return Err(WsError::Limit {
                limit: "max_entries",
                detail: format!("the archive has more than {} entries", limits.max_entries),
            });
        }
        let raw: Vec<u8> = e.path_bytes().into_owned();
        if raw.len() > limits.max_path_bytes {
            return Err(WsError::Limit {
                limit: "max_path_bytes",
                detail: format!(
                    "an entry path is {} bytes long (limit {})",
                    raw.len(),
                    limits.max_path_bytes
                ),
            });
        }
        let comps =
            confine::normalize(Path::new(OsStr::from_bytes(&raw))).map_err(|r| invalid(&raw, r))?;
        let Some((name, parents)) = comps.split_last() else {
            // "./" itself: the workspace root keeps its own metadata.
            return if kind == EntryType::Directory {
                Ok(())
            } else {
                Err(invalid(
                    &raw,
                    "names the workspace root but is not a directory",
                ))
            };
        };
        let name: &OsStr = name;
        let parent_path: PathBuf = parents.iter().collect();
        let path = parent_path.join(name);
        if name.len() > 255 {
            return Err(invalid(&raw, "has a path component longer than 255 bytes"));
        }
        let mode = e
            .header()
            .mode()
            .map_err(|err| invalid(&raw, format!("has a bad mode field: {err}")))?
            & 0o777;
        let mtime = e.header().mtime().unwrap_or(0);
        let size = e
            .header()
            .entry_size()
            .map_err(|err| invalid(&raw, format!("has a bad size field: {err}")))?;

        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                if size > limits.max_file_bytes {
                    return Err(WsError::Limit {
                        limit: "max_file_bytes",
                        detail: format!(
                            "'{}' is {size} bytes (limit {})",
                            path.display(),
                            limits.max_file_bytes
                        ),
                    });
                }
                if self.expanded.saturating_add(size) > limits.max_expanded_bytes {
                    return Err(WsError::Limit {
                        limit: "max_expanded_bytes",
                        detail: format!(
                            "the archive expands to more than {} bytes",
                            limits.max_expanded_bytes
                        ),
                    });
                }
                self.ensure_parent(&parent_path, &raw)?;
                let fd = self.create(name, &path, &raw, |dir, n| {
                    rustix::fs::openat(
                        dir,
                        n,
                        OFlags::WRONLY
                            | OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(mode),
                    )
                })?;
                let mut file = File::from(fd);
                let mut written = 0u64;
                let mut buf = std::mem::take(&mut self.buf);
                let copied = loop {
                    let n = match e.read(&mut buf) {
                        Ok(n) => n,
                        Err(err) => break Err(read_error(err, self.compression)),
                    };
                    if n == 0 {
                        break Ok(());
                    }
                    if let Err(err) = file.write_all(&buf[..n]) {
                        break Err(WsError::io(format!("writing {}", path.display()), err));
                    }
                    written += n as u64;
                    if let Err(err) = self.meter.check() {
                        break Err(err);
                    }
                };
                self.buf = buf;
                copied?;
                if written != size {
                    return Err(invalid(
                        &raw,
                        format!("is truncated: {written} of {size} bytes"),
                    ));
                }
                self.expanded += size;
                self.meta_fd(file.as_fd(), mode, mtime, &path, mode & umask() != 0)?;
                let key = self.key(&path);
                self.files.insert(key);
                self.stats.files += 1;
                self.stats.bytes_written += size;
            }
            EntryType::Directory => {
                self.ensure_parent(&parent_path, &raw)?;
                let parent = self.parent_fd()?;
                match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) => {
                        self.chown_at(parent, name, &path)?;
                    }
                    Err(rustix::io::Errno::EXIST) => {
                        let st = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
                            .map_err(|err| {
                                WsError::io(format!("inspecting {}", path.display()), sys(err))
                            })?;
                        let is_dir = rustix::fs::FileType::from_raw_mode(st.st_mode)
                            == rustix::fs::FileType::Directory;
                        if !is_dir {
                            if self.seen.contains(&self.key(&path)) || !self.opts.merge {
                                return Err(invalid(
                                    &raw,
                                    "is a directory replacing a non-directory entry of the same archive",
                                ));
                            }
                            remove_at(parent, name, &path)?;
                            rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)).map_err(
                                |err| WsError::io(format!("creating {}", path.display()), sys(err)),
                            )?;
                            self.chown_at(parent, name, &path)?;
                        }
                    }
                    Err(err) => {
                        return Err(WsError::io(
                            format!("creating directory {}", path.display()),
                            sys(err),
                        ));
                    }
                }
                let key = self.key(&path);
                self.seen.insert(key);
                self.dirs.push((path, mode, mtime));
                self.stats.dirs += 1;
                return Ok(());
            }
            EntryType::Symlink => {
                let target = e
                    .link_name_bytes()
                    .map(|c| c.into_owned())
                    .unwrap_or_default();
                if target.is_empty() {
                    return Err(invalid(&raw, "is a symlink without a target"));
                }
                if target.len() > limits.max_path_bytes {
                    return Err(WsError::Limit {
                        limit: "max_path_bytes",
                        detail: format!("a symlink target is {} bytes long", target.len()),
                    });
                }
                self.ensure_parent(&parent_path, &raw)?;
                let t = OsStr::from_bytes(&target);
                self.create(name, &path, &raw, |dir, n| rustix::fs::symlinkat(t, dir, n))?;
                let parent = self.parent_fd()?;
                self.chown_at(parent, name, &path)?;
                let _ =
                    rustix::fs::utimensat(parent, name, &times(mtime), AtFlags::SYMLINK_NOFOLLOW);
                self.stats.symlinks += 1;
            }
            EntryType::Link => {
                let target = e
                    .link_name_bytes()
                    .map(|c| c.into_owned())
                    .unwrap_or_default();
                let tcomps = confine::normalize(Path::new(OsStr::from_bytes(&target)))
                    .map_err(|r| invalid(&raw, format!("is a hardlink whose target {r}")))?;
                let tpath: PathBuf = tcomps.iter().collect();
                if !self.files.contains(&self.key(&tpath)) {
                    return Err(invalid(
                        &raw,
                        format!(
                            "is a hardlink to '{}', which is not a regular file earlier in the archive",
                            String::from_utf8_lossy(&target)
                        ),
                    ));
                }
                let (tname, tparents) = tcomps
                    .split_last()
                    .ok_or_else(|| invalid(&raw, "is a hardlink without a target"))?;
                let tparent_path: PathBuf = tparents.iter().collect();
                let tdir = confine::open_dir(self.root, &tparent_path).map_err(|err| {
                    WsError::io(format!("opening {}", tparent_path.display()), err)
                })?;
                self.ensure_parent(&parent_path, &raw)?;
                let tname: &OsStr = tname;
                self.create(name, &path, &raw, |dir, n| {
                    rustix::fs::linkat(tdir.as_fd(), tname, dir, n, AtFlags::empty())
                })?;
                let key = self.key(&path);
                self.files.insert(key);
                self.stats.hardlinks += 1;
            }
            EntryType::Fifo if limits.allow_fifos => {
                self.ensure_parent(&parent_path, &raw)?;
                self.create(name, &path, &raw, |dir, n| {
                    rustix::fs::mknodat(
                        dir,
                        n,
                        rustix::fs::FileType::Fifo,
                        Mode::from_raw_mode(mode),
                        0,
                    )
                })?;
                let parent = self.parent_fd()?;
                self.chown_at(parent, name, &path)?;
                self.stats.fifos += 1;
            }
            EntryType::Fifo => {
                return Err(invalid(
                    &raw,
                    "is a FIFO (set archive.allow_fifos = true to allow FIFOs)",
                ));
            }
            EntryType::Char | EntryType::Block => {
                return Err(invalid(
                    &raw,
                    "is a device node; device nodes are never extracted",
                ));
            }
            other => return Err(invalid(&raw, format!("has an unsupported type {other:?}"))),
        }
        let key = self.key(&path);
        self.seen.insert(key);
        Ok(())
    }

    /// Creates `name` in `parent` with `make`. If something is in the way:
    /// an entry of this archive → refuse; an older workspace entry (merge)
    /// → remove it and retry once.
    fn create<T>(
        &self,
        name: &OsStr,
        path: &Path,
        raw: &[u8],
        make: impl Fn(BorrowedFd<'_>, &OsStr) -> rustix::io::Result<T>,
    ) -> Result<T, WsError> {
        let parent = self.parent_fd()?;
        match make(parent, name) {
            Ok(t) => Ok(t),
            Err(rustix::io::Errno::EXIST) => {
                if self.seen.contains(&self.key(path)) {
                    return Err(invalid(
                        raw,
                        "appears twice in the archive (or replaces a directory the archive created)",
                    ));
                }
                if !self.opts.merge {
                    return Err(invalid(
                        raw,
                        "would replace a directory created by earlier entries",
                    ));
                }
                remove_at(parent, name, path)?;
                make(parent, name)
                    .map_err(|e| WsError::io(format!("creating {}", path.display()), sys(e)))
            }
            Err(e) => Err(WsError::io(format!("creating {}", path.display()), sys(e))),
        }
    }

    /// The directory that holds entries under `rel`, creating missing
    /// directories (mode 0755) without following symlinks.
    /// The cached parent directory handle (see [`Self::ensure_parent`]).
    fn parent_fd(&self) -> Result<BorrowedFd<'_>, WsError> {
        match &self.parent {
            Some((_, fd)) => Ok(fd.as_fd()),
            None => Err(WsError::invalid("internal error: no parent directory")),
        }
    }

    fn ensure_parent(&mut self, rel: &Path, raw: &[u8]) -> Result<(), WsError> {
        let hit = matches!(&self.parent, Some((p, _)) if p == rel);
        if !hit {
            let fd = match confine::open_dir(self.root, rel) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => {
                    self.make_dirs(rel, raw)?
                }
                Err(e) => return Err(self.path_error(e, rel, raw)),
            };
            self.parent = Some((rel.to_owned(), fd));
        }
        Ok(())
    }

    fn make_dirs(&mut self, rel: &Path, raw: &[u8]) -> Result<OwnedFd, WsError> {
        let mut cur = rustix::fs::openat(
            self.root,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| WsError::io("opening the staging directory", sys(e)))?;
        let mut so_far = PathBuf::new();
        for comp in rel.components() {
            let name = comp.as_os_str();
            so_far.push(name);
            match rustix::fs::mkdirat(cur.as_fd(), name, Mode::from_raw_mode(0o755)) {
                Ok(()) => {
                    self.chown_at(cur.as_fd(), name, &so_far)?;
                    let key = self.key(&so_far);
                    self.seen.insert(key);
                    self.stats.dirs += 1;
                }
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => {
                    return Err(WsError::io(
                        format!("creating directory {}", so_far.display()),
                        sys(e),
                    ));
                }
            }
            cur = rustix::fs::openat(
                cur.as_fd(),
                name,
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| self.path_error(sys(e), &so_far, raw))?;
        }
        Ok(cur)
    }

    fn path_error(&self, e: io::Error, rel: &Path, raw: &[u8]) -> WsError {
        match e.raw_os_error() {
            Some(nix::libc::ELOOP) | Some(nix::libc::EXDEV) | Some(nix::libc::ENOTDIR) => {
                // Name the first component in the way, and what it is.
                let mut prefix = PathBuf::new();
                for c in rel.components() {
                    prefix.push(c);
                    let Ok(st) = rustix::fs::statat(self.root, &prefix, AtFlags::SYMLINK_NOFOLLOW)
                    else {
                        break;
                    };
                    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
                        rustix::fs::FileType::Directory => continue,
                        rustix::fs::FileType::Symlink => {
                            return invalid(
                                raw,
                                format!(
                                    "goes through the symlink '{}'; writing through symlinks is refused",
                                    prefix.display()
                                ),
                            );
                        }
                        _ => break,
                    }
                }
                invalid(
                    raw,
                    format!("is below '{}', which is not a directory", prefix.display()),
                )
            }
            _ => WsError::io(format!("opening directory {}", rel.display()), e),
        }
    }

    /// Sets mode (when `chmod`), owner and mtime. Files are created with
    /// their mode, so they need a chmod only for bits the umask removed;
    /// directories are created 0700 and always need one.
    fn meta_fd(
        &self,
        fd: BorrowedFd<'_>,
        mode: u32,
        mtime: u64,
        path: &Path,
        chmod: bool,
    ) -> Result<(), WsError> {
        if chmod {
            rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))
                .map_err(|e| WsError::io(format!("chmod {}", path.display()), sys(e)))?;
        }
        if let Some((u, g)) = self.opts.owner {
            rustix::fs::fchown(
                fd,
                Some(rustix::fs::Uid::from_raw(u)),
                Some(rustix::fs::Gid::from_raw(g)),
            )
            .map_err(|e| WsError::io(format!("chown {}", path.display()), sys(e)))?;
        }
        rustix::fs::futimens(fd, &times(mtime))
            .map_err(|e| WsError::io(format!("setting mtime of {}", path.display()), sys(e)))?;
        Ok(())
    }

    fn chown_at(&self, dir: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<(), WsError> {
        if let Some((u, g)) = self.opts.owner {
            rustix::fs::chownat(
                dir,
                name,
                Some(rustix::fs::Uid::from_raw(u)),
                Some(rustix::fs::Gid::from_raw(g)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| WsError::io(format!("chown {}", path.display()), sys(e)))?;
        }
        Ok(())
    }

    /// Applies directory modes and mtimes, deepest first (creating entries
    /// inside a directory changes its mtime).
    fn finish_dirs(&mut self) -> Result<(), WsError> {
        self.parent = None;
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.0.components().count()));
        for (path, mode, mtime) in dirs {
            let fd = confine::open_dir(self.root, &path)
                .map_err(|e| WsError::io(format!("opening {}", path.display()), e))?;
            self.meta_fd(fd.as_fd(), mode, mtime, &path, true)?;
        }
        Ok(())
    }
}

/// The process umask, read once from /proc (reading it with umask(2)
/// would change it). 0o777 if unknown: then every mode is set explicitly.
fn umask() -> u32 {
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

fn times(mtime: u64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime.min(i64::MAX as u64) as i64,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}
