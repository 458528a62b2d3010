//! The agent (root) never performs a privileged file operation through a
//! path a tenant can write (issue 35): the execution log, packages.txt,
//! export, the clean-ups at Release and Reset. Each test plays the tenant
//! from a script (uid 1000) against the real agent binary; canaries are
//! root-only files the tenant cannot reach, which must never be read,
//! written or packed.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

use crate::common::mcp::*;
use crate::common::servers::{client, release, reset};
use crate::common::*;
use crate::exec::{acquire, read_all, run_to_end, start, status, targz, upload};
use sandbox_client::proto;
use tonic::Code;

/// Root-only canaries: a 0700 directory holding a 0600 file with a secret;
/// `missing` names files that must never be created.
struct Canaries {
    dir: tempfile::TempDir,
    secret: String,
}

impl Canaries {
    fn new() -> Canaries {
        Canaries::within(tempfile::tempdir().expect("tempdir"))
    }

    /// Canaries in `dir` (made root-only here).
    fn within(dir: tempfile::TempDir) -> Canaries {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        let secret = format!("CANARY-SECRET-{}", std::process::id());
        let f = dir.path().join("canary");
        std::fs::write(&f, &secret).expect("canary");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::create_dir(dir.path().join("sub")).expect("sub");
        std::fs::write(dir.path().join("sub/inner"), &secret).expect("inner");
        Canaries { dir, secret }
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("canary")
    }

    /// A path in the root-only directory that must never come to exist.
    fn missing(&self, what: &str) -> PathBuf {
        self.dir.path().join(format!("created-{what}"))
    }

    /// What is in the canary directory: names, sizes, mtimes, contents.
    fn snapshot(&self) -> Vec<(String, u64, i64, i64, String)> {
        let mut out = Vec::new();
        let mut stack = vec![self.dir.path().to_owned()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
                let m = e.path().symlink_metadata().expect("stat");
                if m.is_dir() {
                    stack.push(e.path());
                }
                let body = if m.is_file() {
                    std::fs::read_to_string(e.path()).unwrap_or_default()
                } else {
                    String::new()
                };
                out.push((
                    e.path().display().to_string(),
                    m.len(),
                    m.mtime(),
                    m.mtime_nsec(),
                    body,
                ));
            }
        }
        out.sort();
        out
    }
}

/// A root agent running tenants as uid 1000, its executions' root and
/// its client.
async fn tenant_agent(env: &[(&str, &str)]) -> (Agent, sandbox_client::Client, PathBuf) {
    let agent = agent_with_env("", "", env);
    let c = client(&agent).await;
    let root = agent.dir.path().join("exec");
    (agent, c, root)
}

/// The execution log race of issue 35 (finding 4): a script keeps putting
/// symlinks to root-only canaries where the agent creates an execution's
/// `output.log` (and every other entry of the execution directory) while
/// the name is executed again and again. No canary is created or written,
/// and every run's log holds its output.
#[tokio::test]
async fn the_output_log_race_never_writes_through_a_link() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    let canaries = Canaries::new();
    let before = canaries.snapshot();
    let (agent, c, root) = tenant_agent(&[]).await;
    acquire(&c, "lease-race").await;
    let victim = root.join("victim");
    let attacker = format!(
        r#"
import os, time
victim = "{victim}"
targets = ["{file}", "{missing}"]
done = 0
planted = 0
for i in range(3000):
    for name in ("output.log", "venv", "work", "output.log.tmp"):
        for t in targets:
            tmp = os.path.join(victim, ".plant-%d" % i)
            try:
                os.symlink(t, tmp)
                os.rename(tmp, os.path.join(victim, name))
                planted += 1
            except OSError:
                pass
            try:
                os.link(t, os.path.join(victim, name))
                planted += 1
            except OSError:
                pass
    try:
        os.symlink("{file}", os.path.join(os.path.dirname(victim), "victim"))
        planted += 1
    except OSError:
        pass
    done += 1
    open("count.tmp", "w").write("%d %d" % (done, planted))
    os.rename("count.tmp", "count")
    time.sleep(0.003)
"#,
        victim = victim.display(),
        file = canaries.file().display(),
        missing = canaries.missing("log").display(),
    );
    upload(&c, "attacker", targz(&[("main.py", &attacker)]))
        .await
        .expect("Upload attacker");
    start(&c, "attacker").await;
    let count_file = root.join("attacker/work/count");
    let count = || -> Result<(u64, u64), String> {
        let s = std::fs::read_to_string(&count_file).map_err(|e| e.to_string())?;
        let mut w = s.split_whitespace().map(|n| n.parse::<u64>().unwrap_or(0));
        Ok((w.next().unwrap_or(0), w.next().unwrap_or(0)))
    };
    eventually(Duration::from_secs(60), "the attacker runs", count);
    for round in 0..15 {
        let script = format!("print('victim round {round}')\n");
        upload(&c, "victim", targz(&[("main.py", &script)]))
            .await
            .expect("Upload victim");
        // The attacker has had its go at the fresh directory.
        let seen = count().expect("count").0;
        eventually(Duration::from_secs(30), "the attacker tries again", || {
            let now = count()?.0;
            when(now >= seen + 2, || format!("{now} rounds"))
        });
        start(&c, "victim").await;
        let (log, _, st) = read_all(&c, "victim", 1 << 20).await;
        assert_eq!(st, "completed", "round {round}: {log}");
        assert!(
            log.contains(&format!("victim round {round}")),
            "round {round}: {log}"
        );
    }
    let (_, planted) = count().expect("count");
    assert_eq!(
        planted, 0,
        "the tenant put {planted} links into the agent's execution directory"
    );
    assert_eq!(canaries.snapshot(), before, "a canary was written");
    assert!(!canaries.missing("log").exists());
    assert!(status(&c, "attacker").await.klavis_status == "running");
    release(&c, "lease-race").await;
    drop(agent);
}

