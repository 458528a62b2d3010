//! The writer pool (`archive.extract_writers`, off by default): regular
//! files created, written and given their metadata on threads of their own
//! while the extracting thread parses the next entries.
//!
//! The extracting thread still checks each entry and its limits, in archive
//! order, and reads its data. A writer creates a file (`O_CREAT | O_EXCL |
//! O_NOFOLLOW` in the confined parent, as the extractor would) only when
//! nothing can be in its way: outside merge mode, under a name the archive
//! has not used. Before any entry that could meet a file still to be created
//! (a name used already, a path below a file, a hard link) the extractor
//! waits for the writers ([`Writers::barrier`]), so every entry sees what it
//! would see without them. Otherwise the extractor creates the file and the
//! writer only writes it. A file's pieces all go to one writer, in order, so
//! its mtime is set after its last byte.
//!
//! Memory is bounded: each writer's queue holds at most [`QUEUE`] pieces of
//! at most [`PIECE`] bytes (buffers are reused), so the pool holds at most
//! `writers × (QUEUE + 1) × PIECE` bytes of data (4.5 MiB with the default
//! 2 writers) and as many open files.
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

use super::fsops::{FileMeta, apply_meta};
use super::invalid;

/// What goes down a writer's queue.
enum Job {
    Piece(Piece),
    /// Answered once everything queued before it is done.
    Sync(SyncSender<()>),
}

/// Largest piece of a file handed to a writer at once.
pub(super) const PIECE: usize = 256 << 10;
/// Pieces queued per writer.
pub(super) const QUEUE: usize = 8;

/// A file for a writer to create: `name` in the confined directory `dir`,
/// `O_CREAT | O_EXCL | O_NOFOLLOW`, as the extractor would.
pub(super) struct Create {
    pub dir: Arc<OwnedFd>,
    pub name: OsString,
    pub mode: u32,
    /// The entry's path as the archive gives it, for messages.
    pub raw: Vec<u8>,
}

/// The file a piece is for.
pub(super) enum Dest {
    /// Opened (created) by the extractor.
    Open(Arc<File>),
    /// To create first (the first piece of a file).
    Create(Create),
    /// The file of this writer's previous piece.
    Same,
}

/// What the extractor hands a writer: bytes for a file, and with its last
/// piece what to set on it before closing it.
pub(super) struct Piece {
    pub file: Dest,
    /// A buffer from [`Writers::buffer`]; its first `len` bytes are written.
    pub data: Vec<u8>,
    pub len: usize,
    /// Set on the last piece: the metadata to apply, then the file closes.
    pub last: Option<FileMeta>,
    pub path: Arc<PathBuf>,
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
}

impl Writers {
    /// Starts `n` writer threads (n ≥ 1).
    pub(super) fn start(n: usize) -> Result<Writers, ArchiveError> {
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
        };
        for i in 0..n {
            let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
            let shared = shared.clone();
            let max_free = w.max_free;
            let t = std::thread::Builder::new()
                .name(format!("ws-write-{i}"))
                .spawn(move || run(rx, &shared, max_free))
                .map_err(|e| ArchiveError::io("starting a writer thread", e))?;
            w.queues.push(tx);
            w.threads.push(t);
        }
        Ok(w)
    }

    pub(super) fn len(&self) -> usize {
        self.queues.len()
    }

    /// A buffer of [`PIECE`] bytes (reused: only new ones are zeroed).
    pub(super) fn buffer(&self) -> Vec<u8> {
        let reused = self
            .shared
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        reused.unwrap_or_else(|| vec![0; PIECE])
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

    /// Queues `piece` on writer `i` (blocks while its queue is full).
    pub(super) fn send(&self, i: usize, piece: Piece) -> Result<(), ArchiveError> {
        self.check()?;
        if self.queues[i % self.queues.len()]
            .send(Job::Piece(piece))
            .is_err()
        {
            self.check()?;
            return Err(ArchiveError::invalid(
                "internal error: a writer thread ended",
            ));
        }
        Ok(())
    }

    /// Waits until every piece queued so far is written (the files the
    /// writers create exist); the first error of any.
    pub(super) fn barrier(&self) -> Result<(), ArchiveError> {
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

    /// Waits for every queued piece to be written; the first error of any.
    pub(super) fn finish(mut self) -> Result<(), ArchiveError> {
        self.join();
        self.check()
    }

    fn join(&mut self) {
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

    #[cfg(test)]
    pub(super) fn max_buffers(&self) -> usize {
        self.max_free
    }
}

impl Drop for Writers {
    /// On an error of the extractor: the writers finish what is queued (or
    /// skip it once one failed) and are joined before the tree is given up.
    fn drop(&mut self) {
        self.join();
    }
}

/// A writer thread: pieces in order until the extractor is done.
fn run(rx: Receiver<Job>, shared: &Shared, max_free: usize) {
    let mut cur: Option<Arc<File>> = None;
    while let Ok(job) = rx.recv() {
        let p = match job {
            Job::Piece(p) => p,
            Job::Sync(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let Piece {
            file,
            data,
            len,
            last,
            path,
        } = p;
        if !shared.failed.load(Ordering::Acquire) {
            let r = open(file, &mut cur, &path).and_then(|f| {
                (&*f)
                    .write_all(&data[..len])
                    .map_err(|e| ArchiveError::io(format!("writing {}", path.display()), e))?;
                match &last {
                    Some(m) => apply_meta(f.as_fd(), m, &path),
                    None => Ok(()),
                }
            });
            if let Err(e) = r {
                shared.fail(e);
            }
        }
        // After its last piece a file closes here (this is its last handle).
        if last.is_some() {
            cur = None;
        }
        if data.len() == PIECE {
            let mut free = shared.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < max_free {
                free.push(data);
            }
        }
    }
}

/// The file a piece goes to, created first if it says so.
fn open(
    dest: Dest,
    cur: &mut Option<Arc<File>>,
    path: &std::path::Path,
) -> Result<Arc<File>, ArchiveError> {
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
            *cur = Some(Arc::new(File::from(fd)));
        }
        Dest::Same => {}
    }
    cur.clone()
        .ok_or_else(|| ArchiveError::invalid("internal error: a piece without its file"))
}
