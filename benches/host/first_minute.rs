//! The benchmarks' own start-of-task flows (`first-minute`), replayed
//! through `sandbox-host` as their Klavis integrations run them
//! (`first_minute/flows.rs`), on a lazy host answering discovery from
//! catalogs (`--catalogs use` over a directory recorded once at the start
//! of the run by a host with `--catalogs record`) beside an eager host
//! (`--server-start eager`, no catalogs) in the same run:
//! - MCP_Atlas, Toolathlon and MCP_Mark: each step's median (acquire, the
//!   workspace, the discovery of each server and in all, each call, the
//!   total), and for MCP_Atlas the servers running and the slot's memory
//!   (PSS) right after the discovery;
//! - the first call: each `local_dev` server's first session on a fresh
//!   sandbox going straight to one harmless call;
//! - many MCP_Atlas-style tasks at once (`first_minute/crowd.rs`);
//! - what a template of each Python server build would hold and give
//!   (`first_minute/template.rs`), the measure of why a first call stays
//!   a process start.
//!
//! The sequential cases run on a pool of one (`--max-slots 1`: the slot
//! measured is the task's), each round from a bare sandbox (waited for,
//! untimed).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;

#[path = "first_minute/crowd.rs"]
mod crowd;
#[path = "first_minute/flows.rs"]
mod flows;
#[path = "first_minute/mcp.rs"]
mod mcp;
#[path = "first_minute/template.rs"]
mod template;

use super::memory::{pss_mib, slot_trees};
use super::warm::until;
use super::{Host, api, call, median, start_with};
use crate::common;
use crowd::{BARE, Crowd};
use flows::{SEQ, Steps, ms};

const RECORDING: &str = "sandbox_host_discovery_recording";
const CATALOGS: &str = "sandbox_host_discovery_catalogs";

fn rounds() -> usize {
    common::pick(5, 1)
}

