//! Benchmark data for the tests, installed with
//! packaging/install-benchmark-data.sh exactly as a real host installs it,
//! once per test process; the shipped manifest's
//! `/opt/sandbox-agent/benchmark-data` is pointed at it.
//!
//! MCP_Atlas's real data (its CSV files and memory graph, checked against
//! the committed packaging/benchmark-data/MCP_Atlas.sha256) comes from the
//! shared benchmark-data directory beside the checkout
//! (`SANDBOX_AGENT_BENCHMARK_DATA`, default `../shared/benchmark-data`;
//! nothing third-party is kept in this repository). Its 8 repositories live
//! on GitHub, which tests never reach: each is a local stand-in (same URL
//! and path, a few commits of its own, pinned at the middle one), cloned
//! through the installer's `--git-mirror` with a `--repos` list of the
//! stand-ins' pins. The code executor workspace's `pyproject.toml`, which
//! the shared data leaves out, is stood in too ([`write_workspace_project`]:
//! its facts, pinned in place of the real file's sum), and the installer's
//! `uv sync` resolves offline from the test wheels
//! ([`installer_env`]). A small made-up dataset ([`write_atlas_data`])
//! serves the installer's own tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Where the shipped manifest expects installed benchmark data.
pub const SHIPPED_PREFIX: &str = "/opt/sandbox-agent/benchmark-data";
/// An entity of the made-up dataset's memory graph.
pub const ATLAS_ENTITY: &str = "atlas-preloaded-entity";
/// A CSV file at the top of the made-up dataset.
pub const ATLAS_CSV: &str = "barber_shop.csv";

/// The installer, for tests that call it themselves.
pub fn installer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/install-benchmark-data.sh")
}

/// Writes the made-up dataset's files into `dir`.
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

/// Where the code executor's uv project is in MCP_Atlas's data.
pub const WORKSPACE_PROJECT: &str = "repos/mcp_code_executor_workspace";

