//! `sandbox-host`, the reference host: the Klavis notebook's flow with
//! Python httpx, the official MCP client through mcp_server_url, owners,
//! validation, signed URLs, a restart, the TTL reaper and concurrent cycles,
//! against real agents running real MCP servers.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::mcp::shipped_manifest;
use serde_json::{Value, json};

const HOST: &str = env!("CARGO_BIN_EXE_sandbox-host");
const AGENT: &str = env!("CARGO_BIN_EXE_sandbox-agent");
const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/host_client.py");
const KEY_A: &str = "key-a-0123456789abcdef";
const KEY_B: &str = "key-b-0123456789abcdef";

struct Host {
    child: Option<Child>,
    base: String,
    data: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Host {
    fn start(dir: &Path, extra: &[&str]) -> Host {
        let manifest = dir.join("servers.toml");
        if !manifest.exists() {
            // The state root stays as shipped: the host gives each agent its own.
            std::fs::write(
                &manifest,
                shipped_manifest(Path::new("/var/lib/sandbox-agent")),
            )
            .expect("manifest");
        }
        let keys = dir.join("keys");
        std::fs::write(&keys, format!("{KEY_A} alice\n{KEY_B} bob\n")).expect("keys");
        let data = dir.join("data");
        let mut child = Command::new(HOST)
            .args(["--listen", "127.0.0.1:0", "--pool-size", "1"])
            .arg("--data-dir")
            .arg(&data)
            .arg("--api-key-file")
            .arg(&keys)
            .arg("--agent-bin")
            .arg(AGENT)
            .arg("--manifest")
            .arg(&manifest)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sandbox-host");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("base URL line");
        let base = line
            .trim()
            .strip_prefix("sandbox-host: base URL ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Host {
            child: Some(child),
            base,
            data,
            _dir: None,
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
    }

    /// Pids of the agents this host started (alive or not).
    fn agents(&self) -> Vec<i32> {
        let Ok(rd) = std::fs::read_dir(self.data.join("slots")) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("agent.pid")).ok())
            .filter_map(|p| p.trim().parse().ok())
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop();
        // Agents outlive the host on purpose (restarts); not the test.
        for pid in self.agents() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
}

fn py(host: &Host, key: &str, args: &[&str]) -> Value {
    let out = Command::new("python3")
        .arg(CLIENT)
        .arg(&host.base)
        .arg(key)
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "host_client.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client JSON")
}

/// One HTTP request with curl: (status, body).
fn http(method: &str, url: &str, key: Option<&str>, body: Option<&str>) -> (u16, Value) {
    let mut c = Command::new("curl");
    c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method, url]);
    if let Some(k) = key {
        c.args(["-H", &format!("authorization: Bearer {k}")]);
    }
    if let Some(b) = body {
        c.args(["-H", "content-type: application/json", "-d", b]);
    }
    let out = c.output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("status");
    (
        code.parse().expect("code"),
        serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())),
    )
}

#[test]
fn the_notebook_flow_runs_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let v = py(&host, KEY_A, &["notebook"]);
    assert_eq!(v["acquire_status"], 201, "{v}");
    let a = &v["acquire"];
    assert_eq!(a["status"], "occupied");
    let names: Vec<&str> = a["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|s| s["server_name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["filesystem", "git", "terminal"]);
    let id = a["local_sandbox_id"].as_str().expect("id");
    assert_eq!(
        a["servers"][0]["mcp_server_url"],
        format!("{}/filesystem/mcp/?local_sandbox_id={id}", host.base)
    );
    assert_eq!(v["upload_status"], 200);
    assert_eq!(v["upload_url"]["expires_in_minutes"], 30);
    assert_eq!(v["initialize"]["sandbox_id"], id);
    assert_eq!(v["initialize"]["status"], "occupied");
    assert_eq!(
        v["members"],
        json!([
            [".", 0],
            ["./config.json", 33],
            ["./hello.txt", 32],
            ["./notes.md", 25]
        ])
    );
    assert_eq!(
        v["release"]["message"],
        format!(
            "Local sandbox release started for {id}: it will be released asynchronously in background."
        )
    );
    let (code, _) = http(
        "GET",
        &format!("{}/local-sandbox/{id}", host.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 404, "released");
}

