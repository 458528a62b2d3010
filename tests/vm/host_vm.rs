//! `sandbox-host --backend qemu`: every sandbox is a VM booted from the
//! image of `packaging/vm` (built here with the npm filesystem and memory
//! servers), its agent reached over real virtio-vsock through
//! vhost-device-vsock. The Klavis notebook's flow with httpx, the official
//! MCP client through mcp_server_url, a script execution (the image carries
//! python3, its environment the sandbox's own with nothing of the host's
//! PATH or user), ALL, a server the image lacks, a VM booted ahead with
//! warm servers answering the notebook's Acquire, and nothing left running
//! after the host stops.
//!
//! Needs what `tests/vm.rs` needs, plus the npm servers under
//! `SANDBOX_AGENT_SERVERS_DIR`; the README's test command installs them.
//! The image is the one `vm.rs` boots too (`common::vm::node_image`).

use std::time::Duration;

use crate::common::host::{
    Host, KEY_A, KEY_B, acquire, assert_mcp_client_works, assert_mcp_initializes,
    assert_notebook_outcome, http, metric, py, release, server_names, wait_host, wait_metric,
};

/// The warm profile of the test's pool: two of the image's servers.
const WARM: &str = "filesystem,localmemory";
/// Put in the host's PATH and USER: never in a sandbox's environment.
const HOST_MARK: &str = "sandbox-test-host-mark";

