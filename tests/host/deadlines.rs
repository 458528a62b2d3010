//! Issue 41, parts 4–6, through the real `sandbox-host`: no call to an
//! agent waits without bound (a mute agent is an error within its class's
//! deadline, found by the prober and replaced), the data dir is checked at
//! start, and slots nothing holds any more are ended (an agent whose state
//! root is deleted shuts down; the host's reclaim pass ends the slot
//! directories of its data dir it does not hold).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::common::host::{
    Host, KEY_A, KEY_B, acquire, alive, http, metric, processes_mentioning, put, script_archive,
    start_refused, wait_metric,
};
use crate::common::{eventually, when};
use crate::warm::{agent_state, slot_dirs};

/// The pool's idle sandboxes without servers.
const IDLE: &str = r#"sandbox_host_pool_sandboxes{state="bare",profile=""}"#;
const STARTING: &str = r#"sandbox_host_pool_sandboxes{state="starting",profile=""}"#;
const LEASED: &str = r#"sandbox_host_pool_sandboxes{state="leased",profile=""}"#;
const RECLAIMED: &str = "sandbox_host_slots_reclaimed_total";

/// What a 504 past an `--agent-*-timeout` says.
const NO_ANSWER: &str = "agent did not answer in time";

/// A cheap sandbox: one server, started on first use (never here).
const ONE_SERVER: &str = r#"{"server_names": ["localmemory"]}"#;

/// The deadlines of the mute-agent test, in seconds: short calls (and the
/// prober's period), Acquire/Reset, Release, transfers.
const CALL: u64 = 8;
const ACQUIRE: u64 = 4;
const RELEASE: u64 = 4;
const TRANSFER: u64 = 4;

/// How long past its deadline an answer may come (a loaded machine).
const SLACK: Duration = Duration::from_secs(10);

/// A stopped agent is SIGKILLed this long after its SIGTERM
/// (`pool::slot::stop`).
const STOP_GRACE: Duration = Duration::from_secs(10);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// One HTTP request with curl, given up after `max` (then status 0): the
/// status, the body and how long the answer took.
fn timed(
    method: &str,
    url: &str,
    key: Option<&str>,
    body: Option<&str>,
    max: Duration,
) -> (u16, Value, Duration) {
    let mut c = Command::new("curl");
    c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method, url])
        .args(["--max-time", &max.as_secs().to_string()]);
    if let Some(k) = key {
        c.args(["-H", &format!("authorization: Bearer {k}")]);
    }
    if let Some(b) = body {
        c.args(["-H", "content-type: application/json", "-d", b]);
    }
    let started = Instant::now();
    let out = c.output().expect("curl");
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())),
        took,
    )
}

/// An answer that is the host's 504 for a call past its deadline: within
/// `deadline` plus [`SLACK`], and not long before the deadline (the agent
/// was waited for, not given up on at once).
fn assert_deadline_504(what: &str, answer: &(u16, Value, Duration), deadline: Duration) {
    let (code, body, took) = answer;
    assert_eq!(
        *code, 504,
        "{what}: a mute agent must be a 504 within {deadline:?} + {SLACK:?} (status 0: no answer \
         within that); got {body} after {took:?}"
    );
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(NO_ANSWER),
        "{what}: the 504 must say the sandbox's agent did not answer in time: {body}"
    );
    assert!(
        *took + Duration::from_millis(500) >= deadline && *took <= deadline + SLACK,
        "{what}: answered after {took:?}, its deadline is {deadline:?}"
    );
}

fn stop_process(pid: i32) {
    kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP");
}

/// The sandbox's record as the API shows it.
fn sandbox(host: &Host, key: &str, id: &str) -> (u16, Value) {
    let (code, v, _) = timed(
        "GET",
        &format!("{}/local-sandbox/{id}", host.base),
        Some(key),
        None,
        secs(30),
    );
    (code, v)
}

/// The host's whole log.
fn full_log(host: &Host) -> String {
    std::fs::read_to_string(host.data.with_file_name("host.log")).unwrap_or_default()
}

