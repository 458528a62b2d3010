//! Benchmark profiles through sandbox-host, as Klavis's clients use them:
//! `benchmark` at Acquire changes what packaging/servers.toml says it
//! changes (the official MCP client on the mcp_server_url, the dump through
//! its signed URL), and `ALL` starts every server that can run here.

use crate::common::bench_data::{ATLAS_CSV, ATLAS_ENTITY};
use crate::common::host::{Host, KEY_A, acquire, py, release, server_names};

/// MCP_Atlas's terminal runs only `ls`, `cat` and `find`; by default the
/// same command runs.
#[test]
fn mcp_atlas_confines_the_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let echo = r#"{"command":"echo profile-check"}"#;
    let default = py(
        &host,
        KEY_A,
        &["profile", "-", "terminal", "run_command", echo],
    );
    assert_eq!(default["is_error"], false, "{default}");
    assert!(
        default["text"]
            .as_str()
            .unwrap_or_default()
            .contains("profile-check"),
        "{default}"
    );
    let atlas = py(
        &host,
        KEY_A,
        &["profile", "MCP_Atlas", "terminal", "run_command", echo],
    );
    assert_eq!(atlas["acquire"]["benchmark"], "MCP_Atlas", "{atlas}");
    let text = atlas["text"].as_str().unwrap_or_default();
    assert!(
        !text.contains("profile-check") && text.contains("not allowed"),
        "{atlas}"
    );
    let ls = py(
        &host,
        KEY_A,
        &[
            "profile",
            "MCP_Atlas",
            "terminal",
            "run_command",
            r#"{"command":"ls -a"}"#,
        ],
    );
    assert_eq!(ls["is_error"], false, "{ls}");
}

/// Toolathlon keeps the memory server's graph in the workspace
/// (`memory/memory.json`), so the dump the evaluation reads carries it; by
/// default it stays in the server's state path, out of the dump.
#[test]
fn toolathlon_memory_is_in_the_dump() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let entity =
        r#"{"entities":[{"name":"toolathlon-check","entityType":"test","observations":["kept"]}]}"#;
    let t = py(
        &host,
        KEY_A,
        &[
            "profile",
            "Toolathlon",
            "localmemory",
            "create_entities",
            entity,
        ],
    );
    assert_eq!(t["is_error"], false, "{t}");
    // Dump members are named ./path.
    let memory = t["files"]["./memory/memory.json"]
        .as_str()
        .unwrap_or_default();
    assert!(memory.contains("toolathlon-check"), "{t}");
    let d = py(
        &host,
        KEY_A,
        &["profile", "-", "localmemory", "create_entities", entity],
    );
    assert_eq!(d["is_error"], false, "{d}");
    let files = d["files"].as_object().expect("files");
    assert!(
        files
            .values()
            .all(|v| !v.as_str().unwrap_or_default().contains("toolathlon-check")),
        "{d}"
    );
}

/// `ALL` through the host: every server of the shipped manifest whose
/// outside service needs nothing starts (poste_email_toolathlon with the
/// sandbox's own mail service); google_cloud and canvas, without
/// credentials here, are named in the message with what they need instead
/// of failing the Acquire.
#[test]
fn all_starts_every_local_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let a = acquire(&host, KEY_A, r#"{"server_names": "ALL"}"#);
    let names = server_names(&a);
    assert_eq!(
        names,
        [
            "arxiv",
            "code-executor",
            "code-runner",
            "desktop-commander",
            "excel",
            "filesystem",
            "git",
            "localmemory",
            "pdf-tools",
            "playwright",
            "poste_email_toolathlon",
            "powerpoint",
            "terminal",
            "word"
        ],
        "{a}"
    );
    let message = a["message"].as_str().unwrap_or_default();
    for absent in ["google_cloud", "canvas"] {
        assert!(message.contains(absent), "{message}");
    }
    assert!(message.contains("CANVAS_API_TOKEN"), "{message}");
    release(&host, KEY_A, a["local_sandbox_id"].as_str().expect("id"));
}

