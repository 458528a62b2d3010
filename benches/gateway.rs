//! MCP gateway benchmark: tools/call through the agent's data plane
//! (streamable HTTP over a unix socket) against calling the same server
//! directly over its stdio, in the same run.
//!
//! Both sides use this crate's minimal JSON-RPC clients (`McpHttpClient`
//! over HTTP, `StdioConn` over the child's pipes), so the difference is the
//! gateway hop. The server is the real filesystem server reading a small
//! file (`read_text_file`). Prints medians and p99 of sequential calls, and
//! calls/s with 1, 10 and 50 concurrent sessions (each its own connection).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sandbox_agent::supervisor::logbuf::LogBuf;
use sandbox_agent::supervisor::mcp::StdioConn;
use sandbox_client::mcp_client::McpHttpClient;
use sandbox_client::proto;
use serde_json::json;

use crate::common;
use common::AGENT;

fn calls() -> usize {
    common::pick(2000, 300)
}
fn throughput_secs() -> u64 {
    common::pick(3, 1)
}

pub fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("ws");
    let text = common::shipped_manifest(&dir.path().join("state"));
    let mpath = dir.path().join("servers.toml");
    std::fs::write(&mpath, &text).expect("manifest");
    let sock = dir.path().join("agent.sock");
    let mcp_sock = dir.path().join("mcp.sock");
    let mut agent = std::process::Command::new(&*AGENT)
        .arg("--listen")
        .arg(format!("unix://{}", sock.display()))
        .arg("--mcp-listen")
        .arg(format!("unix://{}", mcp_sock.display()))
        .arg("--workspace")
        .arg(&ws)
        .arg("--manifest")
        .arg(&mpath)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("agent");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let uri = format!("unix://{}", sock.display());
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = loop {
            match sandbox_client::connect(&uri).await {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => panic!("agent: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        client
            .agent()
            .acquire(proto::AcquireRequest {
                lease_id: "bench".into(),
                server_names: vec!["filesystem".into()],
                ..Default::default()
            })
            .await
            .expect("Acquire");
        std::fs::write(ws.join("small.txt"), "hello from the workspace\n").expect("file");
        let params = json!({"name": "read_text_file", "arguments": {"path": "small.txt"}});

        // Direct: the same server, spawned here, over its stdio.
        let m = sandbox_agent::supervisor::manifest::Manifest::parse(&text, &mpath, &sandbox_agent::supervisor::manifest::Roots { workspace: &ws, state_root: &ws.with_file_name("state"), data: None }).expect("manifest");
        let spec = m
            .get("filesystem")
            .expect("filesystem")
            .launch(None, &Default::default(), &|k| std::env::var(k).ok())
            .expect("spec");
        let mut child = std::process::Command::new(&spec.command)
            .args(&spec.args)
            .env_clear()
            .envs(&spec.env)
            .current_dir(&spec.cwd)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("server");
        let stdin: std::os::fd::OwnedFd = child.stdin.take().expect("stdin").into();
        let stdout: std::os::fd::OwnedFd = child.stdout.take().expect("stdout").into();
        let direct = StdioConn::start(stdin, stdout, Arc::new(LogBuf::new(1 << 16, 4096)), 16 << 20).expect("conn");
        direct.handshake(Duration::from_secs(30)).await.expect("handshake");

        let ep: sandbox_client::Endpoint = format!("unix://{}", mcp_sock.display()).parse().expect("uri");
        let mut gw = McpHttpClient::connect(&ep, "filesystem", None, Duration::from_secs(5)).await.expect("gateway");

        // Warm up both paths.
        for _ in 0..200 {
            direct.call("tools/call", params.clone(), Duration::from_secs(10)).await.expect("direct");
            gw.call("tools/call", params.clone()).await.expect("gateway");
        }
        let (mut d, mut g) = (Vec::new(), Vec::new());
        for _ in 0..calls() {
            let t = Instant::now();
            direct.call("tools/call", params.clone(), Duration::from_secs(10)).await.expect("direct");
            d.push(us(t.elapsed()));
            let t = Instant::now();
            gw.call("tools/call", params.clone()).await.expect("gateway");
            g.push(us(t.elapsed()));
        }
        // The HTTP hop alone: a request the gateway answers itself.
        let mut h = Vec::new();
        for _ in 0..calls() {
            let t = Instant::now();
            gw.call("server/discover", json!({})).await.expect("discover");
            h.push(us(t.elapsed()));
        }
        let h50 = pct(&mut h, 0.5);
        let (d50, d99, g50, g99) = (pct(&mut d, 0.5), pct(&mut d, 0.99), pct(&mut g, 0.5), pct(&mut g, 0.99));
        println!(
            "# MCP gateway benchmark (filesystem read_text_file, {} sequential calls; medians; {})",
            calls(),
            common::mode()
        );
        println!("| measure | through the gateway | direct stdio | added | ratio |");
        println!("|---|---|---|---|---|");
        println!("| tools/call p50 | {g50:.0} µs | {d50:.0} µs | {:.0} µs | {:.2}× |", g50 - d50, g50 / d50);
        println!("| tools/call p99 | {g99:.0} µs | {d99:.0} µs | {:.0} µs | {:.2}× |", g99 - d99, g99 / d99);
        println!("| HTTP hop alone p50 (server/discover, answered by the gateway) | {h50:.0} µs | | | |");

        println!();
        println!("| concurrent sessions | gateway calls/s | direct stdio calls/s (same concurrency on one pipe) |");
        println!("|---|---|---|");
        for sessions in [1usize, 10, 50] {
            let count = Arc::new(AtomicU64::new(0));
            let stop = Instant::now() + Duration::from_secs(throughput_secs());
            let mut tasks = Vec::new();
            for _ in 0..sessions {
                let mut c = McpHttpClient::connect(&ep, "filesystem", None, Duration::from_secs(5)).await.expect("session");
                let (count, params) = (count.clone(), params.clone());
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < stop {
                        c.call("tools/call", params.clone()).await.expect("call");
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
            let gw_rate = count.load(Ordering::Relaxed) as f64 / throughput_secs() as f64;
            let count = Arc::new(AtomicU64::new(0));
            let stop = Instant::now() + Duration::from_secs(throughput_secs());
            let mut tasks = Vec::new();
            for _ in 0..sessions {
                let (count, params, conn) = (count.clone(), params.clone(), direct.clone());
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < stop {
                        conn.call("tools/call", params.clone(), Duration::from_secs(10)).await.expect("call");
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
            let d_rate = count.load(Ordering::Relaxed) as f64 / throughput_secs() as f64;
            println!("| {sessions} | {gw_rate:.0} | {d_rate:.0} |");
        }
        let _ = child.kill();
        let _ = child.wait();
    });
    let _ = agent.kill();
    let _ = agent.wait();
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}
