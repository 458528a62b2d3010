//! A bounded ring buffer of log lines, one per server.
//!
//! Lines carry a sequence number that keeps increasing over the agent's
//! lifetime, so a reader can resume from a cursor and learn how many lines it
//! missed when the buffer overflowed. Memory is bounded by `max_bytes`
//! (line bytes) plus a small per-line overhead; a line longer than
//! `max_line_bytes` is cut and flagged.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::watch;

/// Which output of the child a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug, Clone)]
pub struct Line {
    pub seq: u64,
    pub stream: Stream,
    pub at_ms: u64,
    pub text: Bytes,
    pub truncated: bool,
}

/// A batch of lines read from a cursor.
#[derive(Debug, Default)]
pub struct Batch {
    pub lines: Vec<Line>,
    /// Lines between the requested cursor and the first line returned that
    /// have already left the buffer.
    pub dropped: u64,
    /// Cursor for the next read.
    pub next: u64,
}

struct Ring {
    lines: VecDeque<Line>,
    bytes: usize,
    next_seq: u64,
}

pub struct LogBuf {
    ring: Mutex<Ring>,
    max_bytes: usize,
    max_line_bytes: usize,
    /// The next sequence number; followers wait for it to change.
    tick: watch::Sender<u64>,
}

/// Bytes charged per line on top of its text, so a flood of empty lines is
/// bounded too.
const LINE_OVERHEAD: usize = 64;

impl LogBuf {
    pub fn new(max_bytes: usize, max_line_bytes: usize) -> LogBuf {
        LogBuf {
            ring: Mutex::new(Ring {
                lines: VecDeque::new(),
                bytes: 0,
                next_seq: 0,
            }),
            max_bytes,
            max_line_bytes,
            tick: watch::channel(0).0,
        }
    }

    pub fn max_line_bytes(&self) -> usize {
        self.max_line_bytes
    }

    /// Appends one line (without its newline), cutting it at the line limit.
    pub fn push(&self, stream: Stream, text: &[u8], truncated: bool) {
        let cut = text.len() > self.max_line_bytes;
        let text = Bytes::copy_from_slice(&text[..text.len().min(self.max_line_bytes)]);
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let cost = text.len() + LINE_OVERHEAD;
        while r.bytes + cost > self.max_bytes {
            match r.lines.pop_front() {
                Some(old) => r.bytes -= old.text.len() + LINE_OVERHEAD,
                None => break,
            }
        }
        let seq = r.next_seq;
        r.next_seq += 1;
        r.bytes += cost;
        r.lines.push_back(Line {
            seq,
            stream,
            at_ms: crate::supervisor::now_ms(),
            text,
            truncated: truncated || cut,
        });
        let next = r.next_seq;
        drop(r);
        self.tick.send_replace(next);
    }

    /// The sequence number the next line will get.
    pub fn next_seq(&self) -> u64 {
        self.ring.lock().unwrap_or_else(|p| p.into_inner()).next_seq
    }

    /// Cursor of the `n`-th most recent line (`n` = 0: the oldest line held).
    pub fn tail_cursor(&self, n: usize) -> u64 {
        let r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let first = r.lines.front().map_or(r.next_seq, |l| l.seq);
        if n == 0 {
            first
        } else {
            r.next_seq.saturating_sub(n as u64).max(first)
        }
    }

    /// Up to `max` lines from `cursor` on, optionally of one stream only.
    pub fn read(&self, cursor: u64, max: usize, only: Option<Stream>) -> Batch {
        let r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let first = r.lines.front().map_or(r.next_seq, |l| l.seq);
        let start = cursor.max(first);
        let dropped = start - cursor.min(start);
        let skip = (start - first) as usize;
        let mut lines = Vec::new();
        let mut next = start.min(r.next_seq);
        for l in r.lines.iter().skip(skip) {
            if lines.len() == max {
                break;
            }
            next = l.seq + 1;
            if only.is_none_or(|s| s == l.stream) {
                lines.push(l.clone());
            }
        }
        Batch {
            lines,
            dropped,
            next,
        }
    }

    /// The last lines of `stream` joined with newlines, at most `max_bytes`
    /// (cut at the front).
    pub fn tail_text(&self, stream: Stream, max_lines: usize, max_bytes: usize) -> String {
        let r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut picked: Vec<&Line> = r
            .lines
            .iter()
            .rev()
            .filter(|l| l.stream == stream)
            .take(max_lines)
            .collect();
        picked.reverse();
        let mut out = Vec::new();
        for l in picked {
            out.extend_from_slice(&l.text);
            out.push(b'\n');
        }
        let cut = out.len().saturating_sub(max_bytes);
        String::from_utf8_lossy(&out[cut..]).trim_end().to_owned()
    }

