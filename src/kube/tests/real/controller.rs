//! agent-sandbox's controllers, played against the real API server as
//! `../shared/kubernetes/controller.md` says they act (the API semantics
//! stay the server's): a claim of an existing warm pool gets a Ready
//! sandbox of that pool (made when the claim is seen: a pool always warm),
//! adopted as the controller adopts one (annotation on the claim, labels
//! and controller reference on the sandbox, the claim's status through
//! its status subresource); a claim of a missing pool gets `Ready=False`
//! `WarmPoolNotFound`; a claim past its `shutdownTime` is deleted with its
//! `shutdownPolicy` (`Delete`: background propagation; `DeleteForeground`:
//! foreground); and, as kube-controller-manager's garbage collector would,
//! a sandbox whose claim is gone is deleted, and so is one whose claim is
//! being deleted in the foreground, after which the collector takes its
//! `foregroundDeletion` finalizer off the claim.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use sandbox_kube::crd::{Sandbox, SandboxClaim, SandboxWarmPool};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// The controller's loop; stopped when dropped.
pub struct Controller {
    task: JoinHandle<()>,
    adopted: Arc<AtomicUsize>,
    pods: Pods,
}

impl Controller {
    /// How many warm sandboxes claims have adopted so far (each one a
    /// warm pod spent).
    pub fn adopted(&self) -> usize {
        self.adopted.load(Ordering::SeqCst)
    }

