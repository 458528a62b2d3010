//! The command line alone (the REST API is tested in the workspace's
//! `tests/host`).

use std::process::Command;

const HOST: &str = env!("CARGO_BIN_EXE_sandbox-host");

#[test]
fn the_data_dir_is_required() {
    let out = Command::new(HOST).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--data-dir"));
}

#[test]
fn version_names_the_release() {
    let out = Command::new(HOST).arg("--version").output().unwrap();
    assert!(out.status.success());
    let v = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        v.trim(),
        format!("sandbox-host {}", env!("CARGO_PKG_VERSION"))
    );
}
