//! The MCP data plane, driven by the official Python MCP SDK client
//! (streamable HTTP) against real servers (filesystem, memory, git) behind
//! the real agent, and by curl for raw HTTP checks.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common::mcp::*;
use crate::common::*;
use sandbox_client::proto;

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/mcp_client.py");
const TS_CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/node/mcp_client.mjs"
);
const SLOW: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/features_server.py"
);

fn python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    text(&out.stdout).trim().to_owned()
}

/// Runs the SDK client over the agent's data-plane unix socket.
fn sdk(agent: &Agent, args: &[&str]) -> serde_json::Value {
    let sock = agent.mcp_socket().display().to_string();
    let mut a = vec![CLIENT, "--uds", &sock];
    a.extend_from_slice(args);
    let out = Command::new("python3").args(&a).output().expect("python3");
    parse(&out, agent)
}

fn parse(out: &Output, agent: &Agent) -> serde_json::Value {
    assert!(
        out.status.success(),
        "client failed: {}\nagent:\n{}",
        text(&out.stderr),
        agent.stderr.all()
    );
    serde_json::from_slice(&out.stdout).expect("client JSON")
}

async fn acquire(agent: &Agent, names: &[&str]) {
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    c.agent()
        .acquire(proto::AcquireRequest {
            lease_id: "gw".into(),
            server_names: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()));
}

fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl");
    let body = text(&out.stdout);
    let (body, code) = body.rsplit_once('\n').expect("status line");
    (code.parse().expect("status"), body.to_owned())
}

fn write_files(ws: &Path) {
    for i in 0..50 {
        std::fs::write(ws.join(format!("f{i}.txt")), format!("content {i}\n")).expect("write");
    }
}

