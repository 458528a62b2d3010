//! The fleet against a fake API server at the HTTP level, for what a real
//! one cannot be made to do: calls that stall, fail mid-way or are refused
//! for a while, and the exact requests made around them. The whole flow,
//! its bad cases and every request shape sent here also run against a
//! real kube-apiserver (`real_api.rs`).
//!
//! `kube::Client` runs over a `tower-test` mock service; a task plays the
//! API server (a small in-memory store of claims and sandboxes with the
//! API server's semantics for create, get, list, merge patch and delete
//! with finalizers; a watch is held open and never sends an event) and a
//! "controller" hook that plays agent-sandbox's controller on each read of
//! a claim. Every test asserts the requests the fleet made, in order (the
//! reads of a claim being waited for apart: [`World::waits`]), and what is
//! left in the store, so a leaked claim fails it.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use sandbox_kube::crd::{Sandbox, SandboxClaim};
use sandbox_kube::lease::{self, Lease, Phase};
use sandbox_kube::{Fleet, FleetConfig, KubeError};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_test::mock;

type Handle = mock::Handle<Request<Body>, Response<Body>>;

const CLAIMS: &str = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/ns/sandboxclaims";
const SANDBOXES: &str = "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes";
/// Coordination Leases (the owners' admission ledgers): stored, and
/// logged apart from the claims' requests (`World::lease_log`).
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";
/// 2026-01-01T01:00:00Z.
const EXPIRY_MS: i64 = 1_767_229_200_000;
const T0: &str = "2026-01-01T00:00:00Z";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A fleet over a mock service, namespace `ns`, every benchmark on
/// `pool-a`, 90 s of shutdown grace.
fn fleet(claim_timeout: Duration) -> (Fleet, Handle) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "ns");
    let cfg = FleetConfig {
        namespace: "ns".to_owned(),
        pools: BTreeMap::from([("default".to_owned(), "pool-a".to_owned())]),
        claim_timeout,
        shutdown_grace: Duration::from_secs(90),
        coord: Default::default(),
    };
    (Fleet::new(client, cfg), handle)
}

fn lease(id: &str, owner: &str) -> Lease {
    Lease {
        sandbox_id: id.to_owned(),
        owner: owner.to_owned(),
        pool: "pool-a".to_owned(),
        phase: Phase::Acquiring,
        benchmark: Some("swe".to_owned()),
        servers: Value::Null,
        created_at: "2026-01-01T00:00:05Z".to_owned(),
        updated_at: "2026-01-01T00:00:05Z".to_owned(),
        expires_at_ms: Some(EXPIRY_MS),
        claim: String::new(),
        pod_ip: None,
        host: None,
    }
}

// ------------------------------------------------------------ the server

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Req {
    method: String,
    path: String,
    /// Decoded query string.
    query: String,
    body: Value,
}

impl Req {
    /// `GET claims/sbx-1`, `GET sandboxes/x`, `POST claims`; anything off
    /// the two expected prefixes keeps its whole path.
    fn short(&self) -> String {
        if let Some(name) = self.watched() {
            let kind = if self.path == CLAIMS {
                "claims"
            } else {
                "sandboxes"
            };
            let verb = if self.is_watch() { "WATCH" } else { "LIST" };
            return format!("{verb} {kind}/{name}");
        }
        let p = if let Some(r) = self.path.strip_prefix(CLAIMS) {
            format!("claims{r}")
        } else if let Some(r) = self.path.strip_prefix(SANDBOXES) {
            format!("sandboxes{r}")
        } else {
            self.path.clone()
        };
        format!("{} {p}", self.method)
    }
}

impl Req {
    /// The object a list or a watch selects by name (`fieldSelector`):
    /// a wait for it.
    fn watched(&self) -> Option<&str> {
        self.query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldSelector=metadata.name="))
    }

    fn is_watch(&self) -> bool {
        self.query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1")
    }
}

fn shorts(log: &[Req]) -> Vec<String> {
    log.iter().map(Req::short).collect()
}

