//! Test doubles of outside services the sandbox's data tools call (Canvas
//! LMS, Google Cloud), started from tests/clients/*_standin.py on a free
//! loopback port and killed when dropped.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

pub struct StandIn {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
}

impl StandIn {
    /// Starts `tests/clients/SCRIPT PORT ARGS...` and waits for its "ready".
    pub fn start(script: &str, args: &[&str]) -> StandIn {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let mut child = Command::new("python3")
            .arg(format!(
                "{}/tests/clients/{script}",
                env!("CARGO_MANIFEST_DIR")
            ))
            .arg(port.to_string())
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = std::io::BufReader::new(out).read_line(&mut line);
        }
        assert_eq!(line.trim(), "ready", "{script} did not start");
        StandIn {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }
}

/// The host arguments that let isolated sandboxes reach the stand-in at
/// `url` (`http://127.0.0.1:PORT`): its port forwarded into their loopback.
pub fn reach(url: &str) -> Vec<String> {
    let authority = url
        .split_once("://")
        .map_or(url, |(_, r)| r)
        .split('/')
        .next()
        .unwrap_or_default();
    let port = authority.rsplit(':').next().unwrap_or_default();
    vec!["--sandbox-host-port".into(), port.into()]
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bearer token gcp_standin.py issues: the test reads the stand-in's
/// state with it, outside any sandbox.
pub const GCP_ACCESS: &str = "standin-access-token";

/// A service-account key (a fresh RSA key) for project `sandbox-test`,
/// written into `dir`; its path.
pub fn gcp_key_file(dir: &std::path::Path) -> String {
    let key = std::process::Command::new("openssl")
        .args(["genrsa", "2048"])
        .output()
        .expect("openssl genrsa");
    assert!(key.status.success());
    let path = dir.join("service-account.json");
    std::fs::write(
        &path,
        serde_json::json!({
            "type": "service_account",
            "project_id": "sandbox-test",
            "private_key_id": "1",
            "private_key": String::from_utf8_lossy(&key.stdout),
            "client_email": "data@sandbox-test.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token",
        })
        .to_string(),
    )
    .expect("key file");
    path.display().to_string()
}
