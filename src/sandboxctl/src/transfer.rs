//! `upload` and `dump`: workspace transfer with progress.

use crate::output::outln;
use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sandbox_archive::codec::Encoder;
use sandbox_archive::pack::{PackOptions, pack};
use sandbox_archive::stream::ChunkSink;
use sandbox_archive::{Compression, MAX_CHUNK_BYTES};
use sandbox_client::Client;
use sandbox_client::proto;
use sandbox_client::proto::initialize_request::Msg;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;

use crate::output::{bytes, rpc_error};

/// What the progress bar shows: with a known size, the total, the
/// percentage and the time left; else what has moved so far.
fn progress_template(known_size: bool) -> &'static str {
    if known_size {
        "{msg} {bar:30} {bytes}/{total_bytes} {percent:>3}% {binary_bytes_per_sec} ETA {eta}"
    } else {
        "{msg} {spinner} {bytes} {binary_bytes_per_sec} {elapsed}"
    }
}

/// A progress bar on a terminal, nothing otherwise.
fn progress(len: Option<u64>, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let tmpl = progress_template(len.is_some());
    let bar = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    if let Ok(style) = ProgressStyle::with_template(tmpl) {
        bar.set_style(style);
    }
    bar.set_message(what.to_owned());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn rate(n: u64, d: Duration) -> String {
    format!("{}/s", bytes((n as f64 / d.as_secs_f64().max(1e-3)) as u64))
}

/// Archive bytes read from a directory (packed and compressed with zstd on
/// the fly: nothing is written to disk) or from an archive file.
pub(crate) struct Source {
    pub compression: proto::Compression,
    /// Size and sha256 when the source is a file.
    pub size: Option<u64>,
    pub sha256: String,
    pub chunks: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    pub producer: tokio::task::JoinHandle<anyhow::Result<()>>,
}

pub(crate) fn source(path: &Path) -> anyhow::Result<Source> {
    let md = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    if md.is_dir() {
        let dir = rustix::fs::open(
            path,
            rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .with_context(|| format!("cannot open directory {}", path.display()))?;
        let producer = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let sink = ChunkSink::new(tx, MAX_CHUNK_BYTES, |b| b);
            let closed = sink.closed();
            let enc = Encoder::new(sink, Compression::Zstd, 3, 0)?;
            let opts = PackOptions {
                cancelled: Some(&closed),
                ..Default::default()
            };
            let (enc, stats) = pack(dir.as_fd(), &opts, enc)?;
            if !stats.changed.is_empty() {
                eprintln!(
                    "sandboxctl: warning: {} file(s) changed while being packed, e.g. {}",
                    stats.changed.len(),
                    stats.changed[0]
                );
            }
            enc.finish()?
                .finish()
                .context("the agent stopped receiving")?;
            Ok(())
        });
        return Ok(Source {
            compression: proto::Compression::Zstd,
            size: None,
            sha256: String::new(),
            chunks: rx,
            producer,
        });
    }
    let size = md.len();
    let sha256 = sha256_file(path)?;
    let path: PathBuf = path.to_owned();
    let producer = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut f = std::fs::File::open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        loop {
            let mut buf = vec![0u8; MAX_CHUNK_BYTES];
            let n = f
                .read(&mut buf)
                .with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                return Ok(());
            }
            buf.truncate(n);
            if tx.blocking_send(buf.into()).is_err() {
                return Ok(());
            }
        }
    });
    Ok(Source {
        compression: proto::Compression::Auto,
        size: Some(size),
        sha256,
        chunks: rx,
        producer,
    })
}

