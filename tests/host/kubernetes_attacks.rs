//! The kubernetes backend under attack: an owner, a pod or a slow API
//! server trying to get more than the host means to give, through real
//! replicas on the real kube-apiserver (`kube_cluster::Real`), or on the
//! stand-in (`kube_api`) where the API server must stall. An owner's
//! Acquires racing over its cap across two replicas are in `kube_real`.

use std::path::Path;
use std::time::{Duration, Instant};

use super::common::host::{KEY_A, acquire, http, put, script_archive};
use super::common::{Agent, eventually};
use super::kube_api::KubeApi;
use super::kube_cluster::{Cluster, Real};
use super::kubernetes::{Fleet, claims_left, claims_within, fleet, pod_on, replica_on};

/// A fleet of one pod on loopback address `ip` (its agent on `ports`),
/// and the stand-in API server that lists it.
fn one_pod(dir: &Path, ip: &str, ports: (u16, u16)) -> (Fleet, Agent, KubeApi) {
    let f = fleet(dir);
    let pod = pod_on(ip, &f.bootstrap, ports.0, ports.1);
    let api = KubeApi::start(dir, &[ip.to_owned()]);
    (f, pod, api)
}

/// [`one_pod`] on the real API server.
fn one_real_pod(dir: &Path, ip: &str, ports: (u16, u16)) -> (Fleet, Agent, Real) {
    let f = fleet(dir);
    let pod = pod_on(ip, &f.bootstrap, ports.0, ports.1);
    (f, pod, Real::new(&[ip.to_owned()]))
}

/// A replica on `api`, its claims timing out after 30 s.
fn on(
    dir: &Path,
    f: &Fleet,
    api: &dyn Cluster,
    ports: (u16, u16),
    extra: &[&str],
) -> super::common::host::Host {
    replica_on(dir, f, &api.kubeconfig(), 30, ports, extra)
}

/// An API server that accepts a request and never answers it (here the
/// sandbox's GET) must not hold an Acquire past `--kube-claim-timeout`:
/// the client gets a 503 about as soon as the wait is over, and the claim
/// is deleted.
#[test]
fn a_stalled_api_server_cannot_hold_an_acquire_past_the_claim_timeout() {
    const PORTS: (u16, u16) = (47210, 47211);
    let dir = tempfile::tempdir().expect("tempdir");
    let (f, _pod, api) = one_pod(dir.path(), "127.0.91.1", PORTS);
    let host = replica_on(dir.path(), &f, &api.kubeconfig, 2, PORTS, &[]);
    api.lock().stall_sandbox_gets = true;

    let url = format!("{}/local-sandbox", host.base);
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(http(
            "POST",
            &url,
            Some(KEY_A),
            Some(r#"{"server_names": ["filesystem"]}"#),
        ));
    });
    let Ok((code, v)) = rx.recv_timeout(Duration::from_secs(30)) else {
        panic!(
            "an Acquire with --kube-claim-timeout 2 still waits after {:?} on a stalled API server",
            started.elapsed()
        );
    };
    assert_eq!(code, 503, "{v}");
    claims_left(&api, 0);
}

/// Replicas share `--data-dir` for uploads. One replica starting (a
/// rolling update, a crash, a scale-up) must not delete the archives that
/// owners uploaded through the others for their live sandboxes.
#[test]
fn a_replica_starting_keeps_the_uploads_of_live_sandboxes() {
    const PORTS: (u16, u16) = (47220, 47221);
    let dir = tempfile::tempdir().expect("tempdir");
    let (f, _pod, api) = one_real_pod(dir.path(), "127.0.92.1", PORTS);
    let a = on(dir.path(), &f, &api, PORTS, &[]);
    let acq = acquire(&a, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = acq["local_sandbox_id"].as_str().expect("id").to_owned();
    let (code, u) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/upload-url", a.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{u}");
    let (code, v) = put(
        u["upload_url"].as_str().expect("upload_url"),
        &script_archive("print('kept')\n"),
    );
    assert_eq!(code, 200, "{v}");

    // Another replica starts on the same fleet and volume.
    let _b = on(dir.path(), &f, &api, PORTS, &[]);

    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/initialize", a.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(
        code, 200,
        "the upload of a live sandbox was deleted by another replica's start: {v}"
    );
}

