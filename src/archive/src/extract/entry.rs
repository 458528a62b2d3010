//! One tar entry into the tree: path checks, type dispatch, limits.
//!
//! [`Extractor::entry`] checks what every entry shares (its path: [`target`];
//! its mode, mtime and real size: [`meta`]) and hands it to the function of
//! its type: [`file`], [`dir`], [`symlink`], [`hardlink`], [`fifo`]; any
//! other type is [`refused`]. PAX and GNU long-name records never get here
//! as entries of their own: the tar reader folds them into the entry they
//! describe.
//!
//! [`target`]: Extractor::target
//! [`meta`]: Extractor::meta
//! [`file`]: Extractor::file
//! [`dir`]: Extractor::dir
//! [`symlink`]: Extractor::symlink
//! [`hardlink`]: Extractor::hardlink
//! [`fifo`]: Extractor::fifo

use std::collections::HashSet;
use std::ffi::OsStr;
use std::hash::{BuildHasher, RandomState};
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, Mode};
use tar::EntryType;

use crate::codec::Compression;
use crate::confine::{self, remove_at};
use crate::error::{ArchiveError, sys};

use super::dirs::DirTree;
use super::meta::times;
use super::writers::Writers;
use super::{ExtractOptions, ExtractStats, Meter, invalid};

pub(super) struct Extractor<'a> {
    pub(super) root: BorrowedFd<'a>,
    pub(super) opts: &'a ExtractOptions<'a>,
    pub(super) meter: &'a Meter<'a>,
    /// The stream's actual compression (after sniffing), for messages.
    pub(super) compression: Compression,
    pub(super) stats: ExtractStats,
    pub(super) hasher: RandomState,
    /// Hashes of every path the archive created (explicit or implicit).
    pub(super) seen: HashSet<u64>,
    /// Hashes of regular files, the only valid hardlink targets.
    pub(super) files: HashSet<u64>,
    /// Directories whose mode and mtime are applied at the end.
    pub(super) dirs: DirTree,
    /// Entries plus the directories created implicitly, for max_entries.
    pub(super) created: u64,
    pub(super) parent: Option<(PathBuf, Arc<OwnedFd>)>,
    /// The cached parent is setgid (only looked at when the owner is this
    /// process's own: see `file_owner`).
    pub(super) parent_setgid: bool,
    /// This process's effective uid and gid.
    pub(super) me: (u32, u32),
    /// Threads writing file contents (`archive.extract_writers`; none: this
    /// thread writes them).
    pub(super) writers: Option<Writers>,
    pub(super) buf: Vec<u8>,
    /// File content bytes written so far (for max_expanded_bytes).
    pub(super) expanded: u64,
}

/// Where an entry goes, its path checked.
pub(super) struct Target<'r> {
    /// The path as the archive gives it, for messages.
    pub(super) raw: &'r [u8],
    /// The last component: the name created in `parent`.
    pub(super) name: &'r OsStr,
    /// The directory that holds it, relative to the root.
    pub(super) parent: PathBuf,
    /// `parent` joined with `name`.
    pub(super) path: PathBuf,
}

/// What the header says of an entry besides its path and type.
pub(super) struct Meta {
    /// Permission bits only (setuid, setgid and sticky dropped).
    pub(super) mode: u32,
    pub(super) mtime: u64,
    /// The real size: the largest of the fields that may carry it.
    pub(super) size: u64,
}

/// Records the tar reader folds into the entry that follows them.
fn is_extension(kind: EntryType) -> bool {
    matches!(
        kind,
        EntryType::XGlobalHeader
            | EntryType::XHeader
            | EntryType::GNULongName
            | EntryType::GNULongLink
    )
}

/// The error for an entry of a type that is never extracted.
fn refused(raw: &[u8], kind: EntryType) -> ArchiveError {
    match kind {
        EntryType::Char | EntryType::Block => {
            invalid(raw, "is a device node; device nodes are never extracted")
        }
        other => {
            let b = other.as_byte();
            let shown = if b.is_ascii_graphic() {
                format!("'{}'", b as char)
            } else {
                format!("byte {b}")
            };
            invalid(raw, format!("has an unsupported type {shown}"))
        }
    }
}

