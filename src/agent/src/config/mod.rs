//! Agent configuration: a TOML file, overridden by environment variables,
//! overridden by flags.
//!
//! [`Config`] is the file format (every field optional, documented defaults);
//! [`Config::validate`] turns it into [`Settings`], the checked form the
//! agent runs with. Every limit the agent enforces lives in [`Limits`].

mod limits;

pub use crate::workspace::data_path::DataLink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exec::{ExecConfig, ExecConfigError};
use crate::gateway::{GatewayConfig, GatewayConfigError};
use crate::lifecycle::{LifecycleConfig, LifecycleConfigError};
use crate::supervisor::manifest::{DEFAULT_MANIFEST_PATH, Manifest, ManifestError, Roots};
use crate::supervisor::{SupervisorConfig, SupervisorConfigError};
use crate::workspace::ArchiveLimits;
use crate::workspace::limits::LimitsError;
pub use limits::Limits;
use sandbox_client::auth::{Token, TokenError};
use sandbox_client::transport::{DEFAULT_AGENT_LISTEN, DEFAULT_MCP_LISTEN, Endpoint, UriError};

/// Config file read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/sandbox-agent/agent.toml";
/// Where servers keep state outside the workspace, unless `state_root` says.
pub const DEFAULT_STATE_ROOT: &str = "/var/lib/sandbox-agent";
/// Environment variable holding the token itself (an alternative to a file).
pub const TOKEN_ENV: &str = "SANDBOX_AGENT_TOKEN";

/// The config file. Unknown keys are errors, so typos do not pass silently.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Name of this sandbox in logs (tracing span field `sandbox`).
    /// Default: the hostname.
    pub name: Option<String>,
    /// Control-plane listeners (see `transport` for the URI forms).
    pub listen: Vec<String>,
    /// MCP data-plane listeners (streamable HTTP at /<server>/mcp); same
    /// URI forms and token rules as `listen`. Empty disables the data plane.
    pub mcp_listen: Vec<String>,
    /// The workspace directory served by the Workspace service.
    pub workspace: PathBuf,
    /// Where servers keep state outside the workspace: the manifest's
    /// `${state_root}` (memory files, arxiv storage, desktop-commander's
    /// home). Default: /var/lib/sandbox-agent (with --dev: ./state).
    pub state_root: PathBuf,
    /// Where the servers also see the workspace: the benchmarks' task
    /// prompts cite `/data/...`. The agent makes this path show the
    /// workspace at start (`data_link`); the manifest's `${data}`. Default:
    /// none (`${data}` is the workspace).
    pub data_path: Option<PathBuf>,
    /// How `data_path` shows the workspace: `symlink` (default), or `bind`
    /// (a bind mount, as root; what the VM image uses).
    pub data_link: DataLink,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// The mail service's ports: `manifest` (its [mail] imap_port and
    /// smtp_port; default) or `auto` (free loopback ports at every start,
    /// for several agents on one machine, as sandbox-host's process
    /// backend runs them). The lease's auth_data names the ports.
    pub mail_ports: MailPorts,
    pub auth: AuthConfig,
    pub limits: Limits,
    /// Limits of workspace archives (Initialize and Dump).
    pub archive: ArchiveLimits,
    /// The MCP server manifest. Default: /etc/sandbox-agent/servers.toml
    /// (no servers when that file does not exist).
    pub manifest: Option<PathBuf>,
    pub supervisor: SupervisorConfig,
    pub lifecycle: LifecycleConfig,
    pub gateway: GatewayConfig,
    /// Script executions (the Exec service).
    pub exec: ExecConfig,
    /// Duties as the VM's init; used only when the agent is PID 1.
    pub init: crate::init::InitConfig,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MailPorts {
    #[default]
    Manifest,
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// File holding the bearer token (surrounding whitespace ignored).
    pub token_file: Option<PathBuf>,
    /// Also require the token on unix and vsock listeners.
    pub require_on_local: bool,
    /// Allow TCP listeners on non-loopback addresses.
    pub allow_remote_tcp: bool,
}

