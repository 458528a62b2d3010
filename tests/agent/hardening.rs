//! Issue 19's agent items over the real binary: a Release (or a TTL expiry)
//! that meets a stalled transfer stops it instead of failing.

use std::time::Duration;

use crate::common::ws::{Tar, gzip, initialize};
use crate::common::*;
use sandbox_client::proto;
use sandbox_client::proto::initialize_request::Msg;
use tonic::Code;

async fn lease(c: &sandbox_client::Client, id: &str, ttl: Option<u32>) {
    c.agent()
        .acquire(proto::AcquireRequest {
            lease_id: id.into(),
            no_servers: true,
            ttl_seconds: ttl,
            ..Default::default()
        })
        .await
        .expect("Acquire without servers");
}

async fn status(c: &sandbox_client::Client) -> proto::SandboxStatus {
    let i = c
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    i.status()
}

/// 64 MiB gzip cannot shrink, written into the workspace: more than every
/// buffer between a Dump and a reader that stopped reading.
fn fill(ws: &std::path::Path) {
    crate::common::ws::write_64_mib(ws, "big.bin");
}

/// A Dump whose reader stopped, and an upload that trickles: Release ends
/// both (the trickling Initialize answers ABORTED and changes nothing) and
/// the sandbox is idle; the wait for the workspace is short here, so
/// without the cancel the Release would fail instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_stops_stalled_transfers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, "[lifecycle]\nworkspace_wait_ms = 2000\n").expect("config");
    let agent = Agent::start_in(dir, &["--config", &cfg.display().to_string()], &[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let ws = agent.dir.path().join("ws");

    lease(&c, "stalled-dump", None).await;
    fill(&ws);
    let mut stream = c
        .workspace()
        .dump(proto::DumpRequest::default())
        .await
        .expect("Dump")
        .into_inner();
    // One message read, then the reader stops.
    stream.message().await.expect("first chunk");
    let r = c
        .agent()
        .release(proto::ReleaseRequest {
            lease_id: "stalled-dump".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(status(&c).await, proto::SandboxStatus::Idle);
    drop(stream);

    lease(&c, "trickle", None).await;
    let archive = gzip(&Tar::new().file("t.txt", b"trickled").end());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Header(proto::InitializeHeader::default())),
    })
    .await
    .expect("header");
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Chunk(archive[..archive.len() / 2].to_vec().into())),
    })
    .await
    .expect("half the archive");
    let c2 = c.clone();
    let init = tokio::spawn(async move {
        c2.workspace()
            .initialize(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    // Under way once its staging directory exists (a probe that takes the
    // workspace itself could make the Initialize the one refused).
    crate::common::ws::wait_staging(&agent.dir.path().join(".ws.sandbox-agent")).await;
    let r = c
        .agent()
        .release(proto::ReleaseRequest {
            lease_id: "trickle".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await;
    assert!(r.is_ok(), "{r:?}");
    let answered = init.await.expect("join");
    let e = answered.expect_err("the trickling Initialize is stopped");
    assert_eq!(e.code(), Code::Aborted, "{}", e.message());
    assert!(!ws.join("t.txt").exists(), "nothing of it was committed");
    drop(tx);
    assert_eq!(status(&c).await, proto::SandboxStatus::Idle);
}

/// A TTL expiring while a Dump is stalled releases the sandbox too (the
/// TTL release cancels the transfer, and a failed one is retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_release_is_not_blocked_by_a_stalled_dump() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        "[lifecycle]\nworkspace_wait_ms = 2000\nmin_ttl_seconds = 1\n",
    )
    .expect("config");
    let agent = Agent::start_in(dir, &["--config", &cfg.display().to_string()], &[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    fill(&agent.dir.path().join("ws"));
    lease(&c, "ttl", Some(1)).await;
    let mut stream = c
        .workspace()
        .dump(proto::DumpRequest::default())
        .await
        .expect("Dump")
        .into_inner();
    stream.message().await.expect("first chunk");
    eventually_async(
        Duration::from_secs(30),
        "released by its TTL",
        async || match status(&c).await {
            proto::SandboxStatus::Idle => Ok(()),
            s => Err(format!("{s:?}")),
        },
    )
    .await;
    drop(stream);
}

/// Runs `cmd` to completion within `within`, else kills it and fails: a
/// bound on a hang, not a performance figure.
fn finishes(mut cmd: std::process::Command, within: Duration, what: &str) -> std::process::Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(within) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            signal(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("{what}: still waiting after {within:?}");
        }
    }
}

/// Connections that never send a request (or only part of one) are closed
/// after the opening/header timeout, so they cannot hold every slot of a
/// listener: the control plane's health and the MCP data plane still
/// answer while as many silent connections as the limit are open.
#[test]
fn silent_connections_do_not_hold_the_listeners() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = write_token(dir.path());
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        "[limits]\nmax_connections_per_listener = 4\nhandshake_timeout_ms = 1000\n\
         [gateway]\nmax_connections_per_listener = 4\nheader_timeout_ms = 1000\n",
    )
    .expect("config");
    let port = crate::common::mcp::free_port();
    let tcp = format!("tcp://127.0.0.1:{port}");
    let agent = Agent::start_in(
        dir,
        &[
            "--config",
            &cfg.display().to_string(),
            "--listen",
            &tcp,
            "--token-file",
            &token.display().to_string(),
        ],
        &[],
    );
    // As many silent TCP connections as the control plane admits.
    let silent: Vec<_> = (0..4)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    let mut health = std::process::Command::new(&*CTL);
    health
        .args(["--agent", &tcp, "--token-file"])
        .arg(&token)
        .args(["--timeout", "20", "health"])
        .env_remove("SANDBOX_AGENT");
    let out = finishes(
        health,
        Duration::from_secs(60),
        "health behind silent connections",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    drop(silent);

    // Partial HTTP/1.1 request heads on the MCP data plane.
    let sock = agent.mcp_socket();
    let partial: Vec<_> = (0..4)
        .map(|_| {
            use std::io::Write;
            let mut s = std::os::unix::net::UnixStream::connect(&sock).expect("connect");
            s.write_all(b"POST /filesystem/mcp HTTP/1.1\r\nHost: localhost\r\n")
                .expect("partial head");
            s
        })
        .collect();
    let mut curl = std::process::Command::new("curl");
    curl.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--unix-socket",
    ])
    .arg(&sock)
    .arg("http://localhost/nope/mcp");
    let out = finishes(
        curl,
        Duration::from_secs(60),
        "the data plane behind partial requests",
    );
    // Answered (404: no such server in the lease), not stalled.
    assert_eq!(text(&out.stdout), "404");
    drop(partial);
}

