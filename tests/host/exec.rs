//! Klavis's execution endpoints on `sandbox-host` (process backend): the
//! execution notebook's flow with httpx, and the 404/422 answers.

use std::process::Command;

use crate::common::host::{EXEC_CLIENT, Host, KEY_A, KEY_B, acquire, http, release};
use serde_json::{Value, json};

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

/// A host whose agents install Python packages only from the wheel dir.
fn offline_host(dir: &std::path::Path) -> Host {
    let w = wheels();
    Host::start_env(
        dir,
        &[],
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
    let host = offline_host(dir.path());
    let out = Command::new("python3")
        .arg(EXEC_CLIENT)
        .arg(&host.base)
        .arg(KEY_A)
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
            Some(r#"{"execution_name": "a/b"}"#),
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
