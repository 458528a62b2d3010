//! A stand-in for a Kubernetes API server with agent-sandbox installed, at
//! the HTTP level, for what a real one cannot be made to do (calls that
//! stall: `kubernetes_attacks`; everything else runs on the real
//! kube-apiserver, `kube_cluster::Real`): the claims and
//! sandboxes the real host binaries create, read, patch, list and delete,
//! answered in the shapes the API server and agent-sandbox's controller
//! give (objects, lists, `Status` errors, finalizers, deletion
//! timestamps). Its "pods" are real agents the test started, each on its
//! own loopback address: a claim takes a free one, as a claim adopts a
//! warm pool's sandbox; a deleted claim's pod is never handed out again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

pub const NAMESPACE: &str = "fleet";
const EXT: &str = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxclaims";
const CORE: &str = "/apis/agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxes";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases";

/// What the stand-in holds and how it misbehaves.
#[derive(Default)]
pub struct Cluster {
    pub claims: BTreeMap<String, Value>,
    pub sandboxes: BTreeMap<String, Value>,
    /// Coordination Leases (the replicas' presences, the reaper's, the
    /// owners' ledgers), by name.
    pub leases: BTreeMap<String, Value>,
    /// Pod IPs not yet claimed (real agents listen there).
    pub free_pods: Vec<String>,
    /// Every request, as `METHOD path`.
    pub requests: Vec<String>,
    /// Reads of sandboxes (gets, lists, watches) are never answered (an
    /// API server that stalls).
    pub stall_sandbox_gets: bool,
    /// PATCHes of claims are never answered while set (read as each
    /// arrives).
    pub stall_patches: bool,
    serial: u64,
}

pub struct KubeApi {
    pub state: Arc<Mutex<Cluster>>,
    pub kubeconfig: PathBuf,
}

impl KubeApi {
    /// Serves on a loopback port (its own thread and runtime) with these
    /// free pods; writes a kubeconfig for it in `dir`.
    pub fn start(dir: &Path, pods: &[String]) -> KubeApi {
        let state = Arc::new(Mutex::new(Cluster {
            free_pods: pods.to_vec(),
            ..Default::default()
        }));
        let (tx, rx) = std::sync::mpsc::channel();
        let s = state.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                tx.send(l.local_addr().expect("addr")).expect("send");
                let app = Router::new()
                    .route(EXT, get(list_claims).post(create_claim))
                    .route(
                        &format!("{EXT}/{{name}}"),
                        get(get_claim).patch(patch_claim).delete(delete_claim),
                    )
                    .route(CORE, get(list_sandboxes))
                    .route(&format!("{CORE}/{{name}}"), get(get_sandbox))
                    .route(LEASES, get(list_leases).post(create_lease))
                    .route(
                        &format!("{LEASES}/{{name}}"),
                        get(get_lease).patch(patch_lease).delete(delete_lease),
                    )
                    .with_state(s);
                axum::serve(l, app).await.expect("serve");
            });
        });
        let addr = rx.recv().expect("the stand-in's address");
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &format!("http://{addr}"));
        KubeApi { state, kubeconfig }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn claim_names(&self) -> Vec<String> {
        self.lock().claims.keys().cloned().collect()
    }
}

/// A kubeconfig naming the stand-in, its namespace the default.
pub fn write_kubeconfig(path: &Path, server: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: mock\n  cluster:\n    server: {server}\n\
         users:\n- name: mock\n  user: {{}}\ncontexts:\n- name: mock\n  context:\n    cluster: mock\n    user: mock\n    namespace: {NAMESPACE}\n\
         current-context: mock\n"
    );
    std::fs::write(path, text).expect("kubeconfig");
}

type Shared = State<Arc<Mutex<Cluster>>>;

fn lock(s: &Arc<Mutex<Cluster>>) -> std::sync::MutexGuard<'_, Cluster> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// The API server's `Status` failure.
fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code
    });
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(body),
    )
        .into_response()
}

fn not_found(kind: &str, name: &str) -> Response {
    status(404, "NotFound", &format!("{kind} \"{name}\" not found"))
}

/// RFC 3339 UTC of now, to the second (what the API server writes).
fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn ready(status: &str, reason: &str, message: &str) -> Value {
    json!([{
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": now(), "observedGeneration": 1
    }])
}

