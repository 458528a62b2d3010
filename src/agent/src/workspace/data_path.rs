//! `data_path`: a second path at which the servers see the workspace (the
//! benchmarks' task prompts cite `/data/...`). Made once at start: a
//! symlink to the workspace, or a bind mount of it (root, in the VM image).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// How `data_path` shows the workspace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DataLink {
    /// A symlink to the workspace (works unprivileged; servers that resolve
    /// paths see the workspace's real path).
    #[default]
    Symlink,
    /// A bind mount of the workspace (root): the path is the workspace.
    Bind,
}

/// Why `data_path` cannot show the workspace.
#[derive(Debug, thiserror::Error)]
pub enum DataPathError {
    #[error(
        "data_path {0} exists and is not the workspace (nor a symlink); remove it or choose another data_path"
    )]
    InTheWay(String),
    #[error("data_path {path}: {what}: {source}")]
    Io {
        path: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Checks a configured `data_path` against the workspace.
pub fn check(workspace: &Path, data: &Path) -> Result<(), String> {
    if !data.is_absolute() {
        return Err(format!("{} must be an absolute path", data.display()));
    }
    if data.starts_with(workspace) {
        return Err(format!(
            "{} must not be the workspace or inside it",
            data.display()
        ));
    }
    Ok(())
}

/// Makes `data` show `workspace`. Nothing to do when it already does (a
/// restart); a symlink to somewhere else is replaced.
pub fn show_at(workspace: &Path, data: &Path, link: DataLink) -> Result<(), DataPathError> {
    let io = |what, source| DataPathError::Io {
        path: data.display().to_string(),
        what,
        source,
    };
    let ws = std::fs::metadata(workspace).map_err(|e| io("reading the workspace", e))?;
    if std::fs::metadata(data).is_ok_and(|m| m.dev() == ws.dev() && m.ino() == ws.ino()) {
        return Ok(());
    }
    let existing = match std::fs::symlink_metadata(data) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("inspecting", e)),
    };
    if let Some(parent) = data.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io("creating its parent", e))?;
    }
    match (link, existing) {
        (DataLink::Symlink, Some(m)) if !m.file_type().is_symlink() => {
            Err(DataPathError::InTheWay(data.display().to_string()))
        }
        (DataLink::Symlink, existing) => {
            if existing.is_some() {
                std::fs::remove_file(data).map_err(|e| io("replacing the old symlink", e))?;
            }
            std::os::unix::fs::symlink(workspace, data).map_err(|e| io("creating the symlink", e))
        }
        (DataLink::Bind, Some(m)) if !m.is_dir() => {
            Err(DataPathError::InTheWay(data.display().to_string()))
        }
        (DataLink::Bind, existing) => {
            if existing.is_none() {
                std::fs::create_dir(data).map_err(|e| io("creating the mount point", e))?;
            }
            nix::mount::mount(
                Some(workspace),
                data,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| io("bind-mounting the workspace (needs root)", e.into()))
        }
    }
}