/// packages.txt is read by the agent as root: it must be a regular file
/// in `work/`, read by handle, never through a symlink (to a root-only
/// secret, to `/proc/1/environ`, to the agent's own environment, to
/// `/dev/zero`), never a FIFO (a blocking read would hold the Release
/// forever) nor a directory; and what it holds is never quoted back (issue
/// 35, findings 5 and 8).
#[tokio::test]
async fn packages_txt_is_only_ever_a_regular_file_and_never_quoted() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    let canaries = Canaries::new();
    let env_secret = format!("ENV-SECRET-{}", std::process::id());
    let (agent, c, _root) = tenant_agent(&[("S35_OPERATOR_SECRET", &env_secret)]).await;
    acquire(&c, "lease-pk").await;
    let agent_pid = agent.child.id();
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "secretlink",
            format!(
                "os.symlink('{}', 'packages.txt')",
                canaries.file().display()
            ),
            "symbolic link",
        ),
        (
            "environ1",
            "os.symlink('/proc/1/environ', 'packages.txt')".into(),
            "symbolic link",
        ),
        (
            "environagent",
            format!("os.symlink('/proc/{agent_pid}/environ', 'packages.txt')"),
            "symbolic link",
        ),
        (
            "zero",
            "os.symlink('/dev/zero', 'packages.txt')".into(),
            "symbolic link",
        ),
        ("fifo", "os.mkfifo('packages.txt')".into(), "FIFO"),
        ("dir", "os.mkdir('packages.txt')".into(), "a directory"),
        (
            "badword",
            format!("open('packages.txt', 'w').write('curl\\n{env_secret}=1\\n')"),
            "line 2, word 1",
        ),
    ];
    for (name, plant, expect) in &cases {
        let script = format!(
            "import os\nif not os.path.lexists('packages.txt'):\n    {plant}\n    print('planted')\nelse:\n    print('second run')\n"
        );
        let (st, log) = run_to_end(&c, name, &script).await;
        assert_eq!(st, "completed", "{name}: {log}");
        // Its second run reads the planted packages.txt.
        start(&c, name).await;
        let (log, _, st) = read_all(&c, name, 1 << 20).await;
        let s = status(&c, name).await;
        assert_eq!(st, "failed", "{name}: {log}");
        assert!(s.message.contains("packages.txt"), "{name}: {}", s.message);
        assert!(s.message.contains(expect), "{name}: {}", s.message);
        for secret in [&canaries.secret, &env_secret] {
            assert!(
                !log.contains(secret.as_str()) && !s.message.contains(secret.as_str()),
                "{name}: a secret reached the tenant: {} / {log}",
                s.message
            );
        }
        assert!(
            !log.contains("PATH=") && !s.message.contains("PATH="),
            "{name}: an environment reached the tenant: {log}"
        );
    }
    // The FIFO held nothing: the sandbox still releases.
    tokio::time::timeout(Duration::from_secs(120), release(&c, "lease-pk"))
        .await
        .expect("Release completes although packages.txt was a FIFO");
}

