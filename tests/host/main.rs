//! The reference host's integration tests: the real `sandbox-host` over a
//! pool of real agents and MCP servers, driven through its REST API with
//! real HTTP and MCP clients.

#[path = "../common/mod.rs"]
mod common;
/// The real kube-apiserver tier, shared with `sandbox-kube`'s tests (not
/// every helper is used here).
#[cfg(feature = "kubernetes")]
#[allow(dead_code)]
#[path = "../../src/kube/tests/real/mod.rs"]
mod real;

mod atlas_tree;
mod benchmark_tasks;
mod canvas;
mod catalog;
mod cleanup;
mod deadlines;
mod exec;
mod first_day;
mod google_cloud;
mod hardening;
mod host;
mod isolation;
// The kubernetes backend's (`--features kubernetes`, on in CI).
#[cfg(feature = "kubernetes")]
mod kube_api;
#[cfg(feature = "kubernetes")]
mod kube_cluster;
#[cfg(feature = "kubernetes")]
mod kube_real;
#[cfg(feature = "kubernetes")]
mod kubernetes;
#[cfg(feature = "kubernetes")]
mod kubernetes_attacks;
mod lease_bound;
mod mail;
mod no_skips;
mod openapi;
mod profiles;
mod sandbox_api;
mod tenant_paths;
mod toolathlon_mail;
mod warm;
