//! All-or-nothing replacement of the workspace contents, surviving SIGKILL.
//!
//! New contents are built in a staging directory on the same filesystem,
//! then swapped in:
//!
//! 1. with `durable`, `syncfs` the staging tree (the data is durable before
//!    it is visible);
//! 2. write the journal (`phase=commit`): from here on the swap completes
//!    even if the agent dies;
//! 3. move every top-level entry of the workspace into `old-N`;
//! 4. journal `phase=installing`; move every entry of the staging directory
//!    into the workspace;
//! 5. with `durable`, `syncfs`; delete the journal, and remove `old-N` in the background
//!    (deleting before extracting would also make ext4 slow to allocate
//!    fresh inodes for the new tree).
//!
//! On start, [`Txn::recover`] finishes a journaled swap from where it
//! stopped (each phase is idempotent), and discards any staging directory
//! without a journal: the workspace is always entirely before or entirely
//! after.
//!
//! The state directory (stage, old trees, journal) sits next to the
//! workspace, as `.<name>.sandbox-agent`. When the workspace is a mount
//! point, the only place on the same filesystem is inside it, so it is
//! `<workspace>/.sandbox-agent` (mode 0700); Dump and Clear skip it.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags};

use super::clone::{clone_dir, dir_flags};
use super::confine::{list, remove_at};
use super::error::{WorkspaceError, ctx, sys};
use super::fault::fault_point;
use super::moves::{move_entries, open_up, restore_modes, unmovable};

/// Name of the state directory when it lives inside the workspace.
pub const INNER_STATE_NAME: &str = sandbox_archive::extract::RESERVED_NAME;
const JOURNAL: &str = "journal";

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Handles on the workspace root and its state directory.
pub struct Txn {
    root_path: PathBuf,
    root: OwnedFd,
    state_path: PathBuf,
    state: OwnedFd,
    /// Name to skip in the root when the state directory is inside it.
    inner_state: Option<OsString>,
    /// Old trees still being deleted in the background, and a signal when
    /// that count changes.
    trash: std::sync::Arc<(std::sync::Mutex<Trash>, std::sync::Condvar)>,
}

impl Txn {
    /// Opens (creating if needed) the workspace and its state directory.
    pub fn open(root_path: &Path) -> Result<Txn, WorkspaceError> {
        std::fs::create_dir_all(root_path)
            .map_err(ctx(format!("creating workspace {}", root_path.display())))?;
        let root = rustix::fs::open(root_path, dir_flags(), Mode::empty()).map_err(|e| {
            WorkspaceError::io(format!("opening workspace {}", root_path.display()), sys(e))
        })?;
        let root_st =
            rustix::fs::fstat(&root).map_err(|e| WorkspaceError::io("stat workspace", sys(e)))?;
        let parent = root_path.parent().filter(|p| !p.as_os_str().is_empty());
        let same_fs_parent = match parent {
            Some(p) => rustix::fs::stat(p)
                .map(|st| st.st_dev == root_st.st_dev)
                .unwrap_or(false),
            None => false,
        };
        let (state_path, inner_state) = match (same_fs_parent, parent, root_path.file_name()) {
            (true, Some(p), Some(name)) => {
                let mut n = OsString::from(".");
                n.push(name);
                n.push(".sandbox-agent");
                (p.join(n), None)
            }
            _ => (
                root_path.join(INNER_STATE_NAME),
                Some(OsString::from(INNER_STATE_NAME)),
            ),
        };
        match rustix::fs::mkdir(&state_path, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => {
                return Err(WorkspaceError::io(
                    format!("creating state directory {}", state_path.display()),
                    sys(e),
                ));
            }
        }
        let state = rustix::fs::open(&state_path, dir_flags() | OFlags::NOFOLLOW, Mode::empty())
            .map_err(|e| {
                WorkspaceError::io(
                    format!("opening state directory {}", state_path.display()),
                    sys(e),
                )
            })?;
        Ok(Txn {
            root_path: root_path.to_owned(),
            root,
            state_path,
            state,
            inner_state,
            trash: Default::default(),
        })
    }

    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Top-level name the workspace root must hide (the inner state dir).
    pub fn hidden_name(&self) -> Option<&OsStr> {
        self.inner_state.as_deref()
    }

