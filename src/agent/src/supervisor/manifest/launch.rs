//! From a checked entry to the exact process a lease runs: the benchmark
//! profile applied, the lease's credentials mapped to environment
//! variables, required variables checked.

use std::collections::BTreeMap;

use super::check::valid_env_name;
use super::{Benchmark, Credentials, LaunchSpec, Manifest, Seed, ServerDef};

/// Why a server cannot be launched for a lease.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "auth_data.{server}: field {field:?} does not map to an environment variable; use one of: {}",
        known.join(", ")
    )]
    UnmappedAuthField {
        server: String,
        field: String,
        known: Vec<String>,
    },
    #[error("env.{server}: {name:?} is not a valid environment variable name")]
    BadEnvName { server: String, name: String },
    #[error("{}", missing_message(server, missing))]
    MissingCredentials {
        server: String,
        missing: Vec<Missing>,
    },
}

/// A required variable no source set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The environment variable.
    pub var: String,
    /// What it is ("Canvas LMS API token").
    pub what: String,
    /// The `auth_data` field that sets it.
    pub field: String,
}

fn missing_message(server: &str, missing: &[Missing]) -> String {
    let list: Vec<String> = missing
        .iter()
        .map(|m| format!("{} ({})", m.var, m.what))
        .collect();
    let fields: Vec<String> = missing
        .iter()
        .map(|m| format!("\"{}\": …", m.field))
        .collect();
    let cli: Vec<String> = missing
        .iter()
        .map(|m| format!("--auth {server}.{}=…", m.field))
        .collect();
    format!(
        "server {server} needs {}; pass them in auth_data[\"{server}\"] as {{{}}} (sandboxctl acquire {}), in the lease's env, or in the agent's environment",
        list.join(" and "),
        fields.join(", "),
        cli.join(" ")
    )
}

impl ServerDef {
    /// Seed data of a benchmark profile, in order.
    pub fn seeds(&self, benchmark: Option<Benchmark>) -> &[Seed] {
        benchmark
            .and_then(|b| self.benchmarks.get(&b))
            .map_or(&[], |o| o.seed.as_slice())
    }

    /// The server's metadata under `benchmark` (the profile's over it).
    pub fn metadata_for(&self, benchmark: Option<Benchmark>) -> BTreeMap<String, String> {
        let mut m = self.metadata.clone();
        if let Some(o) = benchmark.and_then(|b| self.benchmarks.get(&b)) {
            m.extend(o.metadata.clone());
        }
        m
    }

    /// Workspace directories a benchmark profile keeps for the lease.
    pub fn dirs(&self, benchmark: Option<Benchmark>) -> &[std::path::PathBuf] {
        benchmark
            .and_then(|b| self.benchmarks.get(&b))
            .map_or(&[], |o| o.dirs.as_slice())
    }

