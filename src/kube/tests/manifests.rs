//! Every manifest in `packaging/kubernetes/` parsed into a typed struct
//! (ours for agent-sandbox's kinds, `k8s_openapi`'s for the rest), each
//! re-serialized and compared with the document as written, so a field
//! spelt wrong (which `k8s_openapi` would ignore) fails; then the
//! references between them: pools → templates, the host's pools, Secrets,
//! service account, the Role's exact rules, the templates' probes and
//! network policy.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, Pod, PodSpec, Probe, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sandbox_kube::crd::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes")
}

/// One manifest document, typed. (`Sandbox`, `SandboxClaim` and `Pod` are
/// checked when a file has one; none is shipped, so their values go unread.)
#[derive(Debug)]
#[allow(dead_code)]
enum Object {
    Sandbox(Box<Sandbox>),
    SandboxTemplate(Box<SandboxTemplate>),
    SandboxWarmPool(Box<SandboxWarmPool>),
    SandboxClaim(Box<SandboxClaim>),
    Deployment(Box<Deployment>),
    Service(Box<Service>),
    ServiceAccount(Box<ServiceAccount>),
    Role(Box<Role>),
    RoleBinding(Box<RoleBinding>),
    NetworkPolicy(Box<NetworkPolicy>),
    Secret(Box<Secret>),
    PersistentVolumeClaim(Box<PersistentVolumeClaim>),
    HorizontalPodAutoscaler(Box<HorizontalPodAutoscaler>),
    RuntimeClass(Box<RuntimeClass>),
    Pod(Box<Pod>),
}

/// Parses `doc` as `T` and checks that `T` re-serialized says exactly what
/// the document says.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let value: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&value).map_err(|e| e.to_string())?;
    let mut diffs = Vec::new();
    compare("", doc, &back, &mut diffs);
    if diffs.is_empty() {
        Ok(value)
    } else {
        Err(diffs.join("; "))
    }
}

/// Lists where `doc` (as written) and `typed` (as the typed struct
/// re-serializes it) differ. The only normalisations:
///
/// - A number written where the typed side has a string of the same text
///   (`cpu: 1` against `Quantity("1")`): a quantity is a string in the
///   types, and the API server reads a YAML number there the same way.
/// - A `null` in the document against a field the typed side omits: both
///   mean "unset" (`key:` with no value in YAML).
/// - An empty object or array the typed side adds where the document has
///   nothing: a default our structs always write (e.g. a pod template's
///   `metadata: {}`), carrying no setting.
///
/// Anything else (a field the types do not know, so dropped; a value
/// changed in the round trip) is a difference.
fn compare(path: &str, doc: &Value, typed: &Value, diffs: &mut Vec<String>) {
    match (doc, typed) {
        (Value::Object(d), Value::Object(t)) => {
            for (k, dv) in d {
                let p = format!("{path}.{k}");
                match t.get(k) {
                    Some(tv) => compare(&p, dv, tv, diffs),
                    None if dv.is_null() => {}
                    None => diffs.push(format!("{p}: not a field of the type (dropped)")),
                }
            }
            for (k, tv) in t {
                if d.contains_key(k) {
                    continue;
                }
                let empty = match tv {
                    Value::Object(m) => m.is_empty(),
                    Value::Array(a) => a.is_empty(),
                    _ => false,
                };
                if !empty {
                    diffs.push(format!("{path}.{k}: added by the type as {tv}"));
                }
            }
        }
        (Value::Array(d), Value::Array(t)) => {
            if d.len() != t.len() {
                diffs.push(format!("{path}: {} items, typed {}", d.len(), t.len()));
                return;
            }
            for (i, (dv, tv)) in d.iter().zip(t).enumerate() {
                compare(&format!("{path}[{i}]"), dv, tv, diffs);
            }
        }
        (Value::Number(n), Value::String(s)) if n.to_string() == *s => {}
        (d, t) if d == t => {}
        (d, t) => diffs.push(format!("{path}: written {d}, typed {t}")),
    }
}

