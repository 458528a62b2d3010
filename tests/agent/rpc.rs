//! The control plane through the library client and independent gRPC
//! clients: reflection, standard health, and honest answers without servers.

use crate::common::*;
use sandbox_client::proto;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

#[tokio::test]
async fn library_client_reads_info_and_health() {
    let agent = Agent::start(&[]);
    let client = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let info = client
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.agent_pid, agent.child.id());
    assert_eq!(info.status, proto::SandboxStatus::Idle as i32);
    let health = client
        .health()
        .check(proto::health::HealthCheckRequest {
            service: "sandbox.agent.v1.Agent".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(
        health.status,
        proto::health::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn without_a_manifest_lifecycle_rpcs_answer_honestly() {
    // No --manifest and no /etc/sandbox-agent/servers.toml: no servers.
    let agent = Agent::start(&[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let e = c
        .agent()
        .acquire(proto::AcquireRequest {
            lease_id: "l1".into(),
            all_servers: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("no servers"), "{}", e.message());
    let r = c
        .agent()
        .release(proto::ReleaseRequest::default())
        .await
        .expect("Release of an idle sandbox")
        .into_inner();
    assert_eq!(r.status, proto::SandboxStatus::Idle as i32);
    let e = c
        .agent()
        .reset(proto::ResetRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let list = c
        .servers()
        .list(proto::ListServersRequest {})
        .await
        .expect("List")
        .into_inner();
    assert!(list.servers.is_empty());
    let e = c
        .servers()
        .logs(proto::LogsRequest {
            name: "git".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test]
async fn reflection_lists_every_service() {
    let agent = Agent::start(&[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let mut refl = ServerReflectionClient::new(c.channel());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .expect("reflection")
        .into_inner();
    let resp = stream.next().await.expect("one response").expect("ok");
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection answer");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "sandbox.agent.v1.Agent",
            "sandbox.agent.v1.Exec",
            "sandbox.agent.v1.Servers",
            "sandbox.agent.v1.Workspace",
        ]
    );
}

#[test]
fn a_generic_client_works_without_our_proto_files() {
    let agent = Agent::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/grpc_generic.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(format!("unix:{}", agent.socket.display()))
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "generic client failed (the test command installs grpcio, grpcio-reflection, grpcio-health-checking):\n{}",
        text(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let services: Vec<&str> = v["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for s in [
        "sandbox.agent.v1.Agent",
        "sandbox.agent.v1.Workspace",
        "sandbox.agent.v1.Servers",
        "grpc.health.v1.Health",
    ] {
        assert!(services.contains(&s), "{services:?}");
    }
    assert_eq!(v["health"], "SERVING");
    assert_eq!(v["get_info"]["agent_pid"], agent.child.id());
    assert_eq!(v["get_info"]["status"], "SANDBOX_STATUS_IDLE");
    assert!(
        v["get_info"]["kernel_release"]
            .as_str()
            .is_some_and(|k| !k.is_empty())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_reports_not_serving_and_the_drain_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, "[limits]\nshutdown_grace_ms = 500\n").unwrap();
    let mut agent = Agent::start_in(dir, &["--config", cfg.to_str().unwrap()], &[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    // Watch never ends by itself: it is an RPC in flight that the drain
    // must not wait for forever.
    let mut watch = c
        .health()
        .watch(proto::health::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = watch.next().await.expect("first status").expect("ok");
    assert_eq!(
        first.status,
        proto::health::health_check_response::ServingStatus::Serving as i32
    );

    let start = std::time::Instant::now();
    signal(agent.child.id(), nix::sys::signal::Signal::SIGTERM);
    let next = tokio::time::timeout(std::time::Duration::from_secs(5), watch.next())
        .await
        .expect("watcher told before the connection closes");
    let not_serving = proto::health::health_check_response::ServingStatus::NotServing as i32;
    assert!(
        matches!(next, Some(Ok(ref r)) if r.status == not_serving),
        "{next:?}"
    );

    let status = tokio::task::spawn_blocking(move || {
        let st = agent.child.wait().unwrap();
        (st, agent)
    })
    .await
    .unwrap();
    let took = start.elapsed();
    assert!(
        status.0.success(),
        "{:?}\n{}",
        status.0,
        status.1.stderr.all()
    );
    assert!(
        took < std::time::Duration::from_secs(4),
        "drain bounded by the grace period: {took:?}"
    );
    assert!(
        status.1.stderr.all().contains("grace period over"),
        "{}",
        status.1.stderr.all()
    );
}
