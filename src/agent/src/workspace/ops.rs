//! The [`Workspace`] and its operations: Initialize (extract into a stage,
//! then swap), Dump (pack) and Clear, one at a time.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::fence::Fence;
use super::{ArchiveError, ArchiveLimits, Compression, WorkspaceError};
use super::{confine, error, extract, fault, limits, pack, stream, txn};

/// Result of an Initialize.
#[derive(Debug, Clone, Default)]
pub struct InitStats {
    pub extract: extract::ExtractStats,
    pub archive_bytes: u64,
    pub archive_sha256: String,
    pub duration: Duration,
    /// Part of `duration` spent making the new contents durable (syncfs).
    pub sync: Duration,
    /// Whether the new contents were flushed to disk before the answer.
    pub durable: bool,
}

/// What to Initialize.
#[derive(Debug, Clone, Default)]
pub struct InitRequest {
    pub compression: Compression,
    pub merge: bool,
    /// Lowercase hex, or empty.
    pub expected_sha256: String,
    /// 0 when unknown.
    pub size_hint: u64,
    /// Flush to disk before answering; `None`: `archive.durable_initialize`.
    pub durable: Option<bool>,
    /// Checked before extracting and again before the swap.
    pub fence: Option<Fence>,
}

/// What to Dump.
#[derive(Debug, Clone, Default)]
pub struct DumpRequest {
    pub exclude: Vec<String>,
    pub sub_path: String,
    /// Checked before the first entry is read.
    pub fence: Option<Fence>,
}

/// How often [`Workspace::begin_within`] looks whether the workspace is free.
const BUSY_POLL: Duration = Duration::from_millis(50);

pub struct Workspace {
    txn: txn::Txn,
    limits: ArchiveLimits,
    owner: Option<(u32, u32)>,
    /// The root as it was at start, put back by every Clear.
    root_attrs: super::root::RootAttrs,
    busy: Mutex<Option<(&'static str, Instant, CancellationToken)>>,
    /// Why the last recovery of an interrupted swap could not finish; every
    /// operation retries it first and is refused while it fails.
    stuck: Mutex<Option<String>>,
    /// Directories the lease's benchmark profile keeps in the workspace:
    /// every Initialize and Clear creates them in the new tree.
    keep: Mutex<Vec<PathBuf>>,
}

/// The workspace claimed for one operation ([`Workspace::begin`]); released
/// on drop. The operations are its methods, so none can run without the
/// claim.
pub struct OpGuard {
    ws: Arc<Workspace>,
}

impl OpGuard {
    /// Extracts the archive read from `src` and swaps it in. Blocking.
    /// `outcome` is `src`'s shared state (byte count, sha256, failure).
    pub fn initialize(
        &self,
        req: &InitRequest,
        src: stream::ChannelReader,
        outcome: &Mutex<stream::ReadOutcome>,
    ) -> Result<InitStats, WorkspaceError> {
        Fence::check(&req.fence)?;
        self.ws.recovered()?;
        self.ws.initialize(req, src, outcome)
    }

