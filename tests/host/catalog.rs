//! Discovery catalogs through `sandbox-host`, as a benchmark's client meets
//! a lazy sandbox: every server listed one after another, with the
//! official MCP SDKs 1.x and 2.x. The listing starts no server (the slot's
//! process list says so), what the catalog answers is what the started
//! server answers (field for field, every page, both SDKs), a call in the
//! same session after a catalog-served listing reaches the started
//! server, and a catalog whose key no longer matches is not used. The live
//! listings are also held to the servers' tool surfaces
//! (tests/common/tool_surface.rs): the one place every catalogued server
//! of ALL is listed live under every profile (the agent's `tool_schemas`
//! lists the others).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use crate::common::host::{Host, KEY_A, acquire, metric, process_tree, wait_metric};
use crate::common::mcp::servers_dir;
use crate::common::tool_surface::{self, UNCATALOGUED};

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/discovery.py");
const RECORDING: &str = "sandbox_host_discovery_recording";
/// A tool no server has: calling it starts the server, whose error
/// answer proves the session reached it.
const NO_SUCH_TOOL: &str = "sandbox-test-no-such-tool";

/// The tests' catalogs, recorded once per build (a host with `--catalogs
/// record` over the shared directory, until `/metrics` says the recording
/// ended; the short benches' recorder then finds them made).
fn recorded() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let catalogs = crate::common::bins::shared_catalog_dir();
        let _one_recorder = crate::common::bins::catalog_recording_lock(&catalogs);
        let root = tempfile::Builder::new()
            .prefix("sandbox-suite-recorder")
            .tempdir()
            .expect("tempdir")
            .keep();
        let host = Host::start(
            &root,
            &[
                "--catalogs",
                "record",
                "--catalog-dir",
                &catalogs.display().to_string(),
            ],
        );
        wait_metric(&host, RECORDING, 0.0, Duration::from_secs(900));
        let held = metric(&host, "sandbox_host_discovery_catalogs");
        assert!(held >= 20.0, "only {held} catalogs recorded");
        catalogs
    })
}

/// A lazy host answering from the recorded catalogs.
fn host_with_catalogs(dir: &Path, extra: &[&str]) -> Host {
    let catalogs = recorded().display().to_string();
    let mut args = vec!["--catalogs", "use", "--catalog-dir", &catalogs];
    args.extend_from_slice(extra);
    Host::start(dir, &args)
}

/// Every server of an Acquire of ALL under `benchmark`: (name, URL).
fn acquire_all(host: &Host, benchmark: Option<&str>) -> Vec<(String, String)> {
    acquire_named(host, benchmark, &serde_json::json!("ALL"))
}

/// The servers of an Acquire of `names` under `benchmark`: (name, URL).
fn acquire_named(host: &Host, benchmark: Option<&str>, names: &Value) -> Vec<(String, String)> {
    let mut body = serde_json::json!({ "server_names": names });
    if let Some(b) = benchmark {
        body["benchmark"] = b.into();
    }
    let a = acquire(host, KEY_A, &body.to_string());
    a["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|s| {
            let name = s["server_name"].as_str().expect("name").to_owned();
            let url = s["mcp_server_url"].as_str().expect("url").to_owned();
            (name, url)
        })
        .collect()
}

/// One SDK's discovery of `servers` as tool_surface reads a listing:
/// server → tool → inputSchema (every page), or the listing's error.
fn schemas_of(discovered: &Value, servers: &[(String, String)]) -> Value {
    let mut out = serde_json::Map::new();
    for (name, url) in servers {
        let listing = &discovered[url]["tools"];
        let Some(pages) = listing.as_array() else {
            out.insert(name.clone(), serde_json::json!({ "error": listing }));
            continue;
        };
        let tools = pages
            .iter()
            .flat_map(|p| p["tools"].as_array().into_iter().flatten())
            .map(|t| {
                (
                    t["name"].as_str().unwrap_or("").to_owned(),
                    t["inputSchema"].clone(),
                )
            })
            .collect();
        out.insert(name.clone(), Value::Object(tools));
    }
    Value::Object(out)
}

/// `discovery.py` under SDK 1.x (`python3`) or 2.x (the mcp2 venv).
fn discover(sdk2: bool, targets: &[String]) -> Value {
    let python = if sdk2 {
        crate::common::mcp::mcp2_python()
    } else {
        "python3".to_owned()
    };
    let out = Command::new(&python)
        .arg(CLIENT)
        .args(targets)
        .output()
        .unwrap_or_else(|e| panic!("{python}: {e} (.ci/test-all.sh installs the clients)"));
    assert!(
        out.status.success(),
        "discovery.py ({python}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("discovery.py's JSON")
}

/// The command lines of the MCP servers running in the host's slots (the
/// mail service an Acquire starts for a mail server is not one).
fn server_processes(host: &Host) -> Vec<String> {
    let install = servers_dir();
    host.agents()
        .into_iter()
        .flat_map(process_tree)
        .filter_map(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&install) && !c.contains("sandbox-mail serve"))
        .collect()
}

