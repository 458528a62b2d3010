//! Placing benchmark seed data and wiping server state paths. Blocking.

use rustix::fs::{Mode, OFlags};
use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::supervisor::manifest::Seed;
use crate::workspace::stream::{ChannelReader, ChunkSink, Feed};
use crate::workspace::{
    ArchiveError, Compression, InitRequest, MAX_CHUNK_BYTES, Workspace, WorkspaceError, codec, pack,
};

/// Streams `from` (an archive file, or a directory packed on the fly) as
/// tar bytes into a channel, on its own thread.
fn feed(from: &Path) -> mpsc::Receiver<Feed> {
    let (tx, rx) = mpsc::channel::<Feed>(8);
    let from = from.to_owned();
    std::thread::spawn(move || {
        let fail = |tx: &mpsc::Sender<Feed>, e: ArchiveError| {
            let _ = tx.blocking_send(Err(e));
        };
        if from.is_dir() {
            let dir = match std::fs::File::open(&from) {
                Ok(d) => d,
                Err(e) => {
                    return fail(
                        &tx,
                        ArchiveError::io(format!("opening {}", from.display()), e),
                    );
                }
            };
            let sink = ChunkSink::new(tx.clone(), MAX_CHUNK_BYTES, Ok);
            match pack::pack(dir.as_fd(), &pack::PackOptions::default(), sink) {
                Ok((sink, _)) => {
                    let _ = sink.finish();
                }
                Err(e) => fail(&tx, e),
            }
        } else {
            let mut f = match std::fs::File::open(&from) {
                Ok(f) => f,
                Err(e) => {
                    return fail(
                        &tx,
                        ArchiveError::io(format!("opening {}", from.display()), e),
                    );
                }
            };
            let mut buf = vec![0u8; 256 << 10];
            loop {
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if tx
                            .blocking_send(Ok(bytes::Bytes::copy_from_slice(&buf[..n])))
                            .is_err()
                        {
                            break;
                        }
                    }
                    Err(e) => {
                        return fail(
                            &tx,
                            ArchiveError::io(format!("reading {}", from.display()), e),
                        );
                    }
                }
            }
        }
    });
    rx
}

/// Places one seed: merged into the workspace (through the same confined,
/// limited, atomic path as Initialize), or unpacked into a state directory.
pub fn place(ws: &Arc<Workspace>, seed: &Seed) -> Result<(), WorkspaceError> {
    let limits = ws.limits().clone();
    let (reader, outcome) = ChannelReader::new(feed(&seed.from), limits.max_archive_bytes);
    match &seed.to {
        None => {
            let guard = ws.begin("Initialize")?;
            let req = InitRequest {
                compression: Compression::Auto,
                merge: true,
                ..Default::default()
            };
            guard.initialize(&req, reader, &outcome).map(|_| ())
        }
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| WorkspaceError::io(format!("creating {}", dir.display()), e))?;
            let mut r = codec::buffered(reader);
            let c = codec::sniff(&mut r, Compression::Auto)
                .map_err(|e| WorkspaceError::io("reading the seed", e))?;
            let d = codec::decoder(r, c).map_err(|e| WorkspaceError::io("reading the seed", e))?;
            tar::Archive::new(d)
                .unpack(dir)
                .map_err(|e| WorkspaceError::io(format!("unpacking into {}", dir.display()), e))
        }
    }
}

/// Empties a state directory, creating it when missing (servers expect it
/// to exist). Something else at the path (a file, a symlink) is replaced.
pub fn wipe(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        // Whatever the tenant made there, however deep: no recursion, a
        // bounded number of open directories, no link followed. Everything
        // that can go goes; the first failure is reported.
        Ok(m) if m.is_dir() => {
            let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let dir = rustix::fs::open(path, flags, Mode::empty())?;
            let mut first = None;
            for name in sandbox_tree::list(dir.as_fd())? {
                let at = path.join(&name);
                if let Err(e) = sandbox_tree::remove_at(dir.as_fd(), &name, &at) {
                    first.get_or_insert(e.into());
                }
            }
            first.map_or(Ok(()), Err)
        }
        Ok(_) => {
            std::fs::remove_file(path)?;
            std::fs::create_dir_all(path)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(path),
        Err(e) => Err(e),
    }
}
