//! The writer pool (`archive.extract_writers`): regular files created,
//! written and given their metadata on threads of their own while the
//! extracting thread parses the next entries.
//!
//! The extracting thread still checks each entry and its limits, in archive
//! order, and reads its data, straight into a [`Batch`]: one buffer holding
//! the bytes of many small files (or a piece of a large one) and, per file,
//! where it goes and what to set on it. A batch goes to a writer when it is
//! full, so a writer wakes once per [`BATCH`] bytes or [`MAX_PARTS`] files,
//! not once per file (a hand-off per small file cost more than the work it
//! moved). A writer creates a file (`O_CREAT | O_EXCL | O_NOFOLLOW` in the
//! confined parent, as the extractor would) only when nothing can be in its
//! way: outside merge mode, under a name the archive has not used. Before
//! any entry that could meet a file still to be created (a name used
//! already, a path below a file, a hard link) the extractor sends the open
//! batch and waits for the writers ([`Writers::barrier`]), so every entry
//! sees what it would see without them. Otherwise the extractor creates the
//! file and the writer only writes it. A file split over batches has them
//! all go to one writer, in order, so its mtime is set after its last byte.
//!
//! When the extraction runs with the owner's filesystem identity
//! ([`as_owner`](super::as_owner)), each writer takes it too, or chowns
//! every file it writes if it cannot.
//!
//! Memory is bounded: each writer's queue holds at most [`QUEUE`] batches
//! of [`BATCH`] bytes (buffers are reused), so the pool holds at most
//! `writers × (QUEUE + 1) + 1` buffers (1.25 MiB per writer), and at most
//! [`MAX_OPEN`] files opened by the extractor per batch.
//!
//! The first error of any writer is kept and returned to the extractor at
//! its next hand-off or at [`Writers::finish`]; the others stop writing.
//! The pool is joined before the extraction returns, success or not, so no
//! writer touches the tree after that (the caller may then discard it).

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rustix::fs::{Mode, OFlags};

use crate::error::{ArchiveError, sys};

use super::as_owner::AsOwner;
use super::invalid;
use super::meta::{FileMeta, apply_meta};

/// What goes down a writer's queue.
enum Job {
    Batch(Batch),
    /// Answered once everything queued before it is done.
    Sync(SyncSender<()>),
}

/// Bytes of file data per batch.
pub(super) const BATCH: usize = 256 << 10;
/// Files (or pieces of one) per batch.
pub(super) const MAX_PARTS: usize = 256;
/// Files opened by the extractor (not by a writer) per batch: each is an
/// open descriptor until its writer closes it.
pub(super) const MAX_OPEN: usize = 16;
/// Batches queued per writer.
pub(super) const QUEUE: usize = 4;

/// A file for a writer to create: `name` in the confined directory `dir`,
/// `O_CREAT | O_EXCL | O_NOFOLLOW`, as the extractor would.
pub(super) struct Create {
    pub dir: Arc<OwnedFd>,
    pub name: OsString,
    pub mode: u32,
    /// The entry's path as the archive gives it, for messages.
    pub raw: Vec<u8>,
}

/// The file a part is for.
pub(super) enum Dest {
    /// Opened (created) by the extractor.
    Open(File),
    /// To create first (the first part of a file).
    Create(Create),
    /// The file of this writer's previous part.
    Same,
}

/// One file's bytes in a batch: those from the previous part's `end` to
/// this `end`, and with its last part what to set on it.
pub(super) struct Part {
    pub file: Dest,
    pub end: usize,
    /// Set on the last part: the metadata to apply, then the file closes.
    pub last: Option<FileMeta>,
    pub path: Arc<PathBuf>,
}

/// File data for one writer: a buffer of [`BATCH`] bytes (its first `len`
/// filled) and the files they belong to, in order.
pub(super) struct Batch {
    data: Vec<u8>,
    len: usize,
    parts: Vec<Part>,
    /// Parts whose file the extractor opened.
    open: usize,
}

struct Shared {
    failed: AtomicBool,
    error: Mutex<Option<ArchiveError>>,
    /// Emptied buffers, for the extractor to fill again.
    free: Mutex<Vec<Vec<u8>>>,
}