/// Under `benchmark`: every catalogued server of ALL listed one after
/// another through its catalog (both SDKs) starts nothing; then a call in
/// the same session starts it and is answered by it; then the started
/// server's own listing equals the catalog's, field for field.
fn catalog_answers_as_the_server(benchmark: Option<&str>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host_with_catalogs(dir.path(), &[]);
    let servers: Vec<(String, String)> = acquire_all(&host, benchmark)
        .into_iter()
        .filter(|(n, _)| !UNCATALOGUED.contains(&n.as_str()))
        .collect();
    assert!(servers.len() >= 10, "{servers:?}");
    let urls: Vec<String> = servers.iter().map(|(_, u)| u.clone()).collect();
    let by_catalog = [discover(false, &urls), discover(true, &urls)];
    let running = server_processes(&host);
    assert!(
        running.is_empty(),
        "listing {} servers through their catalogs started: {running:?}",
        urls.len()
    );
    // In one session: the listing (still the catalog's), then a call.
    let calls: Vec<String> = urls.iter().map(|u| format!("{u}|{NO_SUCH_TOOL}")).collect();
    let called = discover(false, &calls);
    for (name, url) in &servers {
        let c = &called[url];
        assert_eq!(c["tools"], by_catalog[0][url]["tools"], "{name}: {c}");
        // The server's own answer to a tool it lacks: an error result, or
        // a JSON-RPC error the SDK raises; never a transport failure.
        let call = &c["call"];
        let answered = call.get("is_error").is_some()
            || call["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("McpError"));
        assert!(
            answered,
            "{name}: the call after the catalog's listing was not answered by the server: {call}"
        );
    }
    assert!(
        server_processes(&host).len() >= servers.len(),
        "the calls started the servers: {:?}",
        server_processes(&host)
    );
    let live = [discover(false, &urls), discover(true, &urls)];
    let profile = benchmark.unwrap_or("default");
    let pins = tool_surface::load();
    let mut problems = Vec::new();
    let listed = |s: &str| servers.iter().any(|(n, _)| n == s);
    let sdk1 = schemas_of(&live[0], &servers);
    tool_surface::surface_problems("SDK 1.x", &pins, profile, &sdk1, listed, &mut problems);
    let sdk2 = schemas_of(&live[1], &servers);
    tool_surface::schema_problems("SDK 2.x", profile, &sdk2, &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for (sdk, (cat, live)) in by_catalog.iter().zip(&live).enumerate() {
        for (name, url) in &servers {
            assert!(
                cat[url].get("error").is_none() && cat[url]["init"].is_object(),
                "{name} (SDK {}.x): {}",
                sdk + 1,
                cat[url]
            );
            assert_eq!(
                cat[url],
                live[url],
                "{name} under {benchmark:?}, SDK {}.x: the catalog's discovery differs from the server's",
                sdk + 1
            );
        }
    }
}

#[test]
fn the_catalog_answers_as_the_server_would_without_starting_it() {
    catalog_answers_as_the_server(None);
}

#[test]
fn mcp_atlas_profile_catalogs_answer_as_its_servers() {
    catalog_answers_as_the_server(Some("MCP_Atlas"));
}

#[test]
fn toolathlon_profile_catalogs_answer_as_its_servers() {
    catalog_answers_as_the_server(Some("Toolathlon"));
}

#[test]
fn mcp_mark_profile_catalogs_answer_as_its_servers() {
    catalog_answers_as_the_server(Some("MCP_Mark"));
}

/// A fresh host recording its catalogs serves only once they are made:
/// right after its start (its base URL printed), an Acquire's discovery is
/// answered from them, nothing started. Before, the host served at once and
/// recorded beside: a benchmark's first discovery started every server. A
/// manifest of the filesystem server alone keeps the recording short.
#[test]
fn a_fresh_host_answers_its_first_discovery_from_catalogs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut manifest: toml::Table =
        crate::common::mcp::shipped_manifest(Path::new("${state_root}"))
            .parse()
            .expect("packaging/servers.toml");
    let servers = manifest["servers"].as_table_mut().expect("[servers]");
    servers.retain(|name, _| name == "filesystem");
    std::fs::write(dir.path().join("servers.toml"), manifest.to_string()).expect("manifest");
    let catalogs = dir.path().join("catalogs").display().to_string();
    let host = Host::start(
        dir.path(),
        &[
            "--catalogs",
            "record",
            "--catalog-dir",
            &catalogs,
            "--server-start",
            "lazy",
        ],
    );
    assert_eq!(
        metric(&host, RECORDING),
        0.0,
        "still recording once serving"
    );
    for benchmark in [None, Some("MCP_Atlas")] {
        let servers = acquire_named(&host, benchmark, &serde_json::json!(["filesystem"]));
        let urls: Vec<String> = servers.iter().map(|(_, u)| u.clone()).collect();
        let listed = discover(false, &urls);
        let tools = &listed[&urls[0]]["tools"];
        assert!(tools.is_array(), "{benchmark:?}: {listed}");
        let running = server_processes(&host);
        assert!(
            running.is_empty(),
            "{benchmark:?}: the first discovery after the start started {running:?}"
        );
    }
}

/// A new version of a server (the manifest says so) makes its catalog's
/// key stale: listing it starts it; an unchanged server's does not.
#[test]
fn a_catalog_whose_key_no_longer_matches_is_not_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = crate::common::mcp::shipped_manifest(Path::new("${state_root}"));
    let old = r#"version = "2026.8.31""#;
    assert!(
        manifest.contains(old),
        "the filesystem server's version moved"
    );
    std::fs::write(
        dir.path().join("servers.toml"),
        manifest.replace(old, r#"version = "2026.8.32""#),
    )
    .expect("manifest");
    let host = host_with_catalogs(dir.path(), &[]);
    let servers = acquire_all(&host, None);
    let url = |n: &str| {
        servers
            .iter()
            .find(|(s, _)| s == n)
            .map(|(_, u)| u.clone())
            .expect(n)
    };
    discover(false, &[url("git")]);
    let running = server_processes(&host);
    assert!(
        running.is_empty(),
        "git's catalog still matches: {running:?}"
    );
    let fs = discover(false, &[url("filesystem")]);
    assert!(fs[url("filesystem")]["tools"].is_array(), "{fs}");
    let running = server_processes(&host);
    assert!(
        running.iter().any(|c| c.contains("server-filesystem")),
        "a stale catalog answered filesystem's discovery: {running:?}"
    );
}

/// Each running agent of the host with its peak resident memory (VmHWM,
/// bytes).
fn agents_peak(host: &Host) -> Vec<(i32, u64)> {
    host.agents()
        .into_iter()
        .filter(|p| std::fs::metadata(format!("/proc/{p}")).is_ok())
        .map(|p| (p, crate::common::peak_rss(p as u32)))
        .collect()
}

/// The most any agent running at both times grew its peak (one that
/// started meanwhile, a pool refill, is not a growth).
fn most_grown(before: &[(i32, u64)], after: &[(i32, u64)]) -> u64 {
    after
        .iter()
        .filter_map(|(p, a)| {
            let b = before.iter().find(|(q, _)| q == p)?.1;
            Some(a.saturating_sub(b))
        })
        .max()
        .unwrap_or(0)
}

/// POSTs `body` to `url` as a streamable-HTTP client would: (status, body).
fn post_mcp(url: &str, body: &str, scratch: &Path) -> (u16, String) {
    let file = scratch.join("body.json");
    std::fs::write(&file, body).expect("body");
    let out = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", "POST"])
        .args(["-H", "content-type: application/json"])
        .args(["-H", "accept: application/json, text/event-stream"])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(url)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.trim().parse().expect("status"), body.to_owned())
}

