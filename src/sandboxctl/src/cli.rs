//! The command line: global options and one subcommand per verb.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
/// Control a sandbox agent from the host.
#[derive(Parser, Debug)]
#[command(name = "sandboxctl", version)]
pub(crate) struct Args {
    /// Agent endpoint: vsock://CID:PORT, unix:///path, tcp://HOST:PORT or
    /// hvsock:///path/to/vsock.sock:PORT.
    #[arg(long, global = true, value_name = "URI", env = "SANDBOX_AGENT")]
    pub agent: Option<String>,

    /// The agent's MCP data plane (for `mcp`). Default: port 1025 of the
    /// --agent vsock/hvsock endpoint; required for unix:// and tcp:// agents.
    #[arg(long, global = true, value_name = "URI", env = "SANDBOX_AGENT_MCP")]
    pub mcp: Option<String>,

    /// Bearer token (required by tcp:// listeners).
    #[arg(
        long,
        global = true,
        env = "SANDBOX_AGENT_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    pub token: Option<String>,

    /// File holding the bearer token.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "SANDBOX_AGENT_TOKEN_FILE"
    )]
    pub token_file: Option<PathBuf>,

    /// Seconds to wait for a connection (for hvsock://, the retry deadline
    /// while the VM boots).
    #[arg(long, global = true, default_value_t = 5.0, value_name = "SECONDS")]
    pub timeout: f64,

    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub verb: Verb,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Verb {
    /// Health of the agent (grpc.health.v1). Exit 0 only when SERVING.
    Health {
        /// Check one service (e.g. sandbox.agent.v1.Workspace) instead of
        /// the whole agent.
        #[arg(long, default_value = "")]
        service: String,
    },
    /// Agent version, machine, resources and lease.
    Info,
    /// Load a directory (packed and compressed on the fly) or an archive file
    /// (.tar, .tar.gz, .tar.zst) into the workspace, atomically.
    Upload {
        /// Directory or archive file.
        path: PathBuf,
        /// Lay the contents over the workspace instead of replacing it.
        #[arg(long)]
        merge: bool,
        /// Flush the new contents to disk before answering (syncfs; the
        /// agent's default is not to: the swap is atomic either way).
        #[arg(long)]
        durable: bool,
    },
    /// Download the workspace as a tar.gz (or tar.zst) archive.
    Dump {
        /// Output file, or - for standard output. A file appears only once
        /// the whole archive arrived and its sha256 matched.
        #[arg(short, long, value_name = "FILE")]
        output: String,
        /// Leave out paths matching this glob (repeatable), e.g. 'node_modules' or '**/*.log'.
        #[arg(long, value_name = "GLOB")]
        exclude: Vec<String>,
        /// zstd instead of gzip.
        #[arg(long)]
        zstd: bool,
        /// Compression level (gzip 1-9, default 6; zstd 1-22, default 3).
        #[arg(long)]
        level: Option<i32>,
        /// Dump only this directory of the workspace.
        #[arg(long, value_name = "DIR")]
        path: Option<String>,
    },
    /// Empty the workspace, atomically.
    Clear,
    /// Lease the sandbox: start MCP servers and wait until they are ready
    /// (with --lazy, on first use).
    Acquire {
        /// Servers to start, comma-separated (names from the manifest).
        #[arg(long, value_delimiter = ',', value_name = "NAMES")]
        servers: Vec<String>,
        /// Start every server in the manifest.
        #[arg(long, conflicts_with = "servers")]
        all: bool,
        /// Benchmark profile: MCP_Atlas, Toolathlon or MCP_Mark.
        #[arg(long)]
        benchmark: Option<String>,
        /// Release automatically after this many seconds (60-86400; default 7200).
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<u32>,
        /// No automatic release.
        #[arg(long, conflicts_with = "ttl")]
        no_ttl: bool,
        /// Lease id (default: a random one).
        #[arg(long)]
        lease_id: Option<String>,
        /// Klavis test_account_email.
        #[arg(long)]
        email: Option<String>,
        /// Credential for a server: SERVER.KEY=VALUE (repeatable).
        #[arg(long, value_name = "SERVER.KEY=VALUE")]
        auth: Vec<String>,
        /// Environment variable for a server: SERVER.VAR=VALUE (repeatable).
        #[arg(long, value_name = "SERVER.VAR=VALUE")]
        env: Vec<String>,
        /// Start no server now: each starts on its first MCP request (the
        /// answer comes once the workspace is ready, servers idle).
        #[arg(long)]
        lazy: bool,
    },
    /// End the lease: stop the servers, clear the workspace and their state.
    Release {
        /// The lease to release (default: the current one).
        #[arg(long)]
        lease_id: Option<String>,
        /// Record the release as a TTL expiry (Klavis is_ttl).
        #[arg(long)]
        is_ttl: bool,
    },
    /// Return the lease to its freshly-acquired state.
    Reset {
        #[arg(long)]
        lease_id: Option<String>,
    },
    /// Stop the agent (Agent.Shutdown): servers stopped, calls drained; as
    /// the VM's init it then powers the VM off.
    Shutdown {
        /// Why, for the agent's log.
        #[arg(long, default_value = "sandboxctl shutdown")]
        reason: String,
    },
    /// Bind the agent to a new token (Agent.BindToken): afterwards the
    /// token of this call (--token/--token-file) admits nothing, on the
    /// control plane and the MCP data plane; FILE's token does.
    BindToken {
        /// File holding the new token (surrounding whitespace ignored).
        #[arg(long, value_name = "FILE")]
        new_token_file: PathBuf,
    },
    /// Sandbox status, lease and servers.
    Status,
    /// Run Python scripts inside the leased sandbox (Klavis's execution
    /// API): upload, run, status, logs, export, cancel.
    Exec {
        #[command(subcommand)]
        verb: ExecVerb,
    },
    /// List, start, stop or restart MCP servers.
    Servers {
        #[command(subcommand)]
        verb: Option<ServersVerb>,
    },
    /// Talk MCP to one server of the lease through the agent's data plane.
    Mcp {
        /// Server name, e.g. filesystem.
        name: String,
        #[command(subcommand)]
        verb: McpVerb,
    },
    /// Expose the agent's MCP data plane on this host (e.g. a VM's, over
    /// vsock) for local MCP clients: every connection to --listen is
    /// forwarded to the data plane. Runs until interrupted.
    McpProxy {
        /// Where to listen: tcp://127.0.0.1:PORT (loopback only) or unix:///path.
        #[arg(long, value_name = "URI")]
        listen: String,
        /// A Host name clients may address the proxy by (repeatable; ports
        /// are not compared). Default: localhost, 127.0.0.1 and [::1].
        /// Requests with any other Host, or a browser Origin from any other
        /// host, are refused (403): a DNS-rebinding web page cannot reach
        /// the sandbox's servers through the proxy.
        #[arg(long = "allow-host", value_name = "HOST")]
        allow_hosts: Vec<String>,
        /// Require `Authorization: Bearer <token>` from clients, the token
        /// read from FILE (created with a fresh token, mode 0600, if
        /// missing). The data plane's own token (--token/--token-file) is
        /// sent upstream in its place.
        #[arg(long, value_name = "FILE")]
        require_token: Option<PathBuf>,
    },
    /// A server's captured output (stderr; stdout for http servers).
    Logs {
        name: String,
        /// Keep following new lines.
        #[arg(short, long)]
        follow: bool,
        /// Start with the last N lines (default: all buffered).
        #[arg(long, default_value_t = 0)]
        tail: u32,
        /// stdout, stderr or all.
        #[arg(long)]
        stream: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum ExecVerb {
    /// Upload a directory holding main.py (and optionally requirements.txt
    /// and packages.txt), or a .tar/.tar.gz/.tar.zst of one, as execution
    /// NAME. Re-using a name replaces it (a running one is killed).
    Upload { name: String, path: PathBuf },
    /// Start execution NAME in the background (uploading PATH first when
    /// given). With -f, follow its log and exit 0 only if it completes.
    Run {
        name: String,
        path: Option<PathBuf>,
        #[arg(short, long)]
        follow: bool,
    },
    /// The status of NAME, or of every execution of the lease.
    Status { name: Option<String> },
    /// Print NAME's log (stdout and stderr as written) from a byte cursor.
    Logs {
        name: String,
        /// Keep following until the execution ends; exit 1 if it failed.
        #[arg(short, long)]
        follow: bool,
        /// Byte offset to start from.
        #[arg(long, default_value_t = 0)]
        cursor: u64,
    },
    /// Save NAME's directory (its working directory) as a tar.gz.
    Export {
        name: String,
        /// Output file, or - for standard output.
        #[arg(short, long)]
        output: String,
    },
    /// Kill a queued or running execution with its whole process tree.
    Cancel { name: String },
}

#[derive(Subcommand, Debug)]
pub(crate) enum McpVerb {
    /// List the server's tools.
    Tools,
    /// Call one tool and print its result.
    Call {
        tool: String,
        /// Tool arguments as a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum ServersVerb {
    /// Every server in the manifest with state, pid, restarts, CPU and RSS.
    List,
    /// Start a server and wait until it is ready.
    Start { name: String },
    /// Stop a server (SIGTERM to its processes, SIGKILL after the grace period).
    Stop {
        name: String,
        /// Milliseconds between SIGTERM and SIGKILL (default: the manifest's).
        #[arg(long, default_value_t = 0)]
        grace_ms: u32,
    },
    /// Stop and start a server, resetting its restart count.
    Restart { name: String },
}
