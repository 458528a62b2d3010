//! End to end in a real VM: the initramfs from `packaging/vm/build-initramfs.sh`
//! booted by `packaging/vm/run-qemu.sh` (QEMU, KVM or TCG, with
//! vhost-user-vsock-pci served by vhost-device-vsock), the agent as PID 1,
//! and every call over real virtio-vsock through the hybrid-vsock socket.
//!
//! Needs qemu-system-x86_64, vhost-device-vsock, apt-get (to fetch Debian's
//! kernel and busybox-static) and the musl target; the README's test
//! command installs them. It boots the image `host_vm.rs` boots (one build,
//! `common::vm::node_image`), whose `notes` server it calls.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::eventually_async;
use crate::common::ws::{Tar, gzip, initialize};
use sandbox_client::mcp_client::McpHttpClient;
use sandbox_client::proto;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The VM's process group (run-qemu.sh, QEMU, vhost-device-vsock): killed
/// whole when the test ends, however it ends.
struct Vm {
    child: Child,
    uds: PathBuf,
    console: crate::common::Lines,
}

impl Vm {
    fn boot(initramfs: &Path, uds: &Path) -> Vm {
        let mut cmd = Command::new(format!("{ROOT}/packaging/vm/run-qemu.sh"));
        cmd.arg("--initramfs")
            .arg(initramfs)
            .arg("--vsock-uds")
            .arg(uds)
            .arg("--memory")
            .arg("512")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        // If this test process dies without unwinding (killed by a
        // timeout), run-qemu.sh gets SIGTERM and stops QEMU and
        // vhost-device-vsock itself.
        // SAFETY: the closure only calls prctl, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn().expect("run-qemu.sh");
        let console = crate::common::capture(child.stderr.take().expect("stderr"));
        Vm {
            child,
            uds: uds.to_owned(),
            console,
        }
    }

    fn agent_uri(&self) -> String {
        format!("hvsock://{}:1024", self.uds.display())
    }

    /// Waits for run-qemu.sh to end; None on timeout.
    fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.uds);
    }
}

/// The VM tests' image (built once, `common::vm::node_image`) and its
/// guest kernel's release.
fn initramfs() -> (PathBuf, String) {
    let image = crate::common::vm::node_image(&crate::common::mcp::servers_dir());
    let release = kernel_release(&crate::common::vm::kernel_of(&image));
    (image, release)
}

/// The release string a bzImage carries (at the offset its header names).
fn kernel_release(bzimage: &Path) -> String {
    let mut b = Vec::new();
    std::fs::File::open(bzimage)
        .and_then(|mut f| f.read_to_end(&mut b))
        .unwrap_or_else(|e| panic!("{}: {e}", bzimage.display()));
    let off = u16::from_le_bytes([b[0x20e], b[0x20f]]) as usize + 0x200;
    let end = b[off..]
        .iter()
        .position(|c| *c == b' ' || *c == 0)
        .expect("release");
    String::from_utf8_lossy(&b[off..off + end]).into_owned()
}

