//! sandbox-host benchmark (process backend), over HTTP on loopback against
//! the real host, agents and MCP servers; prints medians:
//! - Acquire of the notebook's servers (filesystem+git+terminal) with a pool
//!   of warm leases (`--warm-servers`: the servers already running), with a
//!   pool of bare agents (the Acquire starts the servers), and cold (no
//!   pool: an agent started per Acquire);
//! - the reference: the same Acquire + Release straight to an agent over
//!   gRPC, without the host, as a ratio;
//! - the Klavis notebook's whole cycle (acquire, upload-url, PUT a 3-file
//!   tar.gz, initialize, dump, download, release) with each pool;
//! - warm pools serving any subset (`warm`): Acquire p50/p99 of random
//!   subsets of a 5-server warm set, warm (narrowed) vs a bare pool, and
//!   the memory of a warm sandbox;
//! - the qemu backend (full mode): Acquire from a VM booted ahead with
//!   warm servers, from one without, and from a fresh VM;
//! - a recycled slot's next Acquire after a tenant that left 30,000
//!   directories or a deep chain, beside one after a clean lease, and
//!   another tenant's Acquires right after one filled three sandboxes'
//!   file systems (`recycle`);
//! - the benchmarks' start of a task, lazy with discovery catalogs beside
//!   eager (`first-minute`, `host/first_minute.rs`);
//! - executions: execute → `completed` of a trivial script (polling the
//!   log), beside `python3 main.py` run directly, and one execution-logs
//!   poll beside one `GET /local-sandbox/{id}`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::common;
#[path = "host/burst.rs"]
mod burst;
#[path = "host/first_minute.rs"]
pub mod first_minute;
#[cfg(feature = "kubernetes")]
#[path = "host/kube.rs"]
mod kube_api;
#[path = "host/memory.rs"]
mod memory;
#[path = "host/profiles.rs"]
mod profiles;
#[path = "host/recycle.rs"]
mod recycle;
#[path = "host/vm.rs"]
mod vm;
#[path = "host/warm.rs"]
mod warm;
use common::{AGENT, HOST};

const KEY: &str = "bench-key-0123456789";
fn rounds() -> usize {
    common::pick(15, 1)
}

/// The pools' size: three in the full mode, one in the short mode (a
/// smoke check: each pooled sandbox starts its servers).
fn pool() -> usize {
    common::pick(3, 1)
}

struct Host {
    child: Child,
    base: String,
    data: std::path::PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its sandboxes outlive it on purpose (restarts); not the bench.
        common::slots::end_all(&self.data);
    }
}

const NOTEBOOK: &str = r#"{"server_names": ["filesystem", "git", "terminal"]}"#;
const SERVERS: [&str; 3] = ["filesystem", "git", "terminal"];

fn start(dir: &Path, name: &str, pool: usize, warm: &str) -> Host {
    start_with(
        dir,
        name,
        &["--pool-size", &pool.to_string(), "--warm-servers", warm],
    )
}

/// A host with the process backend, the shipped manifest and `args`.
fn start_with(dir: &Path, name: &str, args: &[&str]) -> Host {
    let manifest = dir.join("servers.toml");
    std::fs::write(
        &manifest,
        common::shipped_manifest(Path::new("${state_root}")),
    )
    .expect("manifest");
    let agent: &str = &AGENT;
    let manifest = manifest.display().to_string();
    let own = ["--agent-bin", agent, "--manifest", &manifest];
    spawn_host(dir, name, &[&own[..], args].concat())
}

/// A host on a loopback port with its data in `dir/data-<name>` and `args`.
fn spawn_host(dir: &Path, name: &str, args: &[&str]) -> Host {
    spawn_host_env(dir, name, &[], args)
}

/// [`spawn_host`] with `env` added to its environment.
fn spawn_host_env(dir: &Path, name: &str, env: &[(&str, &str)], args: &[&str]) -> Host {
    use std::io::BufRead;
    let data = dir.join(format!("data-{name}"));
    let mut child = Command::new(&*HOST)
        .args(["--listen", "127.0.0.1:0"])
        .env("SANDBOX_HOST_API_KEY", KEY)
        .args(common::slots::sandbox_read_only(
            common::bench_data::prefix(),
        ))
        // Only the start-of-task cases use catalogs (a later --catalogs
        // wins); recording them takes both cores for a minute.
        .args(["--catalogs", "off"])
        .args(args)
        .arg("--data-dir")
        .arg(&data)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("sandbox-host");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("base URL");
    let base = line
        .trim()
        .trim_start_matches("sandbox-host: base URL ")
        .to_owned();
    Host { child, base, data }
}

