//! A recycled slot's next Acquire, whatever its last tenant left: a host of
//! one slot (`--max-slots 1`), a tenant that leaves nothing, 30,000 empty
//! directories in the workspace (3,000 in short mode), or a chain of
//! directories in its home (16,000 levels; 100,000 in full mode), then the
//! next tenant's Acquire on the same slot, timed once the slot is idle
//! again. The Release's own cost (DELETE to idle: the old trees are
//! deleted, or the slot is dropped whole past `--recycle-max-inodes`,
//! before the slot goes back to the pool) is printed beside it; it is
//! borne by no Acquire.
//!
//! And the worst a tenant can leave on a shared host (issue 50): with
//! `--pool-size 2 --max-slots 4`, A fills three sandboxes' file systems to
//! their `--slot-inodes` (ENOSPC) and releases them; another tenant's
//! Acquires (then Release) at once, beside the same Acquires on the same
//! host when nothing was left: p50, the slowest, and how many were refused
//! (503) for want of a place.

use std::time::{Duration, Instant};

use super::{api, call, exec_archive, median, start_with};

const BODY: &str = r#"{"server_names": ["filesystem"]}"#;
/// The other tenant's Acquire: no server, so it times the place itself.
const BARE: &str = r#"{"server_names": []}"#;
/// Fills the sandbox's file system with directories until ENOSPC.
const FILL: &str = "import os\ntry:\n    for i in range(10_000_000):\n        os.mkdir(f'/workspace/d{i}')\nexcept OSError:\n    pass\n";

/// What the last tenant leaves, as a script.
fn litter(kind: &str) -> String {
    let chain = crate::common::pick(100_000, 16_000);
    match kind {
        // Short mode: a smoke check (the recycled path; `trash_burst`
        // smokes the discarded one).
        "dirs" => format!(
            "import os\nfor i in range({}):\n    os.mkdir(f'd{{i}}')\n",
            crate::common::pick(30_000, 3_000)
        ),
        "chain" => format!(
            "import os\nos.chdir(os.environ['HOME'])\nfor _ in range({chain}):\n    os.mkdir('d')\n    os.chdir('d')\n"
        ),
        _ => "pass\n".to_owned(),
    }
}

