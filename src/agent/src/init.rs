//! The agent's duties when it is PID 1, the VM's init.
//!
//! At boot ([`boot`]): give itself a console, mount the kernel filesystems
//! that are missing (`/proc`, `/sys`, `/dev`, `/dev/pts`, `/run`, and
//! the cgroup v2 hierarchy), a tmpfs on `/tmp`, `/var/tmp` and
//! `/dev/shm` where they are not mount points ([`private_tmp`]), set the hostname and load the configured kernel
//! modules, so a generic distro kernel with a bare initramfs works.
//! Zombies are reaped by the supervisor's reaper, which owns `waitpid(-1)`
//! whether or not the agent is PID 1.
//!
//! At the end ([`power_off`]): sync and power the machine off. PID 1 must
//! never exit (the kernel panics when it does), so every way out of the
//! agent as init goes through here, and it never returns.
//!
//! Each step that fails is reported and skipped: a VM that boots with a
//! warning can still be reached and debugged; one that panics cannot.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// `[init]` in agent.toml: used only when the agent runs as PID 1.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InitConfig {
    /// Hostname to set at boot; empty keeps the kernel's.
    pub hostname: String,
    /// Kernel modules to load at boot, in order: paths to `.ko` files, or
    /// names looked up under `/lib/modules/<release>/`. A module that is
    /// already loaded or built in is fine.
    pub modules: Vec<String>,
    /// Turn the kernel's link protections on at boot where they are off
    /// (`fs.protected_hardlinks`, `fs.protected_symlinks`): a VM's kernel
    /// starts without them. Off only where the agent is PID 1 of a pid
    /// namespace but not the machine's init (the kernel's settings are
    /// then the machine's, not the agent's to change).
    pub protect_links: bool,
}

impl Default for InitConfig {
    fn default() -> Self {
        InitConfig {
            hostname: "sandbox".into(),
            modules: Vec::new(),
            protect_links: true,
        }
    }
}

/// The shared temporary directories, emptied at every Release and Reset
/// (where they are the sandbox's own: [`private_tmp`]).
pub const SHARED_TMP: [&str; 3] = ["/tmp", "/var/tmp", "/dev/shm"];

static PRIVATE_TMP: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());

/// Those of [`SHARED_TMP`] that are, at boot, a file system of the
/// sandbox's own: a mount point already (the process backend mounts a
/// fresh tmpfs on each; whoever starts the agent as PID 1 otherwise must
/// do the same for one that is the machine's), or a tmpfs the agent mounted
/// there. None for an agent that is not PID 1 (`--dev` on a developer's
/// machine): it never empties the machine's.
pub fn private_tmp() -> Vec<&'static str> {
    if !is_pid1() {
        return Vec::new();
    }
    PRIVATE_TMP
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Whether this process is the machine's init.
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// One boot step's outcome, for the log (logging may not be set up yet
/// when the steps run).
#[derive(Debug)]
pub struct Step {
    pub what: String,
    pub result: Result<(), InitError>,
}

/// Why a boot step failed. None is fatal: the agent logs it and serves.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("creating {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Sys(#[from] nix::Error),
    #[error("opening /dev/console: {0}")]
    Console(nix::Error),
    #[error("dup2 onto fd {fd}: {source}")]
    Dup2 { fd: i32, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Module {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("uname: {0}")]
    Uname(nix::Error),
    #[error(
        "{} is 0 and cannot be set ({source}): a tenant may link files it does not own where root reads",
        path.display()
    )]
    LinkProtection {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no {want} under {}", root.display())]
    NoModule { want: String, root: PathBuf },
    #[error("bringing up the loopback interface: {0}")]
    Loopback(std::io::Error),
}

fn step(what: impl Into<String>, result: Result<(), InitError>) -> Step {
    Step {
        what: what.into(),
        result,
    }
}

