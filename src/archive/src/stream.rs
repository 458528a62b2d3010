//! Byte plumbing between async gRPC streams and the blocking tar code.
//!
//! Memory per stream is bounded by the channel capacity (`queue_chunks`
//! chunks of at most 1 MiB); a slow reader or writer applies backpressure
//! to the other side instead of buffering.

use std::io::{self, BufRead, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::error::ArchiveError;

/// What the async side feeds the extractor: data, or why the stream broke.
pub type Feed = Result<Bytes, ArchiveError>;

/// What a [`ChannelReader`] saw, readable after it was moved away.
#[derive(Default)]
pub struct ReadOutcome {
    /// Bytes read so far.
    pub count: u64,
    /// SHA-256 (lowercase hex) of all bytes, set at end of stream.
    pub sha256: Option<String>,
    /// Why the stream broke, if it did (cancel, size limit, protocol).
    pub failure: Option<ArchiveError>,
}

/// Blocking `Read` over a channel of chunks, hashing and counting every
/// byte, and enforcing the compressed-size limit. As a `BufRead` it lends
/// the chunks themselves (no copy): give it to
/// [`extract_buffered`](crate::extract::extract_buffered).
pub struct ChannelReader {
    rx: mpsc::Receiver<Feed>,
    cur: Bytes,
    hasher: Sha256,
    /// Bytes consumed.
    count: u64,
    /// Bytes received (consumed or in `cur`), checked against `max`.
    received: u64,
    max: u64,
    outcome: Arc<Mutex<ReadOutcome>>,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<Feed>, max: u64) -> (ChannelReader, Arc<Mutex<ReadOutcome>>) {
        let outcome = Arc::new(Mutex::new(ReadOutcome::default()));
        let r = ChannelReader {
            rx,
            cur: Bytes::new(),
            hasher: Sha256::new(),
            count: 0,
            received: 0,
            max,
            outcome: outcome.clone(),
        };
        (r, outcome)
    }

    fn fail(&mut self, e: ArchiveError) -> io::Error {
        let msg = e.to_string();
        let mut o = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        o.count = self.count;
        o.failure = Some(e);
        io::Error::other(msg)
    }
}