fn untar(gz: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    let mut out = Vec::new();
    for e in a.entries().expect("entries") {
        let mut e = e.expect("entry");
        if e.header().entry_type().is_file() {
            let name = e.path().expect("path").display().to_string();
            let mut data = Vec::new();
            e.read_to_end(&mut data).expect("read");
            out.push((name.trim_start_matches("./").to_owned(), data));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_a_vm_as_init_over_real_vsock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (image, release) = initramfs();
    let uds = dir.path().join("vsock.sock");
    let started = Instant::now();
    let mut vm = Vm::boot(&image, &uds);
    // QEMU starts after run-qemu.sh has chosen KVM or TCG (its KVM probe
    // takes a few seconds where KVM does not work).
    let line = vm
        .console
        .wait_for(Duration::from_secs(60), |l| l.contains("run-qemu: booting"))
        .unwrap_or_else(|| panic!("QEMU did not start:\n{}", vm.console.all()));
    let booted = Instant::now();
    let accel = line
        .split(" with ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or("")
        .to_owned();

    // Boot to SERVING (TCG is slow; the deadline allows for it).
    let client = eventually_async(
        Duration::from_secs(240),
        "the VM's agent serves",
        async || {
            if let Ok(c) = sandbox_client::connect(&vm.agent_uri()).await
                && let Ok(true) = c.serving().await
            {
                return Ok(c);
            }
            if let Some(s) = vm.child.try_wait().expect("wait") {
                panic!("the VM ended before serving ({s}):\n{}", vm.console.all());
            }
            Err(format!("not serving yet; console:\n{}", vm.console.all()))
        },
    )
    .await;
    println!(
        "boot to SERVING: {:.2} s ({accel}; {:.2} s including the accelerator probe)",
        booted.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    // GetInfo: the guest's kernel, the agent as PID 1.
    let info = client
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    let text = format!("{info:?}");
    assert!(text.contains(&release), "guest kernel {release}: {text}");
    assert!(text.contains("hostname: \"sandbox\""), "{text}");

    // Initialize then Dump: the same files come back.
    let files: Vec<(String, Vec<u8>)> = vec![
        ("config.json".into(), br#"{"a": 1}"#.to_vec()),
        ("hello.txt".into(), b"hello from the host\n".to_vec()),
        (
            "notes.md".into(),
            (0..20000).map(|i| (i % 251) as u8).collect(),
        ),
    ];
    let mut tar = Tar::new();
    for (n, d) in &files {
        tar.file(n, d);
    }
    let archive = gzip(&tar.end());
    initialize(&client, proto::InitializeHeader::default(), archive)
        .await
        .expect("Initialize");
    let (dumped, _) = crate::common::ws::dump(
        &client,
        proto::DumpRequest {
            compression: proto::Compression::Gzip as i32,
            ..Default::default()
        },
    )
    .await
    .expect("Dump");
    assert_eq!(untar(&dumped), files);

    // Acquire the image's stdio MCP server, then call it over the data
    // plane on vsock port 1025. Acquire clears the workspace, so put the
    // files back for the server to see.
    let acq = client
        .agent()
        .acquire(proto::AcquireRequest {
            lease_id: "vm-test".into(),
            server_names: vec!["notes".into()],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", vm.console.all()))
        .into_inner();
    assert_eq!(acq.servers.len(), 1, "{acq:?}");
    let mut tar = Tar::new();
    tar.file("hello.txt", b"hi");
    initialize(
        &client,
        proto::InitializeHeader::default(),
        gzip(&tar.end()),
    )
    .await
    .expect("Initialize in the lease");
    let ep: sandbox_client::Endpoint = format!("hvsock://{}:1025", uds.display())
        .parse()
        .expect("uri");
    let mut mcp = McpHttpClient::connect(&ep, "notes", None, Duration::from_secs(30))
        .await
        .expect("data plane");
    let r = mcp
        .call(
            "tools/call",
            serde_json::json!({"name": "add", "arguments": {"a": 2, "b": 40}}),
        )
        .await
        .expect("tools/call add");
    assert_eq!(r["content"][0]["text"], "42", "{r}");
    let r = mcp
        .call(
            "tools/call",
            serde_json::json!({"name": "list_workspace", "arguments": {}}),
        )
        .await
        .expect("tools/call list_workspace");
    assert_eq!(r["content"][0]["text"], "hello.txt", "{r}");

    // Release: idle again.
    let rel = client
        .agent()
        .release(proto::ReleaseRequest::default())
        .await
        .expect("Release")
        .into_inner();
    assert_eq!(rel.status, proto::SandboxStatus::Idle as i32, "{rel:?}");

    // Shutdown: the VM powers off and QEMU exits 0.
    let r = client
        .agent()
        .shutdown(proto::ShutdownRequest {
            reason: "test".into(),
        })
        .await
        .expect("Shutdown")
        .into_inner();
    assert!(r.power_off, "the agent is PID 1");
    let status = vm
        .wait(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("the VM did not power off:\n{}", vm.console.all()));
    assert!(
        status.success(),
        "run-qemu.sh: {status}\n{}",
        vm.console.all()
    );
    assert!(
        vm.console.all().contains("reboot: Power down"),
        "{}",
        vm.console.all()
    );
    // Nothing of the VM is left running.
    let left = Command::new("pgrep")
        .args(["-f", &uds.display().to_string()])
        .output()
        .expect("pgrep");
    assert!(
        left.stdout.is_empty(),
        "left behind: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}