/// The host's log's last 6000 bytes, for failure messages.
fn host_log(host: &Host) -> String {
    let log = full_log(host);
    let mut from = log.len().saturating_sub(6000);
    while !log.is_char_boundary(from) {
        from += 1;
    }
    log[from..].to_owned()
}

/// The lease an agent holds, if it answers within 5 s.
fn lease_of(rt: &tokio::runtime::Runtime, slot: &Path) -> Option<String> {
    rt.block_on(async { tokio::time::timeout(secs(5), agent_state(slot)).await })
        .ok()
        .flatten()
        .map(|(lease, _)| lease)
}

/// The slot directory and agent pid serving each lease of `leases`.
fn slots_of(host: &Host, leases: &[&str]) -> Vec<(PathBuf, i32)> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let found: Vec<(String, PathBuf)> = slot_dirs(host)
        .into_iter()
        .filter_map(|d| Some((lease_of(&rt, &d)?, d)))
        .collect();
    leases
        .iter()
        .map(|l| {
            let (_, dir) = found
                .iter()
                .find(|(held, _)| held == l)
                .unwrap_or_else(|| panic!("no slot holds {l}: {found:?}"));
            (dir.clone(), pid_of(dir).expect("agent.pid"))
        })
        .collect()
}

fn pid_of(slot: &Path) -> Option<i32> {
    std::fs::read_to_string(slot.join("agent.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn id_of(acquired: &Value) -> String {
    acquired["local_sandbox_id"]
        .as_str()
        .expect("local_sandbox_id")
        .to_owned()
}

/// An agent that takes every connection and never answers (SIGSTOPped:
/// the kernel still queues connections on its socket) makes every call
/// of the host an error within its class's deadline, never a hang: an
/// Acquire on it, Initialize, Dump, an execution's upload and status,
/// Reset; the prober marks its sandbox `error` and replaces its slot; a
/// Release of it replaces it.
#[test]
fn an_agent_that_never_answers_is_an_error_within_each_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (call, acq, rel, xfer) = (
        CALL.to_string(),
        ACQUIRE.to_string(),
        RELEASE.to_string(),
        TRANSFER.to_string(),
    );
    let host = Host::start(
        dir.path(),
        &[
            "--agent-call-timeout",
            &call,
            "--agent-acquire-timeout",
            &acq,
            "--agent-release-timeout",
            &rel,
            "--agent-transfer-timeout",
            &xfer,
            "--server-start",
            "lazy",
        ],
    );
    let b = host.base.clone();
    wait_metric(&host, IDLE, 1.0, secs(60));

    // An Acquire on the one idle sandbox, mute: answered within the
    // Acquire's deadline (a 504, or a sandbox the host started instead).
    let idle = host.agents();
    assert_eq!(idle.len(), 1, "one idle sandbox: {idle:?}");
    let idle_dir = slot_dirs(&host)
        .into_iter()
        .find(|d| pid_of(d) == Some(idle[0]))
        .expect("the idle slot's directory");
    stop_process(idle[0]);
    let answer = timed(
        "POST",
        &format!("{b}/local-sandbox"),
        Some(KEY_A),
        Some(ONE_SERVER),
        secs(ACQUIRE) + SLACK,
    );
    match answer.0 {
        201 => {
            let (code, v) = http(
                "DELETE",
                &format!("{b}/local-sandbox/{}", id_of(&answer.1)),
                Some(KEY_A),
                None,
            );
            assert_eq!(code, 200, "{v}");
        }
        _ => assert_deadline_504("an Acquire on a mute sandbox", &answer, secs(ACQUIRE)),
    }
    // The mute sandbox is replaced (its Release fails within its
    // deadline; the stop SIGKILLs it after its grace).
    eventually(
        secs(RELEASE) + STOP_GRACE + SLACK + secs(10),
        "the mute idle sandbox is stopped and removed",
        || {
            when(!alive(idle[0]) && !idle_dir.exists(), || {
                format!(
                    "agent alive: {}, dir left: {}\n{}",
                    alive(idle[0]),
                    idle_dir.exists(),
                    host_log(&host)
                )
            })
        },
    );

    // Three sandboxes: s1 takes the calls, s2 only the prober's probes, s3
    // a Release.
    let s1 = id_of(&acquire(&host, KEY_A, ONE_SERVER));
    let s2 = id_of(&acquire(&host, KEY_A, ONE_SERVER));
    let s3 = id_of(&acquire(&host, KEY_B, ONE_SERVER));
    let one = format!("{b}/local-sandbox/{s1}");
    // What needs no agent, first: the stored workspace archive, the dump's
    // URL, the stored execution archive.
    let (code, u) = http("POST", &format!("{one}/upload-url"), Some(KEY_A), None);
    assert_eq!(code, 200, "{u}");
    let (code, v) = put(
        u["upload_url"].as_str().expect("upload_url"),
        &script_archive("print('hi')"),
    );
    assert_eq!(code, 200, "{v}");
    let (code, d) = http("GET", &format!("{one}/dump"), Some(KEY_A), None);
    assert_eq!(code, 200, "{d}");
    let download = d["download_url"].as_str().expect("download_url").to_owned();
    let exec = r#"{"execution_name": "mute"}"#;
    let (code, u) = http(
        "POST",
        &format!("{one}/execution-upload-url"),
        Some(KEY_A),
        Some(exec),
    );
    assert_eq!(code, 200, "{u}");
    let (code, v) = put(
        u["upload_url"].as_str().expect("upload_url"),
        &script_archive("print('never runs')"),
    );
    assert_eq!(code, 200, "{v}");

    let slots = slots_of(&host, &[&s1, &s2, &s3]);
    for (_, pid) in &slots {
        stop_process(*pid);
    }
    let muted = Instant::now();
    let [(dir1, pid1), (dir2, pid2), (dir3, pid3)] = [&slots[0], &slots[1], &slots[2]];

    // s3's Release is accepted at once; it ends in the background.
    let (code, v, took) = timed(
        "DELETE",
        &format!("{b}/local-sandbox/{s3}"),
        Some(KEY_B),
        None,
        SLACK,
    );
    assert_eq!(
        code, 200,
        "the release of a mute sandbox: {v} after {took:?}"
    );

    // s1: each call, at once (none of them ends the others: no Reset).
    let calls = [
        (
            "initialize",
            "POST",
            format!("{one}/initialize"),
            Some(KEY_A),
            None,
            secs(TRANSFER),
        ),
        (
            "dump (its download URL)",
            "GET",
            download.clone(),
            None,
            None,
            secs(TRANSFER),
        ),
        (
            "execute (the execution's upload)",
            "POST",
            format!("{one}/execute"),
            Some(KEY_A),
            Some(exec),
            secs(TRANSFER),
        ),
        (
            "execution-status",
            "GET",
            format!("{one}/execution-status?execution_name=mute"),
            Some(KEY_A),
            None,
            secs(CALL),
        ),
    ];
    let calls: Vec<_> = calls
        .into_iter()
        .map(|(what, method, url, key, body, deadline)| {
            let t = std::thread::spawn(move || timed(method, &url, key, body, deadline + SLACK));
            (what, deadline, t)
        })
        .collect();
    for (what, deadline, t) in calls {
        let answer = t.join().expect("the request's thread");
        assert_deadline_504(what, &answer, deadline);
    }
    // Then Reset (which would end the others in flight).
    let answer = timed(
        "POST",
        &format!("{one}/reset"),
        Some(KEY_A),
        None,
        secs(ACQUIRE) + SLACK,
    );
    assert!(
        muted.elapsed() < secs(3 * CALL),
        "the calls took {:?}: the prober may have replaced the slot before the Reset",
        muted.elapsed()
    );
    assert_deadline_504("reset", &answer, secs(ACQUIRE));

    // The prober: s2, never called, is `error` once its agent failed two
    // probes in a row (at most 4 periods: a probe lasts up to one), and
    // its slot replaced; so is s1's.
    eventually(
        secs(4 * CALL) + SLACK,
        "the prober marks the mute sandbox error",
        || {
            let (code, v) = sandbox(&host, KEY_A, &s2);
            when(code == 200 && v["status"] == "error", || {
                format!("{code} {v}\n{}", host_log(&host))
            })
        },
    );
    let (code, v) = sandbox(&host, KEY_A, &s1);
    assert_eq!((code, v["status"].as_str()), (200, Some("error")), "{v}");
    // s3's Release failed within its deadline and replaced the slot,
    // long before the prober would have (it needs two periods of CALL).
    eventually(
        secs(4 * CALL) + STOP_GRACE + SLACK,
        "every mute slot is stopped and removed",
        || {
            let left: Vec<String> = [(dir1, pid1), (dir2, pid2), (dir3, pid3)]
                .iter()
                .filter(|(d, p)| alive(**p) || d.exists())
                .map(|(d, p)| format!("{} (pid {p}, alive {})", d.display(), alive(**p)))
                .collect();
            when(left.is_empty(), || {
                format!("left: {left:?}\n{}", host_log(&host))
            })
        },
    );
    // The whole log: a host also logs each stale cgroup it removes at its
    // start (other tests' killed hosts leave them), which can push the
    // line out of the tail the message shows.
    let log = full_log(&host);
    assert!(
        log.lines()
            .any(|l| l.contains("release failed; the agent is replaced") && l.contains(&s3)),
        "the Release of {s3} must fail past --agent-release-timeout and replace its slot:\n{}",
        host_log(&host)
    );
    let (code, v) = sandbox(&host, KEY_B, &s3);
    assert_eq!(code, 404, "{v}");
    wait_metric(&host, LEASED, 0.0, secs(30));
    // The pool is whole again, and serves.
    wait_metric(&host, IDLE, 1.0, secs(60));
    let again = acquire(&host, KEY_B, ONE_SERVER);
    let (code, v) = sandbox(&host, KEY_B, &id_of(&again));
    assert_eq!((code, v["status"].as_str()), (200, Some("occupied")), "{v}");
}

/// `--data-dir` is checked at start: one whose slots' socket paths
/// (`<data>/slots/<32 hex>/run/agent.sock`) pass 107 bytes, or in which the
/// host cannot make a slot's directory, is refused before the host serves,
/// naming the flag; the longest that fits starts and serves.
#[test]
fn the_data_dir_is_checked_at_start() {
    // Under /tmp: the lengths below are counted from a short base.
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let base = dir.path().display().to_string();
    assert!(base.len() < 40, "{base}");
    let named = |n: usize, c: &str| {
        let p = format!("{base}/{}", c.repeat(n - base.len() - 1));
        assert_eq!(p.len(), n);
        PathBuf::from(p)
    };
    // `/slots/` + 32 + `/run/agent.sock`: 54 bytes after the data dir.
    let longest = 107 - 54;

    let refused = |data: &Path, why: &str| -> String {
        let (status, err, took) = start_refused(dir.path(), data, &[], secs(30));
        assert!(
            !status.success(),
            "{why}: {} must be refused: {status}",
            data.display()
        );
        assert!(took < secs(10), "{why}: refused only after {took:?}: {err}");
        assert!(
            err.contains(&*data.to_string_lossy()),
            "{why}: the refusal must name the data dir: {err}"
        );
        err
    };

    // 100 bytes: far too long.
    let long = named(100, "l");
    let err = refused(&long, "a data dir of 100 bytes");
    for want in [
        "--data-dir",
        "107",
        "run/agent.sock",
        &format!("at most {longest} bytes"),
    ] {
        assert!(err.contains(want), "the refusal must say {want:?}: {err}");
    }
    // One byte too long.
    let err = refused(&named(longest + 1, "o"), "a data dir one byte too long");
    assert!(err.contains("--data-dir") && err.contains("107"), "{err}");

    // A regular file where the data dir's parent should be.
    std::fs::write(dir.path().join("file"), b"in the way").expect("file");
    refused(
        &dir.path().join("file/data"),
        "a data dir under a regular file",
    );
    // The data dir is there but its slots cannot be made: a file in the way.
    let blocked = dir.path().join("blocked");
    std::fs::create_dir(&blocked).expect("mkdir");
    std::fs::write(blocked.join("slots"), b"in the way").expect("file");
    let err = refused(&blocked, "a data dir whose slots cannot be made");
    assert!(err.contains("--data-dir"), "{err}");
    // Nothing can be made under /proc.
    let proc_dir = Path::new("/proc/sandbox-host-data");
    refused(proc_dir, "a data dir under /proc");

    // The longest data dir that fits starts, and its sandboxes serve.
    let fits = named(longest, "f");
    let host = Host::start_at(dir.path(), &fits, &["--server-start", "lazy"]);
    wait_metric(&host, IDLE, 1.0, secs(60));
    let a = acquire(&host, KEY_A, ONE_SERVER);
    let (code, v) = sandbox(&host, KEY_A, &id_of(&a));
    assert_eq!((code, v["status"].as_str()), (200, Some("occupied")), "{v}");
    // Its agent serves on its socket at the longest path.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (slot, _) = slots_of(&host, &[&id_of(&a)]).remove(0);
    let sock = slot.join("run/agent.sock");
    assert_eq!(sock.as_os_str().len(), 107, "{}", sock.display());
    assert_eq!(lease_of(&rt, &slot).as_deref(), Some(id_of(&a).as_str()));
}

/// The first subordinate id and count of root's ranges (`/etc/subuid`),
/// as the host takes them.
fn subuids() -> (u32, u32) {
    let text = std::fs::read_to_string("/etc/subuid").expect("/etc/subuid");
    text.lines()
        .find_map(|l| {
            let mut f = l.trim().split(':');
            let (name, start, count) = (f.next()?, f.next()?, f.next()?);
            let (start, count) = (start.parse().ok()?, count.parse::<u32>().ok()?);
            ((name == "root" || name == "0") && count >= 65536).then_some((start, count))
        })
        .expect("a range of root's in /etc/subuid")
}

/// Processes running with an id (real, effective, saved or fs uid) of id
/// block `block`.
fn processes_in_block(block: u32) -> Vec<String> {
    let (start, _) = subuids();
    let (lo, hi) = (start + block * 65536, start + (block + 1) * 65536);
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let uids = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .unwrap_or_default();
        if uids
            .split_whitespace()
            .filter_map(|u| u.parse::<u32>().ok())
            .any(|u| (lo..hi).contains(&u))
        {
            out.push(format!("{name}: {}", processes_mentioning(&name)));
        }
    }
    out
}

