//! Klavis's execution endpoints on `sandbox-host` (process backend): the
//! execution notebook's flow with httpx, the 404/422 answers, and the
//! bounds of the upload store.

use std::process::Command;

use crate::common::host::{
    EXEC_CLIENT, Host, KEY_A, KEY_B, acquire, http, put, release, script_archive,
};
use crate::common::ws::incompressible;
use serde_json::{Value, json};

/// The package settings the offline host gives executions.
const PACKAGE_ENV: [&str; 5] = [
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
    "UV_OFFLINE",
];

/// Where the test command put the wheels scripts install offline.
fn wheels() -> String {
    let dir = std::env::var("SANDBOX_AGENT_WHEELS")
        .unwrap_or_else(|_| "/opt/sandbox-agent/wheels".to_owned());
    assert!(
        std::fs::read_dir(&dir).is_ok_and(|d| d
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("psutil-"))),
        "no wheels in {dir}: run .ci/install-prereqs.sh"
    );
    dir
}

/// A host whose agents install Python packages only from the wheel dir:
/// the package settings in the host's environment, which reach executions
/// only because the operator names them (`--agent-env`).
fn offline_host_with(dir: &std::path::Path, extra: &[&str]) -> Host {
    let w = wheels();
    let mut args = extra.to_vec();
    for name in PACKAGE_ENV {
        args.extend(["--agent-env", name]);
    }
    Host::start_env(
        dir,
        &args,
        &[
            ("PIP_FIND_LINKS", &w),
            ("PIP_NO_INDEX", "1"),
            ("UV_FIND_LINKS", &w),
            ("UV_NO_INDEX", "1"),
            ("UV_OFFLINE", "1"),
        ],
    )
}

#[test]
fn the_execution_notebook_runs_against_the_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The stand-in for the public URLs the notebook's script fetches
    // listens on this host's loopback, which the sandbox reaches only at a
    // port the host forwards.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let host = offline_host_with(dir.path(), &["--sandbox-host-port", &port]);
    let out = Command::new("python3")
        .arg(EXEC_CLIENT)
        .arg(&host.base)
        .arg(KEY_A)
        .arg(&port)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "exec_client.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let logs = v["logs"].as_str().unwrap_or_default();
    assert_eq!(v["final"], "completed", "{logs}\n{v}");
    assert_eq!(v["status"], json!({"status": "completed"}));
    assert_eq!(v["upload_url"]["expires_in_minutes"], 30);
    assert_eq!(v["execute"]["execution_name"], "demo-run");
    for want in [
        "curl (packages.txt): origin 127.0.0.1",
        "requests (requirements.txt): Host 127.0.0.1:",
        "jq works",
        "MCP servers filesystem,terminal; filesystem answered: True",
        "to stderr\nünïcödé ✓ 日本語 😀\n",
    ] {
        assert!(logs.contains(want), "{want:?} not in the log:\n{logs}");
    }
    assert_eq!(
        v["cursor"].as_u64(),
        Some(logs.len() as u64),
        "the cursor is the log's byte length"
    );
    let artifacts: Vec<&str> = v["artifacts"]
        .as_array()
        .expect("artifacts")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    for f in [
        "./main.py",
        "./report.json",
        "./requirements.txt",
        "./packages.txt",
    ] {
        assert!(artifacts.contains(&f), "{f} not in {artifacts:?}");
    }
    assert_eq!(v["report"]["origin"], "127.0.0.1");
    assert_eq!(v["report"]["mcp"], true);
    assert_eq!(v["mcp_text"], "written by the execution\n");
    assert!(
        v["dump"]
            .as_array()
            .is_some_and(|d| d.iter().any(|m| m == "./summary.txt")),
        "{}",
        v["dump"]
    );
    assert_eq!(v["release"], 200);
}

