//! Benchmark profiles through sandbox-host, as Klavis's clients use them:
//! `benchmark` at Acquire changes what packaging/servers.toml says it
//! changes (the official MCP client on the mcp_server_url, the dump through
//! its signed URL), and `ALL` starts every server that can run here.

use serde_json::{Value, json};

use crate::common::bench_data::{atlas, atlas_source};
use crate::common::host::{Host, KEY_A, acquire, py, release, server_names};

/// MCP_Atlas's terminal runs only `ls`, `cat` and `find`, without flags
/// (Klavis's MCP_Atlas integration: `ALLOWED_FLAGS=""`, an empty list in
/// `show_security_rules`, as the recorded trajectories show); by default
/// the same command runs.
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
    let calls = json!([
        ["terminal", "run_command", {"command": "ls"}],
        ["terminal", "run_command", {"command": "ls -a"}],
        ["terminal", "show_security_rules", {}],
    ]);
    let t = py(&host, KEY_A, &["calls", "MCP_Atlas", &calls.to_string()]);
    let text = |i: usize| t["results"][i]["text"].as_str().unwrap_or_default();
    assert_eq!(t["results"][0]["is_error"], false, "{t}");
    assert!(text(0).contains("return code: 0"), "{t}");
    assert!(text(1).contains("Flag '-a' is not allowed"), "{t}");
    assert!(
        text(2).contains("Allowed Commands:\n----------------\ncat, find, ls\n")
            && text(2).contains("Allowed Flags:\n-------------\n\n"),
        "{t}"
    );
}

/// Toolathlon's terminal (configs/mcp_servers/terminal.yaml): 59 commands,
/// every flag, shell operators, 2048-byte commands, 60 s, at `/data`.
const TOOLATHLON_COMMANDS: &str = "ls cat pwd echo cd mkdir touch rm cp mv find grep head tail wc \
    sort uniq diff tree chmod stat file which whoami date hostname df du ps env history clear sed \
    awk cut tr basename dirname realpath md5sum sha256sum tar gzip gunzip zip unzip less more \
    python wget curl ping netstat ifconfig nslookup traceroute helm kubectl git";

