//! Warm pools serving any subset: Acquire p50/p99 of random subsets of a
//! warm set through the REST API, with a pool warm with that set (the
//! lease is narrowed) beside a pool of bare agents (the Acquire starts the
//! subset), and the memory a warm sandbox holds while it waits.

use std::path::Path;
use std::time::{Duration, Instant};

use super::memory::{pss_mib, slot_trees};
use super::{Host, api, call, start_with};

/// The warm set: the five servers the test command installs (node and
/// Python), sorted as the host labels the profile.
pub const WARM_SET: [&str; 5] = ["excel", "filesystem", "git", "localmemory", "terminal"];
/// The warm pool's size (one in the short mode: five servers a sandbox).
fn pool() -> usize {
    crate::common::pick(3, 1)
}

pub struct Report {
    pub rounds: usize,
    pub warm: (f64, f64),
    pub bare: (f64, f64),
    /// Warm hits the host counted, of `rounds`.
    pub hits: f64,
    /// PSS in MiB: a warm sandbox (agent + the set's servers), a bare agent.
    pub warm_mib: f64,
    pub bare_mib: f64,
}

/// One sample of the host's `/metrics`.
async fn metric(h: &Host, sample: &str) -> f64 {
    let (_, body) = call(
        "GET",
        &format!("{}/metrics", h.base),
        // /metrics needs a key on the API's address.
        true,
        bytes::Bytes::new(),
        true,
    )
    .await;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| {
            l.strip_prefix(sample)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// Waits (untimed) until `sample` is at least `at_least`: 60 s, plus 30 s per
/// sandbox it counts (an isolated agent starts in about a second on an
/// idle machine, many times that when the pool fills 20 at once beside a
/// build).
pub(super) async fn until(h: &Host, sample: &str, at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(60 + 30 * at_least.ceil() as u64);
    while metric(h, sample).await < at_least {
        assert!(
            Instant::now() < deadline,
            "{sample} never reached {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Median PSS of the idle slots' process trees.
fn idle_slots_mib(h: &Host) -> f64 {
    let mut v: Vec<f64> = slot_trees(&h.data).iter().map(|t| pss_mib(t)).collect();
    super::median(&mut v)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let k = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[k - 1]
}

/// The same `n` random non-empty subsets for both pools.
fn subsets(n: usize) -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(18);
    (0..n)
        .map(|_| {
            let mut pick: Vec<&str> = WARM_SET.iter().copied().filter(|_| rng.bool()).collect();
            if pick.is_empty() {
                pick.push(WARM_SET[rng.usize(..WARM_SET.len())]);
            }
            let names: Vec<String> = pick.iter().map(|n| format!("\"{n}\"")).collect();
            format!(r#"{{"server_names": [{}]}}"#, names.join(", "))
        })
        .collect()
}

/// Acquire of each body (timed) and its release, after waiting (untimed)
/// for `ready` sandboxes; (p50, p99) in ms.
async fn rounds(h: &Host, bodies: &[String], ready: &str) -> (f64, f64) {
    let mut t = Vec::new();
    for body in bodies {
        until(h, ready, 1.0).await;
        let start = Instant::now();
        let a = api("POST", &format!("{}/local-sandbox", h.base), body).await;
        t.push(start.elapsed().as_secs_f64() * 1000.0);
        let id = a["local_sandbox_id"].as_str().expect("id");
        api("DELETE", &format!("{}/local-sandbox/{id}", h.base), "").await;
    }
    (percentile(&mut t.clone(), 0.5), percentile(&mut t, 0.99))
}

pub async fn run(dir: &Path) -> Report {
    let n = crate::common::pick(50, 2);
    let bodies = subsets(n);
    let set = WARM_SET.join(",");
    let profile = format!("{set}={}", pool());
    let warm = start_with(
        dir,
        "subsets-warm",
        &["--pool-size", &pool().to_string(), "--warm", &profile],
    );
    let ready = format!("sandbox_host_pool_sandboxes{{state=\"warm\",profile=\"{set}\"}}");
    until(&warm, &ready, pool() as f64).await;
    let warm_mib = idle_slots_mib(&warm);
    let warm_lat = rounds(&warm, &bodies, &ready).await;
    let hits = metric(
        &warm,
        &format!("sandbox_host_warm_hits_total{{profile=\"{set}\"}}"),
    )
    .await;
    drop(warm);

    let bare = start_with(dir, "subsets-bare", &["--pool-size", &pool().to_string()]);
    let ready = "sandbox_host_pool_sandboxes{state=\"bare\",profile=\"\"}";
    until(&bare, ready, pool() as f64).await;
    let bare_mib = idle_slots_mib(&bare);
    let bare_lat = rounds(&bare, &bodies, ready).await;
    drop(bare);
    Report {
        rounds: n,
        warm: warm_lat,
        bare: bare_lat,
        hits,
        warm_mib,
        bare_mib,
    }
}
