//! Initialize and Dump as streams: the blocking operation on its own
//! thread, connected to the caller's stream by bounded channels, and
//! stopped when a Release cancels the operation
//! ([`Workspace::cancel_transfers`]). The gRPC adapter only converts the
//! messages.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::codec::Encoder;
use super::pack::PackStats;
use super::stream::{ChannelReader, ChunkSink, Feed};
use super::{ArchiveError, Workspace, WorkspaceError};
use super::{Compression, DumpRequest, InitRequest, InitStats, MAX_CHUNK_BYTES, OpGuard};

/// Why a streamed Initialize or Dump ended without its result.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error("Initialize stopped: the lease was released while it ran; nothing was changed")]
    InitializeReleased,
    #[error("Dump stopped: the lease was released while it ran")]
    DumpReleased,
    #[error("the extraction task failed: {0}")]
    ExtractionTask(tokio::task::JoinError),
}

/// The end of an archive stream (Dump, and an execution's Export).
#[derive(Debug, Clone)]
pub struct DumpSummary {
    pub archive_bytes: u64,
    pub sha256: String,
    pub stats: PackStats,
    pub duration: Duration,
}

/// One message of a streamed Dump: the archive in chunks, then its summary.
#[derive(Debug)]
pub enum DumpMsg {
    Chunk(Bytes),
    Done(DumpSummary),
}

/// What a streamed Dump sends: messages, or why it stopped (the last one).
pub type DumpItem = Result<DumpMsg, TransferError>;

impl Workspace {
    /// Initializes from a stream. `feed` is given the extractor's input:
    /// it sends the chunks (or the error that ends the input), drops the
    /// sender at the end of the stream and then never completes.
    pub async fn initialize_streamed<F>(
        self: &Arc<Self>,
        init: InitRequest,
        feed: impl FnOnce(mpsc::Sender<Feed>) -> F,
    ) -> Result<InitStats, TransferError>
    where
        F: Future<Output = ()>,
    {
        let limits = self.limits().clone();
        if init.size_hint > limits.max_archive_bytes {
            let too_large = ArchiveError::Limit {
                limit: "max_archive_bytes",
                detail: format!(
                    "the announced archive size {} is larger than {} bytes",
                    init.size_hint, limits.max_archive_bytes
                ),
            };
            return Err(WorkspaceError::from(too_large).into());
        }
        let guard = self.begin("Initialize")?;
        let cancel = guard.cancelled();
        let (tx, rx) = mpsc::channel(limits.queue_chunks);
        // Weak: the channel must still close when the client's stream ends.
        let cancel_tx = tx.downgrade();
        let span = tracing::info_span!("initialize", merge = init.merge);
        let task = tokio::task::spawn_blocking(move || {
            let _e = span.enter();
            let (reader, outcome) = ChannelReader::new(rx, limits.max_archive_bytes);
            let r = guard.initialize(&init, reader, &outcome);
            log_initialized(&r);
            r
        });
        let feed = feed(tx);
        let result = tokio::select! {
            r = task => r,
            _ = feed => Ok(Err(ArchiveError::Cancelled(
                "the upload stream ended unexpectedly".into(),
            ).into())),
            _ = cancel.cancelled() => {
                // An error, not the end of the stream: what was read so far
                // is discarded, never committed.
                if let Some(tx) = cancel_tx.upgrade() {
                    let stop = tx.send(Err(ArchiveError::Cancelled(
                        "the lease was released while this Initialize ran".into(),
                    )));
                    let _ = tokio::time::timeout(Duration::from_secs(5), stop).await;
                }
                return Err(TransferError::InitializeReleased);
            }
        };
        let stats = result.map_err(TransferError::ExtractionTask)??;
        Ok(stats)
    }

