//! Slots that must go, and go for certain: a slot is stopped and its
//! directory removed off the runtime with the bounded removal
//! (`sandbox_tree`: no recursion, a bounded number of open directories,
//! whatever tree its tenant left); a directory that could not be removed
//! stays on the reclaim list (counted in `/metrics`) and is tried again at
//! every reclaim pass, which also ends the slots of the data dir this pool
//! does not know (no live lease of its own can adopt them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use super::slot::stop;
use super::{Kind, Pool, Slot};

/// The reclaim list and its counts.
#[derive(Default)]
pub(super) struct Reclaim {
    /// Slot directories whose removal failed, to be tried again.
    pending: Mutex<BTreeSet<PathBuf>>,
    /// Slot ids being made (their directory exists before the slot is
    /// listed anywhere): never taken for orphans.
    making: Mutex<BTreeSet<String>>,
    /// Slot ids the last pass found in no list: ended if the next pass
    /// finds them so again (a slot moving between lists is in none for a
    /// moment, never for a whole interval).
    suspects: Mutex<BTreeSet<String>>,
    failed: AtomicU64,
    orphans: AtomicU64,
}

/// What `/metrics` shows of the reclaim.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReclaimCounts {
    /// Slot directories waiting for another removal.
    pub pending: usize,
    /// Removals of a slot directory that failed, since start.
    pub failed: u64,
    /// Slots ended because nothing of this host could adopt them.
    pub orphans: u64,
}

/// A slot id being made (its directory exists, the slot is in no list
/// yet), until dropped.
pub(super) struct Making {
    reclaim: Arc<Reclaim>,
    id: String,
}

impl Drop for Making {
    fn drop(&mut self) {
        self.reclaim.making_mut().remove(&self.id);
    }
}

impl Reclaim {
    fn pending_mut(&self) -> std::sync::MutexGuard<'_, BTreeSet<PathBuf>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn making_mut(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.making.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn suspects_mut(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.suspects.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks slot `id` as being made, until the guard drops.
    pub(super) fn making(self: &Arc<Self>, id: &str) -> Making {
        self.making_mut().insert(id.to_owned());
        Making {
            reclaim: self.clone(),
            id: id.to_owned(),
        }
    }

    /// Stops `slot` and removes its directory. Blocking: call it off the
    /// runtime. A directory that cannot be removed is kept for reclaim.
    pub(super) fn discard(&self, slot: &Slot) {
        stop(slot);
        if let Some(dir) = slot.dir() {
            self.remove_dir(dir);
        }
    }

    /// Removes a slot directory, or keeps it for the next reclaim pass.
    /// Blocking.
    pub(super) fn remove_dir(&self, dir: &Path) {
        if dir.as_os_str().is_empty() {
            return;
        }
        // An isolated slot's own file system goes whole, whatever it holds.
        super::isolate::slot_fs::unmount(dir);
        match sandbox_tree::remove_path(dir) {
            Ok(()) => {
                self.pending_mut().remove(dir);
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                warn!(error = %e, dir = %dir.display(), "a slot's directory could not be removed; it is tried again at the next reclaim pass");
                self.pending_mut().insert(dir.to_owned());
            }
        }
    }

    /// Stops and removes `slot` on a blocking thread, and waits for it.
    pub(super) async fn discard_off_runtime(self: &Arc<Self>, slot: Slot) {
        let r = self.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || r.discard(&slot)).await {
            warn!(error = %e, "the task discarding a slot failed");
        }
    }
}

impl Pool {
    pub fn on_release(&self) -> super::OnRelease {
        self.cfg.on_release
    }

    /// Past how many entries of its own file system leased slot `id` is
    /// discarded at its Release (`ReleaseRequest.discard_over_inodes`;
    /// 0: never, the slot has none): an unmount drops them at once where
    /// emptying them would hold the slot.
    pub fn discard_over_inodes(&self, id: &str) -> u64 {
        let dir = self
            .leased()
            .get(id)
            .and_then(|s| s.dir().map(Path::to_owned));
        let own = dir.is_some_and(|d| super::isolate::slot_fs::used_inodes(&d).is_some());
        if own {
            self.cfg.recycle_max_inodes.max(1)
        } else {
            0
        }
    }

