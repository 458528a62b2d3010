//! The late-bound agent token (the Kubernetes backend's identity binding):
//! `Agent.BindToken` replaces the token the control plane and the MCP data
//! plane admit, so the pool's bootstrap secret (and then each lease's token)
//! admits nothing afterwards; a refused token changes nothing; health stays
//! open throughout. Real agent, real TCP listeners.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;
use tonic::Code;

use crate::common::mcp::*;
use crate::common::*;
use sandbox_client::auth::Token;
use sandbox_client::proto;

const T1: &str = "lease-one-token-0123456789";
const T2: &str = "lease-two-token-0123456789";

/// An agent with a TCP control plane and a TCP data plane, both checking
/// its token (the bootstrap secret, [`TOKEN`]).
struct Pod {
    agent: Agent,
    /// `tcp://127.0.0.1:PORT` of the control plane.
    grpc: String,
    /// `127.0.0.1:PORT` of the MCP data plane.
    mcp: String,
}

impl Pod {
    fn start() -> Pod {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = write_token(dir.path());
        let state = dir.path().join("state");
        let manifest = dir.path().join("servers.toml");
        std::fs::write(&manifest, shipped_manifest(&state)).expect("manifest");
        // Port 0 once only: the agent refuses an endpoint listed twice.
        let mcp = format!("tcp://127.0.0.1:{}", free_port());
        let agent = Agent::start_in(
            dir,
            &[
                "--manifest",
                &manifest.display().to_string(),
                "--token-file",
                &token.display().to_string(),
                "--listen",
                "tcp://127.0.0.1:0",
                "--mcp-listen",
                &mcp,
            ],
            &[],
        );
        // The control plane's port, as bound (the scripts' loopback
        // listener logs "MCP data plane listening" too: not this one).
        let line = agent
            .stderr
            .wait_for(Duration::from_secs(5), |l| {
                l.contains("listening")
                    && l.contains("endpoint=tcp://")
                    && !l.contains("MCP data plane")
            })
            .unwrap_or_else(|| panic!("no tcp listener; stderr:\n{}", agent.stderr.all()));
        let at = line.find("endpoint=").expect("endpoint") + "endpoint=".len();
        let grpc = line[at..]
            .split_whitespace()
            .next()
            .expect("uri")
            .to_owned();
        let mcp = mcp.trim_start_matches("tcp://").to_owned();
        Pod { agent, grpc, mcp }
    }

    async fn client(&self, token: Option<&str>) -> sandbox_client::Client {
        sandbox_client::ConnectOptions {
            token: token.map(|t| Token::new(t, "test").expect("token")),
            ..Default::default()
        }
        .connect(&self.grpc)
        .await
        .expect("connect")
    }

    /// GetInfo over TCP with `token`.
    async fn info(&self, token: &str) -> Result<(), tonic::Status> {
        self.client(Some(token))
            .await
            .agent()
            .get_info(proto::GetInfoRequest {})
            .await
            .map(drop)
    }

    async fn bind(&self, with: &str, new: &str) -> Result<(), tonic::Status> {
        self.client(Some(with))
            .await
            .agent()
            .bind_token(proto::BindTokenRequest { token: new.into() })
            .await
            .map(drop)
    }

    /// The HTTP status of an MCP `initialize` POSTed to the filesystem
    /// server's endpoint with `token`.
    fn mcp_status(&self, token: &str) -> u16 {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "token-binding", "version": "0"}}})
        .to_string();
        let mut sock = TcpStream::connect(&self.mcp).expect("data plane");
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        write!(
            sock,
            "POST /filesystem/mcp HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.mcp,
            body.len()
        )
        .expect("request");
        let mut out = String::new();
        let _ = sock.read_to_string(&mut out);
        out.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP status in {out:?}"))
    }

    /// Health answers without any token.
    async fn health_is_open(&self) {
        let serving = self.client(None).await.serving().await;
        assert_eq!(serving.ok(), Some(true), "health without a token");
    }

    /// `token` admits nothing: UNAUTHENTICATED on gRPC, 401 on the data plane.
    async fn refused(&self, token: &str) {
        let e = self.info(token).await.expect_err("an unbound token");
        assert_eq!(e.code(), Code::Unauthenticated, "{e}");
        assert_eq!(e.message(), "wrong bearer token");
        assert_eq!(self.mcp_status(token), 401, "data plane, {token}");
    }

    /// `token` is admitted on both planes (the data plane answers past its
    /// token check: 404 without a lease, 200 with the filesystem leased).
    async fn admitted(&self, token: &str) {
        self.info(token)
            .await
            .unwrap_or_else(|e| panic!("GetInfo with {token}: {e}"));
        let code = self.mcp_status(token);
        assert!(code == 200 || code == 404, "data plane, {token}: {code}");
    }

    async fn acquire(&self, token: &str, lease: &str) {
        self.client(Some(token))
            .await
            .agent()
            .acquire(proto::AcquireRequest {
                lease_id: lease.into(),
                server_names: vec!["filesystem".into()],
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("Acquire {lease}: {e}\n{}", self.agent.stderr.all()));
    }

    async fn release(&self, token: &str, lease: &str) {
        self.client(Some(token))
            .await
            .agent()
            .release(proto::ReleaseRequest {
                lease_id: lease.into(),
                is_ttl: false,
                ..Default::default()
            })
            .await
            .expect("Release");
    }
}

