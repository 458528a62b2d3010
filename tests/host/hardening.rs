//! Issue 19's host items: a per-key cap on live sandboxes, a busy
//! workspace answered 409 (the agent's ABORTED), and concurrent uploads to
//! one sandbox that never mix (the last complete one wins whole).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::eventually;
use crate::common::host::{Host, KEY_A, KEY_B, acquire, http, release};

/// PUTs `file` to `url`; returns the HTTP status.
fn put(url: &str, file: &Path, rate: Option<&str>) -> Command {
    let mut c = Command::new("curl");
    c.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
        .args(["-H", "content-type: application/gzip"])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()));
    if let Some(r) = rate {
        c.args(["--limit-rate", r]);
    }
    c.arg(url);
    c
}

/// A tar.gz of one file `name` holding `len` bytes that do not compress.
fn random_archive(dir: &Path, name: &str, len: usize, seed: u64) -> std::path::PathBuf {
    let data = crate::common::ws::incompressible(len, seed);
    let mut t = crate::common::ws::Tar::new();
    t.file(name, &data);
    let path = dir.join(format!("{name}.tar.gz"));
    let mut f = std::fs::File::create(&path).expect("archive");
    f.write_all(&crate::common::ws::gzip(&t.end()))
        .expect("write archive");
    path
}

fn upload_url(host: &Host, id: &str) -> String {
    let (code, u) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/upload-url", host.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{u}");
    u["upload_url"].as_str().expect("upload_url").to_owned()
}

#[test]
fn a_key_holds_at_most_its_cap_of_sandboxes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &["--max-sandboxes-per-key", "1"]);
    let body = r#"{"server_names": []}"#;
    let a = acquire(&host, KEY_A, body);
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox", host.base),
        Some(KEY_A),
        Some(body),
    );
    assert_eq!(code, 429, "{v}");
    assert!(
        v["detail"].as_str().unwrap_or_default().contains("limit 1"),
        "{v}"
    );
    // Another key has its own count.
    let b = acquire(&host, KEY_B, body);
    release(&host, KEY_A, a["local_sandbox_id"].as_str().expect("id"));
    let again = acquire(&host, KEY_A, body);
    release(
        &host,
        KEY_A,
        again["local_sandbox_id"].as_str().expect("id"),
    );
    release(&host, KEY_B, b["local_sandbox_id"].as_str().expect("id"));
}