/// One document by its `apiVersion` and `kind`; an unknown kind fails.
fn object(doc: &Value) -> Result<Object, String> {
    let api = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    Ok(match (api, kind) {
        ("agents.x-k8s.io/v1beta1", "Sandbox") => Object::Sandbox(typed(doc)?),
        ("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate") => {
            Object::SandboxTemplate(typed(doc)?)
        }
        ("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool") => {
            Object::SandboxWarmPool(typed(doc)?)
        }
        ("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim") => Object::SandboxClaim(typed(doc)?),
        // k8s_openapi's types check `apiVersion` and `kind` themselves.
        (_, "Deployment") => Object::Deployment(typed(doc)?),
        (_, "Service") => Object::Service(typed(doc)?),
        (_, "ServiceAccount") => Object::ServiceAccount(typed(doc)?),
        (_, "Role") => Object::Role(typed(doc)?),
        (_, "RoleBinding") => Object::RoleBinding(typed(doc)?),
        (_, "NetworkPolicy") => Object::NetworkPolicy(typed(doc)?),
        (_, "Secret") => Object::Secret(typed(doc)?),
        (_, "PersistentVolumeClaim") => Object::PersistentVolumeClaim(typed(doc)?),
        (_, "HorizontalPodAutoscaler") => Object::HorizontalPodAutoscaler(typed(doc)?),
        (_, "RuntimeClass") => Object::RuntimeClass(typed(doc)?),
        (_, "Pod") => Object::Pod(typed(doc)?),
        _ => return Err(format!("unknown kind {kind:?} of {api:?}")),
    })
}

/// Every document of a multi-document YAML text, as JSON values (empty
/// documents, comments only, skipped).
fn documents(text: &str) -> Result<Vec<Value>, String> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).map_err(|e| e.to_string())?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn parse(text: &str) -> Result<Vec<Object>, String> {
    documents(text)?
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let name = d["metadata"]["name"].as_str().unwrap_or("?");
            object(d).map_err(|e| format!("document {i} ({name}): {e}"))
        })
        .collect()
}

