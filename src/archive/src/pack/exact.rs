//! A packed file's bytes: exactly the size it had when opened, its holes
//! read as zeros without the file system making them.
//!
//! A sparse file's holes are found with `SEEK_DATA`/`SEEK_HOLE` and given
//! as zeros from memory: reading a hole through the page cache makes the
//! kernel zero a page for every 4 KiB of it (a 9 GiB sparse file filled
//! 9 GiB of page cache and took most of a dump's CPU). The archive is the
//! same either way: holes are stored as zeros (no sparse entries).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::SeekFrom;

/// Reads exactly `left` bytes: a file that shrank is padded with zeros, one
/// that grew is cut, so the header's size stays true.
pub(super) struct Exact<'a> {
    pub(super) file: File,
    /// Offset of the next byte given.
    pos: u64,
    left: u64,
    /// Set once a read found the end early.
    pub(super) short: bool,
    /// The known region around `pos`: data up to `data_end`, or a hole up
    /// to `hole_end` (whichever is past `pos`).
    data_end: u64,
    hole_end: u64,
    /// Checked on every read: a big file stops mid-way when the dump is
    /// cancelled.
    cancelled: Option<&'a AtomicBool>,
}

impl<'a> Exact<'a> {
    pub(super) fn new(file: File, size: u64, cancelled: Option<&'a AtomicBool>) -> Self {
        Exact {
            file,
            pos: 0,
            left: size,
            short: false,
            data_end: 0,
            hole_end: 0,
            cancelled,
        }
    }

    /// Finds what `pos` is in: sets `data_end` past it, or `hole_end`.
    fn probe(&mut self) {
        let end = self.pos + self.left;
        match rustix::fs::seek(&self.file, SeekFrom::Data(self.pos)) {
            // A hole up to the next data.
            Ok(next) if next > self.pos => self.hole_end = next.min(end),
            // Data here: up to the next hole (EOF counts as one).
            Ok(_) => {
                self.data_end = match rustix::fs::seek(&self.file, SeekFrom::Hole(self.pos)) {
                    Ok(h) if h > self.pos => h,
                    _ => u64::MAX,
                }
            }
            // No data past `pos`: a hole to the end, or the file shrank.
            Err(rustix::io::Errno::NXIO) => {
                self.hole_end = end;
                self.short =
                    rustix::fs::fstat(&self.file).is_ok_and(|st| (st.st_size as u64) < end);
            }
            // A file system without holes (or an odd answer): read it.
            Err(_) => self.data_end = u64::MAX,
        }
    }
}

impl Read for Exact<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        if self.cancelled.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(io::Error::other("the dump was cancelled"));
        }
        let mut want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        if !self.short && self.pos >= self.data_end && self.pos >= self.hole_end {
            self.probe();
        }
        let n = if !self.short && self.pos < self.data_end {
            want = want.min((self.data_end - self.pos).min(usize::MAX as u64) as usize);
            match self.file.read_at(&mut buf[..want], self.pos)? {
                0 => {
                    self.short = true;
                    0
                }
                n => n,
            }
        } else {
            0
        };
        let n = if n == 0 {
            // A hole, or past the end of a file that shrank.
            if !self.short {
                want = want.min((self.hole_end - self.pos).min(usize::MAX as u64) as usize);
            }
            buf[..want].fill(0);
            want
        } else {
            n
        };
        self.pos += n as u64;
        self.left -= n as u64;
        Ok(n)
    }
}