/// export-artifacts packs `work/` by handle: a script cannot replace its
/// `work/` (the execution directory is the agent's), and a `work` that is
/// a symlink (put there as root, as a breach would) is refused, never
/// followed (issue 35, finding 6).
#[tokio::test]
async fn export_never_follows_a_replaced_work_directory() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    let canaries = Canaries::new();
    let (_agent, c, root) = tenant_agent(&[]).await;
    acquire(&c, "lease-ex").await;
    let script = format!(
        r#"
import os
here = os.getcwd()
try:
    os.rename(here, here + ".moved")
    os.symlink("{dir}", here)
    print("replaced work")
except OSError as e:
    print("refused:", e.strerror)
open(os.path.join(here, "result.txt"), "w").write("mine")
"#,
        dir = canaries.dir.path().display()
    );
    let (st, log) = run_to_end(&c, "ex", &script).await;
    assert_eq!(st, "completed", "{log}");
    assert!(log.contains("refused:"), "{log}");
    let tar = export(&c, "ex").await.expect("Export");
    let listing = tar_names(&tar);
    assert!(listing.contains(&"result.txt".to_owned()), "{listing:?}");
    assert!(!contains(&tar, canaries.secret.as_bytes()), "{listing:?}");
    // As a breach would: work/ replaced by a link to the canaries.
    let work = root.join("ex/work");
    std::fs::rename(&work, root.join("ex/work.moved")).expect("move work");
    std::os::unix::fs::symlink(canaries.dir.path(), &work).expect("symlink");
    let e = export(&c, "ex")
        .await
        .expect_err("a linked work/ is refused");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("work directory"), "{e:?}");
    assert!(e.message().contains("symbolic link"), "{e:?}");
    assert!(!e.message().contains(&canaries.secret), "{e:?}");
}

/// Starting an execution that runs is refused as busy (ABORTED: the
/// host's 409), and two uploads of one name at once never fail with an
/// internal error (issue 35, finding 7: "Directory not empty").
#[tokio::test]
async fn a_second_execute_of_a_running_name_is_a_conflict() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    let (_agent, c, _root) = tenant_agent(&[]).await;
    acquire(&c, "lease-409").await;
    upload(
        &c,
        "busy",
        targz(&[("main.py", "import time\ntime.sleep(600)\n")]),
    )
    .await
    .expect("Upload");
    start(&c, "busy").await;
    let e = c
        .exec()
        .start(proto::ExecStartRequest {
            execution_name: "busy".into(),
            ..Default::default()
        })
        .await
        .expect_err("a running execution is not started twice");
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    assert!(e.message().contains("busy"), "{e:?}");
    let body = "x".repeat(1 << 20);
    for round in 0..10 {
        let a = targz(&[("main.py", "print('a')\n"), ("pad", &body)]);
        let b = targz(&[("main.py", "print('b')\n"), ("pad", &body)]);
        let (ra, rb) = tokio::join!(upload(&c, "twice", a), upload(&c, "twice", b));
        for r in [ra, rb] {
            if let Err(e) = r {
                assert_eq!(e.code(), Code::Aborted, "round {round}: {e:?}");
            }
        }
    }
    release(&c, "lease-409").await;
}

/// The execution's `work/` packed by Export, as one byte string.
pub(crate) async fn export(
    c: &sandbox_client::Client,
    name: &str,
) -> Result<Vec<u8>, tonic::Status> {
    use tokio_stream::StreamExt;
    let mut s = c
        .exec()
        .export(proto::ExecExportRequest {
            execution_name: name.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(m) = s.next().await {
        if let Some(proto::dump_response::Msg::Chunk(b)) = m?.msg {
            out.extend_from_slice(&b);
        }
    }
    Ok(out)
}

/// The entry names of a (possibly compressed) tar.
fn tar_names(tar: &[u8]) -> Vec<String> {
    let plain = plain_tar(tar);
    let mut a = tar::Archive::new(&plain[..]);
    a.entries()
        .expect("entries")
        .flatten()
        .map(|e| {
            e.path()
                .expect("path")
                .display()
                .to_string()
                .trim_start_matches("./")
                .to_owned()
        })
        .collect()
}

/// A tar, decompressed when gzip or zstd.
fn plain_tar(b: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    if b.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(b)
            .read_to_end(&mut out)
            .expect("gunzip");
    } else if b.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        out = zstd::decode_all(b).expect("unzstd");
    } else {
        out = b.to_vec();
    }
    out
}

/// Whether `needle` is in the (decompressed) archive.
fn contains(tar: &[u8], needle: &[u8]) -> bool {
    plain_tar(tar).windows(needle.len()).any(|w| w == needle)
}

