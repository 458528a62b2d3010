//! Where the workspace's binaries are: beside the directory of the running
//! test or bench executable (`<target>/<profile>/deps/<exe>` →
//! `<target>/<profile>/<bin>`), where `cargo test` and `cargo build` put
//! them. `cargo test` from the workspace root builds them (each binary's
//! package has a CLI test of its own); benches use the release binaries
//! `cargo build --release --bins` makes.
//!
//! A binary older than the sources it is built from is refused: a test run
//! of `-p sandbox-suite` alone would otherwise test yesterday's agent.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::SystemTime;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The source trees each binary is built from.
fn sources(name: &str) -> &'static [&'static str] {
    match name {
        "sandbox-agent" => &[
            "src/agent/src",
            "src/client",
            "src/serve/src",
            "src/archive/src",
            "proto",
        ],
        "sandboxctl" => &[
            "src/sandboxctl/src",
            "src/client",
            "src/serve/src",
            "src/archive/src",
            "proto",
        ],
        "sandbox-host" => &["src/host/src", "src/client", "src/serve/src", "proto"],
        _ => &[],
    }
}

/// The newest modification time of the files below `dir`.
fn newest(dir: &Path) -> Option<(SystemTime, PathBuf)> {
    let mut best: Option<(SystemTime, PathBuf)> = None;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                stack.push(e.path());
            } else if let Ok(t) = md.modified()
                && best.as_ref().is_none_or(|(b, _)| t > *b)
            {
                best = Some((t, e.path()));
            }
        }
    }
    best
}

/// The path of binary `name`, which must have been built from the current
/// sources.
pub fn bin(name: &str) -> String {
    let exe = std::env::current_exe().expect("the path of the running test executable");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(PathBuf::from)
        .expect("the test executable lies in <target>/<profile>/deps");
    let path = dir.join(name);
    let how = "run `cargo test` from the workspace root (tests), or `cargo build --release \
               --bins` with the bench's --target (benches)";
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is not built: {how}", path.display()));
    for src in sources(name) {
        if let Some((t, newer)) = newest(&Path::new(ROOT).join(src))
            && t > built
        {
            panic!(
                "{} is older than {}: {how}",
                path.display(),
                newer.display()
            );
        }
    }
    path.to_string_lossy().into_owned()
}

pub static AGENT: LazyLock<String> = LazyLock::new(|| bin("sandbox-agent"));
pub static CTL: LazyLock<String> = LazyLock::new(|| bin("sandboxctl"));
pub static HOST: LazyLock<String> = LazyLock::new(|| bin("sandbox-host"));

/// The discovery catalogs one build of the agent and host records, shared
/// by every test and short bench run with that build (a directory under
/// cargo's target tmpdir named by the binaries' sizes and times): the
/// first host that records there starts every server once, and a later
/// recorder (`--catalogs record` records only what the directory lacks)
/// finds them made. A catalog's key covers the servers' launches, not the
/// agent's build; the name covers that. Recorders take
/// [`catalog_recording_lock`] first, so they record one after another.
pub fn shared_catalog_dir() -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for b in [&*AGENT, &*HOST] {
        let m = std::fs::metadata(b).unwrap_or_else(|e| panic!("{b}: {e}"));
        (b.as_str(), m.len(), m.modified().ok()).hash(&mut h);
    }
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("catalogs-{:016x}", h.finish()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// Held while a host records into `dir` (an exclusive `flock` of
/// `dir.lock`, waited for): the tests' recorder and the short benches',
/// running side by side, would otherwise both start every server; the
/// second one finds the catalogs made.
pub fn catalog_recording_lock(dir: &std::path::Path) -> nix::fcntl::Flock<std::fs::File> {
    let path = dir.with_extension("lock");
    let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("flock {}: {e}", path.display()))
}