#[test]
fn the_qemu_backend_serves_the_api_from_vms() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = crate::common::vm::node_image(&crate::common::mcp::servers_dir());
    let args: Vec<String> = vec![
        "--backend".into(),
        "qemu".into(),
        "--vm-image".into(),
        image.display().to_string(),
        "--vm-memory".into(),
        "1024".into(),
        "--warm".into(),
        format!("{WARM}=1"),
        // One VM carries every lease of the test, recycled between them
        // (the default `--on-release recycle`): a TCG boot is a minute of
        // a loaded core, and a fresh VM per Acquire checks nothing more.
        "--pool-size".into(),
        "1".into(),
        "--max-slots".into(),
        "1".into(),
    ];
    // A marker in the host's PATH and user: nothing of it may reach a
    // sandbox's processes (issue 50; `run_an_execution` reads `env`).
    let path = format!(
        "/opt/{HOST_MARK}/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    let user = format!("user-{HOST_MARK}");
    let mut host = Host::start_with_env(dir.path(), &args, &[("PATH", &path), ("USER", &user)]);
    let b = host.base.clone();

    // The pool boots a VM ahead and starts the warm servers in it.
    let warm = format!("sandbox_host_pool_sandboxes{{state=\"warm\",profile=\"{WARM}\"}}");
    wait_metric(&host, &warm, 1.0, Duration::from_secs(300));
    let vm = host.agents();

    // The notebook's steps, in that VM: its Acquire narrows the warm lease
    // to filesystem (localmemory stops inside the VM after the answer).
    // With the notebook's own client timeout: httpx's default 5 s.
    let v = py(&host, KEY_A, &["notebook-5s", "filesystem"]);
    assert_notebook_outcome(&v);
    assert_eq!(v["acquire"]["servers"][0]["server_name"], "filesystem");
    assert_eq!(
        metric(
            &host,
            &format!("sandbox_host_warm_hits_total{{profile=\"{WARM}\"}}")
        ),
        1.0,
        "the notebook's Acquire was answered by the warm VM"
    );

    // The official MCP client, through the host, into the VM (recycled).
    settled(&host);
    assert_mcp_client_works(&host);

    // A script execution inside a VM.
    settled(&host);
    run_an_execution(&host, dir.path());

    // ALL is every server of the image.
    settled(&host);
    let a = acquire(
        &host,
        KEY_A,
        r#"{"server_names": "ALL", "ttl_seconds": 600}"#,
    );
    let all = a["local_sandbox_id"].as_str().expect("id").to_owned();
    let names = server_names(&a);
    assert_eq!(names, ["filesystem", "localmemory", "notes"], "{a}");
    assert_mcp_initializes(&b, "localmemory", &all);
    let (code, _) = http(
        "GET",
        &format!("{b}/local-sandbox/{all}"),
        Some(KEY_B),
        None,
    );
    assert_eq!(code, 404, "another owner's VM");

    // A Klavis server this image does not carry: a clear 400, and the VM
    // stays usable.
    let (code, v) = http(
        "POST",
        &format!("{b}/local-sandbox"),
        Some(KEY_A),
        Some(r#"{"server_names": ["git"]}"#),
    );
    assert_eq!(code, 400, "{v}");
    assert!(
        v["detail"].as_str().is_some_and(|d| d.contains("git")),
        "{v}"
    );

    release(&host, KEY_A, &all);
    // Releases end in the background; then the VM booted first is idle
    // again (under --max-slots 1 none could have replaced it while alive).
    settled(&host);
    let booted = host.agents();
    assert!(
        booted == vm && vm.len() == 1 && crate::common::host::alive(vm[0]),
        "one VM served every lease: {vm:?} at first, {booted:?} now"
    );
    // Stopping the host stops its idle VM: no QEMU, vhost-device-vsock or
    // run-qemu.sh of this host is left (QEMU's command line names the
    // image, the others the slot's directory).
    host.stop();
    crate::common::host::assert_nothing_left(&host, &[&image.display().to_string()]);
}

/// Waits until the last release has ended and the VM is back in the pool
/// (under `--max-slots 1`, an Acquire before that would find no room).
fn settled(host: &Host) {
    let sample = |state: &str, profile: &str| {
        metric(
            host,
            &format!("sandbox_host_pool_sandboxes{{state=\"{state}\",profile=\"{profile}\"}}"),
        )
    };
    wait_host(
        host,
        Duration::from_secs(300),
        "the VM back in the pool",
        || {
            let leased = sample("leased", "");
            let idle = sample("bare", "") + sample("warm", WARM) + sample("warming", WARM);
            crate::common::when(leased == 0.0 && idle == 1.0, || {
                format!("{leased} leased, {idle} idle")
            })
        },
    );
}

/// Klavis's execution endpoints against a VM: upload, execute, poll the
/// logs to `completed`, status, export (with the file the script wrote).
fn run_an_execution(host: &Host, dir: &std::path::Path) {
    let b = &host.base;
    let a = acquire(host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    let main = "import os, platform, pwd\nprint('python', platform.python_version(), 'on', platform.node())\nprint('user', pwd.getpwuid(os.getuid()).pw_name)\nfor k, v in os.environ.items():\n    print(f'env {k}={v}')\nopen('hello.txt', 'w').write('from the VM')\nopen(os.path.join(os.environ['AGENT_WORKSPACE'], 'ws.txt'), 'w').write('x')\nprint('done')\n";
    let archive = dir.join("exec.tar.gz");
    {
        let f = std::fs::File::create(&archive).expect("archive");
        let mut t = tar::Builder::new(flate2::write::GzEncoder::new(
            f,
            flate2::Compression::fast(),
        ));
        let mut h = tar::Header::new_gnu();
        h.set_size(main.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        t.append_data(&mut h, "main.py", main.as_bytes())
            .expect("append");
        t.into_inner().expect("tar").finish().expect("gzip");
    }
    let name = r#"{"execution_name": "vm-run"}"#;
    let (code, u) = http(
        "POST",
        &format!("{b}/local-sandbox/{id}/execution-upload-url"),
        Some(KEY_A),
        Some(name),
    );
    assert_eq!(code, 200, "{u}");
    let put = std::process::Command::new("curl")
        .args(["-sf", "-X", "PUT", "--data-binary"])
        .arg(format!("@{}", archive.display()))
        .arg(u["upload_url"].as_str().expect("url"))
        .status()
        .expect("curl");
    assert!(put.success());
    let (code, v) = http(
        "POST",
        &format!("{b}/local-sandbox/{id}/execute"),
        Some(KEY_A),
        Some(name),
    );
    assert_eq!(code, 200, "{v}");
    let (mut cursor, mut logs) = (0u64, String::new());
    let last =
        crate::common::eventually(Duration::from_secs(300), "the VM's execution ends", || {
            let (code, v) = http(
                "GET",
                &format!(
                    "{b}/local-sandbox/{id}/execution-logs?execution_name=vm-run&cursor={cursor}"
                ),
                Some(KEY_A),
                None,
            );
            assert_eq!(code, 200, "{v}");
            logs.push_str(v["logs"].as_str().unwrap_or_default());
            cursor = v["cursor"].as_u64().unwrap_or(cursor);
            let st = v["status"].as_str().unwrap_or_default().to_owned();
            crate::common::when(st == "completed" || st == "failed", || st.clone()).map(|()| st)
        });
    assert_eq!(last, "completed", "{logs}");
    assert!(
        logs.contains("on sandbox") && logs.contains("user sandbox") && logs.contains("done"),
        "{logs}"
    );
    // The sandbox's own environment, nothing of the host's.
    assert!(
        !logs.contains(HOST_MARK) && logs.contains("env USER=sandbox\n"),
        "the execution's environment: {logs}"
    );
    let (code, v) = http(
        "POST",
        &format!("{b}/local-sandbox/{id}/export-artifacts"),
        Some(KEY_A),
        Some(name),
    );
    assert_eq!(code, 200, "{v}");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("curl -sf \"$0\" | tar -xzO ./hello.txt")
        .arg(v["download_url"].as_str().expect("url"))
        .output()
        .expect("curl | tar");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from the VM");
    release(host, KEY_A, &id);
}
