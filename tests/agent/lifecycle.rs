//! Supervision and the lease lifecycle against real MCP servers (filesystem,
//! git and memory from packaging/install-servers.sh), through the real
//! agent binary over its unix socket.

use std::time::Duration;

use crate::common::mcp::*;
use crate::common::servers::*;
use crate::common::*;
use sandbox_client::proto;
use tonic::Code;

const SERVING: i32 = proto::health::health_check_response::ServingStatus::Serving as i32;
const READY: i32 = proto::ServerState::Ready as i32;

#[tokio::test]
async fn acquire_three_real_servers_then_release_leaves_nothing() {
    let agent = agent_with("", "");
    let c = client(&agent).await;
    let r = c
        .agent()
        .acquire(acquire_req(
            "lease-1",
            &["filesystem", "git", "localmemory"],
        ))
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()))
        .into_inner();
    assert_eq!(r.status, proto::SandboxStatus::Occupied as i32);
    assert_eq!(r.servers.len(), 3);
    for s in &r.servers {
        assert_eq!(s.state, READY, "{s:?}");
        assert_eq!(s.status, proto::SandboxStatus::Occupied as i32);
        assert_eq!(s.mcp_path, format!("/{}/mcp", s.name));
        assert!(s.pid > 0 && !s.id.is_empty() && s.updated_at_ms > 0);
        assert_eq!(
            health_becomes(&c, &format!("mcp/{}", s.name), SERVING).await,
            SERVING
        );
    }
    let fs = server(&c, "filesystem").await;
    assert!(fs.rss_bytes > 1 << 20 && fs.processes >= 1, "{fs:?}");
    assert!(fs.in_lease);
    let info = c
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    let lease = info.lease.expect("lease");
    assert_eq!(lease.lease_id, "lease-1");
    assert_eq!(lease.ttl_seconds, 7200);
    assert_eq!(lease.expires_at_ms, lease.acquired_at_ms + 7_200_000);

    // A second Acquire and unknown names get their errors.
    let e = c
        .agent()
        .acquire(acquire_req("lease-2", &["git"]))
        .await
        .expect_err("double");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("lease-1"), "{}", e.message());

    std::fs::write(agent.dir.path().join("ws/note.txt"), "x").expect("write");
    let pids: Vec<u32> = r.servers.iter().map(|s| s.pid).collect();
    let rel = c
        .agent()
        .release(proto::ReleaseRequest {
            lease_id: "lease-1".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("Release")
        .into_inner();
    assert_eq!(rel.status, proto::SandboxStatus::Idle as i32);
    assert_eq!(
        std::fs::read_dir(agent.dir.path().join("ws"))
            .expect("ws")
            .count(),
        0
    );
    assert!(
        descendants(agent.child.id()).is_empty(),
        "children left: {:?}",
        descendants(agent.child.id())
    );
    for p in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists(),
            "{p} survived"
        );
    }
    assert_ne!(health(&c, "mcp/git").await, SERVING);
    // Release is idempotent.
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: "lease-1".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("second Release");
    let e = c
        .agent()
        .release(proto::ReleaseRequest {
            lease_id: "other".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect_err("unknown lease");
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let agent = agent_with("", "");
    let c = client(&agent).await;
    let e = c
        .agent()
        .acquire(acquire_req("l", &["filesystem", "nope"]))
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("nope") && e.message().contains("localmemory"),
        "{}",
        e.message()
    );
    let mut r = acquire_req("l", &["git"]);
    r.ttl_seconds = Some(59);
    let e = c.agent().acquire(r).await.expect_err("ttl");
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut r = acquire_req("l", &["git"]);
    r.ttl_seconds = Some(86_401);
    assert_eq!(
        c.agent().acquire(r).await.expect_err("ttl").code(),
        Code::InvalidArgument
    );
    let e = c
        .agent()
        .acquire(acquire_req("l", &["canvas"]))
        .await
        .expect_err("creds");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("CANVAS_API_TOKEN") && e.message().contains("auth_data"),
        "{}",
        e.message()
    );
    let e = c
        .servers()
        .start(proto::ServerRequest {
            name: "nope".into(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);
    // Nothing half-done: still idle, nothing running.
    let info = c
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.status, proto::SandboxStatus::Idle as i32);
    assert!(descendants(agent.child.id()).is_empty());
}