    pub fn reclaim_counts(&self) -> ReclaimCounts {
        ReclaimCounts {
            pending: self.reclaim.pending_mut().len(),
            failed: self.reclaim.failed.load(Ordering::Relaxed),
            orphans: self.reclaim.orphans.load(Ordering::Relaxed),
        }
    }

    /// One reclaim pass (blocking): the directories whose removal failed
    /// are removed again, and every slot directory of the data dir this
    /// pool did not hold (idle, starting, leased or being made) at this
    /// pass nor at the one before is ended:
    /// its agent stopped if it still runs, its cgroups and id block
    /// released, its directory removed. Returns how many slots it ended.
    pub fn reclaim(&self) -> usize {
        let pending: Vec<PathBuf> = self.reclaim.pending_mut().iter().cloned().collect();
        for dir in pending {
            self.reclaim.remove_dir(&dir);
        }
        if matches!(self.cfg.backend, super::Backend::Kubernetes) {
            return 0;
        }
        let Ok(entries) = std::fs::read_dir(&self.cfg.dir) else {
            return 0;
        };
        let mut ended = 0;
        let before = std::mem::take(&mut *self.reclaim.suspects_mut());
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            let dir = e.path();
            if self.holds(&id) || self.reclaim.pending_mut().contains(&dir) {
                continue;
            }
            if !before.contains(&id) {
                self.reclaim.suspects_mut().insert(id);
                continue;
            }
            info!(slot = %id, "ending a slot nothing of this host can adopt");
            match orphan(&id, &dir) {
                Some(slot) => stop(&slot),
                None => super::isolate::teardown(&id, &dir),
            }
            self.reclaim.orphans.fetch_add(1, Ordering::Relaxed);
            self.reclaim.remove_dir(&dir);
            ended += 1;
        }
        if self.cfg.isolation.is_some() {
            self.end_strays(&before);
        }
        ended
    }

    /// What isolated slots no host ends left outside their namespaces:
    /// pastas whose agent is gone, and slot cgroups that are empty and held
    /// by nothing of this pool at this pass and the one before.
    fn end_strays(&self, before: &BTreeSet<String>) {
        super::isolate::end_stray_pastas();
        for (id, group) in super::isolate::empty_slot_groups() {
            if self.holds(&id) {
                continue;
            }
            let key = format!("cgroup:{id}");
            if !before.contains(&key) {
                self.reclaim.suspects_mut().insert(key);
                continue;
            }
            match super::isolate::remove_empty_group(&group) {
                Ok(()) => info!(slot = %id, "removed the empty cgroup of a slot nothing holds"),
                Err(e) => warn!(slot = %id, error = %e, "cannot remove an empty slot cgroup"),
            }
        }
    }

    /// Whether slot `id` is this pool's: idle, starting, leased or being
    /// made.
    fn holds(&self, id: &str) -> bool {
        self.reclaim.making_mut().contains(id)
            || self.leased().contains_key(id)
            || self.starting().contains_key(id)
            || self.idle().iter().any(|i| i.slot.id == id)
    }
}

