//! The README's walk-through, run as written: the `$` lines of the
//! `<!-- readme-test: console -->` block in order, in one shell, against an
//! agent started as "Set up" says (`sandbox-agent --dev --manifest …`, the
//! binaries on PATH), then the Python MCP SDK snippets (2.x and 1.x) as
//! written against the same agent.
//!
//! A command whose shown output starts with `sandboxctl:` must fail with
//! that message (up to its first `…`); any other must succeed, and each
//! shown output line without digits or `…` must appear in what it printed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::mcp::shipped_manifest;
use crate::common::*;

/// The fenced block right after `marker`.
fn block(readme: &str, marker: &str) -> String {
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("README has no {marker}"));
    let rest = &readme[at..];
    let open = rest.find("```").expect("a fenced block") + 3;
    let body = &rest[open..];
    let body = &body[body.find('\n').expect("fence line") + 1..];
    body[..body.find("```").expect("closing fence")].to_owned()
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

#[test]
fn the_readme_walkthrough_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
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
    let mut child = Command::new("sandbox-agent")
        .args(["--dev", "--manifest"])
        .arg(&manifest)
        .current_dir(&d)
        .env("PATH", &path)
        .env("RUST_LOG", "info")
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("SANDBOX_AGENT_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sandbox-agent on PATH");
    let stderr = capture(child.stderr.take().expect("stderr"));
    let agent = Agent {
        child,
        dir,
        stderr,
        socket: d.join("sandbox-agent.sock"),
    };
    assert!(
        agent
            .stderr
            .wait_for(Duration::from_secs(20), |l| l.contains(" serving "))
            .is_some(),
        "{}",
        agent.stderr.all()
    );

    // Each step's output and status in files; one shell, so `export` holds.
    let steps = steps(&block(&readme, "<!-- readme-test: console -->"));
    assert!(steps.len() >= 10, "the walk-through lost its steps");
    let mut script = String::from("set -o pipefail\n");
    for (i, s) in steps.iter().enumerate() {
        script.push_str(&format!(
            "{{ {}\n}} > out.{i} 2> err.{i}; echo $? > rc.{i}\n",
            s.command
        ));
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&d)
        .env("PATH", &path)
        .env_remove("SANDBOX_AGENT")
        .env_remove("SANDBOX_AGENT_MCP")
        .env_remove("SANDBOX_AGENT_TOKEN")
        .output()
        .expect("bash");
    assert!(out.status.success(), "{}", text(&out.stderr));
    for (i, s) in steps.iter().enumerate() {
        let read = |f: &str| std::fs::read_to_string(d.join(format!("{f}.{i}"))).unwrap_or_default();
        let (rc, stdout, stderr) = (read("rc"), read("out"), read("err"));
        let ctx = format!("$ {}\nexit {rc}stdout:\n{stdout}\nstderr:\n{stderr}", s.command);
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
                    assert!(!fixed || stdout.contains(line.as_str()), "{line:?} not shown\n{ctx}");
                }
            }
        }
    }

    // The Python MCP SDK snippets, as written, with a lease of filesystem.
    let at = format!("unix://{}", d.join("sandbox-agent.sock").display());
    let r = ctl(&["--agent", &at, "acquire", "--servers", "filesystem"]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let mcp2 = std::env::var("SANDBOX_AGENT_MCP2_PYTHON")
        .unwrap_or_else(|_| "/opt/sandbox-agent/clients/mcp2/bin/python".to_owned());
    for (marker, python) in [
        ("<!-- readme-test: python mcp2 -->", mcp2.as_str()),
        ("<!-- readme-test: python mcp1 -->", "python3"),
    ] {
        let file = d.join("snippet.py");
        std::fs::write(&file, block(&readme, marker)).expect("snippet");
        let out = Command::new(python)
            .arg(&file)
            .current_dir(&d)
            .output()
            .expect("python");
        assert!(
            out.status.success() && text(&out.stdout).contains("read_text_file"),
            "{marker}\nstdout: {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    drop(agent);
}
