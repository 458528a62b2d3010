//! `Agent.Narrow`: a warm lease handed to its tenant. Refused, with the
//! code a host falls back on, when the result would not be what a cold
//! Acquire gives; otherwise renamed and trimmed at once, the dropped
//! servers stopped and their state wiped after the answer.

use std::time::Duration;

use crate::common::mcp::*;
use crate::common::*;
use sandbox_client::proto;
use tonic::Code;

/// A Toolathlon lease `lease` of arxiv and localmemory (`lazy`: neither
/// started).
async fn acquire_arxiv_and_memory(
    c: &sandbox_client::Client,
    agent: &Agent,
    lease: &str,
    lazy: bool,
) {
    c.agent()
        .acquire(proto::AcquireRequest {
            lease_id: lease.into(),
            server_names: vec!["arxiv".into(), "localmemory".into()],
            benchmark: proto::Benchmark::Toolathlon as i32,
            ttl_seconds: Some(0),
            lazy,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()));
}

/// Initialize with one file, `task.txt`.
async fn upload_task(c: &sandbox_client::Client) {
    crate::common::ws::initialize(
        c,
        proto::InitializeHeader::default(),
        crate::common::ws::gzip(&crate::common::ws::Tar::new().file("./task.txt", b"t").end()),
    )
    .await
    .expect("upload");
}

/// The names at the top of the workspace `ws`, sorted.
fn listing(ws: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(ws)
        .expect("workspace")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn narrow(lease: &str, new: &str, names: &[&str]) -> proto::NarrowRequest {
    proto::NarrowRequest {
        lease_id: lease.into(),
        new_lease_id: new.into(),
        server_names: names.iter().map(|s| s.to_string()).collect(),
        ttl_seconds: Some(0),
        ..Default::default()
    }
}

#[tokio::test]
async fn narrow_refuses_what_a_cold_acquire_would_not_give_and_trims_the_rest() {
    let agent = agent_with("", "");
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    c.agent()
        .acquire(proto::AcquireRequest {
            lease_id: "warm".into(),
            server_names: vec!["filesystem".into(), "localmemory".into()],
            ttl_seconds: Some(0),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()));
    let memory_state = state_dir(&agent).join("memory");
    std::fs::write(memory_state.join("memory.jsonl"), "{}\n").expect("state file");

    let refused = [
        (
            narrow("other", "t", &["filesystem"]),
            Code::NotFound,
            "no lease \"other\"",
        ),
        (
            narrow("warm", "a b", &["filesystem"]),
            Code::InvalidArgument,
            "lease_id",
        ),
        (
            narrow("warm", "t", &[]),
            Code::InvalidArgument,
            "name at least one",
        ),
        (
            narrow("warm", "t", &["git", "filesystem"]),
            Code::FailedPrecondition,
            "git not in the lease (filesystem, localmemory)",
        ),
        (
            proto::NarrowRequest {
                benchmark: proto::Benchmark::Toolathlon as i32,
                ..narrow("warm", "t", &["filesystem"])
            },
            Code::FailedPrecondition,
            "acquired for benchmark none, not Toolathlon",
        ),
    ];
    for (req, code, says) in refused {
        let e = c.agent().narrow(req.clone()).await.expect_err("refused");
        assert_eq!(e.code(), code, "{req:?}: {e}");
        assert!(e.message().contains(says), "{req:?}: {}", e.message());
    }
    // Refusals changed nothing.
    let info = c
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    let lease = info.lease.expect("lease");
    assert_eq!(lease.lease_id, "warm");
    assert_eq!(lease.server_names, ["filesystem", "localmemory"]);

    let r = c
        .agent()
        .narrow(proto::NarrowRequest {
            test_account_email: "t@example.com".into(),
            ..narrow("warm", "tenant", &["filesystem"])
        })
        .await
        .expect("Narrow")
        .into_inner();
    let lease = r.lease.expect("lease");
    assert_eq!(lease.lease_id, "tenant");
    assert_eq!(lease.server_names, ["filesystem"]);
    assert_eq!(lease.test_account_email, "t@example.com");
    assert_eq!(r.servers.len(), 1);
    assert_eq!(r.servers[0].state, proto::ServerState::Ready as i32);
    // localmemory left the lease at once, and stops with its state wiped.
    let stopped = eventually_async(
        Duration::from_secs(10),
        "localmemory stops and its state is wiped",
        async || {
            let all = c
                .servers()
                .list(proto::ListServersRequest {})
                .await
                .expect("List")
                .into_inner()
                .servers;
            let m = all
                .into_iter()
                .find(|s| s.name == "localmemory")
                .expect("listed");
            // The wipe follows the stop: wait for both.
            let left = std::fs::read_dir(&memory_state).expect("state dir").count();
            if m.pid == 0 && m.state == proto::ServerState::Stopped as i32 && left == 0 {
                Ok(m)
            } else {
                Err(format!("{m:?}, {left} entries left in its state dir"))
            }
        },
    )
    .await;
    assert!(!stopped.in_lease);
    // The warm id is gone; the tenant's releases.
    let e = c
        .agent()
        .release(proto::ReleaseRequest {
            lease_id: "warm".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect_err("not current");
    assert_eq!(e.code(), Code::NotFound);
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: "tenant".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("Release");
    assert!(descendants(agent.child.id()).is_empty());
}

/// A warm Toolathlon lease of arxiv and localmemory, narrowed to
/// localmemory, leaves the workspace a cold Acquire of localmemory gives:
/// its `memory/` directory, not arxiv's `arxiv_local_storage/`; and an
/// upload after it keeps only what the kept profile keeps.
#[tokio::test]
async fn narrowing_drops_the_dropped_servers_workspace_dirs() {
    let agent = agent_with("", "");
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let ws = agent.dir.path().join("ws");
    let listing = || listing(&ws);
    acquire_arxiv_and_memory(&c, &agent, "warm", false).await;
    assert_eq!(listing(), ["arxiv_local_storage", "memory"]);
    let mut n = narrow("warm", "tenant", &["localmemory"]);
    n.benchmark = proto::Benchmark::Toolathlon as i32;
    c.agent().narrow(n).await.expect("Narrow");
    assert_eq!(listing(), ["memory"]);
    upload_task(&c).await;
    assert_eq!(listing(), ["memory", "task.txt"]);
}

/// A lazy Toolathlon lease of arxiv and localmemory: the workspace holds
/// no server's directory until that server starts (as Toolathlon makes
/// `arxiv_local_storage/` only where its arxiv server runs), the started
/// server's directory is kept by an upload, and the one never started
/// never appears, in the workspace or its dump.
#[tokio::test]
async fn a_server_s_workspace_dirs_come_with_its_start() {
    let agent = agent_with("", "");
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let ws = agent.dir.path().join("ws");
    let listing = || listing(&ws);
    acquire_arxiv_and_memory(&c, &agent, "lazy", true).await;
    assert_eq!(listing(), Vec::<String>::new(), "before any server starts");
    c.servers()
        .start(proto::ServerRequest {
            name: "localmemory".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("Servers.Start: {e}\n{}", agent.stderr.all()));
    assert_eq!(listing(), ["memory"]);
    upload_task(&c).await;
    assert_eq!(listing(), ["memory", "task.txt"]);
    let (dump, _) = crate::common::ws::dump(&c, proto::DumpRequest::default())
        .await
        .expect("Dump");
    let names = crate::common::ws::entry_names(&dump);
    assert!(names.iter().any(|n| n.contains("task.txt")), "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains("arxiv_local_storage")),
        "{names:?}"
    );
}