/// Issue 50: one POST of 10,000 `tools/list` to an idle server's URL
/// (answered from its catalog, inside the sandbox's PID 1) is refused
/// whole, 400 naming `gateway.max_batch_messages`, before any answer is
/// made; the sandbox serves on. A batch at the limit (100) of
/// desktop-commander's listing, its largest, is answered whole from the
/// catalog (nothing starts), each answer made and serialized before the
/// next, and the serving agent's peak memory grows by less than 100 parsed
/// listings would take (the old path held a parsed copy of each: 348 MiB
/// for 1,000).
#[test]
fn a_batch_of_ten_thousand_listings_is_refused_and_one_at_the_limit_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host_with_catalogs(dir.path(), &[]);
    let url = acquire_all(&host, None)
        .into_iter()
        .find(|(n, _)| n == "desktop-commander")
        .map(|(_, u)| u)
        .expect("desktop-commander is served");
    let (code, one) = post_mcp(&url, &crate::common::rpc_batch(1, "tools/list"), dir.path());
    assert_eq!(code, 200, "{one}");
    assert!(
        one.len() > 20_000,
        "desktop-commander's listing: {} bytes",
        one.len()
    );
    let before = agents_peak(&host);

    let (code, body) = post_mcp(
        &url,
        &crate::common::rpc_batch(10_000, "tools/list"),
        dir.path(),
    );
    assert_eq!(code, 400, "{}", &body[..body.len().min(300)]);
    assert!(body.contains("gateway.max_batch_messages = 100"), "{body}");

    let (code, body) = post_mcp(
        &url,
        &crate::common::rpc_batch(100, "tools/list"),
        dir.path(),
    );
    assert_eq!(code, 200, "{}", &body[..body.len().min(300)]);
    let answers: Vec<Value> = serde_json::from_str(&body).expect("a batch answer");
    assert_eq!(answers.len(), 100);
    for a in &answers {
        assert!(
            a["result"]["tools"]
                .as_array()
                .is_some_and(|t| !t.is_empty()),
            "{a}"
        );
    }
    let grown = most_grown(&before, &agents_peak(&host));
    assert!(grown < 32 << 20, "an agent's peak RSS grew {grown} bytes");
    let running = server_processes(&host);
    assert!(
        running.is_empty(),
        "the catalog's listing started {running:?}"
    );
    // The sandbox serves on.
    let (code, one) = post_mcp(&url, &crate::common::rpc_batch(1, "tools/list"), dir.path());
    assert_eq!(code, 200, "{one}");
}