    /// Writes the workspace (or `sub_path` of it) as a tar stream to `out`.
    /// Blocking.
    pub fn dump<W: Write>(
        &self,
        req: &DumpRequest,
        out: W,
        cancelled: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<(W, pack::PackStats), WorkspaceError> {
        Fence::check(&req.fence)?;
        self.ws.recovered()?;
        self.ws.dump(req, out, cancelled)
    }

    /// Empties the workspace atomically, unless `fence` refuses. Returns
    /// the number of top-level entries removed. Blocking.
    pub fn clear_for(&self, fence: &Option<Fence>) -> Result<u64, WorkspaceError> {
        Fence::check(fence)?;
        self.clear()
    }

    /// Empties the workspace atomically. Returns the number of top-level
    /// entries removed. Blocking.
    pub fn clear(&self) -> Result<u64, WorkspaceError> {
        let n = self.empty()?;
        // What a tenant did to the root itself goes too.
        self.ws.root_attrs.restore(self.ws.txn.root())?;
        Ok(n)
    }

    fn empty(&self) -> Result<u64, WorkspaceError> {
        match self.ws.recovered() {
            Ok(()) => self.ws.clear(),
            // Emptying needs no completed swap: the workspace is emptied in
            // place and the swap abandoned, so a Release always frees it.
            Err(WorkspaceError::Stuck(why)) => {
                tracing::warn!(error = %why, "emptying a workspace stuck mid-swap in place");
                let n = self.ws.txn.remove_contents()?;
                self.ws.txn.abandon()?;
                self.ws.make_dirs(self.ws.txn.root(), &self.ws.kept());
                *self.ws.stuck.lock().unwrap_or_else(|p| p.into_inner()) = None;
                Ok(n)
            }
            Err(e) => Err(e),
        }
    }
}

impl OpGuard {
    /// Cancelled when a Release ends the lease while this operation runs
    /// ([`Workspace::cancel_transfers`]): the transfer stops at once.
    pub fn cancelled(&self) -> CancellationToken {
        self.ws
            .busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(_, _, c)| c.clone())
            .unwrap_or_default()
    }
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        *self.ws.busy.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

impl Workspace {
    /// Opens the workspace at `path`, finishing or discarding whatever an
    /// interrupted operation left behind.
    pub fn open(path: &Path, limits: ArchiveLimits) -> Result<Workspace, WorkspaceError> {
        limits
            .validate()
            .map_err(|e| WorkspaceError::invalid(e.to_string()))?;
        let txn = txn::Txn::open(path)?;
        let root_attrs = super::root::RootAttrs::capture(txn.root())?;
        // A swap that cannot be completed must not keep the agent from
        // starting: it serves, and workspace operations say what is wrong.
        let stuck = match txn.recover() {
            Ok(Some(what)) => {
                tracing::warn!(workspace = %path.display(), "{what}");
                None
            }
            Ok(None) => None,
            Err(e) => {
                tracing::error!(workspace = %path.display(), error = %e, "an interrupted workspace swap cannot be completed; workspace operations are refused until it can");
                Some(e.to_string())
            }
        };
        let owner = match &limits.owner {
            Some(o) => {
                Some(limits::parse_owner(o).map_err(|e| WorkspaceError::invalid(e.to_string()))?)
            }
            None => {
                let st = rustix::fs::fstat(txn.root())
                    .map_err(|e| WorkspaceError::io("stat workspace", error::sys(e)))?;
                Some((st.st_uid, st.st_gid))
            }
        };
        // chown is only needed (and only allowed) when the owner differs
        // from who we are.
        let me = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        let owner = owner.filter(|o| *o != me);
        if owner.is_some() && me.0 != 0 {
            return Err(WorkspaceError::invalid(format!(
                "archive.owner {:?} differs from the agent's own uid:gid {}:{}, and only root can give files away",
                owner, me.0, me.1
            )));
        }
        Ok(Workspace {
            txn,
            limits,
            owner,
            root_attrs,
            busy: Mutex::new(None),
            stuck: Mutex::new(stuck),
            keep: Mutex::new(Vec::new()),
        })
    }

    pub fn path(&self) -> &Path {
        self.txn.root_path()
    }

    /// Sets the directories every Initialize and Clear keeps in the
    /// workspace (its started servers' profile dirs; none at Release).
    pub fn keep_dirs(&self, dirs: Vec<PathBuf>) {
        *self.keep.lock().unwrap_or_else(|p| p.into_inner()) = dirs;
    }

    /// Makes `dirs` and keeps them too (a server starting); a swap staged
    /// before makes them again at its commit ([`Workspace::commit`]).
    pub fn keep_more(&self, dirs: &[PathBuf]) {
        let mut keep = self.keep.lock().unwrap_or_else(|p| p.into_inner());
        let new: Vec<PathBuf> = dirs.iter().filter(|d| !keep.contains(d)).cloned().collect();
        keep.extend(new);
        drop(keep);
        self.make_dirs(self.txn.root(), dirs);
    }

