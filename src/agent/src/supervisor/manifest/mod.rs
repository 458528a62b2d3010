//! The server manifest: which MCP servers this sandbox can run and how.
//!
//! A TOML file (`packaging/servers.toml` is the shipped one) with a
//! `[defaults]` table and one `[servers.NAME]` table per server. Loading
//! checks every entry and names the entry and field of the first problem.
//! [`ServerDef::launch`] turns an entry, a benchmark profile and the
//! lease's credentials into the exact [`LaunchSpec`] the supervisor runs.
//!
//! Strings may use `${workspace}`, `${state_root}`, `${install_dir}` and `${name}`; they are
//! expanded when the manifest is loaded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod check;
mod installed;
mod launch;
mod mail;
mod schema;

pub use check::{EntryError, FieldError};
pub use installed::{INSTALL_COMMAND, NotInstalled};
pub use launch::{LaunchError, Missing};
pub use mail::{MailDef, local_part_ok};
pub use schema::{
    DataUser, Defaults, HttpFile, MailFile, ManifestFile, OverrideFile, RequiredFile,
    ResourceLimits, RestartFile, RestartPolicy, SeedFile, ServerFile, TransportKind,
};

/// Manifest read when `--manifest` is not given.
pub const DEFAULT_MANIFEST_PATH: &str = "/etc/sandbox-agent/servers.toml";

/// A manifest problem; the message names the file, and the entry and field
/// where there is one.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest {}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("manifest {}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("manifest {}: servers.{server}.{error}", path.display())]
    Entry {
        path: PathBuf,
        server: String,
        error: Box<FieldError>,
    },
    /// A problem in `[mail]` or `[benchmarks.X]`.
    #[error("manifest {}: {error}", path.display())]
    Table {
        path: PathBuf,
        error: Box<FieldError>,
    },
}

/// The benchmark profiles of the Klavis API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Benchmark {
    #[serde(rename = "MCP_Atlas")]
    McpAtlas,
    #[serde(rename = "Toolathlon")]
    Toolathlon,
    #[serde(rename = "MCP_Mark")]
    McpMark,
}

impl Benchmark {
    /// A profile as `--print-launch` names it: a benchmark, or `none`.
    pub fn parse_profile(s: &str) -> Result<Option<Benchmark>, UnknownBenchmark> {
        match s {
            "none" => Ok(None),
            _ => [
                Benchmark::McpAtlas,
                Benchmark::Toolathlon,
                Benchmark::McpMark,
            ]
            .into_iter()
            .find(|b| b.as_str() == s)
            .map(Some)
            .ok_or_else(|| UnknownBenchmark(s.to_owned())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Benchmark::McpAtlas => "MCP_Atlas",
            Benchmark::Toolathlon => "Toolathlon",
            Benchmark::McpMark => "MCP_Mark",
        }
    }
}

/// A profile name that is no benchmark's.
#[derive(Debug, thiserror::Error)]
#[error("unknown benchmark profile {0:?}: use MCP_Atlas, Toolathlon, MCP_Mark or none")]
pub struct UnknownBenchmark(pub String);

/// Resolved restart policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    pub policy: RestartPolicy,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub max_restarts: u32,
    pub window: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    Http { port: u16, path: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    pub from: PathBuf,
    /// `None`: the workspace.
    pub to: Option<PathBuf>,
}

#[derive(Debug, Clone, Default)]
pub struct Override {
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub seed: Vec<Seed>,
    /// Directories the profile keeps in the workspace (normalized relative
    /// paths).
    pub dirs: Vec<PathBuf>,
    pub metadata: BTreeMap<String, String>,
}

/// One checked manifest entry.
#[derive(Debug, Clone)]
pub struct ServerDef {
    pub name: String,
    pub description: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub transport: Transport,
    pub ready_timeout: Duration,
    pub stop_grace: Duration,
    pub state_paths: Vec<PathBuf>,
    pub restart: Restart,
    pub limits: ResourceLimits,
    pub pass_env: Vec<String>,
    pub requires: Vec<RequiredFile>,
    pub auth_env: BTreeMap<String, String>,
    pub benchmarks: BTreeMap<Benchmark, Override>,
    pub metadata: BTreeMap<String, String>,
    /// Gets an account of the sandbox's mail service ([`Manifest::mail`]).
    pub mail: bool,
    /// Loads and dumps the server's data (see the schema's `data_command`).
    pub data_command: Option<String>,
    /// Who runs it (the schema's `data_user`).
    pub data_user: DataUser,
    /// Started by an Acquire of all servers (see the schema's `in_all`).
    pub in_all: bool,
}

/// Everything needed to start one server process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// The complete environment (the child's is cleared first).
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub transport: Transport,
    pub ready_timeout: Duration,
    pub stop_grace: Duration,
    pub restart: Restart,
    pub limits: ResourceLimits,
}

