//! The kubernetes backend's load on a real kube-apiserver (issue 43):
//! the API requests the hosts make, counted from the server's audit log
//! (every request with the hosts' User-Agent), per idle minute with one
//! replica and with two (the reference: load must not grow with
//! replicas × claims), and per lease (Acquire then Release through one
//! replica, the idle rate of the same window taken off). The server, the
//! shipped manifests and the played controller are `src/kube/tests/real`;
//! each sandbox is a real agent on its own loopback address.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Host, api, median, spawn_host_env};
use crate::common::{self, AGENT};
use crate::real::{RealApi, controller};

const NS: &str = "sandbox";
const PORTS: (u16, u16) = (47400, 47401);
const BOOTSTRAP: &str = "bootstrap-secret-of-the-warm-pool-0123";

/// What the hosts asked of the API server in a window.
#[derive(Default)]
pub struct Load {
    pub total: usize,
    /// `verb resource` → count.
    pub by_kind: BTreeMap<String, usize>,
}

pub struct Figures {
    pub idle_seconds: u64,
    /// Requests per idle minute: one replica, two replicas (both).
    pub idle_one: f64,
    pub idle_two: f64,
    /// Two replicas' idle requests by kind, per minute.
    pub idle_two_kinds: BTreeMap<String, f64>,
    pub rounds: usize,
    /// Requests per lease (median), the idle rate taken off.
    pub per_lease: f64,
    /// One lease's requests by kind (the median round's, idle included).
    pub lease_kinds: BTreeMap<String, usize>,
}