    /// More pods for the pool ([`spawn_pods`]): claims waiting take them.
    pub fn add_pods(&self, ips: &[String]) {
        if let Pods::Each(q) = &self.pods {
            q.lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(ips.iter().cloned());
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where the warm pool's pods are.
#[derive(Clone)]
enum Pods {
    /// Every sandbox at one address.
    Same(String),
    /// A pod each, taken in turn and never handed out again (a deleted
    /// sandbox's pod is gone); none left: claims wait, as on an empty
    /// pool.
    Each(Arc<Mutex<VecDeque<String>>>),
    /// Every sandbox adopted, its pod never Ready (no IP).
    Pending,
}

impl Pods {
    fn next(&self) -> Option<String> {
        match self {
            Pods::Same(ip) => Some(ip.clone()),
            Pods::Each(q) => q.lock().unwrap_or_else(|p| p.into_inner()).pop_front(),
            Pods::Pending => Some(String::new()),
        }
    }
}

/// Plays the controllers in `ns` every 50 ms; pods are at `pod_ip`.
pub fn spawn(admin: kube::Client, ns: &str, pod_ip: &str) -> Controller {
    run(admin, ns, Pods::Same(pod_ip.to_owned()))
}

/// [`spawn`], each sandbox a pod of its own from `ips`, in turn.
pub fn spawn_pods(admin: kube::Client, ns: &str, ips: &[String]) -> Controller {
    let q = ips.iter().cloned().collect();
    run(admin, ns, Pods::Each(Arc::new(Mutex::new(q))))
}

/// [`spawn`], every adopted sandbox's pod Pending for ever.
pub fn spawn_pending(admin: kube::Client, ns: &str) -> Controller {
    run(admin, ns, Pods::Pending)
}

fn run(admin: kube::Client, ns: &str, pods: Pods) -> Controller {
    let ns = ns.to_owned();
    let adopted = Arc::new(AtomicUsize::new(0));
    let count = adopted.clone();
    let mine = pods.clone();
    let task = tokio::spawn(async move {
        loop {
            if let Err(e) = tick(&admin, &ns, &pods, &count).await {
                eprintln!("controller: {e}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    Controller {
        task,
        adopted,
        pods: mine,
    }
}

fn condition(status: &str, reason: &str, message: &str) -> Value {
    json!({
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    })
}

async fn tick(
    admin: &kube::Client,
    ns: &str,
    pods: &Pods,
    adopted: &AtomicUsize,
) -> Result<(), kube::Error> {
    let claims: Api<SandboxClaim> = Api::namespaced(admin.clone(), ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(admin.clone(), ns);
    let pools: Api<SandboxWarmPool> = Api::namespaced(admin.clone(), ns);
    let list = claims.list(&ListParams::default()).await?;
    for claim in &list.items {
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if shut_down(&claims, claim).await? || claim.sandbox_name().is_some() {
            continue;
        }
        let name = claim.metadata.name.clone().unwrap_or_default();
        let pool = claim.spec.warm_pool_ref.name.clone();
        if pools.get_opt(&pool).await?.is_none() {
            let status = json!({"status": {"conditions": [condition(
                "False", "WarmPoolNotFound", &format!("warm pool {pool} not found"))]}});
            claims
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
            continue;
        }
        let taken = match begun(&sandboxes, claim).await? {
            Some(sb) => sb,
            None => {
                let Some(ip) = pods.next() else {
                    continue;
                };
                let sb = warm(&sandboxes, claim, &pool, &ip).await?;
                adopted.fetch_add(1, Ordering::SeqCst);
                sb
            }
        };
        adopt(&claims, &sandboxes, claim, &name, &taken).await?;
    }
    collect(&claims, &sandboxes, &list.items).await
}

const FOREGROUND: &str = "foregroundDeletion";

/// Deletes `claim` if its `shutdownTime` has passed, as its policy says;
/// whether it did.
async fn shut_down(claims: &Api<SandboxClaim>, claim: &SandboxClaim) -> Result<bool, kube::Error> {
    let Some(l) = &claim.spec.lifecycle else {
        return Ok(false);
    };
    let (Some(at), Some(policy)) = (&l.shutdown_time, l.shutdown_policy.as_deref()) else {
        return Ok(false);
    };
    if at.0 > k8s_openapi::jiff::Timestamp::now() {
        return Ok(false);
    }
    let propagation = match policy {
        "Delete" => PropagationPolicy::Background,
        "DeleteForeground" => PropagationPolicy::Foreground,
        _ => return Ok(false),
    };
    let dp = DeleteParams {
        propagation_policy: Some(propagation),
        ..Default::default()
    };
    let name = claim.metadata.name.clone().unwrap_or_default();
    claims.delete(&name, &dp).await?;
    Ok(true)
}

/// The garbage collector: a sandbox whose controlling claim is gone, or
/// is being deleted in the foreground, is deleted; a claim deleted in the
/// foreground with no sandbox left loses its `foregroundDeletion`.
async fn collect(
    claims: &Api<SandboxClaim>,
    sandboxes: &Api<Sandbox>,
    listed: &[SandboxClaim],
) -> Result<(), kube::Error> {
    let uid = |c: &SandboxClaim| c.metadata.uid.clone().unwrap_or_default();
    let foreground = |c: &SandboxClaim| {
        c.metadata.deletion_timestamp.is_some()
            && c.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == FOREGROUND)
    };
    let live: Vec<String> = listed.iter().filter(|c| !foreground(c)).map(uid).collect();
    let mut owners = Vec::new();
    for s in sandboxes.list(&ListParams::default()).await?.items {
        let owner = s
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        // One made for a claim by a tick that failed before taking it
        // belongs to that claim all the same.
        let made_for = note(&s, FOR_CLAIM).map(str::to_owned);
        let Some(o) = owner
            .filter(|o| o.kind == "SandboxClaim")
            .map(|o| o.uid.clone())
            .or(made_for)
        else {
            continue;
        };
        owners.push(o.clone());
        if !live.contains(&o) && s.metadata.deletion_timestamp.is_none() {
            let n = s.metadata.name.clone().unwrap_or_default();
            sandboxes.delete(&n, &DeleteParams::background()).await?;
        }
    }
    for c in listed
        .iter()
        .filter(|c| foreground(c) && !owners.contains(&uid(c)))
    {
        let rest: Vec<&String> = c
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != FOREGROUND)
            .collect();
        let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": c.metadata.resource_version}});
        let name = c.metadata.name.clone().unwrap_or_default();
        claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// The test's own note on a sandbox made for a claim (the claim's uid),
/// and the address of its pod: a tick that failed half-way (any call can
/// fail on a loaded machine) finds the sandbox again and finishes, as a
/// controller's next reconcile does, rather than spending another pod
/// and leaving the first sandbox with no owner.
const FOR_CLAIM: &str = "test.sandbox-agent/for-claim";
const POD_IP: &str = "test.sandbox-agent/pod-ip";

fn note<'a>(s: &'a Sandbox, key: &str) -> Option<&'a str> {
    s.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The sandbox already made for `claim`, if a tick before got that far.
async fn begun(
    sandboxes: &Api<Sandbox>,
    claim: &SandboxClaim,
) -> Result<Option<Sandbox>, kube::Error> {
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let all = sandboxes.list(&ListParams::default()).await?.items;
    Ok(all.into_iter().find(|s| note(s, FOR_CLAIM) == Some(uid)))
}

/// A warm sandbox of `pool` for `claim`, its pod at `ip`.
async fn warm(
    sandboxes: &Api<Sandbox>,
    claim: &SandboxClaim,
    pool: &str,
    ip: &str,
) -> Result<Sandbox, kube::Error> {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let warm: Sandbox = serde_json::from_value(json!({
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "generateName": format!("{pool}-"),
            "labels": {
                "agents.x-k8s.io/launch-type": "warm",
                "agents.x-k8s.io/created-by": "controller",
            },
            "annotations": {FOR_CLAIM: uid, POD_IP: ip},
        },
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "sandbox-agent"}]}}},
    }))
    .expect("sandbox");
    sandboxes.create(&PostParams::default(), &warm).await
}

/// `sandbox` Ready and taken by `claim`, as the claim controller adopts a
/// warm one. Every step is a merge patch that may be made again.
async fn adopt(
    claims: &Api<SandboxClaim>,
    sandboxes: &Api<Sandbox>,
    claim: &SandboxClaim,
    name: &str,
    sandbox: &Sandbox,
) -> Result<(), kube::Error> {
    let observed = json!({"metadata": {"annotations": {
        "agents.x-k8s.io/controller-first-observed-at": "2026-01-01T00:00:00Z"}}});
    claims
        .patch(name, &PatchParams::default(), &Patch::Merge(&observed))
        .await?;
    let sb = sandbox.metadata.name.clone().unwrap_or_default();
    // An empty address: a pod that never gets Ready ([`Pods::Pending`]).
    let ip = note(sandbox, POD_IP).unwrap_or_default();
    let ready = if ip.is_empty() {
        json!({"status": {
            "conditions": [condition("False", "DependenciesNotReady", "Pod exists with phase: Pending")],
        }})
    } else {
        json!({"status": {
            "conditions": [condition("True", "DependenciesReady", "Pod is Ready")],
            "podIPs": [ip],
            "nodeName": "node-0",
        }})
    };
    sandboxes
        .patch_status(&sb, &PatchParams::default(), &Patch::Merge(&ready))
        .await?;
    let record = json!({"metadata": {"annotations": {"agents.x-k8s.io/sandbox-name": sb}}});
    claims
        .patch(name, &PatchParams::default(), &Patch::Merge(&record))
        .await?;
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let take = json!({"metadata": {
        "labels": {"agents.x-k8s.io/launch-type": null, "agents.x-k8s.io/claim-uid": uid},
        "ownerReferences": [{
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "name": name,
            "uid": uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    }});
    sandboxes
        .patch(&sb, &PatchParams::default(), &Patch::Merge(&take))
        .await?;
    let status = if ip.is_empty() {
        json!({"status": {
            "conditions": [condition("False", "SandboxNotReady", "Sandbox is not ready")],
            "sandbox": {"name": sb},
        }})
    } else {
        json!({"status": {
            "conditions": [condition("True", "DependenciesReady", "Pod is Ready")],
            "sandbox": {"name": sb, "podIPs": [ip]},
        }})
    };
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}
