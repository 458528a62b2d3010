//! kubernetes-sigs/agent-sandbox's resources (v1.0.x, API `v1beta1`) as
//! typed structs of our own: the fields this project reads or writes, with
//! the controller's spelling. Unknown fields are kept (`extra`) so a
//! round trip through them loses nothing an operator set.
//!
//! - `agents.x-k8s.io/v1beta1`: [`Sandbox`] (one pod and its status).
//! - `extensions.agents.x-k8s.io/v1beta1`: [`SandboxTemplate`] (a pod
//!   template and its network policy), [`SandboxWarmPool`] (`replicas`
//!   ready sandboxes of a template) and [`SandboxClaim`] (takes one
//!   sandbox of a warm pool; deleting it deletes that sandbox).
//!
//! The manifests in `packaging/kubernetes/` are parsed into these types in
//! a test, so a field spelt wrong there fails the build. What the host
//! reads back from the API server (a sandbox, a claim) takes fields it
//! does not know: a newer agent-sandbox that adds a defaulted spec field
//! must not make every read fail (the template's and pool's types stay
//! strict: only the packaging is parsed into them).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, PodSpec};
use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyIngressRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The core group (sandboxes).
pub const CORE_GROUP: &str = "agents.x-k8s.io";
/// The extensions group (templates, warm pools, claims).
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
/// The API version both groups serve.
pub const VERSION: &str = "v1beta1";

/// Implements [`kube::Resource`] for a namespaced type of ours.
macro_rules! resource {
    ($ty:ident, $group:expr, $plural:literal) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = kube::core::NamespaceResourceScope;
            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                stringify!($ty).into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                VERSION.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }

        impl $ty {
            /// The object with its `apiVersion` and `kind` set, as the
            /// API server needs them in a body it is to create (it
            /// answers 400 "Object 'Kind' is missing" otherwise).
            pub fn typed(mut self) -> Self {
                use kube::Resource;
                self.api_version = Some(Self::api_version(&()).into_owned());
                self.kind = Some(Self::kind(&()).into_owned());
                self
            }
        }
    };
}

// ---------------------------------------------------------------- Sandbox

/// One sandbox: a pod made from a blueprint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SandboxSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SandboxStatus>,
}
resource!(Sandbox, CORE_GROUP, "sandboxes");

/// What a sandbox runs, and when it ends.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    #[serde(default)]
    pub pod_template: PodTemplate,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_claim_templates: Vec<VolumeClaimTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_mode: Option<String>,
}

/// A pod's spec and the labels and annotations it gets.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    #[serde(default)]
    pub metadata: PodMetadata,
    #[serde(default)]
    pub spec: PodSpec,
}

/// Labels and annotations (agent-sandbox's `PodMetadata`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A volume claim made with each sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeClaimTemplate {
    #[serde(default)]
    pub metadata: EmbeddedMetadata,
    pub spec: PersistentVolumeClaimSpec,
}

/// Name, labels and annotations of an embedded object.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmbeddedMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// What the controller reports of a sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Vec<String>,
    #[serde(
        default,
        rename = "serviceFQDN",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_fqdn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// The `Ready` condition's type.
pub const READY: &str = "Ready";

/// The condition of `type_` in `conditions`, if any.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

impl Sandbox {
    /// Ready (its `Ready` condition true) with a pod IP: the first one.
    pub fn ready_ip(&self) -> Option<&str> {
        let s = self.status.as_ref()?;
        let ready = condition(&s.conditions, READY).is_some_and(|c| c.status == "True");
        if !ready {
            return None;
        }
        s.pod_ips.first().map(String::as_str)
    }
}

// ------------------------------------------------------- SandboxTemplate

