//! Hybrid vsock client (Firecracker, Cloud Hypervisor, vhost-device-vsock).
//!
//! The VMM exposes the guest's vsock ports through one unix socket on the
//! host. A client connects to it, writes `CONNECT <port>\n` and reads
//! `OK <host_port>\n`; from then on the stream is connected to the guest.
//!
//! A VM that is still booting has nobody listening on the port yet, and the
//! VMM then closes the connection (or, with some VMMs, never answers). So
//! every attempt has a handshake timeout, and failed attempts are retried
//! with backoff until an overall deadline.
//!
//! A socket is never closed before the VMM has answered its `CONNECT`:
//! vhost-device-vsock 0.3.0 (the newest) unwraps its write of `OK` to the
//! host's socket, so a socket closed while a slow guest (TCG, or a busy one)
//! was still accepting panics its vring thread, and the VM's vsock is dead for
//! good. Each handshake therefore runs in a task of its own: a caller that
//! stops waiting (the per-attempt timeout, or its future dropped) leaves the
//! task to read the answer, for at most [`HvsockOptions::answer_wait`].

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::time::Instant;

/// Limits of the hybrid-vsock handshake.
#[derive(Debug, Clone)]
pub struct HvsockOptions {
    /// Longest wait for `OK` after sending `CONNECT` in one attempt.
    pub handshake_timeout: Duration,
    /// Total time to keep retrying before giving up.
    pub retry_deadline: Duration,
    /// First pause between attempts; doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// How long a handshake its caller gave up on keeps the socket open,
    /// waiting for the VMM's answer, before closing it anyway.
    pub answer_wait: Duration,
}

impl Default for HvsockOptions {
    fn default() -> Self {
        HvsockOptions {
            handshake_timeout: Duration::from_secs(2),
            retry_deadline: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            answer_wait: Duration::from_secs(60),
        }
    }
}

/// The reply line is `OK <u32>\n`; anything longer is not a VMM.
const MAX_REPLY: usize = 32;

/// Why a hybrid-vsock connection could not be made.
#[derive(Debug, thiserror::Error)]
#[error(
    "hvsock://{}:{port}: no connection after {attempts} attempt(s) in {elapsed:?}; last error: {last}",
    path.display()
)]
pub struct HvsockError {
    pub path: PathBuf,
    pub port: u32,
    pub attempts: u32,
    pub elapsed: Duration,
    pub last: AttemptError,
}

/// What went wrong in a single attempt.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("cannot connect to the VMM socket: {0}")]
    Connect(#[source] io::Error),
    #[error("I/O error during the CONNECT handshake: {0}")]
    Io(#[source] io::Error),
    #[error(
        "the VMM closed the connection without OK (is the guest up and listening on the port?)"
    )]
    Closed,
    #[error("no OK within {0:?} of sending CONNECT")]
    Timeout(Duration),
    #[error("unexpected handshake reply {0:?} (expected \"OK <port>\")")]
    BadReply(String),
}

/// Connects to guest `port` through the hybrid-vsock socket at `path`,
/// retrying until `opts.retry_deadline`.
pub async fn connect(
    path: &Path,
    port: u32,
    opts: &HvsockOptions,
) -> Result<UnixStream, HvsockError> {
    let start = Instant::now();
    let deadline = start + opts.retry_deadline;
    let mut backoff = opts.initial_backoff;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let budget = opts
            .handshake_timeout
            .min(remaining.max(Duration::from_millis(1)));
        let last = match tokio::time::timeout(budget, attempt(path, port, opts.answer_wait)).await {
            Ok(Ok(stream)) => {
                tracing::debug!(path = %path.display(), port, attempts, "hybrid vsock connected");
                return Ok(stream);
            }
            Ok(Err(e)) => e,
            Err(_) => AttemptError::Timeout(budget),
        };
        tracing::debug!(path = %path.display(), port, attempts, error = %last, "hybrid vsock attempt failed");
        let now = Instant::now();
        if now + backoff >= deadline {
            return Err(HvsockError {
                path: path.to_owned(),
                port,
                attempts,
                elapsed: now - start,
                last,
            });
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(opts.max_backoff);
    }
}

/// One handshake, in a task of its own that outlives a caller who stops
/// waiting (see the module's comment), bounded by `answer_wait`.
async fn attempt(
    path: &Path,
    port: u32,
    answer_wait: Duration,
) -> Result<UnixStream, AttemptError> {
    let path = path.to_owned();
    let task = tokio::spawn(async move {
        tokio::time::timeout(answer_wait, handshake(&path, port))
            .await
            .unwrap_or(Err(AttemptError::Timeout(answer_wait)))
    });
    task.await
        .unwrap_or_else(|e| Err(AttemptError::Io(io::Error::other(e))))
}

async fn handshake(path: &Path, port: u32) -> Result<UnixStream, AttemptError> {
    let mut s = UnixStream::connect(path)
        .await
        .map_err(AttemptError::Connect)?;
    s.write_all(format!("CONNECT {port}\n").as_bytes())
        .await
        .map_err(AttemptError::Io)?;
    // Read byte by byte: whatever follows the newline belongs to the guest's
    // protocol and must stay in the socket.
    let mut line = Vec::with_capacity(16);
    loop {
        let mut b = [0u8; 1];
        let n = s.read(&mut b).await.map_err(AttemptError::Io)?;
        if n == 0 {
            return Err(AttemptError::Closed);
        }
        if b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
        if line.len() > MAX_REPLY {
            return Err(AttemptError::BadReply(
                String::from_utf8_lossy(&line).into_owned(),
            ));
        }
    }
    let text = String::from_utf8_lossy(&line);
    match text.strip_prefix("OK ") {
        Some(n) if n.trim().parse::<u32>().is_ok() => Ok(s),
        _ => Err(AttemptError::BadReply(text.into_owned())),
    }
}
