//! The API server a kubernetes test's replicas use: a namespace of its own
//! on the test process's real kube-apiserver ([`Real`]: agent-sandbox's
//! CRDs and `packaging/kubernetes/` installed, the host as the shipped
//! ServiceAccount with the shipped Role, agent-sandbox's controllers
//! played in that namespace), or the HTTP stand-in (`kube_api`), kept for
//! what a real server cannot be made to do: calls that stall.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use sandbox_kube::crd::SandboxClaim;
use serde_json::{Value, json};

use super::kube_api::KubeApi;
use super::real::{controller, shared_api};

/// What the host tests read of the API server they run on.
pub(super) trait Cluster {
    /// The host's kubeconfig (its namespace is the host's default).
    fn kubeconfig(&self) -> PathBuf;
    /// The claims there, by name.
    fn claim_names(&self) -> Vec<String>;
    /// Claim `name` as the API server has it.
    fn claim(&self, name: &str) -> Value;
}

impl Cluster for KubeApi {
    fn kubeconfig(&self) -> PathBuf {
        self.kubeconfig.clone()
    }

    fn claim_names(&self) -> Vec<String> {
        KubeApi::claim_names(self)
    }

    fn claim(&self, name: &str) -> Value {
        self.lock().claims[name].clone()
    }
}

/// A namespace of the process's real API server, its warm pools' pods
/// the real agents the test started at `pods`.
pub(super) struct Real {
    pub ns: String,
    ctl: controller::Controller,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The audit log's record of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Request {
    pub verb: String,
    pub resource: String,
    pub name: String,
    pub user_agent: String,
}

impl Real {
    /// A fresh namespace with the shipped manifests, its pools' pods at
    /// `pods` (handed out in turn, each once).
    pub fn new(pods: &[String]) -> Real {
        let (rt, api) = shared_api();
        let ns = format!(
            "t{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        rt.block_on(api.install(&ns));
        let ctl = {
            let _in = rt.enter();
            controller::spawn_pods(api.admin.clone(), &ns, pods)
        };
        Real { ns, ctl }
    }

    fn claims(&self) -> Api<SandboxClaim> {
        Api::namespaced(shared_api().1.admin.clone(), &self.ns)
    }

    /// More pods for the pools: waiting claims take them.
    pub fn add_pods(&self, ips: &[String]) {
        self.ctl.add_pods(ips);
    }

    /// `kubectl delete sandboxclaim NAME`: with the hosts' finalizer it
    /// stays, terminating, until a host takes it off.
    pub fn delete_claim(&self, name: &str) {
        shared_api()
            .0
            .block_on(self.claims().delete(name, &DeleteParams::background()))
            .expect("kubectl delete sandboxclaim");
    }

    /// Creates `claim` as an admin would (`kubectl create -f`).
    pub fn create_claim(&self, claim: Value) -> SandboxClaim {
        let c: SandboxClaim = serde_json::from_value(claim).expect("a claim");
        shared_api()
            .0
            .block_on(self.claims().create(&PostParams::default(), &c))
            .expect("kubectl create sandboxclaim")
    }

    /// The shipped Role with or without `create` on claims (an operator
    /// editing it), in force once the API server's authorizer has it.
    pub fn allow_claim_create(&self, allowed: bool) {
        let (rt, api) = shared_api();
        let roles: Api<Role> = Api::namespaced(api.admin.clone(), &self.ns);
        let mut verbs = vec!["get", "list", "watch", "patch", "delete"];
        if allowed {
            verbs.push("create");
        }
        let patch = json!({"rules": [
            {"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["sandboxclaims"], "verbs": verbs},
            {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "create", "patch", "delete"]},
        ]});
        rt.block_on(roles.patch(
            "sandbox-host",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ))
        .expect("patch the Role");
    }

    /// Every request the hosts' ServiceAccount made in this namespace so
    /// far (the API server's audit log).
    pub fn host_requests(&self) -> Vec<Request> {
        let user = format!("system:serviceaccount:{}:sandbox-host", self.ns);
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        shared_api()
            .1
            .audit()
            .iter()
            .filter(|e| e["user"]["username"] == user.as_str())
            .map(|e| Request {
                verb: s(&e["verb"]),
                resource: s(&e["objectRef"]["resource"]),
                name: s(&e["objectRef"]["name"]),
                user_agent: s(&e["userAgent"]),
            })
            .collect()
    }

    /// The User-Agents of the hosts' requests.
    pub fn user_agents(&self) -> BTreeSet<String> {
        self.host_requests()
            .into_iter()
            .map(|r| r.user_agent)
            .collect()
    }
}

impl Cluster for Real {
    fn kubeconfig(&self) -> PathBuf {
        shared_api().1.host_kubeconfig(&self.ns)
    }

    fn claim_names(&self) -> Vec<String> {
        shared_api()
            .0
            .block_on(self.claims().list(&Default::default()))
            .expect("list claims")
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect()
    }

    fn claim(&self, name: &str) -> Value {
        let c = shared_api()
            .0
            .block_on(self.claims().get(name))
            .expect("the claim");
        serde_json::to_value(c).expect("claim JSON")
    }
}

impl Drop for Real {
    /// The namespace goes with the test (its objects, and the claims'
    /// finalizers taken off so nothing is held).
    fn drop(&mut self) {
        let (rt, api) = shared_api();
        let claims = self.claims();
        let _ = rt.block_on(async {
            if let Ok(list) = claims.list(&Default::default()).await {
                for c in list.items {
                    let name = c.metadata.name.unwrap_or_default();
                    let off = json!({"metadata": {"finalizers": null}});
                    let _ = claims
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&off))
                        .await;
                }
            }
            let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(api.admin.clone());
            nss.delete(&self.ns, &DeleteParams::background()).await
        });
    }
}