/// The executions' base venv persists across leases of an agent: it is
/// the agent's alone and checked at every Release against the fingerprint
/// taken when it was made. A change (here made as root by the test, as a
/// breach would) is logged by name, the base removed and made again: the
/// next lease's scripts never run the planted code (issue 35, finding 3).
#[tokio::test]
async fn a_tampered_base_venv_is_found_at_release_and_made_again() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    let (agent, c, _root) = tenant_agent(&[]).await;
    acquire(&c, "lease-v1").await;
    let check = "import os\nprint('planted:', repr(os.environ.get('PLANTED', '')))\n";
    let (st, log) = run_to_end(&c, "first", check).await;
    assert_eq!(st, "completed", "{log}");
    assert!(log.contains("planted: ''"), "{log}");
    let base = state_dir(&agent).join("exec-base-venv");
    let site = std::fs::read_dir(base.join("lib"))
        .expect("base venv lib")
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .expect("site-packages");
    // Sealed: the agent's, not writable by anyone else.
    for p in [&base, &site] {
        let m = std::fs::metadata(p).expect("stat");
        assert_eq!((m.uid(), m.mode() & 0o022), (0, 0), "{}", p.display());
    }
    std::fs::write(
        site.join("zz_planted.pth"),
        "import os; os.environ['PLANTED'] = 'breach'\n",
    )
    .expect("plant");
    release(&c, "lease-v1").await;
    agent
        .stderr
        .wait_for(Duration::from_secs(30), |l| {
            l.contains("base venv changed") && l.contains("zz_planted.pth added")
        })
        .unwrap_or_else(|| panic!("no warning naming the change:\n{}", agent.stderr.all()));
    acquire(&c, "lease-v2").await;
    let (st, log) = run_to_end(&c, "second", check).await;
    assert_eq!(st, "completed", "{log}");
    assert!(log.contains("planted: ''"), "the planted code ran: {log}");
    assert!(!site.join("zz_planted.pth").exists());
    release(&c, "lease-v2").await;
}

/// What is in each shared temporary directory of a PID 1 agent (seen
/// through `/proc/<pid>/root`), with the directory's own mode.
fn temp_contents(pid: u32) -> Vec<(String, u32, Vec<String>)> {
    ["tmp", "var/tmp", "dev/shm"]
        .iter()
        .map(|d| {
            let p = PathBuf::from(format!("/proc/{pid}/root/{d}"));
            let mode = std::fs::symlink_metadata(&p).expect("stat").mode() & 0o7777;
            let mut names: Vec<String> = std::fs::read_dir(&p)
                .expect("read_dir")
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            (d.to_string(), mode, names)
        })
        .collect()
}

/// Plants, in each shared temporary directory of the PID 1 agent `pid`:
/// as root (through `/proc/<pid>/root`) a root file, files and a directory
/// of another uid, a symlink to the canaries; then, as the tenant, its own
/// files, a directory and symlinks (a script of the lease).
async fn plant_temp_files(c: &sandbox_client::Client, pid: u32, canaries: &Canaries, name: &str) {
    for d in ["tmp", "var/tmp", "dev/shm"] {
        let p = PathBuf::from(format!("/proc/{pid}/root/{d}"));
        std::fs::write(p.join("root-file"), "root").expect("root file");
        std::fs::write(p.join("other-file"), "other").expect("other file");
        std::fs::create_dir_all(p.join("other-dir/deeper")).expect("other dir");
        std::fs::write(p.join("other-dir/deeper/f"), "other").expect("other dir file");
        for q in [
            "other-file",
            "other-dir",
            "other-dir/deeper",
            "other-dir/deeper/f",
        ] {
            std::os::unix::fs::chown(p.join(q), Some(4242), Some(4242)).expect("chown");
        }
        std::os::unix::fs::symlink(canaries.dir.path(), p.join("root-link")).expect("symlink");
    }
    let script = format!(
        r#"
import os
for d in ("/tmp", "/var/tmp", "/dev/shm"):
    open(os.path.join(d, "tenant-file"), "w").write("t")
    os.makedirs(os.path.join(d, "tenant-dir/sub"), exist_ok=True)
    os.symlink("{dir}", os.path.join(d, "tenant-dir/sub/link"))
    os.symlink("{file}", os.path.join(d, "tenant-link"))
print("planted")
"#,
        dir = canaries.dir.path().display(),
        file = canaries.file().display(),
    );
    let (st, log) = run_to_end(c, name, &script).await;
    assert_eq!(st, "completed", "{log}");
}

