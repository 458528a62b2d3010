//! `[exec]`: the limits and switches of script executions, each with its
//! default, and their checks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::workspace::ArchiveLimits;

/// `[exec]` in agent.toml.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecConfig {
    /// Where execution directories live. Must be outside the workspace;
    /// everything in it is removed at Release.
    pub root: PathBuf,
    /// The interpreter venvs are made from (asked once for its executable,
    /// so a wrapper such as a pyenv shim runs once per agent, not per run).
    pub python: String,
    /// `uv` for venvs and installs: "auto" (uv on the agent's PATH if there
    /// is one, found once), "off" (python -m venv + pip per run), or a
    /// path. With uv, the agent makes one base venv that every run copies.
    pub uv: String,
    /// Installing packages.txt with apt-get: "auto" (when the agent is
    /// root and apt-get exists) or "off". Packages already installed are
    /// accepted either way.
    pub packages: String,
    /// The apt-get that installs packages.txt, by absolute path (run as
    /// the agent, never looked up on an execution's PATH).
    pub apt_get: PathBuf,
    /// An execution (installs included) is killed after this long.
    pub timeout_ms: u64,
    /// SIGTERM → SIGKILL grace when an execution is killed.
    pub stop_grace_ms: u64,
    /// Largest log kept per execution (on disk); later output is dropped
    /// after a marker line.
    pub log_max_bytes: u64,
    /// Largest part of a log one Logs answer carries.
    pub log_read_bytes: u32,
    /// Largest `packages.txt` the agent reads (it is read as root, from a
    /// tree the tenant writes: a regular file only, and this much at most).
    pub max_packages_bytes: u64,
    /// Executions a lease may hold (uploaded, running or finished).
    pub max_executions: usize,
    /// Executions that run at once; more wait as QUEUED.
    pub max_running: usize,
    /// A loopback listener of the MCP data plane for scripts (token
    /// required, the token is in the script's environment); "" disables it.
    pub mcp_listen: String,
    /// Extra environment of every execution.
    pub env: BTreeMap<String, String>,
    /// Variables copied from the agent's own environment when set (package
    /// indexes and proxies).
    pub pass_env: Vec<String>,
    /// Limits of execution archives.
    pub archive: ArchiveLimits,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            root: PathBuf::from("/var/lib/sandbox-agent/executions"),
            python: "python3".into(),
            uv: "auto".into(),
            packages: "auto".into(),
            apt_get: PathBuf::from("/usr/bin/apt-get"),
            timeout_ms: 3_600_000,
            stop_grace_ms: 2_000,
            log_max_bytes: 16 << 20,
            log_read_bytes: 1 << 20,
            max_packages_bytes: 64 << 10,
            max_executions: 32,
            max_running: 4,
            mcp_listen: "tcp://127.0.0.1:0".into(),
            env: BTreeMap::new(),
            pass_env: sandbox_client::limits::PACKAGE_ACCESS_ENV
                .iter()
                .map(|s| s.to_string())
                .collect(),
            archive: ArchiveLimits {
                max_archive_bytes: 1 << 30,
                max_expanded_bytes: 4 << 30,
                max_entries: 100_000,
                ..ArchiveLimits::default()
            },
        }
    }
}

/// An `[exec]` setting out of its bounds.
#[derive(Debug, thiserror::Error)]
pub enum ExecConfigError {
    #[error("exec.{0} must be greater than 0")]
    Zero(&'static str),
    #[error("exec.log_max_bytes must be at least 4096")]
    SmallLog,
    #[error("exec.apt_get must be an absolute path (got {0:?}): it is never looked up on a PATH")]
    AptGetRelative(PathBuf),
    #[error("exec.{key} must be \"auto\", \"off\"{paths}; got {got:?}")]
    Switch {
        key: &'static str,
        paths: &'static str,
        got: String,
    },
    #[error(
        "exec.root {root} and the workspace {workspace} overlap; executions must live outside the workspace"
    )]
    Overlap { root: String, workspace: String },
    #[error("exec.root must be an absolute path (got {0})")]
    Relative(String),
    #[error(transparent)]
    Archive(#[from] crate::workspace::limits::LimitsError),
}

impl ExecConfig {
    pub fn validate(&self, workspace: &Path) -> Result<(), ExecConfigError> {
        for (k, v) in [
            ("timeout_ms", self.timeout_ms),
            ("log_read_bytes", self.log_read_bytes.into()),
            ("max_packages_bytes", self.max_packages_bytes),
            ("max_executions", self.max_executions as u64),
            ("max_running", self.max_running as u64),
        ] {
            if v == 0 {
                return Err(ExecConfigError::Zero(k));
            }
        }
        if self.log_max_bytes < 4096 {
            return Err(ExecConfigError::SmallLog);
        }
        if !matches!(self.packages.as_str(), "auto" | "off") {
            return Err(ExecConfigError::Switch {
                key: "packages",
                paths: "",
                got: self.packages.clone(),
            });
        }
        if !self.apt_get.is_absolute() {
            return Err(ExecConfigError::AptGetRelative(self.apt_get.clone()));
        }
        if self.uv.is_empty() {
            return Err(ExecConfigError::Switch {
                key: "uv",
                paths: " or a path",
                got: self.uv.clone(),
            });
        }
        if self.root.is_relative() {
            return Err(ExecConfigError::Relative(self.root.display().to_string()));
        }
        if self.root.starts_with(workspace) || workspace.starts_with(&self.root) {
            return Err(ExecConfigError::Overlap {
                root: self.root.display().to_string(),
                workspace: workspace.display().to_string(),
            });
        }
        self.archive.validate()?;
        Ok(())
    }

    pub(super) fn grace(&self) -> Duration {
        Duration::from_millis(self.stop_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_must_lie_outside_the_workspace() {
        let mut c = ExecConfig {
            root: "/ws/exec".into(),
            ..ExecConfig::default()
        };
        assert!(matches!(
            c.validate(Path::new("/ws")),
            Err(ExecConfigError::Overlap { .. })
        ));
        c.root = "/var/x".into();
        assert!(c.validate(Path::new("/ws")).is_ok());
        c.packages = "yes".into();
        assert!(c.validate(Path::new("/ws")).is_err());
    }
}