/// `p`, made absolute against the current directory when relative.
fn absolute(p: &Path) -> Result<PathBuf, ConfigError> {
    if p.is_relative() {
        let cwd = std::env::current_dir().map_err(ConfigError::WorkspaceCwd)?;
        Ok(cwd.join(p))
    } else {
        Ok(p.to_owned())
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: None,
            listen: vec![DEFAULT_AGENT_LISTEN.to_owned()],
            mcp_listen: vec![DEFAULT_MCP_LISTEN.to_owned()],
            workspace: PathBuf::from("/workspace"),
            state_root: PathBuf::from(DEFAULT_STATE_ROOT),
            data_path: None,
            data_link: DataLink::Symlink,
            log_format: LogFormat::Text,
            mail_ports: MailPorts::Manifest,
            auth: AuthConfig::default(),
            limits: Limits::default(),
            archive: ArchiveLimits::default(),
            manifest: None,
            supervisor: SupervisorConfig::default(),
            lifecycle: LifecycleConfig::default(),
            gateway: GatewayConfig::default(),
            exec: ExecConfig::default(),
            init: crate::init::InitConfig::default(),
        }
    }
}

/// A config that cannot be used. Messages name the file and field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("listen: {0}")]
    Uri(UriError),
    #[error("listen: no listener configured; give at least one --listen URI")]
    NoListener,
    #[error("listen: {0} is listed twice")]
    Duplicate(String),
    #[error("listen: {0} is client-only; the agent listens on vsock://, unix:// or tcp://")]
    ClientOnly(String),
    #[error(
        "listen: {0} is a TCP listener and TCP always requires a token; pass --token-file FILE or set {TOKEN_ENV}"
    )]
    TcpNeedsToken(String),
    #[error(
        "listen: {0} is not a loopback address; set auth.allow_remote_tcp = true (or --allow-remote-tcp) to expose the agent on the network"
    )]
    RemoteTcp(String),
    #[error(
        "auth.require_on_local is set but no token is configured; pass --token-file FILE or set {TOKEN_ENV}"
    )]
    LocalNeedsToken,
    #[error("auth: {0}")]
    Token(TokenError),
    #[error("limits.{0} must be greater than 0")]
    ZeroLimit(&'static str),
    #[error("data_path: {0}")]
    DataPath(String),
    #[error("state_root: the path is empty")]
    StateRootEmpty,
    #[error("workspace: the path is empty")]
    WorkspaceEmpty,
    #[error("workspace: cannot resolve relative path: {0}")]
    WorkspaceCwd(std::io::Error),
    #[error(transparent)]
    Archive(#[from] LimitsError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Supervisor(#[from] SupervisorConfigError),
    #[error(transparent)]
    Gateway(#[from] GatewayConfigError),
    #[error(transparent)]
    Lifecycle(#[from] LifecycleConfigError),
    #[error(transparent)]
    Exec(#[from] ExecConfigError),
    #[error("exec.mcp_listen: {0}")]
    ExecListen(String),
}

/// Values from flags and environment variables (clap merges the two, flags
/// winning); each one that is set replaces the file's value.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Vec<String>,
    pub mcp_listen: Vec<String>,
    pub workspace: Option<PathBuf>,
    pub state_root: Option<PathBuf>,
    pub data_path: Option<PathBuf>,
    pub data_link: Option<DataLink>,
    pub token_file: Option<PathBuf>,
    /// The token itself, from `SANDBOX_AGENT_TOKEN`. A token file given by
    /// flag or env wins over it; it wins over the config file's token_file.
    pub token: Option<String>,
    pub log_format: Option<LogFormat>,
    pub mail_ports: Option<MailPorts>,
    pub tenant_user: Option<String>,
    pub allow_remote_tcp: bool,
    pub name: Option<String>,
    pub manifest: Option<PathBuf>,
    pub exec_root: Option<PathBuf>,
}

/// Where the token came from, for `--check-config`.
#[derive(Debug, Clone)]
pub enum TokenSource {
    None,
    File(PathBuf),
    Env,
}

/// The validated configuration the agent runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub name: String,
    pub listen: Vec<Endpoint>,
    pub mcp_listen: Vec<Endpoint>,
    pub gateway: GatewayConfig,
    pub workspace: PathBuf,
    /// `data_path` and how it shows the workspace.
    pub data_path: Option<(PathBuf, DataLink)>,
    pub log_format: LogFormat,
    pub token: Option<Token>,
    pub token_source: TokenSource,
    pub require_token_on_local: bool,
    pub limits: Limits,
    pub archive: ArchiveLimits,
    pub manifest: Manifest,
    pub supervisor: SupervisorConfig,
    pub lifecycle: LifecycleConfig,
    pub exec: ExecConfig,
    /// The scripts' loopback MCP listener (exec.mcp_listen), if any.
    pub exec_mcp_listen: Option<Endpoint>,
    /// The merged file-level view, printed by `--check-config`.
    pub effective: Config,
}

impl Config {
    /// Reads `path`, or the default path if `path` is `None` and the default
    /// file exists, or the built-in defaults.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let path = match path {
            Some(p) => p.to_owned(),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => PathBuf::from(DEFAULT_CONFIG_PATH),
            None => return Ok(Config::default()),
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_owned(),
            message: e.to_string().trim_end().replace('\n', "\n  "),
        })
    }

    /// Applies flag and environment overrides.
    pub fn apply(&mut self, o: &Overrides) {
        if !o.listen.is_empty() {
            self.listen = o.listen.clone();
        }
        if !o.mcp_listen.is_empty() {
            self.mcp_listen = o.mcp_listen.clone();
        }
        if let Some(w) = &o.workspace {
            self.workspace = w.clone();
        }
        if let Some(r) = &o.state_root {
            self.state_root = r.clone();
        }
        if let Some(d) = &o.data_path {
            self.data_path = Some(d.clone());
        }
        if let Some(l) = o.data_link {
            self.data_link = l;
        }
        if let Some(t) = &o.tenant_user {
            self.supervisor.tenant_user = t.clone();
        }
        if let Some(m) = o.mail_ports {
            self.mail_ports = m;
        }
        if let Some(t) = &o.token_file {
            self.auth.token_file = Some(t.clone());
        }
        if let Some(f) = o.log_format {
            self.log_format = f;
        }
        if o.allow_remote_tcp {
            self.auth.allow_remote_tcp = true;
        }
        if let Some(n) = &o.name {
            self.name = Some(n.clone());
        }
        if let Some(m) = &o.manifest {
            self.manifest = Some(m.clone());
        }
        if let Some(r) = &o.exec_root {
            self.exec.root = r.clone();
        }
    }

    /// Checks everything that can be checked without binding sockets.
    /// `env_token` is the value of `SANDBOX_AGENT_TOKEN`, used only when no
    /// token file is configured by flag or env (`file_from_cli`).
    pub fn validate(
        mut self,
        env_token: Option<&str>,
        file_from_cli: bool,
    ) -> Result<Settings, ConfigError> {
        let (token, token_source) = self.token(env_token, file_from_cli)?;
        if self.listen.is_empty() {
            return Err(ConfigError::NoListener);
        }
        let mut seen: Vec<Endpoint> = Vec::new();
        let listen = self.endpoints(&self.listen, token.is_some(), &mut seen)?;
        let mcp_listen = self.endpoints(&self.mcp_listen, token.is_some(), &mut seen)?;
        if self.auth.require_on_local && token.is_none() {
            return Err(ConfigError::LocalNeedsToken);
        }
        self.limits.check_nonzero()?;
        self.archive.validate()?;
        if self.workspace.as_os_str().is_empty() {
            return Err(ConfigError::WorkspaceEmpty);
        }
        self.workspace = absolute(&self.workspace)?;
        if self.state_root.as_os_str().is_empty() {
            return Err(ConfigError::StateRootEmpty);
        }
        self.state_root = absolute(&self.state_root)?;
        self.supervisor.validate()?;
        self.gateway.validate()?;
        self.lifecycle.validate()?;
        self.exec.root = absolute(&self.exec.root)?;
        self.exec.validate(&self.workspace)?;
        let exec_mcp_listen = self.exec_mcp_listen(&seen)?;
        if let Some(d) = &self.data_path {
            crate::workspace::data_path::check(&self.workspace, d)
                .map_err(ConfigError::DataPath)?;
        }
        let manifest = self.load_manifest()?;
        let name = self.name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "sandbox".to_owned())
        });
        Ok(Settings {
            name,
            listen,
            mcp_listen,
            gateway: self.gateway.clone(),
            workspace: self.workspace.clone(),
            data_path: self.data_path.clone().map(|d| (d, self.data_link)),
            log_format: self.log_format,
            token,
            token_source,
            require_token_on_local: self.auth.require_on_local,
            limits: self.limits.clone(),
            archive: self.archive.clone(),
            manifest,
            supervisor: self.supervisor.clone(),
            lifecycle: self.lifecycle.clone(),
            exec: self.exec.clone(),
            exec_mcp_listen,
            effective: self,
        })
    }
}