#[test]
fn the_official_mcp_client_works_through_mcp_server_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let v = py(&host, KEY_A, &["mcp"]);
    assert!(
        v["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|n| n == "read_text_file")),
        "{v}"
    );
    assert_eq!(v["text"], "through the host", "{v}");
}

#[test]
fn owners_validation_and_signed_urls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let b = &host.base;
    let (code, a) = http(
        "POST",
        &format!("{b}/local-sandbox"),
        Some(KEY_A),
        Some(r#"{"server_names": ["filesystem"]}"#),
    );
    assert_eq!(code, 201, "{a}");
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();

    // Another owner sees nothing and can touch nothing: 404, not 403.
    for (m, path) in [
        ("GET", format!("/local-sandbox/{id}")),
        ("DELETE", format!("/local-sandbox/{id}")),
        ("POST", format!("/local-sandbox/{id}/reset")),
        ("POST", format!("/local-sandbox/{id}/upload-url")),
        ("POST", format!("/local-sandbox/{id}/initialize")),
        ("GET", format!("/local-sandbox/{id}/dump")),
        ("POST", format!("/filesystem/mcp/?local_sandbox_id={id}")),
    ] {
        let (code, body) = http(m, &format!("{b}{path}"), Some(KEY_B), Some("{}"));
        assert_eq!(code, 404, "{m} {path}: {body}");
    }
    let (_, list) = http("GET", &format!("{b}/local-sandbox"), Some(KEY_B), None);
    assert_eq!(list["total_count"], 0, "{list}");
    let (_, list) = http("GET", &format!("{b}/local-sandbox"), Some(KEY_A), None);
    assert_eq!(list["total_count"], 1, "{list}");
    let (code, _) = http("GET", &format!("{b}/local-sandbox"), None, None);
    assert_eq!(code, 401);
    let (code, _) = http(
        "GET",
        &format!("{b}/local-sandbox"),
        Some("wrong-key-0123456789"),
        None,
    );
    assert_eq!(code, 401);

    // 422 in FastAPI's shape.
    for (body, loc) in [
        (
            r#"{"server_names": ["nope"]}"#,
            json!(["body", "server_names", 0]),
        ),
        (
            r#"{"server_names": "SOME"}"#,
            json!(["body", "server_names"]),
        ),
        (r#"{}"#, json!(["body", "server_names"])),
        (
            r#"{"server_names": ["git"], "ttl_seconds": 59}"#,
            json!(["body", "ttl_seconds"]),
        ),
        (
            r#"{"server_names": ["git"], "ttl_seconds": 86401}"#,
            json!(["body", "ttl_seconds"]),
        ),
        (
            r#"{"server_names": ["git"], "benchmark": "X"}"#,
            json!(["body", "benchmark"]),
        ),
    ] {
        let (code, v) = http(
            "POST",
            &format!("{b}/local-sandbox"),
            Some(KEY_A),
            Some(body),
        );
        assert_eq!(code, 422, "{body}: {v}");
        assert_eq!(v["detail"][0]["loc"], loc, "{body}: {v}");
        assert!(v["detail"][0]["msg"].is_string() && v["detail"][0]["type"].is_string());
    }

    // Signed URLs: tampered, unsigned and expired ones are refused.
    let (_, u) = http(
        "POST",
        &format!("{b}/local-sandbox/{id}/upload-url"),
        Some(KEY_A),
        None,
    );
    let url = u["upload_url"].as_str().expect("upload_url").to_owned();
    let put = |url: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
            .args([
                "-H",
                "content-type: application/gzip",
                "--data-binary",
                "x",
                url,
            ])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let last = url.chars().last().expect("url");
    let flipped = if last == '0' { '1' } else { '0' };
    let tampered = format!("{}{flipped}", &url[..url.len() - 1]);
    assert_eq!(put(&tampered), "403");
    assert_eq!(put(url.split('?').next().expect("path")), "403");
    let other = url.replace(&id, "00000000-0000-0000-0000-000000000000");
    assert_eq!(put(&other), "403", "a URL is bound to its sandbox");
    let expired = {
        use hmac::{KeyInit, Mac};
        let key = std::fs::read(host.data.join("signing.key")).expect("key");
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("hmac");
        m.update(format!("upload\n{id}\n1000").as_bytes());
        let sig: String = m
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{b}/transfer/upload/{id}?expires=1000&signature={sig}")
    };
    assert_eq!(put(&expired), "403");
    // Initialize without an upload says what to do.
    let (code, v) = http(
        "POST",
        &format!("{b}/local-sandbox/{id}/initialize"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 400, "{v}");
    // A garbage upload is refused by the agent; nothing changes.
    assert_eq!(put(&url), "200");
    let (code, v) = http(
        "POST",
        &format!("{b}/local-sandbox/{id}/initialize"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 400, "not an archive: {v}");
    let (code, _) = http("GET", &format!("{b}/openapi.json"), None, None);
    assert_eq!(code, 200);
}

#[test]
fn a_restart_keeps_the_leases_and_the_reaper_releases_on_ttl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut host = Host::start(dir.path(), &["--time-scale", "0.05"]);
    let b = host.base.clone();
    let (code, a) = http(
        "POST",
        &format!("{b}/local-sandbox"),
        Some(KEY_A),
        Some(r#"{"server_names": ["localmemory"], "ttl_seconds": null}"#),
    );
    assert_eq!(code, 201, "{a}");
    let keep = a["local_sandbox_id"].as_str().expect("id").to_owned();
    host.stop();
    let host2 = Host::start(dir.path(), &["--time-scale", "0.05"]);
    let b = host2.base.clone();
    let (code, v) = http(
        "GET",
        &format!("{b}/local-sandbox/{keep}"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "occupied", "{v}");
    // Its agent (and memory server) survived the restart: MCP still works.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}"#;
    let (code, v) = http(
        "POST",
        &format!("{b}/localmemory/mcp/?local_sandbox_id={keep}"),
        Some(KEY_A),
        Some(init),
    );
    assert_eq!(code, 200, "{v}");
    assert!(v["result"]["serverInfo"].is_object(), "{v}");

    // 60 s at a 0.05 time scale: released by the reaper within seconds.
    let (code, a) = http(
        "POST",
        &format!("{b}/local-sandbox"),
        Some(KEY_A),
        Some(r#"{"server_names": ["filesystem"], "ttl_seconds": 60}"#),
    );
    assert_eq!(code, 201, "{a}");
    let ttl = a["local_sandbox_id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, _) = http(
            "GET",
            &format!("{b}/local-sandbox/{ttl}"),
            Some(KEY_A),
            None,
        );
        if code == 404 {
            break;
        }
        assert!(Instant::now() < deadline, "not released by the reaper");
        std::thread::sleep(Duration::from_millis(250));
    }
    let (_, v) = http(
        "GET",
        &format!("{b}/local-sandbox/{keep}"),
        Some(KEY_A),
        None,
    );
    assert_eq!(v["status"], "occupied", "no TTL, still there: {v}");
}

#[test]
fn concurrent_cycles_leave_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let v = py(&host, KEY_A, &["cycles", "20"]);
    assert_eq!(v["ok"], 20, "{v}");
    // Releases finish in the background; then only the pool is left.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let live: Vec<i32> = host.agents().into_iter().filter(|p| alive(*p)).collect();
        let uploads = std::fs::read_dir(host.data.join("uploads"))
            .map(|d| d.count())
            .unwrap_or(0);
        if live.len() <= 1 && uploads == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: {} agents, {uploads} uploads",
            live.len()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // The idle agent's workspace is empty and it runs no server.
    for e in std::fs::read_dir(host.data.join("slots"))
        .expect("slots")
        .flatten()
    {
        let ws = e.path().join("ws");
        let n = std::fs::read_dir(&ws).map(|d| d.count()).unwrap_or(0);
        assert!(n <= 1, "{} holds {n} entries", ws.display());
    }
    let (_, list) = http(
        "GET",
        &format!("{}/local-sandbox", host.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(list["total_count"], 0, "{list}");
}