#[tokio::test]
async fn killed_server_comes_back_and_crash_loop_fails_the_sandbox() {
    // "flaky" serves the first time, then exits 7 on every restart.
    // In the workspace: the server runs as the tenant, who owns it.
    let marker = "${workspace}/.flaky-started";
    let extra = format!(
        r#"
[servers.flaky]
command = "sh"
args = ["-c", "if [ -e {marker} ]; then echo flaky-dying >&2; exit 7; fi; touch {marker}; exec node {js}"]
restart = {{ initial_backoff_ms = 50, max_backoff_ms = 200, max_restarts = 3, window_ms = 30000 }}
"#,
        js = memory_js()
    );
    let agent = agent_with(&extra, "");
    let c = client(&agent).await;
    c.agent()
        .acquire(acquire_req("l", &["localmemory", "flaky"]))
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()));

    let before = server(&c, "localmemory").await;
    signal(before.pid, nix::sys::signal::Signal::SIGKILL);
    let after = wait_state(&c, "localmemory", Duration::from_secs(10), |s| {
        s.state == READY && s.pid != before.pid
    })
    .await;
    assert_eq!(after.restarts, 1, "{after:?}");
    assert!(matches!(
        after.last_exit.and_then(|e| e.how),
        Some(proto::exit_status::How::Signal(9))
    ));

    let flaky = server(&c, "flaky").await;
    signal(flaky.pid, nix::sys::signal::Signal::SIGKILL);
    let failed = wait_state(&c, "flaky", Duration::from_secs(15), |s| {
        s.state == proto::ServerState::Failed as i32
    })
    .await;
    assert!(failed.message.contains("crash loop"), "{failed:?}");
    assert!(matches!(
        failed.last_exit.and_then(|e| e.how),
        Some(proto::exit_status::How::Code(7))
    ));
    assert!(failed.stderr_tail.contains("flaky-dying"), "{failed:?}");
    assert_eq!(failed.status, proto::SandboxStatus::Error as i32);
    let info = c
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.status, proto::SandboxStatus::Error as i32);
    // Release recovers from error.
    c.agent()
        .release(proto::ReleaseRequest::default())
        .await
        .expect("Release");
    let info = c
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.status, proto::SandboxStatus::Idle as i32);
}

