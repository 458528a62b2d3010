//! Issue 35: a request is bound to the lease that admitted it. Tenant A
//! starts a request and holds back the rest of its body, releases its
//! sandbox, and tenant B leases the same slot, recycled (a host of one
//! sandbox; the test checks B's slot is A's by its uid block). When A's
//! body finally arrives, nothing of it may reach B's servers or workspace.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::host::{Host, KEY_A, KEY_B, acquire, http, release, run_script, wait_metric};

/// An HTTP/1.1 request sent in two parts: the head and `first` bytes of
/// the body now, the rest when [`Stalled::finish`] is called.
struct Stalled {
    sock: TcpStream,
    rest: Vec<u8>,
}

impl Stalled {
    fn start(
        base: &str,
        method: &str,
        target: &str,
        headers: &[String],
        body: &[u8],
        first: usize,
    ) -> Stalled {
        let addr = base.trim_start_matches("http://");
        let mut sock = TcpStream::connect(addr).expect("connect to the host");
        sock.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut head = format!(
            "{method} {target} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        for h in headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        // One write: the host may answer and close once it has the head.
        let mut start = head.into_bytes();
        start.extend_from_slice(&body[..first]);
        sock.write_all(&start).expect("the head and first bytes");
        Stalled {
            sock,
            rest: body[first..].to_vec(),
        }
    }

    /// An MCP POST of `body` to `target` (an MCP URL's path and query),
    /// held back after `first` bytes.
    fn mcp(base: &str, target: &str, body: &[u8], first: usize) -> Stalled {
        let headers = [
            "content-type: application/json".to_owned(),
            "accept: application/json, text/event-stream".to_owned(),
        ];
        Stalled::start(base, "POST", target, &headers, body, first)
    }

    /// Sends the rest of the body; (status, body text), status 0 when the
    /// host answered nothing (closed the connection, crashed, or nothing
    /// came within the read timeout: the text then says which).
    fn finish(mut self) -> (u16, String) {
        // The host may have answered (and closed) already.
        let _ = self.sock.write_all(&self.rest);
        let mut out = Vec::new();
        let read = self.sock.read_to_end(&mut out);
        let mut text = String::from_utf8_lossy(&out).into_owned();
        if out.is_empty() {
            text = format!("no answer ({read:?})");
        }
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (code, text)
    }
}

/// The path and query of an `mcp_server_url`.
fn target_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.find('/').map_or("/".into(), |i| rest[i..].to_owned())
}

/// The `mcp_server_url` of `server` in an Acquire answer.
fn mcp_url(acquired: &Value, server: &str) -> String {
    acquired["servers"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["server_name"] == server))
        .and_then(|s| s["mcp_server_url"].as_str())
        .unwrap_or_else(|| panic!("no {server} in {acquired}"))
        .to_owned()
}

/// A `tools/call` of `tool` with `args`, as JSON-RPC.
fn tool_call(tool: &str, args: Value) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
           "params": {"name": tool, "arguments": args}})
    .to_string()
    .into_bytes()
}

/// A `tools/call` of the terminal's `run_command`, as JSON-RPC.
fn run_command(command: &str) -> Vec<u8> {
    tool_call("run_command", json!({"command": command}))
}