impl BufRead for ChannelReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                None => {
                    let mut o = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
                    o.count = self.count;
                    o.sha256 = Some(hex::encode(self.hasher.clone().finalize()));
                    return Ok(&[]);
                }
                Some(Ok(b)) => {
                    self.received += b.len() as u64;
                    if self.received > self.max {
                        let max = self.max;
                        return Err(self.fail(ArchiveError::Limit {
                            limit: "max_archive_bytes",
                            detail: format!("the archive is larger than {max} bytes"),
                        }));
                    }
                    self.cur = b;
                }
                Some(Err(e)) => return Err(self.fail(e)),
            }
        }
        Ok(&self.cur)
    }

    fn consume(&mut self, n: usize) {
        let n = n.min(self.cur.len());
        let chunk = self.cur.split_to(n);
        self.hasher.update(&chunk);
        self.count += n as u64;
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let have = self.fill_buf()?;
        let n = buf.len().min(have.len());
        buf[..n].copy_from_slice(&have[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// Blocking `Write` that cuts the output into chunks of at most `chunk`
/// bytes and sends them down a channel, hashing and counting them.
///
/// Once the receiver is gone (client disconnected) it sets `closed` and
/// discards further output instead of failing: compressors then shut down
/// normally, and the producer stops when it sees the flag.
pub struct ChunkSink<T> {
    tx: mpsc::Sender<T>,
    closed: Arc<AtomicBool>,
    wrap: fn(Bytes) -> T,
    buf: BytesMut,
    chunk: usize,
    hasher: Sha256,
    count: u64,
}

impl<T> ChunkSink<T> {
    pub fn new(tx: mpsc::Sender<T>, chunk: usize, wrap: fn(Bytes) -> T) -> ChunkSink<T> {
        ChunkSink {
            tx,
            closed: Arc::new(AtomicBool::new(false)),
            wrap,
            buf: BytesMut::with_capacity(chunk),
            chunk,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Set once the receiver is gone.
    pub fn closed(&self) -> Arc<AtomicBool> {
        self.closed.clone()
    }

    fn send(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let b = self.buf.split().freeze();
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        self.hasher.update(&b);
        self.count += b.len() as u64;
        if self.tx.blocking_send((self.wrap)(b)).is_err() {
            self.closed.store(true, Ordering::Relaxed);
        }
    }

    /// Sends what is buffered; returns (bytes sent, sha256 hex) and the
    /// sender for a trailer. Fails if the receiver went away.
    pub fn finish(mut self) -> io::Result<(u64, String, mpsc::Sender<T>)> {
        self.send();
        if self.closed.load(Ordering::Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the receiving side went away",
            ));
        }
        Ok((self.count, hex::encode(self.hasher.finalize()), self.tx))
    }
}

impl<T> Write for ChunkSink<T> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = self.chunk - self.buf.len();
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == self.chunk {
            self.send();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader over `chunks`, the sender dropped after them.
    fn reader(chunks: Vec<Feed>, max: u64) -> (ChannelReader, Arc<Mutex<ReadOutcome>>) {
        let (tx, rx) = mpsc::channel(chunks.len().max(1));
        for c in chunks {
            tx.try_send(c).expect("room");
        }
        ChannelReader::new(rx, max)
    }

    fn failure(outcome: &Arc<Mutex<ReadOutcome>>) -> Option<ArchiveError> {
        outcome.lock().expect("lock").failure.take()
    }

    #[test]
    fn max_archive_bytes_bounds_what_a_reader_takes() {
        let chunks = || {
            vec![
                Ok(Bytes::from_static(b"01234")),
                Ok(Bytes::from_static(b"56789")),
            ]
        };
        let (mut r, outcome) = reader(chunks(), 10);
        let mut out = Vec::new();
        r.read_to_end(&mut out).expect("10 bytes");
        assert_eq!(out, b"0123456789");
        {
            let o = outcome.lock().expect("lock");
            assert_eq!(o.count, 10);
            assert_eq!(
                o.sha256.as_deref(),
                Some(hex::encode(Sha256::digest(b"0123456789")).as_str())
            );
        }
        let (mut r, outcome) = reader(chunks(), 9);
        let e = r.read_to_end(&mut Vec::new()).expect_err("over");
        assert!(
            e.to_string().contains("limit archive.max_archive_bytes"),
            "{e}"
        );
        assert!(matches!(
            failure(&outcome),
            Some(ArchiveError::Limit {
                limit: "max_archive_bytes",
                ..
            })
        ));
    }

    #[test]
    fn a_broken_stream_is_the_reader_s_failure() {
        let chunks = vec![
            Ok(Bytes::from_static(b"abc")),
            Err(ArchiveError::Cancelled("the client went away".into())),
        ];
        let (mut r, outcome) = reader(chunks, 100);
        let e = r.read_to_end(&mut Vec::new()).expect_err("broken");
        assert_eq!(e.to_string(), "the client went away");
        assert!(matches!(
            failure(&outcome),
            Some(ArchiveError::Cancelled(_))
        ));
        assert_eq!(outcome.lock().expect("lock").count, 3);
    }

    #[test]
    fn a_sink_sends_whole_chunks_and_counts_them() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut sink = ChunkSink::new(tx, 4, |b| b);
        sink.write_all(b"0123456789").expect("write");
        let (count, sha, _tx) = sink.finish().expect("finish");
        assert_eq!(count, 10);
        assert_eq!(sha, hex::encode(Sha256::digest(b"0123456789")));
        let mut got = Vec::new();
        while let Ok(b) = rx.try_recv() {
            got.push(b);
        }
        assert_eq!(got, vec![&b"0123"[..], b"4567", b"89"]);
    }

    #[test]
    fn a_sink_whose_receiver_is_gone_says_so() {
        let (tx, rx) = mpsc::channel(8);
        drop(rx);
        let mut sink = ChunkSink::new(tx, 4, |b| b);
        let closed = sink.closed();
        sink.write_all(b"01234567").expect("discarded");
        assert!(closed.load(Ordering::Relaxed));
        let e = sink.finish().expect_err("gone");
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