/// The machine-wide id block registry (`pool::isolate::ids`).
const BLOCK_REGISTRY: &str = "/run/sandbox-host/uid-blocks";

/// Id block `block`, claimed for slot `dir`, is free by the registry's
/// rule: its claim is gone or another slot's, or its slot directory is
/// gone and no process runs with one of its ids.
fn block_free(block: u32, dir: &Path) -> Result<(), String> {
    let link = Path::new(BLOCK_REGISTRY).join(block.to_string());
    let claimed = || std::fs::read_link(&link).is_ok_and(|t| t == dir);
    if !claimed() {
        return Ok(());
    }
    let holders = processes_in_block(block);
    when(!claimed() || (!dir.exists() && holders.is_empty()), || {
        format!(
            "block {block} still claimed for {} (exists: {}), its ids held by {holders:?}",
            dir.display(),
            dir.exists()
        )
    })
}

/// A slot of a host that was killed: its directory, its agent's pid, its
/// id, its id block.
struct OldSlot {
    dir: PathBuf,
    pid: i32,
    id: String,
    block: Option<u32>,
}

/// A host SIGKILLed with two leased sandboxes (and an idle one), its data
/// dir then removed: each agent finds its state root deleted and shuts
/// down, taking its sandbox's processes with it, and their id blocks are
/// free again; a new host on the same data dir path starts and serves.
#[test]
fn a_killed_host_whose_data_dir_is_removed_leaves_nothing_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Host::start(
        dir.path(),
        &["--server-start", "lazy", "--reclaim-interval", "1"],
    );
    let a = id_of(&acquire(&first, KEY_A, ONE_SERVER));
    let b = id_of(&acquire(&first, KEY_B, ONE_SERVER));
    wait_metric(&first, IDLE, 1.0, secs(60));
    wait_metric(&first, STARTING, 0.0, secs(60));
    // Both leases' slots are among them.
    slots_of(&first, &[&a, &b]);
    let old: Vec<OldSlot> = slot_dirs(&first)
        .into_iter()
        .filter_map(|dir| {
            Some(OldSlot {
                pid: pid_of(&dir)?,
                id: dir.file_name()?.to_string_lossy().into_owned(),
                block: std::fs::read_to_string(dir.join("uid_block"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok()),
                dir,
            })
        })
        .collect();
    let old = Orphans(old);
    assert_eq!(old.len(), 3, "two leased sandboxes and an idle one");
    for s in old.iter() {
        assert!(alive(s.pid), "{} runs", s.dir.display());
        assert!(s.block.is_some(), "{} has an id block", s.dir.display());
    }

    let host_pid = first.pid().expect("the host's pid") as i32;
    kill(Pid::from_raw(host_pid), Signal::SIGKILL).expect("SIGKILL the host");
    eventually(secs(10), "the host dies", || {
        when(!alive(host_pid), || "alive".into())
    });
    // Sandboxes outlive their host on purpose.
    assert!(old.iter().all(|s| alive(s.pid)));
    // The data dir removed (a small tree: the plain removal will do; an
    // agent may write while it goes, so again until it is gone). The
    // slots' own file systems are emptied by the first pass (their state
    // roots go with it) and, as an operator would, unmounted after it.
    eventually(
        secs(30),
        "the data dir is removed",
        || match std::fs::remove_dir_all(&first.data) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => {
                crate::common::slots::unmount_slot_file_systems(&first.data);
                Err(e.to_string())
            }
        },
    );

    let second = Host::start(
        dir.path(),
        &["--server-start", "lazy", "--reclaim-interval", "1"],
    );
    let removed = Instant::now();
    // Each agent checks its state root every 5 s (state_root_check_ms),
    // and takes its sandbox's processes with it.
    eventually(secs(30), "the old slots' agents shut down", || {
        let left: Vec<String> = old
            .iter()
            .filter(|s| alive(s.pid))
            .map(|s| format!("slot {} (agent {})", s.id, s.pid))
            .collect();
        when(left.is_empty(), || left.join("\n"))
    });
    // Nothing else of them runs either (their pasta is outside the
    // sandbox: only the host ends it).
    eventually(secs(30), "nothing of the old slots runs", || {
        let left: Vec<String> = old
            .iter()
            .map(|s| processes_mentioning(&s.id))
            .filter(|m| !m.is_empty())
            .collect();
        when(left.is_empty(), || {
            format!(
                "still running, though their agents ended and no host knows their slots:\n{}",
                left.join("")
            )
        })
    });
    let ended = removed.elapsed();
    eventually(secs(30), "the old slots' id blocks are free", || {
        old.iter()
            .try_for_each(|s| block_free(s.block.expect("block"), &s.dir))
    });
    // The new host on the same path serves.
    wait_metric(&second, IDLE, 1.0, secs(60));
    let c = id_of(&acquire(&second, KEY_A, ONE_SERVER));
    let (code, v) = sandbox(&second, KEY_A, &c);
    assert_eq!((code, v["status"].as_str()), (200, Some("occupied")), "{v}");
    eprintln!("the old slots ended {ended:?} after the data dir was removed");
}

