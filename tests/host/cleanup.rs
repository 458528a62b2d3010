//! Issue 41 through the real host: a hostile tenant A leaves trees no
//! removal by recursion survives (chains of 16,000 and 100,000 nested
//! directories in its home, its workspace, its execution's directory and
//! /tmp, a 200 MB file at the bottom of one), 30,000 directories of trash,
//! and inode flags and xattrs on the workspace root and its home. Whether
//! the slot is recycled or replaced, and under a 1,024 open-file limit, the
//! host stays up, the slot's directory holds nothing of A's once the slot
//! is idle again (the disk space is back), and tenant B, on the same slot
//! or a new one, finds nothing of A's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::host::{
    Host, KEY_A, KEY_B, acquire, alive, http, metric, process_tree, release, run_script,
};

/// The pool's idle sandboxes without servers.
const IDLE: &str = r#"sandbox_host_pool_sandboxes{state="bare",profile=""}"#;
/// Every name A makes carries it.
const MARK: &str = "by-a";
/// The big file at the bottom of a chain, in MiB.
const BIG_MIB: u64 = 200;
/// How long a release of A's trees may take before the test gives up (the
/// host is given as long: the tests assert what is left, never how fast it
/// goes; the agent's Release of [`DEEP`] took 38 to 107 s in a debug build
/// on a loaded 2-core machine).
const RELEASE_BOUND: Duration = Duration::from_secs(600);
/// The host's `--agent-release-timeout`, [`RELEASE_BOUND`].
const RELEASE_TIMEOUT: &str = "600";
/// `--recycle-max-inodes` that keeps a slot whatever its lease left: the
/// agent's removal (any depth, any width) is what these tests try.
const RECYCLE_ALWAYS: &str = "100000000";

/// The script that reports a sandbox's slot (its uid block on the host and
/// when its PID 1 started) and what it finds of A's: run by A first, then
/// by B.
const CHECK: &str = r#"
import os
started = open('/proc/1/stat').read().rsplit(') ', 1)[1].split()[19]
print('slot', open('/proc/self/uid_map').read().split()[1], started)
home = os.environ['HOME']
def marked(top):
    try:
        return sorted(n for n in os.listdir(top) if 'by-a' in n)
    except OSError as e:
        return 'unreadable %d' % e.errno
for d in ['/tmp', '/var/tmp', '/dev/shm', home, home + '/tmp', '/workspace', '.']:
    print('left in', d, marked(d))
print('executions', sorted(os.listdir('/var/lib/sandbox-agent/executions')))
"#;

/// A's planting script: a prelude, then one `chain(…)` call per [`Chain`].
/// `chain` makes a directory `by-a-<what>` in `top`, `levels` nested
/// directories `by-a` below it, a `big_mib` MiB file (written, not sparse)
/// at the bottom, then walks down again to say how deep the chain really is
/// and what its big file takes on disk.
const PLANT: &str = r#"
import os
MARK = 'by-a'
def chain(what, top, levels, big_mib):
    back = os.open('.', os.O_RDONLY | os.O_DIRECTORY)
    os.chdir(top)
    os.mkdir(MARK + '-' + what)
    os.chdir(MARK + '-' + what)
    for _ in range(levels):
        os.mkdir(MARK)
        os.chdir(MARK)
    if big_mib:
        block = b'\xa5' * (1 << 20)
        with open('big-' + MARK, 'wb') as f:
            for _ in range(big_mib):
                f.write(block)
            os.fsync(f.fileno())
    os.fchdir(back)
    os.chdir(top)
    os.chdir(MARK + '-' + what)
    depth = 0
    while os.path.isdir(MARK):
        os.chdir(MARK)
        depth += 1
    size = os.stat('big-' + MARK).st_blocks * 512 if big_mib else 0
    os.fchdir(back)
    os.close(back)
    print('chain', what, depth, size, flush=True)
"#;

/// Where A plants a chain.
#[derive(Clone, Copy)]
enum Place {
    /// Its home (`$HOME`, `<slot>/state/home` on the host).
    Home,
    /// The workspace (`<slot>/ws/…` on the host).
    Workspace,
    /// The planting execution's own directory, its working directory
    /// (`<slot>/exec/plant/work` on the host).
    Execution,
    /// The sandbox's /tmp (a tmpfs of the sandbox's own: not on the host's
    /// disk).
    Tmp,
}

