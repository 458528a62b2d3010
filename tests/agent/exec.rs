//! Script executions (the Exec service) through the real agent binary: a
//! failing script, multibyte output read in tiny cursor steps while it is
//! written, the log cap with the agent's memory staying flat, bad requests,
//! replacing a running execution, and a release that must kill a script
//! and its children.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::common::mcp::*;
use crate::common::servers::{client, release};
use crate::common::*;
use sandbox_client::proto;
use tonic::Code;

pub(crate) async fn acquire(c: &sandbox_client::Client, id: &str) {
    c.agent()
        .acquire(proto::AcquireRequest {
            lease_id: id.into(),
            server_names: vec!["filesystem".into()],
            ..Default::default()
        })
        .await
        .expect("Acquire");
}

/// A tar.gz of `files`.
pub(crate) fn targz(files: &[(&str, &str)]) -> Vec<u8> {
    let enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(enc);
    for (name, body) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, body.as_bytes())
            .expect("append");
    }
    b.into_inner().expect("tar").finish().expect("gzip")
}

pub(crate) async fn upload(
    c: &sandbox_client::Client,
    name: &str,
    archive: Vec<u8>,
) -> Result<proto::ExecUploadResponse, tonic::Status> {
    use proto::exec_upload_request::Msg;
    let msgs = vec![
        proto::ExecUploadRequest {
            msg: Some(Msg::Header(proto::ExecUploadHeader {
                execution_name: name.into(),
                ..Default::default()
            })),
        },
        proto::ExecUploadRequest {
            msg: Some(Msg::Chunk(archive.into())),
        },
    ];
    c.exec()
        .upload(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner())
}

pub(crate) async fn start(c: &sandbox_client::Client, name: &str) -> proto::ExecStatus {
    c.exec()
        .start(proto::ExecStartRequest {
            execution_name: name.into(),
            ..Default::default()
        })
        .await
        .expect("Start")
        .into_inner()
}

pub(crate) async fn status(c: &sandbox_client::Client, name: &str) -> proto::ExecStatus {
    c.exec()
        .status(proto::ExecStatusRequest {
            execution_name: name.into(),
            ..Default::default()
        })
        .await
        .expect("Status")
        .into_inner()
}

