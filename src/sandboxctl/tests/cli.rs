//! The command line alone (every verb against a real agent is tested in the
//! workspace's `tests/`).

use std::process::Command;

const CTL: &str = env!("CARGO_BIN_EXE_sandboxctl");

#[test]
fn help_lists_every_verb() {
    let out = Command::new(CTL).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for verb in [
        "health",
        "info",
        "upload",
        "dump",
        "clear",
        "acquire",
        "release",
        "reset",
        "shutdown",
        "status",
        "servers",
        "mcp",
        "mcp-proxy",
        "logs",
    ] {
        assert!(
            help.contains(&format!("  {verb} ")),
            "{verb} missing from:\n{help}"
        );
    }
}

#[test]
fn a_usage_error_exits_2() {
    let out = Command::new(CTL).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bogus"));
}
