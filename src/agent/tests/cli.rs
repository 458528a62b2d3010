//! The binary's command line: what an operator sees before any listener is
//! up. (The behaviour behind it is tested in the workspace's `tests/`.)

use std::process::Command;

const AGENT: &str = env!("CARGO_BIN_EXE_sandbox-agent");

#[test]
fn version_names_the_release() {
    let out = Command::new(AGENT).arg("--version").output().unwrap();
    assert!(out.status.success());
    let v = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        v.trim(),
        format!("sandbox-agent {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_bad_endpoint_is_refused_with_the_accepted_forms() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(AGENT)
        .args(["--listen", "bogus://x", "--workspace"])
        .arg(dir.path().join("ws"))
        .env_remove("SANDBOX_AGENT_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown scheme 'bogus'"), "{err}");
    assert!(err.contains("vsock://CID:PORT"), "{err}");
}