async fn stop_kills_grandchildren(config: &str, n: u32) {
    // Unique sleep lengths, so leftovers of another run cannot interfere.
    let tag = format!("{}{n}", std::process::id());
    // The server forks a grandchild in its group and a daemon in a new
    // session, then serves.
    let extra = format!(
        r#"
[servers.forker]
command = "sh"
args = ["-c", "sleep 7{tag}1 & setsid sleep 7{tag}2 & exec node {js}"]
stop_grace_ms = 500
"#,
        js = memory_js()
    );
    let agent = agent_with(&extra, config);
    let c = client(&agent).await;
    c.servers()
        .start(proto::ServerRequest {
            name: "forker".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("Start: {e}\n{}", agent.stderr.all()));
    eventually(Duration::from_secs(5), "the grandchildren start", || {
        when(!pgrep(&format!("sleep 7{tag}2")).is_empty(), || {
            "no second sleep yet".into()
        })
    });
    assert_eq!(
        server(&c, "forker").await.processes,
        3,
        "node (sh exec'd it), two sleeps"
    );
    let s = c
        .servers()
        .stop(proto::StopServerRequest {
            name: "forker".into(),
            grace_ms: 0,
        })
        .await
        .expect("Stop")
        .into_inner();
    assert_eq!(s.state, proto::ServerState::Stopped as i32);
    assert!(
        pgrep(&format!("sleep 7{tag}1")).is_empty(),
        "group member survived"
    );
    assert!(
        pgrep(&format!("sleep 7{tag}2")).is_empty(),
        "daemon survived"
    );
    assert!(descendants(agent.child.id()).is_empty());
}

#[tokio::test]
async fn stop_leaves_no_grandchild_with_cgroups() {
    stop_kills_grandchildren("", 1).await;
}

#[tokio::test]
async fn stop_leaves_no_grandchild_without_cgroups() {
    stop_kills_grandchildren("[supervisor]\ncgroup = \"off\"\n", 2).await;
}

#[tokio::test]
async fn two_hundred_restarts_leave_no_zombie() {
    let extra = r#"
[servers.blink]
command = "sh"
args = ["-c", "exit 0"]
restart = { policy = "always", initial_backoff_ms = 1, max_backoff_ms = 1, max_restarts = 1000, window_ms = 1 }
ready_timeout_ms = 1000
"#;
    let agent = agent_with(extra, "");
    let c = client(&agent).await;
    // Start returns UNAVAILABLE (it never becomes ready) but keeps restarting.
    let _ = c
        .servers()
        .start(proto::ServerRequest {
            name: "blink".into(),
        })
        .await;
    wait_state(&c, "blink", Duration::from_secs(60), |s| s.restarts >= 200).await;
    c.servers()
        .stop(proto::StopServerRequest {
            name: "blink".into(),
            grace_ms: 0,
        })
        .await
        .expect("Stop");
    // Stop reaps the last child; allow a loaded machine time to get there.
    let pid = agent.child.id();
    eventually(
        Duration::from_secs(15),
        "no zombie and no descendant is left",
        || {
            let (z, d) = (zombies_of(pid), descendants(pid));
            when(z.is_empty() && d.is_empty(), || {
                format!("zombies {z:?}, descendants {d:?}")
            })
        },
    );
}

/// One read of the `chatty` server's whole log buffer.
async fn chatter(c: &sandbox_client::Client) -> Vec<proto::LogLine> {
    let mut s = c
        .servers()
        .logs(proto::LogsRequest {
            name: "chatty".into(),
            ..Default::default()
        })
        .await
        .expect("Logs")
        .into_inner();
    let mut lines = Vec::new();
    while let Some(l) = s.message().await.expect("line") {
        lines.push(l);
    }
    lines
}

#[tokio::test]
async fn logs_are_bounded_and_resumable() {
    let extra = r#"
[servers.chatty]
command = "sh"
args = ["-c", "i=0; while [ $i -lt 5000 ]; do echo \"line $i of chatter\" >&2; i=$((i+1)); done; echo done >&2; exec sleep 100"]
restart = { policy = "never" }
ready_timeout_ms = 60000
"#;
    let agent = agent_with(extra, "[supervisor]\nlog_buffer_bytes = 32768\n");
    let c = client(&agent).await;
    let sup = c.clone();
    tokio::spawn(async move {
        let _ = sup
            .servers()
            .start(proto::ServerRequest {
                name: "chatty".into(),
            })
            .await;
    });
    let lines = eventually_async(
        Duration::from_secs(20),
        "the chatter finishes",
        async || {
            let lines = chatter(&c).await;
            if lines.last().is_some_and(|l| l.line.as_ref() == b"done") {
                Ok(lines)
            } else {
                Err(format!("{} lines, not ending in done", lines.len()))
            }
        },
    )
    .await;
    // A read that began while the chatter was still being written also
    // streams the lines written meanwhile; once it is over, one read is
    // what the buffer holds.
    drop(lines);
    let lines = chatter(&c).await;
    let bytes: usize = lines.iter().map(|l| l.line.len() + 64).sum();
    assert!(bytes <= 32768, "{bytes} bytes kept");
    assert!(lines[0].seq > 4000, "oldest kept line {}", lines[0].seq);
    // A cursor older than the buffer reports what was lost.
    let mut s = c
        .servers()
        .logs(proto::LogsRequest {
            name: "chatty".into(),
            cursor: 1,
            ..Default::default()
        })
        .await
        .expect("Logs")
        .into_inner();
    let first = s.message().await.expect("line").expect("one");
    assert_eq!(first.dropped_before, first.seq - 1);
    // Resume from a cursor: only newer lines.
    let last = lines.last().expect("line").seq;
    let mut s = c
        .servers()
        .logs(proto::LogsRequest {
            name: "chatty".into(),
            cursor: last,
            ..Default::default()
        })
        .await
        .expect("Logs")
        .into_inner();
    let l = s.message().await.expect("line").expect("one");
    assert_eq!(l.seq, last);
    assert!(s.message().await.expect("end").is_none());
    // sandboxctl logs --tail
    let out = ctl(&[
        "--agent",
        &agent.unix_uri(),
        "logs",
        "chatty",
        "--tail",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "line 4999 of chatter\ndone\n");
}

#[tokio::test]
async fn reset_restores_seed_data_and_ttl_auto_releases() {
    let seed = tempfile::tempdir().expect("seed");
    std::fs::write(seed.path().join("seed.txt"), "seeded").expect("seed file");
    std::fs::create_dir(seed.path().join("sub")).expect("dir");
    std::fs::write(seed.path().join("sub/b.txt"), "b").expect("seed file");
    let extra = format!(
        r#"
[servers.seeded]
command = "node"
args = ["{js}"]
[servers.seeded.benchmarks.MCP_Atlas]
seed = [{{ from = "{dir}" }}]
env = {{ MEMORY_FILE_PATH = "${{workspace}}/../state/atlas-memory.jsonl" }}
"#,
        js = memory_js(),
        dir = seed.path().display()
    );
    let agent = agent_with(&extra, "[lifecycle]\nmin_ttl_seconds = 1\n");
    let c = client(&agent).await;
    let ws = agent.dir.path().join("ws");
    let mut req = acquire_req("seeded-lease", &["seeded"]);
    req.benchmark = proto::Benchmark::McpAtlas as i32;
    req.ttl_seconds = Some(6);
    let r = c
        .agent()
        .acquire(req)
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()))
        .into_inner();
    assert_eq!(r.servers[0].benchmark, proto::Benchmark::McpAtlas as i32);
    assert_eq!(
        std::fs::read_to_string(ws.join("seed.txt")).expect("seed"),
        "seeded"
    );
    std::fs::remove_file(ws.join("seed.txt")).expect("rm");
    std::fs::write(ws.join("extra.txt"), "x").expect("write");
    let pid = r.servers[0].pid;
    let r = c
        .agent()
        .reset(proto::ResetRequest {
            lease_id: "seeded-lease".into(),
        })
        .await
        .expect("Reset")
        .into_inner();
    assert_eq!(r.lease.expect("lease").lease_id, "seeded-lease");
    assert_eq!(
        std::fs::read_to_string(ws.join("seed.txt")).expect("seed"),
        "seeded"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("sub/b.txt")).expect("seed"),
        "b"
    );
    assert!(!ws.join("extra.txt").exists());
    assert_ne!(r.servers[0].pid, pid, "servers restarted");
    assert_eq!(r.servers[0].state, READY);

    // The 6 s TTL releases by itself.
    let info = eventually_async(Duration::from_secs(15), "the TTL releases", async || {
        let info = c
            .agent()
            .get_info(proto::GetInfoRequest {})
            .await
            .expect("info")
            .into_inner();
        if info.status == proto::SandboxStatus::Idle as i32 {
            Ok(info)
        } else {
            Err(format!("status {}", info.status))
        }
    })
    .await;
    let rec = info.last_release.expect("release record");
    assert!(rec.is_ttl && rec.lease_id == "seeded-lease");
    assert_eq!(std::fs::read_dir(&ws).expect("ws").count(), 0);
    assert!(descendants(agent.child.id()).is_empty());
}