impl Place {
    /// The Python expression of the directory.
    fn python(self) -> &'static str {
        match self {
            Place::Home => "os.environ['HOME']",
            Place::Workspace => "'/workspace'",
            Place::Execution => "'.'",
            Place::Tmp => "'/tmp'",
        }
    }
}

/// One of A's chains: `by-a-<what>` in `place`, `levels` deep, a
/// `big_mib` MiB file at the bottom (0: none).
struct Chain {
    what: &'static str,
    place: Place,
    levels: u64,
    big_mib: u64,
}

impl Chain {
    const fn new(what: &'static str, place: Place, levels: u64, big_mib: u64) -> Chain {
        Chain {
            what,
            place,
            levels,
            big_mib,
        }
    }

    /// Whether it is in the slot's directory on the host.
    fn on_host(&self) -> bool {
        !matches!(self.place, Place::Tmp)
    }
}

/// 16,000 levels in the home, the execution's own directory and /tmp; in
/// the workspace 100,000, and 16,000 more with the big file at the bottom.
const DEEP: &[Chain] = &[
    Chain::new("home", Place::Home, 16_000, 0),
    Chain::new("ws", Place::Workspace, 100_000, 0),
    Chain::new("wsbig", Place::Workspace, 16_000, BIG_MIB),
    Chain::new("exec", Place::Execution, 16_000, 0),
    Chain::new("tmp", Place::Tmp, 16_000, 0),
];

/// Under a 1,024 open-file limit: a 3,000-level chain with the big file
/// at its bottom in the workspace, and 16,000 levels in the home, the
/// execution's directory and /tmp.
const UNDER_LIMIT: &[Chain] = &[
    Chain::new("home", Place::Home, 16_000, 0),
    Chain::new("wsbig", Place::Workspace, 3_000, BIG_MIB),
    Chain::new("exec", Place::Execution, 16_000, 0),
    Chain::new("tmp", Place::Tmp, 16_000, 0),
];

/// A test's temporary directory (its host's data dir and log), emptied
/// by `rm -rf` when dropped, after the host: coreutils walks any depth
/// without recursion, while `TempDir`'s `std::fs::remove_dir_all` would
/// overflow the test thread's stack on a chain A left (when the code under
/// test failed to remove it) and abort every test of this binary.
struct Scratch(tempfile::TempDir);

impl Scratch {
    fn new() -> Scratch {
        Scratch(tempfile::tempdir().expect("tempdir"))
    }

    /// In memory (`/dev/shm`, when it is a tmpfs that allows exec): the
    /// same trees and removals without a journal's pace for a million
    /// metadata changes. The inode-flag test needs a disk filesystem.
    fn in_memory() -> Scratch {
        let shm = std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
            m.lines().any(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.len() > 3 && f[1] == "/dev/shm" && f[2] == "tmpfs" && !f[3].contains("noexec")
            })
        });
        if !shm {
            return Scratch::new();
        }
        Scratch(tempfile::tempdir_in("/dev/shm").expect("tempdir"))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("rm")
            .args(["-rf", "--one-file-system", "--"])
            .arg(self.0.path())
            .status();
    }
}

fn id(v: &Value) -> String {
    v["local_sandbox_id"].as_str().expect("id").to_owned()
}

/// The end of the host's log (in `dir`).
fn host_log(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("host.log")).unwrap_or_default();
    let mut from = log.len().saturating_sub(6000);
    while !log.is_char_boundary(from) {
        from += 1;
    }
    log[from..].to_owned()
}

