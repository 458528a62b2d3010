//! A slot's network: pasta's outbound access, the host's own addresses
//! and link-local closed, no nested user namespaces.

use std::path::Path;
use std::process::Command;

use super::{BLOCKED_ROUTES, Isolation, IsolationError, Network, io};

impl Isolation {
    /// Gives the slot's network namespace its outbound access (pasta) and
    /// closes link-local addresses. `pid` is the agent's host pid.
    pub(in crate::pool) fn network(&self, dir: &Path, pid: u32) -> Result<(), IsolationError> {
        if self.cfg.network == Network::None {
            return Ok(());
        }
        let netns = format!("/proc/{pid}/ns/net");
        // pasta must open the namespace of a process of another user
        // namespace, which only this host's root may; it confines itself
        // (seccomp, its own empty namespaces) once set up.
        // -T: the sandbox's loopback ports that reach this host's loopback
        // (only those asked for); nothing is forwarded the other way.
        let to_host = if self.cfg.host_ports.is_empty() {
            "none".to_owned()
        } else {
            self.cfg
                .host_ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let out = Command::new("pasta")
            .args(["--runas", "0:0", "--config-net", "--no-map-gw", "--quiet"])
            .args(["-T", &to_host, "-U", "none", "-t", "none", "-u", "none"])
            .arg("--pid")
            .arg(dir.join("pasta.pid"))
            .arg("--netns")
            .arg(&netns)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(io("running pasta"))?;
        if !out.status.success() {
            return Err(IsolationError::Setup(format!(
                "pasta failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        close_host_addresses(&netns)
    }

    /// Forbids user namespaces inside the slot's own (its
    /// `user.max_user_namespaces` set to 0, from this host: the sandbox
    /// sees /proc/sys read-only): a tenant cannot become root of a nested
    /// namespace to mount file systems or make network devices there,
    /// kernel surface a sandbox does not need.
    pub(in crate::pool) fn no_nested_userns(&self, pid: u32) -> Result<(), IsolationError> {
        let out = Command::new("nsenter")
            .arg(format!("--user=/proc/{pid}/ns/user"))
            .args([
                "--",
                "sh",
                "-c",
                "echo 0 > /proc/sys/user/max_user_namespaces",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(io("running nsenter"))?;
        if !out.status.success() {
            return Err(IsolationError::Setup(format!(
                "forbidding nested user namespaces: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }
}

/// Makes unreachable from the namespace `netns` every address pasta would
/// carry back to this host: link-local ones (cloud metadata, and the
/// host's own fe80:: addresses, by a policy rule that wins over the
/// kernel's on-link fe80::/64 route), and each address of this host that
/// the namespace does not hold itself (pasta copies the host's main
/// address into it, where it stays local; a second address, a bridge or a
/// VPN would lead back to the host's services). One `ip -batch` run.
fn close_host_addresses(netns: &str) -> Result<(), IsolationError> {
    let host = addresses(None)?;
    let own = addresses(Some(netns))?;
    let (mut v4, mut v6) = (String::new(), String::new());
    let line = |a: &str| format!("route add prohibit {a}\n");
    for prefix in BLOCKED_ROUTES {
        if prefix.contains(':') {
            v6.push_str(&line(prefix));
        } else {
            v4.push_str(&line(prefix));
        }
    }
    v6.push_str("rule add to fe80::/10 prohibit\n");
    for a in host.iter().filter(|a| !own.contains(a) && !a.is_loopback()) {
        match a {
            std::net::IpAddr::V4(a) => v4.push_str(&line(&format!("{a}/32"))),
            std::net::IpAddr::V6(a) => v6.push_str(&line(&format!("{a}/128"))),
        }
    }
    ip_batch(netns, "-4", &v4)?;
    // Without IPv6 in the namespace there is nothing to close there.
    match ip_batch(netns, "-6", &v6) {
        Err(IsolationError::Setup(e)) if e.contains("family not supported") => Ok(()),
        r => r,
    }
}

/// Runs `ip FAMILY -batch` in the namespace at `netns` over `lines`.
fn ip_batch(netns: &str, family: &str, lines: &str) -> Result<(), IsolationError> {
    let mut child = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["--", "ip", family, "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(io("running ip -batch"))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(lines.as_bytes())
            .map_err(io("writing to ip -batch"))?;
    }
    let out = child.wait_with_output().map_err(io("running ip -batch"))?;
    if !out.status.success() {
        return Err(IsolationError::Setup(format!(
            "closing this host's addresses in the sandbox ({family}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The addresses of this host's interfaces (`None`) or of the network
/// namespace at `netns`, from `ip -json addr`.
fn addresses(netns: Option<&str>) -> Result<Vec<std::net::IpAddr>, IsolationError> {
    #[derive(serde::Deserialize)]
    struct Link {
        #[serde(default)]
        addr_info: Vec<Addr>,
    }
    #[derive(serde::Deserialize)]
    struct Addr {
        local: Option<String>,
    }
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={ns}")).args(["--", "ip"]);
            c
        }
        None => Command::new("ip"),
    };
    let out = c
        .args(["-json", "addr", "show"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(io("running ip -json addr"))?;
    let links: Vec<Link> = serde_json::from_slice(&out.stdout).map_err(|e| {
        IsolationError::Setup(format!(
            "reading `ip -json addr`: {e}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })?;
    Ok(links
        .iter()
        .flat_map(|l| &l.addr_info)
        .filter_map(|a| a.local.as_deref()?.parse().ok())
        .collect())
}
