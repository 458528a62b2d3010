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
//!
//! `entry` writes one entry; `fsops` holds the directory-handle plumbing
//! (parents, creation, ownership, modes and times); `as_owner` lets root
//! create the entries as their owner instead of chowning each.

mod as_owner;
mod dirs;
mod entry;
mod file;
mod fsops;
mod meta;
#[cfg(test)]
mod tests;
mod writers;

use std::cell::Cell;
use std::io::{self, BufRead, Read};
use std::os::fd::BorrowedFd;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::thread::JoinHandle;

use crate::codec;
use crate::codec::Compression;
use crate::error::ArchiveError;
use crate::limits::ArchiveLimits;

use entry::Extractor;

/// The top-level name the agent keeps its own state under when the
/// workspace is a mount point: no archive may use it (a swap would fail
/// half-way moving it).
pub const RESERVED_NAME: &str = ".sandbox-agent";

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

/// Counts the bytes consumed through it (a `Counted` for buffered input:
/// the decoder reads the source's own buffers).
struct CountedBuf<R> {
    inner: R,
    n: Arc<AtomicU64>,
}

impl<R: BufRead> Read for CountedBuf<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for CountedBuf<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, n: usize) {
        self.n.fetch_add(n as u64, Ordering::Relaxed);
        self.inner.consume(n);
    }
}

/// The compressed and expanded byte counters, for the bomb check.
pub(super) struct Meter<'a> {
    limits: &'a ArchiveLimits,
    compressed: Arc<AtomicU64>,
    /// Bytes out of the decoder (the tar stream).
    expanded: Arc<AtomicU64>,
    /// File contents written, which can be more than the stream holds: the
    /// holes of a GNU sparse file are written as zeros.
    written: AtomicU64,
}

