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

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
