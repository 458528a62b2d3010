//! `sandbox-host --backend kubernetes` on a real kube-apiserver (the
//! tier of `src/kube/tests/real`): agent-sandbox's CRDs and
//! `packaging/kubernetes/` applied as an operator would, two replicas of
//! the real host binary authenticated as the shipped ServiceAccount with
//! the shipped Role alone, agent-sandbox's controllers played by the test
//! (each sandbox a pod of its own: a real agent on its own loopback
//! address), and both of Klavis's APIs driven across the two replicas.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use sandbox_kube::crd::{SandboxClaim, SandboxWarmPool};
use serde_json::Value;

use super::common::host::{
    Host, KEY_A, KEY_B, acquire, assert_mcp_initializes, http, put, release, script_archive,
};
use super::common::{Agent, eventually};
use super::kubernetes::{Fleet, fleet, pod_on};
use super::real::{RealApi, controller};

const NS: &str = "sandbox";
const PORTS: (u16, u16) = (47300, 47301);

/// A replica on the real API server, as the shipped ServiceAccount.
fn replica(dir: &Path, f: &Fleet, api: &RealApi) -> Host {
    let args: Vec<String> = [
        "--backend",
        "kubernetes",
        "--kube-pool",
        "sandbox-default",
        "--kube-pool",
        "MCP_Atlas=sandbox-mcp-atlas",
        "--kube-agent-port",
        &PORTS.0.to_string(),
        "--kube-mcp-port",
        &PORTS.1.to_string(),
        "--kube-claim-timeout",
        "20",
        "--kube-presence-ttl",
        "5",
        "--kube-bootstrap-token-file",
        &f.bootstrap.display().to_string(),
        "--signing-key-file",
        &f.signing.display().to_string(),
        "--max-sandboxes-per-key",
        "2",
        // 60 s of TTL last 3 s.
        "--time-scale",
        "0.05",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let kubeconfig = api.host_kubeconfig(NS).display().to_string();
    Host::start_with_env(dir, &args, &[("KUBECONFIG", &kubeconfig)])
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

fn list(h: &Host, key: &str) -> (u16, Value) {
    http("GET", &format!("{}/local-sandbox", h.base), Some(key), None)
}

#[test]
fn two_replicas_serve_both_apis_on_a_real_api_server() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut api = rt.block_on(RealApi::start());
    rt.block_on(api.install(NS));
    let dir = tempfile::tempdir().expect("tempdir");
    let f = fleet(dir.path());
    let ips: Vec<String> = (1..=8).map(|i| format!("127.0.76.{i}")).collect();
    let _pods: Vec<Agent> = ips
        .iter()
        .map(|ip| pod_on(ip, &f.bootstrap, PORTS.0, PORTS.1))
        .collect();
    // Spawned on the runtime's workers: it runs between the test's calls.
    let ctl = rt.block_on(async { controller::spawn_pods(api.admin.clone(), NS, &ips) });
    let claims: Api<SandboxClaim> = Api::namespaced(api.admin.clone(), NS);
    let mut a = replica(dir.path(), &f, &api);
    let b = replica(dir.path(), &f, &api);

    // Acquired through A; listed, shown and served through B.
    let acq = acquire(
        &a,
        KEY_A,
        r#"{"server_names": ["filesystem"], "ttl_seconds": 3600}"#,
    );
    let id = acq["local_sandbox_id"].as_str().expect("id").to_owned();
    let (code, l) = list(&b, KEY_A);
    assert_eq!((code, ids(&l)), (200, vec![id.clone()]), "{l}");
    let (code, l) = list(&b, KEY_B);
    assert_eq!((code, ids(&l)), (200, vec![]), "another owner's: {l}");
    assert_mcp_initializes(&b.base, "filesystem", &id);

    // Uploaded through A, initialized and dumped through B.
    let (_, u) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/upload-url", a.base),
        Some(KEY_A),
        None,
    );
    let (code, v) = put(
        u["upload_url"].as_str().expect("upload_url"),
        &script_archive("print('real')\n"),
    );
    assert_eq!(code, 200, "{v}");
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/initialize", b.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{v}");
    let (code, d) = http(
        "GET",
        &format!("{}/local-sandbox/{id}/dump", b.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{d}");
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

    // Klavis's /sandbox API through B, released through A.
    let (code, v) = http(
        "POST",
        &format!("{}/sandbox/filesystem", b.base),
        Some(KEY_A),
        Some("{}"),
    );
    assert_eq!(code, 200, "{v}");
    let other = v["sandbox_id"].as_str().expect("sandbox_id").to_owned();
    let (code, v) = http(
        "DELETE",
        &format!("{}/sandbox/filesystem/{other}", a.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{v}");

    // The cap (2) across replicas: bob holds one, then two Acquires race
    // on A and B: exactly one is admitted, and the other spends no pod.
    let first = acquire(&a, KEY_B, r#"{"server_names": ["filesystem"]}"#);
    let before = ctl.adopted();
    let body = r#"{"server_names": ["filesystem"]}"#;
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let on = |h: &Host| {
            let url = format!("{}/local-sandbox", h.base);
            s.spawn(move || http("POST", &url, Some(KEY_B), Some(body)))
        };
        let (ta, tb) = (on(&a), on(&b));
        vec![ta.join().expect("a"), tb.join().expect("b")]
    });
    let codes: Vec<u16> = answers.iter().map(|(c, _)| *c).collect();
    assert!(codes.contains(&201) && codes.contains(&429), "{answers:?}");
    assert_eq!(ctl.adopted(), before + 1, "a pod spent on the refused one");
    let (_, l) = list(&a, KEY_B);
    for bob in ids(&l) {
        release(&b, KEY_B, &bob);
    }
    let _ = first;

    // Replica A killed and started again: the lease is still served.
    super::common::signal(a.pid().expect("pid"), nix::sys::signal::Signal::SIGKILL);
    a.stop();
    let a = replica(dir.path(), &f, &api);
    let (code, l) = list(&a, KEY_A);
    assert_eq!((code, ids(&l)), (200, vec![id.clone()]), "{l}");
    assert_mcp_initializes(&a.base, "filesystem", &id);

    // The claim deleted by hand under the lease: the sandbox shows error
    // until it is released (the host's finalizer holds the claim).
    rt.block_on(claims.delete(&format!("sbx-{id}"), &DeleteParams::background()))
        .expect("kubectl delete");
    eventually(Duration::from_secs(30), "the lease in error", || {
        let (code, v) = http(
            "GET",
            &format!("{}/local-sandbox/{id}", b.base),
            Some(KEY_A),
            None,
        );
        if code == 200 && v["status"] == "error" {
            Ok(())
        } else {
            Err(format!("{code} {v}"))
        }
    });
    release(&a, KEY_A, &id);
    let gone = |name: String| {
        eventually(Duration::from_secs(30), "the claim gone", || {
            match rt.block_on(claims.get_opt(&name)) {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
    };
    gone(format!("sbx-{id}"));

    // A TTL: released by the one replica that reaps.
    let short = acquire(
        &b,
        KEY_A,
        r#"{"server_names": ["filesystem"], "ttl_seconds": 60}"#,
    );
    let short = short["local_sandbox_id"].as_str().expect("id").to_owned();
    eventually(Duration::from_secs(30), "the lease expired", || {
        let (_, l) = list(&a, KEY_A);
        if ids(&l).is_empty() {
            Ok(())
        } else {
            Err(l.to_string())
        }
    });
    gone(format!("sbx-{short}"));

    // The API server restarted: 503 while it is down, then served again
    // without restarting the host.
    api.stop_apiserver();
    let (code, v) = list(&b, KEY_A);
    assert_eq!(code, 503, "{v}");
    rt.block_on(api.start_apiserver());
    eventually(Duration::from_secs(30), "served again", || {
        let (code, v) = list(&b, KEY_A);
        if code == 200 {
            Ok(())
        } else {
            Err(format!("{code} {v}"))
        }
    });

    // The pool gone: a 503 naming it, and no claim left.
    let pools: Api<SandboxWarmPool> = Api::namespaced(api.admin.clone(), NS);
    rt.block_on(pools.delete("sandbox-default", &DeleteParams::default()))
        .expect("delete the pool");
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox", a.base),
        Some(KEY_A),
        Some(r#"{"server_names": ["filesystem"]}"#),
    );
    assert_eq!(code, 503, "{v}");
    assert!(v.to_string().contains("sandbox-default"), "{v}");
    eventually(Duration::from_secs(30), "no claim left", || {
        let n = rt
            .block_on(claims.list(&Default::default()))
            .map(|l| l.items.len())
            .map_err(|e| e.to_string())?;
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} claims"))
        }
    });

    // Nothing of a cluster beyond what the Role grants: no pods read.
    let host_client = rt.block_on(super::real::client_of(&api.host_kubeconfig(NS)));
    let pods: Api<Pod> = Api::namespaced(host_client, NS);
    match rt.block_on(pods.list(&Default::default())) {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("the host's account listed pods: {other:?}"),
    }
}
