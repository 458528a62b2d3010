//! SIGKILL of the agent in the middle of Initialize, at every point of the
//! swap, with the workspace as a plain directory and as a mount point:
//! after a restart the workspace is entirely before or entirely after.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::ws::*;
use crate::common::*;
use sandbox_client::proto;

/// A tmpfs mounted on the workspace directory; unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn new(path: &Path) -> Mount {
        std::fs::create_dir_all(path).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256m", "tmpfs"])
            .arg(path)
            .status()
            .expect("mount");
        assert!(
            st.success(),
            "mounting a tmpfs needs root (CAP_SYS_ADMIN); the test command runs as root"
        );
        Mount(path.to_owned())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn tree(tag: &str, n: usize) -> Vec<u8> {
    let mut t = Tar::new();
    for i in 0..n {
        t.dir(&format!("./{tag}-dir{i}/"));
        t.file(
            &format!("./{tag}-dir{i}/data"),
            format!("{tag} {i}").as_bytes(),
        );
        t.file(&format!("./{tag}-top{i}.txt"), tag.as_bytes());
    }
    gzip(&t.end())
}

async fn connect(agent: &Agent) -> sandbox_client::Client {
    sandbox_client::connect(&agent.unix_uri()).await.unwrap()
}

/// An agent in `dir` that Initializes `tree("new", 6)` and pauses at the
/// fault `point` of the swap; and the Initialize call.
async fn paused_at(
    dir: tempfile::TempDir,
    point: &str,
) -> (
    Agent,
    tokio::task::JoinHandle<Result<proto::InitializeResponse, tonic::Status>>,
) {
    let faulty = Agent::start_in(dir, &[], &[("SANDBOX_AGENT_TEST_FAULT", point)]);
    let client = connect(&faulty).await;
    let call = tokio::spawn(async move {
        initialize(&client, proto::InitializeHeader::default(), tree("new", 6)).await
    });
    faulty
        .stderr
        .wait_for(Duration::from_secs(20), |l| l.contains("pausing here"))
        .unwrap_or_else(|| panic!("{point}: fault point not reached\n{}", faulty.stderr.all()));
    (faulty, call)
}