    /// Creates the kept directories under `root` (mode 0755, the workspace
    /// owner's), never through a symlink; one that something else is in
    /// the way of is left out with a warning (the archive decides).
    fn make_dirs(&self, root: std::os::fd::BorrowedFd<'_>, dirs: &[PathBuf]) {
        use rustix::fs::{Mode, OFlags};
        for d in dirs {
            let made = (|| -> Result<(), rustix::io::Errno> {
                let mut cur = rustix::io::dup(root)?;
                for c in d.components() {
                    let name = c.as_os_str();
                    match rustix::fs::mkdirat(&cur, name, Mode::from_raw_mode(0o755)) {
                        Ok(()) => {
                            if let Some((u, g)) = self.owner {
                                rustix::fs::chownat(
                                    &cur,
                                    name,
                                    Some(rustix::fs::Uid::from_raw(u)),
                                    Some(rustix::fs::Gid::from_raw(g)),
                                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                                )?;
                            }
                        }
                        Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(e),
                    }
                    cur = rustix::fs::openat(
                        &cur,
                        name,
                        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )?;
                }
                Ok(())
            })();
            if let Err(e) = made {
                tracing::warn!(dir = %d.display(), error = %e, "cannot keep a profile directory in the workspace");
            }
        }
    }

    /// Removes profile directories that are no longer kept, when empty,
    /// and their parents up to the workspace while empty and not kept;
    /// never through a symlink. A directory something was written into
    /// stays.
    pub fn remove_dirs(&self, dirs: &[PathBuf]) {
        let kept = self.kept();
        for d in dirs {
            let mut cur = d.clone();
            while !cur.as_os_str().is_empty() && !kept.iter().any(|k| k.starts_with(&cur)) {
                let (Some(parent), Some(name)) = (cur.parent(), cur.file_name()) else {
                    break;
                };
                let dir = if parent.as_os_str().is_empty() {
                    rustix::io::dup(self.txn.root()).map_err(std::io::Error::from)
                } else {
                    confine::open_dir(self.txn.root(), parent)
                };
                let gone = dir.is_ok_and(|fd| {
                    rustix::fs::unlinkat(&fd, name, rustix::fs::AtFlags::REMOVEDIR).is_ok()
                });
                if !gone {
                    break;
                }
                cur = parent.to_path_buf();
            }
        }
    }

    pub fn kept(&self) -> Vec<PathBuf> {
        self.keep.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Retries the recovery of an interrupted swap that failed before (at
    /// start or after a failed commit); an error while it still fails.
    fn recovered(&self) -> Result<(), WorkspaceError> {
        let mut stuck = self.stuck.lock().unwrap_or_else(|p| p.into_inner());
        if stuck.is_none() {
            return Ok(());
        }
        match self.txn.recover() {
            Ok(what) => {
                tracing::warn!(
                    workspace = %self.path().display(),
                    "{}",
                    what.unwrap_or_else(|| "the interrupted workspace swap is resolved".into())
                );
                *stuck = None;
                Ok(())
            }
            Err(e) => {
                let msg = format!(
                    "the workspace is in the middle of a swap the agent cannot complete ({e}); \
                     remove what is in the way and retry: each workspace operation tries to \
                     complete it first (journal in {})",
                    self.txn.state_path().display()
                );
                *stuck = Some(e.to_string());
                Err(WorkspaceError::Stuck(msg))
            }
        }
    }

    /// Blocks until the old contents of earlier swaps are deleted; returns
    /// what could not be (see [`super::txn::Txn::wait_trash`]).
    pub fn wait_trash(&self) -> Result<(), Vec<String>> {
        self.txn.wait_trash()
    }

    pub fn limits(&self) -> &ArchiveLimits {
        &self.limits
    }

    /// Stops a running Initialize or Dump (a Release must not wait for a
    /// stalled client); returns its name. Clear is never interrupted.
    pub fn cancel_transfers(&self) -> Option<&'static str> {
        let busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        match busy.as_ref() {
            Some((op, _, c)) if *op != "Clear" => {
                c.cancel();
                Some(op)
            }
            _ => None,
        }
    }

    /// Claims the workspace for `op`, or says what holds it.
    pub fn begin(self: &Arc<Self>, op: &'static str) -> Result<OpGuard, WorkspaceError> {
        self.try_begin(op)
    }

    /// Claims the workspace for `op`, waiting up to `wait` for a running
    /// operation to end (Release and Reset wait for a transfer in flight).
    pub async fn begin_within(
        self: &Arc<Self>,
        op: &'static str,
        wait: Duration,
    ) -> Result<OpGuard, WorkspaceError> {
        let deadline = Instant::now() + wait;
        loop {
            match self.try_begin(op) {
                Ok(g) => return Ok(g),
                Err(e) if Instant::now() >= deadline => {
                    return Err(WorkspaceError::Busy(format!(
                        "waited {} s for the workspace: {e}",
                        wait.as_secs()
                    )));
                }
                Err(_) => tokio::time::sleep(BUSY_POLL).await,
            }
        }
    }

    fn try_begin(self: &Arc<Self>, op: &'static str) -> Result<OpGuard, WorkspaceError> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((running, since, _)) = *busy {
            return Err(WorkspaceError::Busy(format!(
                "Workspace.{running} is running (for {:.1} s); only one Initialize, Dump or Clear runs at a time, retry when it ends",
                since.elapsed().as_secs_f64()
            )));
        }
        *busy = Some((op, Instant::now(), CancellationToken::new()));
        Ok(OpGuard { ws: self.clone() })
    }