/// One sample of the host's `/metrics`, if it shows it.
async fn metric(h: &Host, sample: &str) -> Option<f64> {
    let url = format!("{}/metrics", h.base);
    let (status, body) = call("GET", &url, true, Bytes::new(), true).await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "GET /metrics: {text}");
    text.lines().find_map(|l| {
        l.strip_prefix(sample)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The catalogs, recorded once by a host with `--catalogs record` (until
/// `/metrics` says the recording ended): their directory, how many, and
/// how long it took (s). Into a fresh directory in the full mode (its
/// time is a figure); in the short mode into the directory the tests of
/// this build share, where they are usually made already.
async fn record(dir: &Path) -> (PathBuf, f64, f64) {
    let catalogs = if common::short() {
        common::shared_catalog_dir()
    } else {
        dir.join("catalogs")
    };
    let c = catalogs.display().to_string();
    let t = Instant::now();
    let _one_recorder = common::short().then(|| common::catalog_recording_lock(&catalogs));
    let args = [
        "--pool-size",
        "0",
        "--catalogs",
        "record",
        "--catalog-dir",
        c.as_str(),
    ];
    let h = start_with(dir, "catalog-recorder", &args);
    let deadline = Instant::now() + Duration::from_secs(900);
    while metric(&h, RECORDING).await != Some(0.0) {
        assert!(
            Instant::now() < deadline,
            "the recording of discovery catalogs did not end within 900 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let held = metric(&h, CATALOGS).await.unwrap_or(0.0);
    assert!(held > 0.0, "the recording made no discovery catalog");
    drop(h);
    (catalogs, held, t.elapsed().as_secs_f64())
}

/// What the sequential cases measured on one host.
#[derive(Default)]
struct Cases {
    atlas: Steps,
    /// Servers running right after MCP_Atlas's discovery, and the slot's
    /// PSS then (MiB), per round.
    started: Vec<f64>,
    pss: Vec<f64>,
    /// The last round's slot, process by process.
    pss_detail: String,
    toolathlon: Steps,
    mark: Steps,
    first: Steps,
}

/// MCP_Atlas's start of a task, once; what runs after the discovery and
/// the slot's memory are read between discovery and calls, untimed.
async fn atlas_round(h: &Host, c: &mut Cases) {
    let t0 = Instant::now();
    let ld = flows::acquire_local_dev(&h.base, Some("MCP_Atlas"), SEQ)
        .await
        .expect("acquire");
    c.atlas.add("acquire `POST /sandbox/local_dev`", ms(t0));
    flows::atlas_discovery(&ld, &mut c.atlas, SEQ)
        .await
        .expect("discovery");
    let paused = Instant::now();
    let info = api(
        "GET",
        &format!("{}/sandbox/local_dev/{}", h.base, ld.id),
        "",
    )
    .await;
    let states = info["server_states"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert_eq!(states.len(), ld.urls.len(), "server_states: {info}");
    c.started.push(
        states
            .values()
            .filter(|s| s.as_str() != Some("idle"))
            .count() as f64,
    );
    // The pool holds one slot (`--max-slots 1`): the task's.
    let tree = slot_trees(&h.data).concat();
    c.pss.push(pss_mib(&tree));
    c.pss_detail = by_process(&tree);
    let pause = ms(paused);
    flows::atlas_calls(&ld, &mut c.atlas, SEQ)
        .await
        .expect("calls");
    c.atlas.add("total", ms(t0) - pause);
    flows::release_local_dev(&h.base, &ld.id).await;
}

/// The PSS of each process of `pids` (MiB), biggest first, by name.
fn by_process(pids: &[u32]) -> String {
    let mut each: Vec<(f64, String)> = pids
        .iter()
        .map(|&p| {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            (pss_mib(&[p]), comm.trim().to_owned())
        })
        .collect();
    each.sort_by(|a, b| b.0.total_cmp(&a.0));
    let each: Vec<String> = each.iter().map(|(m, c)| format!("{c} {m:.1}")).collect();
    each.join(", ")
}

/// Every sequential case on `h`, each from a bare sandbox.
async fn cases(h: &Host, repo: &str) -> Cases {
    let mut c = Cases::default();
    for _ in 0..rounds() {
        until(h, BARE, 1.0).await;
        atlas_round(h, &mut c).await;
    }
    for _ in 0..rounds() {
        until(h, BARE, 1.0).await;
        flows::toolathlon(&h.base, &mut c.toolathlon).await;
    }
    for _ in 0..rounds() {
        until(h, BARE, 1.0).await;
        flows::mark(&h.base, &mut c.mark).await;
    }
    for _ in 0..rounds() {
        until(h, BARE, 1.0).await;
        flows::first_call(&h.base, repo, &mut c.first).await;
    }
    c
}

/// A host with a pool of `pool` (and at most that many sandboxes).
fn host(dir: &Path, name: &str, pool: usize, extra: &[&str]) -> Host {
    let pool = pool.to_string();
    let mut args: Vec<&str> = vec!["--pool-size", &pool, "--max-slots", &pool];
    args.extend_from_slice(extra);
    start_with(dir, name, &args)
}

pub fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(run(dir.path()));
}

async fn run(dir: &Path) {
    let data = common::bench_data::atlas();
    let repo = data.repos.first().expect("a repository").path.clone();
    let (catalogs, held, record_s) = record(dir).await;
    let c = catalogs.display().to_string();
    let use_catalogs = ["--catalogs", "use", "--catalog-dir", c.as_str()];
    let eager_start = ["--server-start", "eager"];

    let h = host(dir, "lazy", 1, &use_catalogs);
    let lazy = cases(&h, &repo).await;
    drop(h);
    let h = host(dir, "eager", 1, &eager_start);
    let eager = cases(&h, &repo).await;
    drop(h);

    // Two at once in the short mode: the smoke check of a crowd (each
    // eager sandbox starts all 11 servers).
    let n = common::pick(20, 2);
    let h = host(dir, "crowd-lazy", n, &use_catalogs);
    let lazy_crowd = crowd::run(&h, n, Some("MCP_Atlas")).await;
    drop(h);
    let h = host(dir, "crowd-eager", n, &eager_start);
    let eager_crowd = crowd::run(&h, n, Some("MCP_Atlas")).await;
    drop(h);

    println!(
        "# the benchmarks' start of a task through sandbox-host: lazy servers with discovery catalogs (`--catalogs use`) vs `--server-start eager`, same run; {} rounds, medians; {}",
        rounds(),
        common::mode()
    );
    println!(
        "(a fresh host with `--catalogs record` served after {record_s:.0} s, its {held} catalogs recorded first{}; MCP_Atlas's data: {})",
        if common::short() {
            ", most of them found made by the tests of this build"
        } else {
            ""
        },
        if data.real {
            "its real files, stand-in repositories"
        } else {
            "the tests' made-up dataset (the real one is not on this machine)"
        }
    );
    println!();
    print_steps(
        "MCP_Atlas: `local_dev` with `{\"benchmark\": \"MCP_Atlas\"}`; each server listed in a new session (initialize, initialized, tools/list, DELETE), one after another; 3 calls, each in a new session (initialize, initialized, tools/call, DELETE)",
        &lazy.atlas,
        &eager.atlas,
    );
    println!(
        "| servers running right after the discovery | {:.0} of 11 | {:.0} of 11 | |",
        median(&mut lazy.started.clone()),
        median(&mut eager.started.clone())
    );
    let (lp, ep) = (
        median(&mut lazy.pss.clone()),
        median(&mut eager.pss.clone()),
    );
    println!(
        "| the slot's memory (PSS) right after the discovery | {lp:.0} MiB | {ep:.0} MiB | {:.2}x |",
        lp / ep
    );
    println!(
        "(the slot right after the discovery, MiB: lazy: {}; eager: {})",
        lazy.pss_detail, eager.pss_detail
    );
    println!();
    print_steps(
        "Toolathlon: `local_dev` with `{\"benchmark\": \"Toolathlon\"}`, its workspace uploaded (3 files, tar.gz), a session per task server opened all at once, each listed in turn, all kept for the calls",
        &lazy.toolathlon,
        &eager.toolathlon,
    );
    println!();
    print_steps(
        "MCP_Mark: `POST /local-sandbox` with `[\"filesystem\"]` and `\"benchmark\": \"MCP_Mark\"` (an explicit list: its server starts before the answer on both hosts), the workspace uploaded, one session listed and kept for the calls",
        &lazy.mark,
        &eager.mark,
    );
    println!();
    print_first(&lazy.first, &eager.first);
    println!();
    print_crowd(&lazy_crowd, &eager_crowd);
    println!();
    template::print();
    println!();
    print_goals(&lazy, &lazy_crowd, lp);
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

fn print_steps(title: &str, lazy: &Steps, eager: &Steps) {
    println!("{title}:");
    println!("| step | lazy + catalogs | eager | lazy / eager |");
    println!("|---|---|---|---|");
    for (step, _) in &lazy.0 {
        let l = lazy.median(step).expect("a step");
        match eager.median(step) {
            Some(e) => println!("| {step} | {} | {} | {:.2}x |", fmt_ms(l), fmt_ms(e), l / e),
            None => println!("| {step} | {} | | |", fmt_ms(l)),
        }
    }
}

/// The sessions' samples (not the calls alone) of `first`: p50 and max.
fn first_spread(first: &Steps) -> (f64, f64) {
    let mut all: Vec<f64> = first
        .0
        .iter()
        .filter(|(s, _)| !s.ends_with("(the call alone)"))
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    let max = all.iter().copied().fold(0.0, f64::max);
    (median(&mut all), max)
}

fn print_first(lazy: &Steps, eager: &Steps) {
    println!(
        "The first call of each server on a fresh `local_dev` (MCP_Atlas): a new session (initialize, initialized) and one harmless tools/call, no listing; one server after another:"
    );
    println!(
        "| server `tool` | lazy + catalogs: session / the call alone | eager: session / the call alone |"
    );
    println!("|---|---|---|");
    let get = |s: &Steps, k: &str| s.median(k).map(fmt_ms).unwrap_or_default();
    for (step, _) in lazy
        .0
        .iter()
        .filter(|(s, _)| !s.ends_with("(the call alone)"))
    {
        let alone = format!("{step} (the call alone)");
        println!(
            "| {step} | {} / {} | {} / {} |",
            get(lazy, step),
            get(lazy, &alone),
            get(eager, step),
            get(eager, &alone)
        );
    }
    let (lp, lm) = first_spread(lazy);
    let (ep, em) = first_spread(eager);
    println!(
        "| every session, all rounds: p50 / max | {} / {} | {} / {} |",
        fmt_ms(lp),
        fmt_ms(lm),
        fmt_ms(ep),
        fmt_ms(em)
    );
}

fn print_crowd(l: &Crowd, e: &Crowd) {
    println!(
        "{} MCP_Atlas-style tasks at once (each: `local_dev`, its servers listed one by one, 3 calls; every exchange within {} s), a pool of {} bare sandboxes:",
        l.tasks,
        crowd::WITHIN.as_secs(),
        l.tasks
    );
    println!("| measure | lazy + catalogs | eager | lazy / eager |");
    println!("|---|---|---|---|");
    println!(
        "| tasks done | {} of {} | {} of {} | |",
        l.ok, l.tasks, e.ok, e.tasks
    );
    let row = |what: &str, a: Option<f64>, b: Option<f64>, unit: &str| {
        let v = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1} {unit}"));
        let ratio = match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}x", a / b),
            _ => String::new(),
        };
        println!("| {what} | {} | {} | {ratio} |", v(a), v(b));
    };
    row("wall time", Some(l.wall_s), Some(e.wall_s), "s");
    row("slowest task", Some(l.slowest_s), Some(e.slowest_s), "s");
    row("median task", Some(l.median_s), Some(e.median_s), "s");
    row(
        "slowest discovery of the 11 (tasks that got there)",
        l.slowest_discovery_s,
        e.slowest_discovery_s,
        "s",
    );
    row(
        "peak memory (PSS) of every sandbox together",
        Some(l.peak_mib),
        Some(e.peak_mib),
        "MiB",
    );
    row(
        "one sandbox after its task (PSS, median)",
        l.per_slot_mib,
        e.per_slot_mib,
        "MiB",
    );
    for (name, c) in [("lazy", l), ("eager", e)] {
        if let Some(f) = &c.first_failure {
            println!(
                "({name}: {} of {} not done, e.g. {f})",
                c.tasks - c.ok,
                c.tasks
            );
        }
    }
}

/// The goals beside what the lazy host with catalogs measured.
fn print_goals(lazy: &Cases, crowd: &Crowd, slot_mib: f64) {
    let all = lazy
        .atlas
        .0
        .iter()
        .find(|(s, _)| s.starts_with("discovery: all"))
        .map(|(s, _)| lazy.atlas.median(s).expect("samples"))
        .unwrap_or(f64::NAN);
    let (p50, max) = first_spread(&lazy.first);
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("| goal (lazy + catalogs) | measured | |");
    println!("|---|---|---|");
    println!(
        "| discovery of local_dev's servers one by one ≤ 1 s in all | {} | {} |",
        fmt_ms(all),
        met(all <= 1000.0)
    );
    println!(
        "| the slot ≤ 150 MiB right after it | {slot_mib:.0} MiB | {} |",
        met(slot_mib <= 150.0)
    );
    println!(
        "| first call p50 ≤ 100 ms, max ≤ 300 ms | {} / {} | {} |",
        fmt_ms(p50),
        fmt_ms(max),
        met(p50 <= 100.0 && max <= 300.0)
    );
    println!(
        "| {} MCP_Atlas-style tasks at once, the slowest ≤ 3 s | {:.1} s ({} of {} done) | {} |",
        crowd.tasks,
        crowd.slowest_s,
        crowd.ok,
        crowd.tasks,
        met(crowd.slowest_s <= 3.0 && crowd.ok == crowd.tasks)
    );
}
