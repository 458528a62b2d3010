//! Why a cold first call is not brought to milliseconds (issue 42, part
//! 2): what a template of each installed Python server build (a fork
//! server holding its imports) would hold and give, measured outside any
//! sandbox by `template_probe.py` run with that build's interpreter: the
//! MCP SDK's import alone, the server's own entry module on top of it,
//! the memory the process then holds, and a fork of it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::median;
use crate::common;

/// One console script of one build, as the probe measured it.
struct Row {
    build: String,
    script: String,
    sdk_ms: f64,
    own_ms: f64,
    rss_mib: f64,
    anon_mib: f64,
    fork_ms: f64,
}

/// Every installed Python server build (`<servers>/py/*`), sorted; the
/// short mode probes two.
fn builds() -> Vec<PathBuf> {
    let py = Path::new(&common::servers_dir()).join("py");
    let mut all: Vec<PathBuf> = std::fs::read_dir(&py)
        .unwrap_or_else(|e| panic!("{}: {e}", py.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("bin/python").exists())
        .collect();
    all.sort();
    if common::pick(false, true) {
        all.retain(|p| p.ends_with("git") || p.ends_with("excel"));
    }
    all
}

fn probe(build: &Path) -> Vec<Row> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/host/first_minute/template_probe.py");
    // cli-mcp-server (the terminal) checks its ALLOWED_DIR at import.
    let out = Command::new(build.join("bin/python"))
        .arg(&script)
        .env("ALLOWED_DIR", std::env::temp_dir())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", build.display()));
    assert!(
        out.status.success(),
        "{}: the probe failed: {}",
        build.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let name = build.file_name().map(|n| n.to_string_lossy().into_owned());
    let build = name.unwrap_or_default();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            assert!(v.get("error").is_none(), "{build}: {v}");
            Row {
                build: build.clone(),
                script: v["script"].as_str().unwrap_or_default().to_owned(),
                sdk_ms: f("sdk_ms"),
                own_ms: f("own_ms"),
                rss_mib: f("rss_mib"),
                anon_mib: f("anon_mib"),
                fork_ms: f("fork_ms"),
            }
        })
        .collect()
}

/// The probe over every build, then its table and what it means for each
/// design of the first call.
pub fn print() {
    let rows: Vec<Row> = builds().iter().flat_map(|b| probe(b)).collect();
    assert!(!rows.is_empty(), "no Python server build to probe");
    println!(
        "What a template (fork server) of each Python server build would hold and give, outside any sandbox, a fresh interpreter per script:"
    );
    println!(
        "| build: script | the MCP SDK's import | the server's own imports on top | RSS (anonymous) then | fork to running, p50 |"
    );
    println!("|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {}: `{}` | {:.0} ms | {:.0} ms | {:.0} MiB ({:.0}) | {:.1} ms |",
            r.build, r.script, r.sdk_ms, r.own_ms, r.rss_mib, r.anon_mib, r.fork_ms
        );
    }
    let col = |f: fn(&Row) -> f64| -> Vec<f64> { rows.iter().map(f).collect() };
    let max = |v: &[f64]| v.iter().copied().fold(f64::MIN, f64::max);
    let own = col(|r| r.own_ms);
    let anon = col(|r| r.anon_mib);
    println!(
        "(a template of the SDK alone, shareable across builds of one SDK version, still leaves each server's own imports: p50 {:.0} ms, max {:.0} ms; a template per build holds p50 {:.0} MiB, max {:.0} MiB of its own memory, per slot; a fork runs in p50 {:.1} ms)",
        median(&mut own.clone()),
        max(&own),
        median(&mut anon.clone()),
        max(&anon),
        median(&mut col(|r| r.fork_ms)),
    );
}