/// Runs `script` in sandbox `b` (its URL) to completion.
async fn run(b: &str, name: &str, script: &str) {
    let body = format!(r#"{{"execution_name": "{name}"}}"#);
    let u = api("POST", &format!("{b}/execution-upload-url"), &body).await;
    let url = u["upload_url"].as_str().expect("url");
    let (s, _) = call("PUT", url, false, exec_archive(script), false).await;
    assert_eq!(s, 200);
    api("POST", &format!("{b}/execute"), &body).await;
    loop {
        let l = api(
            "GET",
            &format!("{b}/execution-logs?execution_name={name}&cursor=0"),
            "",
        )
        .await;
        match l["status"].as_str() {
            Some("completed") => return,
            Some("failed") => panic!("the litter script failed: {l}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Waits until the host's one slot is idle (back in the pool).
async fn idle(base: &str) {
    let want = r#"sandbox_host_pool_sandboxes{state="bare",profile=""} 1"#;
    for _ in 0..6000 {
        let (_, m) = call(
            "GET",
            &format!("{base}/metrics"),
            true,
            bytes::Bytes::new(),
            true,
        )
        .await;
        if String::from_utf8_lossy(&m).lines().any(|l| l == want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the slot never came back to the pool");
}

/// Medians (ms) of the next Acquire and of DELETE → idle after `kind`.
async fn rounds(base: &str, kind: &str) -> (f64, f64) {
    let (mut acquire, mut release) = (Vec::new(), Vec::new());
    let script = litter(kind);
    let mut id = api("POST", &format!("{base}/local-sandbox"), BODY).await["local_sandbox_id"]
        .as_str()
        .expect("id")
        .to_owned();
    for i in 0..crate::common::pick(5, 1) {
        let b = format!("{base}/local-sandbox/{id}");
        run(&b, &format!("litter-{i}"), &script).await;
        let t = Instant::now();
        api("DELETE", &b, "").await;
        idle(base).await;
        release.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let a = api("POST", &format!("{base}/local-sandbox"), BODY).await;
        acquire.push(t.elapsed().as_secs_f64() * 1000.0);
        id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    }
    api("DELETE", &format!("{base}/local-sandbox/{id}"), "").await;
    idle(base).await;
    (median(&mut acquire), median(&mut release))
}

pub async fn run_all(dir: &std::path::Path) {
    let h = start_with(dir, "recycle", &["--pool-size", "1", "--max-slots", "1"]);
    idle(&h.base).await;
    let clean = rounds(&h.base, "clean").await;
    let dirs = rounds(&h.base, "dirs").await;
    let chain = rounds(&h.base, "chain").await;
    drop(h);
    println!(
        "# a recycled slot's next Acquire (filesystem; one slot; {} rounds, medians; {})",
        crate::common::pick(5, 1),
        crate::common::mode()
    );
    println!(
        "| the last tenant left | next Acquire | vs after a clean lease | DELETE → slot idle |"
    );
    println!("|---|---|---|---|");
    for (what, (a, r)) in [
        ("nothing (reference)", clean),
        (
            &*format!(
                "{} directories in the workspace",
                crate::common::pick("30,000", "3,000")
            ),
            dirs,
        ),
        (
            &*format!(
                "a {}-level chain in its home",
                crate::common::pick(100_000, 16_000)
            ),
            chain,
        ),
    ] {
        println!("| {what} | {a:.1} ms | {:.2}x | {r:.0} ms |", a / clean.0);
    }
}

/// B's Acquire+Release cycles at once: (latencies in ms, refused).
async fn b_cycles(base: &str, n: usize) -> (Vec<f64>, usize) {
    let (mut ms, mut refused) = (Vec::new(), 0);
    while ms.len() < n {
        let t = Instant::now();
        let (status, body) = call(
            "POST",
            &format!("{base}/local-sandbox"),
            true,
            bytes::Bytes::from_static(BARE.as_bytes()),
            true,
        )
        .await;
        if status == 503 {
            refused += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let id = v["local_sandbox_id"].as_str().expect("id");
        api("DELETE", &format!("{base}/local-sandbox/{id}"), "").await;
    }
    (ms, refused)
}

/// A fills three sandboxes, then releases them: B's cycles right after,
/// and the same on a quiet host first (the reference).
pub async fn trash_burst(dir: &std::path::Path) {
    let inodes = crate::common::pick(262_144, 20_000).to_string();
    let h = start_with(
        dir,
        "trash",
        &[
            "--pool-size",
            "2",
            "--max-slots",
            "4",
            "--slot-inodes",
            &inodes,
        ],
    );
    let n = crate::common::pick(20, 4);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut quiet, _) = b_cycles(&h.base, n).await;
    let mut held = Vec::new();
    for i in 0..3 {
        let a = api("POST", &format!("{}/local-sandbox", h.base), BARE).await;
        let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
        let b = format!("{}/local-sandbox/{id}", h.base);
        run(&b, &format!("fill-{i}"), FILL).await;
        held.push(b);
    }
    for b in &held {
        api("DELETE", b, "").await;
    }
    let (mut after, refused) = b_cycles(&h.base, n).await;
    drop(h);
    let slowest = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (q50, a50) = (median(&mut quiet), median(&mut after));
    println!(
        "\n# another tenant's Acquire right after one left three sandboxes full ({inodes} inodes each, ENOSPC), --pool-size 2 --max-slots 4; {n} cycles each; {}",
        crate::common::mode()
    );
    println!("| B's Acquire | p50 | slowest | refused (503) |");
    println!("|---|---|---|---|");
    println!(
        "| quiet host (reference) | {q50:.1} ms | {:.1} ms | 0 |",
        slowest(&quiet)
    );
    println!(
        "| right after A's release | {a50:.1} ms ({:.2}x) | {:.1} ms | {refused} |",
        a50 / q50,
        slowest(&after)
    );
}
