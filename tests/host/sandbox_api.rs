//! Klavis's MCP Sandbox API (`/sandbox/{server}`) through the real host:
//! driven by Klavis's own Python SDK (klavis 2.20.0, only its base URL
//! changed), by Toolathlon's request sequence, and as an attacker would
//! (another key, bad bodies, names this host cannot serve).

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::host::*;
use crate::common::*;

const SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/klavis_sdk.py");

/// Runs a scenario of `klavis_sdk.py` as `key`'s owner.
fn sdk(host: &Host, key: &str, scenario: &str) -> Value {
    let out = Command::new("python3")
        .args([SDK, &host.base, key, scenario])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "klavis_sdk.py {scenario}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client's JSON")
}

/// The SDK's local_dev calls: create, get, initialize_local_dev with
/// files, dump (a tar.gz of exactly those files), the filesystem server on
/// its server_urls without a key, reset, delete; then the sandbox is gone.
#[test]
fn the_klavis_sdk_drives_local_dev() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let v = sdk(&host, KEY_A, "local_dev");
    assert_eq!(v["create"]["server_name"], "local_dev", "{v}");
    assert_eq!(v["create"]["status"], "occupied", "{v}");
    let servers: Vec<&str> = v["create"]["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for s in ["filesystem", "git", "terminal"] {
        assert!(servers.contains(&s), "{s} missing: {v}");
    }
    assert!(!servers.contains(&"localmemory"), "{v}");
    assert_eq!(v["get"], json!({"sandbox_id": true, "status": "occupied"}));
    assert_eq!(v["initialize"]["sandbox_id"], true, "{v}");
    assert_eq!(
        v["dump"],
        json!([
            ["data.csv", "a,b\n1,2\n"],
            ["notes/hello.txt", "hello from the SDK"]
        ])
    );
    assert!(
        v["mcp_read"]
            .as_str()
            .is_some_and(|t| t.contains("hello from the SDK")),
        "{v}"
    );
    assert_eq!(v["reset"]["status"], "occupied", "{v}");
    assert_eq!(v["delete"], json!({"sandbox_id": true, "status": "idle"}));
    assert_eq!(v["get_after_delete"], 404, "{v}");
}

/// localmemory's data: the SDK's LocalMemoryData loads into the memory
/// server, which a new MCP session per call sees (as MCP_Atlas calls it),
/// and the dump gives back the graph with what the calls added.
#[test]
fn the_klavis_sdk_loads_and_dumps_localmemory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let v = sdk(&host, KEY_A, "localmemory");
    assert_eq!(v["create"]["server_name"], "localmemory", "{v}");
    assert_eq!(v["create"]["servers"], json!(["localmemory"]), "{v}");
    assert_eq!(v["graph"], json!(["Ada", "Engine"]), "{v}");
    assert_eq!(v["dump"]["server_name"], "localmemory", "{v}");
    assert_eq!(
        v["dump"]["entities"],
        json!([
            [
                "Ada",
                "person",
                ["wrote the first program", "kept across sessions"]
            ],
            ["Engine", "machine", []]
        ]),
        "{v}"
    );
    assert_eq!(
        v["dump"]["relations"],
        json!([["Ada", "Engine", "programmed"]])
    );
    // init_default_data=True replaces the graph with the default data.
    assert_eq!(
        v["default"],
        json!({"entities": ["Ada Lovelace", "Analytical Engine", "Charles Babbage"], "relations": 2}),
        "{v}"
    );
}