/// `/tmp`, `/var/tmp` and `/dev/shm` are emptied entirely at Release and
/// Reset, whoever owns what is there (root, another uid, the tenant:
/// files, directories, symlinks, none followed), and keep their mode 1777
/// (issue 35, finding 4: a file the slot's root wrote there survived into
/// the next lease).
#[tokio::test]
async fn every_temporary_file_is_gone_after_release_and_reset() {
    if !root_or_skip("the agent as PID 1 of its own namespaces") {
        return;
    }
    let dir = pid1_dir();
    let canaries = Canaries::new();
    let before = canaries.snapshot();
    let agent = Agent::start_pid1(dir, &[]);
    let pid = pid1_agent_pid(&agent);
    let c = client(&agent).await;
    crate::exec::acquire_bare(&c, "lease-t1").await;
    plant_temp_files(&c, pid, &canaries, "plant1").await;
    assert!(temp_contents(pid).iter().all(|(_, _, n)| n.len() >= 6));
    // What the backend mounts below /tmp (the host binds a manifest or a
    // --sandbox-ro path there) is not a temporary file: it stays.
    std::fs::create_dir_all(format!("/proc/{pid}/root/tmp/bound/mnt")).expect("mkdir");
    let out = std::process::Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-m", "--"])
        .args(["mount", "-t", "tmpfs", "none", "/tmp/bound/mnt"])
        .output()
        .expect("nsenter");
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::write(format!("/proc/{pid}/root/tmp/bound/mnt/keep"), "k").expect("keep");
    release(&c, "lease-t1").await;
    assert!(PathBuf::from(format!("/proc/{pid}/root/tmp/bound/mnt/keep")).exists());
    let out = std::process::Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-m", "--"])
        .args(["umount", "/tmp/bound/mnt"])
        .output()
        .expect("nsenter");
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::remove_dir_all(format!("/proc/{pid}/root/tmp/bound")).expect("rm bound");
    for (d, mode, names) in temp_contents(pid) {
        assert_eq!(mode, 0o1777, "{d}");
        assert!(names.is_empty(), "left in {d} after Release: {names:?}");
    }
    crate::exec::acquire_bare(&c, "lease-t2").await;
    plant_temp_files(&c, pid, &canaries, "plant2").await;
    reset(&c, "lease-t2").await;
    for (d, mode, names) in temp_contents(pid) {
        assert_eq!(mode, 0o1777, "{d}");
        assert!(names.is_empty(), "left in {d} after Reset: {names:?}");
    }
    release(&c, "lease-t2").await;
    assert_eq!(canaries.snapshot(), before, "a canary changed");
}

/// A clean-up that fails (here a file in `/tmp` made immutable, which
/// cannot be removed) fails the Release: the sandbox reports `error` and
/// keeps the lease (the host replaces it) instead of going back as if
/// clean; once the cause is gone, Release completes (issue 35, finding 8).
#[tokio::test]
async fn a_failed_cleanup_puts_the_sandbox_in_error() {
    if !root_or_skip("the agent as PID 1 of its own namespaces") {
        return;
    }
    let dir = pid1_dir();
    let agent = Agent::start_pid1(dir, &[]);
    let pid = pid1_agent_pid(&agent);
    let c = client(&agent).await;
    crate::exec::acquire_bare(&c, "lease-e").await;
    let stuck = format!("/proc/{pid}/root/tmp/stuck");
    std::fs::write(&stuck, "x").expect("write");
    let chattr = |flag: &str| {
        let out = std::process::Command::new("chattr")
            .args([flag, &stuck])
            .output()
            .expect("chattr");
        assert!(out.status.success(), "chattr {flag}: {}", text(&out.stderr));
    };
    chattr("+i");
    let e = c
        .agent()
        .release(proto::ReleaseRequest {
            lease_id: "lease-e".into(),
            ..Default::default()
        })
        .await
        .expect_err("a Release whose clean-up failed");
    assert!(e.message().contains("/tmp"), "{e:?}");
    let info = c
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.status, proto::SandboxStatus::Error as i32, "{info:?}");
    chattr("-i");
    release(&c, "lease-e").await;
    let info = c
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.status, proto::SandboxStatus::Idle as i32, "{info:?}");
}

