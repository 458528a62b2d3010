//! Agents with an MCP server manifest: the shipped packaging/servers.toml
//! (servers installed by packaging/install-servers.sh) plus test entries.

use std::path::{Path, PathBuf};

use super::{Agent, ctl, text};

/// Where the test command installed the servers.
pub fn servers_dir() -> String {
    std::env::var("SANDBOX_AGENT_SERVERS_DIR")
        .unwrap_or_else(|_| "/opt/sandbox-agent/servers".to_owned())
}

/// The launchers (data tools, the mail service, emails-mcp's) the tests
/// take from this checkout, by the server whose virtualenv runs them.
const DATA_TOOLS: [(&str, &str); 5] = [
    ("canvas", "canvas-data"),
    ("google_cloud", "google-cloud-data"),
    ("poste_email_toolathlon", "sandbox-mail"),
    ("poste_email_toolathlon", "emails-mcp-env"),
    ("poste_email_toolathlon@Toolathlon", "emails-mcp-env"),
];

/// This checkout's `packaging/launchers/TOOL`, written as
/// install-servers.sh writes it (run by its server's virtualenv's python)
/// into this build's temporary directory: the tests run the data tools of
/// the tree they test, not the copy installed last.
fn checkout_launcher(server: &str, tool: &str) -> PathBuf {
    let src = format!("{}/packaging/launchers/{tool}", env!("CARGO_MANIFEST_DIR"));
    let body = std::fs::read_to_string(&src).expect("launcher");
    let (_, rest) = body.split_once('\n').expect("a #! line");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("launchers")
        .join(server);
    std::fs::create_dir_all(&dir).expect("launchers dir");
    let path = dir.join(tool);
    // Test binaries run side by side: a whole file, renamed into place.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let part = dir.join(format!("{tool}.{}.{n}.part", std::process::id()));
    std::fs::write(
        &part,
        format!("#!{}/py/{server}/bin/python3\n{rest}", servers_dir()),
    )
    .expect("launcher copy");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::rename(&part, &path).expect("launcher in place");
    path
}

/// packaging/servers.toml as installed here: its `install_dir` the tests'
/// install prefix, nothing else changed.
pub fn installed_manifest() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/servers.toml"
    ))
    .expect("packaging/servers.toml")
    .replace(
        "install_dir = \"/opt/sandbox-agent/servers\"",
        &format!("install_dir = \"{}\"", servers_dir()),
    )
}

/// The shipped manifest, pointed at the installed servers (the data tools
/// at this checkout's) and with its state directories moved under `state`
/// (tests run in parallel).
pub fn shipped_manifest(state: &Path) -> String {
    let mut text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/servers.toml"
    ))
    .expect("packaging/servers.toml");
    for (server, tool) in DATA_TOOLS {
        text = text.replace(
            &format!("\"${{install_dir}}/py/{server}/bin/{tool}\""),
            &format!("\"{}\"", checkout_launcher(server, tool).display()),
        );
    }
    // The memory data tool runs with the system's python: as it is here.
    let memory_data = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/launchers/memory-data"
    );
    text.replace(
        "\"${install_dir}/bin/memory-data\"",
        &format!("\"{memory_data}\""),
    )
    .replace(
        "install_dir = \"/opt/sandbox-agent/servers\"",
        &format!("install_dir = \"{}\"", servers_dir()),
    )
    .replace("${state_root}", &state.display().to_string())
    .replace(
        super::bench_data::SHIPPED_PREFIX,
        &super::bench_data::prefix().display().to_string(),
    )
}

/// The Python of the MCP SDK 2.x client, in a venv of its own (it cannot
/// share one with the 1.x client): `SANDBOX_AGENT_MCP2_PYTHON`, else where
/// the README's test command installs it (`tests/clients/mcp2`).
pub fn mcp2_python() -> String {
    std::env::var("SANDBOX_AGENT_MCP2_PYTHON")
        .unwrap_or_else(|_| "/opt/sandbox-agent/clients/mcp2/bin/python".to_owned())
}

/// Path of the memory server's entry point, for test entries that wrap it.
pub fn memory_js() -> String {
    format!(
        "{}/node/node_modules/@modelcontextprotocol/server-memory/dist/index.js",
        servers_dir()
    )
}

/// Starts an agent with the shipped manifest plus `extra` TOML, and
/// `config` as its agent.toml.
pub fn agent_with(extra: &str, config: &str) -> Agent {
    agent_with_env(extra, config, &[])
}

/// [`agent_with`], the agent's environment extended by `env`.
pub fn agent_with_env(extra: &str, config: &str, env: &[(&str, &str)]) -> Agent {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let manifest = dir.path().join("servers.toml");
    let extra = extra.replace("/var/lib/sandbox-agent", &state.display().to_string());
    std::fs::write(&manifest, format!("{}\n{extra}", shipped_manifest(&state))).expect("manifest");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, config).expect("config");
    let m = manifest.display().to_string();
    let c = cfg.display().to_string();
    Agent::start_in(dir, &["--manifest", &m, "--config", &c], env)
}

pub fn state_dir(agent: &Agent) -> PathBuf {
    agent.dir.path().join("state")
}

/// Pids of every process whose parent chain reaches `root` (not `root`).
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            && let Some((_, rest)) = stat.rsplit_once(')')
        {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if let Some(pp) = f.get(1).and_then(|s| s.parse::<u32>().ok()) {
                parent.insert(pid, (pp, f[0].to_owned()));
            }
        }
    }
    let mut out = Vec::new();
    for (&pid, _) in parent.iter() {
        let mut cur = pid;
        for _ in 0..64 {
            match parent.get(&cur) {
                Some((pp, _)) if *pp == root => {
                    out.push(pid);
                    break;
                }
                Some((pp, _)) if *pp > 1 => cur = *pp,
                _ => break,
            }
        }
    }
    out
}

/// Zombie children of `parent`.
pub fn zombies_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            && let Some((_, rest)) = stat.rsplit_once(')')
        {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.first() == Some(&"Z") && f.get(1) == Some(&parent.to_string().as_str()) {
                out.push(pid);
            }
        }
    }
    out
}

/// Processes whose command line contains `needle`.
pub fn pgrep(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

/// A loopback TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Runs sandboxctl against `agent`'s control and data planes; panics with
/// its output (and the agent's) unless it succeeds; returns its stdout.
pub fn sandboxctl(agent: &Agent, args: &[&str]) -> String {
    let at = agent.unix_uri();
    let mcp = format!("unix://{}", agent.mcp_socket().display());
    let mut all = vec!["--agent", &at, "--mcp", &mcp];
    all.extend_from_slice(args);
    let out = ctl(&all);
    assert!(
        out.status.success(),
        "sandboxctl {args:?}: {}\n{}\nagent:\n{}",
        text(&out.stdout),
        text(&out.stderr),
        agent.stderr.all()
    );
    text(&out.stdout)
}
