//! Workspace transfer benchmark: the real agent over a unix socket against
//! GNU tar, pigz and cp on the same corpora, in the same run. Prints
//! medians and ratios; asserts nothing.
//!
//! Corpora (generated): ~20,000 files of 1–8 KiB in nested directories, and
//! 10 files totalling 512 MiB (half text, half random). Plus a 1 GiB archive
//! for the agent's peak RSS while extracting. `BENCH=short` (CI) uses 2,000
//! files, 16 MiB and 32 MiB, with fewer runs.
//!
//! Each Initialize goes into a fresh, empty workspace of a fresh agent, and
//! each reference extraction into a fresh directory, so no run pays for
//! another's deletions (ext4 delays reuse of freed inodes). Trees are only
//! removed at the end.

use crate::common;
use common::AGENT;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_client::proto;
use sandbox_client::proto::health::HealthCheckRequest;
use tokio_stream::StreamExt;

struct Running {
    child: Child,
    sock: PathBuf,
    log: PathBuf,
}

impl Running {
    fn hwm_kib(&self) -> u64 {
        proc_status(self.child.id(), "VmHWM:")
    }
    fn sync_ms(&self) -> Option<u64> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("workspace initialized"))?;
        line.split("sync_ms=")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn proc_status(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn start(dir: &Path) -> (Running, sandbox_client::Client) {
    std::fs::create_dir_all(dir).expect("dir");
    let sock = dir.join("a.sock");
    let log = dir.join("agent.log");
    let child = Command::new(&*AGENT)
        .arg("--mcp-listen")
        .arg(format!("unix://{}.mcp", sock.display()))
        .arg("--listen")
        .arg(format!("unix://{}", sock.display()))
        .arg("--workspace")
        .arg(dir.join("ws"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn agent");
    let r = Running { child, sock, log };
    let uri = format!("unix://{}", r.sock.display());
    let t = Instant::now();
    loop {
        if let Ok(c) = sandbox_client::connect(&uri).await
            && c.health()
                .check(HealthCheckRequest::default())
                .await
                .is_ok()
        {
            return (r, c);
        }
        assert!(t.elapsed() < Duration::from_secs(10), "agent did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Streams an archive file into Initialize, as `sandboxctl upload FILE` does.
async fn upload(client: &sandbox_client::Client, archive: &Path) -> Duration {
    use proto::initialize_request::Msg;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let path = archive.to_owned();
    let t = Instant::now();
    let producer = tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(path).expect("archive");
        let _ = tx.blocking_send(proto::InitializeRequest {
            msg: Some(Msg::Header(proto::InitializeHeader::default())),
        });
        loop {
            let mut buf = vec![0u8; 1 << 20];
            let n = f.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            buf.truncate(n);
            if tx
                .blocking_send(proto::InitializeRequest {
                    msg: Some(Msg::Chunk(buf.into())),
                })
                .is_err()
            {
                break;
            }
        }
    });
    client
        .workspace()
        .initialize(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("initialize");
    let took = t.elapsed();
    producer.await.expect("producer");
    took
}

async fn dump_to(
    client: &sandbox_client::Client,
    compression: proto::Compression,
    out: &Path,
) -> Duration {
    use std::io::Write;
    let t = Instant::now();
    let mut f = std::fs::File::create(out).expect("out");
    let mut s = client
        .workspace()
        .dump(proto::DumpRequest {
            compression: compression as i32,
            ..Default::default()
        })
        .await
        .expect("dump")
        .into_inner();
    while let Some(m) = s.next().await {
        if let Some(proto::dump_response::Msg::Chunk(b)) = m.expect("chunk").msg {
            f.write_all(&b).expect("write");
        }
    }
    t.elapsed()
}

fn sh(cmd: &str) -> Duration {
    let t = Instant::now();
    let st = Command::new("sh").arg("-c").arg(cmd).status().expect("sh");
    assert!(st.success(), "{cmd}");
    t.elapsed()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64()
}

const WORDS: [&str; 16] = [
    "sandbox",
    "agent",
    "workspace",
    "tool",
    "server",
    "call",
    "result",
    "error",
    "json",
    "value",
    "file",
    "the",
    "of",
    "and",
    "to",
    "in",
];

fn text(rng: &mut fastrand::Rng, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        out.extend_from_slice(WORDS[rng.usize(..WORDS.len())].as_bytes());
        out.push(if rng.u8(..12) == 0 { b'\n' } else { b' ' });
    }
    out.truncate(len);
    out
}

fn small_corpus(root: &Path) {
    let mut rng = fastrand::Rng::with_seed(7);
    for a in 0..common::pick(20, 2) {
        for b in 0..10 {
            let d = root.join(format!("pkg{a}/mod{b}"));
            std::fs::create_dir_all(&d).expect("mkdir");
            for c in 0..100 {
                let len = rng.usize(1024..8192);
                std::fs::write(d.join(format!("f{c}.txt")), text(&mut rng, len)).expect("write");
            }
        }
    }
}

fn large_corpus(root: &Path) {
    let mut rng = fastrand::Rng::with_seed(8);
    std::fs::create_dir_all(root).expect("mkdir");
    let each = common::pick(512 << 20, 16 << 20) / 10;
    for i in 0..10 {
        let data: Vec<u8> = if i % 2 == 0 {
            text(&mut rng, each)
        } else {
            (0..each).map(|_| rng.u8(..)).collect()
        };
        std::fs::write(root.join(format!("blob{i}.bin")), data).expect("write");
    }
}

struct Row(String, String, String);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
pub async fn main() {
    for tool in ["tar", "pigz", "cp", "zstd"] {
        assert!(
            have(tool),
            "{tool} is needed by this benchmark (the test command installs it)"
        );
    }
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tmp");
    let b = base.path();
    println!(
        "# workspace transfer benchmark (2 cores; medians; {})",
        common::mode()
    );
    let mut rows = Vec::new();
    let mut peak_kib = 0u64;

    let small = common::pick("20,000 files of 1-8 KiB", "2,000 files of 1-8 KiB");
    let large = common::pick(
        "10 files, 512 MiB (half random)",
        "10 files, 16 MiB (half random)",
    );
    for (name, tag, runs, generate) in [
        (
            small,
            "small",
            common::pick(5usize, 3),
            small_corpus as fn(&Path),
        ),
        (large, "large", common::pick(3, 1), large_corpus),
    ] {
        let corpus = b.join(format!("{tag}-corpus"));
        generate(&corpus);
        let archive = b.join(format!("{tag}.tgz"));
        sh(&format!(
            "tar -czf {} -C {} .",
            archive.display(),
            corpus.display()
        ));
        let size = std::fs::metadata(&archive).expect("archive").len();
        println!("\n## {name}: archive {:.1} MiB", size as f64 / 1048576.0);

        // Initialize vs tar -xzf vs cp -r.
        let (mut init, mut xzf, mut cp, mut syncs) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..runs {
            sh("sync");
            let dir = b.join(format!("{tag}-init{i}"));
            let (agent, client) = start(&dir).await;
            init.push(upload(&client, &archive).await);
            peak_kib = peak_kib.max(agent.hwm_kib());
            syncs.push(Duration::from_millis(agent.sync_ms().unwrap_or(0)));
            drop(agent);
            sh("sync");
            let x = b.join(format!("{tag}-xzf{i}"));
            std::fs::create_dir_all(&x).expect("mkdir");
            xzf.push(sh(&format!(
                "tar -xzf {} -C {}",
                archive.display(),
                x.display()
            )));
            sh("sync");
            cp.push(sh(&format!(
                "cp -r {} {}",
                corpus.display(),
                b.join(format!("{tag}-cp{i}")).display()
            )));
        }
        let (i, x, c, s) = (median(init), median(xzf), median(cp), median(syncs));
        rows.push(Row(
            format!(
                "{name}: Initialize (upload over unix, incl. {:.2} s syncfs)",
                s
            ),
            format!("{i:.2} s"),
            format!(
                "tar -xzf {x:.2} s → {:.2}×; cp -r {c:.2} s → {:.2}×",
                i / x,
                i / c
            ),
        ));

        // Dump vs tar -czf vs tar | pigz -p2, and zstd.
        let dir = b.join(format!("{tag}-init0"));
        let (agent, client) = start(&dir).await;
        let (mut gz, mut zs, mut czf, mut pz) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..runs {
            gz.push(
                dump_to(
                    &client,
                    proto::Compression::Gzip,
                    &b.join(format!("{tag}-dump{i}.tgz")),
                )
                .await,
            );
            zs.push(
                dump_to(
                    &client,
                    proto::Compression::Zstd,
                    &b.join(format!("{tag}-dump{i}.tzst")),
                )
                .await,
            );
            czf.push(sh(&format!(
                "tar -czf {} -C {} .",
                b.join("ref.tgz").display(),
                corpus.display()
            )));
            pz.push(sh(&format!(
                "tar -cf - -C {} . | pigz -p2 -6 > {}",
                corpus.display(),
                b.join("ref-pigz.tgz").display()
            )));
        }
        peak_kib = peak_kib.max(agent.hwm_kib());
        let dump_size = std::fs::metadata(b.join(format!("{tag}-dump0.tgz")))
            .map(|m| m.len())
            .unwrap_or(0);
        let pigz_size = std::fs::metadata(b.join("ref-pigz.tgz"))
            .map(|m| m.len())
            .unwrap_or(0);
        drop(agent);
        let (g, z, t, p) = (median(gz), median(zs), median(czf), median(pz));
        rows.push(Row(
            format!(
                "{name}: Dump gzip -6 ({:.1} MiB; pigz {:.1} MiB)",
                dump_size as f64 / 1048576.0,
                pigz_size as f64 / 1048576.0
            ),
            format!("{g:.2} s"),
            format!(
                "tar -czf {t:.2} s → {:.2}×; tar|pigz -p2 {p:.2} s → {:.2}×",
                g / t,
                g / p
            ),
        ));
        rows.push(Row(
            format!("{name}: Dump zstd -3"),
            format!("{z:.2} s"),
            format!("tar -czf {t:.2} s → {:.2}×", z / t),
        ));
    }

    // Peak RSS while extracting a 1 GiB archive (32 MiB in the short mode).
    let gib = b.join("gib-corpus");
    std::fs::create_dir_all(&gib).expect("mkdir");
    let mut rng = fastrand::Rng::with_seed(9);
    for i in 0..common::pick(4, 1) {
        let data: Vec<u8> = (0..common::pick(256 << 20, 32 << 20))
            .map(|_| rng.u8(..))
            .collect();
        std::fs::write(gib.join(format!("r{i}")), data).expect("write");
    }
    let gib_archive = b.join("gib.tar.zst");
    sh(&format!(
        "tar -cf - -C {} . | zstd -q -1 -T0 -o {}",
        gib.display(),
        gib_archive.display()
    ));
    let (agent, client) = start(&b.join("gib-init")).await;
    let took = upload(&client, &gib_archive).await;
    let gib_peak = agent.hwm_kib();
    drop(agent);

    println!("\n| measure | sandbox-agent | reference (same run) |");
    println!("|---|---|---|");
    for Row(a, c, d) in rows {
        println!("| {a} | {c} | {d} |");
    }
    println!(
        "| peak agent RSS over all runs above | {:.1} MiB | |",
        peak_kib as f64 / 1024.0
    );
    println!(
        "| peak agent RSS extracting a {} archive (tar.zst) | {:.1} MiB | took {:.2} s |",
        common::pick("1 GiB", "32 MiB"),
        gib_peak as f64 / 1024.0,
        took.as_secs_f64()
    );
}
