//! The runs' Python, prepared once per agent: [`Prep`] holds what
//! [`super::venv::prepare`] found and made, and checks the base venv at
//! every Release ([`Prep::verify`]).

use std::path::{Path, PathBuf};

use super::ExecConfig;
use super::dirs::remove_tree;
use super::venv;
use crate::supervisor::Supervisor;

/// The interpreter, uv and base venv, found and made once per agent (at
/// its first upload, in the background) for every run; made again after a
/// Release found the base venv changed ([`Prep::verify`]).
pub(crate) struct Prep {
    cell: tokio::sync::Mutex<Option<venv::Prepared>>,
    /// Where the base venv is made: the agent's, never the tenant's.
    base: PathBuf,
}

impl Prep {
    /// Nothing prepared yet; the base venv will be made at `base`.
    pub(super) fn new(base: PathBuf) -> Prep {
        Prep {
            cell: tokio::sync::Mutex::new(None),
            base,
        }
    }

    pub(super) async fn get(&self, cfg: &ExecConfig, sup: &Supervisor) -> venv::Prepared {
        let mut cell = self.cell.lock().await;
        if let Some(p) = cell.as_ref() {
            return p.clone();
        }
        let p = venv::prepare(cfg, sup, &self.base).await;
        *cell = Some(p.clone());
        p
    }

    pub(super) fn initialized(&self) -> bool {
        self.cell.try_lock().map(|c| c.is_some()).unwrap_or(true)
    }

    /// Checks the base venv against its fingerprint taken when it was
    /// made (every entry's path, type, mode, owner, size, link target and
    /// content). On any difference it is removed and made again at its
    /// next use; the warning names what changed. `Err`: it changed and
    /// could not be removed.
    /// One being made right now (no run has copied it yet) is left to
    /// the next Release: a Release never waits for uv.
    pub(super) async fn verify(&self) -> Result<(), String> {
        let Ok(mut cell) = self.cell.try_lock() else {
            return Ok(());
        };
        let Some(p) = cell.as_ref() else {
            return Ok(());
        };
        let (Some(base), Some(made)) = (p.base.clone(), p.fingerprint.clone()) else {
            return Ok(());
        };
        let b = base.clone();
        let now = tokio::task::spawn_blocking(move || venv::fingerprint(&b))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        let diff = match &now {
            Ok(now) => venv::differences(&made, now),
            Err(e) => vec![format!("cannot be read: {e}")],
        };
        if diff.is_empty() {
            return Ok(());
        }
        let shown = diff.iter().take(20).cloned().collect::<Vec<_>>().join("; ");
        tracing::warn!(
            base = %base.display(),
            changes = diff.len(),
            changed = %shown,
            "the executions' base venv changed since it was made; removing it (made again at its next use)"
        );
        *cell = None;
        let b = base.clone();
        tokio::task::spawn_blocking(move || remove_tree(b.parent().unwrap_or(Path::new("/")), &b))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(|e| {
                format!(
                    "the executions' base venv {} changed ({shown}) and cannot be removed: {e}",
                    base.display()
                )
            })
    }
}