    fn initialize(
        &self,
        req: &InitRequest,
        src: stream::ChannelReader,
        outcome: &Mutex<stream::ReadOutcome>,
    ) -> Result<InitStats, WorkspaceError> {
        let start = Instant::now();
        if !req.expected_sha256.is_empty()
            && (req.expected_sha256.len() != 64
                || !req.expected_sha256.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(WorkspaceError::invalid(
                "expected_sha256 must be 64 hex digits",
            ));
        }
        let (stage_name, stage) = self.txn.stage()?;
        let result = (|| {
            if req.merge {
                self.txn.clone_into(stage.as_fd(), self.limits.max_depth)?;
            } else if let Some((u, g)) = self.owner {
                // The stage is the owner's (inside the agent's 0700 state
                // directory, which no tenant can pass): the extractor then
                // creates every entry as the owner, with no chown each.
                rustix::fs::fchown(
                    &stage,
                    Some(rustix::fs::Uid::from_raw(u)),
                    Some(rustix::fs::Gid::from_raw(g)),
                )
                .map_err(|e| {
                    WorkspaceError::io(
                        "giving the staging directory to archive.owner",
                        error::sys(e),
                    )
                })?;
            }
            let opts = extract::ExtractOptions {
                limits: &self.limits,
                compression: req.compression,
                owner: self.owner,
                merge: req.merge,
            };
            let result = extract::extract_buffered(src, stage.as_fd(), &opts);
            let mut o = outcome.lock().unwrap_or_else(|p| p.into_inner());
            // A broken stream explains a parse error better than the parser.
            let stats = result.map_err(|e| o.failure.take().unwrap_or(e))?;
            let (count, sha) = (o.count, o.sha256.clone().unwrap_or_default());
            drop(o);
            if req.size_hint != 0 && count != req.size_hint {
                return Err(WorkspaceError::Integrity(format!(
                    "received {count} archive bytes, the header announced {}; the upload was cut short or altered",
                    req.size_hint
                )));
            }
            if !req.expected_sha256.is_empty() && !sha.eq_ignore_ascii_case(&req.expected_sha256) {
                return Err(WorkspaceError::Integrity(format!(
                    "archive sha256 is {sha}, expected {}; nothing was changed",
                    req.expected_sha256
                )));
            }
            self.make_dirs(stage.as_fd(), &self.kept());
            fault::fault_point("before-commit");
            Ok((stats, sha, count))
        })();
        // The whole archive is read: the lease it came under must still be
        // current (the claim held, no Release can end it meanwhile).
        let result = result.and_then(|r| Fence::check(&req.fence).map(|()| r));
        match result {
            Ok((stats, sha, count)) => {
                let durable = req.durable.unwrap_or(self.limits.durable_initialize);
                let (_, sync) = self.commit(&stage_name, stage, durable)?;
                Ok(InitStats {
                    extract: stats,
                    archive_bytes: count,
                    archive_sha256: sha,
                    duration: start.elapsed(),
                    sync,
                    durable,
                })
            }
            Err(e) => {
                drop(stage);
                self.txn.discard(&stage_name);
                Err(e)
            }
        }
    }

