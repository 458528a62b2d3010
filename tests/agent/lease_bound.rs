//! Issue 35, the agent's side: a request bound to a lease (the host's
//! `sandbox-lease` metadata or header) is refused once that lease has
//! ended, checked after its body is read and before it touches a server
//! or the workspace; a data-plane request without the header is bound to
//! the lease current when its head arrived.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::json;
use tonic::Code;

use crate::common::mcp::*;
use crate::common::*;
use sandbox_client::proto;

async fn acquire(c: &sandbox_client::Client, agent: &Agent, lease: &str) {
    c.agent()
        .acquire(proto::AcquireRequest {
            lease_id: lease.into(),
            server_names: vec!["filesystem".into()],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("Acquire {lease}: {e}\n{}", agent.stderr.all()));
}

async fn release(c: &sandbox_client::Client, lease: &str) {
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: lease.into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("Release");
}

/// A POST to the data plane whose body is held back after `first` bytes.
struct Stalled {
    sock: UnixStream,
    rest: Vec<u8>,
}

impl Stalled {
    fn start(agent: &Agent, lease: Option<&str>, body: &[u8], first: usize) -> Stalled {
        let mut sock = UnixStream::connect(agent.mcp_socket()).expect("data plane");
        sock.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut head = format!(
            "POST /filesystem/mcp HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        if let Some(l) = lease {
            head.push_str(&format!("sandbox-lease: {l}\r\n"));
        }
        head.push_str("\r\n");
        // One write: the agent may answer and close as soon as it has read
        // the head, so the head and the first bytes go in together.
        let mut start = head.into_bytes();
        start.extend_from_slice(&body[..first]);
        sock.write_all(&start).expect("head and first bytes");
        Stalled {
            sock,
            rest: body[first..].to_vec(),
        }
    }

    /// Sends the rest and reads the answer. An agent that refused at the
    /// head may have closed its end already (a broken pipe here); its
    /// answer is still in the socket to read.
    fn finish(mut self) -> String {
        if let Err(e) = self.sock.write_all(&self.rest) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "the rest: {e}");
        }
        let mut out = String::new();
        let _ = self.sock.read_to_string(&mut out);
        out
    }
}

fn read_secret() -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
           "params": {"name": "read_text_file", "arguments": {"path": "secret.txt"}}})
    .to_string()
    .into_bytes()
}

#[tokio::test]
async fn a_data_plane_request_of_an_ended_lease_never_reaches_the_next_leases_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let manifest = dir.path().join("servers.toml");
    std::fs::write(&manifest, shipped_manifest(&state)).expect("manifest");
    let agent = Agent::start_in(dir, &["--manifest", &manifest.display().to_string()], &[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    acquire(&c, &agent, "lease-a").await;
    let body = read_secret();
    let named = Stalled::start(&agent, Some("lease-a"), &body, 5);
    let unnamed = Stalled::start(&agent, None, &body, 5);
    release(&c, "lease-a").await;
    acquire(&c, &agent, "lease-b").await;
    std::fs::write(
        agent.dir.path().join("ws").join("secret.txt"),
        "secret of lease b",
    )
    .expect("secret");
    for (what, stalled) in [("named", named), ("unnamed", unnamed)] {
        let answer = tokio::task::spawn_blocking(move || stalled.finish())
            .await
            .expect("finish");
        assert!(
            answer.starts_with("HTTP/1.1 404") && answer.contains("has ended"),
            "the {what} request of lease-a: {answer}"
        );
        assert!(!answer.contains("secret of lease b"), "{answer}");
    }
    // A lease the header names that is not current is refused at once.
    let late = Stalled::start(&agent, Some("lease-a"), &body, body.len());
    let answer = tokio::task::spawn_blocking(move || late.finish())
        .await
        .expect("finish");
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    // The current lease's own requests go through.
    let own = Stalled::start(&agent, Some("lease-b"), &body, body.len());
    let answer = tokio::task::spawn_blocking(move || own.finish())
        .await
        .expect("finish");
    assert!(answer.contains("secret of lease b"), "{answer}");
}

#[tokio::test]
async fn calls_bound_to_an_ended_lease_are_refused_and_change_nothing() {
    let agent = Agent::start(&[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let acq = |lease: &str| proto::AcquireRequest {
        lease_id: lease.into(),
        no_servers: true,
        ..Default::default()
    };
    c.agent().acquire(acq("lease-a")).await.expect("acquire a");
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: "lease-a".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("release a");
    c.agent().acquire(acq("lease-b")).await.expect("acquire b");
    std::fs::write(agent.dir.path().join("ws").join("b.txt"), "b").expect("b's file");
    let old = c.for_lease("lease-a");
    let ws = || old.workspace();

    let header = proto::InitializeRequest {
        msg: Some(proto::initialize_request::Msg::Header(
            proto::InitializeHeader::default(),
        )),
    };
    let chunk = proto::InitializeRequest {
        msg: Some(proto::initialize_request::Msg::Chunk(
            crate::common::ws::gzip(&crate::common::ws::Tar::new().file("a.txt", b"a").end())
                .into(),
        )),
    };
    let init = ws().initialize(tokio_stream::iter([header, chunk])).await;
    assert_eq!(init.map(|_| ()).unwrap_err().code(), Code::NotFound);
    let dump = ws().dump(proto::DumpRequest::default()).await;
    assert_eq!(dump.map(|_| ()).unwrap_err().code(), Code::NotFound);
    let clear = ws().clear(proto::ClearRequest {}).await;
    let e = clear.map(|_| ()).unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert!(
        e.message().contains("has ended") && !e.message().contains("lease-b"),
        "the answer never names the lease now: {e}"
    );
    let list = old.exec().list(proto::ExecListRequest::default()).await;
    assert_eq!(list.map(|_| ()).unwrap_err().code(), Code::NotFound);
    let reset = old.agent().reset(proto::ResetRequest::default()).await;
    assert_eq!(reset.map(|_| ()).unwrap_err().code(), Code::NotFound);
    // A message naming one lease and metadata another: refused.
    let mixed = old
        .exec()
        .list(proto::ExecListRequest {
            lease_id: "lease-b".into(),
        })
        .await;
    assert_eq!(mixed.map(|_| ()).unwrap_err().code(), Code::InvalidArgument);
    // Nothing changed; the current lease's calls work.
    assert_eq!(
        std::fs::read_to_string(agent.dir.path().join("ws").join("b.txt")).expect("b.txt"),
        "b"
    );
    assert!(!agent.dir.path().join("ws").join("a.txt").exists());
    c.for_lease("lease-b")
        .workspace()
        .dump(proto::DumpRequest::default())
        .await
        .expect("the current lease's dump");
}