/// Under Toolathlon the terminal has Toolathlon's rules: its 59 commands
/// (sha256sum and pipes run; python3, not in the list, does not), by
/// default every command.
#[test]
fn toolathlon_terminal_has_its_rules() {
    let mut commands: Vec<&str> = TOOLATHLON_COMMANDS.split_whitespace().collect();
    assert_eq!(commands.len(), 59);
    commands.sort_unstable();
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let calls = json!([
        ["terminal", "show_security_rules", {}],
        ["terminal", "run_command", {"command": "echo toolathlon | sha256sum | cut -c1-16"}],
        ["terminal", "run_command", {"command": "python3 --version"}],
        ["terminal", "run_command", {"command": "touch /data/t.txt && wc -c t.txt"}],
    ]);
    let t = py(&host, KEY_A, &["calls", "Toolathlon", &calls.to_string()]);
    let text = |i: usize| t["results"][i]["text"].as_str().unwrap_or_default();
    let rules = text(0);
    assert!(
        rules.contains(&format!(
            "Allowed Commands:\n----------------\n{}\n",
            commands.join(", ")
        )),
        "{rules}"
    );
    // (The working directory reads /workspace here: /data is a symlink to
    // it in the process backend, and the server resolves it.)
    for want in [
        "All flags allowed",
        "Max Command Length: 2048 characters",
        "Command Timeout: 60 seconds",
    ] {
        assert!(rules.contains(want), "{want}: {rules}");
    }
    // sha256("toolathlon\n")
    assert_eq!(
        text(1),
        "00af91157f1269fb\n\nCommand completed with return code: 0",
        "{t}"
    );
    assert!(text(2).contains("'python3' is not allowed"), "{t}");
    assert_eq!(
        text(3),
        "0 t.txt\n\nCommand completed with return code: 0",
        "{t}"
    );

    let plain = py(&host, KEY_A, &["calls", "-", &calls.to_string()]);
    let rules = plain["results"][0]["text"].as_str().unwrap_or_default();
    assert!(rules.contains("All commands allowed"), "{plain}");
    assert_eq!(plain["results"][2]["is_error"], false, "{plain}");
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
/// benchmark's real data (installed by packaging/install-benchmark-data.sh
/// against the committed pins, its repositories from local stand-ins), at
/// `/data` for the filesystem, terminal and git servers, byte for byte; its
/// memory server starts with the 41 entities and 55 relations of the graph;
/// its dump is the tree MCP_Atlas's Dockerfile builds (`atlas_tree`).
#[test]
fn mcp_atlas_comes_with_its_data() {
    let src = atlas_source();
    if !crate::common::have_or_skip(
        src.is_some(),
        "MCP_Atlas's data check",
        "MCP_Atlas's real data (set SANDBOX_AGENT_BENCHMARK_DATA to the directory holding MCP_Atlas/data)",
    ) {
        return;
    }
    let Some(src) = src else { return };
    let csv = std::fs::read_to_string(src.join("Barber Shop.csv")).expect("Barber Shop.csv");
    assert!(
        !csv.ends_with('\n'),
        "the CSV as published, no trailing newline"
    );
    let graph = std::fs::read_to_string(src.join("repos/memory_mcp_server/memories-for-mcp.json"))
        .expect("memory graph");
    let repos = &atlas().repos;
    assert_eq!(repos.len(), 8);
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);

    let mut calls = vec![
        json!(["filesystem", "read_text_file", {"path": "/data/Barber Shop.csv"}]),
        json!(["filesystem", "list_directory", {"path": "/data/repos"}]),
        json!(["terminal", "run_command", {"command": "cat '/data/Barber Shop.csv'"}]),
        json!(["localmemory", "read_graph", {}]),
    ];
    for r in repos {
        calls.push(json!(["git", "git_status", {"repo_path": r.path}]));
        calls.push(json!(["git", "git_log", {"repo_path": r.path, "max_count": 10}]));
        calls.push(json!(["git", "git_show", {"repo_path": r.path, "revision": r.commits[2]}]));
    }
    let out = py(
        &host,
        KEY_A,
        &["calls", "MCP_Atlas", &Value::from(calls).to_string()],
    );
    let res = out["results"].as_array().expect("results");
    let text = |i: usize| res[i]["text"].as_str().unwrap_or_default();
    assert!(
        res.iter().all(|r| r["is_error"] == false),
        "every call answers: {out}"
    );
    assert_eq!(text(0), csv, "read_text_file: the CSV byte for byte");
    for r in repos {
        let name = r.path.rsplit('/').next().expect("name");
        assert!(text(1).contains(&format!("[DIR] {name}")), "{}", text(1));
    }
    assert_eq!(
        text(2),
        format!("{csv}\nCommand completed with return code: 0"),
        "the terminal's cat"
    );
    let read: Value = serde_json::from_str(text(3)).expect("read_graph JSON");
    let names = |v: &Value| -> Vec<String> {
        let mut n: Vec<String> = v["entities"]
            .as_array()
            .expect("entities")
            .iter()
            .map(|e| e["name"].as_str().expect("name").to_owned())
            .collect();
        n.sort();
        n
    };
    assert_eq!(
        read["entities"].as_array().map(Vec::len),
        Some(41),
        "{read}"
    );
    assert_eq!(
        read["relations"].as_array().map(Vec::len),
        Some(55),
        "{read}"
    );
    let published: Vec<Value> = graph
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSONL line"))
        .collect();
    let entities: Vec<&Value> = published.iter().filter(|v| v["type"] == "entity").collect();
    assert_eq!(names(&json!({ "entities": entities })), names(&read));
    for (i, r) in repos.iter().enumerate() {
        let (status, log, show) = (text(4 + 3 * i), text(5 + 3 * i), text(6 + 3 * i));
        // Detached at the pin, as `git clone URL; git checkout SHA` leaves it.
        assert!(
            status.contains(&format!("HEAD detached at {}", &r.pin()[..7])),
            "{}: {status}",
            r.path
        );
        // The full history up to the pin...
        assert!(
            log.contains(r.pin()) && log.contains(&r.commits[0]) && !log.contains(&r.commits[2]),
            "{}: {log}",
            r.path
        );
        // ...and the default branch's commits after it.
        assert!(show.contains("after the pin"), "{}: {show}", r.path);
    }
    // The dump carries the data as installed: the whole tree as MCP_Atlas's
    // Dockerfile makes it (atlas_tree: its venv's packages linked).
    crate::atlas_tree::check(&out["entries"], &atlas().src, repos);
    assert_eq!(out["files"]["./Barber Shop.csv"], csv.as_str(), "the dump");
    assert_eq!(
        out["files"]["./repos/memory_mcp_server/memories-for-mcp.json"],
        graph.as_str(),
        "the dump"
    );

    // Without the benchmark, none of it.
    let plain = py(
        &host,
        KEY_A,
        &["profile-bare", "-", "localmemory", "read_graph", "{}"],
    );
    let first = entities[0]["name"].as_str().expect("name");
    assert!(
        !plain["text"].as_str().unwrap_or_default().contains(first),
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