async fn call(method: &str, url: &str, key: bool, body: Bytes, json: bool) -> (u16, Bytes) {
    let uri: http::Uri = url.parse().expect("url");
    let addr = format!(
        "{}:{}",
        uri.host().expect("host"),
        uri.port_u16().expect("port")
    );
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .header("host", uri.authority().expect("authority").as_str());
    if key {
        req = req.header("authorization", format!("Bearer {KEY}"));
    }
    req = req.header(
        "content-type",
        if json {
            "application/json"
        } else {
            "application/gzip"
        },
    );
    let resp = send
        .send_request(req.body(Full::new(body)).expect("request"))
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, bytes)
}

async fn api(method: &str, url: &str, body: &str) -> Value {
    let (status, b) = call(method, url, true, Bytes::from(body.to_owned()), true).await;
    assert!(
        status < 300,
        "{method} {url}: {status} {}",
        String::from_utf8_lossy(&b)
    );
    serde_json::from_slice(&b).expect("JSON")
}

fn archive() -> Bytes {
    let mut t = tar::Builder::new(Vec::new());
    for (name, data) in [
        ("hello.txt", "Hello from Klavis Local Sandbox!"),
        ("notes.md", "# Notes\n- item 1\n- item 2"),
        ("config.json", r#"{"app": "demo", "version": "1.0"}"#),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        t.append_data(&mut h, name, data.as_bytes()).expect("tar");
    }
    let tar = t.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar).expect("gzip");
    Bytes::from(gz.finish().expect("gzip"))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn acquire_rounds(h: &Host, settle: Duration) -> f64 {
    let mut t = Vec::new();
    for _ in 0..rounds() {
        tokio::time::sleep(settle).await;
        let start = Instant::now();
        let a = api("POST", &format!("{}/local-sandbox", h.base), NOTEBOOK).await;
        t.push(start.elapsed().as_secs_f64() * 1000.0);
        let id = a["local_sandbox_id"].as_str().expect("id");
        api("DELETE", &format!("{}/local-sandbox/{id}", h.base), "").await;
    }
    median(&mut t)
}

/// The notebook's steps, timed whole.
async fn cycle_rounds(h: &Host, settle: Duration) -> f64 {
    let mut cycle = Vec::new();
    let tgz = archive();
    for _ in 0..rounds() {
        tokio::time::sleep(settle).await;
        let start = Instant::now();
        let a = api("POST", &format!("{}/local-sandbox", h.base), NOTEBOOK).await;
        let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
        let u = api(
            "POST",
            &format!("{}/local-sandbox/{id}/upload-url", h.base),
            "",
        )
        .await;
        let (s, _) = call(
            "PUT",
            u["upload_url"].as_str().expect("url"),
            false,
            tgz.clone(),
            false,
        )
        .await;
        assert_eq!(s, 200);
        api(
            "POST",
            &format!("{}/local-sandbox/{id}/initialize", h.base),
            "",
        )
        .await;
        let d = api("GET", &format!("{}/local-sandbox/{id}/dump", h.base), "").await;
        let (s, body) = call(
            "GET",
            d["download_url"].as_str().expect("url"),
            false,
            Bytes::new(),
            false,
        )
        .await;
        assert!(s == 200 && !body.is_empty());
        api("DELETE", &format!("{}/local-sandbox/{id}", h.base), "").await;
        cycle.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    median(&mut cycle)
}

/// The reference: Acquire + Release of the same servers straight to an
/// agent over gRPC (no REST, no pool); the Acquire's median.
async fn direct_rounds(dir: &Path) -> f64 {
    let state = dir.join("direct-state");
    std::fs::create_dir_all(&state).expect("state");
    let manifest = dir.join("direct.toml");
    std::fs::write(&manifest, common::shipped_manifest(&state)).expect("manifest");
    let sock = dir.join("direct.sock");
    let mut agent = Command::new(&*AGENT)
        .arg("--listen")
        .arg(format!("unix://{}", sock.display()))
        .arg("--workspace")
        .arg(dir.join("direct-ws"))
        .arg("--manifest")
        .arg(&manifest)
        .env("SANDBOX_AGENT_CONFIG", "/dev/null")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("agent");
    let uri = format!("unix://{}", sock.display());
    let deadline = Instant::now() + Duration::from_secs(10);
    let client = loop {
        match sandbox_client::connect(&uri).await {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => panic!("agent never came up: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let mut t = Vec::new();
    for i in 0..rounds() {
        let start = Instant::now();
        client
            .agent()
            .acquire(sandbox_client::proto::AcquireRequest {
                lease_id: format!("direct-{i}"),
                server_names: SERVERS.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            })
            .await
            .expect("Acquire");
        t.push(start.elapsed().as_secs_f64() * 1000.0);
        client
            .agent()
            .release(sandbox_client::proto::ReleaseRequest::default())
            .await
            .expect("Release");
    }
    let _ = agent.kill();
    let _ = agent.wait();
    median(&mut t)
}

fn exec_archive(script: &str) -> Bytes {
    let mut t = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(script.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    t.append_data(&mut h, "main.py", script.as_bytes())
        .expect("tar");
    let tar = t.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar).expect("gzip");
    Bytes::from(gz.finish().expect("gzip"))
}

const TRIVIAL: &str = "print('hello')\n";

/// Executions on one lease, medians: (execute → completed, direct
/// `python3 main.py`, one log poll, one GET of the sandbox).
async fn exec_rounds(h: &Host, dir: &Path) -> (f64, f64, f64, f64) {
    let a = api(
        "POST",
        &format!("{}/local-sandbox", h.base),
        r#"{"server_names": ["filesystem"]}"#,
    )
    .await;
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    let b = format!("{}/local-sandbox/{id}", h.base);
    let tgz = exec_archive(TRIVIAL);
    let (mut run, mut poll, mut get) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds() {
        let body = format!(r#"{{"execution_name": "bench-{i}"}}"#);
        let u = api("POST", &format!("{b}/execution-upload-url"), &body).await;
        let (s, _) = call(
            "PUT",
            u["upload_url"].as_str().expect("url"),
            false,
            tgz.clone(),
            false,
        )
        .await;
        assert_eq!(s, 200);
        let start = Instant::now();
        api("POST", &format!("{b}/execute"), &body).await;
        loop {
            let l = api(
                "GET",
                &format!("{b}/execution-logs?execution_name=bench-{i}&cursor=0"),
                "",
            )
            .await;
            match l["status"].as_str() {
                Some("completed") => break,
                Some("failed") => panic!("the bench script failed: {l}"),
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        run.push(start.elapsed().as_secs_f64() * 1000.0);
        for _ in 0..5 {
            let t = Instant::now();
            api(
                "GET",
                &format!("{b}/execution-logs?execution_name=bench-{i}&cursor=0"),
                "",
            )
            .await;
            poll.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            api("GET", &b, "").await;
            get.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    api("DELETE", &b, "").await;
    let script = dir.join("direct-main.py");
    std::fs::write(&script, TRIVIAL).expect("script");
    // The interpreter itself, not a wrapper such as a pyenv shim: what the
    // execution's venv runs.
    let exe = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    let exe = String::from_utf8_lossy(&exe.stdout).trim().to_owned();
    let mut direct = Vec::new();
    for _ in 0..rounds() {
        let t = Instant::now();
        let out = Command::new(&exe).arg(&script).output().expect("python3");
        assert!(out.status.success());
        direct.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    (
        median(&mut run),
        median(&mut direct),
        median(&mut poll),
        median(&mut get),
    )
}

fn print_exec(exec_ms: f64, python_ms: f64, poll_ms: f64, get_ms: f64) {
    println!(
        "| executions (one lease, {} rounds) | median | vs reference |",
        rounds()
    );
    println!("|---|---|---|");
    println!(
        "| execute → `completed` of `print('hello')` (venv, run, log polled every 5 ms) | {exec_ms:.0} ms | {:.2}x `python3 main.py` run directly ({python_ms:.0} ms) |",
        exec_ms / python_ms
    );
    println!(
        "| one execution-logs poll | {poll_ms:.2} ms | {:.2}x one `GET /local-sandbox/{{id}}` ({get_ms:.2} ms) |",
        poll_ms / get_ms
    );
    println!();
}

/// The executions part alone (`cargo bench -p sandbox-suite -- exec`): a
/// host with a pool of bare agents, one lease, the rounds of `main`.
pub fn exec_main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let bare = start(dir.path(), "bare", 1, "");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (exec_ms, python_ms, poll_ms, get_ms) = exec_rounds(&bare, dir.path()).await;
        drop(bare);
        println!(
            "# executions through sandbox-host (process backend; {})",
            common::mode()
        );
        print_exec(exec_ms, python_ms, poll_ms, get_ms);
    });
}

pub fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        // Settle times let the pool refill between rounds (a warm lease is
        // an agent start plus the servers' start).
        let warm = start(dir.path(), "warm", pool(), "filesystem,git,terminal");
        tokio::time::sleep(Duration::from_secs(5)).await;
        let warm_ms = acquire_rounds(&warm, Duration::from_millis(2500)).await;
        let warm_cycle = cycle_rounds(&warm, Duration::from_millis(2500)).await;
        drop(warm);

        let bare = start(dir.path(), "bare", pool(), "");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let bare_ms = acquire_rounds(&bare, Duration::from_millis(1500)).await;
        let bare_cycle = cycle_rounds(&bare, Duration::from_millis(1500)).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (exec_ms, python_ms, poll_ms, get_ms) = exec_rounds(&bare, dir.path()).await;
        drop(bare);

        let cold = start(dir.path(), "cold", 0, "");
        let cold_ms = acquire_rounds(&cold, Duration::from_millis(300)).await;
        drop(cold);

        let direct_ms = direct_rounds(dir.path()).await;
        let subsets = warm::run(dir.path()).await;
        let profile_rows = profiles::run(dir.path()).await;
        let vms = vm::run(dir.path()).await;

        println!(
            "# sandbox-host benchmark (process backend, {} rounds, medians; servers filesystem+git+terminal; {})",
            rounds(),
            common::mode()
        );
        println!("| measure | median | vs direct agent Acquire |");
        println!("|---|---|---|");
        println!("| Acquire, pool of warm leases (servers already running) | {warm_ms:.1} ms | {:.2}x |", warm_ms / direct_ms);
        println!("| Acquire, pool of bare agents (the Acquire starts the servers) | {bare_ms:.0} ms | {:.2}x |", bare_ms / direct_ms);
        println!("| Acquire, cold (no pool: agent started by the Acquire) | {cold_ms:.0} ms | {:.2}x |", cold_ms / direct_ms);
        println!("| reference: Acquire straight to a running agent over gRPC | {direct_ms:.0} ms | 1.00x |");
        println!("| notebook cycle (acquire → upload → initialize → dump → download → release), warm leases | {warm_cycle:.0} ms | |");
        println!("| notebook cycle, bare agents | {bare_cycle:.0} ms | |");
        println!();
        print_exec(exec_ms, python_ms, poll_ms, get_ms);
        let r = &subsets;
        println!(
            "| Acquire of a random subset of the warm set ({}; {} subsets, the same for both) | p50 | p99 |",
            warm::WARM_SET.join(", "),
            r.rounds
        );
        println!("|---|---|---|");
        println!("| pool warm with the set (`--warm {}=3`): lease narrowed, {} of {} warm hits | {:.1} ms | {:.1} ms |", warm::WARM_SET.join(","), r.hits, r.rounds, r.warm.0, r.warm.1);
        println!("| pool of bare agents (the Acquire starts the subset) | {:.0} ms | {:.0} ms |", r.bare.0, r.bare.1);
        println!("| warm / bare | {:.3}x | {:.3}x |", r.warm.0 / r.bare.0, r.warm.1 / r.bare.1);
        println!("| memory (PSS) per idle sandbox: warm with the set / bare agent | {:.0} MiB | {:.1} MiB |", r.warm_mib, r.bare_mib);
        println!();
        println!(
            "| benchmark profile: Acquire of its usual servers (`benchmark` set; {} rounds) | cold (bare agent) | warm lease of the profile | warm / cold |",
            crate::common::pick(7, 1)
        );
        println!("|---|---|---|---|");
        for p in &profile_rows {
            println!(
                "| {} ({} servers: {}) | {:.0} ms | {:.1} ms | {:.3}x |",
                p.benchmark,
                p.servers,
                profiles::PROFILES
                    .iter()
                    .find(|(b, _)| *b == p.benchmark)
                    .map(|(_, s)| s.join(", "))
                    .unwrap_or_default(),
                p.cold_ms,
                p.warm_ms,
                p.warm_ms / p.cold_ms
            );
        }
        println!();
        match vms {
            Some(v) => {
                println!("| qemu backend (TCG here): Acquire of filesystem | median | vs the 5 s httpx timeout of Klavis's notebook |");
                println!("|---|---|---|");
                println!("| VM booted ahead with warm servers (`--warm filesystem,localmemory=1`), {} rounds | {:.1} ms | {:.3}x |", v.rounds, v.warm_ms, v.warm_ms / 5000.0);
                println!("| VM booted ahead, the Acquire starts the server, {} rounds | {:.0} ms | {:.2}x |", v.rounds, v.booted_ms, v.booted_ms / 5000.0);
                println!("| fresh VM (`--pool-size 0`: boot, agent, server), 3 rounds | {:.0} ms | {:.2}x |", v.fresh_ms, v.fresh_ms / 5000.0);
            }
            None => println!("(qemu backend: skipped in short mode, or QEMU / vhost-device-vsock missing)"),
        }
    });
}

/// The kubernetes backend's API requests on a real kube-apiserver
/// (`host/kube.rs`).
#[cfg(not(feature = "kubernetes"))]
pub fn kube_main() {
    let why = "kube-api: this bench binary was built without the `kubernetes` feature \
               (cargo bench -p sandbox-suite -p sandbox-host --features kubernetes)";
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    assert!(!ci, "CI=true: {why}");
    println!("SKIPPED {why}");
}

/// The kubernetes backend's API requests on a real kube-apiserver
/// (`host/kube.rs`).
#[cfg(feature = "kubernetes")]
pub fn kube_main() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Passable by the sandboxes' users (tempdir makes 0700).
    let _ = std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let f = rt.block_on(kube_api::run(dir.path()));
    kube_api::print(&f);
}

/// A recycled slot's next Acquire after a clean lease and after a tenant
/// that left deep or wide trees (`host/recycle.rs`).
pub fn recycle_main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(recycle::run_all(dir.path()));
    rt.block_on(recycle::trash_burst(dir.path()));
}

/// The benchmarks' pattern on `local_dev`, lazy beside eager
/// (`host/burst.rs`).
pub fn burst_main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let r = rt.block_on(burst::run(dir.path()));
    println!(
        "# local_dev (11 servers) through /sandbox/local_dev, lazy (`--server-start auto`) vs eager; {}",
        common::mode()
    );
    println!("| measure | lazy | eager | lazy / eager |");
    println!("|---|---|---|---|");
    let (l, e) = (&r.lazy, &r.eager);
    println!(
        "| cold Acquire from a bare pool, p50 ({} / {} rounds) | {:.1} ms | {:.0} ms | {:.4}x |",
        l.rounds,
        e.rounds,
        l.acquire_ms,
        e.acquire_ms,
        l.acquire_ms / e.acquire_ms
    );
    println!(
        "| burst: {} tasks at once (acquire + filesystem and terminal calls), done within {} s | {} of {} | {} of {} | |",
        l.tasks,
        burst::WITHIN_S,
        l.ok,
        l.tasks,
        e.ok,
        e.tasks
    );
    println!(
        "| burst: wall time | {:.1} s | {:.1} s | {:.2}x |",
        l.wall_s,
        e.wall_s,
        l.wall_s / e.wall_s
    );
    println!(
        "| burst: slowest Acquire / slowest task | {:.1} s / {:.1} s | {:.1} s / {:.1} s | |",
        l.slowest_acquire_s, l.slowest_task_s, e.slowest_acquire_s, e.slowest_task_s
    );
    println!(
        "| burst: peak memory (PSS) of every sandbox together | {:.0} MiB | {:.0} MiB | {:.2}x |",
        l.peak_mib,
        e.peak_mib,
        l.peak_mib / e.peak_mib
    );
    println!(
        "| one sandbox after its two calls (PSS, median) | {:.0} MiB | {:.0} MiB | {:.2}x |",
        l.per_sandbox_mib,
        e.per_sandbox_mib,
        l.per_sandbox_mib / e.per_sandbox_mib
    );
}