/// A blueprint for a warm pool's sandboxes, and their network policy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: SandboxTemplateSpec,
}
resource!(SandboxTemplate, EXTENSIONS_GROUP, "sandboxtemplates");

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxTemplateSpec {
    pub pod_template: PodTemplate,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_claim_templates: Vec<VolumeClaimTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,
    /// `Managed` (the controller makes the policy) or `Unmanaged`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy_management: Option<String>,
    /// `Allowed`, `Overrides` or `Disallowed`: whether a claim's `env`
    /// reaches the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars_injection_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates_policy: Option<String>,
}

/// The template's network policy: its ingress and egress rules.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicySpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<NetworkPolicyIngressRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<NetworkPolicyEgressRule>,
}

// ------------------------------------------------------- SandboxWarmPool

/// `replicas` ready sandboxes of a template, waiting for claims.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPool {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: SandboxWarmPoolSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SandboxWarmPoolStatus>,
}
resource!(SandboxWarmPool, EXTENSIONS_GROUP, "sandboxwarmpools");

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxWarmPoolSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    pub sandbox_template_ref: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

/// `Recreate` or `OnReplenish`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateStrategy {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolStatus {
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// A reference by name (`sandboxTemplateRef`, `warmPoolRef`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameRef {
    pub name: String,
}

// ---------------------------------------------------------- SandboxClaim

/// Takes one sandbox of a warm pool; deleting it deletes the sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaim {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: SandboxClaimSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SandboxClaimStatus>,
}
resource!(SandboxClaim, EXTENSIONS_GROUP, "sandboxclaims");

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    pub warm_pool_ref: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<ClaimLifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_metadata: Option<PodMetadata>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<ClaimEnvVar>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_claim_templates: Vec<VolumeClaimTemplate>,
}

/// When the claim (and its sandbox) ends by itself.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLifecycle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
    /// `Delete`, `DeleteForeground` or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEnvVar {
    pub name: String,
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub sandbox: ClaimedSandbox,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// The sandbox a claim took.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedSandbox {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, rename = "podIPs")]
    pub pod_ips: Vec<String>,
}

impl SandboxClaim {
    /// The sandbox it took, once the controller says.
    pub fn sandbox_name(&self) -> Option<&str> {
        self.status.as_ref()?.sandbox.name.as_deref()
    }
    /// Why the claim failed for good, if it did: its `Ready` condition
    /// false for a reason the controller does not retry (a missing
    /// template or pool, metadata or environment it refused, expiry).
    pub fn failure(&self) -> Option<String> {
        let s = self.status.as_ref()?;
        let c = condition(&s.conditions, READY)?;
        let terminal = [
            "TemplateNotFound",
            "WarmPoolNotFound",
            "InvalidMetadata",
            "EnvVarsInjectionRejected",
            "VolumeClaimTemplatesError",
            "ClaimExpired",
            "SandboxExpired",
        ];
        if c.status == "False" && terminal.contains(&c.reason.as_str()) {
            return Some(format!("{}: {}", c.reason, c.message));
        }
        None
    }
}

#[cfg(test)]
mod newer_fields {
    use super::{Sandbox, SandboxClaim};

    /// A newer agent-sandbox may default spec fields this host does not
    /// know (an open proposal adds `podFailurePolicy: Ignore` to every
    /// sandbox): reads of sandboxes and claims still parse.
    #[test]
    fn a_sandbox_and_a_claim_with_fields_of_a_newer_release_parse() {
        let s: Result<Sandbox, _> = serde_json::from_value(serde_json::json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": "s"},
            "spec": {"podFailurePolicy": "Ignore", "podTemplate": {
                "metadata": {"labels": {"a": "b"}, "future": 1},
                "spec": {"containers": [{"name": "agent", "image": "i"}]}}},
        }));
        assert!(s.is_ok(), "{s:?}");
        let c: Result<SandboxClaim, _> = serde_json::from_value(serde_json::json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
            "metadata": {"name": "c"},
            "spec": {"warmPoolRef": {"name": "p"}, "ttlSecondsAfterCreated": 60,
                     "lifecycle": {"shutdownPolicy": "Delete", "future": true}},
        }));
        assert!(c.is_ok(), "{c:?}");
    }
}
