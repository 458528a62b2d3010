//! packaging/pins.toml, per benchmark, is what the benchmark's own
//! environment runs behind each Klavis name (package, exact version,
//! command, the file that says so) and what this project serves under its
//! profile. Checked here against the manifest and the installed trees;
//! its tool surfaces (names, properties, required ones) against what the
//! servers list (tests/common/tool_surface.rs, where the table is read).

use std::path::Path;

use serde_json::Value;

use crate::common::mcp::installed_manifest;
use crate::common::tool_surface::{Match, Pin, load};
use crate::common::*;
use sandbox_agent::supervisor::manifest::{Benchmark, Manifest, Roots};

/// The shipped manifest as installed here (the install prefix of the
/// tests), its commands the installed ones (no launcher of the checkout).
fn manifest() -> (Manifest, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let path = dir.path().join("servers.toml");
    let shipped = installed_manifest().replace("${state_root}", &state.display().to_string());
    std::fs::write(&path, shipped).expect("manifest");
    let ws = dir.path().join("ws");
    let roots = Roots {
        workspace: &ws,
        state_root: &state,
        data: None,
    };
    let text = std::fs::read_to_string(&path).expect("manifest");
    (
        Manifest::parse(&text, &path, &roots).expect("manifest"),
        dir,
    )
}

/// The version of the npm package `pkg` installed for `entry` (a file of
/// some node_modules tree), read from its package.json.
fn npm_version(entry: &Path, pkg: &str) -> Option<String> {
    let at = entry.ancestors().find(|a| a.ends_with("node_modules"))?;
    let json = std::fs::read_to_string(at.join(pkg).join("package.json")).ok()?;
    let v: Value = serde_json::from_str(&json).ok()?;
    // npm accepts a leading "v" (context7 1.0.14 says "v1.0.14").
    v["version"]
        .as_str()
        .map(|s| s.trim_start_matches('v').to_owned())
}

/// The version of the Python distribution `pkg` in the venv of `bin`.
fn pip_version(bin: &Path, pkg: &str) -> Option<String> {
    let venv = bin.parent()?.parent()?;
    let norm = |s: &str| s.to_lowercase().replace(['-', '.'], "_");
    let want = norm(pkg);
    for lib in std::fs::read_dir(venv.join("lib")).ok()?.flatten() {
        let site = lib.path().join("site-packages");
        for e in std::fs::read_dir(site).ok()?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".dist-info") else {
                continue;
            };
            if let Some((n, v)) = stem.rsplit_once('-')
                && norm(n) == want
            {
                return Some(v.to_owned());
            }
        }
    }
    None
}

/// The version of `pkg` that `command args` runs, from the install: the
/// first absolute path among them inside a node_modules tree or a venv's
/// bin (a launcher's or a shell's argument included).
fn installed_version(command: &str, args: &[String], pkg: &str) -> Option<String> {
    std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .map(Path::new)
        .filter(|p| p.is_absolute())
        .find_map(|p| {
            if p.components().any(|c| c.as_os_str() == "node_modules") {
                npm_version(p, pkg)
            } else {
                pip_version(p, pkg)
            }
        })
}

/// Every pin names a shipped server, says what the profile's metadata says,
/// and the tree the profile runs holds that version; an exact pin serves
/// the benchmark's own version, an own server names no package.
#[test]
fn each_profile_serves_what_its_pins_table_says() {
    let pins = load();
    let (m, _dir) = manifest();
    let mut problems = Vec::new();
    let mut absent = Vec::new();
    for (bench_name, bench) in &pins {
        let b = [
            Benchmark::McpAtlas,
            Benchmark::Toolathlon,
            Benchmark::McpMark,
        ]
        .into_iter()
        .find(|b| b.as_str() == bench_name)
        .unwrap_or_else(|| panic!("pins.toml: {bench_name} is not a benchmark"));
        assert!(
            bench.source.contains('@'),
            "{bench_name}: source names no commit"
        );
        for (name, pin) in &bench.servers {
            let at = format!("{bench_name} {name}");
            let Some(def) = m.servers.get(name) else {
                problems.push(format!("{at}: no such server in servers.toml"));
                continue;
            };
            let served = def.metadata_for(Some(b));
            if served.get("version").map(String::as_str) != Some(pin.serves.as_str()) {
                problems.push(format!(
                    "{at}: the table serves {}, the profile's metadata {:?}",
                    pin.serves,
                    served.get("version")
                ));
            }
            check_match(&at, pin, &mut problems);
            let o = def.benchmarks.get(&b);
            if pin.serves_package.is_empty() {
                // Our own server: its program is what the profile runs.
                let own = o
                    .and_then(|o| o.command.clone())
                    .unwrap_or(def.command.clone());
                if !Path::new(&own).is_file() {
                    absent.push(format!("{at} ({own})"));
                }
                continue;
            }
            let command = o
                .and_then(|o| o.command.clone())
                .unwrap_or(def.command.clone());
            let args = o.and_then(|o| o.args.clone()).unwrap_or(def.args.clone());
            match installed_version(&command, &args, &pin.serves_package) {
                Some(v) if v == pin.serves => {}
                Some(v) => problems.push(format!(
                    "{at}: {} {v} installed, the table says {}",
                    pin.serves_package, pin.serves
                )),
                None => absent.push(format!("{at} ({command} {args:?})")),
            }
        }
    }
    // Every version a profile pins is in the table.
    for def in m.servers.values() {
        for (b, o) in &def.benchmarks {
            let pinned = pins
                .get(b.as_str())
                .is_some_and(|bench| bench.servers.contains_key(&def.name));
            if o.metadata.contains_key("version") && !pinned {
                problems.push(format!(
                    "{} {}: the profile pins a version; pins.toml has no entry",
                    b.as_str(),
                    def.name
                ));
            }
        }
    }
    if !absent.is_empty() {
        assert!(!ci(), "CI=true and not installed: {absent:?}");
        skipped(&format!(
            "pins not installed (packaging/install-servers.sh): {absent:?}"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn check_match(at: &str, pin: &Pin, problems: &mut Vec<String>) {
    let says = |ok: bool, what: &str, problems: &mut Vec<String>| {
        if !ok {
            problems.push(format!("{at}: {:?} but {what}", pin.matches));
        }
    };
    match pin.matches {
        Match::Exact => says(
            pin.serves == pin.version && pin.serves_package == pin.package,
            "serves another package or version",
            problems,
        ),
        Match::Unpinned => says(
            pin.version.is_empty(),
            "the benchmark pins a version",
            problems,
        ),
        Match::Nearest => says(
            (pin.serves != pin.version || pin.serves_package != pin.package)
                && !pin.note.is_empty(),
            "it serves the pin or says nothing of the differences",
            problems,
        ),
        Match::Own => says(
            pin.serves_package.is_empty() && !pin.note.is_empty(),
            "names a package or says nothing",
            problems,
        ),
        Match::Unavailable => says(!pin.note.is_empty(), "says nothing of why", problems),
    }
    if pin.run.is_empty() || pin.file.is_empty() {
        problems.push(format!("{at}: says not how it runs nor which file says so"));
    }
    let tools_needed = matches!(pin.matches, Match::Exact | Match::Nearest | Match::Own);
    if tools_needed && pin.tools.is_empty() {
        problems.push(format!("{at}: no tools listed for the benchmark's version"));
    }
    if pin.served_tools.is_some() && pin.note.is_empty() {
        problems.push(format!("{at}: serves other tools and says nothing of why"));
    }
}
