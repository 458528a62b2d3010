//! The writer pool: file contents and their metadata written on threads of
//! their own while the extracting thread parses the next entries.
//!
//! The extracting thread still does every namespace operation, in archive
//! order: it checks each entry and its limits, creates the file (`O_EXCL |
//! O_NOFOLLOW` in the confined parent) and reads its data, exactly as
//! without the pool. What moves to a writer is what only touches that open
//! file: `write`, the mode (when the umask took bits), the owner, the mtime
//! and the `close`. A file's pieces all go to one writer, in order, so its
//! mtime is set after its last byte.
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

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::ArchiveError;

use super::fsops::{FileMeta, apply_meta};

/// Largest piece of a file handed to a writer at once.
pub(super) const PIECE: usize = 256 << 10;
/// Pieces queued per writer.
pub(super) const QUEUE: usize = 8;

/// What the extractor hands a writer: bytes for an open file, and with its
/// last piece what to set on it before closing it.
pub(super) struct Piece {
    pub file: Arc<File>,
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
    queues: Vec<SyncSender<Piece>>,
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
        if self.queues[i % self.queues.len()].send(piece).is_err() {
            self.check()?;
            return Err(ArchiveError::invalid(
                "internal error: a writer thread ended",
            ));
        }
        Ok(())
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
fn run(rx: Receiver<Piece>, shared: &Shared, max_free: usize) {
    while let Ok(p) = rx.recv() {
        let Piece {
            file,
            data,
            len,
            last,
            path,
        } = p;
        if !shared.failed.load(Ordering::Acquire) {
            let r = (&*file)
                .write_all(&data[..len])
                .map_err(|e| ArchiveError::io(format!("writing {}", path.display()), e))
                .and_then(|()| match &last {
                    Some(m) => apply_meta(file.as_fd(), m, &path),
                    None => Ok(()),
                });
            if let Err(e) = r {
                shared.fail(e);
            }
        }
        // The last piece's handle is the last one: the file closes here.
        drop(file);
        if data.len() == PIECE {
            let mut free = shared.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < max_free {
                free.push(data);
            }
        }
    }
}