/// A public-data server is a sandbox of its own, as MCP_Atlas's Klavis
/// integration leases it: `/sandbox/calculator` with its benchmark holds
/// that server alone, whose URL lists its tools (`ALL`, above, leaves it
/// out). A public-data name this host does not carry is a 400 saying so.
#[test]
fn a_public_data_server_is_a_sandbox_of_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let v = py(&host, KEY_A, &["sandbox", "calculator", "MCP_Atlas"]);
    assert_eq!(v["create"][0], 200, "{v}");
    let created = &v["create"][1];
    assert_eq!(created["server_name"], "calculator", "{v}");
    let urls: Vec<&String> = created["server_urls"]
        .as_object()
        .expect("server_urls")
        .keys()
        .collect();
    assert_eq!(urls, ["calculator"], "{v}");
    assert_eq!(v["tools"], serde_json::json!(["calculate"]), "{v}");
    assert_eq!(v["get"][1]["benchmark"], "MCP_Atlas", "{v}");
    assert_eq!(
        v["get"][1]["server_url"], created["server_urls"]["calculator"],
        "{v}"
    );
    assert_eq!(v["release"][0], 200, "{v}");

    let v = py(&host, KEY_A, &["sandbox", "pubmed", "-"]);
    assert_eq!(v["create"][0], 400, "{v}");
    assert!(
        v["create"][1]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("do not carry pubmed")),
        "{v}"
    );
}

/// MCP_Atlas's harness uploads nothing: the sandbox comes with the
/// benchmark's data (here the tests' small dataset, installed by
/// packaging/install-benchmark-data.sh), which its memory server and
/// terminal read, and which the dump carries.
#[test]
fn mcp_atlas_comes_with_its_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let memory = py(
        &host,
        KEY_A,
        &[
            "profile-bare",
            "MCP_Atlas",
            "localmemory",
            "read_graph",
            "{}",
        ],
    );
    assert_eq!(memory["is_error"], false, "{memory}");
    assert!(
        memory["text"]
            .as_str()
            .unwrap_or_default()
            .contains(ATLAS_ENTITY),
        "{memory}"
    );
    assert!(
        memory["files"][format!("./{ATLAS_CSV}")]
            .as_str()
            .is_some_and(|t| t.contains("Ann,3")),
        "{memory}"
    );
    let cat = py(
        &host,
        KEY_A,
        &[
            "profile-bare",
            "MCP_Atlas",
            "terminal",
            "run_command",
            &format!(r#"{{"command":"cat {ATLAS_CSV}"}}"#),
        ],
    );
    assert!(
        cat["text"].as_str().unwrap_or_default().contains("Bob,5"),
        "{cat}"
    );
    // Without the benchmark, none of it.
    let plain = py(
        &host,
        KEY_A,
        &["profile-bare", "-", "localmemory", "read_graph", "{}"],
    );
    assert!(
        !plain["text"]
            .as_str()
            .unwrap_or_default()
            .contains(ATLAS_ENTITY),
        "{plain}"
    );
}

/// MCP_Atlas confines desktop-commander's file tools to /data (its
/// data_path), as its harness does right after starting the server; by
/// default they reach the whole file system.
#[test]
fn mcp_atlas_confines_desktop_commander() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let read = r#"{"path":"/etc/hostname"}"#;
    let atlas = py(
        &host,
        KEY_A,
        &[
            "profile-bare",
            "MCP_Atlas",
            "desktop-commander",
            "read_file",
            read,
        ],
    );
    let text = atlas["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("not allowed") || text.contains("outside"),
        "{atlas}"
    );
    let config = py(
        &host,
        KEY_A,
        &[
            "profile-bare",
            "MCP_Atlas",
            "desktop-commander",
            "get_config",
            "{}",
        ],
    );
    assert!(
        config["text"]
            .as_str()
            .unwrap_or_default()
            .contains("/data\""),
        "{config}"
    );
    let default = py(
        &host,
        KEY_A,
        &["profile-bare", "-", "desktop-commander", "read_file", read],
    );
    assert_eq!(default["is_error"], false, "{default}");
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert!(
        default["text"]
            .as_str()
            .unwrap_or_default()
            .contains(hostname.trim()),
        "{default}"
    );
}