/// Toolathlon's sequence (`KlavisSandbox` with local_dev): acquire with its
/// benchmark, upload-url, PUT, initialize without a body, a tool call on
/// server_urls without the key, dump, download, DELETE; nothing of it is
/// left running after.
#[test]
fn the_toolathlon_sequence_runs_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &["--pool-size", "0"]);
    let b = &host.base;
    let (code, a) = http(
        "POST",
        &format!("{b}/sandbox/local_dev"),
        Some(KEY_A),
        Some(r#"{"benchmark": "Toolathlon"}"#),
    );
    assert_eq!(code, 200, "{a}");
    let id = a["sandbox_id"].as_str().expect("sandbox_id").to_owned();
    let fs_url = a["server_urls"]["filesystem"]
        .as_str()
        .expect("filesystem url")
        .to_owned();
    let (code, u) = http(
        "POST",
        &format!("{b}/sandbox/local_dev/{id}/upload-url"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{u}");
    let archive = ws::gzip(
        &ws::Tar::new()
            .file("task.md", b"summarize the documents")
            .end(),
    );
    let (code, p) = put(u["upload_url"].as_str().expect("upload_url"), &archive);
    assert_eq!(code, 200, "{p}");
    let (code, i) = http(
        "POST",
        &format!("{b}/sandbox/local_dev/{id}/initialize"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{i}");
    // The URL alone admits its holder (Toolathlon sends no key).
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"toolathlon","version":"1"}}}"#;
    let (code, m) = http("POST", &fs_url, None, Some(call));
    assert_eq!(code, 200, "{m}");
    let (code, d) = http(
        "GET",
        &format!("{b}/sandbox/local_dev/{id}/dump"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{d}");
    let got = Command::new("curl")
        .args(["-s", "--max-time", "120"])
        .arg(d["download_url"].as_str().expect("download_url"))
        .output()
        .expect("curl");
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(&got.stdout[..]));
    let names: Vec<String> = tar
        .entries()
        .expect("a tar.gz")
        .filter_map(Result::ok)
        .filter(|e| e.header().entry_type().is_file())
        .filter_map(|e| e.path().ok().map(|p| p.display().to_string()))
        .map(|n| n.trim_start_matches("./").to_owned())
        .collect();
    assert_eq!(names, ["task.md"], "the dump holds the uploaded workspace");
    let (code, r) = http(
        "DELETE",
        &format!("{b}/sandbox/local_dev/{id}"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["status"], "idle", "{r}");
    // Pool size 0: once released, its agent stops.
    eventually(Duration::from_secs(60), "the sandbox's agent stops", || {
        let live = host.agents().into_iter().filter(|p| alive(*p)).count();
        when(live == 0, || format!("{live} agents left"))
    });
}

/// Every new route answers another owner 404, bad bodies 422 in FastAPI's
/// shape, names this host cannot serve a 4xx saying why; a sandbox of one
/// API is the same sandbox in the other.
#[test]
fn the_sandbox_api_refuses_as_klavis_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let b = &host.base;
    let (code, a) = http(
        "POST",
        &format!("{b}/sandbox/memory"),
        Some(KEY_A),
        Some(r#"{"benchmark": "MCP_Atlas", "extra": 1}"#),
    );
    assert_eq!(code, 200, "{a}");
    assert_eq!(a["server_name"], "memory", "the name sent: {a}");
    let id = a["sandbox_id"].as_str().expect("id").to_owned();
    // One id space: the same sandbox through /local-sandbox.
    let (code, l) = http("GET", &format!("{b}/local-sandbox/{id}"), Some(KEY_A), None);
    assert_eq!(code, 200, "{l}");
    assert_eq!(l["benchmark"], "MCP_Atlas", "{l}");
    for (method, path, body) in [
        ("GET", format!("/sandbox/localmemory/{id}"), None),
        ("POST", format!("/sandbox/localmemory/{id}/reset"), None),
        ("GET", format!("/sandbox/localmemory/{id}/dump"), None),
        (
            "POST",
            format!("/sandbox/localmemory/{id}/initialize"),
            Some(r#"{"entities": []}"#),
        ),
        ("POST", format!("/sandbox/local_dev/{id}/upload-url"), None),
        ("GET", format!("/sandbox/local_dev/{id}/dump"), None),
        ("DELETE", format!("/sandbox/localmemory/{id}"), None),
    ] {
        let (code, v) = http(method, &format!("{b}{path}"), Some(KEY_B), body);
        assert_eq!(code, 404, "{method} {path} as another owner: {v}");
        // In this API's words, never /local-sandbox's.
        assert_eq!(v["detail"], format!("Sandbox {id} not found"), "{path}");
    }
    let (code, v) = http(
        "POST",
        &format!("{b}/sandbox/localmemory"),
        Some(KEY_A),
        Some(r#"{"ttl_seconds": 5}"#),
    );
    assert_eq!(code, 422, "{v}");
    assert_eq!(v["detail"][0]["loc"], json!(["body", "ttl_seconds"]), "{v}");
    let (code, v) = http(
        "POST",
        &format!("{b}/sandbox/localmemory/{id}/initialize"),
        Some(KEY_A),
        Some(r#"{"entities": [{"name": "x"}]}"#),
    );
    assert_eq!(code, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("entities[0].entityType")),
        "{v}"
    );
    let (code, v) = http(
        "POST",
        &format!("{b}/sandbox/jira"),
        Some(KEY_A),
        Some("{}"),
    );
    assert_eq!(code, 400, "{v}");
    assert!(v["detail"].to_string().contains("test accounts"), "{v}");
    let (code, v) = http(
        "POST",
        &format!("{b}/sandbox/nope"),
        Some(KEY_A),
        Some("{}"),
    );
    assert_eq!(code, 422, "{v}");
    assert_eq!(v["detail"][0]["loc"], json!(["path", "server_name"]), "{v}");
    let (code, _) = http("POST", &format!("{b}/sandbox/local_dev"), None, Some("{}"));
    assert_eq!(code, 401);
    let (code, r) = http(
        "DELETE",
        &format!("{b}/sandbox/localmemory/{id}"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{r}");
    let (code, _) = http(
        "GET",
        &format!("{b}/sandbox/localmemory/{id}"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 404);
}

const ATLAS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/atlas_client.py");

/// MCP_Atlas's Klavis mode: local_dev, localmemory and its public-data and
/// SaaS names acquired all at once (9 in parallel) (what this host cannot serve fails and
/// is skipped, as the client does), a new MCP session for every tool
/// call with state kept across them, every sandbox deleted.
#[test]
fn the_mcp_atlas_sequence_keeps_state_across_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let out = Command::new("python3")
        .args([ATLAS, &host.base, KEY_A])
        .args([
            "local_dev",
            "localmemory",
            "calculator",
            "wikipedia",
            "context7",
        ])
        .args(["pubmed", "google_cloud", "jira", "nope"])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "atlas_client.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let local: Vec<&str> = v["acquired"]["local_dev"]
        .as_array()
        .expect("local_dev acquired")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        local.contains(&"filesystem") && local.contains(&"terminal"),
        "{v}"
    );
    assert_eq!(v["acquired"]["localmemory"], json!(["localmemory"]), "{v}");
    // Its public-data servers, each a sandbox of its own; pubmed has no
    // published package (docs/profiles.md): refused, skipped.
    for name in ["calculator", "wikipedia", "context7"] {
        assert_eq!(v["acquired"][name], json!([name]), "{v}");
    }
    assert_eq!(v["failed"]["pubmed"], 400, "{v}");
    // No Google Cloud credentials here: refused with why, as jira and an
    // unknown name are; the client goes on without them.
    assert_eq!(v["failed"]["jira"], 400, "{v}");
    assert_eq!(v["failed"]["nope"], 422, "{v}");
    assert!(v["failed"].get("google_cloud").is_some(), "{v}");
    assert_eq!(v["calls"]["filesystem"], "state", "{v}");
    assert_eq!(v["calls"]["localmemory"], json!(["Atlas"]), "{v}");
    assert_eq!(
        v["released"],
        json!({"local_dev": 200, "localmemory": 200, "calculator": 200, "wikipedia": 200, "context7": 200}),
        "{v}"
    );
}

/// The README's SDK example, as written, against a real host.
#[test]
fn the_readme_sdk_example_runs() {
    const MARK: &str = "<!-- readme-test: python klavis -->";
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let after = &readme[readme.find(MARK).expect("the SDK example") + MARK.len()..];
    let body = &after[after.find("```python\n").expect("a python block") + 10..];
    let snippet = &body[..body.find("```").expect("its end")];
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let file = dir.path().join("readme_sdk.py");
    std::fs::write(&file, snippet).expect("snippet");
    let out = Command::new("python3")
        .arg(&file)
        .env("SANDBOX_URL", &host.base)
        .env("SANDBOX_KEY", KEY_A)
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout.contains("'filesystem'")
            && stdout.contains("/transfer/dump/"),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Toolathlon's `emails` acquire: the renamed server with its
/// `test_account_email`, which becomes the lease's mail account.
#[test]
fn test_account_email_is_the_mail_account() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let b = &host.base;
    let (code, a) = http(
        "POST",
        &format!("{b}/sandbox/emails"),
        Some(KEY_A),
        Some(r#"{"benchmark": "Toolathlon", "test_account_email": "jsmith@mcp.com"}"#),
    );
    assert_eq!(code, 200, "{a}");
    assert!(a["server_urls"]["emails"].is_string(), "{a}");
    assert_eq!(a["server_name"], "emails", "{a}");
    let id = a["sandbox_id"].as_str().expect("id");
    let (code, l) = http("GET", &format!("{b}/local-sandbox/{id}"), Some(KEY_A), None);
    assert_eq!(code, 200, "{l}");
    assert_eq!(
        l["servers"][0]["auth_data"]["email"], "jsmith@mcp.com",
        "{l}"
    );
    let (code, _) = http(
        "DELETE",
        &format!("{b}/sandbox/emails/{id}"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200);
}

/// The benchmarks' pattern on `local_dev` (lazy by default): two tasks at
/// once, each acquiring and calling filesystem and terminal with the
/// official MCP client. The create answers with every server idle; after
/// the calls exactly those two run, in both sandboxes; an explicit list
/// (`/local-sandbox`) and a one-server `/sandbox/{name}` start theirs
/// before answering, as Klavis's do.
#[test]
fn local_dev_starts_each_server_on_first_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let v = py(&host, KEY_A, &["burst-keep", "2", "120"]);
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{v}");
    for r in results {
        assert_eq!(r["ok"], true, "{r}");
        let states = r["states"].as_object().expect("server_states");
        assert!(states.len() >= 3, "{r}");
        assert!(states.values().all(|s| s == "idle"), "at create: {r}");
        let id = r["sandbox_id"].as_str().expect("id");
        let (code, got) = http(
            "GET",
            &format!("{}/sandbox/local_dev/{id}", host.base),
            Some(KEY_A),
            None,
        );
        assert_eq!(code, 200, "{got}");
        for (name, state) in got["server_states"].as_object().expect("states") {
            let used = name == "filesystem" || name == "terminal";
            assert_eq!(state, if used { "ready" } else { "idle" }, "{name}: {got}");
        }
        release_sandbox(&host, id);
    }
    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem", "git"]}"#);
    for s in a["servers"].as_array().expect("servers") {
        assert_eq!(s["state"], "ready", "an explicit list starts eagerly: {a}");
    }
    release(&host, KEY_A, a["local_sandbox_id"].as_str().expect("id"));
    let (code, c) = http(
        "POST",
        &format!("{}/sandbox/git", host.base),
        Some(KEY_A),
        Some("{}"),
    );
    assert_eq!(code, 200, "{c}");
    assert_eq!(c["server_states"], json!({"git": "ready"}), "{c}");
    release_sandbox(&host, c["sandbox_id"].as_str().expect("id"));
}

fn release_sandbox(host: &Host, id: &str) {
    let (code, body) = http(
        "DELETE",
        &format!("{}/sandbox/local_dev/{id}", host.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{body}");
}

const TOOLATHLON: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/toolathlon_client.py"
);

/// Toolathlon's client with a task's own server names: the local ones
/// through local_dev, `memory`, `emails` (sent as
/// poste_email_toolathlon, with its account) and `playwright_with_chunk`
/// each under the name it looks them up by, found again (GET) and
/// released (DELETE) under the `server_name` each answer gave, then gone
/// in this API's words; `google-cloud` (no credentials here) refused,
/// which the client skips. The memory URL keeps its graph across MCP
/// sessions.
#[test]
fn toolathlon_finds_each_server_under_its_own_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let out = Command::new("python3")
        .args([TOOLATHLON, &host.base, KEY_A])
        .args(["filesystem", "terminal", "memory", "emails"])
        .args(["playwright_with_chunk", "google-cloud"])
        .args(["--email", "jsmith@mcp.com"])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "toolathlon_client.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        v["urls"],
        json!([
            "emails",
            "filesystem",
            "memory",
            "playwright_with_chunk",
            "terminal"
        ]),
        "{v}"
    );
    assert_eq!(v["failed"], json!({"google-cloud": 400}), "{v}");
    let names = [
        "local_dev",
        "memory",
        "playwright_with_chunk",
        "poste_email_toolathlon",
    ];
    assert_eq!(v["server_names"], json!(names), "{v}");
    for name in names {
        assert_eq!(v["details"][name], 200, "GET /sandbox/{name}/…: {v}");
        assert_eq!(v["detail_names"][name], name, "{v}");
        assert_eq!(v["released"][name], 200, "DELETE /sandbox/{name}/…: {v}");
        let gone = &v["after_release"][name];
        assert_eq!(gone[0], 404, "{v}");
        let said = gone[1]["detail"].as_str().unwrap_or_default();
        assert!(
            said.starts_with("Sandbox ") && said.ends_with(" not found"),
            "{v}"
        );
    }
    assert_eq!(v["memory"], json!(["Toolathlon"]), "{v}");
}