fn decode(q: &str) -> String {
    let b = q.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// How the server answers one request.
enum Reply {
    Json(u16, Value),
    /// The connection fails (the service's error, as hyper's would be).
    Fail,
    /// No answer, ever (the request hangs until its caller goes away).
    Hold,
}

/// Plays agent-sandbox's controller on the `n`th GET of a claim (counting
/// every claim GET), before the server answers it.
type Controller = Box<dyn FnMut(u32, &mut Value, &mut BTreeMap<String, Value>) + Send>;
/// Answers a request instead of the store (403s, failures).
type Intercept = Box<dyn FnMut(&Req) -> Option<Reply> + Send>;

struct World {
    claims: BTreeMap<String, Value>,
    sandboxes: BTreeMap<String, Value>,
    leases: BTreeMap<String, Value>,
    /// The requests on Leases, in order (`METHOD name`, or `METHOD` for
    /// the collection).
    lease_log: Vec<String>,
    /// The lists and watches of one object (a wait), in order, apart
    /// from the other requests ([`Req::short`]).
    waits: Vec<String>,
    gets: u32,
    version: u64,
    controller: Controller,
    intercept: Intercept,
}

fn world() -> World {
    World {
        claims: BTreeMap::new(),
        sandboxes: BTreeMap::new(),
        leases: BTreeMap::new(),
        lease_log: Vec::new(),
        waits: Vec::new(),
        gets: 0,
        version: 100,
        controller: Box::new(|_, _, _| {}),
        intercept: Box::new(|_| None),
    }
}

/// The API server's error body.
fn status(code: u16, reason: &str, message: &str) -> Reply {
    Reply::Json(
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code,
        }),
    )
}

fn not_found(resource: &str, name: &str) -> Reply {
    let group = if resource == "sandboxes" {
        "agents.x-k8s.io"
    } else {
        "extensions.agents.x-k8s.io"
    };
    status(
        404,
        "NotFound",
        &format!("{resource}.{group} \"{name}\" not found"),
    )
}

/// RFC 7386.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn finalizers(c: &Value) -> usize {
    c["metadata"]["finalizers"].as_array().map_or(0, Vec::len)
}

impl World {
    fn bump(&mut self, c: &mut Value) {
        self.version += 1;
        c["metadata"]["resourceVersion"] = json!(self.version.to_string());
    }