/// Polls Logs with `max_bytes` from cursor 0 until the answer says the log
/// is complete; returns the text and the number of polls.
pub(crate) async fn read_all(
    c: &sandbox_client::Client,
    name: &str,
    max_bytes: u32,
) -> (String, usize, String) {
    let (mut text, mut cursor, mut polls) = (String::new(), 0, 0);
    loop {
        let r = c
            .exec()
            .logs(proto::ExecLogsRequest {
                execution_name: name.into(),
                cursor,
                max_bytes,
                ..Default::default()
            })
            .await
            .expect("Logs")
            .into_inner();
        polls += 1;
        text.push_str(&r.logs);
        cursor = r.next_cursor;
        if r.complete {
            return (text, polls, r.klavis_status);
        }
        if r.logs.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_failing_script_is_failed_with_its_output_in_the_log() {
    let agent = agent_with("", "");
    let c = client(&agent).await;
    acquire(&c, "lease-x").await;
    let main =
        "import sys\nprint('before the failure')\nprint('oops', file=sys.stderr)\nsys.exit(3)\n";
    let up = upload(&c, "bad", targz(&[("main.py", main)]))
        .await
        .expect("Upload");
    assert_eq!((up.files, up.replaced), (1, false));
    assert_eq!(status(&c, "bad").await.klavis_status, "pending");
    start(&c, "bad").await;
    let (text, _, last) = read_all(&c, "bad", 0).await;
    assert_eq!(last, "failed", "{text}");
    assert!(
        text.contains("before the failure\noops\n"),
        "stdout and stderr as written: {text}"
    );
    assert!(text.contains("main.py ended with exit code 3"), "{text}");
    let st = status(&c, "bad").await;
    assert_eq!(st.klavis_status, "failed");
    assert_eq!(st.exit_code, Some(3));
    assert!(st.message.contains("exit code 3"), "{st:?}");
    // Started again, it runs again with a fresh log.
    start(&c, "bad").await;
    let (again, _, _) = read_all(&c, "bad", 0).await;
    assert_eq!(again.matches("before the failure").count(), 1, "{again}");
}

#[tokio::test]
async fn multibyte_output_reassembles_exactly_through_tiny_polls() {
    let agent = agent_with("", "");
    let c = client(&agent).await;
    acquire(&c, "lease-mb").await;
    // Written in pieces that split characters between writes, with pauses,
    // so polls meet the log while a character is half written.
    let main = r#"
import sys, time
text = ("héllo wörld — ✓ 😀 naïve 日本語 ∑ \n" * 40).encode()
for i in range(0, len(text), 5):
    sys.stdout.buffer.write(text[i:i + 5])
    sys.stdout.buffer.flush()
    if i % 200 == 0:
        time.sleep(0.01)
"#;
    upload(&c, "mb", targz(&[("main.py", main)]))
        .await
        .expect("Upload");
    start(&c, "mb").await;
    let expected = "héllo wörld — ✓ 😀 naïve 日本語 ∑ \n".repeat(40);
    let (text, polls, last) = read_all(&c, "mb", 5).await;
    assert_eq!(last, "completed");
    assert!(polls > 300, "{polls} polls");
    let body = text
        .strip_suffix("[sandbox-agent] main.py exited with code 0\n")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(body, expected);
    assert!(!text.contains('\u{FFFD}'));
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn a_large_output_is_capped_with_a_marker_and_memory_stays_flat() {
    let agent = agent_with("", "[exec]\nlog_max_bytes = 65536\n");
    let c = client(&agent).await;
    acquire(&c, "lease-big").await;
    // 400 MB of output: far beyond the cap, and beyond any memory budget.
    let main = "import sys\nline = b'x' * 1023 + b'\\n'\nfor _ in range(400 * 1024):\n    sys.stdout.buffer.write(line)\n";
    upload(&c, "big", targz(&[("main.py", main)]))
        .await
        .expect("Upload");
    let before = rss_kib(agent.child.id());
    start(&c, "big").await;
    let mut peak = before;
    let st = eventually_async(
        Duration::from_secs(120),
        "the big script ends",
        async || {
            peak = peak.max(rss_kib(agent.child.id()));
            let s = status(&c, "big").await;
            when(s.finished_at_ms > 0, || format!("{s:?}")).map(|()| s)
        },
    )
    .await;
    assert_eq!(st.klavis_status, "completed", "{st:?}");
    assert!(st.log_capped && st.log_bytes <= 65536, "{st:?}");
    let (text, _, _) = read_all(&c, "big", 0).await;
    assert!(
        text.contains("the log reached its limit of 65536 bytes"),
        "{}",
        &text[text.len().saturating_sub(400)..]
    );
    assert!(text.contains("bytes of output were discarded"));
    let log = std::fs::metadata(agent.dir.path().join("exec/big/output.log")).expect("log file");
    assert!(log.len() <= 65536, "{} bytes on disk", log.len());
    assert!(
        peak < before + 64 * 1024,
        "agent RSS grew from {before} KiB to {peak} KiB"
    );
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let agent = agent_with("", "");
    let c = client(&agent).await;
    let e = upload(&c, "x", targz(&[("main.py", "print(1)")]))
        .await
        .expect_err("not leased");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("not leased"), "{}", e.message());
    acquire(&c, "lease-e").await;
    let e = c
        .exec()
        .status(proto::ExecStatusRequest {
            execution_name: "nope".into(),
            ..Default::default()
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);
    assert!(
        e.message().contains("no execution named \"nope\""),
        "{}",
        e.message()
    );
    let e = upload(&c, "../up", targz(&[("main.py", "")]))
        .await
        .expect_err("bad name");
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = upload(&c, "nomain", targz(&[("run.py", "print(1)")]))
        .await
        .expect_err("no main.py");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("main.py"), "{}", e.message());
    let e = upload(&c, "junk", b"this is not an archive".to_vec())
        .await
        .expect_err("junk");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = c
        .exec()
        .status(proto::ExecStatusRequest {
            lease_id: "another".into(),
            execution_name: "x".into(),
        })
        .await
        .expect_err("another lease");
    assert_eq!(e.code(), Code::NotFound);
    // Nothing half-made is left behind by the failed uploads.
    let left: Vec<_> = std::fs::read_dir(agent.dir.path().join("exec"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// Pids of processes whose command line contains `marker`.
fn with_marker(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
        {
            out.push(pid);
        }
    }
    out
}

/// A script that leaves a child and a grandchild (in a new session, so
/// only a tree kill finds it) sleeping for `secs` seconds, a number no
/// other process uses: every one of them has it on its command line.
fn sleeper(secs: &str) -> String {
    format!(
        r#"
import subprocess, time
subprocess.Popen(["sleep", "{secs}"])
subprocess.Popen(["setsid", "sh", "-c", "sleep {secs} & sleep {secs}; wait"])
print("children started", flush=True)
time.sleep(1000)
"#
    )
}

#[tokio::test]
async fn release_kills_a_running_script_and_all_its_children() {
    release_kills_the_tree("").await;
}

#[tokio::test]
async fn release_kills_the_tree_without_cgroups_too() {
    release_kills_the_tree("[supervisor]\ncgroup = \"off\"\n").await;
}

async fn release_kills_the_tree(config: &str) {
    let agent = agent_with("", config);
    let c = client(&agent).await;
    acquire(&c, "lease-k").await;
    // Distinct per test process and per variant (they run in parallel).
    let variant = if config.is_empty() { 0 } else { 45_000 };
    let marker = format!("{}", 900_000 + variant + std::process::id() % 45_000);
    upload(&c, "sleepy", targz(&[("main.py", &sleeper(&marker))]))
        .await
        .expect("Upload");
    start(&c, "sleepy").await;
    eventually(Duration::from_secs(60), "the children run", || {
        let n = with_marker(&marker).len();
        when(n >= 3, || format!("{n} processes"))
    });
    // Re-using the name kills the running one first.
    let up = upload(&c, "sleepy", targz(&[("main.py", &sleeper(&marker))]))
        .await
        .expect("replace");
    assert!(up.replaced && up.killed_running, "{up:?}");
    assert!(
        with_marker(&marker).is_empty(),
        "the replaced run left {:?}",
        with_marker(&marker)
    );
    start(&c, "sleepy").await;
    eventually(Duration::from_secs(60), "the children run again", || {
        let n = with_marker(&marker).len();
        when(n >= 3, || format!("{n} processes"))
    });
    // Reset ends every execution too, and keeps the lease open to new ones.
    c.agent()
        .reset(proto::ResetRequest {
            lease_id: "lease-k".into(),
        })
        .await
        .expect("Reset");
    let left = with_marker(&marker);
    assert!(left.is_empty(), "left running after Reset: {left:?}");
    let e = c
        .exec()
        .status(proto::ExecStatusRequest {
            execution_name: "sleepy".into(),
            ..Default::default()
        })
        .await
        .expect_err("gone with the reset");
    assert_eq!(e.code(), Code::NotFound);
    upload(&c, "sleepy", targz(&[("main.py", &sleeper(&marker))]))
        .await
        .expect("upload after the reset");
    start(&c, "sleepy").await;
    eventually(
        Duration::from_secs(60),
        "the children run once more",
        || {
            let n = with_marker(&marker).len();
            when(n >= 3, || format!("{n} processes"))
        },
    );
    release(&c, "lease-k").await;
    let left = with_marker(&marker);
    assert!(left.is_empty(), "left running after Release: {left:?}");
    assert!(
        std::fs::read_dir(agent.dir.path().join("exec"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "execution directories removed"
    );
    let e = c
        .exec()
        .status(proto::ExecStatusRequest {
            execution_name: "sleepy".into(),
            ..Default::default()
        })
        .await
        .expect_err("gone with the lease");
    assert_eq!(e.code(), Code::FailedPrecondition);
    let _ = std::io::stderr().flush();
}

#[tokio::test]
async fn packages_the_sandbox_may_not_install_fail_clearly() {
    // Installing is off here; packages already installed still pass.
    let agent = agent_with("", "[exec]\npackages = \"off\"\n");
    let c = client(&agent).await;
    acquire(&c, "lease-p").await;
    let main = "print('ran')\n";
    upload(
        &c,
        "have",
        targz(&[("main.py", main), ("packages.txt", "# present\ncurl\n")]),
    )
    .await
    .expect("Upload");
    start(&c, "have").await;
    let (text, _, last) = read_all(&c, "have", 0).await;
    assert_eq!(last, "completed", "{text}");
    assert!(text.contains("already installed: curl\nran\n"), "{text}");

    let missing = "sandbox-agent-no-such-package";
    upload(
        &c,
        "lack",
        targz(&[
            ("main.py", main),
            ("packages.txt", &format!("curl {missing}\n")),
        ]),
    )
    .await
    .expect("Upload");
    start(&c, "lack").await;
    let (text, _, last) = read_all(&c, "lack", 0).await;
    assert_eq!(last, "failed", "{text}");
    assert!(!text.contains("ran\n"), "main.py must not run: {text}");
    let st = status(&c, "lack").await;
    assert!(
        st.message.contains(missing)
            && !st.message.contains("curl ")
            && st.message.contains("exec.packages is \"off\""),
        "{st:?}"
    );
    assert!(text.contains(&st.message), "{text}");

    // A name that is not a Debian package name (an apt-get option, say).
    upload(
        &c,
        "opt",
        targz(&[("main.py", main), ("packages.txt", "-o\n")]),
    )
    .await
    .expect("Upload");
    start(&c, "opt").await;
    let (_, _, last) = read_all(&c, "opt", 0).await;
    assert_eq!(last, "failed");
    assert!(
        status(&c, "opt")
            .await
            .message
            .contains("not a Debian package name"),
        "{:?}",
        status(&c, "opt").await
    );
}

/// Runs `script` as execution `name` to its end; returns (status, log).
pub(crate) async fn run_to_end(
    c: &sandbox_client::Client,
    name: &str,
    script: &str,
) -> (String, String) {
    upload(c, name, targz(&[("main.py", script)]))
        .await
        .expect("Upload");
    start(c, name).await;
    let (log, _, status) = read_all(c, name, 1 << 20).await;
    (status, log)
}

/// A root agent runs scripts unprivileged, each lease in a home of its
/// own: a lease's global git config, files in its home and a process that
/// left its session and tried to leave its cgroup are all gone when the
/// next lease starts (the attack of issue 27, findings 3 and 4). The
/// ghost is seen running, its heartbeat going, until the Release; after
/// it, it is gone and its heartbeat stopped. Here its script runs until
/// the Release.
#[tokio::test]
async fn nothing_of_a_lease_reaches_the_next_one() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    nothing_reaches_the_next_lease("", Script::RunsOn).await;
}

/// The same without cgroups, the script ending at once: the ghost, out of
/// its session and process group, outlives its execution (no tree kill
/// finds it), and only the Release, which kills every process of the
/// tenant below the agent, ends it.
#[tokio::test]
async fn a_ghost_that_outlived_its_execution_dies_at_release() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    nothing_reaches_the_next_lease("[supervisor]\ncgroup = \"off\"\n", Script::Ends).await;
}

/// Whether the script that leaves the ghost ends, or runs until the Release.
#[derive(PartialEq)]
enum Script {
    Ends,
    RunsOn,
}

/// The ghost's heartbeat: (its pid, its count of beats), once it beats.
fn heartbeat(file: &std::path::Path) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(file).ok()?;
    let (pid, beats) = text.trim().split_once(' ')?;
    Some((pid.parse().ok()?, beats.parse().ok()?))
}

/// Waits until the ghost beats again after `beats`; its pid.
fn beats_after(file: &std::path::Path, beats: u64) -> u32 {
    eventually(
        Duration::from_secs(60),
        "the ghost's heartbeat",
        || match heartbeat(file) {
            Some((pid, n)) if n > beats => Ok(pid),
            other => Err(format!("{other:?}")),
        },
    )
}

async fn nothing_reaches_the_next_lease(config: &str, script: Script) {
    let agent = agent_with("", config);
    let c = client(&agent).await;
    acquire(&c, "lease-1").await;
    let marker = format!("ghost-{}-{}", std::process::id(), config.len());
    // Where the ghost beats: a directory of the test's, the tenant's to
    // write (outside the lease's home, so the test still reads it after).
    let beat_dir = agent.dir.path().join("heartbeat");
    std::fs::create_dir(&beat_dir).expect("heartbeat dir");
    std::fs::set_permissions(&beat_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let beat = beat_dir.join("beat");
    let then = match script {
        Script::Ends => "time.sleep(0.5)",
        Script::RunsOn => "time.sleep(3600)",
    };
    let plant = format!(
        r#"
import os, subprocess, sys, time
print("uid:", os.getuid())
subprocess.run(["git", "config", "--global", "core.fsmonitor", "touch /tmp/pwned"], check=True)
open(os.path.join(os.environ["HOME"], "left-by-lease-1"), "w").write("x")
BEAT = """
import os, sys, time
n = 0
while True:
    n += 1
    with open(sys.argv[1] + ".new", "w") as f:
        f.write(f"{{os.getpid()}} {{n}}")
    os.rename(sys.argv[1] + ".new", sys.argv[1])
    time.sleep(0.05)
"""
if os.fork() == 0:
    os.setsid()
    for f in ("/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/unified/cgroup.procs"):
        try:
            open(f, "w").write(str(os.getpid()))
        except OSError:
            pass
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", BEAT, "{beat}", "{marker}"])
    os._exit(0)
{then}
"#,
        beat = beat.display(),
    );
    upload(&c, "plant", targz(&[("main.py", &plant)]))
        .await
        .expect("Upload");
    start(&c, "plant").await;
    if script == Script::Ends {
        let (log, _, status) = read_all(&c, "plant", 1 << 20).await;
        assert_eq!(status, "completed", "{log}");
        assert!(log.contains("uid: 1000"), "{log}");
    }
    // The ghost lives before the Release (after its execution ended, when
    // it did): it beats, and it runs as the tenant.
    let seen = beats_after(&beat, 0);
    let (_, n) = heartbeat(&beat).expect("a beat");
    let pid = beats_after(&beat, n);
    assert_eq!(pid, seen, "one ghost");
    assert_eq!(
        with_marker(&marker),
        [pid],
        "the ghost, by its command line"
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the ghost");
    assert!(
        status.lines().any(|l| l.starts_with("Uid:\t1000\t")),
        "the ghost runs as the tenant: {status}"
    );
    if script == Script::RunsOn {
        assert_eq!(status_of(&c, "plant").await, "running");
    }
    release(&c, "lease-1").await;
    assert!(
        with_marker(&marker).is_empty(),
        "left running after Release: {:?}",
        with_marker(&marker)
    );
    // Its heartbeat stopped with it.
    let last = heartbeat(&beat);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        heartbeat(&beat),
        last,
        "the ghost still beats after Release"
    );
    acquire(&c, "lease-2").await;
    let check = r#"
import os, subprocess
got = subprocess.run(["git", "config", "--global", "core.fsmonitor"], capture_output=True, text=True).stdout.strip()
print("inherited config:", repr(got))
print("home left:", os.path.exists(os.path.join(os.environ["HOME"], "left-by-lease-1")))
"#;
    let (status, log) = run_to_end(&c, "check", check).await;
    assert_eq!(status, "completed", "{log}");
    assert!(log.contains("inherited config: ''"), "{log}");
    assert!(log.contains("home left: False"), "{log}");
}

/// The Klavis status of execution `name` now.
async fn status_of(c: &sandbox_client::Client, name: &str) -> String {
    c.exec()
        .logs(proto::ExecLogsRequest {
            execution_name: name.into(),
            cursor: 0,
            max_bytes: 1,
            ..Default::default()
        })
        .await
        .expect("Logs")
        .into_inner()
        .klavis_status
}

/// The scripts' data-plane token is the lease's: after a Release, the
/// token a script of that lease saw opens nothing, and the next lease's
/// scripts get another (finding 2).
#[tokio::test]
async fn the_scripts_token_dies_with_its_lease() {
    let agent = agent_with("", "");
    let c = client(&agent).await;
    acquire(&c, "lease-1").await;
    let show = r#"
import os
print("url:", os.environ["SANDBOX_MCP_URL"])
print("token:", os.environ["SANDBOX_MCP_TOKEN"])
"#;
    let field = |log: &str, k: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no {k} in {log}"))
    };
    let (status, log) = run_to_end(&c, "show", show).await;
    assert_eq!(status, "completed", "{log}");
    let (url, old) = (field(&log, "url:"), field(&log, "token:"));
    let code = |token: &str| {
        let out = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args(["-H", &format!("authorization: Bearer {token}")])
            .args(["-H", "content-type: application/json"])
            .args(["-H", "accept: application/json, text/event-stream"])
            .args(["-d", r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#])
            .arg(format!("{url}/filesystem/mcp"))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(code(&old), "200", "the lease's own token works");
    release(&c, "lease-1").await;
    assert_eq!(code(&old), "401", "a released lease's token");
    acquire(&c, "lease-2").await;
    assert_eq!(
        code(&old),
        "401",
        "the last lease's token in the next lease"
    );
    let (status, log) = run_to_end(&c, "show", show).await;
    assert_eq!(status, "completed", "{log}");
    let new = field(&log, "token:");
    assert_ne!(new, old);
    assert_eq!(code(&new), "200", "the new lease's token works");
}

/// Executions have their own cgroup names: one named after the agent's own
/// jobs (`mail`, the mail service; `server-data`, a data tool) stops
/// neither the mail service nor a load running beside it. (Before, an
/// execution `mail` took the group `job.mail` and creating it killed the
/// mail service; with cgroups only, as without them groups play no part.)
#[tokio::test]
async fn executions_named_like_the_agents_own_jobs_stop_nothing() {
    const POSTE: &str = "poste_email_toolathlon";
    let agent = agent_with("", "mail_ports = \"auto\"\n");
    let c = client(&agent).await;
    let lease = c
        .agent()
        .acquire(proto::AcquireRequest {
            lease_id: "lease-m".into(),
            server_names: vec![POSTE.into()],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()))
        .into_inner()
        .lease
        .expect("lease");
    let imap = match lease.auth_data[POSTE].fields["imap_port"].kind {
        Some(prost_types::value::Kind::NumberValue(n)) => n as u16,
        ref other => panic!("imap_port: {other:?}"),
    };
    let accepts = || std::net::TcpStream::connect(("127.0.0.1", imap)).is_ok();
    let load = async || {
        c.servers()
            .load_data(proto::LoadDataRequest {
                server_name: POSTE.into(),
                default_data: true,
                ..Default::default()
            })
            .await
    };
    assert!(accepts());

    upload(&c, "mail", targz(&[("main.py", "print('named mail')\n")]))
        .await
        .expect("Upload");
    start(&c, "mail").await;
    let (text, _, last) = read_all(&c, "mail", 0).await;
    assert_eq!(last, "completed", "{text}");
    assert!(accepts(), "the execution `mail` stopped the mail service");
    load()
        .await
        .unwrap_or_else(|e| panic!("a load after the execution `mail`: {e}"));

    // A load (a `server-data` job) while an execution `server-data` runs.
    let main = "import time\nprint('started', flush=True)\ntime.sleep(3)\nprint('done')\n";
    upload(&c, "server-data", targz(&[("main.py", main)]))
        .await
        .expect("Upload");
    start(&c, "server-data").await;
    eventually_async(Duration::from_secs(60), "the script started", async || {
        let r = c
            .exec()
            .logs(proto::ExecLogsRequest {
                execution_name: "server-data".into(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().logs)
            .unwrap_or_default();
        when(r.contains("started"), || r.clone())
    })
    .await;
    let loaded = load().await;
    let (text, _, last) = read_all(&c, "server-data", 0).await;
    loaded.unwrap_or_else(|e| panic!("a load beside the execution `server-data`: {e}"));
    assert_eq!(last, "completed", "{text}");
    assert!(text.contains("started\ndone\n"), "{text}");
    assert!(accepts(), "the mail service stopped");
}

/// What one execution leaves where Python looks for modules never reaches
/// the next one (issue 30: executions without requirements.txt share the
/// agent's prepared base venv, each run a copy of its own). Execution A
/// plants a module, a `.pth` file and a `sitecustomize` in every
/// site-packages it can find (its own venv, the user site of the lease's
/// home, the interpreter's, the agent's base venv) and tries to reach the
/// next execution's directory; B, run after it, must import none of them.
#[tokio::test]
async fn an_execution_leaves_nothing_the_next_one_imports() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    let agent = agent_with("", "");
    let c = client(&agent).await;
    acquire(&c, "lease-plant").await;
    let base = state_dir(&agent).join("exec-base-venv");
    let exec_root = agent.dir.path().join("exec");
    let plant = format!(
        r#"
import glob, os, site, sys, sysconfig
base_py = sysconfig.get_paths(vars={{"base": sys.base_prefix, "platbase": sys.base_prefix}})["purelib"]
targets = [
    ("own venv", sysconfig.get_paths()["purelib"]),
    ("user site", site.getusersitepackages()),
    ("interpreter", base_py),
    ("stdlib", sysconfig.get_paths()["stdlib"]),
    ("base venv", (glob.glob("{base}/lib/python*/site-packages") or ["{base}/lib/site-packages"])[0]),
    ("next execution", "{exec_root}/check/venv/lib/python%d.%d/site-packages" % sys.version_info[:2]),
]
print("uid:", os.getuid(), "in a venv:", sys.prefix != sys.base_prefix)
try:
    import planted_mod
    found = True
except ImportError:
    found = False
print("before:", repr(os.environ.get("PLANTED", "")), found)
try:
    os.rename("{base}", "{base}.moved")
    print("moved the base venv")
except OSError as e:
    print("refused moving the base venv", e)
for where, d in targets:
    try:
        os.makedirs(d, exist_ok=True)
        tag = where.replace(" ", "_")
        open(os.path.join(d, "zz_planted.pth"), "w").write("import os; os.environ['PLANTED'] = os.environ.get('PLANTED', '') + '{{}} '\n".format(tag))
        open(os.path.join(d, "sitecustomize.py"), "w").write("import os; os.environ['PLANTED'] = os.environ.get('PLANTED', '') + 'sitecustomize_{{}} '\n".format(tag))
        open(os.path.join(d, "planted_mod.py"), "w").write("WHERE = '{{}}'\n".format(tag))
        print("planted in", where, d)
    except OSError as e:
        print("refused in", where, d, e)
"#,
        base = base.display(),
        exec_root = exec_root.display()
    );
    let (status, log) = run_to_end(&c, "plant", &plant).await;
    assert_eq!(status, "completed", "{log}");
    assert!(log.contains("uid: 1000"), "{log}");
    // The attack reached what a tenant can write (its home; its own venv
    // when it has one), never the agent's base venv.
    assert!(log.contains("planted in user site"), "{log}");
    let planted = log;
    let check = r#"
import os, sys
print("planted:", repr(os.environ.get("PLANTED", "")))
try:
    import planted_mod
    print("imported planted_mod:", planted_mod.WHERE, planted_mod.__file__)
except ImportError:
    print("no planted_mod")
sc = sys.modules.get("sitecustomize")
print("sitecustomize:", getattr(sc, "__file__", None))
"#;
    for round in 0..2 {
        let (status, log) = run_to_end(&c, "check", check).await;
        assert_eq!(status, "completed", "round {round}: {log}");
        assert!(log.contains("no planted_mod"), "round {round}: {log}");
        assert!(log.contains("planted: ''"), "round {round}: {log}");
        assert!(
            !log.contains("zz_planted") && !log.contains("sitecustomize: /"),
            "round {round}: {log}"
        );
    }
    assert!(planted.contains("refused in base venv"), "{planted}");
    assert!(
        planted.contains("refused moving the base venv"),
        "{planted}"
    );
    // A run again of the planting execution starts from a clean venv too.
    start(&c, "plant").await;
    let (log, _, status) = read_all(&c, "plant", 1 << 20).await;
    assert_eq!(status, "completed", "{log}");
    assert!(log.contains("before: '' False"), "{log}");
}

/// packages.txt is installed by the agent's own apt-get (exec.apt_get, by
/// absolute path, with the system's PATH): an apt-get a tenant planted in
/// its venv, first on the execution's PATH, never runs as root (finding of
/// the attack on issue 27: root in a VM).
#[tokio::test]
async fn a_planted_apt_get_never_runs_as_the_agent() {
    if !root_or_skip("packages.txt runs apt-get as root") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // A stand-in for the system's apt-get that only says it ran.
    let real = dir.path().join("apt-get");
    let ran = dir.path().join("real-apt-ran");
    std::fs::write(
        &real,
        format!("#!/bin/sh\necho \"$@\" >> {}\nexit 0\n", ran.display()),
    )
    .expect("stand-in");
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let agent = agent_with("", &format!("[exec]\napt_get = \"{}\"\n", real.display()));
    let c = client(&agent).await;
    acquire(&c, "lease-apt").await;
    let plant = r##"
import os
fake = os.path.join(os.environ["VIRTUAL_ENV"], "bin", "apt-get")
open(fake, "w").write("#!/bin/sh\nid > " + os.environ["AGENT_WORKSPACE"] + "/apt-proof\nexit 0\n")
os.chmod(fake, 0o755)
open("packages.txt", "w").write("zz-no-such-package-xyz\n")
print("planted")
"##;
    let (status, log) = run_to_end(&c, "aptx", plant).await;
    assert_eq!(status, "completed", "{log}");
    // The same execution again: its venv (with the plant) and the
    // packages.txt it wrote are reused.
    start(&c, "aptx").await;
    let (log, _, status) = read_all(&c, "aptx", 1 << 20).await;
    assert_eq!(status, "completed", "{log}");
    let ws = agent.dir.path().join("ws");
    assert!(
        !ws.join("apt-proof").exists(),
        "the planted apt-get ran: {:?}",
        std::fs::read_to_string(ws.join("apt-proof"))
    );
    let called = std::fs::read_to_string(&ran).expect("the configured apt-get ran");
    assert!(called.contains("zz-no-such-package-xyz"), "{called}");
}

/// IPC objects and keys outlive the processes that made them: System V
/// shared memory, message queues and semaphores, POSIX message queues and
/// the uid's keyrings left by one lease are gone when the next lease of
/// the same agent starts (the attack on issue 27: a recycled sandbox's
/// next tenant read them all). The agent is PID 1 of its own namespaces,
/// as in a VM or the process backend.
#[tokio::test]
async fn no_ipc_object_or_key_reaches_the_next_lease() {
    if !root_or_skip("the agent as PID 1 of its own namespaces") {
        return;
    }
    let dir = pid1_dir();
    let agent = Agent::start_pid1(dir, &[]);
    let c = client(&agent).await;
    acquire_bare(&c, "lease-1").await;
    let plant = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0x1337, 4096, 0o1666)
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, b"LEFT-BY-LEASE-1\0", 16)
libc.shmdt(ctypes.c_void_p(addr))
print("shm", shm, "msg", libc.msgget(0x1338, 0o1666), "sem", libc.semget(0x1339, 1, 0o1666))
rt = ctypes.CDLL("librt.so.1", use_errno=True)
print("mq", rt.mq_open(b"/lease1", os.O_CREAT | os.O_RDWR, 0o666, None))
# add_key(2) into the uid's user keyring (KEY_SPEC_USER_KEYRING, -4).
key = libc.syscall(248, b"user", b"lease1", b"LEFT-BY-LEASE-1", 15, -4)
print("key", key, "errno", ctypes.get_errno())
"#;
    let (status, log) = run_to_end(&c, "plant", plant).await;
    assert_eq!(status, "completed", "{log}");
    assert!(!log.contains(" -1"), "planting failed: {log}");
    // The probe works: another process of lease 1 finds the key
    // (keyctl(2) KEYCTL_SEARCH, 10, in the user keyring).
    let (status, log) = run_to_end(&c, "still", SEARCH_KEY).await;
    assert_eq!(status, "completed", "{log}");
    assert!(
        log.lines()
            .find_map(|l| l.strip_prefix("key: "))
            .and_then(|r| r.split_whitespace().next()?.parse::<i64>().ok())
            .is_some_and(|id| id > 0),
        "lease 1 cannot find its own key, so the check below could not fail:\n{log}"
    );
    release(&c, "lease-1").await;
    acquire_bare(&c, "lease-2").await;
    let look = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("shm:", libc.shmget(0x1337, 0, 0))
print("msg:", libc.msgget(0x1338, 0))
print("sem:", libc.semget(0x1339, 0, 0))
rt = ctypes.CDLL("librt.so.1", use_errno=True)
print("mq:", rt.mq_open(b"/lease1", os.O_RDONLY))
"#;
    let look = format!("{look}{SEARCH_KEY}");
    let (status, log) = run_to_end(&c, "look", &look).await;
    assert_eq!(status, "completed", "{log}");
    for what in ["shm", "msg", "sem", "mq", "key"] {
        assert!(
            log.contains(&format!("{what}: -1")),
            "{what} of lease 1 is still there:\n{log}"
        );
    }
    // Not found (ENOKEY, 126), rather than a search that cannot run.
    assert!(log.contains("key: -1 errno 126"), "{log}");
}

/// A script printing `key: <id> errno <errno>`: lease 1's key, searched
/// for in the uid's user keyring (keyctl KEYCTL_SEARCH).
const SEARCH_KEY: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
found = libc.syscall(250, 10, -4, b"user", b"lease1", 0)
print("key:", found, "errno", ctypes.get_errno() if found < 0 else 0)
"#;

/// Acquires `id` with no server (the execution API only).
pub(crate) async fn acquire_bare(c: &sandbox_client::Client, id: &str) {
    c.agent()
        .acquire(proto::AcquireRequest {
            lease_id: id.into(),
            no_servers: true,
            ..Default::default()
        })
        .await
        .expect("Acquire");
}