    /// Forgets every line (a new lease must not see the previous one's
    /// output). Sequence numbers keep increasing.
    pub fn clear(&self) {
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        r.lines.clear();
        r.bytes = 0;
    }

    /// Bytes currently held, overhead included.
    pub fn held_bytes(&self) -> usize {
        self.ring.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    /// Resolves once a line with a sequence number ≥ `cursor` exists.
    pub async fn wait_past(&self, cursor: u64) {
        let mut rx = self.tick.subscribe();
        let _ = rx.wait_for(|next| *next > cursor).await;
    }

    /// The lines from `cursor` on (only `only`'s, if given), as a stream.
    /// Without `follow` it ends once it has caught up; with it, it waits
    /// for new lines and ends only when dropped. Memory: one batch of at
    /// most [`FOLLOW_BATCH`] lines.
    pub fn stream(
        self: Arc<Self>,
        cursor: u64,
        only: Option<Stream>,
        follow: bool,
    ) -> impl futures_util::Stream<Item = Followed> + Send + 'static {
        let state = (self, cursor, VecDeque::<Followed>::new());
        futures_util::stream::unfold(state, move |(buf, mut cursor, mut pending)| async move {
            loop {
                if let Some(f) = pending.pop_front() {
                    return Some((f, (buf, cursor, pending)));
                }
                let batch = buf.read(cursor, FOLLOW_BATCH, only);
                let caught_up = batch.next == cursor || batch.next >= buf.next_seq();
                cursor = batch.next;
                let mut dropped = batch.dropped;
                pending.extend(batch.lines.into_iter().map(|line| Followed {
                    line,
                    dropped_before: std::mem::take(&mut dropped),
                }));
                if pending.is_empty() && caught_up {
                    if !follow {
                        return None;
                    }
                    buf.wait_past(cursor).await;
                }
            }
        })
    }
}

/// Lines read from the buffer at a time by [`LogBuf::stream`].
pub const FOLLOW_BATCH: usize = 256;

/// A line as a [`LogBuf::stream`] reader sees it.
#[derive(Debug, Clone)]
pub struct Followed {
    pub line: Line,
    /// Lines that left the buffer before the reader got to them, between
    /// the previous line it saw and this one.
    pub dropped_before: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stream_resumes_at_its_cursor_and_follows() {
        use futures_util::StreamExt;
        let b = Arc::new(LogBuf::new(4 * (LINE_OVERHEAD + 8), 8));
        for i in 0..6u32 {
            b.push(Stream::Stderr, format!("e{i}").as_bytes(), false);
        }
        b.push(Stream::Stdout, b"o6", false);
        // Lines 0 and 1 left the buffer: the first line read says so.
        let all: Vec<Followed> = b.clone().stream(0, None, false).collect().await;
        let texts: Vec<&[u8]> = all.iter().map(|f| f.line.text.as_ref()).collect();
        assert_eq!(texts, [&b"e3"[..], b"e4", b"e5", b"o6"]);
        assert_eq!(all[0].dropped_before, 3);
        assert!(all[1..].iter().all(|f| f.dropped_before == 0));
        let stdout: Vec<Followed> = b
            .clone()
            .stream(4, Some(Stream::Stdout), false)
            .collect()
            .await;
        assert_eq!(stdout.len(), 1);
        assert_eq!(stdout[0].line.seq, 6);
        // Following: a line pushed later arrives; nothing is repeated.
        let mut s = Box::pin(b.clone().stream(7, None, true));
        let b2 = b.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            b2.push(Stream::Stderr, b"late", false);
        });
        let f = s.next().await.expect("a followed line");
        assert_eq!((f.line.seq, f.line.text.as_ref()), (7, &b"late"[..]));
    }

    #[test]
    fn bounded_and_resumable() {
        let b = LogBuf::new(10 * (LINE_OVERHEAD + 4), 4);
        for i in 0..100u32 {
            b.push(Stream::Stderr, format!("{i:04}").as_bytes(), false);
        }
        assert!(b.held_bytes() <= 10 * (LINE_OVERHEAD + 4));
        let batch = b.read(0, 1000, None);
        assert_eq!(batch.lines.len(), 10);
        assert_eq!(batch.dropped, 90);
        assert_eq!(batch.lines[0].text.as_ref(), b"0090");
        assert_eq!(batch.next, 100);
        let again = b.read(batch.next, 1000, None);
        assert!(again.lines.is_empty() && again.dropped == 0);
        b.push(Stream::Stderr, b"toolong", false);
        let last = b.read(100, 10, None);
        assert_eq!(last.lines[0].text.as_ref(), b"tool");
        assert!(last.lines[0].truncated);
        assert_eq!(b.tail_cursor(2), 99);
    }
}