/// Mounts, console, hostname and modules. Returns what was done.
pub fn boot(cfg: &InitConfig) -> Vec<Step> {
    use nix::mount::MsFlags;
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let mounts: [(&str, &str, &str, MsFlags, Option<&str>); 6] = [
        ("proc", "/proc", "proc", nosuid, None),
        ("sysfs", "/sys", "sysfs", nosuid, None),
        (
            "devtmpfs",
            "/dev",
            "devtmpfs",
            MsFlags::MS_NOSUID,
            Some("mode=0755"),
        ),
        (
            "devpts",
            "/dev/pts",
            "devpts",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("mode=0620,ptmxmode=0666"),
        ),
        (
            "tmpfs",
            "/run",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755"),
        ),
        ("cgroup2", "/sys/fs/cgroup", "cgroup2", nosuid, None),
    ];
    let mut steps = Vec::new();
    for (source, target, fstype, flags, data) in mounts {
        let target = Path::new(target);
        if is_mountpoint(target) {
            continue;
        }
        let r = mount_at(source, target, fstype, flags, data);
        steps.push(step(format!("mount {fstype} on {}", target.display()), r));
        if target == Path::new("/dev") {
            steps.push(step("console on fds 0-2", console()));
        }
    }
    // The temporary directories: each must be a file system of the
    // sandbox's own, so that Release and Reset may empty it entirely. One
    // that is a mount point already is taken as such (the process
    // backend's tmpfs; a VM's); else a tmpfs is mounted on it.
    for dir in SHARED_TMP {
        let target = Path::new(dir);
        let r = if is_mountpoint(target) {
            Ok(())
        } else {
            let r = mount_at(
                "tmpfs",
                target,
                "tmpfs",
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some("mode=1777"),
            );
            let failed = r.is_err();
            steps.push(step(format!("mount tmpfs on {dir}"), r));
            if failed { Err(()) } else { Ok(()) }
        };
        if r.is_ok() {
            PRIVATE_TMP
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(dir);
        }
    }
    if cfg.protect_links {
        for p in LINK_PROTECTIONS {
            steps.push(step(format!("{p} on"), protect_links(Path::new(p))));
        }
    }
    if !cfg.hostname.is_empty() {
        steps.push(step(
            format!("hostname {}", cfg.hostname),
            nix::unistd::sethostname(&cfg.hostname).map_err(InitError::from),
        ));
    }
    for m in &cfg.modules {
        steps.push(step(format!("load module {m}"), load_module(m)));
    }
    // Scripts reach the MCP data plane on 127.0.0.1 (exec.mcp_listen).
    steps.push(step("loopback interface up", loopback_up()));
    steps
}

/// Mounts `fstype` from `source` on `target`, made first if missing.
fn mount_at(
    source: &str,
    target: &Path,
    fstype: &str,
    flags: nix::mount::MsFlags,
    data: Option<&str>,
) -> Result<(), InitError> {
    std::fs::create_dir_all(target).map_err(|source| InitError::CreateDir {
        path: target.to_owned(),
        source,
    })?;
    Ok(nix::mount::mount(
        Some(source),
        target,
        Some(fstype),
        flags,
        data,
    )?)
}

/// The kernel's link protections: no hard link to a file one does not own,
/// no following another user's symlink in a sticky directory. A VM's
/// kernel starts with them off (systemd turns them on; the agent is the
/// init here); a process backend's slot shares the host's, which the host
/// checks.
const LINK_PROTECTIONS: [&str; 2] = [
    "/proc/sys/fs/protected_hardlinks",
    "/proc/sys/fs/protected_symlinks",
];

/// Turns the protection at `path` on when it is off (`0`).
fn protect_links(path: &Path) -> Result<(), InitError> {
    let err = |source| InitError::LinkProtection {
        path: path.to_owned(),
        source,
    };
    let now = std::fs::read_to_string(path).map_err(err)?;
    if now.trim() != "0" {
        return Ok(());
    }
    std::fs::write(path, "1").map_err(err)
}