/// An owner whose client gives up on an Acquire once its pod is claimed
/// (a client timeout; here while the lease is being recorded in the
/// claim, the API server slow to answer): the claim must not stay behind
/// in phase `acquiring`, listed by no one, reaped by no one, holding a
/// warm pod and counting against the owner forever.
#[test]
fn an_acquire_abandoned_after_its_claim_leaks_no_claim() {
    use std::io::Write;
    const PORTS: (u16, u16) = (47230, 47231);
    let dir = tempfile::tempdir().expect("tempdir");
    let (f, _pod, api) = one_pod(dir.path(), "127.0.93.1", PORTS);
    let host = on(dir.path(), &f, &api, PORTS, &[]);
    api.lock().stall_patches = true;

    let addr = host.base.trim_start_matches("http://").to_owned();
    let mut conn = std::net::TcpStream::connect(&addr).expect("connect");
    let body = r#"{"server_names": ["filesystem"]}"#;
    write!(
        conn,
        "POST /local-sandbox HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY_A}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    eventually(Duration::from_secs(60), "the lease being recorded", || {
        let c = api.lock();
        if c.requests.iter().any(|r| r.starts_with("PATCH")) {
            Ok(())
        } else {
            Err(format!("{:?}", c.requests))
        }
    });
    api.lock().stall_patches = false;
    // The client gives up.
    drop(conn);

    claims_left(&api, 0);
}

/// A replica that stops mid-Acquire (killed, its node lost) runs no
/// guard: its claim stays `acquiring`, with the hosts' finalizer, listed
/// by no one, so its owner cannot release it, and counted against the
/// owner's cap. A release whose claim delete failed half-way leaves a
/// claim no one lists either. The replicas still running must end both
/// once no Acquire or release can still be at work on them.
#[test]
fn claims_left_by_a_stopped_replica_or_a_failed_delete_are_deleted() {
    const PORTS: (u16, u16) = (47240, 47241);
    let dir = tempfile::tempdir().expect("tempdir");
    let (f, _pod, api) = one_real_pod(dir.path(), "127.0.94.1", PORTS);
    // Left acquiring by a replica killed mid-Acquire.
    plant_claim(
        &api,
        "0badc0de-0000-4000-8000-000000000001",
        "acquiring",
        false,
    );
    // Released, but its delete failed half-way (terminating, the
    // finalizer still on).
    plant_claim(
        &api,
        "0badc0de-0000-4000-8000-000000000002",
        "released",
        true,
    );
    let cap = ["--max-sandboxes-per-key", "1"];
    let host = on(dir.path(), &f, &api, PORTS, &cap);
    claims_left(&api, 0);
    // Its owner's cap is whole again.
    acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
}

/// A claim as a host makes it for alice's lease `id` in `phase`, written
/// long ago; `deleting`: terminating, held by the hosts' finalizer.
fn plant_claim(api: &Real, id: &str, phase: &str, deleting: bool) {
    use sha2::Digest;
    let name = format!("sbx-{id}");
    let owner_hash: String = sha2::Sha256::digest(b"alice")[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let record = serde_json::json!({
        "sandbox_id": id, "owner": "alice", "pool": "sandbox-default",
        "phase": phase, "servers": [],
        "created_at": "2020-01-01T00:00:00.000000+00:00",
        "updated_at": "2020-01-01T00:00:00.000000+00:00"
    });
    api.create_claim(serde_json::json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
        "metadata": {
            "name": name, "namespace": api.ns,
            "labels": {
                "sandbox-agent.dev/managed-by": "sandbox-host",
                "sandbox-agent.dev/sandbox-id": id,
                "sandbox-agent.dev/owner-hash": owner_hash
            },
            "annotations": {"sandbox-agent.dev/lease": record.to_string()},
            "finalizers": ["sandbox-agent.dev/lease"]
        },
        "spec": {"warmPoolRef": {"name": "no-such-pool"}}
    }));
    if deleting {
        api.delete_claim(&name);
    }
}

