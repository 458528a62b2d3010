//! sandbox-host benchmark: Acquire latency with a warm pool and with a
//! cold one (an agent started per Acquire), and the Klavis notebook's whole
//! cycle (acquire filesystem+git+terminal, upload-url, PUT a 3-file tar.gz,
//! initialize, dump, download, release), over HTTP on loopback against
//! the real host, agents and MCP servers. Prints medians.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

mod common;

const HOST: &str = env!("CARGO_BIN_EXE_sandbox-host");
const AGENT: &str = env!("CARGO_BIN_EXE_sandbox-agent");
const KEY: &str = "bench-key-0123456789";
const ROUNDS: usize = 15;

struct Host {
    child: Child,
    base: String,
    data: std::path::PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(rd) = std::fs::read_dir(self.data.join("slots")) {
            for e in rd.flatten() {
                if let Some(pid) = std::fs::read_to_string(e.path().join("agent.pid"))
                    .ok()
                    .and_then(|p| p.trim().parse::<i32>().ok())
                {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
}

fn start(dir: &Path, pool: usize) -> Host {
    use std::io::BufRead;
    let manifest = dir.join("servers.toml");
    std::fs::write(
        &manifest,
        common::shipped_manifest(Path::new("/var/lib/sandbox-agent")),
    )
    .expect("manifest");
    let data = dir.join(format!("data-{pool}"));
    let mut child = Command::new(HOST)
        .args(["--listen", "127.0.0.1:0", "--api-key", KEY])
        .args(["--pool-size", &pool.to_string()])
        .arg("--data-dir")
        .arg(&data)
        .arg("--agent-bin")
        .arg(AGENT)
        .arg("--manifest")
        .arg(&manifest)
        .env("RUST_LOG", "warn")
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
    for _ in 0..ROUNDS {
        tokio::time::sleep(settle).await;
        let start = Instant::now();
        let a = api(
            "POST",
            &format!("{}/local-sandbox", h.base),
            r#"{"server_names": ["filesystem"]}"#,
        )
        .await;
        t.push(start.elapsed().as_secs_f64() * 1000.0);
        let id = a["local_sandbox_id"].as_str().expect("id");
        api("DELETE", &format!("{}/local-sandbox/{id}", h.base), "").await;
    }
    median(&mut t)
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let warm = start(dir.path(), 3);
        // Let the pool fill, and refill between rounds.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let warm_ms = acquire_rounds(&warm, Duration::from_millis(1500)).await;

        let mut cycle = Vec::new();
        let tgz = archive();
        for _ in 0..ROUNDS {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let start = Instant::now();
            let a = api(
                "POST",
                &format!("{}/local-sandbox", warm.base),
                r#"{"server_names": ["filesystem", "git", "terminal"]}"#,
            )
            .await;
            let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
            let u = api("POST", &format!("{}/local-sandbox/{id}/upload-url", warm.base), "").await;
            let (s, _) = call("PUT", u["upload_url"].as_str().expect("url"), false, tgz.clone(), false).await;
            assert_eq!(s, 200);
            api("POST", &format!("{}/local-sandbox/{id}/initialize", warm.base), "").await;
            let d = api("GET", &format!("{}/local-sandbox/{id}/dump", warm.base), "").await;
            let (s, body) = call("GET", d["download_url"].as_str().expect("url"), false, Bytes::new(), false).await;
            assert!(s == 200 && !body.is_empty());
            api("DELETE", &format!("{}/local-sandbox/{id}", warm.base), "").await;
            cycle.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        let cycle_ms = median(&mut cycle);
        drop(warm);

        let cold = start(dir.path(), 0);
        let cold_ms = acquire_rounds(&cold, Duration::from_millis(300)).await;
        drop(cold);

        println!("# sandbox-host benchmark (process backend, {ROUNDS} rounds, medians)");
        println!("| measure | median |");
        println!("|---|---|");
        println!("| Acquire filesystem, warm pool (agent already running) | {warm_ms:.0} ms |");
        println!("| Acquire filesystem, cold (agent started by the Acquire) | {cold_ms:.0} ms |");
        println!("| notebook cycle: acquire filesystem+git+terminal → upload → initialize → dump → download → release | {cycle_ms:.0} ms |");
    });
}
