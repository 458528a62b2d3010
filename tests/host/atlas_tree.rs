//! MCP_Atlas's `/data` as its image's Dockerfile builds it, against a
//! fresh MCP_Atlas sandbox's dump, entry by entry: names, types, modes,
//! symlink targets, file contents by SHA-256. The Dockerfile's steps:
//! - `COPY` of the repository's `data/` moved to `/data` (the shared
//!   benchmark data's `MCP_Atlas/data`; a checkout's files are 0644, its
//!   directories 0755);
//! - each line of `repos/git_submodule_info.csv`: `git clone URL PATH;
//!   git checkout SHA` (the worktree at the pin, `.git/HEAD` detached at
//!   it; git's other files are its own);
//! - `uv sync` in `repos/mcp_code_executor_workspace`: its
//!   `pyproject.toml` (here the stand-in the tests install), a `uv.lock`
//!   and a `.venv` of its own. The expected ones come from running that
//!   step again, offline from the test wheels, as
//!   packaging/install-benchmark-data.sh runs it, the build path mapped to
//!   `/data/…` in the venv's scripts as there.
//!
//! One difference is by design (docs/profiles.md, "Benchmark data"): in
//! the venv's `site-packages`, each package directory is a link to the one
//! read-only copy the installer keeps (`PREFIX/.MCP_Atlas-venv.ID/…`), not
//! a copy per sandbox (≈ 300 MB each). The link must point at that copy's
//! same path, and the tree there must match the step's (names, types,
//! modes, sizes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common::bench_data::{StandIn, WORKSPACE_PROJECT, installer_env};

/// The installer's `--exclude-newer` for MCP_Atlas (its default).
const EXCLUDE_NEWER: &str = "2026-07-18T00:00:00Z";

/// One entry as compared: type, mode, link target or content hash.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: String,
    mode: u64,
    link: Option<String>,
    sha256: Option<String>,
}