async fn create_claim(State(s): Shared, UrlPath(ns): UrlPath<String>, body: Bytes) -> Response {
    let mut c = lock(&s);
    c.requests.push("POST sandboxclaims".to_owned());
    let Ok(mut claim) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "the body is not JSON");
    };
    // As the real server (src/kube/tests/real_api.rs): the body names its
    // type, or it is refused.
    if claim["apiVersion"] != "extensions.agents.x-k8s.io/v1beta1"
        || claim["kind"] != "SandboxClaim"
    {
        return status(400, "BadRequest", "Object 'Kind' is missing");
    }
    let name = claim["metadata"]["name"].as_str().unwrap_or("").to_owned();
    if name.is_empty() {
        return status(422, "Invalid", "metadata.name: Required value");
    }
    if c.claims.contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            &format!("sandboxclaims \"{name}\" already exists"),
        );
    }
    c.serial += 1;
    let meta = &mut claim["metadata"];
    meta["uid"] = json!(format!("00000000-0000-0000-0000-{:012}", c.serial));
    meta["resourceVersion"] = json!(c.serial.to_string());
    meta["creationTimestamp"] = json!(now());
    meta["generation"] = json!(1);
    claim["status"] =
        json!({ "conditions": ready("False", "SandboxNotReady", "Sandbox is not ready") });
    assign(&mut c, &ns, &name, &mut claim);
    c.claims.insert(name, claim.clone());
    (StatusCode::CREATED, axum::Json(claim)).into_response()
}

/// Gives a waiting claim a free pod, if there is one (the controller
/// adopting a warm pool's sandbox as soon as one is ready).
fn assign(c: &mut Cluster, ns: &str, name: &str, claim: &mut Value) {
    let waiting = claim["status"]["sandbox"]["name"].is_null()
        && claim["metadata"]["deletionTimestamp"].is_null()
        && claim["status"]["conditions"][0]["reason"] == "SandboxNotReady";
    if !waiting || c.free_pods.is_empty() {
        return;
    }
    let ip = c.free_pods.remove(0);
    let sandbox = json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {
            "name": name, "namespace": ns, "uid": format!("sandbox-{}", c.serial),
            "labels": {"agents.x-k8s.io/launch-type": "warm"},
            "ownerReferences": [{"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                "kind": "SandboxClaim", "name": name, "uid": meta_uid(claim), "controller": true}]
        },
        "spec": {"podTemplate": {"metadata": {}, "spec": {"containers": [{"name": "agent", "image": "sandbox-agent:dev"}]}}},
        "status": {
            "conditions": ready("True", "DependenciesReady", "Pod is Ready; Service Exists"),
            "podIPs": [ip], "nodeName": "kind-worker",
            "selector": "agents.x-k8s.io/sandbox-name-hash=0123abcd"
        }
    });
    c.sandboxes.insert(name.to_owned(), sandbox);
    claim["status"] = json!({
        "conditions": ready("True", "SandboxReady", "Sandbox is ready"),
        "sandbox": {"name": name, "podIPs": [ip]}
    });
}

fn meta_uid(v: &Value) -> Value {
    v["metadata"]["uid"].clone()
}

async fn get_claim(State(s): Shared, UrlPath((ns, name)): UrlPath<(String, String)>) -> Response {
    let mut c = lock(&s);
    c.requests.push(format!("GET sandboxclaims/{name}"));
    let Some(mut claim) = c.claims.get(&name).cloned() else {
        return not_found("sandboxclaims.extensions.agents.x-k8s.io", &name);
    };
    assign(&mut c, &ns, &name, &mut claim);
    c.claims.insert(name, claim.clone());
    axum::Json(claim).into_response()
}

async fn list_claims(
    State(s): Shared,
    UrlPath(ns): UrlPath<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        return watch(s, Kind::Claims, &ns, &q);
    }
    let list = {
        let mut c = lock(&s);
        c.requests.push("LIST sandboxclaims".to_owned());
        let items: Vec<Value> = Kind::Claims
            .selected(&mut c, &ns, &q)
            .into_values()
            .collect();
        json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaimList",
            "metadata": {"resourceVersion": c.serial.to_string()}, "items": items
        })
    };
    axum::Json(list).into_response()
}

