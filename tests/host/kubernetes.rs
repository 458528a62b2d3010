//! `sandbox-host --backend kubernetes`: the real host binaries (two
//! replicas) on the real kube-apiserver (`kube_cluster::Real`: a namespace
//! each on the test process's server), whose claimed "pods" are real
//! agents on their own loopback addresses, reached over TCP with the
//! late-bound lease token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::common::host::{
    Host, KEY_A, KEY_B, acquire, assert_mcp_initializes, http, put, release, script_archive,
};
use super::common::mcp::shipped_manifest;
use super::common::{Agent, eventually};
use super::kube_cluster::{Cluster, Real};

const AGENT_PORT: u16 = 47070;
const MCP_PORT: u16 = 47071;
const BOOTSTRAP: &str = "bootstrap-secret-of-the-warm-pool-0123";

/// A warm pool's pod: an agent on `ip` with the pool's bootstrap secret.
fn pod(ip: &str, bootstrap: &Path) -> Agent {
    pod_on(ip, bootstrap, AGENT_PORT, MCP_PORT)
}

/// [`pod`] with its agent's gRPC and MCP data plane on these ports.
pub(super) fn pod_on(ip: &str, bootstrap: &Path, agent_port: u16, mcp_port: u16) -> Agent {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state");
    let manifest = dir.path().join("servers.toml");
    std::fs::write(&manifest, shipped_manifest(&state)).expect("manifest");
    let (m, t) = (
        manifest.display().to_string(),
        bootstrap.display().to_string(),
    );
    let (grpc, mcp) = (
        format!("tcp://{ip}:{agent_port}"),
        format!("tcp://{ip}:{mcp_port}"),
    );
    Agent::start_in(
        dir,
        &[
            "--manifest",
            &m,
            "--listen",
            &grpc,
            "--mcp-listen",
            &mcp,
            "--token-file",
            &t,
        ],
        &[],
    )
}

/// The shared files of one fleet: the bootstrap secret and the signing key.
pub(super) struct Fleet {
    pub(super) bootstrap: PathBuf,
    pub(super) signing: PathBuf,
}

pub(super) fn fleet(dir: &Path) -> Fleet {
    let bootstrap = dir.join("bootstrap-token");
    std::fs::write(&bootstrap, BOOTSTRAP).expect("bootstrap");
    let signing = dir.join("signing-key");
    std::fs::write(&signing, "0123456789abcdef0123456789abcdef-shared").expect("key");
    Fleet { bootstrap, signing }
}

/// A replica of the host on `api`, its claims timing out after `timeout`
/// seconds.
fn replica(dir: &Path, f: &Fleet, api: &dyn Cluster, timeout: u32) -> Host {
    replica_on(
        dir,
        f,
        &api.kubeconfig(),
        timeout,
        (AGENT_PORT, MCP_PORT),
        &[],
    )
}

/// [`replica`] with `extra` arguments.
fn replica_with(dir: &Path, f: &Fleet, api: &dyn Cluster, timeout: u32, extra: &[&str]) -> Host {
    replica_on(
        dir,
        f,
        &api.kubeconfig(),
        timeout,
        (AGENT_PORT, MCP_PORT),
        extra,
    )
}