/// Checks the dump's `entries` (host_client.py's `calls`) against the
/// tree MCP_Atlas's Dockerfile makes from `src` (its data) and `repos`.
pub fn check(entries: &Value, src: &Path, repos: &[StandIn]) {
    let got: BTreeMap<String, Entry> = entries
        .as_object()
        .expect("the dump's entries")
        .iter()
        .filter(|(n, _)| n.as_str() != ".")
        .map(|(n, e)| {
            let entry = Entry {
                kind: e["type"].as_str().unwrap_or_default().to_owned(),
                mode: e["mode"].as_u64().unwrap_or_default(),
                link: e["link"].as_str().map(str::to_owned),
                sha256: e["sha256"].as_str().map(str::to_owned),
            };
            (n.trim_end_matches('/').to_owned(), entry)
        })
        .collect();
    let mut want = data_tree(src);
    for r in repos {
        want.extend(worktree(r));
    }
    let (synced, linked, _build) = uv_sync(src);
    want.extend(synced);
    let mut problems = Vec::new();
    for (name, w) in &want {
        match (got.get(name), linked.get(name)) {
            (Some(g), _) if g == w => {}
            // A package directory: a link to the installer's one copy.
            (Some(g), Some(built)) if g.kind == "symlink" => {
                problems.extend(same_package(name, g.link.as_deref(), built));
            }
            (Some(g), _) => problems.push(format!("{name}: the image's {w:?}, here {g:?}")),
            (None, _) => problems.push(format!("{name}: missing ({w:?})")),
        }
    }
    for (name, _) in got.iter().filter(|(n, _)| !want.contains_key(*n)) {
        let git_own = repos
            .iter()
            .any(|r| name.starts_with(&format!("./{}/.git/", r.rel())));
        if !git_own {
            problems.push(format!("{name}: not in the image's /data"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The image's `uv sync` in the data's uv project, run again: its `uv.lock`
/// and `.venv` entries, and where each package directory the installer
/// links was built (its name in the tree → its path in the build, which
/// lasts as long as the returned directory).
fn uv_sync(
    src: &Path,
) -> (
    BTreeMap<String, Entry>,
    BTreeMap<String, PathBuf>,
    tempfile::TempDir,
) {
    // A short path, as the installer's: the scripts' shebangs are direct.
    let build = tempfile::Builder::new()
        .prefix("uv-sync")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let project = format!("./{WORKSPACE_PROJECT}");
    std::fs::copy(
        src.join(WORKSPACE_PROJECT).join("pyproject.toml"),
        build.path().join("pyproject.toml"),
    )
    .expect("pyproject.toml");
    let out = Command::new("uv")
        .args(["sync", "--quiet", "--python", "/usr/bin/python3"])
        .args(["--exclude-newer", EXCLUDE_NEWER])
        .current_dir(build.path())
        .envs(installer_env())
        .output()
        .expect("uv");
    assert!(
        out.status.success(),
        "uv sync: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut want = BTreeMap::new();
    let lock = std::fs::read(build.path().join("uv.lock")).expect("uv.lock");
    want.insert(format!("{project}/uv.lock"), file_entry(0o644, &lock));
    let venv = build.path().join(".venv");
    let (from, to) = (
        venv.display().to_string(),
        format!("/data/{WORKSPACE_PROJECT}/.venv"),
    );
    // Its scripts as at /data (their one difference)…
    let mut moved = BTreeMap::new();
    for e in std::fs::read_dir(venv.join("bin")).expect("bin").flatten() {
        let meta = std::fs::symlink_metadata(e.path()).expect("lstat");
        if meta.is_file() {
            let text = std::fs::read(e.path()).expect("a script");
            let text = String::from_utf8_lossy(&text)
                .replace(&from, &to)
                .into_bytes();
            moved.insert(e.file_name().to_string_lossy().into_owned(), text);
        }
    }
    let mut linked = BTreeMap::new();
    let mut todo = vec![venv.clone()];
    want.insert(format!("{project}/.venv"), dir_entry());
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).expect("the venv").flatten() {
            let path = e.path();
            let rel = path.strip_prefix(&venv).expect("below the venv");
            let name = format!("{project}/.venv/{}", rel.display());
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let mode =
                u64::from(std::os::unix::fs::PermissionsExt::mode(&meta.permissions())) & 0o7777;
            let package = rel.parent().is_some_and(|p| p.ends_with("site-packages"))
                && meta.is_dir()
                && !rel.to_string_lossy().ends_with(".dist-info");
            if package {
                linked.insert(name.clone(), path.clone());
                want.insert(name, dir_entry());
            } else if meta.file_type().is_symlink() {
                let link = std::fs::read_link(&path).expect("readlink");
                want.insert(name, link_entry(&link.display().to_string()));
            } else if meta.is_dir() {
                want.insert(
                    name,
                    Entry {
                        mode,
                        ..dir_entry()
                    },
                );
                todo.push(path);
            } else {
                let bytes = match (rel.parent(), rel.file_name()) {
                    (Some(p), Some(f)) if p == Path::new("bin") => {
                        moved[&*f.to_string_lossy()].clone()
                    }
                    (_, Some(f)) if f == "RECORD" => {
                        record_there(&std::fs::read(&path).expect("RECORD"), &moved)
                    }
                    _ => std::fs::read(&path).expect("a venv file"),
                };
                want.insert(name, file_entry(mode, &bytes));
            }
        }
    }
    (want, linked, build)
}

/// …and so their package's RECORD, which lists each file's SHA-256
/// (unpadded URL-safe base64) and size.
fn record_there(record: &[u8], moved: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    use base64::Engine;
    let text = String::from_utf8_lossy(record);
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let path = line.split(',').next().unwrap_or_default();
        match path
            .strip_prefix("../../../bin/")
            .and_then(|n| moved.get(n))
        {
            Some(data) => {
                let digest =
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(data));
                let end = &line[line.trim_end_matches(['\r', '\n']).len()..];
                out.push_str(&format!("{path},sha256={digest},{}{end}", data.len()));
            }
            None => out.push_str(line),
        }
    }
    out.into_bytes()
}

/// A package directory of the sandbox's venv: a link to the installer's
/// copy at the same path below its venv, whose tree matches `built`'s.
fn same_package(name: &str, link: Option<&str>, built: &Path) -> Vec<String> {
    let below = name
        .split_once("/.venv/")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let Some(target) = link.filter(|l| l.ends_with(&format!("/{WORKSPACE_PROJECT}/{below}")))
    else {
        return vec![format!(
            "{name}: a link to the installer's copy of {below}, here {link:?}"
        )];
    };
    let (a, b) = (shape(Path::new(target)), shape(built));
    if a == b {
        return Vec::new();
    }
    let differ: Vec<_> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .chain(b.keys().filter(|k| !a.contains_key(*k)).cloned())
        .take(5)
        .collect();
    vec![format!(
        "{name} → {target}: differs from uv sync's at {differ:?}"
    )]
}

/// A tree's names, types, modes and sizes (not contents: ≈ 300 MB).
fn shape(top: &Path) -> BTreeMap<PathBuf, (bool, u32, u64)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![top.to_owned()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).expect("a package").flatten() {
            let meta = std::fs::symlink_metadata(e.path()).expect("lstat");
            let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
            let rel = e.path().strip_prefix(top).expect("below").to_owned();
            out.insert(
                rel,
                (
                    meta.is_dir(),
                    mode,
                    if meta.is_dir() { 0 } else { meta.len() },
                ),
            );
            if meta.is_dir() {
                todo.push(e.path());
            }
        }
    }
    out
}