impl Shared {
    fn fail(&self, e: ArchiveError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn take_error(&self) -> Option<ArchiveError> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

pub(super) struct Writers {
    queues: Vec<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
    /// Buffers the pool may hold in all (queued, being written, free).
    max_free: usize,
    /// The batch being filled.
    batch: Option<Batch>,
    /// The writer the open batch goes to.
    next: usize,
}

impl Writers {
    /// Starts `n` writer threads (n ≥ 1). With `owner`, each takes that
    /// filesystem identity (see [`as_owner`](super::as_owner)).
    pub(super) fn start(n: usize, owner: Option<(u32, u32)>) -> Result<Writers, ArchiveError> {
        let shared = Arc::new(Shared {
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            free: Mutex::new(Vec::new()),
        });
        let mut w = Writers {
            queues: Vec::with_capacity(n),
            threads: Vec::with_capacity(n),
            shared: shared.clone(),
            max_free: n * (QUEUE + 1) + 1,
            batch: None,
            next: 0,
        };
        for i in 0..n {
            let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
            let shared = shared.clone();
            let max_free = w.max_free;
            let t = std::thread::Builder::new()
                .name(format!("ws-write-{i}"))
                .spawn(move || {
                    let identity = owner.and_then(|(u, g)| AsOwner::take(u, g));
                    // Without the identity, every file is given its owner.
                    let chown = if identity.is_none() { owner } else { None };
                    run(rx, &shared, max_free, chown)
                })
                .map_err(|e| ArchiveError::io("starting a writer thread", e))?;
            w.queues.push(tx);
            w.threads.push(t);
        }
        Ok(w)
    }

    /// The free room of the open batch, for the next bytes of the current
    /// file (never empty: a full batch has been sent by [`Self::part`]).
    pub(super) fn room(&mut self) -> Result<&mut [u8], ArchiveError> {
        self.check()?;
        let batch = match self.batch.take() {
            Some(b) if b.len < b.data.len() => b,
            Some(b) => {
                // Full without its part ended: cannot happen through
                // `part`, but never hand out an empty room.
                self.send(b, false)?;
                self.new_batch()
            }
            None => self.new_batch(),
        };
        let b = self.batch.insert(batch);
        Ok(&mut b.data[b.len..])
    }

    /// Counts `n` bytes of [`Self::room`] as filled.
    pub(super) fn filled(&mut self, n: usize) {
        if let Some(b) = &mut self.batch {
            b.len = (b.len + n).min(b.data.len());
        }
    }

    /// The open batch has no room left.
    pub(super) fn full(&self) -> bool {
        self.batch.as_ref().is_some_and(|b| b.len == b.data.len())
    }

    /// Ends a part: the bytes filled since the previous part are `file`'s,
    /// and with `last` the file is complete. Sends the batch when it is
    /// full; in the middle of a file (no `last`) the next batch then goes
    /// to the same writer.
    pub(super) fn part(
        &mut self,
        file: Dest,
        last: Option<FileMeta>,
        path: Arc<PathBuf>,
    ) -> Result<(), ArchiveError> {
        let mut b = match self.batch.take() {
            Some(b) => b,
            None => self.new_batch(),
        };
        if matches!(file, Dest::Open(_)) {
            b.open += 1;
        }
        let ends_file = last.is_some();
        b.parts.push(Part {
            file,
            end: b.len,
            last,
            path,
        });
        let full = b.len == b.data.len() || b.parts.len() >= MAX_PARTS || b.open >= MAX_OPEN;
        if full || !ends_file {
            // Mid-file (a full buffer): the rest follows to the same writer.
            return self.send(b, ends_file);
        }
        self.batch = Some(b);
        Ok(())
    }

    fn new_batch(&self) -> Batch {
        let reused = self
            .shared
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        Batch {
            data: reused.unwrap_or_else(|| vec![0; BATCH]),
            len: 0,
            parts: Vec::new(),
            open: 0,
        }
    }

    /// The first error of a writer, if one failed.
    pub(super) fn check(&self) -> Result<(), ArchiveError> {
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(self.shared.take_error().unwrap_or_else(|| {
                ArchiveError::invalid("internal error: a writer failed without an error")
            }));
        }
        Ok(())
    }

    /// Queues `b` on the current writer (blocks while its queue is full);
    /// with `advance`, the next batch goes to the next writer.
    fn send(&mut self, b: Batch, advance: bool) -> Result<(), ArchiveError> {
        self.check()?;
        let i = self.next % self.queues.len();
        if advance {
            self.next = (i + 1) % self.queues.len();
        }
        if self.queues[i].send(Job::Batch(b)).is_err() {
            self.check()?;
            return Err(ArchiveError::invalid(
                "internal error: a writer thread ended",
            ));
        }
        Ok(())
    }

    /// Sends the open batch, if any (between two files).
    fn flush(&mut self) -> Result<(), ArchiveError> {
        match self.batch.take() {
            Some(b) if !b.parts.is_empty() => self.send(b, true),
            _ => Ok(()),
        }
    }

    /// Waits until every file handed over so far is written (the files the
    /// writers create exist); the first error of any.
    pub(super) fn barrier(&mut self) -> Result<(), ArchiveError> {
        self.flush()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(self.queues.len());
        for q in &self.queues {
            if q.send(Job::Sync(tx.clone())).is_err() {
                self.check()?;
                return Err(ArchiveError::invalid(
                    "internal error: a writer thread ended",
                ));
            }
        }
        for _ in &self.queues {
            if rx.recv().is_err() {
                break;
            }
        }
        self.check()
    }

    /// Waits for every file handed over to be written; the first error of
    /// any.
    pub(super) fn finish(mut self) -> Result<(), ArchiveError> {
        let flushed = self.flush();
        self.join();
        self.check()?;
        flushed
    }

    fn join(&mut self) {
        self.batch = None;
        self.queues.clear();
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                self.shared.fail(ArchiveError::invalid(
                    "internal error: a writer thread panicked",
                ));
            }
        }
    }

    #[cfg(test)]
    pub(super) fn free_buffers(&self) -> usize {
        self.shared
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Parts of the open batch whose file the extractor opened.
    #[cfg(test)]
    pub(super) fn parts_open(&self) -> usize {
        self.batch.as_ref().map_or(0, |b| b.open)
    }

    #[cfg(test)]
    pub(super) fn max_buffers(&self) -> usize {
        self.max_free
    }
}