/// One systematic attack (issue 35, "Tests"): a tenant replaces every path
/// it can reach in each tree the agent touches (its execution's `work/`
/// and execution directory, the venv, its home, `/tmp`, `/var/tmp`,
/// `/dev/shm`, the workspace) with symlinks (and hard links, where the
/// kernel allows them) to root-only canaries, and tries to plant code in
/// every site-packages; then every operation that touches those trees
/// runs: Execute (packages.txt, requirements.txt, the log, the venv),
/// Export, Dump, Clear, Reset and Release (the clean-up of execution
/// directories, home and temporary files). No canary is read (its secret
/// is in no answer, log or archive), written (content and mtime
/// unchanged) or packed; and the next lease's innocent script runs
/// without any planted code.
#[tokio::test]
async fn no_operation_reads_writes_or_packs_through_a_tenants_links() {
    if !root_or_skip("the agent as PID 1 of its own namespaces") {
        return;
    }
    let dir = pid1_dir();
    let canaries = Canaries::within(pid1_dir());
    let before = canaries.snapshot();
    let agent = Agent::start_pid1(dir, &[]);
    let c = client(&agent).await;
    crate::exec::acquire_bare(&c, "lease-s1").await;
    let plant = format!(
        r#"
import glob, os, site, sys
canary, cdir = "{file}", "{dir}"
targets = [canary, cdir, os.path.join(cdir, "sub"), os.path.join(cdir, "created-by-agent")]
links = hard = 0
def swap(path):
    global links, hard
    for i, t in enumerate(targets):
        tmp = "%s.plant%d" % (path, i)
        try:
            os.symlink(t, tmp)
            os.replace(tmp, path) if i == 0 else os.replace(tmp, path + ".%d" % i)
            links += 1
        except OSError:
            try: os.unlink(tmp)
            except OSError: pass
    try:
        os.link(canary, path + ".hard")
        hard += 1
    except OSError:
        pass
work = os.getcwd()
execdir = os.path.dirname(work)
for p in ("packages.txt", "requirements.txt", "data", "out.txt"):
    swap(os.path.join(work, p))
for p in ("output.log", "venv", "work", "x"):
    swap(os.path.join(execdir, p))
home = os.environ["HOME"]
for p in (".config", ".cache", "tmp", ".gitconfig", ".local/share"):
    swap(os.path.join(home, p))
for d in ("/tmp", "/var/tmp", "/dev/shm", os.environ["AGENT_WORKSPACE"]):
    for p in ("a", "b.txt", ".hidden"):
        swap(os.path.join(d, p))
planted = 0
for d in set(glob.glob("/var/lib/**/site-packages", recursive=True) + glob.glob(os.path.join(execdir, "..", "*", "venv", "lib", "*", "site-packages")) + [site.getusersitepackages(), sys.prefix]):
    try:
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "zz_planted.pth"), "w").write("import os; os.environ['PLANTED'] = 'yes'\n")
        open(os.path.join(d, "planted_mod.py"), "w").write("X = 1\n")
        planted += 1
    except OSError:
        pass