#[test]
fn unknown_executions_are_404_and_bad_bodies_422() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id");
    let b = format!("{}/local-sandbox/{id}", host.base);
    let (code, v) = http(
        "GET",
        &format!("{b}/execution-status?execution_name=nope"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 404, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no execution named \"nope\"")),
        "{v}"
    );
    let (code, v) = http(
        "POST",
        &format!("{b}/execute"),
        Some(KEY_A),
        Some(r#"{"execution_name": "never-uploaded"}"#),
    );
    assert_eq!(code, 404, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("execution-upload-url")),
        "{v}"
    );
    let (code, v) = http(
        "POST",
        &format!("{b}/export-artifacts"),
        Some(KEY_A),
        Some(r#"{"execution_name": "nope"}"#),
    );
    assert_eq!(code, 404, "{v}");
    // A name no execution can have names none (Klavis's schema takes any
    // string): 404 too.
    let (code, v) = http(
        "GET",
        &format!("{b}/execution-logs?execution_name=a/b"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 404, "{v}");
    for (method, path, body, loc) in [
        (
            "POST",
            "execute",
            Some("{}"),
            json!(["body", "execution_name"]),
        ),
        (
            "POST",
            "execution-upload-url",
            Some(r#"{"execution_name": 3}"#),
            json!(["body", "execution_name"]),
        ),
        (
            "POST",
            "export-artifacts",
            Some(r#"{"execution_name": ["a"]}"#),
            json!(["body", "execution_name"]),
        ),
        (
            "GET",
            "execution-status",
            None,
            json!(["query", "execution_name"]),
        ),
        (
            "GET",
            "execution-logs?execution_name=x&cursor=-1",
            None,
            json!(["query", "cursor"]),
        ),
        (
            "GET",
            "execution-logs?execution_name=x&cursor=abc",
            None,
            json!(["query", "cursor"]),
        ),
    ] {
        let (code, v) = http(method, &format!("{b}/{path}"), Some(KEY_A), body);
        assert_eq!(code, 422, "{path}: {v}");
        assert_eq!(v["detail"][0]["loc"], loc, "{path}: {v}");
    }
    // Another owner's sandbox does not exist for them.
    let (code, _) = http(
        "GET",
        &format!("{b}/execution-status?execution_name=x"),
        Some(KEY_B),
        None,
    );
    assert_eq!(code, 404);
    // A signed upload URL is bound to its execution name.
    let (_, u) = http(
        "POST",
        &format!("{b}/execution-upload-url"),
        Some(KEY_A),
        Some(r#"{"execution_name": "one"}"#),
    );
    let url = u["upload_url"]
        .as_str()
        .expect("url")
        .replace("/one?", "/two?");
    let (code, _) = http("PUT", &url, None, Some("x"));
    assert_eq!(code, 403);
    release(&host, KEY_A, id);
}

/// A signed execution upload URL of sandbox `id` for `name`: (status, body).
fn exec_upload_url(host: &Host, key: &str, id: &str, name: &str) -> (u16, Value) {
    http(
        "POST",
        &format!("{}/local-sandbox/{id}/execution-upload-url", host.base),
        Some(key),
        Some(&format!(r#"{{"execution_name": "{name}"}}"#)),
    )
}

/// What the upload store holds for sandbox `id`: its workspace archive and
/// execution archives, partial ones included.
fn stored(host: &Host, id: &str) -> Vec<String> {
    let up = host.data.join("uploads");
    let mut out: Vec<String> = std::fs::read_dir(&up)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(id) && !n.ends_with(".exec"))
                .collect()
        })
        .unwrap_or_default();
    if let Ok(d) = std::fs::read_dir(up.join(format!("{id}.exec"))) {
        out.extend(
            d.flatten()
                .map(|e| format!("exec/{}", e.file_name().to_string_lossy())),
        );
    }
    out.sort();
    out
}

/// Issue 27's finding 7: the upload store kept every archive a tenant
/// PUT (60 never-executed ones in one sandbox). Now a sandbox holds at
/// most `--max-executions-per-sandbox` (32, the agent's own cap) names:
/// URLs handed out before the cap was reached are refused at the PUT, a
/// new name at execution-upload-url; a held name can be replaced.
#[test]
fn a_flood_of_execution_names_is_refused_at_the_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id");
    let archive = script_archive("print('flood')\n");
    // Every URL first (nothing is stored yet), then every PUT.
    let urls: Vec<String> = (0..40)
        .map(|i| {
            let (code, v) = exec_upload_url(&host, KEY_A, id, &format!("flood-{i}"));
            assert_eq!(code, 200, "{v}");
            v["upload_url"].as_str().expect("url").to_owned()
        })
        .collect();
    let codes: Vec<u16> = urls.iter().map(|u| put(u, &archive).0).collect();
    assert_eq!(codes[..32], [200; 32], "{codes:?}");
    assert_eq!(codes[32..], [429; 8], "{codes:?}");
    let (code, v) = put(&urls[39], &archive);
    assert_eq!(code, 429, "{v}");
    let d = v["detail"].as_str().unwrap_or_default();
    assert!(
        d.contains("32 execution archives")
            && d.contains("--max-executions-per-sandbox")
            && d.contains("release the sandbox"),
        "{v}"
    );
    let (code, v) = exec_upload_url(&host, KEY_A, id, "one-more");
    assert_eq!(code, 429, "{v}");
    assert_eq!(stored(&host, id).len(), 32, "{:?}", stored(&host, id));
    // A held name takes a new archive, and runs.
    let (code, v) = exec_upload_url(&host, KEY_A, id, "flood-0");
    assert_eq!(code, 200, "{v}");
    let (code, v) = put(v["upload_url"].as_str().expect("url"), &archive);
    assert_eq!(code, 200, "{v}");
    release(&host, KEY_A, id);
    assert!(stored(&host, id).is_empty(), "{:?}", stored(&host, id));
}

/// PUTs `body` as execution `name`'s archive of sandbox `id`.
fn exec_put(host: &Host, key: &str, id: &str, name: &str, body: &[u8]) -> (u16, Value) {
    let (code, v) = exec_upload_url(host, key, id, name);
    assert_eq!(code, 200, "{v}");
    put(v["upload_url"].as_str().expect("url"), body)
}

/// A new sandbox of `key` (filesystem only); its id.
fn new_sandbox(host: &Host, key: &str) -> String {
    acquire(host, key, r#"{"server_names": ["filesystem"]}"#)["local_sandbox_id"]
        .as_str()
        .expect("id")
        .to_owned()
}

/// The store's bytes are bounded per sandbox and per API key, counted
/// while an upload streams: one over either is a 413 that names the flag
/// and keeps nothing (no archive, no partial file), also after a host
/// restart; Release frees a sandbox's bytes, so the owner can upload
/// again; another owner is not affected.
#[test]
fn stored_bytes_are_capped_per_sandbox_and_per_key_and_freed_at_release() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = [
        "--max-stored-bytes-per-sandbox",
        "1000000",
        "--max-stored-bytes-per-key",
        "1500000",
    ];
    let mut host = Host::start(dir.path(), &args);
    let big = |seed| incompressible(600_000, seed);
    let a1 = new_sandbox(&host, KEY_A);
    assert_eq!(exec_put(&host, KEY_A, &a1, "a", &big(1)).0, 200);
    let (code, v) = exec_put(&host, KEY_A, &a1, "b", &big(2));
    assert_eq!(code, 413, "{v}");
    assert!(
        v["detail"].as_str().is_some_and(
            |d| d.contains("1000000 bytes") && d.contains("--max-stored-bytes-per-sandbox")
        ),
        "{v}"
    );
    assert_eq!(stored(&host, &a1), ["exec/a.tar.gz"], "nothing of b stays");
    // A restarted host counts what is stored.
    host.stop();
    let host = Host::start(dir.path(), &args);
    assert_eq!(exec_put(&host, KEY_A, &a1, "b", &big(2)).0, 413);
    assert_eq!(stored(&host, &a1), ["exec/a.tar.gz"]);

    // A second sandbox of the same key: its own room, but the key's is
    // 1.5 MB.
    let a2 = new_sandbox(&host, KEY_A);
    let (_, u) = http(
        "POST",
        &format!("{}/local-sandbox/{a2}/upload-url", host.base),
        Some(KEY_A),
        None,
    );
    let (code, v) = put(u["upload_url"].as_str().expect("url"), &big(3));
    assert_eq!(code, 200, "{v}");
    let (code, v) = exec_put(&host, KEY_A, &a2, "c", &incompressible(400_000, 4));
    assert_eq!(code, 413, "{v}");
    assert!(
        v["detail"].as_str().is_some_and(
            |d| d.contains("1500000 bytes") && d.contains("--max-stored-bytes-per-key")
        ),
        "{v}"
    );
    assert_eq!(stored(&host, &a2), [format!("{a2}.tar.gz")]);
    // Another key is not held back by this one's uploads.
    let b = new_sandbox(&host, KEY_B);
    assert_eq!(exec_put(&host, KEY_B, &b, "b", &big(5)).0, 200);

    // Release frees a1's 600 kB: the key's next upload fits again.
    release(&host, KEY_A, &a1);
    assert!(stored(&host, &a1).is_empty());
    let a3 = new_sandbox(&host, KEY_A);
    let (code, v) = exec_put(&host, KEY_A, &a3, "d", &big(6));
    assert_eq!(code, 200, "{v}");
    for (key, id) in [(KEY_A, &a2), (KEY_A, &a3), (KEY_B, &b)] {
        release(&host, key, id);
    }
}

/// Executes of one name racing Resets of their sandbox (issue 35): each
/// answer says what happened (200, or 4xx: replaced, released or reset
/// meanwhile), never a 500, and every Reset succeeds and leaves the
/// sandbox usable: occupied, its executions admitted again. The race is
/// checked to have run: executes were answered while a Reset was under
/// way, admitted ones among them.
#[test]
fn executes_racing_resets_never_fail_the_sandbox() {
    use std::time::Instant;
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let a = acquire(&host, KEY_A, r#"{"server_names": []}"#);
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    let b = format!("{}/local-sandbox/{id}", host.base);
    let body = r#"{"execution_name": "j"}"#;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racers: Vec<_> = (0..3)
        .map(|_| {
            let (b, stop) = (b.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let (code, u) = http(
                        "POST",
                        &format!("{b}/execution-upload-url"),
                        Some(KEY_A),
                        Some(body),
                    );
                    if code == 200 {
                        put(
                            u["upload_url"].as_str().unwrap_or_default(),
                            &script_archive("print(1)\n"),
                        );
                    }
                    let asked = Instant::now();
                    let (code, v) = http("POST", &format!("{b}/execute"), Some(KEY_A), Some(body));
                    seen.push((asked, Instant::now(), code, v.to_string()));
                }
                seen
            })
        })
        .collect();
    let mut resets = Vec::new();
    for round in 0..30 {
        let asked = Instant::now();
        let (code, v) = http("POST", &format!("{b}/reset"), Some(KEY_A), None);
        assert_eq!(code, 200, "reset {round}: {v}");
        resets.push((asked, Instant::now()));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let executes: Vec<_> = racers
        .into_iter()
        .flat_map(|r| r.join().expect("racer"))
        .collect();
    for (_, _, code, v) in &executes {
        assert!(*code < 500, "an execute answered {code}: {v}");
    }
    // The race ran: executes admitted (200) while a Reset was under way,
    // and executes in flight when a Reset ended them (the host's 409).
    let during_a_reset = |asked: &Instant, answered: &Instant| {
        resets
            .iter()
            .any(|(r_asked, r_answered)| asked < r_answered && r_asked < answered)
    };
    let admitted = executes
        .iter()
        .filter(|(asked, answered, code, _)| *code == 200 && during_a_reset(asked, answered))
        .count();
    let stopped = executes
        .iter()
        .filter(|(_, _, code, v)| {
            *code == 409 && v.contains("reset while this request was in flight")
        })
        .count();
    let codes: Vec<u16> = executes.iter().map(|e| e.2).collect();
    assert!(
        admitted > 0 && stopped > 0,
        "{admitted} executes admitted while a Reset ran, {stopped} stopped by one: {codes:?}"
    );
    let (code, v) = http("GET", &b, Some(KEY_A), None);
    assert_eq!((code, v["status"].as_str()), (200, Some("occupied")), "{v}");
    let (status, log) =
        crate::common::host::run_script(&host, KEY_A, &id, "after", "print('ok')\n");
    assert_eq!(status, "completed", "{log}");
    release(&host, KEY_A, &id);
}
