//! The environment every slot's main process (the agent, isolated or not,
//! or run-qemu.sh and its helpers) starts with: cleared, then an
//! allow-list of the host's variables. Never the host's whole environment:
//! an agent is PID 1 of its sandbox, and whatever the host's environment
//! holds (an operator's secret, a cloud credential) must not be the
//! tenant's.
//!
//! Passed when set in the host's environment:
//! - [`BASE`]: what the agent itself needs to find its tools (PATH, HOME
//!   for a pyenv shim) and log. The agent never passes these on: servers,
//!   executions and the terminal start from the sandbox's own fixed base
//!   (the agent's `tenant::env`), so nothing of the host's layout, user
//!   or locale reaches a tenant;
//! - every `SANDBOX_AGENT_*` variable (the agent's own settings);
//! - every name a `pass_env` of the manifest lists (`[defaults]` or a
//!   server's): the operator's statement that servers get that variable;
//! - every `--agent-env NAME`: the operator's statement that the agent
//!   gets it, e.g. the package indexes and proxies (`PIP_INDEX_URL`, …)
//!   that the agent's `exec.pass_env` gives executions by default. They
//!   are never passed otherwise.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;

/// Always passed (when set): what the agent itself needs, never passed on
/// to a sandbox's processes.
pub const BASE: &[&str] = &["PATH", "HOME", "RUST_LOG", "RUST_BACKTRACE"];

/// The agents' own settings.
pub const AGENT_PREFIX: &str = "SANDBOX_AGENT_";

/// The environment variable that may hold API keys (comma- or
/// newline-separated). Read once at start, then removed, so no child
/// process inherits it.
pub const API_KEY_ENV: &str = "SANDBOX_HOST_API_KEY";

/// Never passed, even when named: the host's API keys.
const NEVER: &[&str] = &[API_KEY_ENV];

/// The variables a slot's main process gets, taken once at start.
#[derive(Debug, Clone, Default)]
pub struct AgentEnv {
    vars: Vec<(OsString, OsString)>,
}

impl AgentEnv {
    /// The allow-listed part of `host_env` (the host's environment):
    /// [`BASE`], `SANDBOX_AGENT_*`, the manifest's `pass_env` names and
    /// `extra` (`--agent-env`).
    pub fn new(
        host_env: impl IntoIterator<Item = (OsString, OsString)>,
        manifest_names: &BTreeSet<String>,
        extra: &[String],
    ) -> AgentEnv {
        let allowed = |k: &str| {
            !NEVER.contains(&k)
                && (BASE.contains(&k)
                    || k.starts_with(AGENT_PREFIX)
                    || manifest_names.contains(k)
                    || extra.iter().any(|e| e == k))
        };
        let vars = host_env
            .into_iter()
            .filter(|(k, _)| k.to_str().is_some_and(allowed))
            .collect();
        AgentEnv { vars }
    }

    /// Clears `cmd`'s environment and gives it only the allowed variables.
    pub fn apply(&self, cmd: &mut std::process::Command) {
        cmd.env_clear();
        cmd.envs(self.vars.iter().map(|(k, v)| (k, v)));
    }

    /// The names passed (for the start log; never the values).
    pub fn names(&self) -> Vec<String> {
        self.vars
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect()
    }
}

/// Every name a `pass_env` array of the manifest lists, at any depth
/// (`[defaults]`, each server). A manifest that cannot be read gives none:
/// the agent reports it.
pub fn manifest_pass_env(manifest: &Path) -> BTreeSet<String> {
    fn walk(v: &toml::Value, out: &mut BTreeSet<String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    match (k.as_str(), v) {
                        ("pass_env", toml::Value::Array(a)) => {
                            out.extend(a.iter().filter_map(|s| s.as_str().map(str::to_owned)));
                        }
                        _ => walk(v, out),
                    }
                }
            }
            toml::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    if let Some(v) = std::fs::read_to_string(manifest)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
    {
        walk(&toml::Value::Table(v), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn only_allowed_names_pass() {
        let names: BTreeSet<String> = ["CANVAS_API_TOKEN".to_owned()].into();
        let e = AgentEnv::new(
            env(&[
                ("PATH", "/usr/bin"),
                ("OPERATOR_SECRET", "s"),
                ("SANDBOX_HOST_API_KEY", "k"),
                ("SANDBOX_AGENT_WHEELS", "/w"),
                ("CANVAS_API_TOKEN", "t"),
                ("PIP_INDEX_URL", "http://mirror"),
                ("USER", "operator"),
                ("LANG", "de_DE.UTF-8"),
                ("MY_VAR", "v"),
                ("AWS_SECRET_ACCESS_KEY", "x"),
            ]),
            &names,
            &["MY_VAR".to_owned(), "SANDBOX_HOST_API_KEY".to_owned()],
        );
        let mut got = e.names();
        got.sort();
        assert_eq!(
            got,
            ["CANVAS_API_TOKEN", "MY_VAR", "PATH", "SANDBOX_AGENT_WHEELS"]
        );
    }

    #[test]
    fn the_manifests_pass_env_names_are_found() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("servers.toml");
        std::fs::write(
            &m,
            "[defaults]\npass_env = [\"A\"]\n[servers.x]\ncommand = [\"x\"]\npass_env = [\"B\", \"C\"]\n",
        )
        .unwrap();
        let got: Vec<String> = manifest_pass_env(&m).into_iter().collect();
        assert_eq!(got, ["A", "B", "C"]);
    }
}
