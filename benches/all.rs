//! Every benchmark of the suite, in one binary (one release link instead of
//! five). Each prints its medians next to the reference it is compared
//! with, measured in the same run; `BENCH=short` for the quick mode CI
//! runs.
//!
//! `cargo bench -p sandbox-suite` runs them all; name some to run only
//! those: `cargo bench -p sandbox-suite -- host workspace`. `exec` runs
//! only the executions part of `host` (which `host` runs too).

mod agent;
mod common;
mod gateway;
mod host;
mod lifecycle;
/// The real kube-apiserver of the kubernetes tests (`kube-api`).
#[cfg(feature = "kubernetes")]
#[allow(dead_code)]
#[path = "../src/kube/tests/real/mod.rs"]
mod real;
mod workspace;

fn main() {
    let benches: [(&str, fn()); 10] = [
        ("agent", agent::main),
        ("workspace", workspace::main),
        ("lifecycle", lifecycle::main),
        ("gateway", gateway::main),
        ("host", host::main),
        ("burst", host::burst_main),
        ("first-minute", host::first_minute::main),
        ("recycle", host::recycle_main),
        ("kube-api", host::kube_main),
        ("exec", host::exec_main),
    ];
    // cargo passes `--bench`; other words name benchmarks.
    let asked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut took = Vec::new();
    for (name, run) in benches {
        // `host` measures executions too: `exec` alone is for when asked.
        let all = asked.is_empty() && name != "exec";
        if all || asked.iter().any(|a| a == name) {
            println!("\n### {name}");
            let t = std::time::Instant::now();
            run();
            took.push((name, t.elapsed()));
        }
    }
    // What each bench took, so a slower run shows where (the short mode
    // is CI's smoke check of every bench).
    println!("\n### wall time per bench");
    for (name, d) in took {
        println!("| {name} | {:.1} s |", d.as_secs_f64());
    }
}
