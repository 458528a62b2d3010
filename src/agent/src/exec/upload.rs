//! Storing an execution archive: a staging directory, extraction under the
//! `[exec.archive]` limits, the `main.py` check, and the swap that puts it
//! in place of any execution of that name (killing a running one first).
//! A failed or abandoned upload removes its staging directory.

use std::io::Read;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rustix::fs::Mode;

use super::dirs::remove_tree;
use super::error::io_err;
use super::{ExecError, ExecState, Execution, Executions, MAIN_SCRIPT, Progress, check_name};
use crate::supervisor::now_ms;
use crate::workspace::{Compression, extract};

/// An upload in progress: its staging directory, removed unless committed.
pub struct Upload {
    root: PathBuf,
    name: String,
    generation: u64,
    stage: PathBuf,
    committed: bool,
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.committed {
            let _ = remove_tree(&self.root, &self.stage);
        }
    }
}

/// What an upload replaced.
#[derive(Debug, Clone, Copy, Default)]
pub struct Replaced {
    pub replaced: bool,
    pub killed_running: bool,
}

/// Result of extracting an upload.
#[derive(Debug, Clone, Default)]
pub struct Extracted {
    pub files: u64,
    pub bytes_written: u64,
}

impl Executions {
    /// Begins storing an archive for `name`: checks the lease, the name and
    /// the count, and makes a staging directory.
    pub fn begin_upload(&self, lease_id: &str, name: &str) -> Result<Upload, ExecError> {
        check_name(name)?;
        let generation = {
            let i = self.inner();
            self.check_lease(&i, lease_id)?;
            if !i.execs.contains_key(name) && i.execs.len() >= self.cfg.max_executions {
                return Err(ExecError::TooMany {
                    max: self.cfg.max_executions,
                });
            }
            i.generation
        };
        self.prepare_soon();
        let root = self.open_root()?;
        let rnd = sandbox_client::random::hex_token(8)
            .map_err(io_err("naming the upload's staging directory"))?;
        let stage_name = format!(".upload-{name}-{rnd}");
        let stage = self.cfg.root.join(&stage_name);
        // The execution directory stays the agent's (0755): only work/
        // (and the run's venv/) are the tenant's, so nothing a script does
        // puts a link where the agent creates its log.
        let made = (|| -> rustix::io::Result<()> {
            rustix::fs::mkdirat(&root, stage_name.as_str(), Mode::from_raw_mode(0o755))?;
            let sfd =
                rustix::fs::openat(&root, stage_name.as_str(), super::DIR_FLAGS, Mode::empty())?;
            rustix::fs::fchmod(&sfd, Mode::from_raw_mode(0o755))?;
            rustix::fs::mkdirat(&sfd, super::WORK, Mode::from_raw_mode(0o755))?;
            let wfd = rustix::fs::openat(&sfd, super::WORK, super::DIR_FLAGS, Mode::empty())?;
            rustix::fs::fchmod(&wfd, Mode::from_raw_mode(0o755))?;
            let tenant = self.sup.tenant();
            if let (Some(u), Some(g)) = (tenant.uid(), tenant.gid()) {
                rustix::fs::fchown(
                    &wfd,
                    Some(rustix::fs::Uid::from_raw(u)),
                    Some(rustix::fs::Gid::from_raw(g)),
                )?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            let _ = remove_tree(&self.cfg.root, &stage);
            return Err(ExecError::Io {
                context: format!("creating {}", stage.display()),
                source: e.into(),
            });
        }
        Ok(Upload {
            root: self.cfg.root.clone(),
            name: name.to_owned(),
            generation,
            stage,
            committed: false,
        })
    }

    /// Extracts the archive read from `src` into the upload's staging
    /// directory and checks it holds `main.py`. Blocking.
    pub fn extract(
        &self,
        up: &Upload,
        src: impl Read + Send + 'static,
        compression: Compression,
    ) -> Result<Extracted, ExecError> {
        // A Release or Reset meanwhile removed the staging directory under
        // the extraction: that is the cause to report.
        self.extract_staged(up, src, compression).map_err(|e| {
            if self.inner().generation != up.generation {
                ExecError::Released
            } else {
                e
            }
        })
    }

    fn extract_staged(
        &self,
        up: &Upload,
        src: impl Read + Send + 'static,
        compression: Compression,
    ) -> Result<Extracted, ExecError> {
        let work = up.stage.join("work");
        let dir =
            std::fs::File::open(&work).map_err(io_err(format!("opening {}", work.display())))?;
        let opts = extract::ExtractOptions {
            limits: &self.cfg.archive,
            compression,
            owner: self.sup.tenant().uid().zip(self.sup.tenant().gid()),
            merge: false,
        };
        let stats = extract::extract(src, dir.as_fd(), &opts).map_err(ExecError::Archive)?;
        let main = std::fs::symlink_metadata(work.join(MAIN_SCRIPT));
        if !main.is_ok_and(|m| m.is_file()) {
            return Err(ExecError::NoMain);
        }
        Ok(Extracted {
            files: stats.files,
            bytes_written: stats.bytes_written,
        })
    }

    /// Puts an extracted upload in place of any execution of its name,
    /// killing that one first if it runs. A second upload of a name whose
    /// upload is being committed is refused (`Active`): two concurrent
    /// Executes of one name would race.
    pub async fn commit_upload(&self, mut up: Upload) -> Result<Replaced, ExecError> {
        let old = {
            let mut i = self.inner();
            if i.generation != up.generation || i.lease.is_none() {
                return Err(ExecError::Released);
            }
            if !i.committing.insert(up.name.clone()) {
                return Err(ExecError::Active {
                    name: up.name.clone(),
                    state: "being replaced by another upload",
                });
            }
            i.execs.get(&up.name).cloned()
        };
        let _committing = Committing {
            execs: self,
            name: up.name.clone(),
        };
        let mut out = Replaced::default();
        if let Some(old) = &old {
            out.replaced = true;
            out.killed_running = old.stop().await;
        }
        let dir = self.cfg.root.join(&up.name);
        let (stage, root) = (up.stage.clone(), self.cfg.root.clone());
        let name = up.name.clone();
        // The old directory moves aside first (one rename), so nothing
        // still writing into its work/ makes the swap fail; then it goes.
        let moved = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let rnd = sandbox_client::random::hex_token(8)?;
            let old = root.join(format!(".old-{name}-{rnd}"));
            let target = root.join(&name);
            match std::fs::rename(&target, &old) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            std::fs::rename(&stage, &target)?;
            if let Err(e) = remove_tree(&root, &old) {
                tracing::warn!(path = %old.display(), error = %e, "removing a replaced execution directory");
            }
            Ok(())
        })
        .await
        .map_err(|e| ExecError::Io {
            context: "replacing the execution directory".into(),
            source: std::io::Error::other(e),
        })?;
        // A Release or Reset that ran meanwhile removed what was moving:
        // that, not the rename, is what the client must hear.
        if self.inner().generation != up.generation {
            return Err(ExecError::Released);
        }
        moved.map_err(io_err(format!("putting the upload at {}", dir.display())))?;
        up.committed = true;
        let exec = Arc::new(Execution {
            name: up.name.clone(),
            dir,
            uploaded_at_ms: now_ms(),
            progress: Mutex::new(Progress {
                state: ExecState::Uploaded,
                message: String::new(),
                exit_code: None,
                signal: None,
                started_at_ms: 0,
                finished_at_ms: 0,
            }),
            log: Mutex::new(None),
            running: tokio::sync::Mutex::new(None),
        });
        let mut i = self.inner();
        if i.generation != up.generation {
            // Released meanwhile: close() may have missed the directory.
            let _ = remove_tree(&self.cfg.root, &exec.dir);
            return Err(ExecError::Released);
        }
        i.execs.insert(up.name.clone(), exec);
        Ok(out)
    }
}

/// Marks a name's commit as in progress while it lives.
struct Committing<'a> {
    execs: &'a Executions,
    name: String,
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        self.execs.inner().committing.remove(&self.name);
    }
}