    /// Leases with the server's semantics for what the fleet does: create,
    /// get, list, merge patch at a resourceVersion, delete.
    fn lease(&mut self, r: &Req, rest: &str) -> Reply {
        let name = rest.strip_prefix('/');
        self.lease_log.push(
            format!("{} {}", r.method, name.unwrap_or_default())
                .trim()
                .to_owned(),
        );
        match (r.method.as_str(), name) {
            ("POST", None) => {
                let mut l = r.body.clone();
                let n = l["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if self.leases.contains_key(&n) {
                    return status(409, "AlreadyExists", "already exists");
                }
                self.bump(&mut l);
                self.leases.insert(n, l.clone());
                Reply::Json(201, l)
            }
            ("GET", None) => Reply::Json(
                200,
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                       "metadata": {"resourceVersion": self.version.to_string()},
                       "items": self.leases.values().cloned().collect::<Vec<_>>()}),
            ),
            ("GET", Some(n)) => match self.leases.get(n) {
                Some(l) => Reply::Json(200, l.clone()),
                None => status(
                    404,
                    "NotFound",
                    &format!("leases.coordination.k8s.io \"{n}\" not found"),
                ),
            },
            ("PATCH", Some(n)) => {
                let Some(mut l) = self.leases.get(n).cloned() else {
                    return status(404, "NotFound", "not found");
                };
                let want = &r.body["metadata"]["resourceVersion"];
                if !want.is_null() && *want != l["metadata"]["resourceVersion"] {
                    return status(409, "Conflict", "the object has been modified");
                }
                merge(&mut l, &r.body);
                self.bump(&mut l);
                self.leases.insert(n.to_owned(), l.clone());
                Reply::Json(200, l)
            }
            _ => status(
                405,
                "MethodNotAllowed",
                "the server does not allow this method",
            ),
        }
    }

    /// A list or a watch of one object by name (how the fleet waits for a
    /// claim and its sandbox): a list answers the object as it is (a claim
    /// read by the controller first); a watch stays open, sending nothing.
    fn wait(&mut self, r: &Req, name: &str) -> Reply {
        if r.is_watch() {
            return Reply::Hold;
        }
        let obj = if r.path == CLAIMS {
            self.claims.get_mut(name).map(|c| {
                self.gets += 1;
                (self.controller)(self.gets, c, &mut self.sandboxes);
                c.clone()
            })
        } else {
            self.sandboxes.get(name).cloned()
        };
        Reply::Json(
            200,
            json!({"apiVersion": "v1", "kind": "List",
                   "metadata": {"resourceVersion": self.version.to_string()},
                   "items": obj.into_iter().collect::<Vec<_>>()}),
        )
    }

    fn answer(&mut self, r: &Req) -> Reply {
        let m = r.method.as_str();
        if m == "GET"
            && let Some(name) = r.watched()
        {
            let name = name.to_owned();
            return self.wait(r, &name);
        }
        if let Some(rest) = r.path.strip_prefix(LEASES) {
            let rest = rest.to_owned();
            return self.lease(r, &rest);
        }
        if let Some(rest) = r.path.strip_prefix(CLAIMS) {
            let name = rest.strip_prefix('/');
            return match (m, name) {
                ("POST", None) => {
                    let mut c = r.body.clone();
                    let n = c["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    if self.claims.contains_key(&n) {
                        return status(409, "AlreadyExists", "already exists");
                    }
                    // As the real server (tests/real_api.rs): the body
                    // names its type, or it is refused.
                    if c["apiVersion"] != "extensions.agents.x-k8s.io/v1beta1"
                        || c["kind"] != "SandboxClaim"
                    {
                        return status(400, "BadRequest", "Object 'Kind' is missing");
                    }
                    merge(
                        &mut c["metadata"],
                        &json!({"uid": "0b0e8f8e-5c1a-4a43-9a57-3f1c2d4e5f60", "generation": 1, "creationTimestamp": T0}),
                    );
                    // Go's non-pointer struct: always there.
                    if c["spec"].get("additionalPodMetadata").is_none() {
                        c["spec"]["additionalPodMetadata"] = json!({});
                    }
                    self.bump(&mut c);
                    self.claims.insert(n, c.clone());
                    Reply::Json(201, c)
                }
                ("GET", None) => {
                    let sel = r
                        .query
                        .split('&')
                        .find_map(|kv| kv.strip_prefix("labelSelector="))
                        .unwrap_or_default();
                    let items: Vec<Value> = self
                        .claims
                        .values()
                        .filter(|c| {
                            sel.split(',').filter(|s| !s.is_empty()).all(|kv| {
                                let (k, v) = kv.split_once('=').unwrap();
                                c["metadata"]["labels"][k] == json!(v)
                            })
                        })
                        .cloned()
                        .collect();
                    // Pages as the real server makes them: `limit` items
                    // from the `continue` token on (here: an index).
                    let param = |k: &str| {
                        r.query
                            .split('&')
                            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    };
                    let from: usize = param("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
                    let limit: usize = param("limit")
                        .and_then(|l| l.parse().ok())
                        .unwrap_or(usize::MAX);
                    let end = from.saturating_add(limit).min(items.len());
                    let mut meta = json!({"resourceVersion": self.version.to_string()});
                    if end < items.len() {
                        meta["continue"] = json!(end.to_string());
                    }
                    Reply::Json(
                        200,
                        json!({
                            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                            "kind": "SandboxClaimList",
                            "metadata": meta,
                            "items": items[from.min(end)..end],
                        }),
                    )
                }
                ("GET", Some(n)) => match self.claims.get_mut(n) {
                    Some(c) => {
                        self.gets += 1;
                        (self.controller)(self.gets, c, &mut self.sandboxes);
                        Reply::Json(200, c.clone())
                    }
                    None => not_found("sandboxclaims", n),
                },
                ("PATCH", Some(n)) => {
                    let Some(mut c) = self.claims.remove(n) else {
                        return not_found("sandboxclaims", n);
                    };
                    // As the real server: a patch naming a resourceVersion
                    // applies to that version only.
                    let want = &r.body["metadata"]["resourceVersion"];
                    if !want.is_null() && *want != c["metadata"]["resourceVersion"] {
                        self.claims.insert(n.to_owned(), c);
                        return status(409, "Conflict", "the object has been modified");
                    }
                    merge(&mut c, &r.body);
                    self.bump(&mut c);
                    let gone =
                        c["metadata"].get("deletionTimestamp").is_some() && finalizers(&c) == 0;
                    if !gone {
                        self.claims.insert(n.to_owned(), c.clone());
                    }
                    Reply::Json(200, c)
                }
                ("DELETE", Some(n)) => {
                    let Some(mut c) = self.claims.remove(n) else {
                        return not_found("sandboxclaims", n);
                    };
                    if finalizers(&c) == 0 {
                        return Reply::Json(
                            200,
                            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                   "details": {"name": n, "group": "extensions.agents.x-k8s.io", "kind": "sandboxclaims", "uid": c["metadata"]["uid"]}}),
                        );
                    }
                    if c["metadata"].get("deletionTimestamp").is_none() {
                        c["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:30Z");
                        c["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                        self.bump(&mut c);
                    }
                    self.claims.insert(n.to_owned(), c.clone());
                    Reply::Json(200, c)
                }
                _ => status(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method",
                ),
            };
        }
        if let Some(n) = r
            .path
            .strip_prefix(SANDBOXES)
            .and_then(|p| p.strip_prefix('/'))
            && m == "GET"
        {
            return match self.sandboxes.get(n) {
                Some(s) => Reply::Json(200, s.clone()),
                None => not_found("sandboxes", n),
            };
        }
        status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }
}

