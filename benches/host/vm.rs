//! The qemu backend (full mode only: VMs boot under TCG here): an Acquire
//! answered by a VM booted ahead with warm servers, by a VM booted ahead
//! without them (the Acquire starts the servers), and by a fresh VM (no
//! pool: boot, agent, servers). Klavis's notebook gives each request
//! httpx's default timeout of 5 s.

use std::path::Path;
use std::time::Instant;

use super::{Host, api, spawn_host, warm};

pub struct Report {
    pub rounds: usize,
    pub warm_ms: f64,
    pub booted_ms: f64,
    pub fresh_ms: f64,
}

const BODY: &str = r#"{"server_names": ["filesystem"]}"#;

/// Acquire (timed) and Release, `n` times, each after `ready` (untimed).
async fn rounds(h: &Host, n: usize, ready: Option<&str>) -> f64 {
    let mut t = Vec::new();
    for _ in 0..n {
        if let Some(r) = ready {
            warm::until(h, r, 1.0).await;
        }
        let start = Instant::now();
        let a = api("POST", &format!("{}/local-sandbox", h.base), BODY).await;
        t.push(start.elapsed().as_secs_f64() * 1000.0);
        let id = a["local_sandbox_id"].as_str().expect("id");
        api("DELETE", &format!("{}/local-sandbox/{id}", h.base), "").await;
    }
    super::median(&mut t)
}

/// `None` in short mode, or when QEMU or vhost-device-vsock is missing.
pub async fn run(dir: &Path) -> Option<Report> {
    let have = |tool: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if crate::common::short() || !have("qemu-system-x86_64") || !have("vhost-device-vsock") {
        return None;
    }
    let image = match std::env::var("SANDBOX_AGENT_VM_NODE_INITRAMFS") {
        Ok(p) => std::path::PathBuf::from(p),
        Err(_) => crate::common::vm::build_initramfs(
            dir,
            "bench-node",
            &["--node-servers", &crate::common::servers_dir()],
        ),
    };
    let image = image.display().to_string();
    let qemu = [
        "--backend",
        "qemu",
        "--vm-image",
        &image,
        "--vm-memory",
        "1024",
    ];
    let n = 5;

    let profile = "filesystem,localmemory";
    let warm_host = spawn_host(
        dir,
        "vm-warm",
        &[
            &qemu[..],
            &["--pool-size", "1", "--warm", &format!("{profile}=1")],
        ]
        .concat(),
    );
    let ready = format!("sandbox_host_pool_sandboxes{{state=\"warm\",profile=\"{profile}\"}}");
    let warm_ms = rounds(&warm_host, n, Some(&ready)).await;
    drop(warm_host);

    let booted = spawn_host(
        dir,
        "vm-booted",
        &[&qemu[..], &["--pool-size", "1"]].concat(),
    );
    let ready = "sandbox_host_pool_sandboxes{state=\"bare\",profile=\"\"}";
    let booted_ms = rounds(&booted, n, Some(ready)).await;
    drop(booted);

    let fresh = spawn_host(
        dir,
        "vm-fresh",
        &[&qemu[..], &["--pool-size", "0"]].concat(),
    );
    let fresh_ms = rounds(&fresh, 3, None).await;
    drop(fresh);
    Some(Report {
        rounds: n,
        warm_ms,
        booted_ms,
        fresh_ms,
    })
}
