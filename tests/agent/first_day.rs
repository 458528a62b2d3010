//! What a first day with the agent and sandboxctl runs into: non-root use
//! with --dev, a closed pipe, a non-archive upload, the messages of a
//! refused acquire, JSON logs, and Initialize without a filesystem sync.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::mcp::*;
use crate::common::*;

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// As `nobody` with --dev and the shipped manifest: localmemory writes its
/// file under ./state, Release works although other servers' state paths
/// are not writable, and a state path it cannot empty does not keep the
/// lease.
#[test]
fn non_root_dev_agent_acquires_and_releases() {
    if !root_or_skip("running the agent as nobody") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = &dir.path().to_owned();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    nix::unistd::chown(d, Some(65534.into()), Some(65534.into())).expect("chown");
    let manifest = d.join("servers.toml");
    std::fs::write(
        &manifest,
        shipped_manifest(std::path::Path::new("${state_root}")),
    )
    .expect("manifest");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&*AGENT)
        // Unix sockets only: tests run in parallel (--dev's tcp ports).
        .args(["--dev", "--listen", "unix://sandbox-agent.sock"])
        .args([
            "--mcp-listen",
            "unix://sandbox-agent-mcp.sock",
            "--manifest",
        ])
        .arg(&manifest)
        .current_dir(d)
        .env("HOME", d)
        .env("RUST_LOG", "info")
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("SANDBOX_AGENT_CONFIG");
    let agent = Agent::spawn(cmd, dir, d.join("sandbox-agent.sock"));
    let at = format!("unix://{}", d.join("sandbox-agent.sock").display());
    let mcp = format!("unix://{}", d.join("sandbox-agent-mcp.sock").display());
    ok(&ctl(&[
        "--agent",
        &at,
        "acquire",
        "--servers",
        "localmemory",
    ]));
    ok(&ctl(&[
        "--agent",
        &at,
        "--mcp",
        &mcp,
        "mcp",
        "localmemory",
        "call",
        "create_entities",
        "--args",
        r#"{"entities":[{"name":"a","entityType":"t","observations":["x"]}]}"#,
    ]));
    let memory = d.join("state/memory/memory.jsonl");
    assert!(memory.is_file(), "{}", agent.stderr.all());
    let out = ok(&ctl(&["--agent", &at, "release"]));
    assert!(out.contains("released"), "{out}");
    assert!(!memory.exists());

    // A state path nobody cannot empty (root's directory inside it):
    // Release still ends the lease, says what it left, and empties the rest.
    ok(&ctl(&[
        "--agent",
        &at,
        "acquire",
        "--servers",
        "localmemory",
    ]));
    std::fs::write(&memory, "{}\n").expect("memory file");
    let locked = d.join("state/memory/locked");
    std::fs::create_dir(&locked).expect("mkdir");
    std::fs::write(locked.join("f"), "x").expect("file");
    let out = ok(&ctl(&["--agent", &at, "release"]));
    assert!(
        out.contains("could not empty") && out.contains("memory"),
        "{out}"
    );
    assert!(!memory.exists(), "the rest is emptied");
    let status = ok(&ctl(&["--agent", &at, "status"]));
    assert!(status.contains("idle"), "{status}");
    std::fs::remove_dir_all(&locked).expect("cleanup");
    drop(agent);
}

/// `sandboxctl … | head -1`: the reader goes away; sandboxctl exits
/// quietly (141, as a program killed by SIGPIPE) with nothing on stderr.
#[test]
fn a_closed_pipe_ends_sandboxctl_quietly() {
    let agent = agent_with("", "");
    let uri = agent.unix_uri();
    let mut child = Command::new(&*CTL)
        .args(["--agent", &uri, "status"])
        .env_remove("SANDBOX_AGENT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sandboxctl");
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(141), "{err}");
    assert!(err.is_empty(), "{err}");
}