/// Writes a stand-in of MCP_Atlas's `WORKSPACE_PROJECT/pyproject.toml` into
/// the data at `dir` (its facts: the project's name and version, pandas,
/// numpy and scipy at their pins; not its text), or, with `deps`, one with
/// those dependencies. Returns its SHA-256.
pub fn write_workspace_project(dir: &Path, deps: Option<&[&str]>) -> String {
    use sha2::Digest;
    let deps = deps.unwrap_or(&["pandas==2.3.1", "numpy==2.3.1", "scipy==1.16.0"]);
    let list: Vec<String> = deps.iter().map(|d| format!("\"{d}\"")).collect();
    let text = format!(
        "[project]\nname = \"mcp-code-executor-workspace\"\nversion = \"0.1.0\"\n\
         description = \"a stand-in with the facts of MCP_Atlas's (tests/common/bench_data.rs)\"\n\
         dependencies = [{}]\n",
        list.join(", ")
    );
    let project = dir.join(WORKSPACE_PROJECT);
    std::fs::create_dir_all(&project).expect("project dir");
    std::fs::write(project.join("pyproject.toml"), &text).expect("pyproject.toml");
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// The environment the installer's `uv sync` runs with in tests, which
/// reach no index: offline, from the test wheels (`SANDBOX_AGENT_WHEELS`,
/// which .ci/install-prereqs.sh fills from
/// packaging/benchmark-data/MCP_Atlas-wheels.txt), linking into uv's
/// cache.
pub fn installer_env() -> Vec<(&'static str, String)> {
    let wheels = std::env::var("SANDBOX_AGENT_WHEELS")
        .unwrap_or_else(|_| "/opt/sandbox-agent/wheels".into());
    vec![
        ("UV_OFFLINE", "1".into()),
        ("UV_NO_INDEX", "1".into()),
        ("UV_FIND_LINKS", wheels),
        // Links into uv's cache instead of copies (the installer's default):
        // a test's install is thrown away, and copying 224 MB took 1.3 of
        // its 1.8 CPU-seconds.
        ("UV_LINK_MODE", "hardlink".into()),
    ]
}

/// Runs the installer; panics with its output unless it succeeds.
pub fn run_installer(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(installer())
        .args(args)
        .envs(installer_env())
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

/// MCP_Atlas's real data, what its image has at /data (the shared
/// benchmark-data's `MCP_Atlas/data`), where this machine has it:
/// `SANDBOX_AGENT_BENCHMARK_DATA` when set (only there), else
/// `../shared/benchmark-data` beside the checkout, else
/// `/work/shared/benchmark-data`.
pub fn atlas_source() -> Option<PathBuf> {
    shared_data("MCP_Atlas/data", "repos/git_submodule_info.csv")
}

/// `rel` of the shared benchmark data (never in this repository) where
/// this machine has it, with `marker` in it: `SANDBOX_AGENT_BENCHMARK_DATA`
/// when set (only there), else `../shared/benchmark-data` beside the
/// checkout, else `/work/shared/benchmark-data`.
pub fn shared_data(rel: &str, marker: &str) -> Option<PathBuf> {
    let roots: Vec<PathBuf> = match std::env::var_os("SANDBOX_AGENT_BENCHMARK_DATA") {
        Some(r) => vec![PathBuf::from(r)],
        None => vec![
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/benchmark-data"),
            PathBuf::from("/work/shared/benchmark-data"),
        ],
    };
    roots
        .into_iter()
        .map(|r| r.join(rel))
        .find(|d| d.join(marker).exists())
}

/// One of MCP_Atlas's repositories as the tests stand it in.
#[derive(Debug, Clone)]
pub struct StandIn {
    /// The real repository's URL (`https://github.com/OWNER/NAME.git`).
    pub url: String,
    /// Where the sandbox has it (`/data/repos/NAME`).
    pub path: String,
    /// The stand-in's commits, oldest first: the pin is the middle one, the
    /// last is its default branch's tip (after the pin).
    pub commits: [String; 3],
    /// The stand-in repository itself (what the URL stands for).
    pub source: PathBuf,
}

impl StandIn {
    pub fn pin(&self) -> &str {
        &self.commits[1]
    }
    /// The directory under the data's top (`repos/NAME`).
    pub fn rel(&self) -> &str {
        self.path.strip_prefix("/data/").expect("/data/repos/NAME")
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .envs([
            ("GIT_AUTHOR_NAME", "stand-in"),
            ("GIT_AUTHOR_EMAIL", "stand-in@example.org"),
            ("GIT_COMMITTER_NAME", "stand-in"),
            ("GIT_COMMITTER_EMAIL", "stand-in@example.org"),
        ])
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Makes a stand-in for each repository of `list` (the benchmark's
/// `url,sha,path` lines) under `mirror/OWNER/NAME.git`, and writes the list
/// of the stand-ins' pins to `repos_csv`.
pub fn make_stand_ins(list: &Path, mirror: &Path, repos_csv: &Path) -> Vec<StandIn> {
    let text = std::fs::read_to_string(list).expect("git_submodule_info.csv");
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let (url, path) = (f[0], f[2]);
        let repo = url
            .strip_prefix("https://github.com/")
            .expect("a GitHub URL");
        let dir = mirror.join(repo);
        std::fs::create_dir_all(&dir).expect("stand-in dir");
        git(&dir, &["-c", "init.defaultBranch=main", "init", "-q"]);
        let commits = ["first", "pinned", "after the pin"].map(|what| {
            std::fs::write(dir.join("README.md"), format!("{repo}: {what}\n")).expect("write");
            git(&dir, &["add", "-A"]);
            git(&dir, &["commit", "-q", "-m", &format!("{repo}: {what}")]);
            git(&dir, &["rev-parse", "HEAD"])
        });
        out.push(StandIn {
            url: url.to_owned(),
            path: path.to_owned(),
            commits,
            source: dir,
        });
    }
    let csv: Vec<String> = out
        .iter()
        .map(|s| format!("{},{},{}", s.url, s.pin(), s.path))
        .collect();
    std::fs::write(repos_csv, csv.join("\n")).expect("repos csv");
    out
}

/// The installed test data.
pub struct Installed {
    /// The prefix holding `MCP_Atlas/`.
    pub prefix: PathBuf,
    /// The data installed from (the shared data, or a copy of it with the
    /// stand-in pyproject.toml).
    pub src: PathBuf,
    /// MCP_Atlas's repositories, as stood in.
    pub repos: Vec<StandIn>,
    /// MCP_Atlas's real data, or (where this machine lacks it) the made-up
    /// dataset with one stand-in repository.
    pub real: bool,
}

/// MCP_Atlas's data with stand-in repositories, installed once: the real
/// data where this machine has it ([`atlas_source`]), else the made-up
/// dataset pinned on the spot (the tests that check the real data say
/// they are skipped).
pub fn atlas() -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        // Kept for the whole process (the servers read it), then removed
        // by the next process's run: never left to pile up in /tmp.
        let root = process_dir("benchmark-data");
        let s = |p: &Path| p.display().to_string();
        let (mirror, csv) = (root.join("mirror"), root.join("repos.csv"));
        let prefix = root.join("installed");
        let (src, mut pins, real) = match atlas_source() {
            Some(shared) if shared.join(WORKSPACE_PROJECT).join("pyproject.toml").exists() => {
                (shared, Vec::new(), true)
            }
            Some(shared) => {
                // The shared data leaves the project's pyproject.toml out:
                // a copy with its stand-in, pinned in the real one's place.
                let src = root.join("src");
                let cp = Command::new("cp")
                    .arg("-R")
                    .arg(&shared)
                    .arg(&src)
                    .status()
                    .expect("cp");
                assert!(cp.success(), "copying {}", shared.display());
                make_writable(&src);
                let sum = write_workspace_project(&src, None);
                let name = format!("{WORKSPACE_PROJECT}/pyproject.toml");
                let committed = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("packaging/benchmark-data/MCP_Atlas.sha256");
                let text = std::fs::read_to_string(&committed).expect("the committed pins");
                let mut replaced = 0;
                let lines: Vec<String> = text
                    .lines()
                    .map(|l| match l.split_once("  ") {
                        Some((_, path)) if path == name => {
                            replaced += 1;
                            format!("{sum}  {path}")
                        }
                        _ => l.to_owned(),
                    })
                    .collect();
                assert_eq!(replaced, 1, "{} pins {name} once", committed.display());
                let pins = root.join("MCP_Atlas.sha256");
                std::fs::write(&pins, lines.join("\n") + "\n").expect("pins");
                (src, vec!["--pins".to_owned(), s(&pins)], true)
            }
            None => {
                // (Shared with the benches' common module: no helper of
                // the tests' own.)
                let ci = std::env::var("CI")
                    .is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
                assert!(
                    !ci,
                    "CI=true and MCP_Atlas's real data is not on this machine (set \
                     SANDBOX_AGENT_BENCHMARK_DATA to the directory holding MCP_Atlas/data): CI must provide it"
                );
                {
                    use std::io::Write;
                    let _ = writeln!(
                        std::io::stderr(),
                        "SKIPPED: MCP_Atlas's real data is not on this machine \
                         (SANDBOX_AGENT_BENCHMARK_DATA, ../shared/benchmark-data): the tests install a made-up dataset"
                    );
                }
                let src = root.join("src");
                write_atlas_data(&src);
                std::fs::write(
                    src.join("repos/git_submodule_info.csv"),
                    "https://github.com/stand-in/example,0000000,/data/repos/example",
                )
                .expect("repos list");
                let pins = root.join("MCP_Atlas.sha256");
                run_installer(&[
                    "MCP_Atlas",
                    "--pin",
                    "--from",
                    &s(&src),
                    "--pins",
                    &s(&pins),
                ]);
                (src, vec!["--pins".to_owned(), s(&pins)], false)
            }
        };
        let repos = make_stand_ins(&src.join("repos/git_submodule_info.csv"), &mirror, &csv);
        let mirror_base = format!("file://{}", mirror.display());
        let mut args: Vec<String> = ["MCP_Atlas", "--from", &s(&src), "--repos", &s(&csv)]
            .map(str::to_owned)
            .to_vec();
        args.append(&mut pins);
        args.extend([
            "--git-mirror".to_owned(),
            mirror_base,
            "--prefix".to_owned(),
            s(&prefix),
        ]);
        run_installer(&args.iter().map(String::as_str).collect::<Vec<_>>());
        // The servers (some as other users) read it.
        for d in [&root, &prefix] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        Installed {
            prefix,
            src,
            repos,
            real,
        }
    })
}

/// Makes the tree at `dir` writable by its owner (a copy of read-only data).
fn make_writable(dir: &Path) {
    let ok = Command::new("chmod")
        .args(["-R", "u+rwX"])
        .arg(dir)
        .status()
        .expect("chmod");
    assert!(ok.success(), "chmod {}", dir.display());
}

/// A fresh directory of this test process under cargo's target tmpdir,
/// `PREFIX-<pid>`; those of processes gone are removed first (a test
/// process's statics are never dropped, so nothing removes its own).
pub fn process_dir(prefix: &str) -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let lead = format!("{prefix}-");
    for e in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let gone = name
            .strip_prefix(&lead)
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists());
        if gone {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let dir = tmp.join(format!("{lead}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// The prefix holding the installed test data.
pub fn prefix() -> &'static Path {
    &atlas().prefix
}
