//! The packaging files that are not run by other tests: the systemd unit
//! (checked by systemd itself) and the Firecracker example config.

use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    // The unit as installed, pointed at this build's binary.
    let unit = std::fs::read_to_string(format!("{ROOT}/packaging/systemd/sandbox-agent.service"))
        .expect("unit");
    let unit = unit.replace(
        "/usr/local/bin/sandbox-agent",
        crate::common::AGENT.as_str(),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sandbox-agent.service");
    std::fs::write(&path, unit).expect("write");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (package systemd)");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains("sandbox-agent.service:"),
        "warnings about the unit: {text}"
    );
}

#[test]
fn the_firecracker_config_maps_the_agent_ports_to_its_vsock_socket() {
    let text = std::fs::read_to_string(format!("{ROOT}/packaging/firecracker/vm-config.json"))
        .expect("config");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let uds = v["vsock"]["uds_path"].as_str().expect("vsock.uds_path");
    assert!(v["vsock"]["guest_cid"].as_u64().is_some_and(|c| c > 3));
    let readme =
        std::fs::read_to_string(format!("{ROOT}/packaging/firecracker/README.md")).expect("README");
    for port in [1024, 1025] {
        assert!(
            readme.contains(&format!("hvsock://{uds}:{port}")),
            "README names hvsock://{uds}:{port}"
        );
    }
}