pub async fn upload(
    client: &Client,
    path: &Path,
    merge: bool,
    durable: bool,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let mode = if merge {
        proto::InitializeMode::Merge
    } else {
        proto::InitializeMode::Replace
    } as i32;
    let start = Instant::now();
    let src = source(path)?;
    let header = proto::InitializeHeader {
        compression: src.compression as i32,
        mode,
        expected_sha256: src.sha256.clone(),
        size_hint: src.size.unwrap_or(0),
        durable: durable.then_some(true),
    };
    let bar = progress(src.size, "uploading");
    let producer = src.producer;
    let rx = src.chunks;
    let counter = bar.clone();
    let requests = tokio_stream::once(proto::InitializeRequest {
        msg: Some(Msg::Header(header)),
    })
    .chain(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(|b| proto::InitializeRequest {
            msg: Some(Msg::Chunk(b)),
        }),
    )
    .map(move |m| {
        if let Some(Msg::Chunk(b)) = &m.msg {
            counter.inc(b.len() as u64);
        }
        m
    });
    let mut ws = client.workspace();
    let call = ws.initialize(requests);
    tokio::pin!(call);
    tokio::pin!(producer);
    // If packing fails locally, the RPC is dropped (cancelled) so the agent
    // discards what it received; the workspace stays as it was.
    let answer = tokio::select! {
        r = &mut call => r,
        p = &mut producer => {
            match p {
                Ok(Ok(())) => call.await,
                Ok(Err(e)) => { bar.finish_and_clear(); return Err(e.context("upload aborted; the workspace is unchanged")) }
                Err(e) => { bar.finish_and_clear(); bail!("upload aborted: {e}") }
            }
        }
    };
    bar.finish_and_clear();
    let r = answer
        .map_err(|s| rpc_error("Workspace.Initialize", s))?
        .into_inner();
    report_uploaded(&r, start.elapsed(), json_out);
    Ok(ExitCode::SUCCESS)
}