/// The slots' directories on the host.
fn slot_dirs(host: &Host) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(host.data.join("slots"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The one slot directory of a host that has one.
fn only_slot(host: &Host, dir: &Path) -> PathBuf {
    let slots = slot_dirs(host);
    assert_eq!(
        slots.len(),
        1,
        "one slot directory expected: {slots:?}; the host's log:\n{}",
        host_log(dir)
    );
    slots[0].clone()
}

/// What `find` sees below a directory: entries, the deepest level, and
/// how many of them are A's (by name).
#[derive(Debug, Default)]
struct Scan {
    entries: u64,
    deepest: u64,
    marked: u64,
    /// A few of A's names, with their depth.
    sample: Vec<String>,
}

/// Scans `dir` with GNU `find` (no recursion of ours: a tree of 100,000
/// levels would overflow it), printing only depths and names.
fn scan(dir: &Path) -> Scan {
    let out = Command::new("find")
        .arg(dir)
        .args(["-mindepth", "1", "-printf", "%d %f\\n"])
        .output()
        .expect("find");
    let mut s = Scan::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((depth, name)) = line.split_once(' ') else {
            continue;
        };
        let depth: u64 = depth.parse().unwrap_or(0);
        s.entries += 1;
        s.deepest = s.deepest.max(depth);
        if name.contains(MARK) {
            s.marked += 1;
            if s.sample.len() < 5 {
                s.sample.push(format!("{depth} {name}"));
            }
        }
    }
    s
}

/// The disk space `dir` takes (`du`, allocated bytes); 0 when it is gone.
fn disk_bytes(dir: &Path) -> u64 {
    if !dir.exists() {
        return 0;
    }
    let out = Command::new("du")
        .args(["-s", "--block-size=1"])
        .arg(dir)
        .output()
        .expect("du");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The host is alive and answers B's list of sandboxes.
fn assert_host_serves(host: &Host, dir: &Path) {
    let pid = host.pid().expect("pid") as i32;
    assert!(
        alive(pid),
        "the host died; the end of its log:\n{}",
        host_log(dir)
    );
    let (code, v) = http(
        "GET",
        &format!("{}/local-sandbox", host.base),
        Some(KEY_B),
        None,
    );
    assert_eq!(
        code,
        200,
        "the host must serve: {v}; the end of its log:\n{}",
        host_log(dir)
    );
}

/// Waits until the pool's one sandbox is idle again (`within`), failing at
/// once, with its log, if the host dies meanwhile.
fn wait_idle(host: &Host, dir: &Path, within: Duration) {
    let pid = host.pid().expect("pid") as i32;
    crate::common::eventually(within, "the slot is idle again", || {
        assert!(
            alive(pid),
            "the host died; the end of its log:\n{}",
            host_log(dir)
        );
        let (code, v) = http("GET", &format!("{}/metrics", host.base), Some(KEY_A), None);
        let n = v
            .as_str()
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(IDLE)?.strip_prefix(' '))
            .and_then(|n| n.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        crate::common::when(code == 200 && n == 1.0, || format!("{code}: {IDLE} {n}"))
    });
}

/// The `slot …` line of a [`CHECK`] log.
fn slot_line(log: &str) -> String {
    log.lines()
        .find(|l| l.starts_with("slot ") && l.split(' ').count() == 3)
        .unwrap_or_else(|| panic!("no slot line in {log}"))
        .to_owned()
}

/// Sets RLIMIT_NOFILE to 1,024 (soft and hard) on `pids`, and checks it
/// took on each that is still there.
fn limit_open_files(pids: &[i32]) {
    for p in pids {
        let out = Command::new("prlimit")
            .args(["--pid", &p.to_string(), "--nofile=1024:1024"])
            .output()
            .expect("prlimit");
        // A process may have ended meanwhile.
        assert!(
            out.status.success() || !alive(*p),
            "prlimit --pid {p}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for p in pids {
        let Ok(limits) = std::fs::read_to_string(format!("/proc/{p}/limits")) else {
            continue;
        };
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap_or_default();
        let nums: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
        assert_eq!(nums, ["1024", "1024"], "pid {p}: {line}");
    }
}

/// Runs `chains` as A's execution `plant` in sandbox `a` and checks each
/// is as deep as asked (and its big file written).
fn plant(host: &Host, dir: &Path, a: &str, chains: &[Chain]) {
    let mut script = PLANT.to_owned();
    for c in chains {
        script.push_str(&format!(
            "chain({:?}, {}, {}, {})\n",
            c.what,
            c.place.python(),
            c.levels,
            c.big_mib
        ));
    }
    let (status, log) = run_script(host, KEY_A, a, "plant", &script);
    assert_eq!(
        status,
        "completed",
        "A's planting: {log}; the host's log:\n{}",
        host_log(dir)
    );
    for c in chains {
        let line = log
            .lines()
            .find(|l| l.starts_with(&format!("chain {} ", c.what)))
            .unwrap_or_else(|| panic!("no chain {} in {log}", c.what));
        let nums: Vec<u64> = line
            .split(' ')
            .skip(2)
            .map(|n| n.parse().expect("number"))
            .collect();
        assert_eq!(nums[0], c.levels, "{line}");
        assert!(nums[1] >= c.big_mib << 20, "the big file: {line}");
    }
}

/// The slot directory holding the tops of A's chains (those on the
/// host's disk, not in the sandbox's own /tmp): where the test then looks
/// for what is left.
fn planted_slot(host: &Host, chains: &[Chain]) -> PathBuf {
    let slots = slot_dirs(host);
    let mut seen = Vec::new();
    for slot in &slots {
        // Only the first levels: walking the chains themselves takes long.
        let out = Command::new("find")
            .arg(slot)
            .args(["-maxdepth", "8", "-name", "by-a-*", "-printf", "%f\\n"])
            .output()
            .expect("find");
        let tops = String::from_utf8_lossy(&out.stdout).into_owned();
        if chains
            .iter()
            .filter(|c| c.on_host())
            .all(|c| tops.lines().any(|l| l == format!("{MARK}-{}", c.what)))
        {
            return slot.clone();
        }
        seen.push(format!("{}: {tops:?}", slot.display()));
    }
    panic!("no slot directory holds A's chains: {seen:?}")
}

/// B's lease after A's, found by retrying until the pool has one for B.
fn lease_b(host: &Host) -> String {
    crate::common::eventually(Duration::from_secs(120), "B leases a sandbox", || {
        let (code, v) = http(
            "POST",
            &format!("{}/local-sandbox", host.base),
            Some(KEY_B),
            Some(r#"{"server_names": []}"#),
        );
        crate::common::when(code == 201, || format!("{code} {v}")).map(|()| id(&v))
    })
}

/// B's [`CHECK`] finds nothing of A's: no name of A's in any temporary
/// directory, the home, the workspace or its execution's directory, and no
/// execution but its own. Returns B's slot line.
fn assert_b_finds_nothing(host: &Host, dir: &Path, b: &str) -> String {
    let (status, log) = run_script(host, KEY_B, b, "check-b", CHECK);
    assert_eq!(status, "completed", "B's check: {log}");
    for line in log.lines().filter(|l| l.starts_with("left in ")) {
        assert!(
            line.ends_with(" []"),
            "B finds A's names: {line}\n{log}\nthe host's log:\n{}",
            host_log(dir)
        );
    }
    assert_eq!(
        log.lines().filter(|l| l.starts_with("left in ")).count(),
        7,
        "{log}"
    );
    assert!(
        log.contains("executions ['check-b']"),
        "B sees another execution: {log}"
    );
    slot_line(&log)
}

/// No slot directory failed to go, none waits for another try.
fn assert_no_reclaim_left(host: &Host) {
    assert_eq!(metric(host, "sandbox_host_slots_reclaim_pending"), 0.0);
    assert_eq!(metric(host, "sandbox_host_slot_removals_failed_total"), 0.0);
}

/// A host with one sandbox at most, `extra` args, optionally under a
/// 1,024 open-file limit; its one slot idle.
fn host_of_one(dir: &Path, extra: &[&str], limited: bool) -> Host {
    let host = Host::start(dir, extra);
    let pid = host.pid().expect("pid") as i32;
    if limited {
        // The host first: what it starts from now on inherits the limit.
        limit_open_files(&[pid]);
    }
    wait_idle(&host, dir, Duration::from_secs(120));
    if limited {
        // Then whatever it started before, its slot's agent among them.
        let tree = process_tree(pid);
        let agents: Vec<i32> = host.agents().into_iter().filter(|a| alive(*a)).collect();
        assert!(
            !agents.is_empty() && agents.iter().all(|a| tree.contains(a)),
            "the slots' processes {agents:?} must be below the host: {tree:?}"
        );
        limit_open_files(&tree);
    }
    host
}

/// A leases, reports its slot, plants `chains` and releases, on a host
/// recycling its one slot: once the slot is idle again the host serves,
/// nothing of A's is left in the slot's directory and the disk space is
/// back, and B lands on the same slot and finds nothing of A's.
fn recycled(chains: &[Chain], limited: bool) {
    let dir = Scratch::in_memory();
    let host = host_of_one(
        dir.path(),
        &[
            "--max-slots",
            "1",
            "--agent-release-timeout",
            RELEASE_TIMEOUT,
            "--recycle-max-inodes",
            RECYCLE_ALWAYS,
        ],
        limited,
    );
    let a = id(&acquire(&host, KEY_A, r#"{"server_names": []}"#));
    let (_, log) = run_script(&host, KEY_A, &a, "slot-a", CHECK);
    let a_slot = slot_line(&log);
    let slot = only_slot(&host, dir.path());
    let before = disk_bytes(&slot);
    plant(&host, dir.path(), &a, chains);
    assert_eq!(planted_slot(&host, chains), slot);
    release(&host, KEY_A, &a);
    wait_idle(&host, dir.path(), RELEASE_BOUND);
    // At once: the slot is idle, so A's trees must already be gone.
    let left = scan(&slot);
    assert_eq!(
        (left.marked, left.sample.as_slice()),
        (0, &[][..]),
        "A's trees are left in {} once the slot is idle: {left:?}; the host's log:\n{}",
        slot.display(),
        host_log(dir.path())
    );
    assert!(
        left.deepest < 40,
        "a deep tree is left in {}: {left:?}",
        slot.display()
    );
    let after = disk_bytes(&slot);
    assert!(
        after < before + (BIG_MIB << 20) / 2,
        "the disk space is not back: {} bytes before A's trees, {after} after the release",
        before
    );
    assert_host_serves(&host, dir.path());
    assert_eq!(only_slot(&host, dir.path()), slot);
    let b = lease_b(&host);
    let b_slot = assert_b_finds_nothing(&host, dir.path(), &b);
    assert_eq!(
        a_slot,
        b_slot,
        "B must land on A's recycled slot; the host's log:\n{}",
        host_log(dir.path())
    );
    assert_no_reclaim_left(&host);
    release(&host, KEY_B, &b);
}

/// As [`recycled`], on a host replacing released slots: the old slot's
/// directory is gone within 300 s (the host removes it), the host serves
/// meanwhile, B has a new slot.
fn replaced(chains: &[Chain], limited: bool) {
    let dir = Scratch::in_memory();
    let host = host_of_one(dir.path(), &["--on-release", "replace"], limited);
    let a = id(&acquire(&host, KEY_A, r#"{"server_names": []}"#));
    let (_, log) = run_script(&host, KEY_A, &a, "slot-a", CHECK);
    let a_slot = slot_line(&log);
    plant(&host, dir.path(), &a, chains);
    // The pool refills at once: A's slot is the one holding A's trees.
    let slot = planted_slot(&host, chains);
    release(&host, KEY_A, &a);
    crate::common::eventually(
        Duration::from_secs(300),
        "the old slot's directory is gone",
        || {
            assert_host_serves(&host, dir.path());
            crate::common::when(!slot.exists(), || {
                let top: Vec<String> = std::fs::read_dir(&slot)
                    .map(|d| {
                        d.flatten()
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                format!("{} still holds {top:?}", slot.display())
            })
        },
    );
    assert_host_serves(&host, dir.path());
    let b = lease_b(&host);
    let b_slot = assert_b_finds_nothing(&host, dir.path(), &b);
    assert_ne!(
        a_slot,
        b_slot,
        "B must have a new slot; the host's log:\n{}",
        host_log(dir.path())
    );
    assert_no_reclaim_left(&host);
    release(&host, KEY_B, &b);
}

#[test]
fn deep_trees_of_a_recycled_slot_are_removed_and_the_host_survives() {
    recycled(DEEP, false);
}

#[test]
fn deep_trees_of_a_replaced_slot_are_removed_and_the_host_survives() {
    replaced(DEEP, false);
}

/// The agent's removal at Release under a 1,024 open-file limit.
#[test]
fn deep_trees_under_an_open_file_limit_leave_nothing_in_a_recycled_slot() {
    recycled(UNDER_LIMIT, true);
}

/// Issue 50: round 5's crash of a slot's agent (1 run in 5), a 3,000-level
/// chain with the big file at its bottom in the workspace released under
/// a 1,024 open-file limit, looped: five leases on one recycled slot, and
/// after each Release the same agent serves (no crash, no replacement)
/// and nothing of A's is left.
#[test]
fn a_deep_workspace_chain_under_an_open_file_limit_released_five_times() {
    const CHAIN: &[Chain] = &[Chain::new("wsbig", Place::Workspace, 3_000, BIG_MIB)];
    let dir = Scratch::in_memory();
    let host = host_of_one(
        dir.path(),
        &[
            "--max-slots",
            "1",
            "--agent-release-timeout",
            RELEASE_TIMEOUT,
            "--recycle-max-inodes",
            RECYCLE_ALWAYS,
        ],
        true,
    );
    let agents: Vec<i32> = host.agents().into_iter().filter(|a| alive(*a)).collect();
    assert_eq!(agents.len(), 1, "{agents:?}");
    let slot = only_slot(&host, dir.path());
    for round in 1..=5 {
        let a = id(&acquire(&host, KEY_A, r#"{"server_names": []}"#));
        plant(&host, dir.path(), &a, CHAIN);
        release(&host, KEY_A, &a);
        wait_idle(&host, dir.path(), RELEASE_BOUND);
        assert!(
            alive(agents[0]),
            "round {round}: the slot's agent died; its log:\n{}\nthe host's log:\n{}",
            std::fs::read_to_string(slot.join("agent.log")).unwrap_or_default(),
            host_log(dir.path())
        );
        assert_eq!(only_slot(&host, dir.path()), slot, "round {round}");
        let left = scan(&slot);
        assert_eq!(left.marked, 0, "round {round}: {left:?}");
    }
}

/// The host's removal of a replaced slot under a 1,024 open-file limit.
#[test]
fn deep_trees_under_an_open_file_limit_leave_no_replaced_slot_behind() {
    replaced(UNDER_LIMIT, true);
}

/// A's trash: 30,000 empty directories in the workspace, 2,000 in the
/// home.
const TRASH: &str = r#"
import os
for i in range(30000):
    os.mkdir('/workspace/by-a-%d' % i)
home = os.environ['HOME']
for i in range(2000):
    os.mkdir(home + '/by-a-%d' % i)
print('made', len(os.listdir('/workspace')), len([n for n in os.listdir(home) if 'by-a' in n]))
"#;

/// B's Acquire never waits for A's trash: when the slot is idle again,
/// none of A's 32,000 directories is left in the slot's directory, and B
/// lands on that slot. While the agent deletes them, the released sandbox
/// still counts against A's cap (issue 50): A's next Acquire, at its cap
/// of one, waits until they are gone.
#[test]
fn no_trash_is_left_when_a_recycled_slot_is_idle_again() {
    let dir = Scratch::in_memory();
    let host = host_of_one(
        dir.path(),
        &[
            "--max-slots",
            "1",
            "--max-sandboxes-per-key",
            "1",
            "--recycle-max-inodes",
            RECYCLE_ALWAYS,
        ],
        false,
    );
    let a = id(&acquire(&host, KEY_A, r#"{"server_names": []}"#));
    let (_, log) = run_script(&host, KEY_A, &a, "slot-a", CHECK);
    let a_slot = slot_line(&log);
    let slot = only_slot(&host, dir.path());
    let (status, log) = run_script(&host, KEY_A, &a, "trash", TRASH);
    assert_eq!(status, "completed", "{log}");
    assert!(log.contains("made 30000 2000"), "{log}");
    let planted = scan(&slot);
    assert!(planted.marked >= 32_000, "{planted:?}");
    release(&host, KEY_A, &a);
    // A's next Acquire waits until A's trash is gone: the only slot holds
    // none of it when the Acquire answers.
    let again = id(&acquire(&host, KEY_A, r#"{"server_names": []}"#));
    let left = scan(&slot);
    assert_eq!(
        left.marked, 0,
        "A's Acquire did not wait for A's trash to go: {left:?}"
    );
    release(&host, KEY_A, &again);
    wait_idle(&host, dir.path(), RELEASE_BOUND);
    let left = scan(&slot);
    assert_eq!(
        left.marked,
        0,
        "A's trash is left in {} once the slot is idle: {left:?}; the host's log:\n{}",
        slot.display(),
        host_log(dir.path())
    );
    let b = lease_b(&host);
    let b_slot = assert_b_finds_nothing(&host, dir.path(), &b);
    assert_eq!(a_slot, b_slot, "B must land on A's recycled slot");
    release(&host, KEY_B, &b);
}

/// A's marks on the workspace root and its home: inode flags `A`
/// (noatime), `d` (nodump), `S` (sync) by `FS_IOC_SETFLAGS`, and a
/// `user.msg` xattr; each read back. Prints, per directory, the flags
/// before and after and the xattrs after.
const MARKS: &str = r#"
import fcntl, os, struct
GET, SET = 0x80086601, 0x40086602
WANT = 0x80 | 0x40 | 0x08
def flags(p):
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return struct.unpack('i', fcntl.ioctl(fd, GET, struct.pack('q', 0))[:4])[0]
    finally:
        os.close(fd)
def mark(p):
    before = flags(p)
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, SET, struct.pack('q', before | WANT))
    except OSError as e:
        print('unsupported flags', p, e.errno, flush=True)
    finally:
        os.close(fd)
    try:
        os.setxattr(p, 'user.msg', b'hi')
    except OSError as e:
        print('unsupported xattr', p, e.errno, flush=True)
    print('marked', p, hex(before), hex(flags(p)), sorted(os.listxattr(p)), flush=True)
for p in ['/workspace', os.environ['HOME']]:
    mark(p)
"#;

/// What B reads of the same directories.
const READ_MARKS: &str = r#"
import fcntl, os, struct
GET = 0x80086601
def flags(p):
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return struct.unpack('i', fcntl.ioctl(fd, GET, struct.pack('q', 0))[:4])[0]
    finally:
        os.close(fd)
started = open('/proc/1/stat').read().rsplit(') ', 1)[1].split()[19]
print('slot', open('/proc/self/uid_map').read().split()[1], started)
for p in ['/workspace', os.environ['HOME']]:
    print('found', p, hex(flags(p)), sorted(os.listxattr(p)), flush=True)
"#;

/// Inode flags the test sets (`A`, `d`, `S`).
const WANT_FLAGS: u64 = 0x80 | 0x40 | 0x08;

/// `(path, flags before, flags after, xattrs)` of the `marked` lines, or
/// `(path, flags, xattrs)` of the `found` lines (`before` then 0).
fn marks(log: &str, prefix: &str) -> Vec<(String, u64, u64, String)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex");
    log.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|l| {
            let mut parts = l.splitn(4, ' ');
            let path = parts.next().unwrap_or_default().to_owned();
            let a = hex(parts.next().unwrap_or("0"));
            let rest = parts.collect::<Vec<_>>();
            if prefix == "marked " {
                let (after, x) = rest.split_first().expect("after");
                (path, a, hex(after), x.join(" "))
            } else {
                (path, 0, a, rest.join(" "))
            }
        })
        .collect()
}

/// Inode flags and xattrs A sets on the workspace root and its home never
/// reach B on the same (recycled) slot.
#[test]
fn inode_flags_and_xattrs_of_the_workspace_and_home_do_not_cross_a_lease() {
    let dir = Scratch::new();
    // The slots' files on the data dir's disk filesystem (the slot's own
    // tmpfs takes no inode flags: there a tenant cannot set them at all).
    let host = host_of_one(
        dir.path(),
        &["--max-slots", "1", "--slot-disk-bytes", "0"],
        false,
    );
    let a = id(&acquire(&host, KEY_A, r#"{"server_names": []}"#));
    let (status, log) = run_script(&host, KEY_A, &a, "marks", MARKS);
    assert_eq!(status, "completed", "{log}");
    let set = marks(&log, "marked ");
    assert_eq!(set.len(), 2, "{log}");
    let supported = !log.contains("unsupported")
        && set
            .iter()
            .all(|(_, _, after, x)| after & WANT_FLAGS == WANT_FLAGS && x.contains("'user.msg'"));
    let fs = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(&host.data)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    if !crate::common::have_or_skip(
        supported,
        "inode flags and xattrs crossing a lease",
        &format!(
            "a filesystem under the data dir ({fs} at {}) taking inode flags A, d, S and user xattrs; A's script said:\n{log}",
            host.data.display()
        ),
    ) {
        return;
    }
    for (path, before, _, _) in &set {
        assert_eq!(
            before & WANT_FLAGS,
            0,
            "{path} has the flags before A sets them: nothing to test; {log}"
        );
    }
    let (_, log_a) = run_script(&host, KEY_A, &a, "slot-a", CHECK);
    let a_slot = slot_line(&log_a);
    release(&host, KEY_A, &a);
    wait_idle(&host, dir.path(), Duration::from_secs(120));
    let b = lease_b(&host);
    let (status, found) = run_script(&host, KEY_B, &b, "read-marks", READ_MARKS);
    assert_eq!(status, "completed", "{found}");
    assert_eq!(
        slot_line(&found),
        a_slot,
        "B must land on A's recycled slot"
    );
    let found = marks(&found, "found ");
    assert_eq!(found.len(), 2, "{found:?}");
    for ((path, before, _, _), (p, _, now, x)) in set.iter().zip(&found) {
        assert_eq!(path, p);
        assert_eq!(
            now & WANT_FLAGS,
            before & WANT_FLAGS,
            "{path}: A's inode flags reach B ({now:#x}; before A: {before:#x})"
        );
        assert!(!x.contains("user.msg"), "{path}: A's xattr reaches B: {x}");
    }
    release(&host, KEY_B, &b);
}

/// A fills its sandbox's own file system: as many directories as it can
/// make in the workspace, its home and /tmp, until the kernel says no.
const FILL: &str = r#"
import errno, os
made, why = 0, None
try:
    for top in ['/workspace', os.environ['HOME'], '/tmp']:
        for i in range(1_000_000):
            os.mkdir('%s/by-a-%d' % (top, i))
            made += 1
except OSError as e:
    why = errno.errorcode.get(e.errno, e.errno)
print('made', made, why)
"#;

/// Issue 50: what a lease can leave is bounded by the kernel, and A's
/// trash costs no one else a place. Three of A's sandboxes fill
/// their file systems (`--slot-inodes`) until ENOSPC; A releases them.
/// Each is discarded whole (unmounted: its directory is gone, no removal
/// file by file), and B then acquires every place of `--max-slots`.
#[test]
fn a_lease_that_fills_its_inodes_leaves_no_one_waiting_for_its_trash() {
    let dir = Scratch::in_memory();
    let host = Host::start(
        dir.path(),
        &[
            "--pool-size",
            "2",
            "--max-slots",
            "4",
            "--slot-inodes",
            "30000",
        ],
    );
    let mut ids = Vec::new();
    for n in 0..3 {
        let a = id(&acquire(&host, KEY_A, r#"{"server_names": []}"#));
        let (status, log) = run_script(&host, KEY_A, &a, &format!("fill-{n}"), FILL);
        assert_eq!(status, "completed", "{log}");
        let line = log
            .lines()
            .find(|l| l.starts_with("made "))
            .unwrap_or_default();
        let made: u64 = line
            .split(' ')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        assert!(
            line.ends_with(" ENOSPC") && made > 10_000 && made < 30_000,
            "the kernel must stop A at --slot-inodes: {line:?}\n{log}"
        );
        ids.push(a);
    }
    // A's slots: those whose workspace holds A's directories.
    let filled: Vec<PathBuf> = slot_dirs(&host)
        .into_iter()
        .filter(|d| {
            let out = Command::new("find")
                .arg(d)
                .args(["-maxdepth", "5", "-name", "by-a-0", "-print", "-quit"])
                .output()
                .expect("find");
            !out.stdout.is_empty()
        })
        .collect();
    assert_eq!(filled.len(), 3, "{filled:?}");
    for a in &ids {
        release(&host, KEY_A, a);
    }
    let (mut acquired, mut refused) = (Vec::new(), 0);
    crate::common::eventually(Duration::from_secs(60), "B holds 4 sandboxes", || {
        let (code, v) = http(
            "POST",
            &format!("{}/local-sandbox", host.base),
            Some(KEY_B),
            Some(r#"{"server_names": []}"#),
        );
        match code {
            201 => acquired.push(id(&v)),
            503 => refused += 1,
            _ => panic!("B's Acquire: {code} {v}"),
        }
        crate::common::when(acquired.len() == 4, || {
            format!("{} of 4, {refused} refused", acquired.len())
        })
    });
    // A discard ends in the background after the Release's answer (its
    // unmount may finish after B's Acquires under load): wait for it.
    crate::common::eventually(
        Duration::from_secs(60),
        "A's filled slots are discarded",
        || {
            let kept: Vec<&PathBuf> = filled.iter().filter(|d| d.exists()).collect();
            crate::common::when(kept.is_empty(), || {
                format!(
                    "A's filled slots must be discarded, not kept: {kept:?}; the host's log:\n{}",
                    host_log(dir.path())
                )
            })
        },
    );
    assert!(
        host_log(dir.path()).contains("discarded with what it held"),
        "{}",
        host_log(dir.path())
    );
    for b in &acquired {
        release(&host, KEY_B, b);
    }
}