    pub fn state_path(&self) -> &Path {
        &self.state_path
    }

    /// A fresh, empty staging directory.
    pub fn stage(&self) -> Result<(OsString, OwnedFd), WorkspaceError> {
        let name = unique("stage");
        rustix::fs::mkdirat(&self.state, &name, Mode::from_raw_mode(0o700))
            .map_err(|e| WorkspaceError::io("creating a staging directory", sys(e)))?;
        let fd = rustix::fs::openat(
            &self.state,
            &name,
            dir_flags() | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| WorkspaceError::io("opening the staging directory", sys(e)))?;
        Ok((name, fd))
    }

    /// Removes a staging directory that will not be committed.
    pub fn discard(&self, name: &OsStr) {
        if let Err(e) = remove_at(self.state.as_fd(), name, Path::new(name)) {
            tracing::warn!(error = %e, "could not remove a staging directory; it is removed at the next start");
        }
    }

    /// Hardlinks the current workspace into `stage` (for merge mode):
    /// directories are recreated, everything else shares its inode. The
    /// extractor never writes into an existing file, so the workspace is not
    /// touched.
    pub fn clone_into(
        &self,
        stage: BorrowedFd<'_>,
        max_depth: usize,
    ) -> Result<(), WorkspaceError> {
        clone_dir(self.root.as_fd(), stage, self.hidden_name(), max_depth)
    }

    /// Swaps the staging directory's contents in. Returns how many
    /// top-level entries the workspace had before, and the time spent in
    /// `syncfs`. Without `durable` nothing is flushed: the swap is just as
    /// atomic for a killed agent (the page cache outlives it); only a crash
    /// of the machine could lose the new contents.
    pub fn commit(
        &self,
        stage_name: &OsStr,
        stage: BorrowedFd<'_>,
        durable: bool,
    ) -> Result<(u64, std::time::Duration), WorkspaceError> {
        let t = std::time::Instant::now();
        if durable {
            rustix::fs::syncfs(stage)
                .map_err(|e| WorkspaceError::io("syncing the staging tree", sys(e)))?;
        }
        let mut synced = t.elapsed();
        // Everything that must move is checked before the journal: once it
        // is written the swap has to complete.
        let staged = unmovable(stage, None)?;
        let current = unmovable(self.root.as_fd(), self.hidden_name())?;
        let me = rustix::process::geteuid().as_raw();
        if let Some((name, st)) = current.iter().find(|(_, st)| st.st_uid != me) {
            return Err(WorkspaceError::Stuck(format!(
                "cannot replace the workspace contents: the directory '{}' (owner uid {}, mode \
                 {:o}) cannot be moved by the agent (uid {me}) and nothing was changed; make it \
                 writable by uid {me} or remove it, then retry",
                Path::new(name).display(),
                st.st_uid,
                st.st_mode & 0o7777
            )));
        }
        let old = unique("old");
        rustix::fs::mkdirat(&self.state, &old, Mode::from_raw_mode(0o700))
            .map_err(|e| WorkspaceError::io("creating the old-contents directory", sys(e)))?;
        let opened = open_up(stage, &staged)
            .and_then(|()| open_up(self.root.as_fd(), &current))
            .and_then(|()| self.write_journal("commit", stage_name, &old));
        if let Err(e) = opened {
            restore_modes(self.root.as_fd(), &current);
            let _ = rustix::fs::unlinkat(&self.state, &old, AtFlags::REMOVEDIR);
            return Err(e);
        }
        fault_point("after-journal");
        let moved = self.move_out(&old)?;
        self.write_journal("installing", stage_name, &old)?;
        self.move_in(stage_name)?;
        // The archive's own modes, now that the directories are in place.
        restore_modes(self.root.as_fd(), &staged);
        let t = std::time::Instant::now();
        if durable {
            rustix::fs::syncfs(&self.root)
                .map_err(|e| WorkspaceError::io("syncing the workspace", sys(e)))?;
        }
        synced += t.elapsed();
        self.finish(stage_name, &old)?;
        Ok((moved, synced))
    }

