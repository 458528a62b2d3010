//! Lifecycle benchmark of the real `sandbox-agent` binary with the real
//! filesystem, git and memory servers (from packaging/install-servers.sh).
//!
//! Prints (never asserts) medians over 15 cycles (4 with BENCH=short) of:
//! - Acquire of filesystem + git + localmemory until all are ready;
//! - Release until the sandbox is idle again (servers stopped, workspace
//!   and state cleared).
//!
//! The reference from the same run: the same three servers started directly
//! by this process and taken through the MCP initialize handshake over
//! stdio, in parallel (what Acquire cannot beat), then killed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_client::proto;

use crate::common;
use common::AGENT;

fn runs() -> usize {
    common::pick(15, 4)
}
const SERVERS: [&str; 3] = ["filesystem", "git", "localmemory"];

pub fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state");
    let manifest = common::shipped_manifest(&state);
    let mpath = dir.path().join("servers.toml");
    std::fs::write(&mpath, &manifest).expect("write manifest");
    let ws = dir.path().join("ws");
    let sock = dir.path().join("agent.sock");
    let mut agent = Command::new(&*AGENT)
        .arg("--mcp-listen")
        .arg(format!("unix://{}.mcp", sock.display()))
        .arg("--listen")
        .arg(format!("unix://{}", sock.display()))
        .arg("--workspace")
        .arg(&ws)
        .arg("--manifest")
        .arg(&mpath)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn agent");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let uri = format!("unix://{}", sock.display());
    let client = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match sandbox_client::connect(&uri).await {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => panic!("agent never came up: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    });

    // The direct launch commands, from the same manifest.
    let m = sandbox_agent::supervisor::manifest::Manifest::parse(
        &manifest,
        &mpath,
        &sandbox_agent::supervisor::manifest::Roots {
            workspace: &ws,
            state_root: &ws.with_file_name("state"),
            data: None,
        },
    )
    .expect("manifest");
    let none = |k: &str| std::env::var(k).ok();
    let specs: Vec<_> = SERVERS
        .iter()
        .map(|n| {
            m.get(n)
                .expect("server")
                .launch(None, &Default::default(), &none)
                .expect("spec")
        })
        .collect();

    let (mut acquire, mut release, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs() {
        let t = Instant::now();
        rt.block_on(client.agent().acquire(proto::AcquireRequest {
            lease_id: format!("bench-{i}"),
            server_names: SERVERS.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }))
        .expect("Acquire");
        acquire.push(ms(t.elapsed()));
        let t = Instant::now();
        rt.block_on(client.agent().release(proto::ReleaseRequest::default()))
            .expect("Release");
        release.push(ms(t.elapsed()));

        std::fs::create_dir_all(&ws).expect("ws");
        std::fs::create_dir_all(state.join("memory")).expect("state");
        let t = Instant::now();
        let handles: Vec<_> = specs
            .iter()
            .cloned()
            .map(|s| std::thread::spawn(move || direct_handshake(&s)))
            .collect();
        let mut children: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect();
        direct.push(ms(t.elapsed()));
        for c in &mut children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    let _ = agent.kill();
    let _ = agent.wait();

    let (a, r, d) = (
        median(&mut acquire),
        median(&mut release),
        median(&mut direct),
    );
    println!(
        "# sandbox-agent lifecycle benchmark ({} cycles, {}; servers: {})",
        runs(),
        common::mode(),
        SERVERS.join(" + ")
    );
    println!(
        "acquire → all ready   median {a:8.1} ms   (direct spawn + MCP handshake: {d:.1} ms, ratio {:.2}x)",
        a / d
    );
    println!("release → idle        median {r:8.1} ms");
}

/// Starts a server and completes `initialize` over its stdio.
fn direct_handshake(spec: &sandbox_agent::supervisor::manifest::LaunchSpec) -> std::process::Child {
    let mut child = Command::new(&spec.command)
        .args(&spec.args)
        .env_clear()
        .envs(&spec.env)
        .current_dir(&spec.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn server");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"bench","version":"1"}}}}}}"#
    )
    .expect("write");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).expect("read") > 0,
            "{} exited",
            spec.name
        );
        if line.contains("\"id\":1") {
            break;
        }
    }
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .expect("write");
    std::mem::forget(stdin);
    child
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