/// What the stand-in lists and watches.
#[derive(Clone, Copy)]
enum Kind {
    Claims,
    Sandboxes,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Claims => "sandboxclaims",
            Kind::Sandboxes => "sandboxes",
        }
    }

    /// The objects a request's label and field selectors name, the
    /// controller having handed free pods to waiting claims first.
    fn selected(
        self,
        c: &mut Cluster,
        ns: &str,
        q: &BTreeMap<String, String>,
    ) -> BTreeMap<String, Value> {
        let waiting: Vec<String> = c.claims.keys().cloned().collect();
        for name in waiting {
            if let Some(mut claim) = c.claims.get(&name).cloned() {
                assign(c, ns, &name, &mut claim);
                c.claims.insert(name, claim);
            }
        }
        let labels = selector(q, "labelSelector");
        let fields = selector(q, "fieldSelector");
        let store = match self {
            Kind::Claims => &c.claims,
            Kind::Sandboxes => &c.sandboxes,
        };
        store
            .iter()
            .filter(|(_, o)| {
                labels
                    .iter()
                    .all(|(k, v)| o["metadata"]["labels"][k].as_str() == Some(v.as_str()))
                    && fields.iter().all(|(k, v)| {
                        k != "metadata.name" || o["metadata"]["name"].as_str() == Some(v.as_str())
                    })
            })
            .map(|(n, o)| (n.clone(), o.clone()))
            .collect()
    }
}

/// The `key=value` pairs of a request's label or field selector.
fn selector(q: &BTreeMap<String, String>, which: &str) -> Vec<(String, String)> {
    q.get(which)
        .map(|sel| {
            sel.split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// A watch of what a request's selectors name: the changes since the
/// watch began (looked at every 20 ms, the controller acting first), as
/// the API server streams them (one JSON event a line), until
/// `timeoutSeconds` (at most 25 s here).
fn watch(s: Arc<Mutex<Cluster>>, kind: Kind, ns: &str, q: &BTreeMap<String, String>) -> Response {
    let secs: u64 = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .unwrap_or(25)
        .min(25);
    lock(&s).requests.push(format!("WATCH {}", kind.name()));
    let (ns, q) = (ns.to_owned(), q.clone());
    let snapshot = move |s: &Arc<Mutex<Cluster>>| kind.selected(&mut lock(s), &ns, &q);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let mut seen = snapshot(&s);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let now = snapshot(&s);
            let mut events = Vec::new();
            for (n, o) in &now {
                match seen.get(n) {
                    None => events.push(json!({"type": "ADDED", "object": o})),
                    Some(old) if old != o => events.push(json!({"type": "MODIFIED", "object": o})),
                    _ => {}
                }
            }
            for (n, o) in &seen {
                if !now.contains_key(n) {
                    events.push(json!({"type": "DELETED", "object": o}));
                }
            }
            for e in events {
                let line = format!("{e}\n");
                if tx.send(Ok(Bytes::from(line))).await.is_err() {
                    return;
                }
            }
            seen = now;
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    ([("content-type", "application/json")], body).into_response()
}

/// Lists or watches sandboxes (a claim's sandbox, by name).
async fn list_sandboxes(
    State(s): Shared,
    UrlPath(ns): UrlPath<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    if lock(&s).stall_sandbox_gets {
        lock(&s).requests.push("LIST sandboxes".to_owned());
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    }
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        return watch(s, Kind::Sandboxes, &ns, &q);
    }
    let mut c = lock(&s);
    c.requests.push("LIST sandboxes".to_owned());
    let items: Vec<Value> = Kind::Sandboxes
        .selected(&mut c, &ns, &q)
        .into_values()
        .collect();
    axum::Json(json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "SandboxList",
        "metadata": {"resourceVersion": c.serial.to_string()}, "items": items
    }))
    .into_response()
}

async fn patch_claim(
    State(s): Shared,
    UrlPath((_ns, name)): UrlPath<(String, String)>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let stall = {
        let mut c = lock(&s);
        c.requests.push(format!("PATCH sandboxclaims/{name}"));
        c.stall_patches
    };
    if stall {
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    }
    let mut c = lock(&s);
    let merge = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/merge-patch+json"));
    if !merge {
        return status(415, "UnsupportedMediaType", "only merge patches here");
    }
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "the patch is not JSON");
    };
    c.serial += 1;
    let serial = c.serial;
    let Some(claim) = c.claims.get_mut(&name) else {
        return not_found("sandboxclaims.extensions.agents.x-k8s.io", &name);
    };
    json_patch::merge(claim, &patch);
    claim["metadata"]["resourceVersion"] = json!(serial.to_string());
    let out = claim.clone();
    finish_deletion(&mut c, &name);
    axum::Json(out).into_response()
}

async fn delete_claim(
    State(s): Shared,
    UrlPath((_ns, name)): UrlPath<(String, String)>,
) -> Response {
    let mut c = lock(&s);
    c.requests.push(format!("DELETE sandboxclaims/{name}"));
    if !c.claims.contains_key(&name) {
        return not_found("sandboxclaims.extensions.agents.x-k8s.io", &name);
    }
    let out = delete(&mut c, &name);
    axum::Json(out).into_response()
}