    /// Starts a Dump whose messages arrive on the returned receiver: the
    /// archive's chunks, then its summary or an error. A Release stops it.
    pub fn dump_streamed(
        self: &Arc<Self>,
        req: DumpRequest,
        compression: Compression,
        level: i32,
    ) -> Result<mpsc::Receiver<DumpItem>, WorkspaceError> {
        let compression = match compression {
            Compression::Auto => Compression::Gzip,
            c => c,
        };
        let guard = self.begin("Dump")?;
        let limits = self.limits();
        // The producer writes into `tx`; a relay passes the messages on to
        // the caller's stream (`out`) until a Release cancels the Dump. A
        // client that stopped reading leaves the relay waiting, but dropping
        // `rx` then still unblocks the producer, which stops.
        let (tx, rx) = mpsc::channel::<DumpItem>(limits.queue_chunks);
        let (out, out_rx) = mpsc::channel::<DumpItem>(1);
        tokio::spawn(relay(rx, out, guard.cancelled()));
        let threads = limits.dump_threads;
        let span = tracing::info_span!("dump", ?compression, level);
        tokio::task::spawn_blocking(move || {
            let _e = span.enter();
            produce_dump(guard, &req, tx, compression, level, threads);
        });
        Ok(out_rx)
    }
}

fn log_initialized(r: &Result<InitStats, WorkspaceError>) {
    match r {
        Ok(s) => tracing::info!(
            files = s.extract.files,
            bytes = s.extract.bytes_written,
            archive_bytes = s.archive_bytes,
            ms = s.duration.as_millis() as u64,
            sync_ms = s.sync.as_millis() as u64,
            "workspace initialized"
        ),
        Err(e) => tracing::warn!(error = %e, "initialize failed; workspace unchanged"),
    }
}

/// Passes a Dump's messages from `rx` to `out` until the Dump ends or a
/// Release cancels it (then, if `out` has room, says so).
async fn relay(
    mut rx: mpsc::Receiver<DumpItem>,
    out: mpsc::Sender<DumpItem>,
    cancel: CancellationToken,
) {
    loop {
        let m = tokio::select! {
            m = rx.recv() => m,
            _ = cancel.cancelled() => {
                drop(rx);
                let _ = out.try_send(Err(TransferError::DumpReleased));
                return;
            }
        };
        let Some(m) = m else { return };
        tokio::select! {
            sent = out.send(m) => if sent.is_err() { return },
            _ = cancel.cancelled() => return,
        }
    }
}

/// The blocking side of a Dump: packs and compresses into `tx`, frees the
/// workspace, then sends the summary or the error.
fn produce_dump(
    guard: OpGuard,
    req: &DumpRequest,
    tx: mpsc::Sender<DumpItem>,
    compression: Compression,
    level: i32,
    threads: usize,
) {
    let start = Instant::now();
    let sink = ChunkSink::new(tx.clone(), MAX_CHUNK_BYTES, |b| Ok(DumpMsg::Chunk(b)));
    let closed = sink.closed();
    let result = Encoder::new(sink, compression, level, threads)
        .map_err(|e| WorkspaceError::from(ArchiveError::invalid(e.to_string())))
        .and_then(|enc| guard.dump(req, enc, Some(&closed)))
        .and_then(|(enc, stats)| {
            Ok((
                enc.finish()
                    .map_err(|e| ArchiveError::io("finishing compression", e))?,
                stats,
            ))
        })
        .and_then(|(sink, stats)| {
            let (bytes, sha, tx) = sink
                .finish()
                .map_err(|_| ArchiveError::Cancelled("the client went away".into()))?;
            Ok((bytes, sha, tx, stats))
        });
    // The workspace is free before the last message goes out: a client that
    // has the trailer (or the error) may start the next operation at once,
    // and must not find this Dump still running.
    drop(guard);
    match result {
        Ok((archive_bytes, sha256, tx, stats)) => {
            tracing::info!(
                files = stats.files,
                bytes = archive_bytes,
                ms = start.elapsed().as_millis() as u64,
                changed = stats.changed.len(),
                "workspace dumped"
            );
            let _ = tx.blocking_send(Ok(DumpMsg::Done(DumpSummary {
                archive_bytes,
                sha256,
                stats,
                duration: start.elapsed(),
            })));
        }
        Err(e) => {
            tracing::warn!(error = %e, "dump failed");
            let _ = tx.blocking_send(Err(e.into()));
        }
    }
}