/// Serves until every client of the fleet is gone; the requests in order
/// and the store as it was left.
fn serve(mut handle: Handle, mut world: World) -> JoinHandle<(Vec<Req>, World)> {
    tokio::spawn(async move {
        let mut log = Vec::new();
        let mut held = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let req = Req {
                method: parts.method.to_string(),
                path: parts.uri.path().to_owned(),
                query: decode(parts.uri.query().unwrap_or_default()),
                body: if bytes.is_empty() {
                    Value::Null
                } else {
                    serde_json::from_slice(&bytes).unwrap()
                },
            };
            let reply = match (world.intercept)(&req) {
                Some(r) => r,
                None => world.answer(&req),
            };
            if req.watched().is_some() {
                world.waits.push(req.short());
            } else if !req.path.starts_with(LEASES) {
                log.push(req);
            }
            match reply {
                Reply::Json(code, v) => send.send_response(
                    Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(Body::from(serde_json::to_vec(&v).unwrap()))
                        .unwrap(),
                ),
                Reply::Fail => send.send_error(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "tcp connect error: Connection refused (os error 111)",
                )),
                Reply::Hold => held.push(send),
            }
        }
        (log, world)
    })
}

/// Drops the fleet and waits for the server to see every client gone
/// (background deletes included).
async fn finish(fleet: Fleet, server: JoinHandle<(Vec<Req>, World)>) -> (Vec<Req>, World) {
    drop(fleet);
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("a client of the fleet stayed alive")
        .unwrap()
}

// --------------------------------------------------- controller's shapes

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({
        "type": type_, "status": status, "observedGeneration": 1,
        "lastTransitionTime": "2026-01-01T00:00:07Z", "reason": reason, "message": message,
    })
}

