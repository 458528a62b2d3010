//! The slots' id blocks: each slot's 65,536 subordinate ids, claimed
//! machine-wide so two hosts never give one uid to two sandboxes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::Ordering;

use super::{IDS_PER_SLOT, Isolation, IsolationError, io};

impl Isolation {
    /// Takes the lowest free id block for the new slot `dir`, machine-wide:
    /// each block in use is a symlink `BLOCK_REGISTRY/<n>` to its slot's
    /// directory, made atomically, with `<n>.owner` naming the host that
    /// claimed it (pid and start time, so a reused pid is not taken for
    /// it), so two hosts of one user (two data dirs) never give a uid to
    /// two sandboxes. A claimed block is free again when its slot directory
    /// or the host that claimed it is gone, and no process runs with one
    /// of its ids (the slot's agent, which outlives a host
    /// restart on purpose, holds them while it lives; as PID 1 of its pid
    /// namespace, every process of the slot dies with it). The block is
    /// also recorded in `dir/uid_block`. When none is free, the log says
    /// how many are claimed and by which hosts, and the exhaustion is
    /// counted (`/metrics`).
    pub(in crate::pool) fn take_block(&self, dir: &Path) -> Result<u32, IsolationError> {
        let registry = self.registry.as_path();
        let _lock = lock_registry(registry)?;
        let mut in_use: Option<BTreeSet<u32>> = None;
        for block in 0..self.blocks {
            let link = registry.join(block.to_string());
            let taken = match std::os::unix::fs::symlink(dir, &link) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A slot directory removed under a running agent (its
                    // data dir deleted) frees nothing while a process runs
                    // with the block's ids: two sandboxes would share them.
                    let dir_gone = std::fs::read_link(&link).is_ok_and(|t| !t.exists());
                    let free = (dir_gone || !owner_alive(registry, block))
                        && !in_use
                            .get_or_insert_with(|| self.blocks_with_processes())
                            .contains(&block);
                    free && std::fs::remove_file(&link).is_ok()
                        && std::os::unix::fs::symlink(dir, &link).is_ok()
                }
                Err(e) => return Err(io(format!("creating {}", link.display()))(e)),
            };
            if taken {
                write_owner(registry, block)?;
                std::fs::write(dir.join("uid_block"), block.to_string())
                    .map_err(io(format!("writing {}/uid_block", dir.display())))?;
                return Ok(block);
            }
        }
        self.exhausted.fetch_add(1, Ordering::Relaxed);
        let mut owners: BTreeMap<String, u32> = BTreeMap::new();
        for block in 0..self.blocks {
            let o = std::fs::read_to_string(owner_path(registry, block))
                .ok()
                .and_then(|t| t.split_whitespace().next().map(str::to_owned))
                .unwrap_or_else(|| "unknown".into());
            *owners.entry(o).or_default() += 1;
        }
        tracing::warn!(
            claimed = self.blocks,
            by_host_pid = ?owners,
            registry = %registry.display(),
            "every subordinate id block is claimed: no more sandboxes can start on this machine \
             (blocks of hosts that are gone are freed once no process of theirs runs)"
        );
        Err(IsolationError::Exhausted(self.blocks))
    }

    /// Makes this host the owner of the block slot `dir` holds (a slot
    /// taken back after a restart), if the registry gives it to that slot.
    pub(in crate::pool) fn adopt_block(&self, dir: &Path) {
        let Some(block) = block_of(dir) else { return };
        let Ok(_lock) = lock_registry(&self.registry) else {
            return;
        };
        let link = self.registry.join(block.to_string());
        if std::fs::read_link(&link).is_ok_and(|t| t == dir) {
            let _ = write_owner(&self.registry, block);
        }
    }

    /// Blocks claimed in the registry (by any host) and blocks this host's
    /// subordinate ids hold, for `/metrics`.
    pub fn block_counts(&self) -> (u32, u32) {
        let claimed = (0..self.blocks)
            .filter(|b| self.registry.join(b.to_string()).symlink_metadata().is_ok())
            .count() as u32;
        (claimed, self.blocks)
    }

    /// How many times a slot could not start for want of a free block.
    pub fn blocks_exhausted(&self) -> u64 {
        self.exhausted.load(Ordering::Relaxed)
    }

    /// The blocks some live process has an id of (real, effective, saved
    /// or filesystem uid), from /proc.
    fn blocks_with_processes(&self) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        let Ok(d) = std::fs::read_dir("/proc") else {
            return out;
        };
        for e in d.flatten() {
            if !e
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
            {
                continue;
            }
            let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                continue;
            };
            let uids = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .unwrap_or_default();
            for uid in uids
                .split_whitespace()
                .filter_map(|u| u.parse::<u32>().ok())
            {
                if let Some(off) = uid.checked_sub(self.uid_start) {
                    let block = off / IDS_PER_SLOT;
                    if block < self.blocks {
                        out.insert(block);
                    }
                }
            }
        }
        out
    }

    pub(super) fn ids(&self, block: u32) -> (u32, u32) {
        (
            self.uid_start + block * IDS_PER_SLOT,
            self.gid_start + block * IDS_PER_SLOT,
        )
    }
}

