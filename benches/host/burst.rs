//! The benchmarks' pattern on `local_dev` (11 servers): lazy servers
//! (`--server-start auto`, the default) beside eager ones
//! (`--server-start eager`), measured in the same run:
//! - a cold `POST /sandbox/local_dev` from a pool of bare agents
//!   (sequential, each after the pool has refilled, untimed);
//! - a burst as MCP_Atlas's Klavis client runs it: N tasks at once, each
//!   acquiring `local_dev` and calling one tool on filesystem and one on
//!   terminal with the official MCP client, within a 30 s client timeout
//!   (`tests/clients/host_client.py burst-keep`): how many succeed, the
//!   wall time, the slowest task, and the peak memory (PSS) of all the
//!   sandboxes together, sampled while it runs;
//! - the memory one such sandbox holds after its two calls.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::memory::{pss_mib, slot_trees};
use super::warm::until;
use super::{Host, KEY, api, median, start_with};

/// The client's timeout per task, as MCP_Atlas's Klavis client sets it.
pub const WITHIN_S: u64 = 30;
const BARE: &str = "sandbox_host_pool_sandboxes{state=\"bare\",profile=\"\"}";
const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/host_client.py");

pub struct Mode {
    /// Cold `local_dev` Acquire, p50 (ms).
    pub acquire_ms: f64,
    pub rounds: usize,
    /// The burst: tasks, succeeded within the timeout, wall (s), slowest
    /// task (s), slowest Acquire (s), peak PSS of every sandbox (MiB).
    pub tasks: usize,
    pub ok: usize,
    pub wall_s: f64,
    pub slowest_task_s: f64,
    pub slowest_acquire_s: f64,
    pub peak_mib: f64,
    /// Median PSS of one sandbox after its two calls (MiB).
    pub per_sandbox_mib: f64,
}

pub struct Report {
    pub lazy: Mode,
    pub eager: Mode,
}

/// Sequential cold Acquires of `local_dev`, released at once; p50 in ms.
async fn acquires(h: &Host, rounds: usize) -> f64 {
    let mut t = Vec::new();
    for _ in 0..rounds {
        until(h, BARE, 1.0).await;
        let start = Instant::now();
        let a = api("POST", &format!("{}/sandbox/local_dev", h.base), "{}").await;
        t.push(start.elapsed().as_secs_f64() * 1000.0);
        let id = a["sandbox_id"].as_str().expect("acquired");
        api("DELETE", &format!("{}/sandbox/local_dev/{id}", h.base), "").await;
    }
    median(&mut t)
}

/// Samples the PSS of every sandbox together until `stop`; the peak in MiB.
pub(super) fn sample_peak(
    data: std::path::PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<f64> {
    std::thread::spawn(move || {
        let mut peak: f64 = 0.0;
        while !stop.load(Ordering::Relaxed) {
            let all: Vec<u32> = slot_trees(&data).concat();
            peak = peak.max(pss_mib(&all));
            std::thread::sleep(Duration::from_millis(500));
        }
        peak
    })
}

/// Runs the client's `burst-keep` of `n` tasks, sampling memory meanwhile.
async fn run_client(h: &Host, n: usize) -> (Value, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_peak(h.data.clone(), stop.clone());
    let base = h.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args([
                CLIENT,
                &base,
                KEY,
                "burst-keep",
                &n.to_string(),
                &WITHIN_S.to_string(),
            ])
            .output()
            .expect("python3")
    })
    .await
    .expect("client");
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().expect("sampler");
    assert!(
        out.status.success(),
        "host_client.py burst: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_slice(&out.stdout).expect("client JSON"),
        peak,
    )
}

/// The burst of `n` tasks; the sandboxes are measured, then released.
async fn burst(h: &Host, n: usize, mode: &mut Mode) {
    until(h, BARE, n as f64).await;
    let (v, peak) = run_client(h, n).await;
    mode.peak_mib = peak;
    let results = v["results"].as_array().cloned().unwrap_or_default();
    // A task that never got there counts as the whole timeout.
    let secs = |r: &Value, k: &str| r[k].as_f64().unwrap_or(WITHIN_S as f64 * 1000.0) / 1000.0;
    mode.tasks = n;
    mode.ok = results.iter().filter(|r| r["ok"] == true).count();
    mode.wall_s = v["wall_ms"].as_f64().unwrap_or(0.0) / 1000.0;
    mode.slowest_task_s = results
        .iter()
        .map(|r| secs(r, "task_ms"))
        .fold(0.0, f64::max);
    mode.slowest_acquire_s = results
        .iter()
        .map(|r| secs(r, "acquire_ms"))
        .fold(0.0, f64::max);
    if mode.ok < n {
        let why: Vec<&str> = results.iter().filter_map(|r| r["error"].as_str()).collect();
        println!(
            "(burst: {} of {n} failed, e.g. {})",
            n - mode.ok,
            why.first().unwrap_or(&"?")
        );
    }
    // One leased sandbox's memory after its two calls: the median of the
    // `n` biggest slots (the pool's refills are bare agents).
    let mut per: Vec<f64> = slot_trees(&h.data).iter().map(|t| pss_mib(t)).collect();
    per.sort_by(|a, b| b.total_cmp(a));
    per.truncate(n.min(per.len()).max(1));
    mode.per_sandbox_mib = median(&mut per);
    for r in &results {
        if let Some(id) = r["sandbox_id"].as_str() {
            api("DELETE", &format!("{}/sandbox/local_dev/{id}", h.base), "").await;
        }
    }
}

/// One mode (`--server-start` value): the sequential Acquires on a small
/// pool, then the burst on a pool of `n`.
async fn mode(dir: &Path, start: &str, rounds: usize, n: usize) -> Mode {
    let mut m = Mode {
        acquire_ms: 0.0,
        rounds,
        tasks: n,
        ok: 0,
        wall_s: 0.0,
        slowest_task_s: 0.0,
        slowest_acquire_s: 0.0,
        peak_mib: 0.0,
        per_sandbox_mib: 0.0,
    };
    let h = start_with(
        dir,
        &format!("local-dev-{start}"),
        &["--pool-size", "2", "--server-start", start],
    );
    m.acquire_ms = acquires(&h, rounds).await;
    drop(h);
    let pool = n.to_string();
    let h = start_with(
        dir,
        &format!("burst-{start}"),
        &["--pool-size", &pool, "--server-start", start],
    );
    burst(&h, n, &mut m).await;
    drop(h);
    m
}

pub async fn run(dir: &Path) -> Report {
    let n = crate::common::pick(20, 2);
    Report {
        lazy: mode(dir, "auto", crate::common::pick(15, 1), n).await,
        eager: mode(dir, "eager", crate::common::pick(3, 1), n).await,
    }
}