/// A Sandbox as agent-sandbox's controller leaves it: adopted from the
/// warm pool by claim `claim`.
fn sandbox(name: &str, claim: &str, ready: bool, ips: &[&str]) -> Value {
    let ready = if ready {
        cond(
            "Ready",
            "True",
            "DependenciesReady",
            "Pod is Ready; Service Exists",
        )
    } else {
        cond(
            "Ready",
            "False",
            "DependenciesNotReady",
            "Pod exists with phase: Pending; Service Exists",
        )
    };
    let mut status = json!({
        "service": name,
        "serviceFQDN": format!("{name}.ns.svc.cluster.local"),
        "replicas": 1,
        "selector": "agents.x-k8s.io/sandbox-name-hash=8c2f7a1d",
        "conditions": [ready, cond("Suspended", "False", "NotSuspended", "Sandbox is running")],
        "nodeName": "kind-worker",
    });
    if !ips.is_empty() {
        status["podIPs"] = json!(ips);
    }
    json!({
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": name, "namespace": "ns", "uid": "5d0c1a9e-7f61-4d0b-8a3c-2b6f9e1d4c77",
            "resourceVersion": "4711", "generation": 2, "creationTimestamp": "2025-12-31T23:50:00Z",
            "labels": {
                "agents.x-k8s.io/sandbox-template-ref-hash": "6f1e2d3c",
                "agents.x-k8s.io/warm-pool-sandbox": "pool-a",
                "agents.x-k8s.io/launch-type": "warm",
            },
            "annotations": {"agents.x-k8s.io/pod-name": name, "agents.x-k8s.io/sandbox-template-ref": "agent"},
            "ownerReferences": [{
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim", "name": claim,
                "uid": "0b0e8f8e-5c1a-4a43-9a57-3f1c2d4e5f60", "controller": true, "blockOwnerDeletion": true,
            }],
            "managedFields": [{"manager": "agent-sandbox-controller", "operation": "Update", "apiVersion": "agents.x-k8s.io/v1beta1", "time": T0, "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"app": "sandbox-agent"}},
                "spec": {
                    "containers": [{
                        "name": "agent", "image": "ghcr.io/example/sandbox-agent:1.0",
                        "ports": [{"containerPort": 8080, "protocol": "TCP"}], "resources": {},
                    }],
                    "restartPolicy": "Never",
                },
            },
        },
        "status": status,
    })
}

/// A claim already in the store, carrying `l`.
fn stored_claim(l: &Lease, status: Value) -> Value {
    json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {
            "name": format!("sbx-{}", l.sandbox_id), "namespace": "ns", "uid": format!("uid-{}", l.sandbox_id),
            "resourceVersion": "77", "generation": 1, "creationTimestamp": T0,
            "labels": l.labels(),
            "annotations": {lease::RECORD: l.record()},
            "finalizers": [lease::FINALIZER],
        },
        "spec": {"warmPoolRef": {"name": l.pool}, "additionalPodMetadata": {}},
        "status": status,
    })
}

/// A controller that, at every read of the claim, hands over pod
/// `pool-a-x7k2p`: Ready with IP 10.244.1.17, or still Pending.
fn hand_over(ready: bool) -> Controller {
    Box::new(move |_, c, sbx| {
        let (status, reason, message) = if ready {
            ("True", "DependenciesReady", "Pod is Ready")
        } else {
            (
                "False",
                "DependenciesNotReady",
                "Pod exists with phase: Pending; Service Exists",
            )
        };
        c["status"] = json!({
            "conditions": [cond("Ready", status, reason, message)],
            "sandbox": {"name": "pool-a-x7k2p"},
        });
        let ips: &[&str] = if ready { &["10.244.1.17"] } else { &[] };
        sbx.insert(
            "pool-a-x7k2p".into(),
            sandbox(
                "pool-a-x7k2p",
                "sbx-00000000-0000-4000-8000-000000000001",
                ready,
                ips,
            ),
        );
    })
}

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn a_transient_403_is_tried_again() {
    let (fleet, handle) = fleet(Duration::from_secs(2));
    let mut w = world();
    let mut refused = 0;
    w.intercept = Box::new(move |r| {
        (r.method == "POST" && r.path == CLAIMS && refused < 3).then(|| {
            refused += 1;
            status(
                403,
                "Forbidden",
                "sandboxclaims is forbidden: RBAC: the cache is warming",
            )
        })
    });
    // The controller hands over a Ready pod at the first read.
    w.controller = hand_over(true);
    let server = serve(handle, w);
    let got = fleet
        .claim(&lease("00000000-0000-4000-8000-000000000001", "alice"), 8)
        .await;
    assert!(got.is_ok(), "{got:?}");
    let (log, _) = finish(fleet, server).await;
    assert_eq!(shorts(&log)[1..5], ["POST claims"; 4]);
}