    fn dump<W: Write>(
        &self,
        req: &DumpRequest,
        out: W,
        cancelled: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<(W, pack::PackStats), WorkspaceError> {
        let exclude = build_globs(&req.exclude)?;
        let sub = req.sub_path.trim_matches('/');
        let dir = if sub.is_empty() {
            rustix::io::dup(self.txn.root())
                .map_err(|e| WorkspaceError::io("opening the workspace", error::sys(e)))?
        } else {
            let comps = confine::normalize(Path::new(sub))
                .map_err(|r| WorkspaceError::invalid(format!("sub_path '{sub}' {r}")))?;
            let rel: PathBuf = comps.iter().collect();
            if rel.as_os_str() == txn::INNER_STATE_NAME && self.txn.hidden_name().is_some() {
                return Err(WorkspaceError::NotFound(format!(
                    "sub_path '{sub}' does not exist in the workspace"
                )));
            }
            confine::open_dir(self.txn.root(), &rel).map_err(|e| match e.raw_os_error() {
                Some(nix::libc::ENOENT) => WorkspaceError::NotFound(format!(
                    "sub_path '{sub}' does not exist in the workspace"
                )),
                Some(nix::libc::ENOTDIR) => {
                    WorkspaceError::invalid(format!("sub_path '{sub}' is not a directory"))
                }
                Some(nix::libc::ELOOP) | Some(nix::libc::EXDEV) => {
                    WorkspaceError::invalid(format!("sub_path '{sub}' goes through a symlink"))
                }
                _ => WorkspaceError::io(format!("opening sub_path '{sub}'"), e),
            })?
        };
        let hidden = if sub.is_empty() {
            self.txn.hidden_name()
        } else {
            None
        };
        let leave_out = exclude.as_ref().map(|g| move |p: &Path| g.is_match(p));
        let opts = pack::PackOptions {
            exclude: leave_out
                .as_ref()
                .map(|f| f as &(dyn Fn(&Path) -> bool + Sync)),
            hidden,
            cancelled,
            max_depth: self.limits.max_depth,
        };
        Ok(pack::pack(dir.as_fd(), &opts, out)?)
    }

    /// Empties the workspace by an (empty) swap; on a full disk, where the
    /// swap cannot even write its journal, by deleting in place: emptying
    /// needs no atomicity, and a Release must be able to free the disk.
    fn clear(&self) -> Result<u64, WorkspaceError> {
        let swapped = self.txn.stage().and_then(|(name, stage)| {
            self.make_dirs(stage.as_fd(), &self.kept());
            self.commit(&name, stage, false).map(|(n, _)| n)
        });
        match swapped {
            Err(WorkspaceError::Archive(ArchiveError::DiskFull(why))) => {
                tracing::warn!(error = %why, "the disk is full; emptying the workspace in place");
                let n = self.txn.remove_contents()?;
                self.make_dirs(self.txn.root(), &self.kept());
                Ok(n)
            }
            other => other,
        }
    }

    /// Commits a stage; on failure, rolls forward (journal written) or
    /// discards the stage (not yet committed), as a restart would.
    fn commit(
        &self,
        name: &std::ffi::OsStr,
        stage: std::os::fd::OwnedFd,
        durable: bool,
    ) -> Result<(u64, Duration), WorkspaceError> {
        match self.txn.commit(name, stage.as_fd(), durable) {
            Ok(n) => {
                // Kept meanwhile (a server started during the swap).
                self.make_dirs(self.txn.root(), &self.kept());
                Ok(n)
            }
            Err(e) => {
                drop(stage);
                if let Err(r) = self.txn.recover() {
                    tracing::error!(error = %r, "recovery after a failed swap failed too; it is retried before the next workspace operation");
                    *self.stuck.lock().unwrap_or_else(|p| p.into_inner()) = Some(r.to_string());
                }
                Err(e)
            }
        }
    }
}

fn build_globs(patterns: &[String]) -> Result<Option<globset::GlobSet>, WorkspaceError> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut b = globset::GlobSetBuilder::new();
    for p in patterns {
        let p = p.trim_start_matches("./");
        let g = globset::GlobBuilder::new(p)
            .literal_separator(false)
            .build()
            .map_err(|e| WorkspaceError::invalid(format!("exclude pattern '{p}': {e}")))?;
        b.add(g);
    }
    b.build()
        .map(Some)
        .map_err(|e| WorkspaceError::invalid(format!("exclude patterns: {e}")))
}