print("links", links, "hard", hard, "planted", planted)
"#,
        file = canaries.file().display(),
        dir = canaries.dir.path().display(),
    );
    let secret = canaries.secret.clone();
    let clean = |what: &str, text: &str| {
        assert!(!text.contains(&secret), "{what}: a canary was read: {text}");
    };
    // Execute: the plants, then each execution run again over them.
    let (st, log) = run_to_end(&c, "plant", &plant).await;
    assert_eq!(st, "completed", "{log}");
    let links: u32 = log
        .split_whitespace()
        .skip_while(|w| *w != "links")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(links >= 20, "the attack planted too little to test: {log}");
    for name in ["plant"] {
        start(&c, name).await;
        let (log, _, _) = read_all(&c, name, 1 << 20).await;
        let s = status(&c, name).await;
        clean("a second Execute's log", &log);
        clean("a second Execute's status", &s.message);
    }
    assert_eq!(canaries.snapshot(), before, "after a second Execute");
    let (st, log) = run_to_end(
        &c,
        "req",
        "import os\nos.symlink('/etc/shadow', 'requirements.txt')\n",
    )
    .await;
    assert_eq!(st, "completed", "{log}");
    start(&c, "req").await;
    let (log, _, st) = read_all(&c, "req", 1 << 20).await;
    assert_eq!(st, "failed", "{log}");
    let s = status(&c, "req").await;
    assert!(s.message.contains("requirements.txt"), "{}", s.message);
    assert!(s.message.contains("symbolic link"), "{}", s.message);
    // Export and Dump pack links as links, never what they point to.
    let tar = export(&c, "plant").await.expect("Export");
    assert!(!contains(&tar, secret.as_bytes()), "Export packed a canary");
    let (dump, _) = crate::common::ws::dump(&c, proto::DumpRequest::default())
        .await
        .expect("Dump");
    assert!(!contains(&dump, secret.as_bytes()), "Dump packed a canary");
    c.workspace()
        .clear(proto::ClearRequest {})
        .await
        .expect("Clear");
    assert_eq!(canaries.snapshot(), before, "after Clear");
    // Reset, then the plants again, then Release.
    reset(&c, "lease-s1").await;
    assert_eq!(canaries.snapshot(), before, "after Reset");
    let check = "import os, sys\nprint('planted:', repr(os.environ.get('PLANTED', '')))\ntry:\n    import planted_mod\n    print('imported', planted_mod.__file__)\nexcept ImportError:\n    print('no planted_mod')\n";
    let (st, log) = run_to_end(&c, "check", check).await;
    assert_eq!(st, "completed", "{log}");
    assert!(
        log.contains("planted: ''") && log.contains("no planted_mod"),
        "after Reset: {log}"
    );
    let (st, log) = run_to_end(&c, "plant", &plant).await;
    assert_eq!(st, "completed", "{log}");
    release(&c, "lease-s1").await;
    assert_eq!(canaries.snapshot(), before, "after Release");
    crate::exec::acquire_bare(&c, "lease-s2").await;
    let (st, log) = run_to_end(&c, "check", check).await;
    assert_eq!(st, "completed", "{log}");
    assert!(
        log.contains("planted: ''") && log.contains("no planted_mod"),
        "the next lease: {log}"
    );
    release(&c, "lease-s2").await;
    assert_eq!(canaries.snapshot(), before, "a canary changed");
    for what in ["log", "agent"] {
        assert!(!canaries.missing(what).exists());
    }
    assert!(!canaries.dir.path().join("created-by-agent").exists());
    clean("the agent's log", &agent.stderr.all());
}