impl<'a> Extractor<'a> {
    pub(super) fn new(
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
            dirs: DirTree::default(),
            created: 0,
            parent: None,
            parent_setgid: false,
            me: (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            ),
            writers: None,
            buf: vec![0; 256 << 10],
            expanded: 0,
        }
    }

    /// Counts one more entry or implicit directory against max_entries
    /// (the implicit ones too: each costs a directory and tracking).
    pub(super) fn count_created(&mut self) -> Result<(), ArchiveError> {
        self.created += 1;
        let max = self.opts.limits.max_entries;
        if self.created > max {
            return Err(ArchiveError::Limit {
                limit: "max_entries",
                detail: format!(
                    "the archive has more than {max} entries (counting the directories its \
                     paths create without entries of their own)"
                ),
            });
        }
        Ok(())
    }

    pub(super) fn key(&self, p: &Path) -> u64 {
        self.hasher.hash_one(p.as_os_str().as_bytes())
    }

    /// Extracts one entry: the checks every entry shares, then the function
    /// of its type.
    pub(super) fn entry<R: Read>(&mut self, e: &mut tar::Entry<'_, R>) -> Result<(), ArchiveError> {
        let kind = e.header().entry_type();
        if is_extension(kind) {
            return Ok(());
        }
        self.stats.entries += 1;
        self.count_created()?;
        let raw: Vec<u8> = e.path_bytes().into_owned();
        let Some(t) = self.target(&raw, kind)? else {
            // "./" itself: the workspace root keeps its own metadata.
            return Ok(());
        };
        let m = Self::meta(e, &raw, kind)?;
        // Files the writers create must exist before anything could meet
        // them: a name the archive used already (a duplicate, a file over a
        // directory or the reverse) and a hard link's target.
        if self.writers.is_some()
            && (kind == EntryType::Link || self.seen.contains(&self.key(&t.path)))
            && let Some(w) = &mut self.writers
        {
            w.barrier()?;
        }
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(e, &t, &m)?
            }
            EntryType::Directory => self.dir(&t, &m)?,
            EntryType::Symlink => self.symlink(e, &t, m.mtime)?,
            EntryType::Link => self.hardlink(e, &t)?,
            EntryType::Fifo => self.fifo(&t, m.mode)?,
            other => return Err(refused(&raw, other)),
        }
        let key = self.key(&t.path);
        self.seen.insert(key);
        Ok(())
    }

    /// Checks an entry's path: its length, no `..` nor absolute path, not
    /// the reserved name, its depth, its last component's length. `None`
    /// for the root itself (`./`), which only a directory may name.
    fn target<'r>(
        &self,
        raw: &'r [u8],
        kind: EntryType,
    ) -> Result<Option<Target<'r>>, ArchiveError> {
        let limits = self.opts.limits;
        if raw.len() > limits.max_path_bytes {
            return Err(ArchiveError::Limit {
                limit: "max_path_bytes",
                detail: format!(
                    "an entry path is {} bytes long (limit {})",
                    raw.len(),
                    limits.max_path_bytes
                ),
            });
        }
        let comps =
            confine::normalize(Path::new(OsStr::from_bytes(raw))).map_err(|r| invalid(raw, r))?;
        if comps.first().is_some_and(|c| *c == super::RESERVED_NAME) {
            return Err(invalid(
                raw,
                format!(
                    "uses the top-level name {}, reserved for the agent's own state",
                    super::RESERVED_NAME
                ),
            ));
        }
        if comps.len() > limits.max_depth {
            return Err(ArchiveError::Limit {
                limit: "max_depth",
                detail: format!(
                    "an entry is nested {} directories deep (limit {})",
                    comps.len(),
                    limits.max_depth
                ),
            });
        }
        let Some((name, parents)) = comps.split_last() else {
            return if kind == EntryType::Directory {
                Ok(None)
            } else {
                Err(invalid(
                    raw,
                    "names the workspace root but is not a directory",
                ))
            };
        };
        if name.len() > 255 {
            return Err(invalid(raw, "has a path component longer than 255 bytes"));
        }
        let parent: PathBuf = parents.iter().collect();
        let path = parent.join(name);
        Ok(Some(Target {
            raw,
            name,
            parent,
            path,
        }))
    }

    /// Reads an entry's mode, mtime and real size, and refuses PAX sparse
    /// files.
    fn meta<R: Read>(
        e: &mut tar::Entry<'_, R>,
        raw: &[u8],
        kind: EntryType,
    ) -> Result<Meta, ArchiveError> {
        let mode = e
            .header()
            .mode()
            .map_err(|err| invalid(raw, format!("has a bad mode field: {err}")))?
            & 0o777;
        let mtime = e.header().mtime().unwrap_or(0);
        // The real size, whatever field carries it: the header's, a PAX
        // `size` record (the reader's `size()`), or a GNU sparse file's
        // real size. Every limit is checked against the largest, and no more
        // than that is ever written.
        let header_size = e
            .header()
            .entry_size()
            .map_err(|err| invalid(raw, format!("has a bad size field: {err}")))?;
        let mut size = header_size.max(e.size());
        if kind == EntryType::GNUSparse {
            let real = e
                .header()
                .as_gnu()
                .map(|g| g.real_size())
                .transpose()
                .map_err(|err| invalid(raw, format!("has a bad sparse size field: {err}")))?;
            size = size.max(real.unwrap_or(0));
        }
        if let Ok(Some(pax)) = e.pax_extensions() {
            for ext in pax.flatten() {
                if ext.key_bytes().starts_with(b"GNU.sparse.") {
                    return Err(invalid(
                        raw,
                        "is a PAX sparse file (GNU tar --sparse with --format=pax), which this \
                         agent does not extract; archive it without --sparse, or with --format=gnu",
                    ));
                }
            }
        }
        Ok(Meta { mode, mtime, size })
    }

    /// A directory: created 0700 (its mode and mtime are applied last), or
    /// kept if it exists; one replacing a non-directory only in merge mode
    /// and only one from before the archive.
    fn dir(&mut self, t: &Target<'_>, m: &Meta) -> Result<(), ArchiveError> {
        self.ensure_parent(&t.parent, t.raw)?;
        let parent = self.parent_fd()?;
        match rustix::fs::mkdirat(parent, t.name, Mode::from_raw_mode(0o700)) {
            Ok(()) => self.chown_at(parent, t.name, &t.path)?,
            Err(rustix::io::Errno::EXIST) => self.dir_over_existing(parent, t)?,
            Err(err) => {
                return Err(ArchiveError::io(
                    format!("creating directory {}", t.path.display()),
                    sys(err),
                ));
            }
        }
        self.dirs.set(&t.path, m.mode, m.mtime);
        self.stats.dirs += 1;
        Ok(())
    }

    /// A directory entry whose name exists: a directory stays; anything
    /// else is an error if this archive made it (or outside merge mode),
    /// else it is removed for the directory.
    fn dir_over_existing(
        &self,
        parent: BorrowedFd<'_>,
        t: &Target<'_>,
    ) -> Result<(), ArchiveError> {
        let st = rustix::fs::statat(parent, t.name, AtFlags::SYMLINK_NOFOLLOW).map_err(|err| {
            ArchiveError::io(format!("inspecting {}", t.path.display()), sys(err))
        })?;
        let is_dir =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory;
        if is_dir {
            return Ok(());
        }
        if self.seen.contains(&self.key(&t.path)) || !self.opts.merge {
            return Err(invalid(
                t.raw,
                "is a directory replacing a non-directory entry of the same archive",
            ));
        }
        remove_at(parent, t.name, &t.path)?;
        rustix::fs::mkdirat(parent, t.name, Mode::from_raw_mode(0o700))
            .map_err(|err| ArchiveError::io(format!("creating {}", t.path.display()), sys(err)))?;
        self.chown_at(parent, t.name, &t.path)
    }

    /// A symlink: created as it is (never followed); its target non-empty,
    /// without NUL, at most max_path_bytes.
    fn symlink<R: Read>(
        &mut self,
        e: &mut tar::Entry<'_, R>,
        t: &Target<'_>,
        mtime: u64,
    ) -> Result<(), ArchiveError> {
        let limits = self.opts.limits;
        let target = e
            .link_name_bytes()
            .map(|c| c.into_owned())
            .unwrap_or_default();
        if target.is_empty() {
            return Err(invalid(t.raw, "is a symlink without a target"));
        }
        if target.contains(&0) {
            return Err(invalid(t.raw, "has a symlink target with a NUL byte"));
        }
        if target.len() > limits.max_path_bytes {
            return Err(ArchiveError::Limit {
                limit: "max_path_bytes",
                detail: format!("a symlink target is {} bytes long", target.len()),
            });
        }
        self.ensure_parent(&t.parent, t.raw)?;
        let link = OsStr::from_bytes(&target);
        self.create(t.name, &t.path, t.raw, |dir, n| {
            rustix::fs::symlinkat(link, dir, n)
        })?;
        let parent = self.parent_fd()?;
        self.chown_at(parent, t.name, &t.path)?;
        let _ = rustix::fs::utimensat(parent, t.name, &times(mtime), AtFlags::SYMLINK_NOFOLLOW);
        self.stats.symlinks += 1;
        Ok(())
    }

    /// A hard link: only to a regular file extracted earlier from this
    /// archive, its target found beneath the root without following links.
    fn hardlink<R: Read>(
        &mut self,
        e: &mut tar::Entry<'_, R>,
        t: &Target<'_>,
    ) -> Result<(), ArchiveError> {
        let target = e
            .link_name_bytes()
            .map(|c| c.into_owned())
            .unwrap_or_default();
        let tcomps = confine::normalize(Path::new(OsStr::from_bytes(&target)))
            .map_err(|r| invalid(t.raw, format!("is a hardlink whose target {r}")))?;
        let tpath: PathBuf = tcomps.iter().collect();
        if !self.files.contains(&self.key(&tpath)) {
            return Err(invalid(
                t.raw,
                format!(
                    "is a hardlink to '{}', which is not a regular file earlier in the archive",
                    String::from_utf8_lossy(&target)
                ),
            ));
        }
        let (tname, tparents) = tcomps
            .split_last()
            .ok_or_else(|| invalid(t.raw, "is a hardlink without a target"))?;
        let tparent_path: PathBuf = tparents.iter().collect();
        let tdir = confine::open_dir(self.root, &tparent_path)
            .map_err(|err| ArchiveError::io(format!("opening {}", tparent_path.display()), err))?;
        self.ensure_parent(&t.parent, t.raw)?;
        let tname: &OsStr = tname;
        self.create(t.name, &t.path, t.raw, |dir, n| {
            rustix::fs::linkat(tdir.as_fd(), tname, dir, n, AtFlags::empty())
        })?;
        let key = self.key(&t.path);
        self.files.insert(key);
        self.stats.hardlinks += 1;
        Ok(())
    }

    /// A FIFO, only with `allow_fifos`.
    fn fifo(&mut self, t: &Target<'_>, mode: u32) -> Result<(), ArchiveError> {
        if !self.opts.limits.allow_fifos {
            return Err(invalid(
                t.raw,
                "is a FIFO (set archive.allow_fifos = true to allow FIFOs)",
            ));
        }
        self.ensure_parent(&t.parent, t.raw)?;
        self.create(t.name, &t.path, t.raw, |dir, n| {
            rustix::fs::mknodat(
                dir,
                n,
                rustix::fs::FileType::Fifo,
                Mode::from_raw_mode(mode),
                0,
            )
        })?;
        let parent = self.parent_fd()?;
        self.chown_at(parent, t.name, &t.path)?;
        self.stats.fifos += 1;
        Ok(())
    }
}