impl Config {
    /// The API token and where it came from: a token file named on the
    /// command line wins over `SANDBOX_AGENT_TOKEN`, which wins over one
    /// from the config file.
    fn token(
        &self,
        env_token: Option<&str>,
        file_from_cli: bool,
    ) -> Result<(Option<Token>, TokenSource), ConfigError> {
        Ok(match (&self.auth.token_file, env_token) {
            (Some(p), _) if file_from_cli => (
                Some(Token::from_file(p).map_err(ConfigError::Token)?),
                TokenSource::File(p.clone()),
            ),
            (_, Some(t)) => (
                Some(Token::new(t, TOKEN_ENV).map_err(ConfigError::Token)?),
                TokenSource::Env,
            ),
            (Some(p), None) => (
                Some(Token::from_file(p).map_err(ConfigError::Token)?),
                TokenSource::File(p.clone()),
            ),
            (None, None) => (None, TokenSource::None),
        })
    }

    /// `exec.mcp_listen`: empty (none), or a loopback TCP address that is
    /// not another listener's (`seen`), unless its port is 0.
    fn exec_mcp_listen(&self, seen: &[Endpoint]) -> Result<Option<Endpoint>, ConfigError> {
        let uri = self.exec.mcp_listen.as_str();
        if uri.is_empty() {
            return Ok(None);
        }
        let ep: Endpoint = uri
            .parse()
            .map_err(|e: UriError| ConfigError::ExecListen(e.to_string()))?;
        if !ep.is_loopback_tcp() {
            return Err(ConfigError::ExecListen(format!(
                "{uri} must be a loopback tcp:// address (scripts reach it from inside the sandbox)"
            )));
        }
        // Port 0 (the default) never clashes; a fixed port must not be
        // another listener's.
        if seen.contains(&ep) && !matches!(ep, Endpoint::Tcp { port: 0, .. }) {
            return Err(ConfigError::Duplicate(ep.to_string()));
        }
        Ok(Some(ep))
    }