/// Where the id blocks in use on this machine are claimed (see
/// [`Isolation::take_block`]).
pub(super) const BLOCK_REGISTRY: &str = "/run/sandbox-host/uid-blocks";

/// One taker or releaser at a time, machine-wide: two takers of one stale
/// link would otherwise both remove it and both believe the block theirs.
fn lock_registry(registry: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, IsolationError> {
    std::fs::create_dir_all(registry).map_err(io(format!("creating {}", registry.display())))?;
    let lock_path = registry.join(".lock");
    let lock = std::fs::File::create(&lock_path)
        .map_err(io(format!("creating {}", lock_path.display())))?;
    nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| io(format!("locking {}", lock_path.display()))(e.into()))
}

fn owner_path(registry: &Path, block: u32) -> std::path::PathBuf {
    registry.join(format!("{block}.owner"))
}

/// Records this host (pid and start time) as the claimer of `block`.
fn write_owner(registry: &Path, block: u32) -> Result<(), IsolationError> {
    let pid = std::process::id();
    let start = start_time(pid).unwrap_or(0);
    let p = owner_path(registry, block);
    std::fs::write(&p, format!("{pid} {start}\n")).map_err(io(format!("writing {}", p.display())))
}

/// Whether the host that claimed `block` may still run: the same process
/// (its start time matches), or no owner recorded (a claim of an older
/// host, which may be starting the slot's agent right now: such a block
/// is freed only when its slot directory is gone, as before).
fn owner_alive(registry: &Path, block: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(owner_path(registry, block)) else {
        return true;
    };
    // An owner file older than the claim is not the claimer's (an older
    // host re-claimed the block without writing one): unknown, as above.
    let mtime = |p: &Path| std::fs::symlink_metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(owner), Some(link)) = (
        mtime(&owner_path(registry, block)),
        mtime(&registry.join(block.to_string())),
    ) && owner < link
    {
        return true;
    }
    let mut f = text.split_whitespace();
    let (Some(pid), Some(start)) = (
        f.next().and_then(|p| p.parse::<u32>().ok()),
        f.next().and_then(|s| s.parse::<u64>().ok()),
    ) else {
        return false;
    };
    start_time(pid) == Some(start)
}

/// A process's start time (clock ticks since boot, /proc/<pid>/stat field
/// 22), `None` when it is gone or a zombie.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let mut f = rest.split(' ');
    if matches!(f.next(), Some("Z") | Some("X")) {
        return None;
    }
    // Fields 4.. follow the state (field 3); the start time is field 22.
    f.nth(18)?.parse().ok()
}

fn block_of(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("uid_block"))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
}

/// Frees the id block the slot `dir` holds, if the registry still gives it
/// to that slot.
pub(super) fn release_block(dir: &Path) {
    let Some(block) = block_of(dir) else {
        return;
    };
    let registry = Path::new(BLOCK_REGISTRY);
    let Ok(_lock) = lock_registry(registry) else {
        return;
    };
    let link = registry.join(block.to_string());
    if std::fs::read_link(&link).is_ok_and(|t| t == dir) {
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_file(owner_path(registry, block));
    }
}

