//! Setup shared by the benchmarks that run real MCP servers.

use std::path::Path;

/// The shipped manifest, pointed at the installed servers
/// (`SANDBOX_AGENT_SERVERS_DIR`, default /opt/sandbox-agent/servers) and
/// with its state directories moved under `state`.
pub fn shipped_manifest(state: &Path) -> String {
    let dir = std::env::var("SANDBOX_AGENT_SERVERS_DIR")
        .unwrap_or_else(|_| "/opt/sandbox-agent/servers".into());
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/servers.toml"
    ))
    .expect("packaging/servers.toml")
    .replace(
        "install_dir = \"/opt/sandbox-agent/servers\"",
        &format!("install_dir = \"{dir}\""),
    )
    .replace("/var/lib/sandbox-agent", &state.display().to_string())
}