    /// The exact process to run for a lease with `benchmark` and `creds`.
    /// Its environment: the sandbox's fixed base, the `pass_env` names
    /// read from `agent_env` (the agent's own), `env`, the profile's `env`,
    /// then the lease's credentials and variables.
    pub fn launch(
        &self,
        benchmark: Option<Benchmark>,
        creds: &Credentials,
        agent_env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<LaunchSpec, LaunchError> {
        let o = benchmark.and_then(|b| self.benchmarks.get(&b));
        // The sandbox's own base; of the agent's environment only what the
        // manifest's pass_env lists.
        let mut env = crate::tenant::env::base();
        for k in &self.pass_env {
            if let Some(v) = agent_env(k) {
                env.insert(k.clone(), v);
            }
        }
        env.extend(self.env.clone());
        if let Some(o) = o {
            env.extend(o.env.clone());
        }
        for (k, v) in &creds.auth {
            let var = self.auth_var(k);
            if !valid_env_name(&var) {
                return Err(LaunchError::UnmappedAuthField {
                    server: self.name.clone(),
                    field: k.clone(),
                    known: self.auth_env.keys().cloned().collect(),
                });
            }
            env.insert(var, v.clone());
        }
        for (k, v) in &creds.env {
            if !valid_env_name(k) {
                return Err(LaunchError::BadEnvName {
                    server: self.name.clone(),
                    name: k.clone(),
                });
            }
            env.insert(k.clone(), v.clone());
        }
        let missing: Vec<Missing> = self
            .requires
            .iter()
            .filter(|r| env.get(&r.var).is_none_or(|v| v.is_empty()))
            .map(|r| Missing {
                var: r.var.clone(),
                what: r.what.clone(),
                field: self
                    .auth_env
                    .iter()
                    .find(|(_, v)| **v == r.var)
                    .map_or_else(|| r.var.to_ascii_lowercase(), |(k, _)| k.clone()),
            })
            .collect();
        if !missing.is_empty() {
            return Err(LaunchError::MissingCredentials {
                server: self.name.clone(),
                missing,
            });
        }
        Ok(LaunchSpec {
            name: self.name.clone(),
            command: o
                .and_then(|o| o.command.clone())
                .unwrap_or_else(|| self.command.clone()),
            args: o
                .and_then(|o| o.args.clone())
                .unwrap_or_else(|| self.args.clone()),
            env,
            cwd: o
                .and_then(|o| o.cwd.clone())
                .unwrap_or_else(|| self.cwd.clone()),
            uid: self.uid,
            gid: self.gid,
            transport: self.transport.clone(),
            ready_timeout: self.ready_timeout,
            stop_grace: self.stop_grace,
            restart: self.restart.clone(),
            limits: self.limits.clone(),
        })
    }

    /// The environment variable an `auth_data` field sets.
    fn auth_var(&self, field: &str) -> String {
        self.auth_env
            .get(field)
            .cloned()
            .unwrap_or_else(|| field.to_ascii_uppercase())
    }

    /// Whether the lease itself sets every variable the server requires
    /// (in auth_data or its env), so that the outside account they open is
    /// the lease's own rather than the operator's, which every lease shares.
    /// A server that requires none uses whatever the operator configured.
    pub fn lease_account(&self, creds: &Credentials) -> bool {
        let by_lease = |var: &str| match creds.env.get(var) {
            Some(v) => !v.is_empty(),
            None => creds
                .auth
                .iter()
                .any(|(k, v)| !v.is_empty() && self.auth_var(k) == var),
        };
        !self.requires.is_empty() && self.requires.iter().all(|r| by_lease(&r.var))
    }

    /// The endpoint path of this server on the MCP data plane.
    pub fn mcp_path(&self) -> String {
        format!("/{}/mcp", self.name)
    }
}

impl Manifest {
    /// What every installed server runs under `benchmark` for a lease
    /// without credentials, by name (`--print-launch`): its command,
    /// arguments, whole environment and directory, and the profile's
    /// metadata. A variable a lease's credentials must set reads
    /// `<credential>` and is named in `credentials`.
    pub fn launches(
        &self,
        benchmark: Option<Benchmark>,
        agent_env: &dyn Fn(&str) -> Option<String>,
    ) -> BTreeMap<String, serde_json::Value> {
        self.servers
            .iter()
            .map(|(name, def)| (name.clone(), def.launch_shown(benchmark, agent_env)))
            .collect()
    }
}

impl ServerDef {
    fn launch_shown(
        &self,
        benchmark: Option<Benchmark>,
        agent_env: &dyn Fn(&str) -> Option<String>,
    ) -> serde_json::Value {
        let mut creds = Credentials::default();
        let mut spec = self.launch(benchmark, &creds, agent_env);
        if let Err(LaunchError::MissingCredentials { missing, .. }) = &spec {
            for m in missing {
                creds.env.insert(m.var.clone(), "<credential>".into());
            }
            spec = self.launch(benchmark, &creds, agent_env);
        }
        let metadata = self.metadata_for(benchmark);
        match spec {
            Ok(mut s) => {
                // As the tenant's spawn sets them (`Tenant::env`).
                crate::tenant::overlay(&mut s.env, "<lease home>", true);
                serde_json::json!({
                "command": s.command,
                "args": s.args,
                "env": s.env,
                "cwd": s.cwd,
                "credentials": creds.env.keys().collect::<Vec<_>>(),
                "metadata": metadata,
                })
            }
            Err(e) => serde_json::json!({ "error": e.to_string(), "metadata": metadata }),
        }
    }
}