/// A replica on the API server of `kubeconfig`, reaching the pods'
/// agents on `ports` (gRPC, MCP), with `extra` flags.
pub(super) fn replica_on(
    dir: &Path,
    f: &Fleet,
    kubeconfig: &Path,
    timeout: u32,
    (agent_port, mcp_port): (u16, u16),
    extra: &[&str],
) -> Host {
    let mut args: Vec<String> = [
        "--backend",
        "kubernetes",
        "--kube-pool",
        "sandbox-default",
        "--kube-pool",
        "MCP_Atlas=sandbox-mcp-atlas",
        "--kube-agent-port",
        &agent_port.to_string(),
        "--kube-mcp-port",
        &mcp_port.to_string(),
        "--kube-claim-timeout",
        &timeout.to_string(),
        "--kube-bootstrap-token-file",
        &f.bootstrap.display().to_string(),
        "--signing-key-file",
        &f.signing.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let kubeconfig = kubeconfig.display().to_string();
    Host::start_with_env(dir, &args, &[("KUBECONFIG", &kubeconfig)])
}

fn claim_of(api: &dyn Cluster, id: &str) -> Value {
    api.claim(&format!("sbx-{id}"))
}

/// Waits until the API server holds `n` claims (a release's deletion ends
/// in the background).
pub(super) fn claims_left(api: &dyn Cluster, n: usize) {
    claims_within(api, n, Duration::from_secs(30));
}

/// [`claims_left`] within `within`.
pub(super) fn claims_within(api: &dyn Cluster, n: usize, within: Duration) {
    eventually(within, "the claims deleted", || {
        let left = api.claim_names();
        if left.len() == n {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
}

fn ids(list: &Value) -> Vec<String> {
    list["local_sandboxes"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|s| s["local_sandbox_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the agent on `ip` admits `token` (GetInfo over TCP).
fn admits(ip: &str, token: &str) -> bool {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let options = sandbox_client::ConnectOptions {
            token: Some(sandbox_client::auth::Token::new(token, "test").expect("token")),
            ..Default::default()
        };
        let Ok(c) = options.connect(&format!("tcp://{ip}:{AGENT_PORT}")).await else {
            return false;
        };
        c.agent()
            .get_info(sandbox_client::proto::GetInfoRequest {})
            .await
            .is_ok()
    })
}

#[test]
fn two_replicas_serve_one_fleet_of_claimed_pods() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = fleet(dir.path());
    let ips = [
        "127.0.71.1".to_owned(),
        "127.0.71.2".to_owned(),
        "127.0.71.3".to_owned(),
    ];
    let _pods: Vec<Agent> = ips.iter().map(|ip| pod(ip, &f.bootstrap)).collect();
    let api = Real::new(&ips);
    let mut a = replica(dir.path(), &f, &api, 30);
    let b = replica(dir.path(), &f, &api, 30);

    // Replica A claims a pod and binds its agent to the lease.
    let acq = acquire(
        &a,
        KEY_A,
        r#"{"server_names": ["filesystem"], "ttl_seconds": 3600}"#,
    );
    let id = acq["local_sandbox_id"].as_str().expect("id").to_owned();
    let claim = claim_of(&api, &id);
    let labels = &claim["metadata"]["labels"];
    assert_eq!(
        labels["sandbox-agent.dev/managed-by"], "sandbox-host",
        "{claim}"
    );
    assert_eq!(
        labels["sandbox-agent.dev/sandbox-id"],
        id.as_str(),
        "{claim}"
    );
    assert_eq!(
        claim["metadata"]["finalizers"][0], "sandbox-agent.dev/lease",
        "{claim}"
    );
    assert_eq!(
        claim["spec"]["warmPoolRef"]["name"], "sandbox-default",
        "{claim}"
    );
    assert!(
        claim["spec"]["lifecycle"]["shutdownTime"].is_string(),
        "{claim}"
    );
    let record: Value = serde_json::from_str(
        claim["metadata"]["annotations"]["sandbox-agent.dev/lease"]
            .as_str()
            .expect("lease annotation"),
    )
    .expect("lease JSON");
    assert_eq!(record["phase"], "occupied", "{record}");
    assert_eq!(record["owner"], "alice", "{record}");
    assert_eq!(record["pod_ip"], ips[0].as_str(), "{record}");
    // The pool's bootstrap secret admits nothing on the claimed pod now;
    // the unclaimed pod still takes it.
    assert!(
        !admits(&ips[0], BOOTSTRAP),
        "the bootstrap secret still opens a bound pod"
    );
    assert!(admits(&ips[1], BOOTSTRAP));

    // Replica B lists it, shows it, and serves its MCP URL.
    let (code, list) = http(
        "GET",
        &format!("{}/local-sandbox", b.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{list}");
    assert_eq!(ids(&list), vec![id.clone()], "{list}");
    let (code, list) = http(
        "GET",
        &format!("{}/local-sandbox", b.base),
        Some(KEY_B),
        None,
    );
    assert_eq!((code, ids(&list)), (200, vec![]), "another owner's: {list}");
    let (code, v) = http(
        "GET",
        &format!("{}/local-sandbox/{id}", b.base),
        Some(KEY_B),
        None,
    );
    assert_eq!(code, 404, "{v}");
    assert_mcp_initializes(&b.base, "filesystem", &id);
    // The acquire answer's URL (its token signed by the shared key),
    // through the other replica.
    let url = acq["servers"][0]["mcp_server_url"].as_str().expect("url");
    let through_b = url.replace(&a.base, &b.base);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}"#;
    let (code, v) = http("POST", &through_b, None, Some(init));
    assert_eq!(code, 200, "{through_b}: {v}");

    // A transfer across replicas: uploaded through A, initialized and
    // dumped through B.
    let (_, u) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/upload-url", a.base),
        Some(KEY_A),
        None,
    );
    let (code, v) = put(
        u["upload_url"].as_str().expect("upload_url"),
        &script_archive("print('k8s')\n"),
    );
    assert_eq!(code, 200, "{v}");
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/initialize", b.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{v}");
    let (_, d) = http(
        "GET",
        &format!("{}/local-sandbox/{id}/dump", b.base),
        Some(KEY_A),
        None,
    );
    let dump = dir.path().join("dump.tar.gz");
    let got = std::process::Command::new("curl")
        .args(["-sf", "-o"])
        .arg(&dump)
        .arg(d["download_url"].as_str().expect("download_url"))
        .status()
        .expect("curl");
    assert!(got.success());
    let listing = std::process::Command::new("tar")
        .arg("tzf")
        .arg(&dump)
        .output()
        .expect("tar");
    assert!(
        String::from_utf8_lossy(&listing.stdout).contains("main.py"),
        "{listing:?}"
    );

    // Klavis's /sandbox API claims a pod too, and another replica
    // releases it.
    let (code, v) = http(
        "POST",
        &format!("{}/sandbox/filesystem", b.base),
        Some(KEY_A),
        Some("{}"),
    );
    assert_eq!(code, 200, "{v}");
    let other = v["sandbox_id"].as_str().expect("sandbox_id").to_owned();
    assert_eq!(
        claim_of(&api, &other)["spec"]["warmPoolRef"]["name"],
        "sandbox-default"
    );
    let (code, v) = http(
        "DELETE",
        &format!("{}/sandbox/filesystem/{other}", a.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{v}");
    claims_left(&api, 1);

    // A restarted replica loses nothing: the claims are the state.
    a.stop();
    let a = replica(dir.path(), &f, &api, 30);
    let (code, v) = http(
        "GET",
        &format!("{}/local-sandbox/{id}", a.base),
        Some(KEY_A),
        None,
    );
    assert_eq!((code, v["status"].as_str()), (200, Some("occupied")), "{v}");
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/reset", a.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "reset through the restarted replica: {v}");

    // Released through B: the claim goes (finalizer off, deleted), and
    // neither replica knows the sandbox any more.
    release(&b, KEY_A, &id);
    claims_left(&api, 0);
    let (code, v) = http(
        "GET",
        &format!("{}/local-sandbox/{id}", a.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 404, "{v}");
    // Every call named the host and its version (the API server's audit
    // log).
    let agents = api.user_agents();
    let ua = format!("sandbox-host/{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(agents.into_iter().collect::<Vec<_>>(), vec![ua]);
}

#[test]
fn the_fleet_s_bad_cases_answer_clearly_and_leak_no_claim() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = fleet(dir.path());
    let ip = "127.0.72.1".to_owned();
    let _pod = pod(&ip, &f.bootstrap);
    // No pod free at first: the pool is empty past the wait. MCP_Mark's
    // pool is not in the cluster.
    let api = Real::new(&[]);
    let host = replica_with(
        dir.path(),
        &f,
        &api,
        2,
        &["--kube-pool", "MCP_Mark=no-such-pool"],
    );
    let acquire_body = r#"{"server_names": ["filesystem"]}"#;
    let url = format!("{}/local-sandbox", host.base);
    let (code, v) = http("POST", &url, Some(KEY_A), Some(acquire_body));
    assert_eq!(code, 503, "{v}");
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("\"sandbox-default\"") && detail.contains("within 2."),
        "the answer names the pool and the wait: {v}"
    );
    claims_left(&api, 0);

    // An id that is not one this host makes never reaches the API
    // server's paths.
    for bad in [
        "..%2F..%2F..%2Fapi%2Fv1%2Fsecrets",
        "sbx-x",
        "A0000000-0000-0000-0000-000000000000",
    ] {
        let (code, v) = http("GET", &format!("{url}/{bad}"), Some(KEY_A), None);
        assert_eq!(code, 404, "{bad}: {v}");
        let (code, v) = http(
            "POST",
            &format!(
                "{}/filesystem/mcp/?local_sandbox_id={bad}&mcp_token=00",
                host.base
            ),
            None,
            Some("{}"),
        );
        assert!(code == 404 || code == 401, "{bad}: {code} {v}");
    }
    let named: Vec<_> = api
        .host_requests()
        .into_iter()
        .filter(|r| r.resource == "sandboxclaims" && !r.name.is_empty())
        .collect();
    assert!(
        named.iter().all(
            |r| r.name.strip_prefix("sbx-").is_some_and(|id| id.len() == 36
                && id
                    .bytes()
                    .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        ),
        "a claim named by something else than a sandbox id: {named:?}"
    );

    // A benchmark's own pool is claimed from.
    api.add_pods(std::slice::from_ref(&ip));
    let acq = acquire(
        &host,
        KEY_A,
        r#"{"server_names": ["filesystem"], "benchmark": "MCP_Atlas"}"#,
    );
    let id = acq["local_sandbox_id"].as_str().expect("id").to_owned();
    assert_eq!(
        claim_of(&api, &id)["spec"]["warmPoolRef"]["name"],
        "sandbox-mcp-atlas"
    );

    // A claim deleted under the live lease (kubectl delete): the sandbox
    // shows error until released; the release then ends the claim.
    api.delete_claim(&format!("sbx-{id}"));
    let (code, v) = eventually(Duration::from_secs(10), "the sandbox shows error", || {
        let (code, v) = http("GET", &format!("{url}/{id}"), Some(KEY_A), None);
        if v["status"] == "error" {
            Ok((code, v))
        } else {
            Err(v.to_string())
        }
    });
    assert_eq!(code, 200, "{v}");
    release(&host, KEY_A, &id);
    claims_left(&api, 0);

    // A claim the controller fails (a pool the cluster does not have): its
    // reason answered, the claim deleted.
    let (code, v) = http(
        "POST",
        &url,
        Some(KEY_A),
        Some(r#"{"server_names": ["filesystem"], "benchmark": "MCP_Mark"}"#),
    );
    assert_eq!(code, 503, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("WarmPoolNotFound"),
        "{v}"
    );
    claims_left(&api, 0);

    // Forbidden (an operator took `create` off the Role): a 503, and the
    // log names the permission the Role lacks.
    api.allow_claim_create(false);
    eventually(Duration::from_secs(30), "the permission named", || {
        let (code, v) = http("POST", &url, Some(KEY_A), Some(acquire_body));
        let log = std::fs::read_to_string(dir.path().join("host.log")).unwrap_or_default();
        let named = log.contains("permission=create sandboxclaims")
            || log.contains("permission=\"create sandboxclaims\"");
        if code == 503 && named {
            Ok(())
        } else {
            Err(format!("{code} {v}"))
        }
    });
    api.allow_claim_create(true);

    // The API server unreachable: a 503 (nothing listens at its address).
    let gone = dir.path().join("gone");
    std::fs::create_dir_all(&gone).expect("dir");
    let dead = gone.join("kubeconfig");
    super::kube_api::write_kubeconfig(&dead, "http://127.0.0.1:9");
    let lost = replica_on(&gone, &f, &dead, 2, (AGENT_PORT, MCP_PORT), &[]);
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox", lost.base),
        Some(KEY_A),
        Some(acquire_body),
    );
    assert_eq!(code, 503, "{v}");
    let (code, v) = http(
        "GET",
        &format!("{}/local-sandbox", lost.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 503, "listing without the API server: {v}");
}

/// The host's arguments in packaging/kubernetes/host.yaml's Deployment.
fn shipped_host_args() -> Vec<String> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/kubernetes/host.yaml"
    ))
    .expect("host.yaml");
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("a YAML document");
        if v["kind"] == "Deployment" {
            let args = &v["spec"]["template"]["spec"]["containers"][0]["args"];
            return serde_json::from_value(args.clone()).expect("args");
        }
    }
    panic!("no Deployment in host.yaml");
}

#[test]
fn the_shipped_deployment_s_arguments_serve_a_first_acquire() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let f = fleet(d);
    // The Deployment's files, as its Secrets and volume mount them.
    let keys = d.join("keys");
    std::fs::write(&keys, format!("{KEY_A} alice\n")).expect("keys");
    let data = d.join("data");
    let files = [
        (
            "/run/secrets/sandbox-host/bootstrap/token",
            f.bootstrap.clone(),
        ),
        ("/run/secrets/sandbox-host/signing/key", f.signing.clone()),
        ("/run/secrets/sandbox-host/api-keys/keys", keys),
        ("/var/lib/sandbox-host", data),
    ];
    let mut args = shipped_host_args();
    for a in &mut args {
        if let Some((_, here)) = files.iter().find(|(there, _)| a == there) {
            *a = here.display().to_string();
        } else if a == "0.0.0.0:8080" {
            *a = "127.0.0.1:0".to_owned();
        }
    }
    // The base URL is the one the host listens on here.
    if let Some(i) = args.iter().position(|a| a == "--public-url") {
        args.drain(i..i + 2);
    }
    assert!(
        args.iter()
            .all(|a| !a.starts_with("/run/") && !a.starts_with("/var/")),
        "a file of the Deployment this test does not provide: {args:?}"
    );
    // Its pool's pod, on the image's ports (7070, 7071).
    let ip = "127.0.73.1";
    let _pod = pod_on(ip, &f.bootstrap, 7070, 7071);
    let api = Real::new(&[ip.to_owned()]);
    let mut child = std::process::Command::new(&*super::common::host::HOST)
        .args(&args)
        .env("KUBECONFIG", api.kubeconfig())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(d.join("host.log")).expect("log"))
        .spawn()
        .expect("sandbox-host");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("base URL line");
    let base = line
        .trim()
        .strip_prefix("sandbox-host: base URL ")
        .map(str::to_owned);
    let log = || std::fs::read_to_string(d.join("host.log")).unwrap_or_default();
    let Some(base) = base else {
        let _ = child.kill();
        panic!(
            "the Deployment's arguments did not start the host: {line:?}\n{}",
            log()
        );
    };
    let (code, v) = http(
        "POST",
        &format!("{base}/local-sandbox"),
        Some(KEY_A),
        Some(r#"{"server_names": ["filesystem"], "benchmark": "Toolathlon"}"#),
    );
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(code, 201, "{v}\n{}", log());
    let id = v["local_sandbox_id"].as_str().expect("id");
    assert_eq!(
        claim_of(&api, id)["spec"]["warmPoolRef"]["name"],
        "sandbox-toolathlon",
        "the Deployment's pool for Toolathlon"
    );
}

#[test]
fn an_owner_s_acquires_in_flight_are_counted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = fleet(dir.path());
    let ips = ["127.0.74.1".to_owned(), "127.0.74.2".to_owned()];
    let _pods: Vec<Agent> = ips.iter().map(|ip| pod(ip, &f.bootstrap)).collect();
    // No pod free yet: each Acquire waits with its claim made.
    let api = Real::new(&[]);
    let host = replica_with(dir.path(), &f, &api, 30, &["--max-sandboxes-per-key", "2"]);
    let url = format!("{}/local-sandbox", host.base);
    let body = r#"{"server_names": ["filesystem"]}"#;
    let (tx, rx) = std::sync::mpsc::channel();
    let start = |n: usize| {
        let (url, tx) = (url.clone(), tx.clone());
        std::thread::spawn(move || {
            let _ = tx.send((n, http("POST", &url, Some(KEY_A), Some(body))));
        });
    };
    let claims = |want: usize| {
        eventually(Duration::from_secs(30), "the claims made", || {
            if let Ok(done) = rx.try_recv() {
                panic!("an Acquire ended before any pod was free: {done:?}");
            }
            let n = api.claim_names().len();
            if n == want {
                Ok(())
            } else {
                Err(format!("{n} claims"))
            }
        })
    };
    start(1);
    claims(1);
    // The second, within the cap of 2: the first's claim and its Acquire
    // in flight are one sandbox, not two.
    start(2);
    claims(2);
    api.add_pods(&ips);
    for _ in 0..2 {
        let (n, (code, v)) = rx.recv_timeout(Duration::from_secs(60)).expect("an answer");
        assert_eq!(code, 201, "acquire {n}: {v}");
    }
    // A third is over the cap.
    let (code, v) = http("POST", &url, Some(KEY_A), Some(body));
    assert_eq!(code, 429, "{v}");
}