/// Reset admits executions again only once root has prepared the home and
/// the seeds: while its preparing waits (here for an Initialize that
/// trickles), an upload is refused; afterwards one is admitted (issue 35,
/// finding 8: a script could change the paths root was preparing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_admits_executions_only_once_the_slot_is_prepared() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    use proto::initialize_request::Msg;
    let agent = agent_with("", "[lifecycle]\nworkspace_wait_ms = 60000\n");
    let c = client(&agent).await;
    crate::exec::acquire_bare(&c, "lease-r").await;
    let archive = crate::common::ws::gzip(
        &crate::common::ws::Tar::new()
            .file("t.txt", b"trickled")
            .end(),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Header(proto::InitializeHeader::default())),
    })
    .await
    .expect("header");
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Chunk(archive[..archive.len() / 2].to_vec().into())),
    })
    .await
    .expect("half the archive");
    let c2 = c.clone();
    let init = tokio::spawn(async move {
        c2.workspace()
            .initialize(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    crate::common::ws::wait_staging(&agent.dir.path().join(".ws.sandbox-agent")).await;
    let c3 = c.clone();
    let reset = tokio::spawn(async move {
        c3.agent()
            .reset(proto::ResetRequest {
                lease_id: "lease-r".into(),
            })
            .await
    });
    let script = targz(&[("main.py", "print('hi')\n")]);
    let refused = eventually_async(
        Duration::from_secs(20),
        "an upload refused while Reset prepares",
        // An upload that began before Reset closed the executions is
        // refused at its commit instead ("released or reset meanwhile"):
        // try again.
        async || match upload(&c, "during", script.clone()).await {
            Err(e)
                if e.code() == Code::FailedPrecondition && e.message().contains("not leased") =>
            {
                Ok(e)
            }
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    assert!(refused.message().contains("not leased"), "{refused:?}");
    assert!(!reset.is_finished(), "Reset was not waiting");
    drop(tx);
    let _ = init.await.expect("join");
    reset.await.expect("join").expect("Reset");
    upload(&c, "after", script)
        .await
        .expect("admitted after Reset");
    release(&c, "lease-r").await;
}

/// Without uv each run makes its venv with `python -m venv` as the tenant,
/// in a directory the agent makes for it (the execution directory is the
/// agent's): a run and a run again both work, as the tenant.
#[tokio::test]
async fn without_uv_the_tenant_makes_its_venv_in_the_agents_directory() {
    if !root_or_skip("tenants run as uid 1000") {
        return;
    }
    let agent = agent_with("", "[exec]\nuv = \"off\"\n");
    let c = client(&agent).await;
    acquire(&c, "lease-nouv").await;
    let script = "import os, sys\nprint('uid', os.getuid(), 'venv', sys.prefix != sys.base_prefix, os.path.basename(sys.prefix))\n";
    let (st, log) = run_to_end(&c, "nouv", script).await;
    assert_eq!(st, "completed", "{log}");
    assert!(log.contains("uid 1000 venv True venv"), "{log}");
    start(&c, "nouv").await;
    let (log, _, st) = read_all(&c, "nouv", 1 << 20).await;
    assert_eq!(st, "completed", "{log}");
    assert!(log.contains("uid 1000 venv True venv"), "{log}");
    release(&c, "lease-nouv").await;
}

/// The workspace root is the tenant's, so a tenant can change the directory
/// itself: mode 0 locked every later server out of it, 1777, a `user.*`
/// attribute and POSIX ACLs (an access ACL granting another user, a
/// default ACL every new file would inherit) carried a message to the next
/// lease, its times survived. Release and Reset put the root back as the
/// agent found it.
#[tokio::test]
async fn the_workspace_root_itself_is_put_back_at_release_and_reset() {
    if !root_or_skip("the agent as PID 1 of its own namespaces") {
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = pid1_dir();
    let ws = dir.path().join("ws");
    let agent = Agent::start_pid1(dir, &[]);
    let c = client(&agent).await;
    let before = std::fs::metadata(&ws).expect("workspace");
    // The ACLs in the kernel's xattr form (version 2; entries of tag,
    // permissions, id): user 4242 may do anything there.
    let script = r#"
import os, struct
ws = os.environ["AGENT_WORKSPACE"]
NO_ID = 0xffffffff
def acl(entries):
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
granted = acl([(0x01, 7, NO_ID), (0x02, 7, 4242), (0x04, 7, NO_ID), (0x10, 7, NO_ID), (0x20, 7, NO_ID)])
os.chmod(ws, 0o1777)
os.setxattr(ws, "user.msg", b"from the last lease")
os.setxattr(ws, "system.posix_acl_access", granted)
os.setxattr(ws, "system.posix_acl_default", granted)
os.utime(ws, (946684800, 946684800))
print("changed")
"#;
    let tenants = [
        "system.posix_acl_access",
        "system.posix_acl_default",
        "user.msg",
    ];
    // What the script did is there: the checks below are not vacuous.
    let changed = || {
        let m = std::fs::metadata(&ws).expect("ws");
        assert_eq!(
            m.permissions().mode() & 0o7777,
            0o1777,
            "the script changed the root's mode"
        );
        assert_eq!(m.mtime(), 946684800, "the script changed the root's times");
        let names = xattrs(&ws);
        for name in tenants {
            assert!(names.iter().any(|n| n == name), "{name} set: {names:?}");
        }
    };
    let check = |when: &str| {
        let m = std::fs::metadata(&ws).expect("workspace");
        assert_eq!(
            m.permissions().mode() & 0o7777,
            before.permissions().mode() & 0o7777,
            "{when}: the mode"
        );
        assert_eq!((m.uid(), m.gid()), (before.uid(), before.gid()), "{when}");
        assert!(m.mtime() > 946684800, "{when}: the times");
        let names = xattrs(&ws);
        for name in tenants {
            assert!(
                !names.iter().any(|n| n == name),
                "{when}: the tenant's {name} is left: {names:?}"
            );
        }
    };
    crate::exec::acquire_bare(&c, "lease-r1").await;
    let (st, log) = run_to_end(&c, "root1", script).await;
    assert_eq!(st, "completed", "{log}");
    changed();
    release(&c, "lease-r1").await;
    check("after Release");
    crate::exec::acquire_bare(&c, "lease-r2").await;
    let (st, log) = run_to_end(&c, "root2", script).await;
    assert_eq!(st, "completed", "{log}");
    changed();
    reset(&c, "lease-r2").await;
    check("after Reset");
    release(&c, "lease-r2").await;
}

/// The names of `dir`'s extended attributes; failing to list them fails
/// the test (an error is no proof that none is there).
fn xattrs(dir: &std::path::Path) -> Vec<String> {
    let f = std::fs::File::open(dir).expect("open");
    let mut buf = vec![0u8; 64 << 10];
    let n = rustix::fs::flistxattr(&f, &mut buf[..])
        .unwrap_or_else(|e| panic!("listing the xattrs of {}: {e}", dir.display()));
    buf[..n]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}
