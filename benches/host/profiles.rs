//! Acquire of each benchmark profile's usual server set through the REST
//! API (with `benchmark`): cold (a bare agent starts the servers under the
//! profile) and with a warm lease of that profile (started ahead under the
//! benchmark; the Acquire narrows it and answers).

use std::time::Instant;

use super::warm::until;
use super::{api, median, start_with};

/// Each benchmark's servers that run here without an outside service, as
/// its harness acquires them (see ../shared/benchmarks.md).
pub const PROFILES: [(&str, &[&str]); 3] = [
    (
        "MCP_Atlas",
        &[
            "arxiv",
            "code-executor",
            "code-runner",
            "desktop-commander",
            "filesystem",
            "git",
            "localmemory",
            "terminal",
        ],
    ),
    (
        "Toolathlon",
        &[
            "arxiv",
            "excel",
            "filesystem",
            "git",
            "localmemory",
            "pdf-tools",
            "playwright",
            "powerpoint",
            "terminal",
            "word",
        ],
    ),
    ("MCP_Mark", &["filesystem", "playwright"]),
];

pub struct Row {
    pub benchmark: &'static str,
    pub servers: usize,
    pub cold_ms: f64,
    pub warm_ms: f64,
}

/// Timed Acquires of `body` (each after waiting, untimed, for an idle
/// sandbox `ready`), released at once; the median in ms.
async fn acquires(h: &super::Host, body: &str, ready: &str) -> f64 {
    let mut t = Vec::new();
    for _ in 0..crate::common::pick(7, 1) {
        until(h, ready, 1.0).await;
        let start = Instant::now();
        let a = api("POST", &format!("{}/local-sandbox", h.base), body).await;
        t.push(start.elapsed().as_secs_f64() * 1000.0);
        let id = a["local_sandbox_id"].as_str().expect("acquired");
        api("DELETE", &format!("{}/local-sandbox/{id}", h.base), "").await;
    }
    median(&mut t)
}

pub async fn run(dir: &std::path::Path) -> Vec<Row> {
    let mut rows = Vec::new();
    for (benchmark, set) in PROFILES {
        let body = serde_json::json!({"server_names": set, "benchmark": benchmark}).to_string();
        let cold = start_with(dir, &format!("{benchmark}-cold"), &["--pool-size", "1"]);
        let cold_ms = acquires(
            &cold,
            &body,
            "sandbox_host_pool_sandboxes{state=\"bare\",profile=\"\"}",
        )
        .await;
        drop(cold);
        let label = format!("{benchmark}:{}", set.join(","));
        let warm = start_with(
            dir,
            &format!("{benchmark}-warm"),
            &["--pool-size", "1", "--warm", &format!("{label}=1")],
        );
        let ready = format!("sandbox_host_pool_sandboxes{{state=\"warm\",profile=\"{label}\"}}");
        let warm_ms = acquires(&warm, &body, &ready).await;
        drop(warm);
        rows.push(Row {
            benchmark,
            servers: set.len(),
            cold_ms,
            warm_ms,
        });
    }
    rows
}