/// The slot a directory of the data dir describes (`None` without a pid:
/// only the directory is left).
fn orphan(id: &str, dir: &Path) -> Option<Slot> {
    let kind = match std::fs::read_to_string(dir.join("backend")).as_deref() {
        Ok("qemu") => Kind::Qemu,
        _ => Kind::Process,
    };
    let pid = std::fs::read_to_string(dir.join("agent.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|&p: &u32| p > 1)?;
    Some(Slot::local(id.to_owned(), kind, dir.to_owned(), pid))
}

impl Pool {
    /// Runs a reclaim pass now and then every `every`, until the pool
    /// closes.
    pub async fn keep_reclaiming(self: Arc<Self>, every: Duration) {
        loop {
            if self.is_closed() {
                return;
            }
            let p = self.clone();
            match tokio::task::spawn_blocking(move || p.reclaim()).await {
                Ok(0) => {}
                Ok(n) => info!(
                    ended = n,
                    "reclaim: ended slots nothing of this host could adopt"
                ),
                Err(e) => warn!(error = %e, "the reclaim pass failed"),
            }
            tokio::time::sleep(every).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{AgentEnv, Backend, OnRelease, PoolConfig};

    fn pool(dir: &Path) -> Arc<Pool> {
        Pool::new(PoolConfig {
            backend: Backend::Process {
                agent_bin: "/nonexistent/sandbox-agent".into(),
                manifest: None,
            },
            dir: dir.to_path_buf(),
            size: 0,
            warm: vec![],
            on_release: OnRelease::Recycle,
            recycle_max_inodes: 20_000,
            isolation: None,
            start_timeout: None,
            agent_env: AgentEnv::default(),
            max_slots: None,
            deadlines: Default::default(),
            discovery: None,
        })
        .expect("pool")
    }

    /// A chain of `depth` directories below `dir`, made by handles.
    fn chain(dir: &Path, depth: usize) {
        use nix::fcntl::{OFlag, open, openat};
        use nix::sys::stat::{Mode, mkdirat};
        let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        let mut cur = open(dir, flags, Mode::empty()).expect("open");
        for _ in 0..depth {
            mkdirat(&cur, "d", Mode::S_IRWXU).expect("mkdir");
            cur = openat(&cur, "d", flags, Mode::empty()).expect("open");
        }
    }

    /// A slot directory nobody holds, its process running, is ended at the
    /// second pass that finds it so: the process killed, the directory
    /// (a 20,000-level tree in it) removed, and counted.
    #[test]
    fn a_slot_held_in_no_list_is_ended_at_the_second_pass() {
        let shm = Path::new("/dev/shm");
        let t = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .expect("tempdir");
        let p = pool(t.path());
        let id = "0123456789abcdef0123456789abcdef";
        let dir = t.path().join(id);
        std::fs::create_dir(&dir).expect("mkdir");
        chain(&dir, 20_000);
        // A process whose command line names the slot, as an agent's does.
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg0(id).arg("60");
        // SAFETY: only an async-signal-safe call between fork and exec:
        // SIGTERM's default action back (a test runner may ignore it).
        unsafe {
            cmd.pre_exec(|| {
                use nix::sys::signal::{SigHandler, Signal, signal};
                signal(Signal::SIGTERM, SigHandler::SigDfl)
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn().expect("sleep");
        std::fs::write(dir.join("agent.pid"), child.id().to_string()).expect("pid");
        let probe = orphan(id, &dir).expect("slot");
        assert!(probe.alive(), "the stand-in agent runs");
        assert_eq!(p.reclaim(), 0, "one pass only suspects it");
        assert!(dir.exists());
        assert_eq!(p.reclaim(), 1);
        assert!(!dir.exists(), "the slot's directory is gone");
        let status = child.wait().expect("wait");
        assert!(!status.success(), "the slot's process was ended: {status}");
        let c = p.reclaim_counts();
        assert_eq!((c.orphans, c.pending, c.failed), (1, 0, 0));
    }

    /// A directory that cannot be removed stays on the list (counted) and
    /// goes at the next pass that can remove it.
    #[test]
    fn a_failed_removal_is_kept_and_retried() {
        let t = tempfile::tempdir().expect("tempdir");
        let p = pool(t.path().join("slots").as_path());
        let dir = t.path().join("slots/stuck");
        std::fs::create_dir_all(dir.join("a")).expect("mkdir");
        // It cannot be removed, even by root: a read-only bind mount of
        // itself (unmounted however the test ends).
        use nix::mount::{MntFlags, MsFlags, mount, umount2};
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = umount2(self.0, MntFlags::MNT_DETACH);
            }
        }
        let none: Option<&str> = None;
        let ro = mount(Some(&dir), &dir, none, MsFlags::MS_BIND, none).and_then(|()| {
            mount(
                none,
                &dir,
                none,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                none,
            )
        });
        let mounted = Unmount(&dir);
        if let Err(e) = ro {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: this test needs root (a read-only bind mount): {e}"
            );
            eprintln!("SKIPPED: a read-only bind mount needs root: {e}");
            return;
        }
        p.reclaim.remove_dir(&dir);
        assert_eq!(p.reclaim_counts().pending, 1);
        assert_eq!(p.reclaim_counts().failed, 1);
        drop(mounted);
        p.reclaim();
        assert!(!dir.exists());
        assert_eq!(p.reclaim_counts().pending, 0);
    }
}
