//! What isolation needs of this machine and of its configuration, checked
//! before any slot starts.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{IsolationConfig, IsolationError, Network, TOOLS};

/// The kernel's refusal to hard-link a file one does not own (1 or 2).
pub(super) const PROTECTED_HARDLINKS: &str = "/proc/sys/fs/protected_hardlinks";

/// Whether a `fs.protected_*` value is on (unreadable: taken as on, the
/// kernel's own default is checked where it matters, at a slot's boot).
pub(super) fn links_protected(value: &str) -> bool {
    value.trim() != "0"
}

/// Whether `dir` is the root of a filesystem mounted at it: then the
/// sandboxes' bind mounts from below it show paths relative to it in their
/// /proc/self/mountinfo (`/slots/<id>/ws`), not the data dir's path. A
/// mount point that is itself a bind of a subdirectory does not hide it.
pub(super) fn is_filesystem_root(dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.to_string_lossy();
    // The last mount at `dir` is the one seen there.
    info.lines()
        .rev()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let root = f.nth(3)?;
            let point = f.next()?;
            Some((root, point))
        })
        .find(|(_, point)| unescape_mountinfo(point) == want)
        .is_some_and(|(root, _)| root == "/")
}

/// mountinfo's octal escapes (`\040` for a space) undone.
pub(super) fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if b[i] == b'\\'
            && let Some(d) = octal
        {
            out.push(
                d.iter()
                    .fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')),
            );
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The first directory above `dir` that others cannot pass through (no
/// `o+x`), if any.
pub(super) fn unreachable_ancestor(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().skip(1).find_map(|a| {
        let mode = std::fs::metadata(a).ok()?.permissions().mode();
        (mode & 0o001 == 0).then(|| a.to_owned())
    })
}

pub(super) fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// What this machine must have for isolated slots: the tools, and the
/// kernel's link protection (the sandboxes share this kernel).
pub(super) fn check_host(cfg: &IsolationConfig) -> Result<(), IsolationError> {
    let mut tools = TOOLS.to_vec();
    if cfg.network == Network::Outbound {
        tools.push(("pasta", "passt"));
        tools.push(("ip", "iproute2"));
    }
    for (tool, package) in tools {
        if which(tool).is_none() {
            return Err(IsolationError::MissingTool { tool, package });
        }
    }
    if !links_protected(&std::fs::read_to_string(PROTECTED_HARDLINKS).unwrap_or_default()) {
        return Err(IsolationError::HardlinksUnprotected);
    }
    Ok(())
}

/// The configuration's own checks, `data` the data dir's real path.
pub(super) fn check_config(cfg: &IsolationConfig, data: &Path) -> Result<(), IsolationError> {
    if cfg.memory_max == 0 || cfg.pids_max == 0 {
        return Err(IsolationError::ZeroLimit);
    }
    for p in &cfg.read_only {
        if !p.is_absolute() || !p.exists() {
            return Err(IsolationError::BadReadOnly(p.clone()));
        }
        let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        if data.starts_with(&real) || real.starts_with(data) {
            return Err(IsolationError::ExposesData(p.clone(), data.to_owned()));
        }
    }
    if let Some(private) = unreachable_ancestor(data) {
        return Err(IsolationError::PrivateDataDir(data.to_owned(), private));
    }
    if cfg.host_ports.contains(&cfg.api_port) {
        return Err(IsolationError::ForwardsApi(cfg.api_port));
    }
    if !cfg.host_ports.is_empty() && cfg.network == Network::None {
        return Err(IsolationError::PortsWithoutNetwork);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_zero_leaves_links_unprotected() {
        assert!(!links_protected("0\n"));
        assert!(links_protected("1\n"));
        assert!(links_protected("2"));
    }
}