fn yaml_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("packaging/kubernetes")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// Every manifest but `kustomization.yaml`, typed, by file.
fn all() -> BTreeMap<String, Vec<Object>> {
    let mut out = BTreeMap::new();
    let mut errors = Vec::new();
    for path in yaml_files() {
        let name = file_name(&path);
        if name == "kustomization.yaml" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        match parse(&text) {
            Ok(objects) => {
                out.insert(name, objects);
            }
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    out
}

macro_rules! of_kind {
    ($all:expr, $variant:ident) => {
        $all.values()
            .flatten()
            .filter_map(|o| match o {
                Object::$variant(x) => Some(x.as_ref()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
}

fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const HOST_LABEL: (&str, &str) = ("app.kubernetes.io/name", "sandbox-host");

#[test]
fn every_manifest_parses_into_its_type_with_nothing_dropped() {
    let all = all();
    let files: BTreeSet<&str> = all.keys().map(String::as_str).collect();
    for f in [
        "sandbox-templates.yaml",
        "warm-pools.yaml",
        "host.yaml",
        "secrets.yaml",
    ] {
        assert!(files.contains(f), "{f} is missing");
    }
    assert_eq!(of_kind!(all, SandboxTemplate).len(), 4);
    assert_eq!(of_kind!(all, SandboxWarmPool).len(), 4);
    assert_eq!(of_kind!(all, Deployment).len(), 1);
}

#[test]
fn kustomization_lists_existing_files_and_every_namespaced_manifest() {
    let text = std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap();
    let docs = documents(&text).unwrap();
    assert_eq!(docs.len(), 1);
    let k = &docs[0];
    assert_eq!(k["kind"], "Kustomization");
    let listed: BTreeSet<String> = k["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let present: BTreeSet<String> = yaml_files().iter().map(|p| file_name(p)).collect();
    for r in &listed {
        assert!(present.contains(r), "kustomization lists {r}, not a file");
    }
    // Left out on purpose: cluster-scoped (runtimeclass.yaml) or optional
    // (autoscaler.yaml); everything else is applied.
    let optional = ["kustomization.yaml", "runtimeclass.yaml", "autoscaler.yaml"];
    for p in &present {
        if !optional.contains(&p.as_str()) {
            assert!(listed.contains(p), "{p} is not in kustomization.yaml");
        }
    }
}

#[test]
fn warm_pools_name_templates_and_the_host_names_the_pools() {
    let all = all();
    let templates: BTreeSet<&str> = of_kind!(all, SandboxTemplate)
        .iter()
        .map(|t| name(&t.metadata))
        .collect();
    let pools: BTreeSet<&str> = of_kind!(all, SandboxWarmPool)
        .iter()
        .map(|p| {
            let t = p.spec.sandbox_template_ref.name.as_str();
            assert!(
                templates.contains(t),
                "{} names no template: {t}",
                name(&p.metadata)
            );
            assert!(p.spec.replicas.unwrap_or(0) >= 1);
            name(&p.metadata)
        })
        .collect();

    // --kube-pool [BENCHMARK=]POOL: a default and one per benchmark, each
    // an existing pool.
    let deployment = of_kind!(all, Deployment)[0];
    let args = host_args(deployment);
    let mut mapped = BTreeMap::new();
    for pair in args.windows(2) {
        if pair[0] == "--kube-pool" {
            let (bench, pool) = match pair[1].split_once('=') {
                Some((b, p)) => (b.to_string(), p.to_string()),
                None => (String::new(), pair[1].clone()),
            };
            assert!(
                pools.contains(pool.as_str()),
                "--kube-pool {pool}: no such pool"
            );
            assert!(mapped.insert(bench, pool).is_none());
        }
    }
    let benches: BTreeSet<&str> = mapped.keys().map(String::as_str).collect();
    assert_eq!(
        benches,
        BTreeSet::from(["", "MCP_Atlas", "MCP_Mark", "Toolathlon"])
    );

    // The HPA example scales an existing pool through its scale subresource.
    for hpa in of_kind!(all, HorizontalPodAutoscaler) {
        let target = &hpa.spec.as_ref().unwrap().scale_target_ref;
        assert_eq!(target.kind, "SandboxWarmPool");
        assert_eq!(
            target.api_version.as_deref(),
            Some("extensions.agents.x-k8s.io/v1beta1")
        );
        assert!(pools.contains(target.name.as_str()));
    }
}

fn host_args(d: &Deployment) -> Vec<String> {
    let spec = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    spec.containers[0].args.clone().unwrap_or_default()
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].as_str())
}

#[test]
fn the_host_deployment_is_wired_to_its_secrets_account_volume_and_service() {
    let all = all();
    let d = of_kind!(all, Deployment)[0];
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    assert_eq!(
        pod_labels.get(HOST_LABEL.0).map(String::as_str),
        Some(HOST_LABEL.1)
    );
    let pod = spec.template.spec.as_ref().unwrap();
    let args = host_args(d);
    assert_eq!(flag(&args, "--backend"), Some("kubernetes"));
    assert_eq!(flag(&args, "--kube-agent-port"), Some("7070"));
    assert_eq!(flag(&args, "--kube-mcp-port"), Some("7071"));
    assert_eq!(flag(&args, "--listen"), Some("0.0.0.0:8080"));

    // Every file flag lies in a mounted Secret that secrets.yaml defines
    // (the data dir on the RWX claim).
    let secrets: BTreeMap<&str, &Secret> = of_kind!(all, Secret)
        .into_iter()
        .map(|s| (name(&s.metadata), s))
        .collect();
    let volumes = pod.volumes.clone().unwrap();
    let mounts = pod.containers[0].volume_mounts.clone().unwrap();
    let volume_at = |file: &str| {
        let m = mounts
            .iter()
            .filter(|m| file.starts_with(&format!("{}/", m.mount_path)))
            .max_by_key(|m| m.mount_path.len())
            .unwrap_or_else(|| panic!("{file} is under no mount"));
        volumes.iter().find(|v| v.name == m.name).unwrap().clone()
    };
    for f in [
        "--kube-bootstrap-token-file",
        "--signing-key-file",
        "--api-key-file",
    ] {
        let file = flag(&args, f).unwrap_or_else(|| panic!("{f} missing"));
        let v = volume_at(file);
        let s = v
            .secret
            .unwrap_or_else(|| panic!("{f}: not a Secret volume"));
        let secret = secrets[s.secret_name.as_deref().unwrap()];
        let key = file.rsplit('/').next().unwrap();
        assert!(
            secret
                .string_data
                .as_ref()
                .is_some_and(|d| d.contains_key(key)),
            "{f}: Secret {} has no key {key}",
            name(&secret.metadata)
        );
    }
    let data = volume_at(&format!("{}/x", flag(&args, "--data-dir").unwrap()));
    let claim = data
        .persistent_volume_claim
        .expect("data dir on a claim")
        .claim_name;
    let pvc = of_kind!(all, PersistentVolumeClaim)
        .into_iter()
        .find(|c| name(&c.metadata) == claim)
        .expect("the data dir's claim");
    assert_eq!(
        pvc.spec.as_ref().unwrap().access_modes.as_deref(),
        Some(&["ReadWriteMany".to_string()][..])
    );

    // The service account is the one bound to the Role.
    let sa = pod.service_account_name.as_deref().unwrap();
    assert!(
        of_kind!(all, ServiceAccount)
            .iter()
            .any(|s| name(&s.metadata) == sa)
    );
    let binding = of_kind!(all, RoleBinding)[0];
    assert_eq!(binding.role_ref.kind, "Role");
    assert!(
        of_kind!(all, Role)
            .iter()
            .any(|r| name(&r.metadata) == binding.role_ref.name)
    );
    let subjects = binding.subjects.as_ref().unwrap();
    assert!(
        subjects
            .iter()
            .any(|s| s.kind == "ServiceAccount" && s.name == sa)
    );
    assert_eq!(
        pod.automount_service_account_token, None,
        "the host needs its token"
    );

    // The Service selects the host's pods.
    let service = of_kind!(all, Service)[0];
    let selector = service.spec.as_ref().unwrap().selector.clone().unwrap();
    assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));

    // The host's probes: it serves no health route, so a TCP socket.
    let c = &pod.containers[0];
    for p in [&c.startup_probe, &c.readiness_probe, &c.liveness_probe] {
        let p = p.as_ref().unwrap();
        assert_eq!(
            p.tcp_socket.as_ref().map(|t| t.port.clone()),
            Some(IntOrString::Int(8080))
        );
    }
}

#[test]
fn the_role_grants_exactly_what_the_host_uses() {
    let all = all();
    let roles = of_kind!(all, Role);
    assert_eq!(roles.len(), 1);
    let mut got = BTreeMap::new();
    for rule in roles[0].rules.as_ref().unwrap() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for group in rule.api_groups.as_ref().unwrap() {
            for resource in rule.resources.as_ref().unwrap() {
                let verbs: BTreeSet<String> = rule.verbs.iter().cloned().collect();
                assert!(
                    got.insert((group.clone(), resource.clone()), verbs)
                        .is_none(),
                    "{group}/{resource} granted twice"
                );
            }
        }
    }
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let want = BTreeMap::from([
        (
            (
                "extensions.agents.x-k8s.io".to_string(),
                "sandboxclaims".to_string(),
            ),
            set(&["get", "list", "watch", "create", "patch", "delete"]),
        ),
        (
            ("agents.x-k8s.io".to_string(), "sandboxes".to_string()),
            set(&["get", "list", "watch"]),
        ),
        // sandbox_kube::coord: presences, the reaper's, owners' ledgers.
        (
            ("coordination.k8s.io".to_string(), "leases".to_string()),
            set(&["get", "list", "create", "patch", "delete"]),
        ),
    ]);
    assert_eq!(got, want);
    // Nothing cluster-wide.
    let kinds: Vec<&str> = all
        .values()
        .flatten()
        .map(|o| match o {
            Object::Role(_) | Object::RoleBinding(_) => "rbac",
            _ => "",
        })
        .filter(|k| !k.is_empty())
        .collect();
    assert_eq!(kinds.len(), 2);
}

fn grpc_on_7070(what: &str, p: &Option<Probe>) {
    let p = p.as_ref().unwrap_or_else(|| panic!("{what}: no probe"));
    let g = p
        .grpc
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: not grpc"));
    assert_eq!(g.port, 7070, "{what}");
    assert!(p.exec.is_none() && p.http_get.is_none() && p.tcp_socket.is_none());
}

/// A port given as a number (names would depend on the pods' port names).
fn number(port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => panic!("port {s:?}: a number expected"),
    }
}

fn admits_only_the_host(peers: &[NetworkPolicyPeer]) -> bool {
    !peers.is_empty()
        && peers.iter().all(|peer| {
            peer.ip_block.is_none()
                && peer.namespace_selector.is_none()
                && peer.pod_selector.as_ref().is_some_and(|s| {
                    s.match_expressions.is_none()
                        && s.match_labels.as_ref() == Some(&labels(&[HOST_LABEL]))
                })
        })
}

#[test]
fn templates_probe_grpc_mount_the_bootstrap_secret_and_admit_only_the_host() {
    let all = all();
    let secrets: BTreeSet<&str> = of_kind!(all, Secret)
        .iter()
        .map(|s| name(&s.metadata))
        .collect();
    let runtime_classes: BTreeSet<&str> = of_kind!(all, RuntimeClass)
        .iter()
        .map(|r| name(&r.metadata))
        .collect();
    for t in of_kind!(all, SandboxTemplate) {
        let n = name(&t.metadata);
        let pod: &PodSpec = &t.spec.pod_template.spec;
        let rc = pod.runtime_class_name.as_deref().unwrap_or_default();
        assert_eq!(rc, "gvisor", "{n}");
        assert!(
            runtime_classes.contains(rc),
            "{n}: RuntimeClass {rc} not defined"
        );
        assert_eq!(pod.automount_service_account_token, Some(false), "{n}");
        assert_eq!(pod.containers.len(), 1, "{n}");
        let c = &pod.containers[0];
        grpc_on_7070(&format!("{n} startup"), &c.startup_probe);
        grpc_on_7070(&format!("{n} readiness"), &c.readiness_probe);
        grpc_on_7070(&format!("{n} liveness"), &c.liveness_probe);
        let ports: BTreeSet<i32> = c.ports.iter().flatten().map(|p| p.container_port).collect();
        assert_eq!(ports, BTreeSet::from([7070, 7071]), "{n}");
        let r = c.resources.as_ref().unwrap();
        for k in ["cpu", "memory"] {
            assert!(
                r.requests.as_ref().unwrap().contains_key(k),
                "{n}: request {k}"
            );
            assert!(r.limits.as_ref().unwrap().contains_key(k), "{n}: limit {k}");
        }
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{n}");
        assert_eq!(sc.privileged, None, "{n}");
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]), "{n}");
        assert!(
            !caps
                .add
                .iter()
                .flatten()
                .any(|c| c == "SYS_ADMIN" || c == "NET_ADMIN"),
            "{n}"
        );

        // The bootstrap Secret, root-only (0400), at the image's token path.
        let v = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.secret.is_some())
            .unwrap_or_else(|| panic!("{n}: no Secret volume"));
        let s = v.secret.as_ref().unwrap();
        assert_eq!(
            s.secret_name.as_deref(),
            Some("sandbox-agent-bootstrap"),
            "{n}"
        );
        assert!(secrets.contains("sandbox-agent-bootstrap"));
        assert_eq!(s.default_mode, Some(0o400), "{n}");
        let m = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == v.name)
            .unwrap();
        assert_eq!(m.mount_path, "/run/secrets/sandbox-agent", "{n}");
        assert_eq!(m.read_only, Some(true), "{n}");

        // Ingress: only from the host's pods, only to 7070 and 7071.
        assert_eq!(t.spec.network_policy_management.as_deref(), Some("Managed"));
        assert_eq!(
            t.spec.env_vars_injection_policy.as_deref(),
            Some("Disallowed")
        );
        let np = t.spec.network_policy.as_ref().expect("a network policy");
        assert!(!np.ingress.is_empty(), "{n}");
        for rule in &np.ingress {
            assert!(
                admits_only_the_host(rule.from.as_deref().unwrap_or_default()),
                "{n}: ingress from other than the host: {rule:?}"
            );
            let ports: BTreeSet<i32> = rule
                .ports
                .iter()
                .flatten()
                .map(|p| number(p.port.as_ref().expect("a port")))
                .collect();
            assert_eq!(ports, BTreeSet::from([7070, 7071]), "{n}");
        }
        // Egress: no peer reaches private ranges or the metadata service.
        for rule in &np.egress {
            for peer in rule.to.iter().flatten() {
                if let Some(b) = &peer.ip_block {
                    let except = b.except.clone().unwrap_or_default();
                    if b.cidr == "0.0.0.0/0" {
                        for c in [
                            "10.0.0.0/8",
                            "172.16.0.0/12",
                            "192.168.0.0/16",
                            "169.254.0.0/16",
                        ] {
                            assert!(except.iter().any(|e| e == c), "{n}: egress to {c}");
                        }
                    } else if b.cidr == "::/0" {
                        assert!(except.iter().any(|e| e == "fc00::/7"), "{n}");
                        assert!(except.iter().any(|e| e == "fe80::/10"), "{n}");
                    } else {
                        panic!("{n}: egress to {}", b.cidr);
                    }
                } else {
                    // Only the cluster's DNS, on port 53.
                    let ports: BTreeSet<i32> = rule
                        .ports
                        .iter()
                        .flatten()
                        .map(|p| number(p.port.as_ref().expect("a port")))
                        .collect();
                    assert_eq!(ports, BTreeSet::from([53]), "{n}");
                }
            }
            assert!(rule.to.is_some(), "{n}: an egress rule to anywhere");
        }
    }
}