#[tokio::test]
async fn an_unreachable_api_server_is_an_api_error() {
    let (fleet, handle) = fleet(Duration::from_secs(2));
    let mut w = world();
    // The connection fails for every call past the admission (its ledger
    // and its count of the owner's claims).
    let mut counted = false;
    w.intercept = Box::new(move |r| {
        if r.path.starts_with(LEASES) || (!counted && r.method == "GET" && r.path == CLAIMS) {
            counted |= r.path == CLAIMS;
            return None;
        }
        Some(Reply::Fail)
    });
    let server = serve(handle, w);
    let verb = |e: KubeError| match e {
        KubeError::Api { verb, resource, .. } => format!("{verb} {resource}"),
        e => panic!("{e:?}"),
    };
    let e = fleet
        .claim(&lease("00000000-0000-4000-8000-000000000001", "alice"), 8)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("failed create on sandboxclaims"),
        "{e}"
    );
    assert_eq!(verb(e), "create sandboxclaims");
    assert_eq!(
        verb(
            fleet
                .find("00000000-0000-4000-8000-000000000001")
                .await
                .unwrap_err()
        ),
        "get sandboxclaims"
    );
    assert_eq!(
        verb(fleet.leases(None).await.unwrap_err()),
        "list sandboxclaims"
    );
    assert_eq!(
        verb(
            fleet
                .update("00000000-0000-4000-8000-000000000001", |_| {})
                .await
                .unwrap_err()
        ),
        "get sandboxclaims"
    );
    assert_eq!(
        verb(
            fleet
                .release("sbx-00000000-0000-4000-8000-000000000001")
                .await
                .unwrap_err()
        ),
        "delete sandboxclaims"
    );

    // Each call that may be repeated was, within the retry window (5
    // tries: 50 + 100 + 200 + 400 ms of pauses); the create was not (it
    // may have been made).
    let (log, _) = finish(fleet, server).await;
    let mut calls = shorts(&log);
    let tries = |c: &str| calls.iter().filter(|s| s.as_str() == c).count();
    assert_eq!(tries("POST claims"), 1);
    // The admission's count, then 5 tries of the list.
    assert_eq!(tries("GET claims"), 6);
    assert_eq!(
        tries("DELETE claims/sbx-00000000-0000-4000-8000-000000000001"),
        5
    );
    calls.dedup();
    assert_eq!(
        calls,
        [
            "GET claims",
            "POST claims",
            "GET claims/sbx-00000000-0000-4000-8000-000000000001",
            "GET claims",
            "GET claims/sbx-00000000-0000-4000-8000-000000000001",
            "DELETE claims/sbx-00000000-0000-4000-8000-000000000001",
        ]
    );
}

#[tokio::test]
async fn a_dropped_wait_deletes_the_claim() {
    let (fleet, handle) = fleet(Duration::from_secs(5));
    let server = serve(handle, world());
    let r = tokio::time::timeout(
        ms(50),
        fleet.claim(&lease("00000000-0000-4000-8000-000000000001", "alice"), 8),
    )
    .await;
    assert!(r.is_err(), "the wait ended: {r:?}");

    let (log, w) = finish(fleet, server).await;
    assert_eq!(
        shorts(&log),
        [
            "GET claims",
            "POST claims",
            "DELETE claims/sbx-00000000-0000-4000-8000-000000000001",
            "GET claims/sbx-00000000-0000-4000-8000-000000000001",
            "PATCH claims/sbx-00000000-0000-4000-8000-000000000001"
        ]
    );
    // The claim was listed, then watched (the watch never answered).
    assert_eq!(
        w.waits,
        [
            "LIST claims/sbx-00000000-0000-4000-8000-000000000001",
            "WATCH claims/sbx-00000000-0000-4000-8000-000000000001"
        ]
    );
    assert!(w.claims.is_empty(), "leaked: {:?}", w.claims.keys());
}

