//! A regular file: its size checked against the limits, then created and
//! its contents written, here or by the writer threads
//! (`archive.extract_writers`), never more than its size.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};

use crate::error::ArchiveError;

use super::entry::{Extractor, Meta, Target};
use super::meta::{FileMeta, umask};
use super::writers::{Create, Dest, Writers};
use super::{invalid, read_error};

impl Extractor<'_> {
    /// A regular file (plain, contiguous or GNU sparse, written dense): its
    /// size checked against the limits first, then exactly that many bytes
    /// written.
    pub(super) fn file<R: Read>(
        &mut self,
        e: &mut tar::Entry<'_, R>,
        t: &Target<'_>,
        m: &Meta,
    ) -> Result<(), ArchiveError> {
        let size = m.size;
        self.check_file_size(&t.path, size)?;
        self.ensure_parent(&t.parent, t.raw)?;
        let meta = FileMeta {
            mode: m.mode,
            mtime: m.mtime,
            chmod: m.mode & umask() != 0,
            owner: self.file_owner(),
        };
        // A writer creates the file itself when nothing can be in its way:
        // outside merge mode, under a name the archive has not used (the
        // tree holds nothing else); otherwise it is created here.
        let created_here = if self.writers.is_some()
            && !self.opts.merge
            && !self.seen.contains(&self.key(&t.path))
        {
            None
        } else {
            let fd = self.create(t.name, &t.path, t.raw, |dir, n| {
                rustix::fs::openat(
                    dir,
                    n,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(m.mode),
                )
            })?;
            Some(File::from(fd))
        };
        let written = match (self.writers.take(), created_here) {
            (Some(mut w), file) => {
                let r = self.hand_over(e, file, t, size, meta, &mut w);
                self.writers = Some(w);
                r?
            }
            (None, None) => {
                return Err(ArchiveError::invalid("internal error: no file to write"));
            }
            (None, Some(mut file)) => {
                let n = self.copy_data(e, &mut file, t, size)?;
                if n == size {
                    super::meta::apply_meta(file.as_fd(), &meta, &t.path)?;
                }
                n
            }
        };
        if written != size {
            return Err(invalid(
                t.raw,
                format!("is truncated: {written} of {size} bytes"),
            ));
        }
        self.expanded += size;
        let key = self.key(&t.path);
        self.files.insert(key);
        self.stats.files += 1;
        self.stats.bytes_written += size;
        Ok(())
    }

    /// Refuses a file of `size` bytes over max_file_bytes, or taking the
    /// archive over max_expanded_bytes.
    fn check_file_size(&self, path: &Path, size: u64) -> Result<(), ArchiveError> {
        let limits = self.opts.limits;
        if size > limits.max_file_bytes {
            return Err(ArchiveError::Limit {
                limit: "max_file_bytes",
                detail: format!(
                    "'{}' is {size} bytes (limit {})",
                    path.display(),
                    limits.max_file_bytes
                ),
            });
        }
        if self.expanded.saturating_add(size) > limits.max_expanded_bytes {
            return Err(ArchiveError::Limit {
                limit: "max_expanded_bytes",
                detail: format!(
                    "the archive expands to more than {} bytes",
                    limits.max_expanded_bytes
                ),
            });
        }
        Ok(())
    }

    /// Reads an entry's data straight into the writers' open batch (the
    /// file created here, or by its writer when `created` is `None`), with
    /// the same checks as [`Self::copy_data`]; the writer sets `meta` after
    /// the last byte. Returns the bytes read.
    fn hand_over<R: Read>(
        &mut self,
        e: &mut tar::Entry<'_, R>,
        created: Option<File>,
        t: &Target<'_>,
        size: u64,
        meta: FileMeta,
        w: &mut Writers,
    ) -> Result<u64, ArchiveError> {
        let mut dest = match created {
            Some(f) => Dest::Open(f),
            None => Dest::Create(Create {
                dir: match &self.parent {
                    Some((_, fd)) => fd.clone(),
                    None => {
                        return Err(ArchiveError::invalid("internal error: no parent directory"));
                    }
                },
                name: t.name.to_owned(),
                mode: meta.mode,
                raw: t.raw.to_vec(),
            }),
        };
        let path = Arc::new(t.path.clone());
        let mut written = 0u64;
        loop {
            let n = match e.read(w.room()?) {
                Ok(n) => n,
                Err(err) => return Err(read_error(err, self.compression)),
            };
            // Never past the size the limits were checked against.
            if written + n as u64 > size {
                return Err(invalid(
                    t.raw,
                    format!("holds more data than its size ({size})"),
                ));
            }
            written += n as u64;
            w.filled(n);
            self.meter.wrote(n);
            self.meter.check()?;
            if n == 0 {
                w.part(dest, Some(meta), path)?;
                return Ok(written);
            }
            if w.full() {
                w.part(std::mem::replace(&mut dest, Dest::Same), None, path.clone())?;
            }
        }
    }

    /// Waits for the writers to write every file handed to them.
    pub(super) fn finish_writers(&mut self) -> Result<(), ArchiveError> {
        match self.writers.take() {
            Some(w) => w.finish(),
            None => Ok(()),
        }
    }

    /// Copies an entry's data into `file`, never more than `size` bytes,
    /// checking the compression ratio as it goes; returns the bytes written.
    fn copy_data<R: Read>(
        &mut self,
        e: &mut tar::Entry<'_, R>,
        file: &mut File,
        t: &Target<'_>,
        size: u64,
    ) -> Result<u64, ArchiveError> {
        let mut written = 0u64;
        let mut buf = std::mem::take(&mut self.buf);
        let copied = loop {
            let n = match e.read(&mut buf) {
                Ok(n) => n,
                Err(err) => break Err(read_error(err, self.compression)),
            };
            if n == 0 {
                break Ok(written);
            }
            // Never past the size the limits were checked against.
            if written + n as u64 > size {
                break Err(invalid(
                    t.raw,
                    format!("holds more data than its size ({size})"),
                ));
            }
            if let Err(err) = file.write_all(&buf[..n]) {
                break Err(ArchiveError::io(
                    format!("writing {}", t.path.display()),
                    err,
                ));
            }
            written += n as u64;
            self.meter.wrote(n);
            if let Err(err) = self.meter.check() {
                break Err(err);
            }
        };
        self.buf = buf;
        copied
    }
}
