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
//!   `pyproject.toml`, a `uv.lock` and a `.venv` of its own.
//!
//! What still differs is [`GAPS`]: each must be absent here, so the list
//! fails once a gap is closed.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common::bench_data::StandIn;

/// Entries of the image's `/data` a sandbox does not have yet, and why
/// (docs/profiles.md, "Benchmark data").
const GAPS: [(&str, &str); 3] = [
    (
        "./repos/mcp_code_executor_workspace/pyproject.toml",
        "the image's recipe for the venv, not in the data this project installs",
    ),
    (
        "./repos/mcp_code_executor_workspace/uv.lock",
        "made by the image's `uv sync`",
    ),
    (
        "./repos/mcp_code_executor_workspace/.venv",
        "made by the code executor when it starts, linking the installed packages",
    ),
];

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
    let mut problems = Vec::new();
    for (name, w) in &want {
        match got.get(name) {
            Some(g) if g == w => {}
            Some(g) => problems.push(format!("{name}: the image's {w:?}, here {g:?}")),
            None => problems.push(format!("{name}: missing ({w:?})")),
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
    for (gap, why) in GAPS {
        if got
            .keys()
            .any(|n| n == gap || n.starts_with(&format!("{gap}/")))
        {
            problems.push(format!(
                "{gap} is there now: take it out of atlas_tree::GAPS ({why})"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
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
