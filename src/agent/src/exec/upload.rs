//! Storing an execution archive: a staging directory, extraction under the
//! `[exec.archive]` limits, the `main.py` check, and the swap that puts it
//! in place of any execution of that name (killing a running one first).
//! A failed or abandoned upload removes its staging directory.

use std::io::Read;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::error::io_err;
use super::{ExecError, ExecState, Execution, Executions, MAIN_SCRIPT, Progress, check_name};
use crate::supervisor::now_ms;
use crate::workspace::{Compression, extract};

/// An upload in progress: its staging directory, removed unless committed.
pub struct Upload {
    name: String,
    generation: u64,
    stage: PathBuf,
    committed: bool,
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.stage);
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
        std::fs::create_dir_all(&self.cfg.root).map_err(io_err(format!(
            "creating exec.root {}",
            self.cfg.root.display()
        )))?;
        let rnd = sandbox_client::random::hex_token(8)
            .map_err(io_err("naming the upload's staging directory"))?;
        let stage = self.cfg.root.join(format!(".upload-{name}-{rnd}"));
        std::fs::create_dir_all(stage.join("work"))
            .map_err(io_err(format!("creating {}", stage.display())))?;
        // The run makes its venv here and works in work/: the tenant's.
        let tenant = self.sup.tenant();
        tenant
            .own(&stage)
            .and_then(|()| tenant.own(&stage.join("work")))
            .map_err(io_err(format!("giving {} to the tenant", stage.display())))?;
        Ok(Upload {
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
    /// killing that one first if it runs.
    pub async fn commit_upload(&self, mut up: Upload) -> Result<Replaced, ExecError> {
        let old = {
            let i = self.inner();
            if i.generation != up.generation || i.lease.is_none() {
                return Err(ExecError::Released);
            }
            i.execs.get(&up.name).cloned()
        };
        let mut out = Replaced::default();
        if let Some(old) = &old {
            out.replaced = true;
            out.killed_running = old.stop().await;
        }
        let dir = self.cfg.root.join(&up.name);
        let stage = up.stage.clone();
        let target = dir.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            match std::fs::remove_dir_all(&target) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            std::fs::rename(&stage, &target)
        })
        .await
        .map_err(|e| ExecError::Io {
            context: "replacing the execution directory".into(),
            source: std::io::Error::other(e),
        })?
        .map_err(io_err(format!("putting the upload at {}", dir.display())))?;
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
            let _ = std::fs::remove_dir_all(&exec.dir);
            return Err(ExecError::Released);
        }
        i.execs.insert(up.name.clone(), exec);
        Ok(out)
    }
}
