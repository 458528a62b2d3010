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

impl Benchmark {
    /// The names Klavis's API gives the profiles, in its order.
    pub const KLAVIS_NAMES: [&str; 3] = ["MCP_Atlas", "Toolathlon", "MCP_Mark"];

    /// The profile Klavis names `name` (`MCP_Atlas`, `Toolathlon`,
    /// `MCP_Mark`); `None` for any other string.
    pub fn from_klavis(name: &str) -> Option<Benchmark> {
        match name {
            "MCP_Atlas" => Some(Benchmark::McpAtlas),
            "Toolathlon" => Some(Benchmark::Toolathlon),
            "MCP_Mark" => Some(Benchmark::McpMark),
            _ => None,
        }
    }

    /// Klavis's name of the profile; `None` for `Unspecified`.
    pub fn klavis_name(self) -> Option<&'static str> {
        match self {
            Benchmark::Unspecified => None,
            Benchmark::McpAtlas => Some("MCP_Atlas"),
            Benchmark::Toolathlon => Some("Toolathlon"),
            Benchmark::McpMark => Some("MCP_Mark"),
        }
    }
}
