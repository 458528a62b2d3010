//! Each benchmark's start of a task as its Klavis integration runs it,
//! timed step by step:
//! - MCP_Atlas (zihaolin96/mcp-atlas `klavis_sandbox_client.py`):
//!   `POST /sandbox/local_dev` with `{"benchmark": "MCP_Atlas"}`, then every
//!   server's tools listed one after another, each in a new session
//!   (initialize, initialized, tools/list, DELETE), then every tool call in
//!   a new session (initialize, initialized, tools/call, DELETE);
//! - Toolathlon (`utils/app_specific/local_dev`, `utils/mcp/tool_servers.py`):
//!   `POST /sandbox/local_dev` with `{"benchmark": "Toolathlon"}`, the task's
//!   workspace uploaded (upload-url, PUT, initialize), a session per server
//!   of the task opened, all at once (`connect_servers` gathers them), each
//!   listed in turn (openai-agents lists server by server), all kept for
//!   the task's calls;
//! - MCP_Mark (`src/klavis_util.py`, `src/agents/mcp/http_server.py`):
//!   `POST /local-sandbox` with its one server, `benchmark` and
//!   `ttl_seconds`, the workspace uploaded, one session listed and kept for
//!   the calls;
//! - the first call: on a fresh lazy sandbox, each server's first session
//!   goes straight to one harmless call, without listing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};

use super::mcp::{self, Session, Timed, within};
use crate::host::{api, call};

/// How long a step of the sequential cases may take before the bench
/// fails (their clients allow 30–300 s; a hang is a bug here).
pub const SEQ: Duration = Duration::from_secs(120);

/// Each step's samples (ms), in the order first seen.
#[derive(Default)]
pub struct Steps(pub Vec<(String, Vec<f64>)>);

impl Steps {
    pub fn add(&mut self, step: &str, ms: f64) {
        match self.0.iter_mut().find(|(s, _)| s == step) {
            Some((_, v)) => v.push(ms),
            None => self.0.push((step.to_owned(), vec![ms])),
        }
    }

    pub fn median(&self, step: &str) -> Option<f64> {
        let (_, v) = self.0.iter().find(|(s, _)| s == step)?;
        let mut v = v.clone();
        Some(crate::host::median(&mut v))
    }
}