/// Behind one Service, a sandbox's upload and its release land on any
/// replica. Uploads counted by one replica for a sandbox another replica
/// released must stop counting against the owner: else, over a
/// benchmark's run, the owner's upload allowance on that replica is used
/// up by sandboxes long gone and every upload there is refused.
#[test]
fn uploads_of_a_sandbox_released_elsewhere_stop_counting() {
    const PORTS: (u16, u16) = (47250, 47251);
    let dir = tempfile::tempdir().expect("tempdir");
    let f = fleet(dir.path());
    let ips = ["127.0.95.1".to_owned(), "127.0.95.2".to_owned()];
    let _pods: Vec<Agent> = ips
        .iter()
        .map(|ip| pod_on(ip, &f.bootstrap, PORTS.0, PORTS.1))
        .collect();
    let api = Real::new(&ips);
    let archive = script_archive("print('counted')\n");
    // Room for one such archive, not two.
    let per_key = (archive.len() * 3 / 2).to_string();
    let quota = ["--max-stored-bytes-per-key", per_key.as_str()];
    let a = on(dir.path(), &f, &api, PORTS, &quota);
    let b = on(dir.path(), &f, &api, PORTS, &quota);

    let upload_through_a = |id: &str| {
        let (code, u) = http(
            "POST",
            &format!("{}/local-sandbox/{id}/upload-url", a.base),
            Some(KEY_A),
            None,
        );
        assert_eq!(code, 200, "{u}");
        put(u["upload_url"].as_str().expect("upload_url"), &archive)
    };
    let first = acquire(&a, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let first = first["local_sandbox_id"].as_str().expect("id").to_owned();
    let (code, v) = upload_through_a(&first);
    assert_eq!(code, 200, "{v}");
    super::common::host::release(&b, KEY_A, &first);

    let second = acquire(&a, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let second = second["local_sandbox_id"].as_str().expect("id").to_owned();
    let (code, v) = upload_through_a(&second);
    assert_eq!(
        code, 200,
        "the owner's one live upload is refused: replica A still counts the sandbox B released: {v}"
    );
}

/// The same, given up while the host binds the claimed pod's agent (a
/// pod that accepts connections and never answers). The bind would wait
/// far longer than this test does (`--kube-bind-timeout` 600 s; the
/// channel's keepalive ends a mute connection after some 40 s): only the
/// abandoned request can delete the claim in time.
#[test]
fn an_acquire_abandoned_while_binding_its_pod_leaks_no_claim() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let f = fleet(dir.path());
    const PORTS: (u16, u16) = (47260, 47261);
    let ip = "127.0.96.1".to_owned();
    // Accepts, then says nothing; says when the host connected.
    let mute = std::net::TcpListener::bind((ip.as_str(), PORTS.0)).expect("bind");
    let (connected, host_connected) = std::sync::mpsc::channel();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in mute.incoming().take(4).flatten() {
            conns.push(c);
            let _ = connected.send(());
        }
        std::thread::sleep(Duration::from_secs(120));
        drop(conns);
    });
    let api = Real::new(std::slice::from_ref(&ip));
    let host = on(dir.path(), &f, &api, PORTS, &["--kube-bind-timeout", "600"]);

    let addr = host.base.trim_start_matches("http://").to_owned();
    let mut conn = std::net::TcpStream::connect(&addr).expect("connect");
    let body = r#"{"server_names": ["filesystem"]}"#;
    write!(
        conn,
        "POST /local-sandbox HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY_A}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    // The host is binding the mute pod once it has connected to it.
    host_connected
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| {
            panic!(
                "the host never connected to the claimed pod: {:?}",
                api.host_requests()
            )
        });
    assert_eq!(api.claim_names().len(), 1, "the pod's claim, while binding");
    // The client gives up.
    drop(conn);

    // Well within the bind's bounds: the abandoned request deleted it.
    claims_within(&api, 0, Duration::from_secs(15));
    drop(held);
}

/// A claimed pod that takes the connection and never answers (its agent
/// hung) must not hold an Acquire for ever: the client, waiting as long
/// as it takes, gets an answer, and the claim is deleted.
#[test]
fn a_mute_pod_cannot_hold_an_acquire_for_ever() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = fleet(dir.path());
    const PORTS: (u16, u16) = (47270, 47271);
    let ip = "127.0.97.1".to_owned();
    let mute = std::net::TcpListener::bind((ip.as_str(), PORTS.0)).expect("bind");
    std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in mute.incoming().take(4).flatten() {
            conns.push(c);
        }
        std::thread::sleep(Duration::from_secs(120));
        drop(conns);
    });
    let api = Real::new(std::slice::from_ref(&ip));
    let host = on(dir.path(), &f, &api, PORTS, &["--kube-bind-timeout", "2"]);
    let url = format!("{}/local-sandbox", host.base);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(http(
            "POST",
            &url,
            Some(KEY_A),
            Some(r#"{"server_names": ["filesystem"]}"#),
        ));
    });
    let Ok((code, v)) = rx.recv_timeout(Duration::from_secs(45)) else {
        panic!("an Acquire bound to a mute pod is still waiting after 45 s");
    };
    assert!(code >= 500, "{code}: {v}");
    claims_within(&api, 0, Duration::from_secs(20));
}