/// An Initialize while a Dump is being read holds the workspace: the agent
/// answers ABORTED and the host 409 (not 500), and the workspace is free
/// again once the reader goes away.
#[test]
fn a_busy_workspace_is_409() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id");
    let mark = random_archive(dir.path(), "mark.bin", 1024, 7);
    let out = put(&upload_url(&host, id), &mark, None)
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    let init = format!("{}/local-sandbox/{id}/initialize", host.base);
    let (code, v) = http("POST", &init, Some(KEY_A), None);
    assert_eq!(code, 200, "{v}");
    // 64 MiB that gzip cannot shrink, written straight into this sandbox's
    // workspace: more than every buffer between the agent and the reader,
    // so the Dump stays in flight while its reader is slow.
    let ws = crate::warm::slot_dirs(&host)
        .into_iter()
        .map(|s| crate::common::slots::slot_workspace(&s))
        .find(|w| w.join("mark.bin").exists())
        .expect("the sandbox's workspace");
    crate::common::ws::write_64_mib(&ws, "big.bin");
    let (_, d) = http(
        "GET",
        &format!("{}/local-sandbox/{id}/dump", host.base),
        Some(KEY_A),
        None,
    );
    let url = d["download_url"].as_str().expect("download_url");
    let part = dir.path().join("dump.part");
    let mut slow = Command::new("curl")
        .args(["-s", "--limit-rate", "16k", "-o"])
        .arg(&part)
        .arg(url)
        .stdout(Stdio::null())
        .spawn()
        .expect("curl");
    // The dump is under way once its first bytes arrived.
    eventually(
        Duration::from_secs(30),
        "the dump's first bytes",
        || match std::fs::metadata(&part).map(|m| m.len()) {
            Ok(n) if n > 0 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let (code, busy) = http("POST", &init, Some(KEY_A), None);
    assert_eq!(code, 409, "{busy}");
    assert!(
        busy["detail"].as_str().unwrap_or_default().contains("Dump"),
        "{busy}"
    );
    let _ = slow.kill();
    let _ = slow.wait();
    eventually(
        Duration::from_secs(30),
        "the workspace free again",
        || match http("POST", &init, Some(KEY_A), None) {
            (200, _) => Ok(()),
            (c, v) => Err(format!("{c}: {v}")),
        },
    );
    release(&host, KEY_A, id);
}

/// A slow PUT and a fast one to the same sandbox: each goes to its own
/// temporary file, and the stored archive is one of them whole, never a
/// mix; Initialize extracts exactly that one.
#[test]
fn concurrent_uploads_never_mix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id");
    let slow_file = random_archive(dir.path(), "slow.bin", 2 << 20, 1);
    let fast_file = random_archive(dir.path(), "fast.bin", 1 << 20, 2);
    let url = upload_url(&host, id);
    let slow = put(&url, &slow_file, Some("512k"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("slow curl");
    let fast = put(&url, &fast_file, None).output().expect("fast curl");
    assert_eq!(String::from_utf8_lossy(&fast.stdout), "200");
    let slow = slow.wait_with_output().expect("slow curl");
    assert_eq!(String::from_utf8_lossy(&slow.stdout), "200");
    // The slow one completed last: it is stored whole.
    let stored = std::fs::read(host.data.join(format!("uploads/{id}.tar.gz"))).expect("stored");
    assert_eq!(stored, std::fs::read(&slow_file).expect("slow file"));
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/initialize", host.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{v}");
    release(&host, KEY_A, id);
}

fn host_addr(host: &Host) -> String {
    host.base.trim_start_matches("http://").to_owned()
}

/// Connections that send nothing are closed after `--header-timeout-ms`,
/// so as many of them as `--max-connections` do not keep the API from
/// answering (no key is needed to connect).
#[test]
fn silent_connections_do_not_hold_the_host() {
    use std::io::Read;
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(
        dir.path(),
        &["--max-connections", "4", "--header-timeout-ms", "1000"],
    );
    let addr = host_addr(&host);
    let mut silent: Vec<_> = (0..4)
        .map(|_| std::net::TcpStream::connect(&addr).expect("connect"))
        .collect();
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "60",
        ])
        .arg(format!("{}/openapi.json", host.base))
        .output()
        .expect("curl");
    assert_eq!(crate::common::text(&out.stdout), "200");
    // The host closed them: reads end instead of waiting.
    for s in &mut silent {
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("a silent connection was not closed: {other:?}"),
        }
    }
}

/// A flood of connections that runs the host out of file descriptors
/// (EMFILE) makes accepts fail for a while, but the TTL reaper, which then
/// cannot read /proc either, no longer takes the live sandbox's agent for
/// dead: the sandbox stays occupied and works once the flood ends.
#[test]
fn running_out_of_descriptors_does_not_fail_a_live_sandbox() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(
        dir.path(),
        &[
            "--max-connections",
            "2000",
            "--header-timeout-ms",
            "120000",
            // The reaper looks every 50 ms.
            "--time-scale",
            "0.05",
        ],
    );
    let a = acquire(&host, KEY_A, r#"{"server_names": []}"#);
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    let pid = host.pid().expect("pid").to_string();
    let st = Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=128:128"])
        .status()
        .expect("prlimit");
    assert!(st.success());
    let addr: std::net::SocketAddr = host_addr(&host).parse().expect("address");
    let log = dir.path().join("host.log");
    let failed = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("accept failed")
            .count()
    };
    // Connections until the host has no descriptor left to accept one
    // (more would only wait in the listen backlog).
    let mut flood = Vec::new();
    while failed() == 0 && flood.len() < 1000 {
        for _ in 0..10 {
            if let Ok(c) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                flood.push(c);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eventually(
        Duration::from_secs(30),
        "accepts fail for want of fds",
        || {
            let n = failed();
            // 50 ms apart: a second or more of reaper passes without fds.
            crate::common::when(n >= 20, || format!("{n} failed accepts so far"))
        },
    );
    drop(flood);
    let (code, v) = http(
        "GET",
        &format!("{}/local-sandbox/{id}", host.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "occupied", "{v}");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("its agent died"), "{text}");
    release(&host, KEY_A, &id);
}