/// Milliseconds since `t`.
pub fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// MCP_Atlas's three calls of a task: filesystem, terminal and a cheap
/// third (server, tool, arguments); MCP_Atlas's profile roots them at /data.
pub const ATLAS_CALLS: [(&str, &str, &str); 3] = [
    ("filesystem", "list_directory", r#"{"path": "/data"}"#),
    ("terminal", "run_command", r#"{"command": "ls /data"}"#),
    (
        "code-runner",
        "run-code",
        r#"{"code": "console.log(6 * 7)", "languageId": "javascript"}"#,
    ),
];

/// A `local_dev` sandbox: its id and its servers' URLs (by name, sorted).
pub struct LocalDev {
    pub id: String,
    pub urls: Vec<(String, String)>,
}

impl LocalDev {
    pub fn url(&self, server: &str) -> &str {
        self.urls
            .iter()
            .find(|(n, _)| n == server)
            .map(|(_, u)| u.as_str())
            .unwrap_or_else(|| panic!("local_dev has no {server}: {:?}", self.urls))
    }
}

/// `POST /sandbox/local_dev`, with `benchmark` when given.
pub async fn acquire_local_dev(base: &str, bench: Option<&str>, d: Duration) -> Timed<LocalDev> {
    let body = bench.map_or(json!({}), |b| json!({"benchmark": b}));
    let url = format!("{base}/sandbox/local_dev");
    let a = within(
        d,
        "POST /sandbox/local_dev",
        api("POST", &url, &body.to_string()),
    )
    .await?;
    let urls = a["server_urls"]
        .as_object()
        .unwrap_or_else(|| panic!("no server_urls: {a}"))
        .iter()
        .map(|(n, u)| (n.clone(), u.as_str().expect("URL").to_owned()))
        .collect();
    Ok(LocalDev {
        id: a["sandbox_id"].as_str().expect("sandbox_id").to_owned(),
        urls,
    })
}

pub async fn release_local_dev(base: &str, id: &str) {
    api("DELETE", &format!("{base}/sandbox/local_dev/{id}"), "").await;
}

/// MCP_Atlas's discovery: every server listed in a session of its own,
/// one after another.
pub async fn atlas_discovery(ld: &LocalDev, steps: &mut Steps, d: Duration) -> Timed<()> {
    let all = Instant::now();
    for (name, url) in &ld.urls {
        let t = Instant::now();
        mcp::list_once(url, d).await?;
        steps.add(&format!("discovery: {name}"), ms(t));
    }
    let n = ld.urls.len();
    steps.add(&format!("discovery: all {n}, one by one"), ms(all));
    Ok(())
}

/// MCP_Atlas's calls, each in a session of its own.
pub async fn atlas_calls(ld: &LocalDev, steps: &mut Steps, d: Duration) -> Timed<()> {
    for (server, tool, args) in ATLAS_CALLS {
        let args: Value = serde_json::from_str(args).expect("arguments");
        let t = Instant::now();
        mcp::call_once(ld.url(server), tool, &args, d).await?;
        steps.add(&format!("call: {server} `{tool}`"), ms(t));
    }
    Ok(())
}

/// A one-page PDF with a correct cross-reference table.
fn tiny_pdf() -> Vec<u8> {
    let objs = [
        "<</Type/Catalog/Pages 2 0 R>>",
        "<</Type/Pages/Kids[3 0 R]/Count 1>>",
        "<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>",
    ];
    let mut out = String::from("%PDF-1.4\n");
    let mut offsets = Vec::new();
    for (i, o) in objs.iter().enumerate() {
        offsets.push(out.len());
        out += &format!("{} 0 obj\n{o}\nendobj\n", i + 1);
    }
    let xref = out.len();
    out += &format!("xref\n0 {}\n0000000000 65535 f \n", objs.len() + 1);
    for off in offsets {
        out += &format!("{off:010} 00000 n \n");
    }
    out += &format!(
        "trailer\n<</Size {}/Root 1 0 R>>\nstartxref\n{xref}\n%%EOF\n",
        objs.len() + 1
    );
    out.into_bytes()
}

/// A task's small workspace as a tar.gz: files only (Toolathlon), or
/// under `./` with the directory's own entry (MCP_Mark's `arcname=".")`.
fn workspace(dot: bool) -> Bytes {
    let mut t = tar::Builder::new(Vec::new());
    let prefix = if dot { "./" } else { "" };
    if dot {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        h.set_cksum();
        t.append_data(&mut h, "./", std::io::empty()).expect("tar");
    }
    let notes = b"# Notes\n- item 1\n- item 2\n".to_vec();
    let csv = b"name,visits\nAnn,3\nBob,5\n".to_vec();
    for (name, data) in [
        ("notes.md", notes),
        ("visits.csv", csv),
        ("report.pdf", tiny_pdf()),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        t.append_data(&mut h, format!("{prefix}{name}"), &data[..])
            .expect("tar");
    }
    let tar = t.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar).expect("gzip");
    Bytes::from(gz.finish().expect("gzip"))
}

/// upload-url, PUT of the archive, initialize (`api`: `sandbox/local_dev`
/// or `local-sandbox`).
async fn upload(base: &str, api_path: &str, id: &str, tgz: Bytes) {
    let u = api("POST", &format!("{base}/{api_path}/{id}/upload-url"), "").await;
    let put = u["upload_url"].as_str().expect("upload_url");
    let (s, b) = call("PUT", put, false, tgz, false).await;
    assert_eq!(s, 200, "PUT: {}", String::from_utf8_lossy(&b));
    api("POST", &format!("{base}/{api_path}/{id}/initialize"), "").await;
}

/// Toolathlon's task servers (its names for them in local_dev).
pub const TOOLATHLON_SERVERS: [&str; 4] = ["filesystem", "terminal", "excel", "pdf-tools"];
const TOOLATHLON_CALLS: [(&str, &str, &str); 4] = [
    ("filesystem", "read_file", r#"{"path": "/data/notes.md"}"#),
    ("terminal", "run_command", r#"{"command": "ls"}"#),
    (
        "excel",
        "create_workbook",
        r#"{"filepath": "/data/out.xlsx"}"#,
    ),
    (
        "pdf-tools",
        "get_pdf_info",
        r#"{"pdf_file_path": "/data/report.pdf"}"#,
    ),
];

/// Toolathlon's start of a task, once.
pub async fn toolathlon(base: &str, steps: &mut Steps) {
    let t0 = Instant::now();
    let ld = acquire_local_dev(base, Some("Toolathlon"), SEQ)
        .await
        .expect("acquire");
    steps.add("acquire `POST /sandbox/local_dev`", ms(t0));
    let t = Instant::now();
    upload(base, "sandbox/local_dev", &ld.id, workspace(false)).await;
    steps.add("workspace: upload-url, PUT, initialize", ms(t));
    // `connect_servers` connects every server at once; the agent then
    // lists each one's tools in turn (openai-agents), in the kept sessions.
    let all = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for name in TOOLATHLON_SERVERS {
        let url = ld.url(name).to_owned();
        set.spawn(async move {
            let mut s = Session::new(&url, SEQ);
            s.initialize().await.expect("initialize");
            (name, s)
        });
    }
    let mut sessions = HashMap::new();
    while let Some(r) = set.join_next().await {
        let (name, s) = r.expect("a handshake");
        sessions.insert(name, s);
    }
    let n = TOOLATHLON_SERVERS.len();
    steps.add(&format!("discovery: {n} handshakes at once"), ms(all));
    for name in TOOLATHLON_SERVERS {
        let t = Instant::now();
        let s = sessions.get_mut(name).expect("session");
        s.list_tools().await.expect("tools/list");
        steps.add(&format!("discovery: tools/list of {name}"), ms(t));
    }
    steps.add(&format!("discovery: all {n}"), ms(all));
    for (server, tool, args) in TOOLATHLON_CALLS {
        let args: Value = serde_json::from_str(args).expect("arguments");
        let t = Instant::now();
        let s = sessions.get_mut(server).expect("session");
        s.call(tool, &args).await.expect("call");
        steps.add(&format!("call: {server} `{tool}`"), ms(t));
    }
    steps.add("total", ms(t0));
    for (_, s) in sessions {
        s.close().await.expect("DELETE");
    }
    release_local_dev(base, &ld.id).await;
}

const MARK_CALLS: [(&str, &str); 3] = [
    ("list_directory", r#"{"path": "/data"}"#),
    ("read_text_file", r#"{"path": "/data/notes.md"}"#),
    ("get_file_info", r#"{"path": "/data/visits.csv"}"#),
];

/// MCP_Mark's start of a filesystem task, once.
pub async fn mark(base: &str, steps: &mut Steps) {
    let t0 = Instant::now();
    let body =
        json!({"server_names": ["filesystem"], "benchmark": "MCP_Mark", "ttl_seconds": 7200});
    let a = api("POST", &format!("{base}/local-sandbox"), &body.to_string()).await;
    steps.add("acquire `POST /local-sandbox` (filesystem)", ms(t0));
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    let url = a["servers"][0]["mcp_server_url"]
        .as_str()
        .unwrap_or_else(|| panic!("no MCP URL: {a}"))
        .to_owned();
    let t = Instant::now();
    upload(base, "local-sandbox", &id, workspace(true)).await;
    steps.add("workspace: upload-url, PUT, initialize", ms(t));
    let t = Instant::now();
    let mut s = Session::new(&url, SEQ);
    s.initialize().await.expect("initialize");
    s.list_tools().await.expect("tools/list");
    steps.add("discovery: filesystem", ms(t));
    for (tool, args) in MARK_CALLS {
        let args: Value = serde_json::from_str(args).expect("arguments");
        let t = Instant::now();
        s.call(tool, &args).await.expect("call");
        steps.add(&format!("call: filesystem `{tool}`"), ms(t));
    }
    steps.add("total", ms(t0));
    s.close().await.expect("DELETE");
    api("DELETE", &format!("{base}/local-sandbox/{id}"), "").await;
}

/// A harmless call per `local_dev` server under MCP_Atlas's profile
/// (its /data, a stand-in repository for git).
pub fn first_calls(repo: &str) -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("arxiv", "list_papers", json!({})),
        (
            "code-executor",
            "execute_code",
            json!({"code": "print(6 * 7)"}),
        ),
        (
            "code-runner",
            "run-code",
            json!({"code": "console.log(6 * 7)", "languageId": "javascript"}),
        ),
        (
            "desktop-commander",
            "list_directory",
            json!({"path": "/data"}),
        ),
        (
            "excel",
            "create_workbook",
            json!({"path": "/data/first.xlsx"}),
        ),
        ("filesystem", "list_allowed_directories", json!({})),
        ("git", "git_status", json!({"repo_path": repo})),
        (
            "pdf-tools",
            "get_pdf_info",
            json!({"pdf_file_path": "/data/none.pdf"}),
        ),
        ("powerpoint", "create_presentation", json!({})),
        ("terminal", "run_command", json!({"command": "ls"})),
        (
            "word",
            "create_document",
            json!({"filename": "/data/first.docx"}),
        ),
    ]
}

/// The first call of every server of a fresh `local_dev` (MCP_Atlas):
/// each a new session (initialize, initialized, tools/call, DELETE), one
/// server after another; per server the session and the call alone.
pub async fn first_call(base: &str, repo: &str, steps: &mut Steps) {
    let ld = acquire_local_dev(base, Some("MCP_Atlas"), SEQ)
        .await
        .expect("acquire");
    for (server, tool, args) in first_calls(repo) {
        let t = Instant::now();
        let mut s = Session::new(ld.url(server), SEQ);
        s.initialize().await.expect("initialize");
        let c = Instant::now();
        s.call(tool, &args).await.expect("call");
        let (whole, alone) = (ms(t), ms(c));
        s.close().await.expect("DELETE");
        steps.add(&format!("{server} `{tool}`"), whole);
        steps.add(&format!("{server} `{tool}` (the call alone)"), alone);
    }
    release_local_dev(base, &ld.id).await;
}