/// The slots of a killed host whose data dir is gone: no host can end
/// them. When dropped, whatever of them still runs is killed (a failed
/// test leaves nothing) and their cgroups, which no host knows either,
/// are removed.
struct Orphans(Vec<OldSlot>);

impl std::ops::Deref for Orphans {
    type Target = Vec<OldSlot>;
    fn deref(&self) -> &Vec<OldSlot> {
        &self.0
    }
}

impl Drop for Orphans {
    fn drop(&mut self) {
        for s in &self.0 {
            if alive(s.pid) {
                let _ = kill(Pid::from_raw(s.pid), Signal::SIGKILL);
            }
            for line in processes_mentioning(&s.id).lines() {
                if let Some(pid) = line.split(' ').next().and_then(|p| p.parse().ok()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
        let deadline = Instant::now() + secs(5);
        for s in &self.0 {
            for base in [
                "/sys/fs/cgroup/sandbox-slots",
                "/sys/fs/cgroup/unified/sandbox-slots",
                "/sys/fs/cgroup/pids/sandbox-slots",
            ] {
                let group = Path::new(base).join(&s.id);
                while !remove_empty_tree(&group) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

/// Removes an (empty) cgroup tree, deepest first; whether it is gone.
fn remove_empty_tree(d: &Path) -> bool {
    let mut all = vec![d.to_owned()];
    let mut i = 0;
    while i < all.len() {
        if let Ok(rd) = std::fs::read_dir(&all[i]) {
            all.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        i += 1;
    }
    for g in all.iter().rev() {
        let _ = std::fs::remove_dir(g);
    }
    !d.exists()
}

/// A slot directory of the data dir that the running host holds in no
/// list (here a stand-in: an `agent.pid` naming a process whose command
/// line names the slot) is ended and removed within a few
/// `--reclaim-interval`s and counted in `/metrics`; the host's own idle
/// sandbox is left alone.
#[test]
fn a_slot_the_host_does_not_hold_is_reclaimed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &["--reclaim-interval", "1"]);
    wait_metric(&host, IDLE, 1.0, secs(60));
    let own = host.agents();
    assert_eq!(own.len(), 1, "{own:?}");
    assert_eq!(metric(&host, RECLAIMED), 0.0);

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_nanos();
    let id = format!("{:032x}", now ^ (u128::from(std::process::id()) << 64));
    let mut stray = Command::new("bash")
        .args(["-c", &format!("exec -a {id} sleep 1000")])
        .spawn()
        .expect("bash");
    let pid = stray.id() as i32;
    eventually(secs(10), "the stray process names the slot", || {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        when(String::from_utf8_lossy(&cmd).contains(&id), || {
            String::from_utf8_lossy(&cmd).into_owned()
        })
    });
    let slot = host.data.join("slots").join(&id);
    std::fs::create_dir(&slot).expect("the stray slot's directory");
    std::fs::write(slot.join("agent.pid"), pid.to_string()).expect("agent.pid");
    std::fs::write(slot.join("left.txt"), b"a file of its own").expect("a file");
    let made = Instant::now();

    let ended = eventually(secs(20), "the stray slot is ended and removed", || {
        when(
            !alive(pid) && !slot.exists() && metric(&host, RECLAIMED) == 1.0,
            || {
                format!(
                    "alive: {}, dir left: {}, reclaimed: {}\n{}",
                    alive(pid),
                    slot.exists(),
                    metric(&host, RECLAIMED),
                    host_log(&host)
                )
            },
        )
        .map(|()| made.elapsed())
    });
    let _ = stray.wait();
    // Seen so at two passes in a row: not at the first.
    assert!(ended >= secs(1), "ended after {ended:?}");
    // More passes end nothing of the host's own.
    std::thread::sleep(secs(3));
    assert_eq!(metric(&host, RECLAIMED), 1.0);
    assert!(alive(own[0]), "the host's idle sandbox must be left alone");
    assert_eq!(host.agents(), own);
    wait_metric(&host, IDLE, 1.0, secs(10));
}