    /// Completes or discards whatever a killed agent left behind. Returns a
    /// description of what was done, if anything.
    pub fn recover(&self) -> Result<Option<String>, WorkspaceError> {
        let journal = match rustix::fs::openat(
            &self.state,
            JOURNAL,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        ) {
            Ok(fd) => {
                let mut text = String::new();
                io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text)
                    .map_err(ctx("reading the journal"))?;
                Some(text)
            }
            Err(rustix::io::Errno::NOENT) => None,
            Err(e) => return Err(WorkspaceError::io("opening the journal", sys(e))),
        };
        let mut done = None;
        let mut scheduled = None;
        if let Some(text) = journal {
            let mut lines = text.lines();
            let (Some("v1"), Some(phase), Some(stage), Some(old)) =
                (lines.next(), lines.next(), lines.next(), lines.next())
            else {
                return Err(WorkspaceError::io(
                    "reading the journal",
                    io::Error::other(format!(
                        "unrecognised journal in {}; inspect it by hand",
                        self.state_path.display()
                    )),
                ));
            };
            let (stage, old) = (OsString::from(stage), OsString::from(old));
            match rustix::fs::mkdirat(&self.state, &old, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => {
                    return Err(WorkspaceError::io(
                        "recreating the old-contents directory",
                        sys(e),
                    ));
                }
            }
            if phase == "commit" {
                self.move_out(&old)?;
                self.write_journal("installing", &stage, &old)?;
            }
            self.move_in(&stage)?;
            rustix::fs::syncfs(&self.root)
                .map_err(|e| WorkspaceError::io("syncing the workspace", sys(e)))?;
            self.finish(&stage, &old)?;
            scheduled = Some(old);
            done = Some(format!(
                "completed an interrupted workspace swap (phase {phase})"
            ));
        }
        // Anything else in the state directory is debris of operations that
        // never committed.
        let mut names = list(self.state.as_fd()).map_err(ctx("listing the state directory"))?;
        names.retain(|n| Some(n) != scheduled.as_ref());
        if !names.is_empty() {
            let n = names.len();
            self.remove_in_background(names);
            done.get_or_insert_with(|| {
                format!("discarded {n} uncommitted staging or old director(ies)")
            });
        }
        Ok(done)
    }

    fn write_journal(&self, phase: &str, stage: &OsStr, old: &OsStr) -> Result<(), WorkspaceError> {
        let tmp = "journal.tmp";
        let fd = rustix::fs::openat(
            &self.state,
            tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| WorkspaceError::io("writing the journal", sys(e)))?;
        let mut f = std::fs::File::from(fd);
        let mut text = Vec::new();
        text.extend_from_slice(b"v1\n");
        text.extend_from_slice(phase.as_bytes());
        text.push(b'\n');
        text.extend_from_slice(stage.as_bytes());
        text.push(b'\n');
        text.extend_from_slice(old.as_bytes());
        text.push(b'\n');
        f.write_all(&text)
            .and_then(|()| f.sync_all())
            .map_err(ctx("writing the journal"))?;
        rustix::fs::renameat(&self.state, tmp, &self.state, JOURNAL)
            .map_err(|e| WorkspaceError::io("installing the journal", sys(e)))?;
        rustix::fs::fsync(&self.state)
            .map_err(|e| WorkspaceError::io("syncing the journal", sys(e)))?;
        Ok(())
    }

    fn move_out(&self, old: &OsStr) -> Result<u64, WorkspaceError> {
        let old_fd = rustix::fs::openat(
            &self.state,
            old,
            dir_flags() | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| WorkspaceError::io("opening the old-contents directory", sys(e)))?;
        move_entries(
            self.root.as_fd(),
            old_fd.as_fd(),
            self.hidden_name(),
            "out of",
            "mid-move-out",
        )
    }

    fn move_in(&self, stage: &OsStr) -> Result<(), WorkspaceError> {
        let stage_fd = match rustix::fs::openat(
            &self.state,
            stage,
            dir_flags() | OFlags::NOFOLLOW,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            // Already moved in and removed by an earlier, interrupted finish.
            Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(e) => return Err(WorkspaceError::io("opening the staging directory", sys(e))),
        };
        move_entries(
            stage_fd.as_fd(),
            self.root.as_fd(),
            None,
            "into",
            "mid-move-in",
        )?;
        Ok(())
    }

    fn finish(&self, stage: &OsStr, old: &OsStr) -> Result<(), WorkspaceError> {
        rustix::fs::unlinkat(&self.state, JOURNAL, AtFlags::empty())
            .map_err(|e| WorkspaceError::io("removing the journal", sys(e)))?;
        rustix::fs::fsync(&self.state)
            .map_err(|e| WorkspaceError::io("syncing the state directory", sys(e)))?;
        let _ = rustix::fs::unlinkat(&self.state, stage, AtFlags::REMOVEDIR);
        self.remove_in_background(vec![old.to_owned()]);
        Ok(())
    }

    /// Deletes state-directory entries on a background thread (counted in
    /// `trash` until done; see [`Txn::wait_trash`]).
    fn remove_in_background(&self, names: Vec<OsString>) {
        let state = match rustix::io::dup(&self.state) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(error = %e, "could not start removing old workspace contents");
                return;
            }
        };
        let trash = self.trash.clone();
        trash.0.lock().unwrap_or_else(|p| p.into_inner()).running += 1;
        let done = trash.clone();
        let spawned = std::thread::Builder::new()
            .name("ws-trash".into())
            .spawn(move || {
                let mut failed = Vec::new();
                for n in names {
                    if let Err(e) = remove_at(state.as_fd(), &n, Path::new(&n)) {
                        tracing::warn!(error = %e, "could not remove old workspace contents");
                        failed.push(e.to_string());
                    }
                }
                let mut t = done.0.lock().unwrap_or_else(|p| p.into_inner());
                t.running = t.running.saturating_sub(1);
                t.failed.extend(failed);
                done.1.notify_all();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the cleanup thread");
            let mut t = trash.0.lock().unwrap_or_else(|p| p.into_inner());
            t.running = t.running.saturating_sub(1);
            t.failed
                .push(format!("could not start the cleanup thread: {e}"));
        }
    }

    /// Deletes every top-level entry of the workspace (but the inner state
    /// directory) where it is; returns how many there were.
    pub fn remove_contents(&self) -> Result<u64, WorkspaceError> {
        let mut n = 0;
        for name in list(self.root.as_fd()).map_err(ctx("listing the workspace"))? {
            if Some(name.as_os_str()) == self.hidden_name() {
                continue;
            }
            remove_at(self.root.as_fd(), &name, Path::new(&name))?;
            n += 1;
        }
        Ok(n)
    }

    /// Gives up an interrupted swap (after the workspace was emptied in
    /// place): the journal goes, and the staging and old trees are deleted.
    pub fn abandon(&self) -> Result<(), WorkspaceError> {
        match rustix::fs::unlinkat(&self.state, JOURNAL, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(WorkspaceError::io("removing the journal", sys(e))),
        }
        rustix::fs::fsync(&self.state)
            .map_err(|e| WorkspaceError::io("syncing the state directory", sys(e)))?;
        let names = list(self.state.as_fd()).map_err(ctx("listing the state directory"))?;
        self.remove_in_background(names);
        Ok(())
    }

    /// Blocks until every old tree scheduled for deletion is gone: with the
    /// state directory inside the workspace (a mount point), they sit where
    /// the servers can read them, so no new lease starts before.
    ///
    /// Returns what could not be removed since the last call (each with
    /// its path and cause): that old tree is still in the state directory.
    pub fn wait_trash(&self) -> Result<(), Vec<String>> {
        let mut t = self.trash.0.lock().unwrap_or_else(|p| p.into_inner());
        while t.running > 0 {
            t = self.trash.1.wait(t).unwrap_or_else(|p| p.into_inner());
        }
        match std::mem::take(&mut t.failed) {
            f if f.is_empty() => Ok(()),
            f => Err(f),
        }
    }

    pub fn root_path(&self) -> &Path {
        &self.root_path
    }
}

/// Old trees being deleted in the background, and what could not be.
#[derive(Debug, Default)]
pub struct Trash {
    running: usize,
    failed: Vec<String>,
}

fn unique(kind: &str) -> OsString {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    OsString::from(format!(
        "{kind}-{}-{nanos}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}