impl Drop for Writers {
    /// On an error of the extractor: the writers finish every file handed
    /// over, the open batch's too (or skip them once one failed), and are
    /// joined before the tree is given up.
    fn drop(&mut self) {
        let _ = self.flush();
        self.join();
    }
}

/// A writer thread: batches in order until the extractor is done. With
/// `chown`, every file is given that owner.
fn run(rx: Receiver<Job>, shared: &Shared, max_free: usize, chown: Option<(u32, u32)>) {
    let mut cur: Option<File> = None;
    while let Ok(job) = rx.recv() {
        let b = match job {
            Job::Batch(b) => b,
            Job::Sync(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let mut start = 0;
        for p in b.parts {
            let bytes = b.data.get(start..p.end).unwrap_or_default();
            start = p.end;
            if !shared.failed.load(Ordering::Acquire)
                && let Err(e) = write_part(p.file, &mut cur, bytes, p.last.as_ref(), &p.path, chown)
            {
                shared.fail(e);
            }
            // After its last part a file closes here.
            if p.last.is_some() {
                cur = None;
            }
        }
        if b.data.len() == BATCH {
            let mut free = shared.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < max_free {
                free.push(b.data);
            }
        }
    }
}

/// Writes one part: the file created or taken first, then its bytes, then
/// with `last` its metadata.
fn write_part(
    dest: Dest,
    cur: &mut Option<File>,
    bytes: &[u8],
    last: Option<&FileMeta>,
    path: &std::path::Path,
    chown: Option<(u32, u32)>,
) -> Result<(), ArchiveError> {
    let f = open(dest, cur, path)?;
    if !bytes.is_empty() {
        (&*f)
            .write_all(bytes)
            .map_err(|e| ArchiveError::io(format!("writing {}", path.display()), e))?;
    }
    match last {
        Some(m) if m.owner.is_none() && chown.is_some() => {
            let m = FileMeta { owner: chown, ..*m };
            apply_meta(f.as_fd(), &m, path)
        }
        Some(m) => apply_meta(f.as_fd(), m, path),
        None => Ok(()),
    }
}

/// The file a part goes to, created first if it says so.
fn open<'c>(
    dest: Dest,
    cur: &'c mut Option<File>,
    path: &std::path::Path,
) -> Result<&'c File, ArchiveError> {
    match dest {
        Dest::Open(f) => *cur = Some(f),
        Dest::Create(c) => {
            let fd = rustix::fs::openat(
                &*c.dir,
                &c.name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(c.mode),
            )
            .map_err(|e| match e {
                rustix::io::Errno::EXIST => invalid(
                    &c.raw,
                    "appears twice in the archive (or replaces a directory the archive created)",
                ),
                e => ArchiveError::io(format!("creating {}", path.display()), sys(e)),
            })?;
            *cur = Some(File::from(fd));
        }
        Dest::Same => {}
    }
    cur.as_ref()
        .ok_or_else(|| ArchiveError::invalid("internal error: a part without its file"))
}