/// Brings `lo` up (the kernel leaves it down; up, it carries 127.0.0.1).
fn loopback_up() -> Result<(), InitError> {
    use nix::libc;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let err = |_| InitError::Loopback(std::io::Error::last_os_error());
    // SAFETY: socket(2) and two ioctl(2)s on a socket owned here, with a
    // zeroed `ifreq` whose name is the NUL-terminated "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(err(()));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) < 0 {
            return Err(err(()));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) < 0 {
            return Err(err(()));
        }
    }
    Ok(())
}

/// A directory is a mount point when it is on another device than its
/// parent (all the file systems mounted here are).
pub(crate) fn is_mountpoint(p: &Path) -> bool {
    let (Ok(me), Ok(parent)) = (std::fs::metadata(p), std::fs::metadata(p.join(".."))) else {
        return false;
    };
    me.dev() != parent.dev()
}

/// Points fds 0-2 at /dev/console where they are not open (the kernel
/// gives init none when its initramfs has no /dev/console).
fn console() -> Result<(), InitError> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl, open};
    use nix::sys::stat::Mode;
    let closed: Vec<i32> = (0..3)
        .filter(|fd| {
            // SAFETY: fds 0-2 are only probed here; nothing else owns them yet.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) };
            fcntl(fd, FcntlArg::F_GETFD).is_err()
        })
        .collect();
    if closed.is_empty() {
        return Ok(());
    }
    let console = open(
        "/dev/console",
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(InitError::Console)?;
    for fd in closed {
        // SAFETY: dup2 onto a closed standard fd, which nothing owns.
        if unsafe { nix::libc::dup2(console.as_raw_fd(), fd) } < 0 {
            return Err(InitError::Dup2 {
                fd,
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

/// Loads one module with `finit_module`; already loaded is success.
fn load_module(m: &str) -> Result<(), InitError> {
    let path = if m.contains('/') {
        PathBuf::from(m)
    } else {
        find_module(m)?
    };
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(source) => return Err(InitError::Module { path, source }),
    };
    let params = CString::default();
    match nix::kmod::finit_module(&file, &params, nix::kmod::ModuleInitFlags::empty()) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(e) => Err(InitError::Module {
            path,
            source: e.into(),
        }),
    }
}

/// `/lib/modules/<release>/**/<name>.ko` (`-` and `_` are the same in
/// module names).
fn find_module(name: &str) -> Result<PathBuf, InitError> {
    let release = nix::sys::utsname::uname()
        .map_err(InitError::Uname)?
        .release()
        .to_string_lossy()
        .into_owned();
    let root = Path::new("/lib/modules").join(&release);
    let want = format!("{}.ko", name.replace('-', "_"));
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else if e.file_name().to_string_lossy().replace('-', "_") == want {
                return Ok(p);
            }
        }
    }
    Err(InitError::NoModule { want, root })
}

/// Syncs and powers the machine off. Never returns: if the kernel refuses,
/// it keeps waiting rather than let PID 1 exit.
pub fn power_off() -> ! {
    nix::unistd::sync();
    let e = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_POWER_OFF);
    eprintln!("sandbox-agent: power-off failed: {e:?}; halting here");
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_protection_that_is_off_is_turned_on() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("protected_hardlinks");
        std::fs::write(&p, "0\n").unwrap();
        protect_links(&p).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "1");
        std::fs::write(&p, "2\n").unwrap();
        protect_links(&p).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "2\n");
        assert!(protect_links(&t.path().join("absent")).is_err());
    }

    #[test]
    fn mount_points_are_told_from_plain_directories() {
        assert!(is_mountpoint(Path::new("/proc")));
        let dir = std::env::temp_dir().join(format!("init-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!is_mountpoint(&dir));
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_missing_module_is_reported_not_fatal() {
        let e = load_module("/nonexistent/nothing.ko").unwrap_err();
        assert!(matches!(e, InitError::Module { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/nothing.ko"), "{e}");
        let e = load_module("no_such_module_anywhere").unwrap_err();
        assert!(matches!(e, InitError::NoModule { .. }), "{e}");
        assert!(e.to_string().contains("no_such_module_anywhere.ko"), "{e}");
    }
}