/// The agent, and its directory (removed after it).
struct Pod {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A warm pool's pod: an agent on `ip` with the pool's bootstrap secret.
fn pod(ip: &str, bootstrap: &Path) -> Pod {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let manifest = d.join("servers.toml");
    std::fs::write(&manifest, common::shipped_manifest(&d.join("state"))).expect("manifest");
    let child = Command::new(&*AGENT)
        .arg("--state-root")
        .arg(d.join("state"))
        .arg("--exec-root")
        .arg(d.join("exec"))
        .arg("--workspace")
        .arg(d.join("ws"))
        .arg("--manifest")
        .arg(&manifest)
        .args(["--listen", &format!("tcp://{ip}:{}", PORTS.0)])
        .args(["--mcp-listen", &format!("tcp://{ip}:{}", PORTS.1)])
        .arg("--token-file")
        .arg(bootstrap)
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("SANDBOX_AGENT_LISTEN")
        .env_remove("SANDBOX_AGENT_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sandbox-agent");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect((ip, PORTS.0)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the pod's agent on {ip} did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Pod { child, _dir: dir }
}

fn replica(dir: &Path, name: &str, api: &RealApi) -> Host {
    let (bootstrap, signing) = (dir.join("bootstrap"), dir.join("signing"));
    let kubeconfig = api.host_kubeconfig(NS).display().to_string();
    let agent_port = PORTS.0.to_string();
    let mcp_port = PORTS.1.to_string();
    let (b, s) = (
        bootstrap.display().to_string(),
        signing.display().to_string(),
    );
    spawn_host_env(
        dir,
        name,
        &[("KUBECONFIG", &kubeconfig)],
        &[
            "--backend",
            "kubernetes",
            "--kube-pool",
            "sandbox-default",
            "--kube-agent-port",
            &agent_port,
            "--kube-mcp-port",
            &mcp_port,
            "--kube-bootstrap-token-file",
            &b,
            "--signing-key-file",
            &s,
        ],
    )
}

/// The hosts' requests among `events`.
fn load(events: &[Value]) -> Load {
    let mut l = Load::default();
    for e in events {
        let ua = e["userAgent"].as_str().unwrap_or_default();
        if !ua.starts_with("sandbox-host/") {
            continue;
        }
        l.total += 1;
        let kind = format!(
            "{} {}",
            e["verb"].as_str().unwrap_or("?"),
            e["objectRef"]["resource"].as_str().unwrap_or("?")
        );
        *l.by_kind.entry(kind).or_default() += 1;
    }
    l
}

/// The hosts' requests over `for_` from now.
async fn window(api: &RealApi, for_: Duration) -> Load {
    let from = api.audit().len();
    tokio::time::sleep(for_).await;
    load(&api.audit()[from..])
}

pub async fn run(dir: &Path) -> Figures {
    let api = RealApi::start_with(true).await;
    api.install(NS).await;
    std::fs::write(dir.join("bootstrap"), BOOTSTRAP).expect("bootstrap");
    std::fs::write(
        dir.join("signing"),
        "0123456789abcdef0123456789abcdef-shared",
    )
    .expect("key");
    let rounds = common::pick(10, 3);
    let ips: Vec<String> = (1..=rounds + 1).map(|i| format!("127.0.77.{i}")).collect();
    let _pods: Vec<Pod> = ips
        .iter()
        .map(|ip| pod(ip, &dir.join("bootstrap")))
        .collect();
    let _ctl = controller::spawn_pods(api.admin.clone(), NS, &ips);
    let idle = Duration::from_secs(common::pick(60, 15));
    let per_minute = |n: usize| n as f64 * 60.0 / idle.as_secs_f64();

    let a = replica(dir, "kube-a", &api);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let one = window(&api, idle).await;
    let b = replica(dir, "kube-b", &api);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let two = window(&api, idle).await;

    let claims: kube::Api<sandbox_kube::crd::SandboxClaim> =
        kube::Api::namespaced(api.admin.clone(), NS);
    let mut per_lease = Vec::new();
    let mut kinds = Vec::new();
    for _ in 0..rounds {
        let from = api.audit().len();
        let started = Instant::now();
        let v = api_call(
            &a,
            "POST",
            "/local-sandbox",
            r#"{"server_names": ["filesystem"]}"#,
        )
        .await;
        let id = v["local_sandbox_id"].as_str().expect("id").to_owned();
        api_call(&a, "DELETE", &format!("/local-sandbox/{id}"), "").await;
        // The release ends in the background: until its claim is gone.
        let claim = format!("sbx-{id}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while claims.get_opt(&claim).await.expect("get").is_some() {
            assert!(
                Instant::now() < deadline,
                "the claim of {id} was not released"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let l = load(&api.audit()[from..]);
        let idle_share = two.total as f64 * started.elapsed().as_secs_f64() / idle.as_secs_f64();
        per_lease.push(l.total as f64 - idle_share);
        kinds.push((l.total, l.by_kind));
    }
    drop((a, b));
    kinds.sort_by_key(|(n, _)| *n);
    let lease_kinds = kinds[kinds.len() / 2].1.clone();
    Figures {
        idle_seconds: idle.as_secs(),
        idle_one: per_minute(one.total),
        idle_two: per_minute(two.total),
        idle_two_kinds: two
            .by_kind
            .into_iter()
            .map(|(k, n)| (k, per_minute(n)))
            .collect(),
        rounds,
        per_lease: median(&mut per_lease),
        lease_kinds,
    }
}

async fn api_call(h: &Host, method: &str, path: &str, body: &str) -> Value {
    api(method, &format!("{}{path}", h.base), body).await
}

pub fn print(f: &Figures) {
    println!(
        "# kubernetes backend on a real kube-apiserver: the hosts' API requests (audit log), {}",
        common::mode()
    );
    println!("| measure | requests | vs one replica idle |");
    println!("|---|---|---|");
    println!(
        "| idle, one replica, per minute ({} s window) | {:.0} | 1.00x |",
        f.idle_seconds, f.idle_one
    );
    println!(
        "| idle, two replicas (both), per minute | {:.0} | {:.2}x |",
        f.idle_two,
        f.idle_two / f.idle_one.max(1.0)
    );
    println!(
        "| one lease (Acquire + Release through one replica; the idle rate of its window taken off), median of {} | {:.1} | |",
        f.rounds, f.per_lease
    );
    let kinds = |m: &BTreeMap<String, f64>| {
        m.iter()
            .map(|(k, n)| format!("{k} {n:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "\nidle, two replicas, per minute by kind: {}",
        kinds(&f.idle_two_kinds)
    );
    let lease: BTreeMap<String, f64> = f
        .lease_kinds
        .iter()
        .map(|(k, n)| (k.clone(), *n as f64))
        .collect();
    println!(
        "one lease by kind (its window, idle included): {}",
        kinds(&lease)
    );
}