    /// The manifest (`--manifest`, else the default path if it exists, else
    /// none), its mail ports made automatic under `MailPorts::Auto`.
    fn load_manifest(&self) -> Result<Manifest, ConfigError> {
        let roots = Roots {
            workspace: &self.workspace,
            state_root: &self.state_root,
            data: self.data_path.as_deref(),
        };
        let mut manifest = match &self.manifest {
            Some(p) => Manifest::load(p, &roots)?,
            None if Path::new(DEFAULT_MANIFEST_PATH).exists() => {
                Manifest::load(Path::new(DEFAULT_MANIFEST_PATH), &roots)?
            }
            None => Manifest::empty(Path::new(DEFAULT_MANIFEST_PATH)),
        };
        if let (MailPorts::Auto, Some(m)) = (self.mail_ports, manifest.mail.as_mut()) {
            m.imap_port = 0;
            m.smtp_port = 0;
        }
        Ok(manifest)
    }

    /// Parses and checks one listener list; `seen` catches duplicates
    /// across the control and data planes.
    fn endpoints(
        &self,
        uris: &[String],
        have_token: bool,
        seen: &mut Vec<Endpoint>,
    ) -> Result<Vec<Endpoint>, ConfigError> {
        let mut out = Vec::new();
        for uri in uris {
            let ep: Endpoint = uri.parse().map_err(ConfigError::Uri)?;
            if matches!(ep, Endpoint::HybridVsock { .. }) {
                return Err(ConfigError::ClientOnly(uri.clone()));
            }
            if seen.contains(&ep) {
                return Err(ConfigError::Duplicate(ep.to_string()));
            }
            if let Endpoint::Tcp { .. } = ep {
                if !have_token {
                    return Err(ConfigError::TcpNeedsToken(ep.to_string()));
                }
                if !ep.is_loopback_tcp() && !self.auth.allow_remote_tcp {
                    return Err(ConfigError::RemoteTcp(ep.to_string()));
                }
            }
            seen.push(ep.clone());
            out.push(ep);
        }
        Ok(out)
    }
}

impl Settings {
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.limits.shutdown_grace_ms)
    }

    /// The effective configuration as TOML, the token itself never shown.
    pub fn render(&self) -> String {
        let body = toml::to_string_pretty(&self.effective)
            .unwrap_or_else(|e| format!("# cannot render config: {e}\n"));
        let token = match &self.token_source {
            TokenSource::None => "none (unix and vsock listeners only)".to_owned(),
            TokenSource::File(p) => format!("from file {}", p.display()),
            TokenSource::Env => format!("from environment variable {TOKEN_ENV}"),
        };
        let mut servers = String::new();
        for def in self.manifest.servers.values() {
            let mut line = vec![def.command.clone()];
            line.extend(def.args.iter().cloned());
            servers.push_str(&format!("#   {}: {}\n", def.name, line.join(" ")));
        }
        if servers.is_empty() {
            servers = "#   (none)\n".into();
        }
        format!(
            "# effective sandbox-agent configuration\n# sandbox name: {}\n# token: {token}\n# manifest {}: {} servers\n{servers}{body}",
            self.name,
            self.manifest.path.display(),
            self.manifest.servers.len()
        )
    }
}

#[cfg(test)]
mod tests;