/// A lease's credentials and extra environment for one server.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// auth_data fields, already rendered as strings.
    pub auth: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
}

/// The checked manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub path: PathBuf,
    pub servers: BTreeMap<String, ServerDef>,
    /// The mail service, when the manifest has `[mail]`.
    pub mail: Option<MailDef>,
    /// `[benchmarks.X] data`: what each profile merges into the workspace.
    pub profile_data: BTreeMap<Benchmark, PathBuf>,
    /// The file after expansion, printed by `--check-config`.
    pub file: ManifestFile,
    /// Servers of the file whose install is absent (not in `servers`):
    /// [`Manifest::retain_installed`].
    pub not_installed: BTreeMap<String, NotInstalled>,
    /// Servers installed whose pinned version for a profile is not.
    pub profiles_not_installed: BTreeMap<(String, Benchmark), NotInstalled>,
}

/// What `${workspace}` and `${state_root}` expand to.
#[derive(Debug, Clone, Copy)]
pub struct Roots<'a> {
    /// The workspace directory.
    pub workspace: &'a Path,
    /// Where servers keep state outside the workspace (`state_root`,
    /// `--state-root`; default /var/lib/sandbox-agent).
    pub state_root: &'a Path,
    /// Where the servers also see the workspace (`data_path`, e.g. /data
    /// for the benchmarks' task prompts): the manifest's `${data}`. `None`:
    /// `${data}` is the workspace.
    pub data: Option<&'a Path>,
}

impl Manifest {
    /// An empty manifest (no servers), used when the default file is absent.
    pub fn empty(path: &Path) -> Manifest {
        Manifest {
            path: path.to_owned(),
            servers: BTreeMap::new(),
            mail: None,
            profile_data: BTreeMap::new(),
            file: ManifestFile::default(),
            not_installed: BTreeMap::new(),
            profiles_not_installed: BTreeMap::new(),
        }
    }