#[test]
fn sandboxctl_lease_verbs() {
    let agent = agent_with("", "");
    let uri = agent.unix_uri();
    let out = ctl(&[
        "--agent",
        &uri,
        "acquire",
        "--servers",
        "git,filesystem",
        "--ttl",
        "600",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("2 servers ready"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(&["--agent", &uri, "--json", "servers", "list"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let git = v["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .find(|s| s["name"] == "git")
        .expect("git");
    assert_eq!(git["state"], "ready");
    assert!(git["pid"].as_u64().expect("pid") > 0);
    let out = ctl(&["--agent", &uri, "servers", "restart", "git"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = ctl(&["--agent", &uri, "status"]);
    assert!(
        text(&out.stdout).contains("occupied"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(&["--agent", &uri, "reset"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = ctl(&["--agent", &uri, "acquire", "--servers", "bogus"]);
    assert_eq!(out.status.code(), Some(1));
    let out = ctl(&["--agent", &uri, "release"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = ctl(&["--agent", &uri, "--json", "status"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["status"], "idle");
}

#[tokio::test]
async fn http_servers_are_probed_on_their_port() {
    // excel-mcp-server speaks streamable HTTP itself.
    let port = free_port();
    let extra = format!(
        r#"
[servers.excel-http]
command = "${{install_dir}}/py/excel/bin/excel-mcp-server"
args = ["streamable-http", "--host", "127.0.0.1", "--port", "{port}", "--allow-dir", "${{workspace}}", "--allow-unauthenticated"]
transport = "http"
http = {{ port = {port}, path = "/mcp" }}

[servers.mute-http]
command = "sleep"
args = ["100"]
transport = "http"
http = {{ port = {mute}, path = "/mcp" }}
ready_timeout_ms = 1000
restart = {{ policy = "never" }}
"#,
        mute = free_port()
    );
    let agent = agent_with(&extra, "");
    let c = client(&agent).await;
    let r = c
        .agent()
        .acquire(acquire_req("h", &["excel-http"]))
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()))
        .into_inner();
    assert_eq!(r.servers[0].state, READY);
    assert_eq!(r.servers[0].transport, proto::ServerTransport::Http as i32);
    assert_eq!(health_becomes(&c, "mcp/excel-http", SERVING).await, SERVING);
    // The port really is the server's: it answers HTTP.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    c.agent()
        .release(proto::ReleaseRequest::default())
        .await
        .expect("Release");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "server still listening"
    );

    // A process that never opens its port fails readiness with a reason.
    let e = c
        .agent()
        .acquire(acquire_req("m", &["mute-http"]))
        .await
        .expect_err("never ready");
    assert_eq!(e.code(), Code::Unavailable);
    assert!(
        e.message().contains("mute-http") && e.message().contains("connect"),
        "{}",
        e.message()
    );
    assert!(descendants(agent.child.id()).is_empty());
}

#[tokio::test]
async fn servers_run_as_the_manifest_user() {
    if !root_or_skip("running a server as the manifest's user") {
        return;
    }
    let extra = format!(
        r#"
[servers.as-nobody]
command = "node"
args = ["{js}"]
user = "nobody"
cwd = "/"
env = {{ MEMORY_FILE_PATH = "/tmp/sandbox-agent-test-nobody-{pid}.jsonl" }}
"#,
        js = memory_js(),
        pid = std::process::id()
    );
    let agent = agent_with(&extra, "");
    let c = client(&agent).await;
    let s = c
        .servers()
        .start(proto::ServerRequest {
            name: "as-nobody".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("Start: {e}\n{}", agent.stderr.all()))
        .into_inner();
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.pid)).expect("status");
    let uid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line");
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("passwd")
        .expect("nobody exists")
        .uid
        .as_raw();
    assert!(
        uid.split_whitespace()
            .skip(1)
            .all(|u| u == nobody.to_string()),
        "{uid}"
    );
}

#[tokio::test]
async fn seeds_go_into_state_paths_and_logs_follow() {
    let seed_dir = tempfile::tempdir().expect("seed");
    let tgz = seed_dir.path().join("memory-seed.tar.gz");
    let mut t = crate::common::ws::Tar::new();
    t.file("graph.json", b"{\"seeded\":true}\n");
    std::fs::write(&tgz, crate::common::ws::gzip(&t.end())).expect("write seed");
    let extra = format!(
        r#"
[servers.seeded-state]
command = "sh"
args = ["-c", "i=0; while true; do echo tick $i >&2; i=$((i+1)); sleep 0.1; done & exec node {js}"]
state_paths = ["/var/lib/sandbox-agent/seeded"]
env = {{ MEMORY_FILE_PATH = "/var/lib/sandbox-agent/seeded/memory.jsonl" }}
[servers.seeded-state.benchmarks.Toolathlon]
seed = [{{ from = "{tgz}", to = "/var/lib/sandbox-agent/seeded/init" }}]
"#,
        js = memory_js(),
        tgz = tgz.display()
    );
    let agent = agent_with(&extra, "");
    let c = client(&agent).await;
    let mut req = acquire_req("s", &["seeded-state"]);
    req.benchmark = proto::Benchmark::Toolathlon as i32;
    c.agent()
        .acquire(req)
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()));
    let seeded = state_dir(&agent).join("seeded");
    assert_eq!(
        std::fs::read_to_string(seeded.join("init/graph.json")).expect("seeded"),
        "{\"seeded\":true}\n"
    );

    // Follow: new stderr lines arrive as they are written.
    let mut s = c
        .servers()
        .logs(proto::LogsRequest {
            name: "seeded-state".into(),
            tail: 1,
            follow: true,
            ..Default::default()
        })
        .await
        .expect("Logs")
        .into_inner();
    let mut ticks: Vec<u64> = Vec::new();
    let mut last_seq = 0;
    while ticks.len() < 5 {
        let l = tokio::time::timeout(Duration::from_secs(5), s.message())
            .await
            .expect("a line within 5 s")
            .expect("stream")
            .expect("line");
        assert!(l.seq > last_seq || last_seq == 0, "sequence goes forward");
        last_seq = l.seq;
        // The memory server's banner may come in between.
        if let Some(n) = l.line.strip_prefix(b"tick ") {
            ticks.push(String::from_utf8_lossy(n).parse().expect("tick number"));
        }
    }
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "{ticks:?}");
    drop(s);

    c.agent()
        .release(proto::ReleaseRequest::default())
        .await
        .expect("Release");
    assert!(seeded.is_dir(), "state dirs stay, emptied");
    assert_eq!(std::fs::read_dir(&seeded).expect("state").count(), 0);
    // A new lease sees none of the previous lease's output.
    let mut s = c
        .servers()
        .logs(proto::LogsRequest {
            name: "seeded-state".into(),
            ..Default::default()
        })
        .await
        .expect("Logs")
        .into_inner();
    assert!(s.message().await.expect("end").is_none());
}

/// `ALL` starts every server that can run here: one whose outside service
/// is not configured (its `requires` are unset) is left out and named with
/// what it needs, instead of failing the Acquire. Asked for by name, it
/// still fails it; given its credentials, ALL starts it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_leaves_out_servers_whose_service_is_absent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let manifest = dir.path().join("servers.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"
[servers.notes]
command = "node"
args = ["{js}"]
env = {{ MEMORY_FILE_PATH = "{state}/notes.jsonl" }}

[servers.saas]
command = "node"
args = ["{js}"]
env = {{ MEMORY_FILE_PATH = "{state}/saas.jsonl" }}
requires = [{{ var = "SAAS_TOKEN", what = "a token of the outside service" }}]
auth_env = {{ token = "SAAS_TOKEN" }}
"#,
            js = memory_js(),
            state = state.display()
        ),
    )
    .expect("manifest");
    let m = manifest.display().to_string();
    let agent = Agent::start_in(dir, &["--manifest", &m], &[]);
    let c = client(&agent).await;
    let all = |id: &str| proto::AcquireRequest {
        lease_id: id.into(),
        all_servers: true,
        ..Default::default()
    };
    let r = c
        .agent()
        .acquire(all("all"))
        .await
        .unwrap_or_else(|e| panic!("ALL: {e}\n{}", agent.stderr.all()))
        .into_inner();
    let lease = r.lease.expect("lease");
    assert_eq!(lease.server_names, ["notes"]);
    assert_eq!(lease.skipped.len(), 1, "{:?}", lease.skipped);
    assert_eq!(lease.skipped[0].name, "saas");
    assert!(
        lease.skipped[0].reason.contains("SAAS_TOKEN"),
        "{}",
        lease.skipped[0].reason
    );
    assert!(
        r.message.contains("left out") && r.message.contains("saas"),
        "{}",
        r.message
    );
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: "all".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("release");

    let e = c
        .agent()
        .acquire(acquire_req("named", &["notes", "saas"]))
        .await
        .expect_err("saas by name without its token");
    assert!(e.message().contains("SAAS_TOKEN"), "{}", e.message());

    let mut req = all("all-with-token");
    let token = prost_types::Struct {
        fields: [(
            "token".to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue("t0k".into())),
            },
        )]
        .into(),
    };
    req.auth_data.insert("saas".into(), token);
    let r = c
        .agent()
        .acquire(req)
        .await
        .expect("ALL with the token")
        .into_inner();
    let lease = r.lease.expect("lease");
    assert_eq!(lease.server_names, ["notes", "saas"]);
    assert!(lease.skipped.is_empty());
}
