//! What the shipped servers that the host's catalog comparisons do not
//! list advertise (those whose launch carries a lease's secret, and those
//! ALL leaves out), as the official MCP Python SDKs (1.x and 2.x) list it
//! through the agent's data plane: every tool's `inputSchema` is an object
//! schema with its properties, under every profile
//! (tests/common/tool_surface.rs). Every other shipped server is listed
//! live, under every profile and with both SDKs, by those comparisons
//! (tests/host/catalog.rs), which check the same surface. And a server whose install is absent is not
//! advertised: naming it is refused with the install command.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::mcp::*;
use crate::common::tool_surface::{self, UNCATALOGUED};
use crate::common::*;
use sandbox_agent::supervisor::manifest::{Manifest, Roots};

type Pins = BTreeMap<String, tool_surface::Bench>;

const MCP1_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/mcp_client.py");
const MCP2_CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/mcp2/mcp2_client.py"
);

/// Lists every tool of `servers` with the SDK at `python` running `client`.
fn list_schemas(agent: &Agent, python: &str, client: &str, servers: &[String]) -> Value {
    let sock = agent.mcp_socket().display().to_string();
    let joined = servers.join(",");
    let out = Command::new(python)
        .args([client, "--uds", &sock, &joined, "schemas"])
        .output()
        .expect("the MCP client");
    assert!(
        out.status.success(),
        "{client}: {}\nagent:\n{}",
        text(&out.stderr),
        agent.stderr.all()
    );
    serde_json::from_slice(&out.stdout).expect("the client's JSON")
}

/// The manifest's servers (all of them, installed or not).
fn manifest_of(agent: &Agent, installed: bool) -> Manifest {
    let path = agent.dir.path().join("servers.toml");
    let ws = agent.dir.path().join("ws");
    let state = state_dir(agent);
    let roots = Roots {
        workspace: &ws,
        state_root: &state,
        data: None,
    };
    if installed {
        return Manifest::load(&path, &roots).expect("manifest");
    }
    let text = std::fs::read_to_string(&path).expect("manifest");
    Manifest::parse(&text, &path, &roots).expect("manifest")
}