#[test]
fn the_host_network_policy_selects_the_host_and_reaches_only_agents_dns_and_the_api() {
    let all = all();
    let nps = of_kind!(all, NetworkPolicy);
    assert_eq!(nps.len(), 1);
    let spec = nps[0].spec.as_ref().unwrap();
    assert_eq!(
        spec.pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref()),
        Some(&labels(&[HOST_LABEL]))
    );
    let types: BTreeSet<&str> = spec
        .policy_types
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    assert_eq!(types, BTreeSet::from(["Egress", "Ingress"]));
    for rule in spec.ingress.iter().flatten() {
        let ports: Vec<_> = rule
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.port.clone())
            .collect();
        assert_eq!(ports, vec![IntOrString::Int(8080)]);
    }
    let agents = labels(&[("app.kubernetes.io/name", "sandbox-agent")]);
    for t in of_kind!(all, SandboxTemplate) {
        let l = &t.spec.pod_template.metadata.labels;
        assert!(agents.iter().all(|(k, v)| l.get(k) == Some(v)));
    }
    assert!(spec.egress.iter().flatten().any(|r| {
        r.to.iter().flatten().any(|p| {
            p.pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.as_ref())
                == Some(&agents)
        })
    }));
}

// ---------------------------------------------------- the check itself

