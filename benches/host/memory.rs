//! The memory of the host's sandboxes: each slot's process tree (its
//! agent, servers, everything below) and its proportional set size.

use std::collections::HashMap;
use std::path::Path;

/// Each slot's process tree, found from the slots' `agent.pid` files.
pub fn slot_trees(data: &Path) -> Vec<Vec<u32>> {
    let roots: Vec<u32> = std::fs::read_dir(data.join("slots"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("agent.pid")).ok())
        .filter_map(|p| p.trim().parse().ok())
        .collect();
    let parent = parents();
    let root_of = |p: u32| {
        let mut cur = p;
        for _ in 0..64 {
            if roots.contains(&cur) {
                return Some(cur);
            }
            match parent.get(&cur) {
                Some(&pp) if pp > 1 => cur = pp,
                _ => return None,
            }
        }
        None
    };
    let mut trees: HashMap<u32, Vec<u32>> = HashMap::new();
    for &p in parent.keys() {
        if let Some(r) = root_of(p) {
            trees.entry(r).or_default().push(p);
        }
    }
    trees.into_values().collect()
}

/// Every process's parent.
fn parents() -> HashMap<u32, u32> {
    let mut parent = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some(pp) = std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok())
        {
            parent.insert(p, pp);
        }
    }
    parent
}

/// Proportional set size of `pids` together, in MiB.
pub fn pss_mib(pids: &[u32]) -> f64 {
    let kib: u64 = pids
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .sum();
    kib as f64 / 1024.0
}