    /// Reads and checks `path`; `roots` gives `${workspace}` and
    /// `${state_root}`. The servers whose install is absent are left out
    /// (logged, and named by [`Manifest::not_installed`]).
    pub fn load(path: &Path, roots: &Roots) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut m = Manifest::parse(&text, path, roots)?;
        m.retain_installed();
        for n in m
            .not_installed
            .values()
            .chain(m.profiles_not_installed.values())
        {
            tracing::warn!(server = %n.server, "{n}");
        }
        Ok(m)
    }

    pub fn parse(text: &str, path: &Path, roots: &Roots) -> Result<Manifest, ManifestError> {
        let file: ManifestFile = toml::from_str(text).map_err(|e| ManifestError::Syntax {
            path: path.to_owned(),
            message: e.to_string().trim_end().replace('\n', "\n  "),
        })?;
        let mut servers = BTreeMap::new();
        for (name, entry) in &file.servers {
            let def = check::check_entry(name, entry, &file, roots).map_err(|error| {
                ManifestError::Entry {
                    path: path.to_owned(),
                    server: name.clone(),
                    error: Box::new(error),
                }
            })?;
            if def.mail && file.mail.is_none() {
                return Err(ManifestError::Entry {
                    path: path.to_owned(),
                    server: name.clone(),
                    error: Box::new(check::field("mail", EntryError::NoMailService)),
                });
            }
            servers.insert(name.clone(), def);
        }
        let vars = check::file_vars(&file, roots);
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mail = file
            .mail
            .as_ref()
            .map(|m| mail::check_mail(m, &file, &vars))
            .transpose()
            .map_err(|error| ManifestError::Table {
                path: path.to_owned(),
                error: Box::new(FieldError {
                    field: format!("mail.{}", error.field),
                    cause: error.cause,
                }),
            })?;
        let mut profile_data = BTreeMap::new();
        for (b, p) in &file.benchmarks {
            if let Some(d) = &p.data {
                let f = format!("data of [benchmarks.{}]", b.as_str());
                let d = check::expand(d, &vars, &f)
                    .and_then(|d| check::abs_path(&d, &f))
                    .map_err(|error| ManifestError::Table {
                        path: path.to_owned(),
                        error: Box::new(error),
                    })?;
                profile_data.insert(*b, d);
            }
        }
        Ok(Manifest {
            path: path.to_owned(),
            servers,
            mail,
            profile_data,
            file,
            not_installed: BTreeMap::new(),
            profiles_not_installed: BTreeMap::new(),
        })
    }

    pub fn names(&self) -> Vec<String> {
        self.servers.keys().cloned().collect()
    }

    /// The servers an Acquire of all servers starts: those not marked
    /// `in_all = false`.
    pub fn all_names(&self) -> Vec<String> {
        self.servers
            .values()
            .filter(|d| d.in_all)
            .map(|d| d.name.clone())
            .collect()
    }

    pub fn get(&self, name: &str) -> Option<&ServerDef> {
        self.servers.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(
            text,
            Path::new("m.toml"),
            &Roots {
                workspace: Path::new("/ws"),
                state_root: Path::new("/st"),
                data: None,
            },
        )
    }

    #[test]
    fn errors_name_entry_and_field() {
        let e =
            parse("[servers.a]\ncommand = \"x\"\n[servers.a.restart]\npolicy = \"sometimes\"\n")
                .expect_err("bad policy")
                .to_string();
        assert!(e.contains("m.toml") && e.contains("policy"), "{e}");
        let e = parse("[servers.a]\ncommand = \"x\"\ntransport = \"http\"\n")
            .expect_err("http without port")
            .to_string();
        assert!(e.contains("servers.a.http"), "{e}");
        let e = parse("[servers.a]\ncommand = \"${nope}/x\"\n")
            .expect_err("unknown var")
            .to_string();
        assert!(
            e.contains("servers.a.command") && e.contains("${nope}"),
            "{e}"
        );
        let e = parse("[servers.a]\ncommand = \"x\"\nstate_paths = [\"/ws/x\"]\n")
            .expect_err("state path inside ws")
            .to_string();
        assert!(e.contains("servers.a.state_paths"), "{e}");
        let e = parse("[servers.A]\ncommand = \"x\"\n")
            .expect_err("bad name")
            .to_string();
        assert!(e.contains("servers.A.name"), "{e}");
    }

    #[test]
    fn launch_applies_profile_and_credentials() {
        let m = parse(
            r#"
install_dir = "/opt/s"
[servers.c]
command = "${install_dir}/bin/c"
args = ["${workspace}"]
env = { A = "1" }
requires = [{ var = "TOKEN", what = "an API token" }]
auth_env = { api_token = "TOKEN" }
[servers.c.benchmarks.Toolathlon]
args = ["--bench"]
env = { A = "2" }
"#,
        )
        .expect("valid");
        let def = m.get("c").expect("entry");
        let none = |_: &str| None;
        let e = def
            .launch(None, &Credentials::default(), &none)
            .expect_err("token missing")
            .to_string();
        assert!(
            e.contains("TOKEN (an API token)") && e.contains("api_token"),
            "{e}"
        );
        let creds = Credentials {
            auth: [("api_token".to_owned(), "t".to_owned())].into(),
            env: BTreeMap::new(),
        };
        let s = def.launch(None, &creds, &none).expect("launch");
        assert_eq!(s.command, "/opt/s/bin/c");
        assert_eq!(s.args, vec!["/ws"]);
        assert_eq!(s.env.get("TOKEN").map(String::as_str), Some("t"));
        let s = def
            .launch(Some(Benchmark::Toolathlon), &creds, &none)
            .expect("launch");
        assert_eq!(s.args, vec!["--bench"]);
        assert_eq!(s.env.get("A").map(String::as_str), Some("2"));
    }

    #[test]
    fn the_account_is_the_leases_only_when_it_brings_every_credential() {
        let m = parse(
            r#"
[servers.c]
command = "c"
requires = [{ var = "URL", what = "u" }, { var = "TOKEN", what = "t" }]
auth_env = { api_token = "TOKEN" }
[servers.free]
command = "f"
"#,
        )
        .expect("valid");
        let (c, free) = (m.get("c").expect("c"), m.get("free").expect("free"));
        let creds = |auth: &[(&str, &str)], env: &[(&str, &str)]| Credentials {
            auth: auth
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        // The operator's (from the agent's environment): shared.
        assert!(!c.lease_account(&Credentials::default()));
        // Half of them: the other half is still the operator's.
        assert!(!c.lease_account(&creds(&[("api_token", "t")], &[])));
        assert!(c.lease_account(&creds(&[("api_token", "t"), ("url", "u")], &[])));
        assert!(c.lease_account(&creds(&[("api_token", "t")], &[("URL", "u")])));
        // An empty value sets nothing; the lease's env wins over auth_data.
        assert!(!c.lease_account(&creds(&[("api_token", "t"), ("url", "u")], &[("URL", "")])));
        assert!(!free.lease_account(&creds(&[("x", "y")], &[])));
    }
}
