//! Lazy leases (`AcquireRequest.lazy`): the Acquire starts nothing, each
//! server starts on its first data-plane request (which waits for it), the
//! states say so truthfully, Reset brings them back to idle, Release stops
//! only what started, and a server that cannot start answers its first
//! request with why.

use std::time::Duration;

use crate::common::mcp::*;
use crate::common::servers::*;
use crate::common::*;
use sandbox_client::proto;

const IDLE: i32 = proto::ServerState::Idle as i32;
const READY: i32 = proto::ServerState::Ready as i32;

fn lazy(id: &str, names: &[&str]) -> proto::AcquireRequest {
    proto::AcquireRequest {
        lazy: true,
        ..acquire_req(id, names)
    }
}

/// `sandboxctl mcp SERVER tools` on a thread; its output and success.
fn tools(agent: &Agent, server: &str) -> std::thread::JoinHandle<(bool, String)> {
    let at = agent.unix_uri();
    let mcp = format!("unix://{}", agent.mcp_socket().display());
    let server = server.to_owned();
    std::thread::spawn(move || {
        let out = ctl(&["--agent", &at, "--mcp", &mcp, "mcp", &server, "tools"]);
        (
            out.status.success(),
            format!("{}{}", text(&out.stdout), text(&out.stderr)),
        )
    })
}

#[tokio::test]
async fn a_lazy_lease_starts_only_the_servers_used() {
    let agent = agent_with("", "");
    let c = client(&agent).await;
    let r = c
        .agent()
        .acquire(lazy("lazy-1", &["filesystem", "git", "localmemory"]))
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()))
        .into_inner();
    assert_eq!(r.status, proto::SandboxStatus::Occupied as i32);
    assert!(r.lease.as_ref().is_some_and(|l| l.lazy), "{r:?}");
    for s in &r.servers {
        assert_eq!((s.state, s.pid), (IDLE, 0), "{s:?}");
        assert_eq!(s.status, proto::SandboxStatus::Occupied as i32);
    }
    assert!(
        descendants(agent.child.id()).is_empty(),
        "a lazy Acquire starts no process"
    );
    // Health tells the truth: not serving, and sandboxctl says why.
    let at = agent.unix_uri();
    let out = ctl(&["--agent", &at, "health", "--service", "mcp/git"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stdout).contains("mcp/git: NOT_SERVING (idle)"),
        "{}",
        text(&out.stdout)
    );

    // Two first requests at once: both answered, one process started.
    let (a, b) = (tools(&agent, "filesystem"), tools(&agent, "filesystem"));
    for h in [a, b] {
        let (ok, out) = h.join().expect("thread");
        assert!(ok && out.contains("read_text_file"), "{out}");
    }
    let s = states(&c).await;
    assert_eq!(s["filesystem"].0, READY, "{s:?}");
    assert_eq!(s["git"], (IDLE, 0), "{s:?}");
    assert_eq!(s["localmemory"], (IDLE, 0), "{s:?}");
    let fs = server(&c, "filesystem").await;
    assert_eq!(fs.restarts, 0, "started once: {fs:?}");

    // Reset: back to right after the Acquire, every server idle.
    let r = reset(&c, "lazy-1").await;
    assert!(r.servers.iter().all(|s| s.state == IDLE), "{r:?}");
    eventually(Duration::from_secs(10), "no server process", || {
        when(descendants(agent.child.id()).is_empty(), || {
            "processes left".into()
        })
    });

    // Used again, then released: what started stops, the rest never ran.
    let (ok, out) = tools(&agent, "git").join().expect("thread");
    assert!(ok && out.contains("git_status"), "{out}");
    release(&c, "lazy-1").await;
    let s = states(&c).await;
    for (name, (state, pid)) in &s {
        assert_eq!(
            (*state, *pid),
            (proto::ServerState::Stopped as i32, 0),
            "{name}: {s:?}"
        );
    }
    assert!(descendants(agent.child.id()).is_empty());
}

#[tokio::test]
async fn a_lazy_server_that_cannot_start_answers_its_first_request_with_why() {
    let extra = r#"
[servers.broken]
command = "sh"
args = ["-c", "echo 'broken: no such config file /etc/broken.conf' >&2; exit 3"]
restart = { initial_backoff_ms = 50, max_backoff_ms = 100, max_restarts = 1, window_ms = 30000 }
"#;
    let agent = agent_with(extra, "");
    let c = client(&agent).await;
    c.agent()
        .acquire(lazy("lazy-2", &["broken", "localmemory"]))
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()));
    let (ok, out) = tools(&agent, "broken").join().expect("thread");
    assert!(!ok, "{out}");
    assert!(
        out.contains("503") && out.contains("no such config file /etc/broken.conf"),
        "the first request says why: {out}"
    );
    let broken = server(&c, "broken").await;
    assert_eq!(
        broken.state,
        proto::ServerState::Failed as i32,
        "{broken:?}"
    );
    assert_eq!(broken.status, proto::SandboxStatus::Error as i32);
    let info = c
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.status, proto::SandboxStatus::Error as i32);
    // The other server is unaffected.
    let (ok, out) = tools(&agent, "localmemory").join().expect("thread");
    assert!(ok && out.contains("read_graph"), "{out}");
    c.agent()
        .release(proto::ReleaseRequest::default())
        .await
        .expect("Release");
    assert!(descendants(agent.child.id()).is_empty());
}