/// The first range of `user` (by name or uid) in a subordinate id file.
pub(super) fn subids(file: &str, user: &str, uid: u32) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.trim().split(':');
        let (name, start, count) = (f.next()?, f.next()?, f.next()?);
        if name != user && name != uid.to_string() {
            return None;
        }
        let (start, count) = (start.parse().ok()?, count.parse::<u32>().ok()?);
        (count >= IDS_PER_SLOT).then_some((start, count))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An isolation of `blocks` blocks far above any real id, claimed in
    /// a registry of its own.
    fn isolation(registry: &Path, blocks: u32) -> Isolation {
        Isolation {
            cfg: super::super::IsolationConfig {
                read_only: vec![],
                memory_max: 1,
                pids_max: 1,
                network: super::super::Network::None,
                host_ports: vec![],
                data_dir: registry.to_owned(),
                api_port: 0,
                slot_fs: None,
            },
            uid_start: 3_000_000_000,
            gid_start: 3_000_000_000,
            blocks,
            cgroups: super::super::cgroups::CgroupLayout::detect(),
            exhausted: Default::default(),
            registry: registry.to_owned(),
        }
    }

    /// A pid no process has any more.
    fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    #[test]
    fn a_block_whose_claimer_and_processes_are_gone_is_taken_again() {
        let d = tempfile::tempdir().unwrap();
        let reg = d.path().join("registry");
        std::fs::create_dir(&reg).unwrap();
        let iso = isolation(&reg, 4);
        let slot = |n: &str| {
            let p = d.path().join(n);
            std::fs::create_dir(&p).unwrap();
            p
        };
        // Block 0: a live host's (this process), its slot still there.
        std::os::unix::fs::symlink(slot("live"), reg.join("0")).unwrap();
        write_owner(&reg, 0).unwrap();
        // Block 1: an older host's claim (no owner), its slot still there:
        // it may be starting its agent, so the block stays claimed.
        std::os::unix::fs::symlink(slot("older"), reg.join("1")).unwrap();
        // Block 2: a host that died, its slot directory left behind.
        std::os::unix::fs::symlink(slot("left"), reg.join("2")).unwrap();
        std::fs::write(reg.join("2.owner"), format!("{} 1\n", dead_pid())).unwrap();
        let new = slot("new");
        assert_eq!(iso.take_block(&new).unwrap(), 2);
        assert_eq!(std::fs::read_link(reg.join("2")).unwrap(), new);
        assert!(owner_alive(&reg, 2));
        assert_eq!(iso.block_counts(), (3, 4));
        // Block 3 next; then none: counted.
        assert_eq!(iso.take_block(&slot("third")).unwrap(), 3);
        assert_eq!(iso.blocks_exhausted(), 0);
        assert!(matches!(
            iso.take_block(&slot("fourth")),
            Err(IsolationError::Exhausted(4))
        ));
        assert_eq!(iso.blocks_exhausted(), 1);
        assert_eq!(iso.block_counts(), (4, 4));
    }

    #[test]
    fn a_block_with_a_live_process_stays_claimed_after_its_host_died() {
        if !nix::unistd::geteuid().is_root() {
            // CI runs the tests as root: a skip there would leave this
            // untested without a word.
            let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
            assert!(
                !ci,
                "a process of the block's uid needs root, and CI=true: the test command must run as root in CI"
            );
            eprintln!("skipped: needs root (a process of the block's uid)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let reg = d.path().join("registry");
        std::fs::create_dir(&reg).unwrap();
        let iso = isolation(&reg, 2);
        let old = d.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::os::unix::fs::symlink(&old, reg.join("0")).unwrap();
        std::fs::write(reg.join("0.owner"), format!("{} 1\n", dead_pid())).unwrap();
        // The slot's agent (uid `base` of block 0) outlived its host.
        use std::os::unix::process::CommandExt;
        let mut agent = std::process::Command::new("sleep")
            .arg("60")
            .uid(iso.uid_start)
            .spawn()
            .unwrap();
        let new = d.path().join("new");
        std::fs::create_dir(&new).unwrap();
        let got = iso.take_block(&new);
        let _ = agent.kill();
        let _ = agent.wait();
        assert_eq!(got.unwrap(), 1, "block 0's agent still runs");
        // Once it is gone, block 0 is free.
        let newer = d.path().join("newer");
        std::fs::create_dir(&newer).unwrap();
        assert_eq!(iso.take_block(&newer).unwrap(), 0);
    }

    #[test]
    fn subordinate_ranges_are_found_by_name_or_uid() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("subuid");
        std::fs::write(&f, "alice:100000:65536\n1001:300000:131072\nbob:5:10\n").unwrap();
        let f = f.to_str().unwrap();
        assert_eq!(subids(f, "alice", 1000), Some((100000, 65536)));
        assert_eq!(subids(f, "carol", 1001), Some((300000, 131072)));
        // Too small for one slot.
        assert_eq!(subids(f, "bob", 7), None);
        assert_eq!(subids(f, "dave", 8), None);
    }
}
