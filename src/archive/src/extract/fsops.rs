//! Directory-handle plumbing of the extractor: the cached parent, O_EXCL
//! creation, implicit directories, ownership, and the modes and mtimes of
//! directories applied last.

use std::ffi::OsStr;
use std::io::{self};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

use crate::confine::{self, remove_at};
use crate::error::{ArchiveError, sys};

use super::entry::Extractor;
use super::invalid;
use super::meta::{FileMeta, apply_meta};

impl Extractor<'_> {
    /// Creates `name` in `parent` with `make`. If something is in the way:
    /// an entry of this archive → refuse; an older workspace entry (merge)
    /// → remove it and retry once.
    pub(super) fn create<T>(
        &self,
        name: &OsStr,
        path: &Path,
        raw: &[u8],
        make: impl Fn(BorrowedFd<'_>, &OsStr) -> rustix::io::Result<T>,
    ) -> Result<T, ArchiveError> {
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
                    .map_err(|e| ArchiveError::io(format!("creating {}", path.display()), sys(e)))
            }
            Err(e) => Err(ArchiveError::io(
                format!("creating {}", path.display()),
                sys(e),
            )),
        }
    }

    /// The directory that holds entries under `rel`, creating missing
    /// directories (mode 0755) without following symlinks.
    /// The cached parent directory handle (see [`Self::ensure_parent`]).
    pub(super) fn parent_fd(&self) -> Result<BorrowedFd<'_>, ArchiveError> {
        match &self.parent {
            Some((_, fd)) => Ok(fd.as_fd()),
            None => Err(ArchiveError::invalid("internal error: no parent directory")),
        }
    }

    pub(super) fn ensure_parent(&mut self, rel: &Path, raw: &[u8]) -> Result<(), ArchiveError> {
        let hit = matches!(&self.parent, Some((p, _)) if p == rel);
        if !hit {
            // A file the writers have yet to create may be in the way.
            if self.writers.is_some()
                && self.under_a_file(rel)
                && let Some(w) = &mut self.writers
            {
                w.barrier()?;
            }
            let fd = match confine::open_dir(self.root, rel) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => {
                    self.make_dirs(rel, raw)?
                }
                Err(e) => return Err(self.path_error(e, rel, raw)),
            };
            // Only worth a syscall when it can spare a chown per file.
            self.parent_setgid = self.opts.owner == Some(self.me)
                && rustix::fs::fstat(&fd).map_or(true, |st| st.st_mode & 0o2000 != 0);
            self.parent = Some((rel.to_owned(), std::sync::Arc::new(fd)));
        }
        Ok(())
    }

    /// `rel` or a directory above it names a file of the archive.
    fn under_a_file(&self, rel: &Path) -> bool {
        let mut prefix = PathBuf::new();
        rel.components().any(|c| {
            prefix.push(c);
            self.files.contains(&self.key(&prefix))
        })
    }

    pub(super) fn make_dirs(&mut self, rel: &Path, raw: &[u8]) -> Result<OwnedFd, ArchiveError> {
        let mut cur = rustix::fs::openat(
            self.root,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ArchiveError::io("opening the staging directory", sys(e)))?;
        let mut so_far = PathBuf::new();
        for comp in rel.components() {
            let name = comp.as_os_str();
            so_far.push(name);
            match rustix::fs::mkdirat(cur.as_fd(), name, Mode::from_raw_mode(0o755)) {
                Ok(()) => {
                    self.count_created()?;
                    self.chown_at(cur.as_fd(), name, &so_far)?;
                    let key = self.key(&so_far);
                    self.seen.insert(key);
                    self.stats.dirs += 1;
                }
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => {
                    return Err(ArchiveError::io(
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

    pub(super) fn path_error(&self, e: io::Error, rel: &Path, raw: &[u8]) -> ArchiveError {
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
            _ => ArchiveError::io(format!("opening directory {}", rel.display()), e),
        }
    }

    /// Sets mode (when `chmod`), owner and mtime. Files are created with
    /// their mode, so they need a chmod only for bits the umask removed;
    /// directories are created 0700 and always need one.
    pub(super) fn meta_fd(
        &self,
        fd: BorrowedFd<'_>,
        mode: u32,
        mtime: u64,
        path: &Path,
        chmod: bool,
    ) -> Result<(), ArchiveError> {
        let m = FileMeta {
            mode,
            mtime,
            chmod,
            owner: self.opts.owner,
        };
        apply_meta(fd, &m, path)
    }

    /// The owner a new file in the cached parent must be given: none when
    /// it already has it (the configured owner is this process's, and the
    /// parent is not setgid, which would give the file the parent's group).
    pub(super) fn file_owner(&self) -> Option<(u32, u32)> {
        let owner = self.opts.owner?;
        if owner == self.me && !self.parent_setgid {
            None
        } else {
            Some(owner)
        }
    }

    pub(super) fn chown_at(
        &self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        path: &Path,
    ) -> Result<(), ArchiveError> {
        if let Some((u, g)) = self.opts.owner {
            rustix::fs::chownat(
                dir,
                name,
                Some(rustix::fs::Uid::from_raw(u)),
                Some(rustix::fs::Gid::from_raw(g)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| ArchiveError::io(format!("chown {}", path.display()), sys(e)))?;
        }
        Ok(())
    }

    /// Applies directory modes and mtimes, deepest first (creating entries
    /// inside a directory changes its mtime).
    pub(super) fn finish_dirs(&mut self) -> Result<(), ArchiveError> {
        self.parent = None;
        let dirs = std::mem::take(&mut self.dirs);
        for (path, mode, mtime) in dirs.deepest_first() {
            let fd = confine::open_dir(self.root, &path)
                .map_err(|e| ArchiveError::io(format!("opening {}", path.display()), e))?;
            self.meta_fd(fd.as_fd(), mode, mtime, &path, true)?;
        }
        Ok(())
    }
}
