//! Control-plane benchmark of the real `sandbox-agent` binary.
//!
//! Prints (never asserts) medians, each next to a reference measured in the
//! same run:
//! - exec → first SERVING health answer, against spawning `/bin/true`;
//! - idle RSS after start, and RSS after the load below;
//! - stripped binary size (static when benched with
//!   `--target x86_64-unknown-linux-musl`, as the test command does);
//! - `grpc.health.v1.Health/Check` latency p50/p99 over a unix socket,
//!   against a raw 1-byte unix-socket ping-pong (the transport's floor);
//! - health requests/s with 32 concurrent callers on one connection.
//!
//! Targets from the foundation issue: start ≤ 20 ms, idle RSS ≤ 8 MiB,
//! binary ≤ 15 MiB, health p99 ≤ 1 ms.

use crate::common;
use common::AGENT;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_client::proto::health::HealthCheckRequest;
use sandbox_client::proto::health::health_check_response::ServingStatus;

fn start_runs() -> usize {
    common::pick(30, 8)
}
fn latency_calls() -> usize {
    common::pick(20_000, 2_000)
}
fn throughput_secs() -> u64 {
    common::pick(3, 1)
}
const CONCURRENCY: usize = 32;

pub fn main() {
    // `cargo bench` passes --bench; ignore all arguments.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");

    println!("# sandbox-agent control-plane benchmark");
    println!("binary: {}", &*AGENT);
    let size = std::fs::metadata(&*AGENT).expect("binary").len();
    println!("static: {}", is_static(Path::new(&*AGENT)));
    println!();

    // 1. exec → SERVING, against the cost of exec itself.
    let mut start_ms = Vec::new();
    let mut true_ms = Vec::new();
    for i in 0..start_runs() {
        let t = Instant::now();
        let status = Command::new("/bin/true").status().expect("/bin/true");
        assert!(status.success());
        true_ms.push(ms(t.elapsed()));

        let sock = dir.path().join(format!("s{i}.sock"));
        let (child, took) = rt.block_on(start_agent(dir.path(), &sock));
        start_ms.push(ms(took));
        drop(child);
    }

    // 2–4 on one long-lived agent.
    let sock = dir.path().join("bench.sock");
    let (child, _) = rt.block_on(start_agent(dir.path(), &sock));
    std::thread::sleep(Duration::from_secs(1));
    let idle_rss = rss_kib(child.id());

    let floor_us = unix_pingpong_us(dir.path(), latency_calls());
    let (lat_us, rps) = rt.block_on(health_load(&sock));
    let loaded_rss = rss_kib(child.id());
    drop(child);

    let start_med = median(&mut start_ms);
    let true_med = median(&mut true_ms);
    let mut lat = lat_us;
    let p50 = percentile(&mut lat, 50.0);
    let p99 = percentile(&mut lat, 99.0);
    let mut floor = floor_us;
    let f50 = percentile(&mut floor, 50.0);
    let f99 = percentile(&mut floor, 99.0);

    println!("| measure | sandbox-agent | reference | ratio | target |");
    println!("|---|---|---|---|---|");
    let (start_runs, latency_calls, throughput_secs) =
        (start_runs(), latency_calls(), throughput_secs());
    println!("({})", common::mode());
    println!(
        "| exec → SERVING (median of {start_runs}) | {start_med:.2} ms | spawn+wait /bin/true {true_med:.2} ms | {:.1}× | ≤ 20 ms |",
        start_med / true_med
    );
    println!(
        "| idle RSS (1 s after SERVING) | {:.2} MiB | | | ≤ 8 MiB |",
        idle_rss as f64 / 1024.0
    );
    println!(
        "| RSS after the health load | {:.2} MiB | | | |",
        loaded_rss as f64 / 1024.0
    );
    println!(
        "| stripped binary size | {:.2} MiB | | | ≤ 15 MiB |",
        size as f64 / (1024.0 * 1024.0)
    );
    println!(
        "| health p50 over unix ({latency_calls} sequential calls) | {p50:.0} µs | raw unix ping-pong {f50:.0} µs | {:.1}× | |",
        p50 / f50
    );
    println!(
        "| health p99 over unix | {p99:.0} µs | raw unix ping-pong {f99:.0} µs | {:.1}× | ≤ 1 ms |",
        p99 / f99
    );
    println!(
        "| health throughput ({CONCURRENCY} callers, 1 connection, {throughput_secs} s) | {rps:.0} req/s | | | |"
    );
}

/// A running agent, killed and reaped when dropped (also on panic).
struct Running(Child);

impl Running {
    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns the agent and returns when a health check answers SERVING.
async fn start_agent(dir: &Path, sock: &Path) -> (Running, Duration) {
    let t = Instant::now();
    let child = Running(
        Command::new(&*AGENT)
            .arg("--mcp-listen")
            .arg(format!("unix://{}.mcp", sock.display()))
            .arg("--listen")
            .arg(format!("unix://{}", sock.display()))
            .arg("--workspace")
            .arg(dir.join("ws"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn agent"),
    );
    let uri = format!("unix://{}", sock.display());
    loop {
        if sock.exists()
            && let Ok(c) = sandbox_client::connect(&uri).await
            && let Ok(r) = c.health().check(HealthCheckRequest::default()).await
            && r.into_inner().status == ServingStatus::Serving as i32
        {
            return (child, t.elapsed());
        }
        assert!(t.elapsed() < Duration::from_secs(10), "agent did not start");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// Sequential latencies (µs) and concurrent throughput (req/s).
async fn health_load(sock: &Path) -> (Vec<f64>, f64) {
    let client = sandbox_client::connect(&format!("unix://{}", sock.display()))
        .await
        .expect("connect");
    let mut health = client.health();
    for _ in 0..1000 {
        health
            .check(HealthCheckRequest::default())
            .await
            .expect("warm-up");
    }
    let mut lat = Vec::with_capacity(latency_calls());
    for _ in 0..latency_calls() {
        let t = Instant::now();
        health
            .check(HealthCheckRequest::default())
            .await
            .expect("check");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }

    let deadline = Instant::now() + Duration::from_secs(throughput_secs());
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let mut h = client.health();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                h.check(HealthCheckRequest::default()).await.expect("check");
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("task");
    }
    (lat, total as f64 / t.elapsed().as_secs_f64())
}

/// Round trips (µs) of one byte over a unix socket between two threads.
fn unix_pingpong_us(dir: &Path, n: usize) -> Vec<f64> {
    let path = dir.join("pingpong.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    let mut c = std::os::unix::net::UnixStream::connect(&path).expect("connect");
    let mut b = [7u8; 1];
    let mut out = Vec::with_capacity(n);
    for _ in 0..1000 + n {
        let t = Instant::now();
        c.write_all(&b).expect("write");
        c.read_exact(&mut b).expect("read");
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(c);
    let _ = server.join();
    out.split_off(1000)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// An ELF without a PT_INTERP program header needs no dynamic loader.
fn is_static(path: &Path) -> bool {
    Command::new("readelf")
        .arg("-lW")
        .arg(path)
        .output()
        .map(|o| o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("INTERP"))
        .unwrap_or(false)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(v: &mut [f64]) -> f64 {
    percentile(v, 50.0)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let idx = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[idx]
}
