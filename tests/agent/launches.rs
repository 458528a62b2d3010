//! Each profile's launch read against its benchmark's own launch
//! definitions (`packaging/launches.toml` says which files and how they
//! are read). For every server a benchmark's file starts, the process the
//! profile runs (`sandbox-agent --print-launch`) has the same program,
//! version, arguments, environment and directory after the path mapping,
//! or the difference is a row of the table with its reason. A server the
//! file adds, an argument it changes, or a row that no longer differs
//! fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common::agent_once;
use crate::common::bench_data::shared_data;
use crate::common::mcp::{installed_manifest, servers_dir};
use crate::common::tool_surface::{Bench, Match, load};

const TABLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/launches.toml");
const SUMS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/packaging/benchmark-data/launch.sha256"
);
/// Where the sandbox shows the task's workspace to its servers.
const DATA: &str = "/data";
/// The workspace's own path in the printed launches: another path than
/// /data, so that a launch naming it shows as a difference.
const WORKSPACE: &str = "/workspace";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    /// Variables every server of the sandbox gets, and why.
    common_env: BTreeMap<String, String>,
    benchmarks: BTreeMap<String, Source>,
    #[serde(default)]
    differs: Vec<Differs>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Source {
    #[allow(dead_code)]
    source: String,
    /// The files read, under the shared benchmark data.
    file: String,
    format: Format,
    /// What the file writes for the task's workspace (shown at /data).
    workspace: String,
    /// The directory a server inherits from the harness when it sets none.
    harness_cwd: String,
    /// The benchmark's server names that are not Klavis's.
    #[serde(default)]
    names: BTreeMap<String, String>,
    /// The file's servers no profile serves, and why.
    #[serde(default)]
    unserved: BTreeMap<String, String>,
    /// For `facts`: each server's launch as the file states it.
    #[serde(default)]
    facts: BTreeMap<String, Fact>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "kebab-case")]
