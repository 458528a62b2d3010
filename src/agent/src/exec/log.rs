//! An execution's log: one file that stdout and stderr are appended to as
//! written, read back by byte cursor.
//!
//! - **Bounded.** The file never grows past `max_bytes`: once the output
//!   would pass it, a marker line is written in its place and the rest of
//!   the output is counted but discarded (the pipe is still drained, so the
//!   script never blocks on a full pipe). Memory is one read buffer.
//! - **Cursor reads** ([`ExecLog::read`]) return the bytes from a cursor,
//!   at most `max` of them, as text. A read never ends inside a UTF-8
//!   character that may still be completed (the log is still open, or the
//!   read was cut by `max`): the returned cursor stops before it, so the
//!   next read starts with the whole character. Bytes that are not UTF-8
//!   are shown as U+FFFD but counted as they were, so cursors stay byte
//!   offsets and no byte is lost or repeated.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;

use rustix::fs::{AtFlags, Mode, OFlags};
use std::sync::Mutex;

use tokio::sync::watch;

/// Room kept below the cap for the markers the agent writes itself.
const MARKER_ROOM: u64 = 512;

/// Where the log stands; published on every change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogState {
    /// Bytes in the file.
    pub len: u64,
    /// Output discarded after the cap.
    pub dropped: u64,
    /// No more bytes will be written.
    pub closed: bool,
}

pub struct ExecLog {
    file: Mutex<File>,
    max_bytes: u64,
    state: watch::Sender<LogState>,
}

/// One cursor read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    pub text: String,
    pub next: u64,
    /// The log is closed and `next` is its end.
    pub complete: bool,
}

/// A cursor past the end of the log.
#[derive(Debug, thiserror::Error)]
#[error("cursor {cursor} is past the end of the log ({len} bytes)")]
pub struct PastEnd {
    pub cursor: u64,
    pub len: u64,
}

impl ExecLog {
    /// Creates the log file `name` in the directory `dir` (a handle: the
    /// execution directory, the agent's own), removing an old one first.
    /// Never through a symlink, never an existing file: whatever is at
    /// `name` is unlinked (not followed), then the log is made with
    /// `O_CREAT | O_EXCL | O_NOFOLLOW`, so a link planted in between fails
    /// the create instead of being written through.
    pub fn create(dir: BorrowedFd<'_>, name: &str, max_bytes: u64) -> io::Result<ExecLog> {
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )?;
        let file = File::from(fd);
        Ok(ExecLog {
            file: Mutex::new(file),
            max_bytes: max_bytes.max(MARKER_ROOM * 2),
            state: watch::channel(LogState::default()).0,
        })
    }

    pub fn state(&self) -> LogState {
        *self.state.borrow()
    }

    /// Follows the log's growth.
    pub fn subscribe(&self) -> watch::Receiver<LogState> {
        self.state.subscribe()
    }

    /// Appends output of the script. Past the cap, writes the marker once
    /// and discards the rest.
    pub fn append(&self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let st = self.state();
        if st.closed {
            return Ok(());
        }
        let room = (self.max_bytes - MARKER_ROOM).saturating_sub(st.len);
        let take = room.min(data.len() as u64) as usize;
        let mut written = 0u64;
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if take > 0 {
            file.write_all(&data[..take])?;
            written += take as u64;
        }
        let rest = (data.len() - take) as u64;
        let mut dropped = 0;
        if rest > 0 {
            if st.dropped == 0 {
                let m = format!(
                    "\n[sandbox-agent] the log reached its limit of {} bytes (exec.log_max_bytes); later output is discarded\n",
                    self.max_bytes
                );
                file.write_all(m.as_bytes())?;
                written += m.len() as u64;
            }
            dropped = rest;
        }
        drop(file);
        self.state.send_modify(|s| {
            s.len += written;
            s.dropped += dropped;
        });
        Ok(())
    }

    /// Appends a line from the agent itself (step headers, the outcome).
    /// Agent lines are kept within the room reserved below the cap.
    pub fn note(&self, line: &str) {
        let st = self.state();
        if st.closed || st.len + line.len() as u64 + 1 > self.max_bytes {
            return;
        }
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let text = format!("{line}\n");
        if file.write_all(text.as_bytes()).is_ok() {
            drop(file);
            self.state.send_modify(|s| s.len += text.len() as u64);
        }
    }

    /// No more output; followers see `closed`.
    pub fn close(&self) {
        let st = self.state();
        if st.dropped > 0 {
            self.note(&format!(
                "[sandbox-agent] {} bytes of output were discarded after the limit",
                st.dropped
            ));
        }
        self.state.send_modify(|s| s.closed = true);
    }

    /// Reads from `cursor`, at most `max` bytes (at least 4 are read, so a
    /// whole character always fits). See the module docs.
    pub fn read(&self, cursor: u64, max: usize) -> Result<LogChunk, ReadError> {
        let st = self.state();
        if cursor > st.len {
            return Err(ReadError::PastEnd(PastEnd {
                cursor,
                len: st.len,
            }));
        }
        let want = (st.len - cursor).min(max.max(4) as u64) as usize;
        let mut buf = vec![0u8; want];
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.read_exact_at(&mut buf, cursor)
            .map_err(ReadError::Io)?;
        drop(file);
        let cut_by_max = cursor + (want as u64) < st.len;
        let end = if cut_by_max || !st.closed {
            complete_prefix(&buf)
        } else {
            buf.len()
        };
        buf.truncate(end);
        let next = cursor + end as u64;
        let text = match String::from_utf8(buf) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        Ok(LogChunk {
            text,
            next,
            complete: st.closed && next == st.len,
        })
    }
}

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    PastEnd(PastEnd),
    #[error("reading the log: {0}")]
    Io(io::Error),
}

