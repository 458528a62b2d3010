//! A small MCP_Atlas dataset made by the tests (nothing third-party is
//! kept here), pinned and installed with packaging/install-benchmark-data.sh
//! exactly as real data is, once per test process. The shipped manifest's
//! `/opt/sandbox-agent/benchmark-data` is pointed at it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Where the shipped manifest expects installed benchmark data.
pub const SHIPPED_PREFIX: &str = "/opt/sandbox-agent/benchmark-data";
/// An entity of the dataset's memory graph.
pub const ATLAS_ENTITY: &str = "atlas-preloaded-entity";
/// A CSV file at the top of the dataset.
pub const ATLAS_CSV: &str = "barber_shop.csv";

/// The installer, for tests that call it themselves.
pub fn installer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/install-benchmark-data.sh")
}

/// Writes the dataset's files into `dir`.
pub fn write_atlas_data(dir: &Path) {
    let memory = dir.join("repos/memory_mcp_server");
    std::fs::create_dir_all(&memory).expect("data dir");
    std::fs::write(dir.join(ATLAS_CSV), "customer,visits\nAnn,3\nBob,5\n").expect("csv");
    std::fs::write(
        memory.join("memories-for-mcp.json"),
        format!(
            "{{\"type\":\"entity\",\"name\":\"{ATLAS_ENTITY}\",\"entityType\":\"test\",\"observations\":[\"preloaded\"]}}\n"
        ),
    )
    .expect("memory graph");
}

/// Runs the installer; panics with its output unless it succeeds.
pub fn run_installer(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(installer())
        .args(args)
        .output()
        .expect("bash");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "install-benchmark-data {args:?}: {text}"
    );
    text
}

/// The prefix holding the installed test dataset (MCP_Atlas).
pub fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let root = tempfile::Builder::new()
            .prefix("sandbox-suite-benchmark-data")
            .tempdir()
            .expect("tempdir")
            .keep();
        let src = root.join("src");
        write_atlas_data(&src);
        let pins = root.join("MCP_Atlas.sha256");
        let prefix = root.join("installed");
        let (s, p, x) = (
            src.display().to_string(),
            pins.display().to_string(),
            prefix.display().to_string(),
        );
        run_installer(&["MCP_Atlas", "--pin", "--from", &s, "--pins", &p]);
        run_installer(&["MCP_Atlas", "--from", &s, "--pins", &p, "--prefix", &x]);
        // The servers (some as other users) read it.
        for d in [&root, &prefix] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        prefix
    })
}