async fn crash_at(point: &str, mounted: bool, expect_after: bool) {
    if mounted && !root_or_skip(&format!("recovery at {point} with a mounted workspace")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let _mount = mounted.then(|| Mount::new(&ws));

    let agent = Agent::start_in(dir, &[], &[]);
    initialize(
        &connect(&agent).await,
        proto::InitializeHeader::default(),
        tree("old", 6),
    )
    .await
    .expect("old tree");
    let old = snapshot(&ws, true);
    let dir = agent.kill9();

    // The new tree, extracted once into a scratch agent, is what "after" means.
    let scratch = Agent::start(&[]);
    initialize(
        &connect(&scratch).await,
        proto::InitializeHeader::default(),
        tree("new", 6),
    )
    .await
    .expect("new tree");
    let new = snapshot(&scratch.dir.path().join("ws"), false);

    let (faulty, call) = paused_at(dir, point).await;
    let mid = snapshot(&ws, false);
    if point.starts_with("mid-") {
        assert!(
            mid != old && mid != new,
            "{point}: the kill should land in a half-swapped workspace"
        );
    }
    let dir = faulty.kill9();
    assert!(call.await.unwrap().is_err());

    let restarted = Agent::start_in(dir, &[], &[]);
    let got = snapshot(&ws, !expect_after);
    if expect_after {
        assert_eq!(
            got, new,
            "{point} (mounted={mounted}): expected the new tree after restart"
        );
        assert!(
            restarted
                .stderr
                .all()
                .contains("completed an interrupted workspace swap"),
            "{}",
            restarted.stderr.all()
        );
    } else {
        assert_eq!(
            got, old,
            "{point} (mounted={mounted}): expected the old tree after restart"
        );
    }
    // No staging debris stays behind, inside or next to the workspace.
    let state = if mounted {
        ws.join(".sandbox-agent")
    } else {
        restarted.dir.path().join(".ws.sandbox-agent")
    };
    wait_empty(&state).await;
    // And the agent works normally afterwards.
    let r = initialize(
        &connect(&restarted).await,
        proto::InitializeHeader::default(),
        tree("third", 2),
    )
    .await
    .expect("works after recovery");
    assert_eq!(r.files, 4);
    drop(restarted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_commit_leaves_the_old_workspace() {
    crash_at("before-commit", false, false).await;
    crash_at("before-commit", true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_the_journal_completes_the_swap() {
    crash_at("after-journal", false, true).await;
    crash_at("after-journal", true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_move_out_completes_the_swap() {
    crash_at("mid-move-out", false, true).await;
    crash_at("mid-move-out", true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_move_in_completes_the_swap() {
    crash_at("mid-move-in", false, true).await;
    crash_at("mid-move-in", true, true).await;
}

/// An agent killed half-way through moving `tree("new", 6)` in, restarted
/// after something took the name of an entry still to move (a non-empty
/// `new-dir5`): the swap cannot complete. Returns the restarted agent, a
/// client of it and its workspace path.
async fn stuck_agent() -> (Agent, sandbox_client::Client, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let (faulty, call) = paused_at(dir, "mid-move-in").await;
    let dir = faulty.kill9();
    assert!(call.await.unwrap().is_err());
    std::fs::create_dir(ws.join("new-dir5")).unwrap();
    std::fs::write(ws.join("new-dir5/in-the-way.txt"), "x").unwrap();
    // Before, the agent refused to start ("Directory not empty"), forever.
    let agent = Agent::start_in(dir, &[], &[]);
    assert!(
        agent.stderr.all().contains("cannot be completed"),
        "{}",
        agent.stderr.all()
    );
    let c = connect(&agent).await;
    (agent, c, ws)
}

/// A swap that cannot be completed leaves the agent serving: workspace
/// operations are refused with FAILED_PRECONDITION saying what is wrong,
/// and once the obstacle is gone the next one completes the swap first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinishable_swap_leaves_the_agent_serving() {
    let (agent, c, ws) = stuck_agent().await;
    c.agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .expect("GetInfo answers");
    let e = dump(&c, proto::DumpRequest::default())
        .await
        .expect_err("a Dump of a half-swapped workspace");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{}", e.message());
    assert!(
        e.message().contains("Directory not empty")
            && e.message().contains("remove what is in the way"),
        "{}",
        e.message()
    );
    std::fs::remove_dir_all(ws.join("new-dir5")).unwrap();
    let (archive, _) = dump(&c, proto::DumpRequest::default())
        .await
        .expect("a Dump once the obstacle is gone");
    assert!(!archive.is_empty());
    for i in 0..6 {
        assert_eq!(
            std::fs::read_to_string(ws.join(format!("new-dir{i}/data"))).unwrap(),
            format!("new {i}")
        );
    }
    wait_empty(&agent.dir.path().join(".ws.sandbox-agent")).await;
}

/// Clear (and so Release) of a workspace stuck mid-swap empties it in
/// place and abandons the swap: the sandbox is never stuck with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_frees_a_workspace_stuck_mid_swap() {
    let (agent, c, ws) = stuck_agent().await;
    c.workspace()
        .clear(proto::ClearRequest {})
        .await
        .expect("Clear of a stuck workspace");
    assert_eq!(std::fs::read_dir(&ws).unwrap().count(), 0);
    wait_empty(&agent.dir.path().join(".ws.sandbox-agent")).await;
    let r = initialize(&c, proto::InitializeHeader::default(), tree("after", 2))
        .await
        .expect("works after the Clear");
    assert_eq!(r.files, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_leaves_the_old_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let agent = Agent::start_in(dir, &[], &[]);
    let client = connect(&agent).await;
    initialize(&client, proto::InitializeHeader::default(), tree("old", 3))
        .await
        .unwrap();
    let old = snapshot(&ws, true);
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let mut w = client.workspace();
    let call = tokio::spawn(async move {
        w.initialize(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    use proto::initialize_request::Msg;
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Header(proto::InitializeHeader::default())),
    })
    .await
    .unwrap();
    let mut t = Tar::new();
    for i in 0..300 {
        t.file(&format!("./n{i}"), &[b'x'; 4000]);
    }
    // Chunks within the agent's per-chunk limit, and no end-of-archive: the
    // stream stays open while the agent extracts.
    for chunk in t.buf.chunks(256 * 1024) {
        tx.send(proto::InitializeRequest {
            msg: Some(Msg::Chunk(chunk.to_vec().into())),
        })
        .await
        .unwrap();
    }
    // Killed while extracting: its staging directory exists, and the call
    // is still open.
    wait_staging(&agent.dir.path().join(".ws.sandbox-agent")).await;
    assert!(!call.is_finished(), "{:?}", call.await);
    let dir = agent.kill9();
    let _ = call.await;
    drop(tx);
    let left = std::fs::read_dir(dir.path().join(".ws.sandbox-agent"))
        .unwrap()
        .count();
    assert!(left > 0, "the killed agent left its staging directory");
    let restarted = Agent::start_in(dir, &[], &[]);
    assert_eq!(snapshot(&ws, true), old);
    let state = restarted.dir.path().join(".ws.sandbox-agent");
    wait_empty(&state).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&ws)
        .status()
        .expect("mount");
    assert!(st.success(), "mounting a tmpfs needs root");
    let _mount = Mount(ws.clone());
    let agent = Agent::start_in(dir, &[], &[]);
    let client = connect(&agent).await;
    initialize(&client, proto::InitializeHeader::default(), tree("old", 2))
        .await
        .expect("small tree fits");
    let old = snapshot(&ws, true);
    let mut t = Tar::new();
    t.file("./big.bin", &vec![0x5au8; 2 << 20]);
    let e = initialize(&client, proto::InitializeHeader::default(), gzip(&t.end()))
        .await
        .expect_err("2 MiB into 1 MiB");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{}", e.message());
    assert!(e.message().contains("full"), "{}", e.message());
    assert_eq!(snapshot(&ws, true), old);
    assert_eq!(
        std::fs::read_dir(ws.join(".sandbox-agent"))
            .unwrap()
            .count(),
        0,
        "staging removed"
    );
}

/// With the workspace a mount point, the old trees a swap leaves for
/// background deletion sit inside it (`.sandbox-agent/old-*`), where the
/// servers can read them: the next Acquire starts only once they are gone,
/// so no tenant sees the previous one's files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_lease_never_sees_the_previous_ones_files() {
    if !root_or_skip("the next lease with a mounted workspace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _m = Mount::new(&dir.path().join("ws"));
    let agent = Agent::start_in(dir, &[], &[]);
    let c = connect(&agent).await;
    let lease = |id: &str| proto::AcquireRequest {
        lease_id: id.into(),
        no_servers: true,
        ..Default::default()
    };
    c.agent().acquire(lease("first")).await.expect("Acquire");
    initialize(&c, proto::InitializeHeader::default(), tree("secret", 8000))
        .await
        .expect("Initialize");
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: "first".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("Release");
    c.agent().acquire(lease("second")).await.expect("Acquire");
    let inner = agent.dir.path().join("ws/.sandbox-agent");
    let left: Vec<String> = std::fs::read_dir(&inner)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("old"))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "the previous lease's trees: {left:?}");
}

/// A workspace filesystem filled to the last byte (by a server, say): the
/// swap cannot even write its journal, yet Release empties the workspace in
/// place, frees the disk and leaves the sandbox idle; so does Clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_a_full_disk() {
    if !root_or_skip("a full tmpfs workspace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&ws)
        .status()
        .expect("mount");
    assert!(st.success(), "mounting a tmpfs needs root");
    let _mount = Mount(ws.clone());
    let agent = Agent::start_in(dir, &[], &[]);
    let c = connect(&agent).await;
    let fill = || {
        use std::io::Write;
        let mut f = std::fs::File::create(ws.join("filler.bin")).expect("filler");
        let block = vec![7u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        let _ = std::fs::create_dir(ws.join("more"));
        let mut i = 0;
        while std::fs::write(ws.join(format!("more/f{i}")), b"x").is_ok() && i < 10_000 {
            i += 1;
        }
    };
    c.agent()
        .acquire(proto::AcquireRequest {
            lease_id: "full".into(),
            no_servers: true,
            ..Default::default()
        })
        .await
        .expect("Acquire");
    fill();
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: "full".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("Release on a full disk");
    let left: Vec<_> = std::fs::read_dir(&ws)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != ".sandbox-agent")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    fill();
    c.workspace()
        .clear(proto::ClearRequest {})
        .await
        .expect("Clear on a full disk");
    assert!(!ws.join("filler.bin").exists());
}

/// As PID 1 (a VM's init, an isolated slot) with the workspace a mount
/// point, the agent keeps its journal, staging and old trees beside the
/// tree the servers see, never in it: the workspace shows exactly the
/// archive's entries, before and after a second Initialize, and so does
/// its dump; the volume's own root is out of a tenant's reach.
#[tokio::test]
async fn a_mounted_workspace_shows_only_the_tasks_files() {
    if !root_or_skip("a PID 1 agent over a mounted workspace") {
        return;
    }
    let dir = pid1_dir();
    let ws = dir.path().join("ws");
    let _mount = Mount::new(&ws);
    let agent = Agent::start_pid1(dir, &[]);
    let pid = pid1_agent_pid(&agent);
    // The workspace as the agent's namespace (its servers, its tenants)
    // sees it.
    let seen = PathBuf::from(format!("/proc/{pid}/root")).join(ws.strip_prefix("/").unwrap());
    let names = |d: &Path| -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    };
    let client = connect(&agent).await;
    for tag in ["first", "second"] {
        initialize(&client, proto::InitializeHeader::default(), tree(tag, 3))
            .await
            .unwrap_or_else(|e| panic!("Initialize {tag}: {e}\n{}", agent.stderr.all()));
        let mut expected: Vec<String> = (0..3)
            .flat_map(|i| [format!("{tag}-dir{i}"), format!("{tag}-top{i}.txt")])
            .collect();
        expected.sort();
        assert_eq!(names(&seen), expected, "{tag}: the workspace");
        let (tgz, _) = dump(&client, proto::DumpRequest::default())
            .await
            .expect("Dump");
        let mut tops: Vec<String> = crate::common::ws::entry_names(&tgz)
            .into_iter()
            .filter_map(|p| {
                let p = p.trim_start_matches("./").trim_end_matches('/').to_owned();
                (!p.is_empty() && !p.contains('/')).then_some(p)
            })
            .collect();
        tops.sort();
        assert_eq!(tops, expected, "{tag}: the dump");
    }
    let volume = PathBuf::from(format!("/proc/{pid}/root/run/sandbox-agent-volume"));
    let meta = std::fs::metadata(&volume).expect("the volume");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o700,
        "the volume's root"
    );
    assert_eq!(meta.uid(), 0);
    assert!(
        names(&volume).contains(&"tree".to_owned()),
        "{:?}",
        names(&volume)
    );
}
