//! `packages.txt`: the Debian packages an execution asks for, checked by
//! name and installed with apt-get as the agent (the only step that is not
//! the tenant's), unless dpkg says they are installed already.

use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;
use std::path::Path;

use super::super::{ExecConfig, PACKAGES};
use super::{Halt, Steps, strings};
use crate::supervisor::spawn::Exit;

/// The packages `packages.txt` in the execution's `work/` (its handle)
/// lists: the words of its non-empty, non-comment lines (absent: none).
/// Read through [`crate::tenant_file`]: a regular file of at most `cap`
/// bytes (exec.max_packages_bytes), never through a symlink, never a FIFO
/// or device. Nothing of its content is ever quoted back: a bad line is
/// named by its number and why.
pub(super) fn read_list(work: BorrowedFd<'_>, cap: u64) -> Result<Vec<String>, String> {
    let bytes = match crate::tenant_file::read_capped(
        work,
        Path::new(PACKAGES),
        cap,
        "exec.max_packages_bytes",
    ) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => return Err(e.to_string()),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return Err(format!("{PACKAGES} is not UTF-8 text"));
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let l = line.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        for (w, word) in l.split_whitespace().enumerate() {
            if !valid_package(word) {
                return Err(format!(
                    "{PACKAGES} line {}, word {}: not a Debian package name (lowercase letters, digits, + - . ; starting with a letter or digit)",
                    n + 1,
                    w + 1
                ));
            }
            out.push(word.to_owned());
        }
    }
    Ok(out)
}

/// Debian policy §5.6.1: `[a-z0-9][a-z0-9+.-]+` (so never an option).
fn valid_package(p: &str) -> bool {
    p.len() >= 2
        && p.as_bytes()[0].is_ascii_alphanumeric()
        && p.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.')
        })
}

/// apt-get's environment: the system's PATH, and what the operator passes
/// to executions from the agent's own environment (exec.pass_env: proxies).
pub(super) fn apt_env(cfg: &ExecConfig) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = cfg
        .pass_env
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)))
        .collect();
    env.insert("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into());
    env.insert("DEBIAN_FRONTEND".into(), "noninteractive".into());
    env.insert("LANG".into(), "C.UTF-8".into());
    env
}

/// The step that installs packages.txt: the only one run as the agent.
pub(super) const APT_STEP: &str = "apt";
/// dpkg's database: writable where packages can be installed.
const DPKG_DIR: &str = "/var/lib/dpkg";

pub(super) async fn install(s: &Steps<'_>, packages: &[String]) -> Result<(), Halt> {
    let status = tokio::fs::read_to_string(DPKG_STATUS)
        .await
        .unwrap_or_default();
    let installed = installed_packages(&status);
    let missing: Vec<String> = packages
        .iter()
        .filter(|p| !installed.contains(p.as_str()))
        .cloned()
        .collect();
    if missing.is_empty() {
        s.log.note(&format!(
            "[sandbox-agent] {PACKAGES}: already installed: {}",
            packages.join(" ")
        ));
        return Ok(());
    }
    let why_not = if s.ctx.cfg.packages == "off" {
        Some("exec.packages is \"off\" in this sandbox".to_owned())
    } else if !rustix::process::geteuid().is_root() {
        Some("the agent does not run as root".to_owned())
    } else if !s.ctx.cfg.apt_get.is_file() {
        Some(format!(
            "there is no {} in this sandbox",
            s.ctx.cfg.apt_get.display()
        ))
    } else if rustix::fs::access(DPKG_DIR, rustix::fs::Access::WRITE_OK).is_err() {
        // The process backend shows the host's system read-only: a tenant
        // never changes the host.
        Some(format!(
            "its system directories ({DPKG_DIR}) are read-only; only packages already installed can be listed"
        ))
    } else {
        None
    };
    if let Some(why) = why_not {
        return Err(Halt::Failed(format!(
            "{PACKAGES} asks for {} (not installed), but this sandbox cannot install Debian packages: {why}",
            missing.join(" ")
        )));
    }
    s.log.note(&format!(
        "[sandbox-agent] installing Debian packages: {}",
        missing.join(" ")
    ));
    let mut install = strings(&["install", "-y", "-q", "--no-install-recommends", "--"]);
    install.extend(missing.iter().cloned());
    // By absolute path, with the agent's own environment (Steps::run gives
    // this step no part of the execution's): the execution's PATH starts
    // with its venv, which the tenant writes.
    let apt = || s.ctx.cfg.apt_get.display().to_string();
    if s.run(APT_STEP, apt(), install.clone()).await? == Exit::Code(0) {
        return Ok(());
    }
    // A fresh image has no package lists yet: update once, then retry.
    s.log
        .note("[sandbox-agent] apt-get install failed; running apt-get update and retrying");
    s.must(
        APT_STEP,
        apt(),
        strings(&["update", "-q"]),
        "apt-get update",
    )
    .await?;
    s.must(APT_STEP, apt(), install, &format!("installing {PACKAGES}"))
        .await
}

/// dpkg's database of installed packages.
const DPKG_STATUS: &str = "/var/lib/dpkg/status";

/// The packages dpkg's status file lists as installed. (Read directly: a
/// `dpkg-query` child would race the agent's reaper for its exit status.)
fn installed_packages(status: &str) -> std::collections::HashSet<&str> {
    let mut out = std::collections::HashSet::new();
    for para in status.split("\n\n") {
        let mut name = None;
        let mut installed = false;
        for line in para.lines() {
            if let Some(n) = line.strip_prefix("Package: ") {
                name = Some(n.trim());
            } else if let Some(st) = line.strip_prefix("Status: ") {
                installed = st.trim_end().ends_with(" installed");
            }
        }
        if let (Some(n), true) = (name, installed) {
            out.insert(n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn package_names_follow_debian_policy() {
        for ok in ["curl", "jq", "libc6", "g++", "python3.11", "lib32z1-dev"] {
            assert!(valid_package(ok), "{ok}");
        }
        for bad in [
            "-o",
            "--allow-unauthenticated",
            "Curl",
            "a",
            "x;rm",
            "c url",
        ] {
            assert!(!valid_package(bad), "{bad}");
        }
    }

    #[test]
    fn a_bad_word_is_named_by_its_place_never_quoted() {
        let t = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(t.path()).unwrap();
        std::fs::write(
            t.path().join(PACKAGES),
            "# tools\ncurl jq\n\nSECRET=hunter2\n",
        )
        .unwrap();
        let e = read_list(d.as_fd(), 1024).unwrap_err();
        assert!(e.contains("line 4, word 1"), "{e}");
        assert!(!e.contains("SECRET") && !e.contains("hunter2"), "{e}");
        std::fs::write(t.path().join(PACKAGES), "curl jq # c\ngit\n").unwrap();
        assert_eq!(read_list(d.as_fd(), 1024).unwrap(), ["curl", "jq", "git"]);
        let e = read_list(d.as_fd(), 8).unwrap_err();
        assert!(e.contains("exec.max_packages_bytes"), "{e}");
        std::fs::remove_file(t.path().join(PACKAGES)).unwrap();
        assert!(read_list(d.as_fd(), 8).unwrap().is_empty());
    }

    #[test]
    fn installed_means_the_status_says_so() {
        let st = "Package: curl\nStatus: install ok installed\nVersion: 1\n\nPackage: jq\nStatus: deinstall ok config-files\n\nPackage: git\nArchitecture: amd64\nStatus: install ok installed\n";
        let i = installed_packages(st);
        assert!(i.contains("curl") && i.contains("git") && !i.contains("jq"));
    }
}