/// The data's files and directories as the image's `COPY` leaves them.
fn data_tree(src: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut todo = vec![src.to_owned()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).expect("the data").flatten() {
            let path = e.path();
            let rel = path.strip_prefix(src).expect("below the data");
            let name = format!("./{}", rel.display());
            if path.is_dir() {
                out.insert(name, dir_entry());
                todo.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("a data file");
                out.insert(name, file_entry(0o644, &bytes));
            }
        }
    }
    out
}

/// A repository's entries after `git clone; git checkout PIN`: the
/// worktree at the pin, `.git` and its detached `HEAD`.
fn worktree(r: &StandIn) -> BTreeMap<String, Entry> {
    let top = format!("./{}", r.rel());
    let git = |args: &[&str]| -> Vec<u8> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&r.source)
            .args(args)
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}");
        out.stdout
    };
    let mut out = BTreeMap::new();
    out.insert(top.clone(), dir_entry());
    out.insert(format!("{top}/.git"), dir_entry());
    let head = format!("{}\n", r.pin());
    out.insert(
        format!("{top}/.git/HEAD"),
        file_entry(0o644, head.as_bytes()),
    );
    let listing = String::from_utf8(git(&["ls-tree", "-r", "-t", r.pin()])).expect("ls-tree");
    for line in listing.lines() {
        let (meta, path) = line.split_once('\t').expect("MODE TYPE SHA\tPATH");
        let f: Vec<&str> = meta.split(' ').collect();
        let name = format!("{top}/{path}");
        let entry = match f[0] {
            "040000" => dir_entry(),
            "120000" => Entry {
                kind: "symlink".into(),
                mode: 0o777,
                link: Some(String::from_utf8(git(&["cat-file", "blob", f[2]])).expect("a link")),
                sha256: None,
            },
            mode => {
                let exec = mode == "100755";
                file_entry(
                    if exec { 0o755 } else { 0o644 },
                    &git(&["cat-file", "blob", f[2]]),
                )
            }
        };
        out.insert(name, entry);
    }
    out
}

fn link_entry(target: &str) -> Entry {
    Entry {
        kind: "symlink".into(),
        mode: 0o777,
        link: Some(target.to_owned()),
        sha256: None,
    }
}

fn dir_entry() -> Entry {
    Entry {
        kind: "dir".into(),
        mode: 0o755,
        link: None,
        sha256: None,
    }
}

fn file_entry(mode: u64, bytes: &[u8]) -> Entry {
    Entry {
        kind: "file".into(),
        mode,
        link: None,
        sha256: Some(hex::encode(Sha256::digest(bytes))),
    }
}