/// A file that is no archive is refused with what it looks like and what
/// was expected, never its bytes.
#[test]
fn a_non_archive_upload_is_named_not_echoed() {
    let agent = Agent::start(&[]);
    let uri = agent.unix_uri();
    let dir = tempfile::tempdir().expect("tempdir");
    let zip = dir.path().join("data.tar.gz");
    let mut bytes = b"PK\x03\x04secret-bytes".to_vec();
    bytes.resize(2048, b'z');
    std::fs::write(&zip, &bytes).expect("zip");
    let text_file = dir.path().join("notes.tar");
    std::fs::write(&text_file, "hello secret text, not a tar\n".repeat(40)).expect("text");
    for (path, says) in [(&zip, "zip"), (&text_file, "not a tar header")] {
        let out = ctl(&["--agent", &uri, "upload", &path.display().to_string()]);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(err.contains("InvalidArgument"), "{err}");
        assert!(
            err.contains(says) && err.contains("gzip") && err.contains("zstd"),
            "{err}"
        );
        assert!(!err.contains("secret"), "the data is quoted: {err}");
    }
}

/// A refused acquire names every server that lacks credentials with the
/// CLI form; a second acquire says when the lease began in words; a
/// missing socket asks whether the agent runs.
#[test]
fn refusals_say_what_to_do() {
    let agent = agent_with("", "");
    let uri = agent.unix_uri();
    let out = ctl(&[
        "--agent",
        &uri,
        "acquire",
        "--servers",
        "canvas,google_cloud",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    for want in [
        "server canvas needs",
        "server google_cloud needs",
        "--auth canvas.",
        "--auth google_cloud.",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    ok(&ctl(&[
        "--agent",
        &uri,
        "acquire",
        "--servers",
        "filesystem",
    ]));
    let out = ctl(&["--agent", &uri, "acquire", "--servers", "filesystem"]);
    let err = text(&out.stderr);
    assert!(
        err.contains("already leased") && err.contains(" ago)") || err.contains("(just now)"),
        "{err}"
    );
    assert!(!err.contains(" ms)"), "{err}");
    let gone = format!("unix://{}", agent.dir.path().join("nope.sock").display());
    let err = text(&ctl(&["--agent", &gone, "status"]).stderr);
    assert!(err.contains("is the agent running?"), "{err}");
}

/// --log-format json with --dev: every line on stderr is a JSON object.
#[test]
fn json_logs_are_only_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(&*AGENT)
        .args(["--dev", "--log-format", "json", "--listen", "unix://a.sock"])
        .args(["--mcp-listen", "unix://mcp.sock"])
        .current_dir(dir.path())
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("SANDBOX_AGENT_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent");
    let lines = capture(child.stderr.take().expect("stderr"));
    let serving = lines.wait_for(Duration::from_secs(20), |l| l.contains("\"serving\""));
    let _ = child.kill();
    let _ = child.wait();
    assert!(serving.is_some(), "{}", lines.all());
    let all = lines.all();
    for l in all.lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v.is_object()),
            "not a JSON line: {l:?}"
        );
    }
    assert!(all.contains("token_file"), "{all}");
}

/// Initialize does not sync the filesystem unless asked: the answer says
/// which it did.
#[tokio::test]
async fn initialize_syncs_only_when_durable() {
    use sandbox_client::proto;
    use sandbox_client::proto::initialize_request::Msg;
    let agent = Agent::start(&[]);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let mut t = crate::common::ws::Tar::new();
    t.file("a.txt", b"a");
    let archive = t.end();
    for (durable, want) in [(None, false), (Some(true), true), (Some(false), false)] {
        let msgs = vec![
            proto::InitializeRequest {
                msg: Some(Msg::Header(proto::InitializeHeader {
                    durable,
                    ..Default::default()
                })),
            },
            proto::InitializeRequest {
                msg: Some(Msg::Chunk(archive.clone().into())),
            },
        ];
        let r = c
            .workspace()
            .initialize(tokio_stream::iter(msgs))
            .await
            .expect("Initialize")
            .into_inner();
        assert_eq!(r.durable, want, "{durable:?}");
        assert_eq!(r.files, 1);
    }
}