#[tokio::test]
async fn binding_refuses_the_bootstrap_secret_on_both_planes() {
    let pod = Pod::start();
    pod.health_is_open().await;
    pod.admitted(TOKEN).await;
    // A connection opened with the bootstrap secret before the binding.
    let before = pod.client(Some(TOKEN)).await;
    before
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("GetInfo before");

    pod.bind(TOKEN, T1).await.expect("BindToken t1");
    pod.refused(TOKEN).await;
    let e = before
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect_err("the same connection, the old token");
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    pod.admitted(T1).await;
    pod.acquire(T1, "l1").await;
    assert_eq!(pod.mcp_status(T1), 200);
    assert_eq!(pod.mcp_status(TOKEN), 401);
    // The bootstrap secret cannot bind again either.
    let e = pod
        .bind(TOKEN, T2)
        .await
        .expect_err("bind with the old token");
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    pod.health_is_open().await;
    assert!(
        pod.agent.stderr.all().contains("agent token bound"),
        "the rotation is logged"
    );
    assert!(
        !pod.agent.stderr.all().contains(T1),
        "the token itself is never logged"
    );
}

#[tokio::test]
async fn the_next_lease_s_token_refuses_the_last_lease_s() {
    let pod = Pod::start();
    pod.bind(TOKEN, T1).await.expect("BindToken t1");
    pod.acquire(T1, "l1").await;
    assert_eq!(pod.mcp_status(T1), 200);
    pod.release(T1, "l1").await;

    pod.bind(T1, T2)
        .await
        .expect("BindToken t2, called with t1");
    pod.refused(T1).await;
    pod.refused(TOKEN).await;
    pod.admitted(T2).await;
    pod.acquire(T2, "l2").await;
    assert_eq!(pod.mcp_status(T2), 200);
    assert_eq!(pod.mcp_status(T1), 401);
    pod.health_is_open().await;
}

#[tokio::test]
async fn a_token_the_agent_would_refuse_changes_nothing() {
    let pod = Pod::start();
    pod.bind(TOKEN, T1).await.expect("BindToken t1");
    for (bad, why) in [
        ("short", "at least 16"),
        ("has a space 0123456789", "printable ASCII"),
        ("", "empty"),
        (T1, "in force"),
    ] {
        let e = pod.bind(T1, bad).await.expect_err(bad);
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e}");
        assert!(e.message().contains(why), "{bad:?}: {e}");
    }
    pod.admitted(T1).await;
    pod.refused(TOKEN).await;
    pod.health_is_open().await;
}

#[tokio::test]
async fn an_agent_without_a_token_has_nothing_to_bind() {
    let agent = Agent::start(&[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let e = c
        .agent()
        .bind_token(proto::BindTokenRequest { token: T1.into() })
        .await
        .expect_err("no token configured");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    c.agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("still open on unix");
}

#[test]
fn sandboxctl_binds_a_token_from_a_file() {
    let pod = Pod::start();
    let file = pod.agent.dir.path().join("lease.token");
    std::fs::write(&file, format!("{T1}\n")).expect("token file");
    let bind = ctl(&[
        "--agent",
        &pod.grpc,
        "--token",
        TOKEN,
        "bind-token",
        "--new-token-file",
        file.to_str().expect("path"),
    ]);
    assert!(bind.status.success(), "{}", text(&bind.stderr));
    let old = ctl(&["--agent", &pod.grpc, "--token", TOKEN, "info"]);
    assert_eq!(old.status.code(), Some(1));
    assert!(
        text(&old.stderr).contains("wrong bearer token"),
        "{}",
        text(&old.stderr)
    );
    let new = ctl(&["--agent", &pod.grpc, "--token", T1, "info"]);
    assert!(new.status.success(), "{}", text(&new.stderr));
}