impl Meter<'_> {
    /// Counts `n` bytes of file contents about to be written.
    pub(super) fn wrote(&self, n: usize) {
        self.written.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn check(&self) -> Result<(), ArchiveError> {
        let compressed = self.compressed.load(Ordering::Relaxed);
        let expanded = self
            .expanded
            .load(Ordering::Relaxed)
            .max(self.written.load(Ordering::Relaxed));
        let l = self.limits;
        if expanded > l.ratio_grace_bytes
            && expanded > l.max_compression_ratio.saturating_mul(compressed.max(1))
        {
            return Err(ArchiveError::Limit {
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

/// A block of `BLOCK` bytes and how many of them the decoder filled.
type Block = (Vec<u8>, usize);

/// Blocks the extractor is done with, for the decoder to fill again (at
/// most `BLOCKS_IN_FLIGHT + 2` exist: no allocation, page fault or zeroing
/// per block).
type FreeBlocks = Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

/// `Read` over the decoder thread's blocks.
struct Blocks {
    rx: std::sync::mpsc::Receiver<io::Result<Block>>,
    cur: Vec<u8>,
    len: usize,
    pos: usize,
    free: FreeBlocks,
}

impl Read for Blocks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.len {
            match self.rx.recv() {
                Ok(Ok((b, len))) => {
                    let done = std::mem::replace(&mut self.cur, b);
                    if done.len() == BLOCK {
                        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
                        if free.len() < BLOCKS_IN_FLIGHT + 2 {
                            free.push(done);
                        }
                    }
                    self.len = len;
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.len - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Bounds what the tar reader takes in on its own between two entries (the
/// previous entry's padding, header blocks, GNU long names and links, PAX
/// records, sparse maps): it reads those whole into memory before any
/// check of ours. Entry data is read by the extractor with the gate open.
struct Gate<R> {
    inner: R,
    ctl: GateCtl,
}

/// The extractor's side of a [`Gate`], kept while the tar reader holds the
/// gate itself.
#[derive(Clone)]
struct GateCtl {
    /// Bytes the reader may still read; `None` while the gate is open.
    left: Rc<Cell<Option<u64>>>,
    /// Set when a read was refused for want of budget.
    tripped: Rc<Cell<bool>>,
    /// What the reader may read between two entries.
    budget: u64,
}

impl GateCtl {
    fn new(limits: &ArchiveLimits) -> GateCtl {
        // The previous entry's padding (< 512 bytes) is read with the next
        // entry's metadata.
        let budget = limits.max_header_bytes.saturating_add(512);
        GateCtl {
            left: Rc::new(Cell::new(Some(budget))),
            tripped: Rc::new(Cell::new(false)),
            budget,
        }
    }

    /// Lets an entry's data through.
    fn open(&self) {
        self.left.set(None);
    }

    /// Gives the reader a fresh budget for the next entry's metadata.
    fn close(&self) {
        self.left.set(Some(self.budget));
    }
}

impl<R: Read> Read for Gate<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(left) = self.ctl.left.get() else {
            return self.inner.read(buf);
        };
        if left == 0 && !buf.is_empty() {
            self.ctl.tripped.set(true);
            return Err(io::Error::other(
                "tar metadata over archive.max_header_bytes",
            ));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.ctl.left.set(Some(left - n as u64));
        Ok(n)
    }
}

fn header_limit(limits: &ArchiveLimits) -> ArchiveError {
    ArchiveError::Limit {
        limit: "max_header_bytes",
        detail: format!(
            "more than {} bytes of tar metadata (a GNU long name or link, PAX records, a sparse \
             map) precede one entry's data",
            limits.max_header_bytes
        ),
    }
}

pub(super) fn invalid(path: &[u8], what: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::invalid(format!(
        "archive entry '{}' {what}",
        String::from_utf8_lossy(path)
    ))
}

/// Maps a read error from the decoder/tar parser. The tar reader's own
/// messages may quote header bytes; those are replaced by what they mean.
pub(super) fn read_error(e: io::Error, compression: Compression) -> ArchiveError {
    let what = match compression {
        Compression::Gzip => "corrupt or truncated gzip stream",
        Compression::Zstd => "corrupt or truncated zstd stream",
        _ => "corrupt or truncated tar archive",
    };
    let msg = e.to_string();
    if msg.contains("too much memory") {
        return ArchiveError::invalid(format!(
            "the zstd stream asks for a window over {} MiB (compressed with zstd --long?); \
             recompress it without --long, or with --long={} at most",
            (1u64 << codec::ZSTD_WINDOW_LOG_MAX) >> 20,
            codec::ZSTD_WINDOW_LOG_MAX
        ));
    }
    let why = if msg.contains("failed to read entire block") {
        "the data ends inside a 512-byte tar block (a truncated upload, or not a tar archive: \
         expected gzip, zstd or plain tar)"
            .to_owned()
    } else if msg.contains("numeric field") || msg.contains("checksum") {
        "a tar header is malformed (not a tar archive, or a damaged one)".to_owned()
    } else if msg.len() <= 200 && msg.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
        msg
    } else {
        "a header could not be read".to_owned()
    };
    ArchiveError::invalid(format!("{what}: {why}"))
}

/// Reads what is left of an entry's data into nothing (`sink`: a scratch
/// buffer, not zeroed per entry).
fn drain<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    sink: &mut [u8],
    meter: &Meter<'_>,
    compression: Compression,
) -> Result<(), ArchiveError> {
    loop {
        match entry.read(sink) {
            Ok(0) => return Ok(()),
            Ok(_) => meter.check()?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(e, compression)),
        }
    }
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
) -> Result<ExtractStats, ArchiveError> {
    extract_buffered(codec::buffered(src), root, opts)
}

/// [`extract`] from a source with buffers of its own (a
/// [`ChannelReader`](crate::stream::ChannelReader)'s chunks), which the
/// decoder reads in place.
pub fn extract_buffered<R: BufRead + Send + 'static>(
    src: R,
    root: BorrowedFd<'_>,
    opts: &ExtractOptions<'_>,
) -> Result<ExtractStats, ArchiveError> {
    let meter = Meter {
        limits: opts.limits,
        compressed: Arc::new(AtomicU64::new(0)),
        expanded: Arc::new(AtomicU64::new(0)),
        written: AtomicU64::new(0),
    };
    let mut compressed = CountedBuf {
        inner: src,
        n: meter.compressed.clone(),
    };
    let compression = codec::sniff(&mut compressed, opts.compression)
        .map_err(|e| read_error(e, opts.compression))?;
    if opts.compression == Compression::Auto && compression == Compression::None {
        codec::check_plain_tar(&mut compressed).map_err(ArchiveError::invalid)?;
    }
    let (blocks, decoder) = spawn_decoder(compressed, compression, meter.expanded.clone())?;
    let consumed = Arc::new(AtomicU64::new(0));
    let ctl = GateCtl::new(opts.limits);
    let mut plain = Gate {
        inner: Counted {
            inner: blocks,
            n: consumed.clone(),
        },
        ctl: ctl.clone(),
    };
    let mut x = Extractor::new(root, opts, &meter, compression);
    // Held to the end, the directories' modes included.
    let owner_guard = as_owner::AsOwner::enter(root, opts);
    let identity = owner_guard.as_ref().map(|(_, owner)| *owner);
    if let Some(owner) = identity {
        x.me = owner;
    }
    if opts.limits.extract_writers > 0 {
        x.writers = Some(writers::Writers::start(
            opts.limits.extract_writers,
            identity,
        )?);
    }
    let last_end = read_entries(&mut plain, &mut x, &ctl)?;
    ctl.open();
    // The parser stops at the first zero block; if it stopped because the
    // input ended instead, the archive was cut short.
    if consumed.load(Ordering::Relaxed) <= last_end {
        return Err(ArchiveError::invalid(
            "truncated tar archive: the stream ends without the end-of-archive marker",
        ));
    }
    only_zeros_after(&mut plain, &meter, compression)?;
    drop(plain);
    let _ = decoder.join();
    x.finish_writers()?;
    x.finish_dirs()?;
    Ok(x.stats)
}

/// Starts the thread that decompresses `compressed` into blocks, counting
/// the expanded bytes; returns the reader of its blocks and the thread.
fn spawn_decoder<R: BufRead + Send + 'static>(
    compressed: R,
    compression: Compression,
    expanded: Arc<AtomicU64>,
) -> Result<(Blocks, JoinHandle<()>), ArchiveError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(BLOCKS_IN_FLIGHT);
    let free = FreeBlocks::default();
    let recycled = free.clone();
    let decoder = std::thread::Builder::new()
        .name("ws-decode".into())
        .spawn(move || decode(compressed, compression, &tx, &expanded, &recycled))
        .map_err(|e| ArchiveError::io("starting the decoder thread", e))?;
    let blocks = Blocks {
        rx,
        cur: Vec::new(),
        len: 0,
        pos: 0,
        free,
    };
    Ok((blocks, decoder))
}

/// The decoder thread: whole blocks down `tx` until the stream ends, an
/// error (sent too) or the extractor is gone.
fn decode<R: BufRead>(
    compressed: R,
    compression: Compression,
    tx: &SyncSender<io::Result<Block>>,
    expanded: &AtomicU64,
    free: &FreeBlocks,
) {
    let mut dec = match codec::decoder(compressed, compression) {
        Ok(d) => d,
        Err(e) => {
            let _ = tx.send(Err(e));
            return;
        }
    };
    loop {
        let reused = free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut block = reused.unwrap_or_else(|| vec![0u8; BLOCK]);
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
        expanded.fetch_add(filled as u64, Ordering::Relaxed);
        if tx.send(Ok((block, filled))).is_err() {
            return;
        }
    }
}

/// Extracts every entry up to the end-of-archive marker, each one's
/// metadata read under the gate's budget; returns where the last entry's
/// data ends in the plain stream.
fn read_entries<R: Read>(
    plain: &mut R,
    x: &mut Extractor<'_>,
    ctl: &GateCtl,
) -> Result<u64, ArchiveError> {
    let (meter, compression, limits) = (x.meter, x.compression, x.opts.limits);
    let mut last_end = 0u64;
    let mut archive = tar::Archive::new(plain);
    let entries = archive.entries().map_err(|e| read_error(e, compression))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            if ctl.tripped.get() {
                header_limit(limits)
            } else {
                read_error(e, compression)
            }
        })?;
        ctl.open();
        meter.check()?;
        x.entry(&mut entry)?;
        // Whatever data the extractor did not read (a directory or link
        // with a size, a PAX global header) is skipped here, streaming,
        // rather than by the reader under the metadata budget.
        drain(&mut entry, &mut x.buf, meter, compression)?;
        ctl.close();
        let size = entry.header().entry_size().unwrap_or(0);
        last_end = entry.raw_file_position() + size.div_ceil(512) * 512;
    }
    Ok(last_end)
}

/// Reads the rest of the stream so compressed trailers and checksums are
/// verified and every byte is hashed. Only zero padding may follow the
/// end-of-archive marker: entries after it (a second archive appended,
/// plain or as a second gzip/zstd member) would otherwise be dropped
/// without a word.
fn only_zeros_after<R: Read>(
    plain: &mut R,
    meter: &Meter<'_>,
    compression: Compression,
) -> Result<(), ArchiveError> {
    let mut sink = [0u8; 64 << 10];
    loop {
        match plain.read(&mut sink) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                meter.check()?;
                if sink[..n].iter().any(|&b| b != 0) {
                    return Err(ArchiveError::invalid(
                        "data after the tar end-of-archive marker (two archives concatenated? \
                         upload them one at a time, the later ones with merge mode)",
                    ));
                }
            }
            Err(e) => return Err(read_error(e, compression)),
        }
    }
}
