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

/// A limit of 0 would make every start fail or every request wait: each
/// is refused before anything starts, naming the flag.
#[test]
fn zero_limits_are_refused_naming_the_flag() {
    let dir = std::env::temp_dir().join(format!("sandbox-host-cli-{}", std::process::id()));
    for (flag, value) in [
        ("--slot-start-timeout", "0"),
        ("--max-connections", "0"),
        ("--max-upload-bytes", "0"),
        ("--time-scale", "0"),
    ] {
        let out = Command::new(HOST)
            .arg("--data-dir")
            .arg(&dir)
            .args([flag, value])
            .env("SANDBOX_HOST_API_KEY", "k-0123456789abcdef")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {err}");
        assert!(err.contains(flag), "{flag}: {err}");
        assert!(
            !dir.exists(),
            "{flag}: the data dir was made before the check"
        );
    }
}