enum Format {
    /// `{"mcpServers": {name: {command, args, env}}}`
    McpServersJson,
    /// A directory of `{name, params: {command, args, env, cwd}}` files.
    ToolathlonYaml,
    /// Stated in `facts`, from the file (prose) and ../shared/benchmarks.md,
    /// both pinned by their sums.
    Facts,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Fact {
    command: String,
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
#[serde(deny_unknown_fields)]
struct Differs {
    benchmark: String,
    /// A Klavis name, or `*` for every server of the benchmark.
    server: String,
    field: String,
    ours: String,
    theirs: String,
    #[serde(default)]
    why: String,
}

/// A launch reduced to what the comparison reads.
#[derive(Debug, Default)]
struct Launch {
    /// The package npx or uvx fetches (none for `uv run`, whose project
    /// lock pins it: pins.toml cites it).
    package: Option<String>,
    version: Option<String>,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: String,
}

#[test]
fn each_profile_launches_what_its_benchmark_does_or_says_why_not() {
    let table: Table = toml::from_str(&std::fs::read_to_string(TABLE).expect(TABLE))
        .unwrap_or_else(|e| panic!("packaging/launches.toml: {e}"));
    let root = shared_root();
    check_sums(&root);
    let pins = load();
    let mut problems = Vec::new();
    let mut found = BTreeSet::new();
    for (bench, source) in &table.benchmarks {
        let theirs = read_launches(&root, source);
        let ours = print_launches(bench);
        let pins = pins
            .get(bench)
            .unwrap_or_else(|| panic!("pins.toml has no {bench}"));
        compare_benchmark(
            bench,
            source,
            &theirs,
            &ours,
            pins,
            &table,
            &mut found,
            &mut problems,
        );
    }
    let listed: BTreeSet<Differs> = table.differs.iter().map(key).collect();
    if listed.len() != table.differs.len() {
        problems.push("packaging/launches.toml lists a difference twice".to_owned());
    }
    for d in found.difference(&listed) {
        problems.push(format!(
            "not in packaging/launches.toml: {{ benchmark = {:?}, server = {:?}, field = {:?}, ours = {:?}, theirs = {:?} }}",
            d.benchmark, d.server, d.field, d.ours, d.theirs
        ));
    }
    for d in listed.difference(&found) {
        problems.push(format!(
            "a row of packaging/launches.toml no longer differs: {d:?}"
        ));
    }
    for d in &table.differs {
        if d.why.trim().is_empty() {
            problems.push(format!("a row without its reason: {d:?}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn print_launch_refuses_an_unknown_profile_naming_the_known_ones() {
    let out = agent_once(&["--print-launch", "MCP-Atlas"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("\"MCP-Atlas\"") && err.contains("MCP_Atlas, Toolathlon, MCP_Mark or none"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing printed");
}

/// A row as found: `why` is the table's alone.
fn key(d: &Differs) -> Differs {
    Differs {
        why: String::new(),
        ..d.clone()
    }
}

/// The shared benchmark data; under CI it must be there.
fn shared_root() -> PathBuf {
    let found = shared_data("", "MCP_Atlas/launch/SHA256SUMS");
    match found {
        Some(r) => r,
        None => panic!(
            "the shared benchmark data (with MCP_Atlas/launch) is not here: set SANDBOX_AGENT_BENCHMARK_DATA"
        ),
    }
}

/// The launch files read are the ones whose sums the repository pins.
fn check_sums(root: &Path) {
    let sums = std::fs::read_to_string(SUMS).expect(SUMS);
    let mut seen = 0;
    for line in sums.lines().filter(|l| !l.trim().is_empty()) {
        let (want, rel) = line.split_once("  ").expect("SUM  PATH");
        let bytes = std::fs::read(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let got = hex::encode(Sha256::digest(&bytes));
        assert_eq!(got, want, "{rel} changed: its launches must be read again");
        seen += 1;
    }
    assert!(seen > 0, "packaging/benchmark-data/launch.sha256 is empty");
}

/// The benchmark's launches by its own server names, its paths mapped.
fn read_launches(root: &Path, s: &Source) -> BTreeMap<String, Launch> {
    let at = root.join(&s.file);
    let raw: Vec<(String, Fact)> = match s.format {
        Format::McpServersJson => {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&at).expect("template"))
                .expect("template JSON");
            let servers = v["mcpServers"].as_object().expect("mcpServers");
            servers
                .iter()
                .map(|(n, e)| (n.clone(), serde_json::from_value(e.clone()).expect(n)))
                .collect()
        }
        Format::ToolathlonYaml => {
            let mut files: Vec<PathBuf> = std::fs::read_dir(&at)
                .expect("launch dir")
                .map(|e| e.expect("entry").path())
                .collect();
            files.sort();
            files
                .iter()
                .map(|f| {
                    let v: serde_yaml_ng::Value =
                        serde_yaml_ng::from_str(&std::fs::read_to_string(f).expect("yaml"))
                            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                    let name = v["name"].as_str().expect("name").to_owned();
                    let fact: Fact = serde_yaml_ng::from_value(v["params"].clone())
                        .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                    (name, fact)
                })
                .collect()
        }
        Format::Facts => s.facts.clone().into_iter().collect(),
    };
    raw.into_iter()
        .map(|(n, f)| (n, normalize_theirs(f, s)))
        .collect()
}

/// `${workspace placeholder}` → /data; each other `${…}` span: a
/// credential (`${token.…}`, `${UPPER_CASE}`) → `<credential>`, anything
/// else (the harness's own paths) → `<harness NAME>`; the rest stays.
fn map_theirs(v: &str, s: &Source) -> String {
    let mut rest = v.replace(&s.workspace, DATA);
    let mut out = String::new();
    while let Some(i) = rest.find("${") {
        let Some(len) = rest[i..].find('}') else {
            break;
        };
        let name = &rest[i + 2..i + len];
        let upper = name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        out.push_str(&rest[..i]);
        if name.starts_with("token.") || upper {
            out.push_str("<credential>");
        } else {
            out.push_str(&format!("<harness {name}>"));
        }
        rest = rest[i + len + 1..].to_owned();
    }
    out + &rest
}

fn normalize_theirs(f: Fact, s: &Source) -> Launch {
    let args: Vec<String> = f.args.iter().map(|a| map_theirs(a, s)).collect();
    let (package, version, rest) = program_of(&f.command, &args);
    Launch {
        package,
        version,
        args: rest,
        env: f
            .env
            .iter()
            .map(|(k, v)| (k.clone(), map_theirs(v, s)))
            .collect(),
        cwd: f
            .cwd
            .map_or_else(|| s.harness_cwd.clone(), |c| map_theirs(&c, s)),
    }
}

/// What `command args` runs, by the launcher's own rules: the package and
/// version npx or uvx fetch (`uvx --from PKG SCRIPT` too), and the
/// arguments the server gets (after `uv run SCRIPT` or `uv run -m MODULE`).
fn program_of(command: &str, args: &[String]) -> (Option<String>, Option<String>, Vec<String>) {
    let mut a = args.to_vec();
    let first = |a: &[String], i: usize| a.get(i).cloned().unwrap_or_default();
    match command {
        "npx" => {
            // npx's own options come before the package (`-y`).
            let opts = a.iter().take_while(|x| x.starts_with('-')).count();
            let mut a = a.split_off(opts);
            let (p, v) = split_spec(&first(&a, 0), "@");
            (Some(p), v, a.split_off(1.min(a.len())))
        }
        "uvx" if first(&a, 0) == "--from" => {
            let (p, v) = split_spec(&first(&a, 1), "==");
            (Some(p), v, a.split_off(3.min(a.len())))
        }
        "uvx" => {
            let (p, v) = split_spec(&first(&a, 0), "==");
            (Some(p), v, a.split_off(1.min(a.len())))
        }
        "uv" if first(&a, 1) == "-m" => (None, None, a.split_off(3.min(a.len()))),
        "uv" => (None, None, a.split_off(2.min(a.len()))),
        _ => (None, None, a),
    }
}

/// `pkg@1.2` / `@scope/pkg@1.2` / `pkg==1.2` / `pkg`.
fn split_spec(spec: &str, sep: &str) -> (String, Option<String>) {
    match spec.rfind(sep) {
        // `@latest` pins nothing: the registry's newest runs.
        Some(i) if i > 0 && &spec[i + sep.len()..] != "latest" => {
            (spec[..i].to_owned(), Some(spec[i + sep.len()..].to_owned()))
        }
        Some(i) if i > 0 => (spec[..i].to_owned(), None),
        _ => (spec.to_owned(), None),
    }
}

/// The profile's launches as the agent prints them, by Klavis name.
fn print_launches(bench: &str) -> BTreeMap<String, Value> {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("servers.toml");
    std::fs::write(&manifest, installed_manifest()).expect("manifest");
    let out = agent_once(
        &[
            "--manifest",
            &manifest.display().to_string(),
            "--workspace",
            WORKSPACE,
            "--data-path",
            DATA,
            "--state-root",
            "/var/lib/sandbox-agent",
            "--print-launch",
            bench,
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "--print-launch {bench}: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("--print-launch {bench}: {e}: {text}"))
}

#[allow(clippy::too_many_arguments)]
fn compare_benchmark(
    bench: &str,
    source: &Source,
    theirs: &BTreeMap<String, Launch>,
    ours: &BTreeMap<String, Value>,
    pins: &Bench,
    table: &Table,
    found: &mut BTreeSet<Differs>,
    problems: &mut Vec<String>,
) {
    let mut served = BTreeSet::new();
    for (name, t) in theirs {
        let klavis = source.names.get(name).unwrap_or(name);
        let Some(pin) = pins.servers.get(klavis) else {
            if !source.unserved.contains_key(name) {
                problems.push(format!(
                    "{bench}: the benchmark starts {name:?}, which the profile neither serves (pins.toml) nor lists as unserved (launches.toml)"
                ));
            }
            continue;
        };
        served.insert(klavis.clone());
        if source.unserved.contains_key(name) {
            problems.push(format!(
                "{bench}: {name:?} is served and listed as unserved"
            ));
        }
        let Some(o) = ours.get(klavis) else {
            problems.push(format!("{bench}: --print-launch has no {klavis}"));
            continue;
        };
        if let Some(e) = o.get("error") {
            problems.push(format!("{bench}/{klavis}: {e}"));
            continue;
        }
        // The package and version: pins.toml holds what is served and why
        // it may differ; here its benchmark side must be the file's.
        // pins.toml may say which fork: `cli-mcp-server (fork …)`.
        let pinned_package = pin.package.split(" (").next().unwrap_or_default();
        if let Some(p) = &t.package
            && norm(p) != norm(pinned_package)
        {
            problems.push(format!(
                "{bench}/{klavis}: pins.toml's package {:?}, the launch file's {p:?}",
                pin.package
            ));
        }
        if let Some(v) = &t.version
            && *v != pin.version
        {
            problems.push(format!(
                "{bench}/{klavis}: pins.toml's version {:?}, the launch file's {v:?}",
                pin.version
            ));
        }
        let same = norm(pinned_package) == norm(&pin.serves_package) && pin.version == pin.serves;
        if !same && pin.matches == Match::Exact {
            problems.push(format!(
                "{bench}/{klavis}: serves {} {}, the benchmark runs {} {}, and pins.toml says exact",
                pin.serves_package, pin.serves, pin.package, pin.version
            ));
        }
        let mut diff = |field: String, ours: String, theirs: String| {
            found.insert(Differs {
                benchmark: bench.to_owned(),
                server: klavis.clone(),
                field,
                ours,
                theirs,
                why: String::new(),
            });
        };
        // The version the profile says it runs is pins.toml's (pins.rs
        // checks the installed tree the launch names holds it).
        let says = o["metadata"]["version"].as_str().unwrap_or_default();
        if says != pin.serves {
            problems.push(format!(
                "{bench}/{klavis}: the profile says version {says:?}, pins.toml serves {:?}",
                pin.serves
            ));
        }
        let o = normalize_ours(o);
        if o.args != t.args {
            diff("args".into(), show(&o.args), show(&t.args));
        }
        let names: BTreeSet<&String> = o.env.keys().chain(t.env.keys()).collect();
        for n in names {
            let (ov, tv) = (o.env.get(n), t.env.get(n));
            if ov != tv && !(tv.is_none() && table.common_env.contains_key(n)) {
                let unset = || "<unset>".to_owned();
                diff(
                    format!("env.{n}"),
                    ov.cloned().unwrap_or_else(unset),
                    tv.cloned().unwrap_or_else(unset),
                );
            }
        }
        if o.cwd != t.cwd {
            diff("cwd".into(), o.cwd.clone(), t.cwd.clone());
        }
    }
    for (name, klavis) in &source.names {
        if !theirs.contains_key(name) || !pins.servers.contains_key(klavis) {
            problems.push(format!(
                "{bench}: names maps {name:?} to {klavis:?}: the launch file has no such server, or pins.toml no such Klavis name"
            ));
        }
    }
    for (name, why) in &source.unserved {
        if !theirs.contains_key(name) || why.trim().is_empty() {
            problems.push(format!(
                "{bench}: unserved {name:?}: not a server of the launch file, or no reason"
            ));
        }
    }
    for name in pins.servers.keys().filter(|n| !served.contains(*n)) {
        problems.push(format!(
            "{bench}: the profile serves {name}, which the benchmark's launch file does not start"
        ));
    }
    fold_wildcards(bench, table, found);
}

/// Differences a `*` row of the benchmark covers count as that row.
fn fold_wildcards(bench: &str, table: &Table, found: &mut BTreeSet<Differs>) {
    for w in table
        .differs
        .iter()
        .filter(|d| d.benchmark == bench && d.server == "*")
    {
        let covered: Vec<Differs> = found
            .iter()
            .filter(|d| {
                d.benchmark == bench
                    && d.server != "*"
                    && (&d.field, &d.ours, &d.theirs) == (&w.field, &w.ours, &w.theirs)
            })
            .cloned()
            .collect();
        if !covered.is_empty() {
            for c in covered {
                found.remove(&c);
            }
            found.insert(key(w));
        }
    }
}

/// Our launch: the program's own files (paths under the install) are not
/// arguments; /data and the workspace's own path stay as they are.
fn normalize_ours(o: &Value) -> Launch {
    let install = servers_dir();
    // The install's prefix as servers.toml writes it, whatever this
    // machine's is.
    let shown = |v: &str| v.replace(&install, "${install_dir}");
    let args: Vec<String> = o["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    let skip = args.iter().take_while(|a| a.starts_with(&install)).count();
    Launch {
        args: args[skip..].iter().map(|a| shown(a)).collect(),
        env: o["env"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), shown(v.as_str().unwrap_or_default())))
            .collect(),
        cwd: o["cwd"].as_str().unwrap_or_default().to_owned(),
        ..Launch::default()
    }
}

fn show(args: &[String]) -> String {
    serde_json::to_string(args).unwrap_or_default()
}

/// A package name as its registry compares it.
fn norm(p: &str) -> String {
    p.to_lowercase().replace(['_', '.'], "-")
}