/// Length of `b` without a trailing, incomplete UTF-8 sequence (one whose
/// lead byte announces more continuation bytes than follow it).
fn complete_prefix(b: &[u8]) -> usize {
    // A sequence is at most 4 bytes: look at the last 3 for its lead byte.
    for back in 1..=3.min(b.len()) {
        let i = b.len() - back;
        let lead = b[i];
        if lead & 0xC0 == 0x80 {
            continue; // a continuation byte; the lead is further back
        }
        let need = match lead {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1, // ASCII, or a byte that can start no sequence
        };
        return if back < need { i } else { b.len() };
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(max: u64) -> (tempfile::TempDir, ExecLog) {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let l = ExecLog::create(std::os::fd::AsFd::as_fd(&dir), "log", max).unwrap();
        (d, l)
    }

    #[test]
    fn create_never_writes_through_a_planted_link() {
        use std::os::fd::AsFd;
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, d.path().join("output.log")).unwrap();
        let dir = File::open(d.path()).unwrap();
        let l = ExecLog::create(dir.as_fd(), "output.log", 4096).unwrap();
        l.note("hello");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        let m = std::fs::symlink_metadata(d.path().join("output.log")).unwrap();
        assert!(m.is_file());
        assert_eq!(
            std::fs::read_to_string(d.path().join("output.log")).unwrap(),
            "hello\n"
        );
        // A hard link to an outside file is unlinked, never truncated.
        drop(l);
        std::fs::remove_file(d.path().join("output.log")).unwrap();
        std::fs::hard_link(&outside, d.path().join("output.log")).unwrap();
        let _l = ExecLog::create(dir.as_fd(), "output.log", 4096).unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
    }

    #[test]
    fn an_incomplete_character_at_the_end_is_held_back() {
        assert_eq!(complete_prefix("aé".as_bytes()), 3);
        assert_eq!(complete_prefix(&"aé".as_bytes()[..2]), 1);
        assert_eq!(complete_prefix(&"€".as_bytes()[..2]), 0);
        assert_eq!(complete_prefix(&"😀".as_bytes()[..3]), 0);
        assert_eq!(complete_prefix("😀".as_bytes()), 4);
        // Not UTF-8 at all: nothing is held back forever.
        assert_eq!(complete_prefix(&[0x80, 0x80, 0x80, 0x80]), 4);
        assert_eq!(complete_prefix(&[b'a', 0xFF]), 2);
    }

    #[test]
    fn small_reads_reassemble_multibyte_text_exactly() {
        let (_d, l) = log(1 << 20);
        let text = "héllo wörld — ✓ 😀 naïve 日本語\n".repeat(50);
        for piece in text.as_bytes().chunks(7) {
            l.append(piece).unwrap();
        }
        l.close();
        for max in [4, 5, 6, 7, 13] {
            let (mut got, mut cur) = (String::new(), 0);
            loop {
                let c = l.read(cur, max).unwrap();
                got.push_str(&c.text);
                assert!(c.next > cur || c.complete, "no progress at {cur}");
                cur = c.next;
                if c.complete {
                    break;
                }
            }
            assert_eq!(got, text, "max {max}");
        }
    }

    #[test]
    fn an_open_log_never_ends_a_read_inside_a_character() {
        let (_d, l) = log(1 << 20);
        l.append(&"a€".as_bytes()[..3]).unwrap();
        let c = l.read(0, 100).unwrap();
        assert_eq!((c.text.as_str(), c.next, c.complete), ("a", 1, false));
        l.append(&"a€".as_bytes()[3..]).unwrap();
        let c = l.read(1, 100).unwrap();
        assert_eq!((c.text.as_str(), c.next), ("€", 4));
        assert!(matches!(l.read(5, 10), Err(ReadError::PastEnd(_))));
    }

    #[test]
    fn the_cap_writes_one_marker_and_discards_the_rest() {
        let (_d, l) = log(4096);
        for _ in 0..100 {
            l.append(&[b'x'; 1000]).unwrap();
        }
        l.close();
        let st = l.state();
        assert!(st.len <= 4096, "{st:?}");
        assert_eq!(st.dropped, 100_000 - (4096 - MARKER_ROOM));
        let all = l.read(0, 1 << 20).unwrap().text;
        assert!(all.contains("reached its limit of 4096 bytes"), "{all}");
        assert!(all.ends_with("bytes of output were discarded after the limit\n"));
    }
}
