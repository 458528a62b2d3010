//! The README's examples and those of `docs/*.md`, run as written and in
//! document order, each document against an agent of its own started as
//! the README's walk-through says (`sandbox-agent --dev --manifest …`, the
//! binaries on PATH, in a fresh directory): every block marked `<!--
//! readme-test: console -->` (its `$` lines, in a shell that keeps what
//! the document's earlier blocks exported) and the Python MCP SDK snippets
//! (`python mcp2`: 2.x, `python mcp1`: 1.x).
//!
//! A command whose shown output starts with `sandboxctl:` must fail with
//! that message (up to its first `…`); any other must succeed, and each
//! shown output line without digits or `…` must appear in what it printed.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use crate::common::mcp::shipped_manifest;
use crate::common::*;

/// The fenced blocks marked `<!-- readme-test: KIND -->`, in document
/// order: (kind, body).
fn blocks(readme: &str) -> Vec<(String, String)> {
    const MARK: &str = "<!-- readme-test: ";
    let mut out = Vec::new();
    let mut rest = readme;
    while let Some(at) = rest.find(MARK) {
        let after = &rest[at + MARK.len()..];
        let kind = after[..after.find(" -->").expect("marker end")].to_owned();
        let open = after.find("```").expect("a fenced block") + 3;
        let body = &after[open..];
        let body = &body[body.find('\n').expect("fence line") + 1..];
        let end = body.find("```").expect("closing fence");
        out.push((kind, body[..end].to_owned()));
        rest = &body[end + 3..];
    }
    out
}

struct Step {
    command: String,
    shown: Vec<String>,
}

fn steps(console: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    for line in console.lines() {
        if let Some(c) = line.strip_prefix("$ ") {
            out.push(Step {
                command: c.to_owned(),
                shown: vec![],
            });
        } else if let Some(s) = out.last_mut() {
            s.shown.push(line.to_owned());
        }
    }
    out
}

/// `--dev` agents listen on fixed TCP ports (7070, 7071), which the
/// examples name: one document at a time.
static DEV_PORTS: Mutex<()> = Mutex::new(());

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_readme_walkthrough_runs_as_written() {
    let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).expect("README.md");
    let blocks = blocks(&readme);
    let consoles = blocks.iter().filter(|(k, _)| k == "console").count();
    assert!(
        consoles >= 2 && blocks.len() >= 3,
        "the README lost its tested blocks"
    );
    run_document("README.md", &blocks);
}

/// Every `docs/*.md` with marked blocks, in name order, each against a
/// fresh agent.
#[test]
fn the_docs_examples_run_as_written() {
    let mut docs: Vec<_> = std::fs::read_dir(format!("{ROOT}/docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    let mut tested = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).expect("doc");
        let blocks = blocks(&text);
        if blocks.is_empty() {
            continue;
        }
        let name = format!(
            "docs/{}",
            doc.file_name().unwrap_or_default().to_string_lossy()
        );
        run_document(&name, &blocks);
        tested.push(name);
    }
    for want in ["docs/data-plane.md", "docs/executions.md"] {
        assert!(
            tested.iter().any(|t| t == want),
            "{want} lost its tested blocks (tested: {tested:?})"
        );
    }
}

/// Starts an agent as the README's walk-through does, in a fresh
/// directory, and runs `blocks` against it in order.
fn run_document(doc: &str, blocks: &[(String, String)]) {
    let _one = DEV_PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_owned();
    let manifest = d.join("servers.toml");
    std::fs::write(&manifest, shipped_manifest(Path::new("${state_root}"))).expect("manifest");
    let bin_dir = Path::new(&*AGENT).parent().expect("bin dir").to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("sandbox-agent");
    cmd.args(["--dev", "--manifest"])
        .arg(&manifest)
        .current_dir(&d)
        .env("PATH", &path)
        .env("RUST_LOG", "info")
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("SANDBOX_AGENT_CONFIG");
    let agent = Agent::spawn(cmd, dir, d.join("sandbox-agent.sock"));

    let mcp2 = crate::common::mcp::mcp2_python();
    for (n, (kind, body)) in blocks.iter().enumerate() {
        match kind.as_str() {
            "console" => run_console(doc, n, body, &d, &path),
            // Against a host: tests/host/sandbox_api.rs runs it.
            "python klavis" => {}
            python => {
                let interpreter = match python {
                    "python mcp2" => mcp2.as_str(),
                    "python mcp1" => "python3",
                    other => panic!("{doc}: unknown readme-test kind {other:?}"),
                };
                let file = d.join(format!("snippet{n}.py"));
                std::fs::write(&file, body).expect("snippet");
                let out = Command::new(interpreter)
                    .arg(&file)
                    .current_dir(&d)
                    .output()
                    .expect("python");
                assert!(
                    out.status.success() && text(&out.stdout).contains("read_text_file"),
                    "{doc}: {kind}\nstdout: {}\nstderr: {}",
                    text(&out.stdout),
                    text(&out.stderr)
                );
            }
        }
    }
    drop(agent);
}

/// Runs one console block's `$` lines in a shell that starts from the
/// variables the previous blocks exported, and checks each step.
fn run_console(doc: &str, n: usize, body: &str, d: &Path, path: &str) {
    let steps = steps(body);
    let mut script = String::from("set -o pipefail\n[ -f env.sh ] && . ./env.sh\n");
    for (i, s) in steps.iter().enumerate() {
        script.push_str(&format!(
            "{{ {}\n}} > out.{n}.{i} 2> err.{n}.{i}; echo $? > rc.{n}.{i}\n",
            s.command
        ));
    }
    script.push_str("export -p > env.sh\n");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(d)
        .env("PATH", path)
        .env_remove("SANDBOX_AGENT")
        .env_remove("SANDBOX_AGENT_MCP")
        .env_remove("SANDBOX_AGENT_TOKEN")
        .output()
        .expect("bash");
    assert!(out.status.success(), "{doc}: {}", text(&out.stderr));
    for (i, s) in steps.iter().enumerate() {
        let read =
            |f: &str| std::fs::read_to_string(d.join(format!("{f}.{n}.{i}"))).unwrap_or_default();
        let (rc, stdout, stderr) = (read("rc"), read("out"), read("err"));
        let ctx = format!(
            "{doc}, block {n}:\n$ {}\nexit {rc}stdout:\n{stdout}\nstderr:\n{stderr}",
            s.command
        );
        match s.shown.first() {
            Some(first) if first.starts_with("sandboxctl: ") => {
                assert_eq!(rc.trim(), "1", "{ctx}");
                let want = first.split('…').next().unwrap_or(first);
                assert!(stderr.starts_with(want), "expected {want:?}\n{ctx}");
            }
            _ => {
                assert_eq!(rc.trim(), "0", "{ctx}");
                for line in &s.shown {
                    let fixed = !line.contains('…') && !line.chars().any(|c| c.is_ascii_digit());
                    assert!(
                        !fixed || stdout.contains(line.as_str()),
                        "{line:?} not shown\n{ctx}"
                    );
                }
            }
        }
    }
}