fn report_uploaded(r: &proto::InitializeResponse, took: std::time::Duration, json_out: bool) {
    if json_out {
        outln!(
            "{}",
            json!({ "ok": true, "files": r.files, "dirs": r.dirs, "symlinks": r.symlinks, "hardlinks": r.hardlinks,
                    "bytes_written": r.bytes_written, "archive_bytes": r.archive_bytes, "archive_sha256": r.archive_sha256,
                    "agent_duration_ms": r.duration_ms, "duration_ms": took.as_millis() as u64 })
        );
    } else {
        outln!(
            "uploaded {} files, {} dirs, {} symlinks ({} expanded from {} sent, {}) in {:.2} s; sha256 {}",
            r.files,
            r.dirs,
            r.symlinks,
            bytes(r.bytes_written),
            bytes(r.archive_bytes),
            rate(r.archive_bytes, took),
            took.as_secs_f64(),
            r.archive_sha256
        );
    }
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            return Ok(hex::encode(h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

pub async fn dump(
    client: &Client,
    output: &str,
    exclude: Vec<String>,
    zstd: bool,
    level: i32,
    sub_path: String,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let compression = if zstd {
        proto::Compression::Zstd
    } else {
        proto::Compression::Gzip
    };
    let req = proto::DumpRequest {
        compression: compression as i32,
        level,
        exclude,
        sub_path,
    };
    let start = Instant::now();
    let stream = client
        .workspace()
        .dump(req)
        .await
        .map_err(|s| rpc_error("Workspace.Dump", s))?
        .into_inner();
    save(stream, "Workspace.Dump", "dumped", output, start, json_out).await
}

/// Writes an archive stream (chunks, then a trailer) to `output` (a file,
/// which appears only once complete and verified, or - for stdout) and
/// reports it.
pub(crate) async fn save(
    mut stream: tonic::Streaming<proto::DumpResponse>,
    rpc: &'static str,
    verb: &str,
    output: &str,
    start: Instant,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let to_stdout = output == "-";
    // A file only appears complete: write aside, rename at the end.
    let final_path = PathBuf::from(output);
    let partial = PathBuf::from(format!("{output}.partial-{}", std::process::id()));
    let mut out: Box<dyn tokio::io::AsyncWrite + Unpin + Send> = if to_stdout {
        Box::new(tokio::io::stdout())
    } else {
        Box::new(
            tokio::fs::File::create(&partial)
                .await
                .with_context(|| format!("cannot create {}", partial.display()))?,
        )
    };
    let trailer = match receive(&mut stream, rpc, &mut out)
        .await
        .and_then(Received::verified)
    {
        Ok(t) => t,
        Err(e) => {
            if !to_stdout {
                let _ = tokio::fs::remove_file(&partial).await;
            }
            return Err(e);
        }
    };
    if !to_stdout {
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .open(&partial)
            .await?;
        file.sync_all().await.context("syncing the archive")?;
        tokio::fs::rename(&partial, &final_path)
            .await
            .with_context(|| format!("renaming to {}", final_path.display()))?;
    }
    report_saved(&trailer, verb, output, start.elapsed(), json_out, to_stdout);
    Ok(ExitCode::SUCCESS)
}

/// An archive stream as received: its trailer, and what came before it.
struct Received {
    trailer: proto::DumpTrailer,
    sha256: String,
    bytes: u64,
}

impl Received {
    /// The trailer, when the bytes received are the ones it describes.
    fn verified(self) -> anyhow::Result<proto::DumpTrailer> {
        let (sha, received, t) = (self.sha256, self.bytes, self.trailer);
        if sha != t.sha256 || received != t.archive_bytes {
            bail!(
                "the archive received (sha256 {sha}, {received} bytes) is not what the agent sent (sha256 {}, {} bytes)",
                t.sha256,
                t.archive_bytes
            );
        }
        Ok(t)
    }
}

/// Writes the stream's chunks to `out` (hashing and counting them, with a
/// progress bar) until its trailer.
async fn receive(
    stream: &mut tonic::Streaming<proto::DumpResponse>,
    rpc: &'static str,
    out: &mut (dyn tokio::io::AsyncWrite + Unpin + Send),
) -> anyhow::Result<Received> {
    let bar = progress(None, "dumping");
    let mut h = Sha256::new();
    let mut received = 0u64;
    let result: anyhow::Result<proto::DumpTrailer> = async {
        while let Some(msg) = stream.next().await {
            match msg.map_err(|s| rpc_error(rpc, s))?.msg {
                Some(proto::dump_response::Msg::Chunk(b)) => {
                    h.update(&b);
                    received += b.len() as u64;
                    bar.inc(b.len() as u64);
                    out.write_all(&b).await.context("writing the archive")?;
                }
                Some(proto::dump_response::Msg::Trailer(t)) => {
                    out.flush().await.context("writing the archive")?;
                    return Ok(t);
                }
                None => {}
            }
        }
        bail!("the {rpc} stream ended without a trailer after {received} bytes; the archive is incomplete")
    }
    .await;
    bar.finish_and_clear();
    Ok(Received {
        trailer: result?,
        sha256: hex::encode(h.finalize()),
        bytes: received,
    })
}

/// Reports a saved archive: JSON on stdout, or on stderr when the archive
/// itself went to stdout; else lines for people on stderr.
fn report_saved(
    trailer: &proto::DumpTrailer,
    verb: &str,
    output: &str,
    took: std::time::Duration,
    json_out: bool,
    to_stdout: bool,
) {
    let summary = json!({ "ok": true, "output": output, "archive_bytes": trailer.archive_bytes, "sha256": trailer.sha256,
        "files": trailer.files, "dirs": trailer.dirs, "symlinks": trailer.symlinks, "skipped_special": trailer.skipped_special,
        "content_bytes": trailer.content_bytes, "changed_files": trailer.changed_files, "changed_truncated": trailer.changed_truncated,
        "agent_duration_ms": trailer.duration_ms, "duration_ms": took.as_millis() as u64 });
    if json_out {
        if to_stdout {
            eprintln!("{summary}");
        } else {
            outln!("{summary}");
        }
        return;
    }
    eprintln!(
        "{verb} {} files, {} dirs, {} symlinks ({} of content → {} archive, {}) in {:.2} s; sha256 {}",
        trailer.files,
        trailer.dirs,
        trailer.symlinks,
        bytes(trailer.content_bytes),
        bytes(trailer.archive_bytes),
        rate(trailer.archive_bytes, took),
        took.as_secs_f64(),
        trailer.sha256
    );
    if trailer.skipped_special > 0 {
        eprintln!(
            "skipped {} socket(s)/fifo(s)/device(s)",
            trailer.skipped_special
        );
    }
    if !trailer.changed_files.is_empty() {
        eprintln!(
            "warning: {} file(s) changed while being read, e.g. {}",
            trailer.changed_files.len(),
            trailer.changed_files[0]
        );
    }
}

/// `clear`: empties the workspace, atomically.
pub async fn clear(client: &Client, json_out: bool) -> anyhow::Result<ExitCode> {
    let r = client
        .workspace()
        .clear(proto::ClearRequest {})
        .await
        .map_err(|s| rpc_error("Workspace.Clear", s))?
        .into_inner();
    if json_out {
        outln!(
            "{}",
            json!({ "ok": true, "removed_entries": r.removed_entries, "duration_ms": r.duration_ms })
        );
    } else {
        outln!(
            "cleared the workspace ({} top-level entries removed, {} ms)",
            r.removed_entries,
            r.duration_ms
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_known_size_shows_total_percentage_and_eta() {
        let t = super::progress_template(true);
        for part in ["{total_bytes}", "{percent", "ETA {eta}"] {
            assert!(t.contains(part), "{t}");
        }
        let style = indicatif::ProgressStyle::with_template(t);
        assert!(style.is_ok(), "the template must parse");
        assert!(indicatif::ProgressStyle::with_template(super::progress_template(false)).is_ok());
    }
}
