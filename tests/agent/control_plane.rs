//! The agent's control plane through the real binaries: health and info over
//! unix and tcp, auth, reflection, URI and config errors, socket handling,
//! graceful shutdown.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

#[test]
fn health_and_info_over_unix() {
    let agent = Agent::start(&[]);
    let uri = agent.unix_uri();

    let out = ctl(&["--agent", &uri, "health"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "SERVING");

    let out = ctl(&[
        "--agent",
        &uri,
        "health",
        "--service",
        "sandbox.agent.v1.Workspace",
        "--json",
    ]);
    assert!(out.status.success());
    assert_eq!(json(&out)["status"], "SERVING");

    let out = ctl(&["--agent", &uri, "info", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let info = json(&out);
    let uname = nix::sys::utsname::uname().unwrap();
    assert_eq!(info["kernel_release"], uname.release().to_str().unwrap());
    assert_eq!(
        info["hostname"],
        nix::unistd::gethostname().unwrap().to_str().unwrap()
    );
    assert_eq!(info["agent_pid"], agent.child.id());
    assert_eq!(info["agent_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        info["boot_id"],
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap()
            .trim()
    );
    assert_eq!(info["status"], "idle");
    assert_eq!(info["lease"], Value::Null);
    assert!(info["cpu_count"].as_u64().unwrap() >= 1);
    assert!(
        info["memory_total_bytes"].as_u64().unwrap()
            >= info["memory_available_bytes"].as_u64().unwrap()
    );
    let rss = info["agent_rss_bytes"].as_u64().unwrap();
    assert!(rss > 100 << 10 && rss < 1 << 30, "implausible rss {rss}");
    let ws = agent.dir.path().join("ws");
    assert_eq!(info["workspace"]["path"], ws.to_str().unwrap());
    assert!(ws.is_dir(), "agent creates the workspace directory");
    let st = nix::sys::statvfs::statvfs(&ws).unwrap();
    assert_eq!(
        info["workspace"]["total_bytes"].as_u64().unwrap(),
        st.blocks() as u64 * st.fragment_size() as u64
    );

    // The readable table carries the same facts.
    let out = ctl(&["--agent", &uri, "info"]);
    assert!(out.status.success());
    let table = text(&out.stdout);
    assert!(table.contains("status     idle"), "{table}");
    assert!(table.contains(uname.release().to_str().unwrap()), "{table}");
}

#[test]
fn tcp_requires_the_token_and_health_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = write_token(dir.path());
    let agent = Agent::start_in(
        dir,
        &[
            "--listen",
            "tcp://127.0.0.1:0",
            "--token-file",
            token_file.to_str().unwrap(),
        ],
        &[],
    );
    let tcp = agent.listening("tcp");
    assert!(tcp.starts_with("tcp://127.0.0.1:"), "{tcp}");

    let ok = ctl(&[
        "--agent",
        &tcp,
        "--token-file",
        token_file.to_str().unwrap(),
        "info",
        "--json",
    ]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert_eq!(json(&ok)["status"], "idle");
    let ok = ctl(&["--agent", &tcp, "--token", TOKEN, "info"]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));

    let missing = ctl(&["--agent", &tcp, "info"]);
    assert_eq!(missing.status.code(), Some(1));
    let err = text(&missing.stderr);
    assert!(
        err.contains("Unauthenticated") && err.contains("missing bearer token"),
        "{err}"
    );

    let wrong = ctl(&[
        "--agent",
        &tcp,
        "--token",
        "test-token-0123456789abcdeX",
        "info",
        "--json",
    ]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(text(&wrong.stderr).contains("wrong bearer token"));
    assert_eq!(json(&wrong)["ok"], false);

    // Probes need no secret.
    let health = ctl(&["--agent", &tcp, "health"]);
    assert!(health.status.success(), "{}", text(&health.stderr));

    // On unix the token is optional, but a wrong one is still refused.
    let unix = agent.unix_uri();
    assert!(ctl(&["--agent", &unix, "info"]).status.success());
    assert!(
        ctl(&["--agent", &unix, "--token", TOKEN, "info"])
            .status
            .success()
    );
    let wrong = ctl(&[
        "--agent",
        &unix,
        "--token",
        "test-token-0123456789abcdeX",
        "info",
    ]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(text(&wrong.stderr).contains("Unauthenticated"));
}

#[test]
fn require_on_local_enforces_the_token_on_unix() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, "[auth]\nrequire_on_local = true\n").unwrap();
    let agent = Agent::start_in(
        dir,
        &["--config", cfg.to_str().unwrap()],
        &[("SANDBOX_AGENT_TOKEN", TOKEN)],
    );
    let uri = agent.unix_uri();
    let out = ctl(&["--agent", &uri, "info"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("missing bearer token"));
    assert!(
        ctl(&["--agent", &uri, "--token", TOKEN, "info"])
            .status
            .success()
    );
    assert!(ctl(&["--agent", &uri, "health"]).status.success());
}

#[test]
fn unreachable_agent_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("unix://{}/nobody.sock", dir.path().display());
    let out = ctl(&["--agent", &uri, "health"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot reach the agent") && err.contains("nobody.sock"),
        "{err}"
    );
    assert!(out.stdout.is_empty());

    let out = ctl(&["--agent", &uri, "health", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["ok"], false);

    // No agent given at all.
    let out = ctl(&["health"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--agent"));
}

#[test]
fn bad_uris_list_the_accepted_forms() {
    for bad in ["foo://x", "tcp://nohost", "vsock://x:1", "unix://"] {
        let out = ctl(&["--agent", bad, "health"]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let err = text(&out.stderr);
        assert!(
            err.contains("accepted forms") && err.contains("hvsock://"),
            "{bad}: {err}"
        );

        let out = agent_once(&["--listen", bad, "--check-config"], &[]);
        assert!(!out.status.success(), "{bad}");
        assert!(text(&out.stderr).contains("accepted forms"), "{bad}");
    }
    let out = agent_once(&["--listen", "hvsock:///x.sock:1", "--check-config"], &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("client-only"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn config_file_errors_name_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    let path = cfg.to_str().unwrap();

    std::fs::write(&cfg, "listen = [\"unix:///tmp/a.sock\"\n").unwrap();
    let out = agent_once(&["--config", path, "--check-config"], &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(path) && err.contains("line 1"), "{err}");

    std::fs::write(&cfg, "[limits]\nmax_conections_per_listener = 3\n").unwrap();
    let err = text(&agent_once(&["--config", path, "--check-config"], &[]).stderr);
    assert!(err.contains("max_conections_per_listener"), "{err}");

    std::fs::write(&cfg, "[limits]\nshutdown_grace_ms = \"soon\"\n").unwrap();
    let err = text(&agent_once(&["--config", path, "--check-config"], &[]).stderr);
    assert!(err.contains("shutdown_grace_ms"), "{err}");

    std::fs::write(&cfg, "listen = [\"tcp://127.0.0.1:7\"]\n").unwrap();
    let err = text(&agent_once(&["--config", path, "--check-config"], &[]).stderr);
    assert!(err.contains("requires a token"), "{err}");

    std::fs::write(&cfg, "listen = [\"tcp://0.0.0.0:7\"]\n").unwrap();
    let err = text(
        &agent_once(
            &["--config", path, "--check-config"],
            &[("SANDBOX_AGENT_TOKEN", TOKEN)],
        )
        .stderr,
    );
    assert!(
        err.contains("not a loopback address") && err.contains("allow_remote_tcp"),
        "{err}"
    );

    let out = agent_once(
        &["--config", "/nonexistent/agent.toml", "--check-config"],
        &[],
    );
    assert!(text(&out.stderr).contains("cannot read config file /nonexistent/agent.toml"));

    let out = agent_once(
        &["--token-file", "/nonexistent/token", "--check-config"],
        &[],
    );
    assert!(text(&out.stderr).contains("cannot read token file /nonexistent/token"));

    let short = dir.path().join("short");
    std::fs::write(&short, "abc\n").unwrap();
    let out = agent_once(
        &["--token-file", short.to_str().unwrap(), "--check-config"],
        &[],
    );
    assert!(
        text(&out.stderr).contains("at least 16"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn flags_beat_env_beat_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        "listen = [\"unix:///tmp/from-file.sock\"]\nworkspace = \"/srv/ws\"\n[limits]\nmax_concurrent_streams = 7\n",
    )
    .unwrap();
    let path = cfg.to_str().unwrap();
    let check = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec!["--config", path, "--check-config"];
        all.extend_from_slice(args);
        let out = agent_once(&all, env);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let file_only = check(&[], &[]);
    assert!(
        file_only.contains("unix:///tmp/from-file.sock"),
        "{file_only}"
    );
    assert!(file_only.contains("max_concurrent_streams = 7"));
    assert!(file_only.contains("workspace = \"/srv/ws\""));
    assert!(file_only.contains("# token: none"));

    let env = [("SANDBOX_AGENT_LISTEN", "unix:///tmp/from-env.sock")];
    let with_env = check(&[], &env);
    assert!(with_env.contains("from-env.sock") && !with_env.contains("from-file.sock"));

    let with_flag = check(&["--listen", "unix:///tmp/from-flag.sock"], &env);
    assert!(with_flag.contains("from-flag.sock") && !with_flag.contains("from-env.sock"));

    let with_token = check(&[], &[("SANDBOX_AGENT_TOKEN", TOKEN)]);
    assert!(with_token.contains("# token: from environment variable SANDBOX_AGENT_TOKEN"));
    assert!(
        !with_token.contains(TOKEN),
        "the token itself is never printed"
    );
}

#[test]
fn unix_socket_is_private_and_stale_files_are_handled() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    // A stale socket: bound, then its listener closed without unlinking.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let agent = Agent::start_in(dir, &[], &[]);
    let md = std::fs::metadata(&agent.socket).unwrap();
    assert!(md.file_type().is_socket());
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    assert!(
        ctl(&["--agent", &agent.unix_uri(), "health"])
            .status
            .success()
    );

    // A live socket is never taken over.
    let out = agent_once(
        &[
            "--listen",
            &agent.unix_uri(),
            "--workspace",
            agent.dir.path().join("ws2").to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("already listening"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        ctl(&["--agent", &agent.unix_uri(), "health"])
            .status
            .success()
    );

    // A regular file in the way is left alone.
    let file = agent.dir.path().join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let out = agent_once(
        &[
            "--listen",
            &format!("unix://{}", file.display()),
            "--workspace",
            agent.dir.path().join("ws3").to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        text(&out.stderr).contains("is not a socket"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

#[test]
fn sigterm_shuts_down_cleanly_and_removes_the_socket() {
    let agent = Agent::start(&["--log-format", "json"]);
    let sock = agent.socket.clone();
    let stderr = agent.stderr.clone();
    // JSON logs carry the sandbox name in the span.
    let line = stderr
        .wait_for(Duration::from_secs(1), |l| {
            l.contains("\"message\":\"serving\"")
        })
        .expect("json serving line");
    let v: Value = serde_json::from_str(&line).expect("log line is JSON");
    assert!(v["span"]["sandbox"].is_string(), "{line}");

    let status = agent.terminate();
    assert!(status.success(), "exit status {status:?}\n{}", stderr.all());
    assert!(!sock.exists(), "socket file removed on shutdown");
    assert!(stderr.all().contains("SIGTERM received"));
}

#[test]
fn vsock_listener_binds_or_explains() {
    // This machine may be a VM guest: bind only (never connect to CID 2/3).
    // A real vsock round trip runs in the VM end-to-end test.
    let port = 20000 + (std::process::id() % 20000);
    let dir = tempfile::tempdir().unwrap();
    if std::path::Path::new("/dev/vsock").exists() {
        let agent = Agent::start_in(dir, &["--listen", &format!("vsock://any:{port}")], &[]);
        assert_eq!(agent.listening("vsock"), format!("vsock://any:{port}"));
        assert!(
            ctl(&["--agent", &agent.unix_uri(), "health"])
                .status
                .success()
        );
    } else {
        let out = agent_once(
            &[
                "--listen",
                &format!("vsock://any:{port}"),
                "--workspace",
                dir.path().join("ws").to_str().unwrap(),
            ],
            &[],
        );
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("vsock is not available"),
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn dev_mode_creates_a_private_token_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    // --dev defaults apply relative to the working directory; the tcp port
    // is overridden so parallel runs do not collide.
    let mut child = std::process::Command::new(&*AGENT)
        .args([
            "--dev",
            "--listen",
            "unix://dev.sock",
            "--listen",
            "tcp://127.0.0.1:0",
            // Not --dev's 7071: the README test's agent uses it.
            "--mcp-listen",
            "unix://dev-mcp.sock",
        ])
        .current_dir(dir.path())
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("SANDBOX_AGENT_LISTEN")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sock = dir.path().join("dev.sock");
    eventually(Duration::from_secs(10), "the --dev socket appears", || {
        when(sock.exists(), || format!("no {}", sock.display()))
    });
    let token = dir.path().join("sandbox-agent.token");
    let md = std::fs::metadata(&token).expect("token file created");
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    assert!(std::fs::read_to_string(&token).unwrap().trim().len() >= 32);
    assert!(dir.path().join("workspace").is_dir());
    let out = ctl(&[
        "--agent",
        &format!("unix://{}", sock.display()),
        "info",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_shipped_example_config_is_valid() {
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/agent.toml");
    let out = agent_once(&["--config", cfg, "--check-config"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let effective = text(&out.stdout);
    assert!(effective.contains("vsock://any:1024"), "{effective}");
    assert!(
        effective.contains("max_message_bytes = 4194304"),
        "{effective}"
    );
}
