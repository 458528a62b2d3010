//! Setup shared by the benchmarks that run real MCP servers.
#![allow(dead_code)]

use std::path::Path;

/// The shipped manifest, pointed at the installed servers
/// (`SANDBOX_AGENT_SERVERS_DIR`, default /opt/sandbox-agent/servers) and
/// with its state directories moved under `state`.
pub fn shipped_manifest(state: &Path) -> String {
    let dir = servers_dir();
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/servers.toml"
    ))
    .expect("packaging/servers.toml")
    .replace(
        "install_dir = \"/opt/sandbox-agent/servers\"",
        &format!("install_dir = \"{dir}\""),
    )
    .replace("${state_root}", &state.display().to_string())
    .replace(
        bench_data::SHIPPED_PREFIX,
        &bench_data::prefix().display().to_string(),
    )
}

/// The tests' small MCP_Atlas dataset, installed as real data is.
#[path = "../../tests/common/bench_data.rs"]
pub mod bench_data;

/// Where the MCP servers are installed (`SANDBOX_AGENT_SERVERS_DIR`).
pub fn servers_dir() -> String {
    std::env::var("SANDBOX_AGENT_SERVERS_DIR")
        .unwrap_or_else(|_| "/opt/sandbox-agent/servers".into())
}

/// The test VM image builder (`packaging/vm/build-initramfs.sh`).
#[path = "../../tests/common/slots.rs"]
pub mod slots;
#[path = "../../tests/common/vm.rs"]
pub mod vm;

#[path = "../../tests/common/bins.rs"]
mod bins;
#[allow(unused_imports)]
pub use bins::{AGENT, HOST, catalog_recording_lock, shared_catalog_dir};

/// `BENCH=short` (what the test command runs in CI): fewer rounds and
/// smaller corpora, so the suite stays fast while every bench still runs
/// end to end. Anything else, or unset, is the full benchmark whose figures
/// the README quotes (`BENCH=full ./.ci/test-all.sh`, or `cargo bench`).
pub fn short() -> bool {
    std::env::var("BENCH").is_ok_and(|v| v == "short")
}

/// `full` in the full mode, else `short`.
pub fn pick<T>(full: T, short_: T) -> T {
    if short() { short_ } else { full }
}

/// The mode, for the report's heading.
pub fn mode() -> &'static str {
    if short() {
        "short mode (BENCH=short): fewer rounds, smaller corpora"
    } else {
        "full mode"
    }
}
