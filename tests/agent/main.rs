//! The agent's integration tests, one binary: each module starts the real
//! `sandbox-agent` (and `sandboxctl`) and talks to it over real sockets,
//! with real MCP servers where a test needs them.

#[path = "../common/mod.rs"]
mod common;

mod control_plane;
mod exec;
mod first_day;
mod gateway;
mod hardening;
mod hvsock;
mod launches;
mod lazy;
mod lease_bound;
mod lifecycle;
mod mail;
mod module_graph;
mod narrow;
mod outside_accounts;
mod packaging;
mod pinned;
mod pins;
mod readme;
mod recovery;
mod rpc;
mod shipped_servers;
mod tenant_paths;
mod token_binding;
mod tool_schemas;
mod workspace;
mod workspace_turns;