/// The claim failed and its delete hangs when the caller gives up: the
/// claim is still deleted, in the background.
#[tokio::test]
async fn a_wait_dropped_while_deleting_a_failed_claim_still_deletes_it() {
    let (fleet, handle) = fleet(Duration::from_secs(5));
    let mut w = world();
    w.controller = Box::new(|_, c, _| {
        c["status"] = json!({"conditions": [cond("Ready", "False", "TemplateNotFound", "SandboxTemplate \"agent\" not found")]});
    });
    let mut deletes = 0;
    w.intercept = Box::new(move |r| {
        if r.method == "DELETE" {
            deletes += 1;
            if deletes == 1 {
                return Some(Reply::Hold);
            }
        }
        None
    });
    let server = serve(handle, w);
    let r = tokio::time::timeout(
        ms(100),
        fleet.claim(&lease("00000000-0000-4000-8000-000000000001", "alice"), 8),
    )
    .await;
    assert!(r.is_err(), "the wait ended: {r:?}");

    let (log, w) = finish(fleet, server).await;
    assert_eq!(
        shorts(&log),
        [
            // The admission's count of the owner's claims, then the claim.
            "GET claims",
            "POST claims",
            "DELETE claims/sbx-00000000-0000-4000-8000-000000000001",
            "DELETE claims/sbx-00000000-0000-4000-8000-000000000001",
            "GET claims/sbx-00000000-0000-4000-8000-000000000001",
            "PATCH claims/sbx-00000000-0000-4000-8000-000000000001",
        ]
    );
    assert!(w.claims.is_empty(), "leaked: {:?}", w.claims.keys());
}

// ------------------------------------------------------------- the types

#[test]
fn a_controllers_sandbox_parses() {
    let s: Sandbox = serde_json::from_value(sandbox(
        "pool-a-x7k2p",
        "sbx-00000000-0000-4000-8000-000000000001",
        true,
        &["10.244.1.17", "fd00::17"],
    ))
    .unwrap();
    assert_eq!(s.ready_ip(), Some("10.244.1.17"));
    let st = s.status.as_ref().unwrap();
    assert_eq!(st.node_name.as_deref(), Some("kind-worker"));
    assert_eq!(
        st.service_fqdn.as_deref(),
        Some("pool-a-x7k2p.ns.svc.cluster.local")
    );
    // The fields we do not read are kept.
    assert_eq!(st.extra["service"], "pool-a-x7k2p");
    assert_eq!(st.extra["replicas"], 1);
    assert!(st.extra.contains_key("selector"));
    let back = serde_json::to_value(&s).unwrap();
    assert_eq!(back["status"]["selector"], st.extra["selector"]);

    // Ready without an IP, and an IP without Ready: neither is usable.
    let s: Sandbox = serde_json::from_value(sandbox("p", "c", true, &[])).unwrap();
    assert_eq!(s.ready_ip(), None);
    let s: Sandbox = serde_json::from_value(sandbox("p", "c", false, &["10.0.0.1"])).unwrap();
    assert_eq!(s.ready_ip(), None);
    // No status at all (just created).
    let mut v = sandbox("p", "c", true, &[]);
    v.as_object_mut().unwrap().remove("status");
    let s: Sandbox = serde_json::from_value(v).unwrap();
    assert_eq!(s.ready_ip(), None);
}

#[test]
fn claim_failure_is_terminal_reasons_only() {
    let claim = |status: &str, reason: &str| -> SandboxClaim {
        let mut v = stored_claim(
            &lease("00000000-0000-4000-8000-000000000001", "alice"),
            json!({"conditions": [cond("Ready", status, reason, "why")], "sandbox": {"name": "x"}}),
        );
        v["status"]["extraField"] = json!(true);
        serde_json::from_value(v).unwrap()
    };
    for r in [
        "TemplateNotFound",
        "WarmPoolNotFound",
        "InvalidMetadata",
        "EnvVarsInjectionRejected",
        "VolumeClaimTemplatesError",
        "ClaimExpired",
        "SandboxExpired",
    ] {
        assert_eq!(claim("False", r).failure(), Some(format!("{r}: why")));
    }
    for r in [
        "DependenciesNotReady",
        "SandboxNotReady",
        "SandboxMissing",
        "SandboxCreatePending",
        "AdoptionConflict",
        "ReconcilerError",
    ] {
        assert_eq!(claim("False", r).failure(), None, "{r}");
    }
    assert_eq!(claim("True", "DependenciesReady").failure(), None);
    let c = claim("True", "DependenciesReady");
    assert_eq!(c.sandbox_name(), Some("x"));
    // No status yet.
    let c: SandboxClaim = serde_json::from_value(stored_claim(
        &lease("00000000-0000-4000-8000-000000000001", "alice"),
        json!(null),
    ))
    .unwrap();
    assert_eq!(c.failure(), None);
    assert_eq!(c.sandbox_name(), None);
}