/// A delete: terminating while finalizers remain, else gone (with its
/// sandbox, whose pod is never handed out again).
fn delete(c: &mut Cluster, name: &str) -> Value {
    let Some(claim) = c.claims.get_mut(name) else {
        return Value::Null;
    };
    if claim["metadata"]["deletionTimestamp"].is_null() {
        claim["metadata"]["deletionTimestamp"] = json!(now());
        claim["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    }
    let out = claim.clone();
    finish_deletion(c, name);
    out
}

fn finish_deletion(c: &mut Cluster, name: &str) {
    let Some(claim) = c.claims.get(name) else {
        return;
    };
    let terminating = !claim["metadata"]["deletionTimestamp"].is_null();
    let finalized = claim["metadata"]["finalizers"]
        .as_array()
        .is_none_or(|f| f.is_empty());
    if terminating && finalized {
        c.claims.remove(name);
        c.sandboxes.remove(name);
    }
}

async fn get_sandbox(
    State(s): Shared,
    UrlPath((_ns, name)): UrlPath<(String, String)>,
) -> Response {
    let stall = {
        let mut c = lock(&s);
        c.requests.push(format!("GET sandboxes/{name}"));
        c.stall_sandbox_gets
    };
    if stall {
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    }
    let c = lock(&s);
    match c.sandboxes.get(&name) {
        Some(v) => axum::Json(v.clone()).into_response(),
        None => not_found("sandboxes.agents.x-k8s.io", &name),
    }
}

// ---------------------------------------------------------------- leases
// What the host does with coordination.k8s.io Leases (sandbox_kube::coord
// and kube-lease-manager): create, get, list, patch (merge, strategic and
// apply patches of a Lease's flat fields all merge alike here) at a
// resourceVersion when one is named, delete.

fn lease_not_found(name: &str) -> Response {
    not_found("leases.coordination.k8s.io", name)
}

async fn create_lease(State(s): Shared, body: Bytes) -> Response {
    let mut c = lock(&s);
    c.requests.push("POST leases".to_owned());
    let Ok(mut l) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "the body is not JSON");
    };
    let name = l["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if c.leases.contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            &format!("leases \"{name}\" already exists"),
        );
    }
    c.serial += 1;
    l["metadata"]["resourceVersion"] = json!(c.serial.to_string());
    c.leases.insert(name, l.clone());
    (StatusCode::CREATED, axum::Json(l)).into_response()
}

async fn get_lease(State(s): Shared, UrlPath((_ns, name)): UrlPath<(String, String)>) -> Response {
    let mut c = lock(&s);
    c.requests.push(format!("GET leases/{name}"));
    match c.leases.get(&name) {
        Some(l) => axum::Json(l.clone()).into_response(),
        None => lease_not_found(&name),
    }
}

async fn list_leases(State(s): Shared) -> Response {
    let mut c = lock(&s);
    c.requests.push("GET leases".to_owned());
    let items: Vec<Value> = c.leases.values().cloned().collect();
    axum::Json(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
        "metadata": {"resourceVersion": c.serial.to_string()}, "items": items
    }))
    .into_response()
}

async fn patch_lease(
    State(s): Shared,
    UrlPath((_ns, name)): UrlPath<(String, String)>,
    body: Bytes,
) -> Response {
    let mut c = lock(&s);
    c.requests.push(format!("PATCH leases/{name}"));
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "the patch is not JSON");
    };
    c.serial += 1;
    let serial = c.serial;
    let Some(l) = c.leases.get_mut(&name) else {
        return lease_not_found(&name);
    };
    let want = &patch["metadata"]["resourceVersion"];
    if !want.is_null() && *want != l["metadata"]["resourceVersion"] {
        return status(409, "Conflict", "the object has been modified");
    }
    json_patch::merge(l, &patch);
    l["metadata"]["resourceVersion"] = json!(serial.to_string());
    axum::Json(l.clone()).into_response()
}

async fn delete_lease(
    State(s): Shared,
    UrlPath((_ns, name)): UrlPath<(String, String)>,
) -> Response {
    let mut c = lock(&s);
    c.requests.push(format!("DELETE leases/{name}"));
    match c.leases.remove(&name) {
        Some(l) => axum::Json(l).into_response(),
        None => lease_not_found(&name),
    }
}