/// A service-account key file of the right form (a generated key).
fn service_account() -> String {
    let key = Command::new("openssl")
        .args(["genrsa", "2048"])
        .output()
        .expect("openssl genrsa");
    assert!(key.status.success());
    serde_json::json!({
        "type": "service_account",
        "project_id": "sandbox-test",
        "private_key_id": "1",
        "private_key": text(&key.stdout),
        "client_email": "test@sandbox-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    })
    .to_string()
}

/// Whether the host's catalog comparisons leave `server` to this test:
/// uncatalogued, or left out of ALL.
fn ours(m: &Manifest, server: &str) -> bool {
    UNCATALOGUED.contains(&server) || m.servers.get(server).is_some_and(|d| !d.in_all)
}

/// Per profile, the servers of `ours` to list: every installed one by
/// default; under a benchmark, those whose profile runs another command or
/// arguments (another version, a launcher): the others run what the
/// default runs.
fn profiles(m: &Manifest, pins: &Pins) -> BTreeMap<&'static str, Vec<String>> {
    let is_ours = |n: &String| ours(m, n);
    let mut out = BTreeMap::from([("default", m.names().into_iter().filter(is_ours).collect())]);
    for b in ["MCP_Atlas", "Toolathlon", "MCP_Mark"] {
        let pinned = tool_surface::pinned(pins, b);
        let names = m
            .servers
            .values()
            .filter(|d| {
                pinned.contains(&d.name)
                    || d.benchmarks
                        .iter()
                        .any(|(k, o)| k.as_str() == b && (o.command.is_some() || o.args.is_some()))
            })
            .filter(|d| !m.not_installed.contains_key(&d.name))
            .filter(|d| {
                !m.profiles_not_installed
                    .keys()
                    .any(|(n, k)| n == &d.name && k.as_str() == b)
            })
            .map(|d| d.name.clone())
            .filter(is_ours)
            .collect();
        out.insert(b, names);
    }
    out
}

/// Every server of `ours` under every profile lists its tools with object
/// schemas to both SDKs, and a benchmark's pinned ones list the tools
/// packaging/pins.toml says (names, properties, required ones). Absent
/// installs are skipped, saying so, except under CI=true, where every
/// shipped server must be installed.
#[test]
fn every_tool_of_the_servers_the_catalog_tests_leave_has_an_object_schema() {
    let agent = agent_with("", "mail_ports = \"auto\"\n");
    let (all, installed) = (manifest_of(&agent, false), manifest_of(&agent, true));
    let absent: Vec<String> = installed.not_installed.keys().cloned().collect();
    if !absent.is_empty() {
        assert!(!ci(), "CI=true and not installed: {absent:?}");
        crate::common::skipped(&format!(
            "servers not installed (packaging/install-servers.sh): {absent:?}"
        ));
    }
    assert!(
        all.servers.len() > absent.len(),
        "no shipped server installed"
    );
    let py2 = crate::common::mcp::mcp2_python();
    assert!(
        Path::new(&py2).exists(),
        "{py2} is missing: run .ci/test-all.sh"
    );
    let sa = agent.dir.path().join("service-account.json");
    std::fs::write(&sa, service_account()).expect("key file");
    let mut problems = Vec::new();
    let pins = tool_surface::load();
    for (profile, names) in profiles(&installed, &pins) {
        if names.is_empty() {
            continue;
        }
        let mut args = vec!["acquire", "--lazy", "--servers"];
        let joined = names.join(",");
        args.push(&joined);
        if profile != "default" {
            args.extend(["--benchmark", profile]);
        }
        // Credentials of the right form: listing tools reaches no service.
        let sa_arg = format!("google_cloud.credentials_file={}", sa.display());
        for (server, auth) in [
            ("google_cloud", "google_cloud.project_id=sandbox-test"),
            ("google_cloud", sa_arg.as_str()),
            ("canvas", "canvas.api_url=https://127.0.0.1:9/api/v1"),
            ("canvas", "canvas.api_token=token"),
        ] {
            if names.iter().any(|n| n == server) {
                args.extend(["--auth", auth]);
            }
        }
        sandboxctl(&agent, &args);
        let lists = |s: &str| ours(&installed, s);
        let one = list_schemas(&agent, "python3", MCP1_CLIENT, &names);
        tool_surface::surface_problems("SDK 1.x", &pins, profile, &one, lists, &mut problems);
        let two = list_schemas(&agent, &py2, MCP2_CLIENT, &names);
        tool_surface::schema_problems("SDK 2.x", profile, &two, &mut problems);
        sandboxctl(&agent, &["release"]);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A manifest whose install_dir lacks a server: the agent leaves it out of
/// its list and of ALL, and an Acquire naming it is refused with the
/// install command.
#[test]
fn a_server_not_installed_is_not_advertised() {
    let empty = tempfile::tempdir().expect("tempdir");
    let extra = format!(
        "[servers.present]\ncommand = \"node\"\nargs = [\"{}\"]\n",
        memory_js()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let manifest = shipped_manifest(&state).replace(
        &format!("install_dir = \"{}\"", servers_dir()),
        &format!("install_dir = \"{}\"", empty.path().display()),
    );
    let path = dir.path().join("servers.toml");
    std::fs::write(&path, format!("{manifest}\n{extra}")).expect("manifest");
    let p = path.display().to_string();
    let agent = Agent::start_in(dir, &["--manifest", &p], &[]);
    let listed = sandboxctl(&agent, &["servers", "list"]);
    assert!(listed.contains("present"), "{listed}");
    assert!(!listed.contains("filesystem"), "{listed}");
    let at = agent.unix_uri();
    let out = ctl(&["--agent", &at, "acquire", "--servers", "filesystem"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("InvalidArgument")
            && err.contains("filesystem is not installed")
            && err.contains("packaging/install-servers.sh filesystem"),
        "{err}"
    );
    let all = sandboxctl(&agent, &["acquire", "--all", "--lazy"]);
    assert!(all.contains("present") && !all.contains("git"), "{all}");
    sandboxctl(&agent, &["release"]);
}

/// The installer's command line: `--help` is the usage, an unknown option
/// or server is an error saying what to do, and an interpreter sandboxes
/// would not see (outside /usr and the prefix) is refused before anything
/// is installed.
#[test]
fn the_installer_says_how_it_is_used() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/install-servers.sh");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(script)
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("install-servers.sh");
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, usage, _) = run(&["--help"], &[]);
    assert_eq!(code, Some(0));
    assert!(
        usage.contains("--lock") && usage.contains("--prefix DIR"),
        "{usage}"
    );
    let (code, _, err) = run(&["--frobnicate"], &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("'--frobnicate'") && err.contains("--help"),
        "{err}"
    );
    let (code, _, err) = run(&["nope"], &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("unknown server 'nope'") && err.contains("filesystem@Toolathlon"),
        "{err}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let python = dir.path().join("python3");
    std::fs::copy("/usr/bin/python3", &python).expect("an interpreter outside /usr");
    let prefix = dir.path().join("servers").display().to_string();
    let py = python.display().to_string();
    let (code, _, err) = run(&["--prefix", &prefix, "calculator"], &[("PYTHON", &py)]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("outside /usr") && err.contains("/usr/bin/python3"),
        "{err}"
    );
    assert!(!dir.path().join("servers/py/calculator").exists());
}
