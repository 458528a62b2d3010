//! Many MCP_Atlas-style tasks at once (`local_dev`, its 11 servers listed
//! one by one in sessions of their own, 3 calls each in a new session), as
//! its harness runs tasks side by side: every HTTP exchange within 30 s
//! (the Atlas client's httpx timeout), the peak memory of all sandboxes
//! sampled meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::flows::{Steps, acquire_local_dev, atlas_calls, atlas_discovery};
use super::mcp::Timed;
use crate::host::Host;
use crate::host::burst::sample_peak;
use crate::host::memory::{pss_mib, slot_trees};
use crate::host::warm::until;

/// Each exchange's bound, as MCP_Atlas's client sets it.
pub const WITHIN: Duration = Duration::from_secs(30);
pub const BARE: &str = "sandbox_host_pool_sandboxes{state=\"bare\",profile=\"\"}";

pub struct Crowd {
    pub tasks: usize,
    pub ok: usize,
    pub wall_s: f64,
    /// The slowest task and the median one (a task that ran out of time:
    /// when it gave up).
    pub slowest_s: f64,
    pub median_s: f64,
    /// The slowest discovery of the 11 servers (of the tasks that got
    /// that far; none when none did).
    pub slowest_discovery_s: Option<f64>,
    pub peak_mib: f64,
    /// One sandbox after its discovery and calls (PSS, median of the
    /// `tasks` biggest slots; none unless every task was done).
    pub per_slot_mib: Option<f64>,
    pub first_failure: Option<String>,
}

/// One task: acquire, discovery, calls; its steps.
async fn task(base: String, bench: Option<&'static str>) -> (Timed<()>, Steps) {
    let mut steps = Steps::default();
    let r = async {
        let ld = acquire_local_dev(&base, bench, WITHIN).await?;
        atlas_discovery(&ld, &mut steps, WITHIN).await?;
        atlas_calls(&ld, &mut steps, WITHIN).await
    }
    .await;
    (r, steps)
}

/// `n` tasks at once on `h` (a pool of at least `n` bare sandboxes).
pub async fn run(h: &Host, n: usize, bench: Option<&'static str>) -> Crowd {
    until(h, BARE, n as f64).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_peak(h.data.clone(), stop.clone());
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let base = h.base.clone();
        set.spawn(async move {
            let t = Instant::now();
            let (r, steps) = task(base, bench).await;
            (r, steps, t.elapsed().as_secs_f64())
        });
    }
    let mut c = Crowd {
        tasks: n,
        ok: 0,
        wall_s: 0.0,
        slowest_s: 0.0,
        median_s: 0.0,
        slowest_discovery_s: None,
        peak_mib: 0.0,
        per_slot_mib: None,
        first_failure: None,
    };
    let mut times = Vec::new();
    while let Some(done) = set.join_next().await {
        let (r, steps, secs) = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        c.slowest_s = c.slowest_s.max(secs);
        times.push(secs);
        let all = steps
            .0
            .iter()
            .find(|(s, _)| s.starts_with("discovery: all"));
        if let Some((_, d)) = all {
            let s = c.slowest_discovery_s.unwrap_or(0.0).max(d[0] / 1000.0);
            c.slowest_discovery_s = Some(s);
        }
        match r {
            Ok(()) => c.ok += 1,
            Err(e) => {
                c.first_failure.get_or_insert(e);
            }
        }
    }
    c.wall_s = start.elapsed().as_secs_f64();
    c.median_s = crate::host::median(&mut times);
    stop.store(true, Ordering::Relaxed);
    c.peak_mib = sampler.join().expect("sampler");
    let mut per: Vec<f64> = slot_trees(&h.data).iter().map(|t| pss_mib(t)).collect();
    per.sort_by(|a, b| b.total_cmp(a));
    per.truncate(n.min(per.len()).max(1));
    if c.ok == n {
        c.per_slot_mib = Some(crate::host::median(&mut per));
    }
    c
}
