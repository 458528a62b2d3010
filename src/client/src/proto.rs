//! Code generated from `proto/sandbox/agent/v1/*.proto` by `build.rs`.
//!
//! Clients: [`agent_client::AgentClient`], [`workspace_client::WorkspaceClient`],
//! [`servers_client::ServersClient`], [`exec_client::ExecClient`]. Health is the standard
//! `grpc.health.v1` service, re-exported as [`health`].

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("sandbox.agent.v1");

/// Encoded `FileDescriptorSet` of package `sandbox.agent.v1` and its imports,
/// served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("sandbox_agent_v1_descriptor");

/// The standard gRPC health checking protocol (`grpc.health.v1`).
pub use tonic_health::pb as health;

/// Fully-qualified names of the services this crate defines, as reflection
/// and health report them.
pub const SERVICE_NAMES: [&str; 4] = [
    "sandbox.agent.v1.Agent",
    "sandbox.agent.v1.Workspace",
    "sandbox.agent.v1.Servers",
    "sandbox.agent.v1.Exec",
];