#[tokio::test]
async fn sdk_client_lists_and_calls_real_servers() {
    let agent = agent_with("", "");
    acquire(&agent, &["filesystem", "git", "localmemory"]).await;
    let ws = agent.dir.path().join("ws");
    write_files(&ws);
    let v = sdk(&agent, &["filesystem", "tools"]);
    let tools: Vec<&str> = v["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert!(
        tools.contains(&"read_text_file") && tools.contains(&"write_file"),
        "{tools:?}"
    );
    let v = sdk(
        &agent,
        &[
            "filesystem",
            "call",
            "write_file",
            r#"{"path": "new.txt", "content": "via MCP"}"#,
        ],
    );
    assert_eq!(v["is_error"], false, "{v}");
    assert_eq!(
        std::fs::read_to_string(ws.join("new.txt")).expect("written"),
        "via MCP"
    );

    let repo = ws.join("repo");
    std::fs::create_dir(&repo).expect("repo dir");
    let git = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&repo)
        .status()
        .expect("git");
    assert!(git.success());
    std::fs::write(repo.join("hello.txt"), "hi").expect("write");
    as_tenant(&ws, &repo);
    let args = format!(r#"{{"repo_path": "{}"}}"#, repo.display());
    let v = sdk(&agent, &["git", "call", "git_status", &args]);
    assert_eq!(v["is_error"], false, "{v}");
    assert!(
        v["text"].as_str().expect("text").contains("hello.txt"),
        "{v}"
    );

    let v = sdk(&agent, &["localmemory", "tools"]);
    assert!(
        v["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .any(|t| t == "create_entities"),
        "{v}"
    );
}

#[tokio::test]
async fn concurrent_sessions_never_mix_up_answers() {
    let agent = agent_with("", "");
    acquire(&agent, &["filesystem"]).await;
    write_files(&agent.dir.path().join("ws"));
    let v = sdk(&agent, &["filesystem", "concurrent", "10", "20"]);
    assert_eq!(v["calls"], 200);
    assert_eq!(v["mismatches"], serde_json::json!([]), "{v}");
}

/// One server serves every session: what each of many one-call sessions
/// wrote is there at the end (64 sessions: the 200 this took before cost
/// 11 CPU-seconds and showed nothing more).
#[tokio::test]
async fn memory_survives_many_one_call_sessions() {
    let agent = agent_with("", "");
    acquire(&agent, &["localmemory"]).await;
    let v = sdk(&agent, &["localmemory", "memory-sessions", "64"]);
    assert_eq!(v["entities"], 64, "{v}");
}

#[tokio::test]
async fn a_killed_server_fails_the_call_then_comes_back() {
    let extra = format!(
        "[servers.slow]\ncommand = \"{}\"\nargs = [\"{SLOW}\"]\n",
        python()
    );
    let agent = agent_with(&extra, "");
    acquire(&agent, &["slow"]).await;
    let sock = agent.mcp_socket().display().to_string();
    // The server creates `started` once the call is in flight: killing it
    // earlier would test a restart, not a call whose server dies under it.
    let marks = tempfile::tempdir().expect("tempdir");
    // The server runs as the tenant: it must be able to write there.
    std::fs::set_permissions(marks.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let started = marks.path().join("started");
    let args = serde_json::json!({"seconds": 60, "started": started}).to_string();
    let mut call = Command::new("python3")
        .args([CLIENT, "--uds", &sock, "slow", "call", "sleep", &args])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("client");
    let launched = Instant::now();
    while !started.exists() {
        if let Some(st) = call.try_wait().expect("wait") {
            panic!("the client ended ({st}) before its call started");
        }
        assert!(
            launched.elapsed() < Duration::from_secs(60),
            "the sleep call never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let list = c
        .servers()
        .list(proto::ListServersRequest {})
        .await
        .expect("List")
        .into_inner();
    let pid = list
        .servers
        .iter()
        .find(|s| s.name == "slow")
        .expect("slow")
        .pid;
    signal(pid, nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    let status = loop {
        if let Some(st) = call.try_wait().expect("wait") {
            break st;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the client hangs after its server died"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let out = call.wait_with_output().expect("output");
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        !status.success() || said.contains("\"is_error\": true"),
        "the call must fail: {said}"
    );
    assert!(said.contains("exited"), "{said}");
    // The supervisor restarts it; the next call works.
    let v = sdk(&agent, &["slow", "call", "sleep", r#"{"seconds": 0.1}"#]);
    assert_eq!(v["text"], "slept 0.1", "{v}");
}

#[tokio::test]
async fn routes_and_tokens() {
    let (agent, base, secret) = agent_with_tcp();
    acquire(&agent, &["filesystem"]).await;
    let uds = agent.mcp_socket().display().to_string();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}"#;
    let post = |url: &str, extra: &[&str]| {
        let mut a = vec![
            "--unix-socket",
            &uds,
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-H",
            "accept: application/json, text/event-stream",
            "-d",
            init,
            url,
        ];
        a.extend_from_slice(extra);
        curl(&a)
    };
    let (code, body) = post("http://localhost/filesystem/mcp/?local_sandbox_id=x", &[]);
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("\"protocolVersion\":\"2025-06-18\""),
        "{body}"
    );
    let (code, body) = post("http://localhost/git/mcp", &[]);
    assert_eq!(code, 404, "not in the lease: {body}");
    assert!(body.contains("filesystem"), "{body}");
    let (code, _) = post("http://localhost/nope/mcp", &[]);
    assert_eq!(code, 404);
    let (code, _) = post("http://localhost/elsewhere", &[]);
    assert_eq!(code, 404);

    // TCP needs the token.
    let url = format!("{base}/filesystem/mcp");
    let (code, _) = curl(&[
        "-X",
        "POST",
        "-H",
        "content-type: application/json",
        "-d",
        init,
        &url,
    ]);
    assert_eq!(code, 401);
    let auth = format!("authorization: Bearer {secret}");
    let (code, body) = curl(&[
        "-X",
        "POST",
        "-H",
        "content-type: application/json",
        "-H",
        &auth,
        "-d",
        init,
        &url,
    ]);
    assert_eq!(code, 200, "{body}");
    // And the SDK client works over TCP with it.
    let out = Command::new("python3")
        .args([
            CLIENT,
            "--base",
            &base,
            "--token",
            &secret,
            "filesystem",
            "tools",
        ])
        .output()
        .expect("client");
    let v = parse(&out, &agent);
    assert!(v["tools"].as_array().is_some_and(|t| !t.is_empty()));
}

#[test]
fn sandboxctl_mcp_tools_and_call() {
    let agent = agent_with("", "");
    let uri = agent.unix_uri();
    let out = ctl(&["--agent", &uri, "acquire", "--servers", "filesystem"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::write(agent.dir.path().join("ws/hello.txt"), "hello, sandbox\n").expect("write");
    let mcp = format!("unix://{}", agent.mcp_socket().display());
    let out = ctl(&["--agent", &uri, "--mcp", &mcp, "mcp", "filesystem", "tools"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("read_text_file"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(&[
        "--agent",
        &uri,
        "--mcp",
        &mcp,
        "mcp",
        "filesystem",
        "call",
        "read_text_file",
        "--args",
        r#"{"path": "hello.txt"}"#,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "hello, sandbox");
    let out = ctl(&["--agent", &uri, "--mcp", &mcp, "mcp", "git", "tools"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("404"), "{}", text(&out.stderr));
    let out = ctl(&["--agent", &uri, "mcp", "filesystem", "tools"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--mcp"), "{}", text(&out.stderr));
}

/// An agent whose data plane also listens on loopback TCP (token required);
/// returns it with the base URL and the token.
fn agent_with_tcp() -> (Agent, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = write_token(dir.path());
    let state = dir.path().join("state");
    let manifest = dir.path().join("servers.toml");
    std::fs::write(&manifest, shipped_manifest(&state)).expect("manifest");
    let tcp = format!("tcp://127.0.0.1:{}", free_port());
    let sock = format!("unix://{}", dir.path().join("mcp.sock").display());
    let agent = Agent::start_in(
        dir,
        &[
            "--manifest",
            &manifest.display().to_string(),
            "--token-file",
            &token.display().to_string(),
            "--mcp-listen",
            &sock,
            "--mcp-listen",
            &tcp,
        ],
        &[],
    );
    let secret = std::fs::read_to_string(&token)
        .expect("token")
        .trim()
        .to_owned();
    (
        agent,
        format!("http://{}", tcp.trim_start_matches("tcp://")),
        secret,
    )
}

fn ts(base: &str, token: &str, args: &[&str], agent: &Agent) -> serde_json::Value {
    let out = Command::new("node")
        .arg(TS_CLIENT)
        .args([base, token])
        .args(args)
        .output()
        .expect("node");
    parse(&out, agent)
}

#[tokio::test]
async fn typescript_sdk_client_lists_calls_and_runs_concurrently() {
    let (agent, base, token) = agent_with_tcp();
    acquire(&agent, &["filesystem", "localmemory"]).await;
    write_files(&agent.dir.path().join("ws"));
    let v = ts(&base, &token, &["filesystem", "tools"], &agent);
    assert!(
        v["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .any(|t| t == "read_text_file"),
        "{v}"
    );
    let v = ts(
        &base,
        &token,
        &[
            "filesystem",
            "call",
            "read_text_file",
            r#"{"path": "f7.txt"}"#,
        ],
        &agent,
    );
    assert_eq!(v["text"], "content 7\n", "{v}");
    let v = ts(
        &base,
        &token,
        &["filesystem", "concurrent", "10", "20"],
        &agent,
    );
    assert_eq!(v["calls"], 200);
    assert_eq!(v["mismatches"], serde_json::json!([]), "{v}");
    let v = ts(
        &base,
        &token,
        &[
            "localmemory",
            "call",
            "create_entities",
            r#"{"entities": [{"name": "ts", "entityType": "t", "observations": []}]}"#,
        ],
        &agent,
    );
    assert_eq!(v["is_error"], false, "{v}");
    // The Python client sees what the TypeScript client made: one child.
    let v = sdk(&agent, &["localmemory", "call", "read_graph", "{}"]);
    assert!(v["text"].as_str().expect("text").contains("\"ts\""), "{v}");
    // A wrong token is refused.
    let out = Command::new("node")
        .arg(TS_CLIENT)
        .args([
            base.as_str(),
            "wrong-token-0123456789",
            "filesystem",
            "tools",
        ])
        .output()
        .expect("node");
    assert!(!out.status.success());
}

#[tokio::test]
async fn http_servers_are_reverse_proxied() {
    let port = free_port();
    let extra = format!(
        r#"
[servers.excel-http]
command = "${{install_dir}}/py/excel/bin/excel-mcp-server"
args = ["streamable-http", "--host", "127.0.0.1", "--port", "{port}", "--allow-dir", "${{workspace}}", "--allow-unauthenticated"]
transport = "http"
http = {{ port = {port}, path = "/mcp" }}
"#
    );
    let agent = agent_with(&extra, "");
    acquire(&agent, &["excel-http"]).await;
    // The official client, through the agent, to a server with its own
    // streamable-HTTP transport (its answers are SSE streams).
    let v = sdk(&agent, &["excel-http", "tools"]);
    let tools = v["tools"].as_array().expect("tools");
    assert!(tools.len() > 5, "{v}");
    let name = tools
        .iter()
        .filter_map(|t| t.as_str())
        .find(|t| t.contains("workbook"))
        .unwrap_or_else(|| panic!("a workbook tool: {v}"));
    assert!(!name.is_empty());
}

#[tokio::test]
async fn mcp_proxy_exposes_the_data_plane_on_the_host() {
    let agent = agent_with("", "");
    acquire(&agent, &["filesystem"]).await;
    write_files(&agent.dir.path().join("ws"));
    let port = free_port();
    let mcp = format!("unix://{}", agent.mcp_socket().display());
    let listen = format!("tcp://127.0.0.1:{port}");
    let mut proxy = Command::new(&*CTL)
        .args(["--mcp", &mcp, "mcp-proxy", "--listen", &listen])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("proxy");
    let lines = crate::common::capture(proxy.stderr.take().expect("stderr"));
    lines
        .wait_for(Duration::from_secs(10), |l| l.contains("available at"))
        .unwrap_or_else(|| panic!("proxy did not start: {}", lines.all()));
    let out = Command::new("python3")
        .args([
            CLIENT,
            "--base",
            &format!("http://127.0.0.1:{port}"),
            "filesystem",
            "call",
            "read_text_file",
            r#"{"path": "f3.txt"}"#,
        ])
        .output()
        .expect("client");
    let v = parse(&out, &agent);
    assert_eq!(v["text"], "content 3\n", "{v}");
    // DNS rebinding: a page of another site that resolved to 127.0.0.1
    // sends its own Host, or its Origin; both are refused before the
    // data plane sees anything.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}"#;
    assert_eq!(post_init(port, init, &[]), "200");
    assert_eq!(
        post_init(port, init, &["-H", "Host: attacker.example"]),
        "403"
    );
    assert_eq!(
        post_init(port, init, &["-H", "Origin: http://attacker.example"]),
        "403"
    );
    assert_eq!(
        post_init(port, init, &["-H", "Origin: http://localhost:3000"]),
        "200"
    );
    let _ = proxy.kill();
    let _ = proxy.wait();
    // With --require-token, clients must send the proxy's token.
    let token_file = agent.dir.path().join("proxy.token");
    let port = free_port();
    let mut proxy = Command::new(&*CTL)
        .args(["--mcp", &mcp, "mcp-proxy", "--listen"])
        .arg(format!("tcp://127.0.0.1:{port}"))
        .arg("--require-token")
        .arg(&token_file)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("proxy");
    let lines = crate::common::capture(proxy.stderr.take().expect("stderr"));
    lines
        .wait_for(Duration::from_secs(10), |l| l.contains("available at"))
        .unwrap_or_else(|| panic!("proxy did not start: {}", lines.all()));
    let token = std::fs::read_to_string(&token_file).expect("token created");
    assert_eq!(post_init(port, init, &[]), "401");
    assert_eq!(
        post_init(
            port,
            init,
            &["-H", "Authorization: Bearer wrong-token-0123456789"]
        ),
        "401"
    );
    let auth = format!("Authorization: Bearer {}", token.trim());
    assert_eq!(post_init(port, init, &["-H", &auth]), "200");
    let _ = proxy.kill();
    let _ = proxy.wait();
    // Only loopback.
    let out = ctl(&["--mcp", &mcp, "mcp-proxy", "--listen", "tcp://0.0.0.0:1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("loopback"),
        "{}",
        text(&out.stderr)
    );
}

/// The Python SDK 2.x client, in its own venv (it cannot share one with
/// the 1.x client): `SANDBOX_AGENT_MCP2_PYTHON`, installed by the README's
/// test command.
fn sdk2(agent: &Agent, args: &[&str]) -> serde_json::Value {
    let py = crate::common::mcp::mcp2_python();
    assert!(
        Path::new(&py).exists(),
        "{py} is missing: run .ci/test-all.sh (it installs tests/clients/mcp2/requirements.txt) or set SANDBOX_AGENT_MCP2_PYTHON"
    );
    let sock = agent.mcp_socket().display().to_string();
    let mut a = vec![MCP2_CLIENT, "--uds", &sock];
    a.extend_from_slice(args);
    let out = Command::new(&py).args(&a).output().expect("python");
    parse(&out, agent)
}

const MCP2_CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/mcp2/mcp2_client.py"
);

fn features_agent() -> Agent {
    let extra = format!(
        "[servers.features]\ncommand = \"{}\"\nargs = [\"{SLOW}\"]\n",
        python()
    );
    agent_with(&extra, "")
}

#[tokio::test]
async fn server_features_reach_the_session_that_asked() {
    let agent = features_agent();
    acquire(&agent, &["features"]).await;
    // Every session's first call has the same request id, so the same
    // progress token: each must still see only its own progress, all of
    // it, though the server answers right after its last progress (the
    // answer overtook it in 2 of 5 runs of 4 sessions before the gateway
    // kept the child's order).
    for _ in 0..2 {
        let v = sdk(&agent, &["features", "progress", "8", "5"]);
        for s in v["sessions"].as_array().expect("sessions") {
            assert_eq!(s["text"], "counted 5", "{v}");
            assert_eq!(
                s["progress"],
                serde_json::json!([1.0, 2.0, 3.0, 4.0, 5.0]),
                "{v}"
            );
        }
    }
    // roots/list goes to the session whose call is running.
    let v = sdk(&agent, &["features", "roots"]);
    assert_eq!(v["a"], "file:///a", "{v}");
    assert_eq!(v["b"], "file:///b", "{v}");
    // With no client able to answer, the server gets an error at once.
    assert_eq!(v["none"]["is_error"], true, "{v}");
    assert!(
        v["none"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("roots")),
        "{v}"
    );
    // list_changed is broadcast to the sessions' GET streams.
    let v = sdk(&agent, &["features", "list-changed"]);
    assert_eq!(v["received"], true, "{v}");
}

#[tokio::test]
async fn python_sdk_2_speaks_the_session_less_revision() {
    let agent = features_agent();
    acquire(&agent, &["filesystem", "localmemory", "features"]).await;
    write_files(&agent.dir.path().join("ws"));
    let v = sdk2(&agent, &["filesystem", "tools"]);
    assert_eq!(v["version"], "2026-07-28", "{v}");
    assert!(
        v["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|n| n == "read_text_file")),
        "{v}"
    );
    assert!(v["server"].is_string(), "serverInfo is stamped: {v}");
    let v = sdk2(&agent, &["filesystem", "concurrent", "60"]);
    assert_eq!(v["mismatches"], serde_json::json!([]), "{v}");
    let v = sdk2(
        &agent,
        &[
            "localmemory",
            "call",
            "create_entities",
            r#"{"entities":[{"name":"e2","entityType":"t","observations":["x"]}]}"#,
        ],
    );
    assert_eq!(v["is_error"], false, "{v}");
    let v = sdk2(&agent, &["localmemory", "call", "read_graph", "{}"]);
    assert!(v["text"].as_str().is_some_and(|t| t.contains("e2")), "{v}");
    // Progress arrives on the request's own SSE answer.
    let v = sdk2(&agent, &["features", "progress", "3"]);
    assert_eq!(v["text"], "counted 3", "{v}");
    assert_eq!(v["progress"], serde_json::json!([1.0, 2.0, 3.0]), "{v}");
}

#[tokio::test]
async fn session_less_requests_are_checked_against_their_headers() {
    let agent = agent_with("", "");
    acquire(&agent, &["localmemory"]).await;
    let uds = agent.mcp_socket().display().to_string();
    let url = "http://localhost/localmemory/mcp";
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_graph","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let post = |body: &str, headers: &[&str]| {
        let mut a = vec![
            "--unix-socket",
            &uds,
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-H",
            "accept: application/json, text/event-stream",
        ];
        for h in headers {
            a.extend_from_slice(&["-H", h]);
        }
        a.extend_from_slice(&["-d", body, url]);
        curl(&a)
    };
    let v = "mcp-protocol-version: 2026-07-28";
    let (code, body) = post(call, &[v, "mcp-method: tools/call", "mcp-name: read_graph"]);
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON answer");
    assert_eq!(answer["id"], 7);
    assert_eq!(answer["result"]["resultType"], "complete", "{body}");
    // No session is issued.
    let (code, body) = post(call, &[v, "mcp-method: tools/call", "mcp-name: other"]);
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("-32020") && body.contains("Mcp-Name"),
        "{body}"
    );
    let (code, body) = post(call, &[v, "mcp-method: tools/list", "mcp-name: read_graph"]);
    assert_eq!(code, 400, "{body}");
    let no_meta = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let (code, body) = post(no_meta, &[v, "mcp-method: tools/list"]);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("-32602"), "{body}");
    let batch = format!("[{call}]");
    let (code, _) = post(&batch, &[v, "mcp-method: tools/call"]);
    assert_eq!(code, 400, "no batches");
    let (code, body) = post(call, &["mcp-protocol-version: 2099-01-01"]);
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("-32022") && body.contains("2026-07-28"),
        "{body}"
    );
    let unknown = r#"{"jsonrpc":"2.0","id":2,"method":"nope/nothing","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let (code, body) = post(unknown, &[v, "mcp-method: nope/nothing"]);
    assert_eq!(code, 404, "method not found maps to 404: {body}");
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (code, _) = post(note, &[v]);
    assert_eq!(code, 202);
    let (code, _) = curl(&["--unix-socket", &uds, "-H", v, url]);
    assert_eq!(code, 405, "no GET stream in 2026-07-28");
    let discover = r#"{"jsonrpc":"2.0","id":3,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let (code, body) = post(discover, &[v, "mcp-method: server/discover"]);
    assert_eq!(code, 200, "{body}");
    let d: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        d["result"]["supportedVersions"],
        serde_json::json!(["2026-07-28"])
    );
    assert!(d["result"]["capabilities"]["tools"].is_object(), "{body}");
}

/// POSTs the MCP `initialize` body `init` to `/filesystem/mcp` of the proxy
/// on `port`, with `extra` curl arguments; returns the HTTP status.
fn post_init(port: u16, init: &str, extra: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", "content-type: application/json"])
        .args(["-H", "accept: application/json, text/event-stream"])
        .args(extra)
        .args(["-d", init])
        .arg(format!("http://127.0.0.1:{port}/filesystem/mcp"))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 50: a JSON-RPC batch is bounded before it is answered, on a
/// running server. 10,000 `tools/list` in one POST are refused whole (400,
/// naming `gateway.max_batch_messages`) and the agent serves on; a batch
/// at the limit is answered whole, each answer past
/// `gateway.max_reply_bytes` replaced by an error for its id naming that
/// limit, so the reply stays within it; the agent's peak memory grows by
/// far less than the answers would have cost whole.
#[tokio::test]
async fn batches_and_their_answers_are_bounded() {
    let agent = agent_with(
        "",
        "[gateway]\nmax_batch_messages = 16\nmax_reply_bytes = 100000\n",
    );
    acquire(&agent, &["filesystem"]).await;
    let uds = agent.mcp_socket().display().to_string();
    let body_file = agent.dir.path().join("batch.json");
    let post = |n: usize| {
        std::fs::write(&body_file, rpc_batch(n, "tools/list")).expect("batch");
        let data = format!("@{}", body_file.display());
        curl(&[
            "--unix-socket",
            &uds,
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-H",
            "accept: application/json, text/event-stream",
            "--data-binary",
            &data,
            "http://localhost/filesystem/mcp",
        ])
    };
    let (code, one) = post(1);
    assert_eq!(code, 200, "{one}");
    let listing = one.len();
    assert!(listing > 8_000, "filesystem's listing is {listing} bytes");
    let before = peak_rss(agent.child.id());

    let (code, body) = post(10_000);
    assert_eq!(code, 400, "{}", &body[..body.len().min(400)]);
    assert!(body.contains("gateway.max_batch_messages = 16"), "{body}");

    let (code, body) = post(16);
    assert_eq!(code, 200, "{}", &body[..body.len().min(400)]);
    let answers: Vec<serde_json::Value> = serde_json::from_str(&body).expect("a batch answer");
    assert_eq!(answers.len(), 16);
    let dropped: Vec<&serde_json::Value> = answers
        .iter()
        .filter(|a| a.get("error").is_some())
        .collect();
    // As many as fit (ids of two digits make a few a byte longer).
    let fit = 100_000 / listing;
    let kept = answers.len() - dropped.len();
    assert!(
        kept == fit || kept + 1 == fit,
        "{kept} answers kept, {fit} fit"
    );
    for a in &dropped {
        let msg = a["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("gateway.max_reply_bytes = 100000"), "{a}");
        assert!(a["id"].is_u64(), "{a}");
    }
    assert!(body.len() < 100_000 + 16 * 400, "{} bytes", body.len());
    let grown = peak_rss(agent.child.id()).saturating_sub(before);
    assert!(grown < 16 << 20, "the agent's peak RSS grew {grown} bytes");

    // The server and the agent serve on.
    let (code, one) = post(1);
    assert_eq!(code, 200, "{one}");
}
