//! A recycled slot's next Acquire, whatever its last tenant left: a host of
//! one slot (`--max-slots 1`), a tenant that leaves nothing, 30,000 empty
//! directories in the workspace, or a chain of directories in its home
//! (16,000 levels; 100,000 in full mode), then the next tenant's Acquire
//! on the same slot, timed once the slot is idle again. The Release's own
//! cost (DELETE to idle: the old trees are deleted before the slot goes
//! back to the pool) is printed beside it; it is borne by no Acquire.

use std::time::{Duration, Instant};

use super::{api, call, exec_archive, median, start_with};

const BODY: &str = r#"{"server_names": ["filesystem"]}"#;

/// What the last tenant leaves, as a script.
fn litter(kind: &str) -> String {
    let chain = crate::common::pick(100_000, 16_000);
    match kind {
        "dirs" => "import os\nfor i in range(30000):\n    os.mkdir(f'd{i}')\n".to_owned(),
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
        ("30,000 directories in the workspace", dirs),
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