const TEMPLATE: &str = r#"
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: t
spec:
  podTemplate:
    metadata:
      labels: {a: b}
    spec:
      containers:
        - name: agent
          image: sandbox-agent:dev
          resources:
            requests: {cpu: 1, memory: 2Gi}
"#;

#[test]
fn a_correct_document_passes_with_only_the_stated_normalisations() {
    // `cpu: 1` is a number in YAML and a string in the type: the same.
    parse(TEMPLATE).unwrap();
}

#[test]
fn a_misspelt_field_fails() {
    // In our types (deny_unknown_fields and the required podTemplate).
    let e = parse(&TEMPLATE.replace("podTemplate:", "podTemplte:")).unwrap_err();
    assert!(e.contains("podTemplte"), "{e}");
    // Inside a k8s_openapi type, which ignores unknown fields: caught by
    // the round trip.
    let e = parse(&TEMPLATE.replace("image:", "imgae:")).unwrap_err();
    assert!(e.contains("imgae"), "{e}");
    let deployment = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  replica: 2
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers: [{name: c, image: i}]
"#;
    let e = parse(deployment).unwrap_err();
    assert!(e.contains(".spec.replica: not a field"), "{e}");
    // A value of the wrong type.
    let e = parse(&TEMPLATE.replace(
        "image: sandbox-agent:dev",
        "image: sandbox-agent:dev\n          ports: [{containerPort: \"7070\"}]",
    ))
    .unwrap_err();
    assert!(e.contains("invalid type"), "{e}");
}

#[test]
fn an_unknown_kind_fails() {
    let e = parse("apiVersion: v1\nkind: ConfigMapp\nmetadata: {name: x}\n").unwrap_err();
    assert!(e.contains("unknown kind"), "{e}");
    let e = parse(&TEMPLATE.replace("v1beta1", "v1alpha1")).unwrap_err();
    assert!(e.contains("unknown kind"), "{e}");
}