fn mode_of(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

/// As a non-root agent, read-only directories swap in and out whole: moving
/// a directory to another parent needs write permission on it, so an
/// archive whose top-level directory is mode 0555 used to be moved in half
/// (and the journal then failed every restart). It is installed with its
/// modes, replaced by the next archive, and its old tree (a read-only
/// directory inside) is deleted. A directory the agent cannot make
/// movable (root's) refuses the swap before anything moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_directories_swap_whole_as_non_root() {
    if !root_or_skip("running the agent as nobody") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state").display().to_string();
    let agent = Agent::start_as(Some(65534), dir, &["--state-root", &state], &[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let ws = agent.dir.path().join("ws");
    let swap_state = agent.dir.path().join(".ws.sandbox-agent");

    let ro = Tar::new()
        .dir_mode("./ro/", 0o555)
        .dir_mode("./ro/sub/", 0o555)
        .file("./ro/sub/f.txt", b"read-only")
        .file("./top.txt", b"top")
        .end();
    initialize(&c, proto::InitializeHeader::default(), gzip(&ro))
        .await
        .expect("an archive with read-only directories");
    assert_eq!(mode_of(&ws.join("ro")), 0o555);
    assert_eq!(mode_of(&ws.join("ro/sub")), 0o555);
    assert_eq!(
        std::fs::read(ws.join("ro/sub/f.txt")).expect("f.txt"),
        b"read-only"
    );

    let next = Tar::new().file("./next.txt", b"next").end();
    initialize(&c, proto::InitializeHeader::default(), gzip(&next))
        .await
        .expect("replacing read-only directories");
    assert_eq!(names(&ws), ["next.txt"]);
    crate::common::ws::wait_empty(&swap_state).await;

    let locked = ws.join("locked");
    std::fs::create_dir(&locked).expect("root's directory");
    std::fs::write(locked.join("keep.txt"), "root's").expect("root's file");
    std::fs::set_permissions(&locked, std::os::unix::fs::PermissionsExt::from_mode(0o555))
        .expect("chmod");
    let other = Tar::new().file("./other.txt", b"other").end();
    let e = initialize(&c, proto::InitializeHeader::default(), gzip(&other))
        .await
        .expect_err("a swap that cannot move root's directory");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains("'locked'") && e.message().contains("nothing was changed"),
        "{}",
        e.message()
    );
    assert_eq!(names(&ws), ["locked", "next.txt"]);
    crate::common::ws::wait_empty(&swap_state).await;
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
