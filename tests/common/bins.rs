//! Where the workspace's binaries are: beside the directory of the running
//! test or bench executable (`<target>/<profile>/deps/<exe>` →
//! `<target>/<profile>/<bin>`), where `cargo test` and `cargo build` put
//! them. `cargo test` from the workspace root builds them (each binary's
//! package has a CLI test of its own); benches use the release binaries
//! `cargo build --release --bins` makes.

use std::path::PathBuf;
use std::sync::LazyLock;

/// The path of binary `name`, which must have been built.
pub fn bin(name: &str) -> String {
    let exe = std::env::current_exe().expect("the path of the running test executable");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(PathBuf::from)
        .expect("the test executable lies in <target>/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo test` from the workspace root (tests), or \
         `cargo build --release --bins` with the bench's --target (benches)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

pub static AGENT: LazyLock<String> = LazyLock::new(|| bin("sandbox-agent"));
pub static CTL: LazyLock<String> = LazyLock::new(|| bin("sandboxctl"));
pub static HOST: LazyLock<String> = LazyLock::new(|| bin("sandbox-host"));