/// Calls `tool` of `server` of an acquired sandbox; the text it answers
/// (`no text in …` when it answers none).
fn call(acquired: &Value, server: &str, tool: &str, args: Value) -> String {
    let url = mcp_url(acquired, server);
    let out = std::process::Command::new("curl")
        .args(["-s", "-X", "POST", &url])
        .args(["-H", "content-type: application/json"])
        .args(["-H", "accept: application/json, text/event-stream"])
        .arg("--data-binary")
        .arg(String::from_utf8(tool_call(tool, args)).expect("utf-8"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // JSON, or SSE whose data line carries the answer.
    let json = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or(&text);
    let v: Value = serde_json::from_str(json.trim()).unwrap_or(Value::String(text.clone()));
    v["result"]["content"][0]["text"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("no text in {v}"))
}

/// Calls the terminal of an acquired sandbox with `command`; its text.
fn terminal(acquired: &Value, command: &str) -> String {
    call(
        acquired,
        "terminal",
        "run_command",
        json!({"command": command}),
    )
}

/// The slot serving a sandbox: the host uid its tenant maps to (one uid
/// block per slot) and when its PID 1 started, as a script there sees them.
fn slot_identity(host: &Host, key: &str, acquired: &Value) -> String {
    let id = acquired["local_sandbox_id"].as_str().expect("id");
    let (status, log) = run_script(
        host,
        key,
        id,
        "whoami",
        "print('slot', open('/proc/self/uid_map').read().split()[1], \
         open('/proc/1/stat').read().rsplit(') ', 1)[1].split()[19])",
    );
    assert_eq!(status, "completed", "{log}");
    let line = log
        .lines()
        .find(|l| l.starts_with("slot "))
        .unwrap_or_default();
    assert!(line.split(' ').count() == 3, "no identity in {log}");
    line.to_owned()
}

/// The pool's idle sandboxes without servers.
const IDLE: &str = r#"sandbox_host_pool_sandboxes{state="bare",profile=""}"#;

/// A host of one sandbox at most (`--max-slots 1`): a released sandbox is
/// recycled for the next Acquire.
fn recycling_host(dir: &Path) -> Host {
    let host = Host::start(dir, &["--max-slots", "1"]);
    wait_metric(&host, IDLE, 1.0, Duration::from_secs(60));
    host
}

/// A multipart body of one `files` part.
fn multipart(name: &str, content: &[u8]) -> (String, Vec<u8>) {
    let boundary = "lease-bound-boundary-7d1f";
    let mut b = format!(
        "--{boundary}\r\ncontent-disposition: form-data; name=\"files\"; filename=\"{name}\"\r\ncontent-type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    b.extend_from_slice(content);
    b.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (
        format!("content-type: multipart/form-data; boundary={boundary}"),
        b,
    )
}

/// B's sandbox takes A's recycled slot and gets B's secret file.
fn lease_b_after(host: &Host, a: &Value, a_slot: &str) -> Value {
    let a_id = a["local_sandbox_id"].as_str().expect("id");
    release(host, KEY_A, a_id);
    // The release ends in the background: A's slot is back when one
    // is idle (the refill's new one sleeps).
    wait_metric(host, IDLE, 1.0, Duration::from_secs(60));
    let b = acquire(host, KEY_B, r#"{"server_names": ["terminal"]}"#);
    assert_eq!(
        slot_identity(host, KEY_B, &b),
        a_slot,
        "B must lease A's recycled slot"
    );
    let b_id = b["local_sandbox_id"].as_str().expect("id");
    let (ct, body) = multipart("b-secret.txt", b"the secret of tenant B");
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .arg(format!("{}/local-sandbox/{b_id}/initialize", host.base))
        .args(["-H", &format!("authorization: Bearer {KEY_B}")])
        .args(["-H", &ct])
        .arg("--data-binary")
        .arg("@-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().expect("stdin").write_all(&body)?;
            c.wait_with_output()
        })
        .expect("curl");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "B's initialize"
    );
    assert_eq!(terminal(&b, "cat b-secret.txt"), "the secret of tenant B");
    b
}

#[test]
fn a_stalled_mcp_request_never_runs_in_the_next_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = recycling_host(dir.path());
    let a = acquire(&host, KEY_A, r#"{"server_names": ["terminal"]}"#);
    let a_slot = slot_identity(&host, KEY_A, &a);
    let target = target_of(&mcp_url(&a, "terminal"));
    let body = run_command("cat b-secret.txt");
    let stalled = Stalled::mcp(&host.base, &target, &body, 10);
    let b = lease_b_after(&host, &a, &a_slot);
    let (code, answer) = stalled.finish();
    assert!(
        !answer.contains("the secret of tenant B"),
        "A read B's file through its stalled request: {answer}"
    );
    // Stopped by A's Release while its body was still arriving: the
    // host's 409 (not a timeout, a crash or a closed connection, which
    // would say nothing about where the body went).
    assert_eq!(
        code, 409,
        "A's stalled request must be stopped by A's Release: {answer}"
    );
    release(&host, KEY_B, b["local_sandbox_id"].as_str().expect("id"));
}

#[test]
fn a_stalled_initialize_never_replaces_the_next_leases_workspace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = recycling_host(dir.path());
    let a = acquire(&host, KEY_A, r#"{"server_names": ["terminal"]}"#);
    let a_slot = slot_identity(&host, KEY_A, &a);
    let a_id = a["local_sandbox_id"].as_str().expect("id");
    let (ct, body) = multipart("planted-by-a.txt", b"A's archive");
    let stalled = Stalled::start(
        &host.base,
        "POST",
        &format!("/local-sandbox/{a_id}/initialize"),
        &[ct, format!("authorization: Bearer {KEY_A}")],
        &body,
        20,
    );
    let b = lease_b_after(&host, &a, &a_slot);
    let (code, answer) = stalled.finish();
    assert_eq!(
        code, 409,
        "A's stalled initialize must be stopped by A's Release: {answer}"
    );
    let listing = terminal(&b, "ls -a");
    assert!(
        listing.lines().any(|l| l == "b-secret.txt")
            && listing.lines().all(|l| l != "planted-by-a.txt"),
        "B's workspace was replaced by A's archive: {listing}"
    );
    release(&host, KEY_B, b["local_sandbox_id"].as_str().expect("id"));
}

/// The shipped manifest in `dir`, its filesystem server taking `secs`
/// seconds to start (so a Reset that restarts it takes as long).
fn manifest_with_slow_filesystem(dir: &Path, secs: u32) {
    let shipped = crate::common::mcp::shipped_manifest(Path::new("${state_root}"));
    let fs =
        "${install_dir}/node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js";
    let fast = format!("command = \"node\"\nargs = [\"{fs}\", \"${{workspace}}\"]");
    let slow = format!(
        "command = \"sh\"\nargs = [\"-c\", \"sleep {secs}; exec node {fs} \\\"$0\\\"\", \"${{workspace}}\"]"
    );
    assert!(
        shipped.contains(&fast),
        "the shipped filesystem server changed"
    );
    std::fs::write(dir.join("servers.toml"), shipped.replace(&fast, &slow)).expect("manifest");
}

/// A request whose head arrives while its sandbox's Reset runs (here, a
/// server that takes 3 s to start again) is stopped when the Reset
/// returns: nothing admitted before the Reset is done lands after it.
#[test]
fn a_request_admitted_during_a_reset_never_lands_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    manifest_with_slow_filesystem(dir.path(), 3);
    let host = Host::start(dir.path(), &[]);
    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    let target = target_of(&mcp_url(&a, "filesystem"));
    let reset = {
        let url = format!("{}/local-sandbox/{id}/reset", host.base);
        std::thread::spawn(move || http("POST", &url, Some(KEY_A), None))
    };
    // The Reset runs: its server is starting again (sleeping).
    crate::common::eventually(
        Duration::from_secs(30),
        "the Reset restarts the filesystem server",
        || {
            let ps = crate::common::host::processes_mentioning("sleep 3; exec node");
            crate::common::when(!ps.trim().is_empty(), || "not yet".into())
        },
    );
    let write = tool_call(
        "write_file",
        json!({"path": "planted-before-reset.txt", "content": "x"}),
    );
    let stalled = Stalled::mcp(&host.base, &target, &write, 5);
    let (code, v) = reset.join().expect("reset thread");
    assert_eq!(code, 200, "{v}");
    let (code, answer) = stalled.finish();
    assert_eq!(
        code, 409,
        "a request admitted during the Reset must be stopped when it returns: {answer}"
    );
    let listing = call(&a, "filesystem", "list_directory", json!({"path": "."}));
    assert!(!listing.starts_with("no text in"), "{listing}");
    assert!(!listing.contains("planted-before-reset"), "{listing}");
    release(&host, KEY_A, &id);
}
