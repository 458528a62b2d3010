//! The tenant: the unprivileged user every process of a lease runs as
//! (MCP servers, script executions, data tools), its per-lease home, and
//! how a lease's processes and files are ended.
//!
//! The agent itself keeps its identity (root in a VM, root of its user
//! namespace on the process backend): it owns the control plane, the
//! workspace journal and the sockets, which tenants must not reach.
//! Everything a tenant runs gets `uid:gid`, a fresh `HOME` (with the XDG
//! directories and `TMPDIR` inside it) under the state root, emptied at
//! every Acquire, Reset and Release, and at those points every process of
//! the tenant uid that descends from the agent is killed — whatever it did
//! to its session, process group or cgroup (see [`Tenant::kill_all`]).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{AtFlags, Mode, OFlags};

/// `supervisor.tenant_user`: "auto", "none" or "UID:GID".
pub const DEFAULT_TENANT_USER: &str = "auto";
/// The tenant's ids under "auto" when the agent runs as root.
pub const AUTO_TENANT_ID: u32 = 1000;
/// The service user's ids (data tools of outside services), whenever
/// tenants have a user of their own.
pub const SERVICE_ID: u32 = 999;
/// Rounds of [`Tenant::kill_all`] before it gives up on a process that
/// keeps forking (bounded in any case by the slot's `pids.max`).
const MAX_KILL_ROUNDS: usize = 200;
/// Where the agent (as PID 1) mounts the IPC namespace's mqueue
/// filesystem to remove what tenants left (root-only, under /run).
const MQUEUE_DIR: &str = "/run/sandbox-agent-mqueue";
/// Deepest directory level [`chown_tree`] descends.
const MAX_CHOWN_DEPTH: usize = 4096;

/// A `tenant_user` setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error(
        "supervisor.tenant_user: {0:?} is not \"auto\", \"none\" or UID:GID (numbers, e.g. 1000:1000)"
    )]
    Syntax(String),
    #[error(
        "supervisor.tenant_user: {0}:{1} is root; tenants must never run as root (use \"none\" only for development, as a non-root agent)"
    )]
    Root(u32, u32),
    #[error(
        "supervisor.tenant_user: switching to {0}:{1} needs the agent to run as root; run it as root or set tenant_user = \"none\""
    )]
    NotRoot(u32, u32),
}

/// Parses `tenant_user`: `None` when tenants keep the agent's identity.
pub fn parse(setting: &str) -> Result<Option<(u32, u32)>, TenantError> {
    let root = rustix::process::geteuid().is_root();
    match setting {
        "none" => Ok(None),
        "auto" if root => Ok(Some((AUTO_TENANT_ID, AUTO_TENANT_ID))),
        "auto" => Ok(None),
        s => {
            let (u, g) = s
                .split_once(':')
                .and_then(|(u, g)| Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)))
                .ok_or_else(|| TenantError::Syntax(s.to_owned()))?;
            if u == 0 || g == 0 {
                return Err(TenantError::Root(u, g));
            }
            if !root {
                return Err(TenantError::NotRoot(u, g));
            }
            Ok(Some((u, g)))
        }
    }
}

pub mod env;
mod tmp;
pub use tmp::empty_dir;

/// Who tenants run as, and where their per-lease home is.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// `None`: the agent's own identity (a non-root agent, development).
    ids: Option<(u32, u32)>,
    home: PathBuf,
}

impl Tenant {
    /// `home` is `<state_root>/home`.
    pub fn new(ids: Option<(u32, u32)>, state_root: &Path) -> Tenant {
        Tenant {
            ids,
            home: state_root.join("home"),
        }
    }

    pub fn uid(&self) -> Option<u32> {
        self.ids.map(|(u, _)| u)
    }
    pub fn gid(&self) -> Option<u32> {
        self.ids.map(|(_, g)| g)
    }
    /// The service user (see `RunAs::Service`): unprivileged, not the
    /// tenant; `None` when tenants keep the agent's identity.
    pub fn service(&self) -> Option<(u32, u32)> {
        self.ids.map(|_| (SERVICE_ID, SERVICE_ID))
    }
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// Makes a launch a tenant's: its ids (unless the manifest names a user
    /// for it) and [`Tenant::env`].
    pub fn apply(
        &self,
        uid: &mut Option<u32>,
        gid: &mut Option<u32>,
        env: &mut BTreeMap<String, String>,
    ) {
        if uid.is_none()
            && let Some((u, g)) = self.ids
        {
            *uid = Some(u);
            *gid = Some(gid.unwrap_or(g));
        }
        self.env(env);
    }

    /// The variables every tenant process gets, replacing the agent's:
    /// its home, the XDG directories and TMPDIR inside it, and its user.
    pub fn env(&self, env: &mut BTreeMap<String, String>) {
        overlay(env, &self.home.display().to_string(), self.ids.is_some());
    }

    /// A fresh, empty home (with its XDG and temp directories), owned by
    /// the tenant, mode 0700. Whatever was there (a previous lease's git
    /// config, caches, planted symlinks) is gone.
    pub fn fresh_home(&self) -> io::Result<()> {
        self.clear_home()?;
        for sub in [".config", ".cache", ".local/share", ".local/state", "tmp"] {
            std::fs::create_dir_all(self.home.join(sub))?;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.home, std::fs::Permissions::from_mode(0o700))?;
        self.own_tree(&self.home)
    }

    /// Replaces the home with a new, empty directory (Release): nothing of
    /// it reaches the next lease, neither what is in it nor what the tenant
    /// set on the directory itself (inode flags such as `chattr +S`, extended
    /// attributes, ACLs: a new inode has none). Its parent, the state root,
    /// is the agent's. A home that is a mount point stays, emptied and
    /// scrubbed of flags and tenant xattrs.
    pub fn clear_home(&self) -> io::Result<()> {
        match sandbox_tree::remove_path(&self.home) {
            Ok(()) => {}
            Err(e)
                if e.path == self.home
                    && e.source.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) =>
            {
                let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let fd = rustix::fs::open(&self.home, flags, Mode::empty())?;
                crate::workspace::root::scrub(fd.as_fd()).map_err(io::Error::other)?;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        std::fs::create_dir_all(&self.home)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.home, std::fs::Permissions::from_mode(0o700))
    }

    /// Gives `path` (not what is below it) to the tenant.
    pub fn own(&self, path: &Path) -> io::Result<()> {
        let Some((u, g)) = self.ids else {
            return Ok(());
        };
        rustix::fs::chownat(
            rustix::fs::CWD,
            path,
            Some(rustix::fs::Uid::from_raw(u)),
            Some(rustix::fs::Gid::from_raw(g)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(io::Error::from)
    }

    /// Gives `path` and everything below it to the tenant, never following
    /// a symlink.
    pub fn own_tree(&self, path: &Path) -> io::Result<()> {
        let Some((u, g)) = self.ids else {
            return Ok(());
        };
        chown_tree(path, u, g, &[])
    }

    /// SIGKILL to every process of the tenant uid that descends from this
    /// agent (as PID 1 of a VM or of its own pid namespace, that is every
    /// tenant process there is), round after round until none is left.
    /// Leaving a session, a process group or a cgroup does not take a
    /// process out of this: orphans re-parent to the agent, a subreaper.
    /// Returns how many were killed; `Err` (with that count) when some
    /// were still appearing after the last round.
    pub fn kill_all(&self) -> Result<usize, usize> {
        let Some((uid, _)) = self.ids else {
            return Ok(0);
        };
        let me = std::process::id() as i32;
        let mut killed = 0;
        for round in 0..MAX_KILL_ROUNDS {
            let victims = tenant_descendants(me, uid);
            if victims.is_empty() {
                return Ok(killed);
            }
            for pid in &victims {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            killed += victims.len();
            // Let the kills land (and the reaper collect) before looking
            // again; later rounds wait a little longer.
            std::thread::sleep(Duration::from_millis(if round < 5 { 2 } else { 20 }));
        }
        tracing::warn!(
            uid,
            "tenant processes were still appearing after {MAX_KILL_ROUNDS} kill rounds"
        );
        Err(killed)
    }

    /// Empties the shared temporary directories (`/tmp`, `/var/tmp`,
    /// `/dev/shm`) at Release and Reset. Those that are the sandbox's own
    /// (a tmpfs the agent mounted as PID 1, [`crate::init::private_tmp`])
    /// lose every entry, whoever owns it; elsewhere, as PID 1, only the
    /// top-level entries the tenant owns go. An agent that is not PID 1
    /// (`--dev` on a developer's machine) touches none: another user with
    /// the same uid may have files there. By handles: no symlink is
    /// followed, the directories keep their modes (1777). Returns what
    /// could not be removed.
    pub fn clear_shared_tmp(&self) -> Vec<String> {
        if !crate::init::is_pid1() {
            return Vec::new();
        }
        let private = crate::init::private_tmp();
        let mut failed = Vec::new();
        for dir in crate::init::SHARED_TMP {
            let whole = private.contains(&dir);
            let owner = match (whole, self.ids) {
                (true, _) => None,
                (false, Some((uid, _))) => Some(uid),
                (false, None) => continue,
            };
            if let Err(e) = empty_dir(Path::new(dir), owner) {
                tracing::warn!(dir, error = %e, "cannot empty a temporary directory");
                failed.push(format!("emptying {dir}: {e}"));
            }
        }
        failed
    }
}

/// The hidden argument that makes the agent binary clear its user's
/// keyrings and exit (run as the tenant by [`clear_keyrings_job`]).
pub const CLEAR_KEYRINGS_ARG: &str = "__clear-keyrings";

/// What [`CLEAR_KEYRINGS_ARG`] does, in the process that runs as the
/// tenant: empties its user, user-session and persistent keyrings, which
/// the kernel keeps for the uid (not per process) while its user namespace
/// lives: a recycled sandbox's next tenant would find them.
pub fn clear_own_keyrings() -> i32 {
    const KEYCTL_CLEAR: i64 = 7;
    const KEYCTL_GET_PERSISTENT: i64 = 22;
    const KEY_SPEC_THREAD_KEYRING: i64 = -1;
    const KEY_SPEC_USER_KEYRING: i64 = -4;
    const KEY_SPEC_USER_SESSION_KEYRING: i64 = -5;
    // SAFETY: keyctl takes integers only here; no memory is passed.
    let keyctl = |op: i64, a: i64, b: i64| unsafe {
        nix::libc::syscall(nix::libc::SYS_keyctl, op, a, b, 0i64, 0i64)
    };
    let mut failed = 0;
    for ring in [KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING] {
        if keyctl(KEYCTL_CLEAR, ring, 0) < 0 {
            failed += 1;
        }
    }
    // The persistent keyring exists only once asked for; -1: our uid.
    // Linked into the thread keyring, so this process possesses it (its
    // owner alone may not clear it: it may hold no write permission).
    let persistent = keyctl(KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_THREAD_KEYRING);
    if persistent >= 0 && keyctl(KEYCTL_CLEAR, persistent, 0) < 0 {
        failed += 1;
    }
    failed
}

/// Removes every System V IPC object (shared memory, message queues,
/// semaphore sets) and every POSIX message queue of this IPC namespace:
/// they outlive the processes that made them. Only as PID 1, where the
/// IPC namespace is the sandbox's own (a VM's, or the process backend's);
/// the agent itself uses none. Returns how many went.
pub fn clear_ipc() -> usize {
    if !crate::init::is_pid1() {
        return 0;
    }
    let mut n = 0;
    for (file, kind) in [("shm", 0), ("msg", 1), ("sem", 2)] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/sysvipc/{file}")) else {
            continue;
        };
        // The second column is the id (the first line is the header).
        for id in text
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<i32>().ok())
        {
            // SAFETY: IPC_RMID takes no buffer (null) for shm and msg; semctl
            // takes no fourth argument for IPC_RMID.
            let r = unsafe {
                match kind {
                    0 => nix::libc::shmctl(id, nix::libc::IPC_RMID, std::ptr::null_mut()),
                    1 => nix::libc::msgctl(id, nix::libc::IPC_RMID, std::ptr::null_mut()),
                    _ => nix::libc::semctl(id, 0, nix::libc::IPC_RMID),
                }
            };
            if r == 0 {
                n += 1;
            }
        }
    }
    // POSIX message queues are files of the namespace's mqueue filesystem,
    // mounted privately here once.
    let mqueue_dir = Path::new(MQUEUE_DIR);
    let mounted = std::fs::create_dir_all(mqueue_dir).is_ok()
        && (crate::init::is_mountpoint(mqueue_dir)
            || nix::mount::mount(
                Some("mqueue"),
                mqueue_dir,
                Some("mqueue"),
                nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .is_ok());
    if mounted && let Ok(entries) = std::fs::read_dir(mqueue_dir) {
        for e in entries.flatten() {
            if std::fs::remove_file(e.path()).is_ok() {
                n += 1;
            }
        }
    }
    n
}

/// The first existing directory on the way to `path` (itself excluded)
/// that other users cannot pass through (no `o+x`), if any.
pub fn unreachable(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.ancestors().skip(1).find_map(|a| {
        let mode = std::fs::metadata(a).ok()?.permissions().mode();
        (mode & 0o001 == 0).then(|| a.to_owned())
    })
}

/// Pids of `uid`'s processes below `root` in the process tree.
fn tenant_descendants(root: i32, uid: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut parent: HashMap<i32, i32> = HashMap::new();
    let mut owned: Vec<i32> = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or("")
                .to_owned()
        };
        if field("State:").starts_with('Z') {
            continue;
        }
        if let Ok(pp) = field("PPid:").parse::<i32>() {
            parent.insert(pid, pp);
        }
        // Real, effective, saved or filesystem uid: any of them.
        if field("Uid:")
            .split_whitespace()
            .any(|u| u.parse::<u32>() == Ok(uid))
        {
            owned.push(pid);
        }
    }
    owned
        .into_iter()
        .filter(|&pid| {
            let mut cur = pid;
            for _ in 0..4096 {
                match parent.get(&cur) {
                    Some(&pp) if pp == root => return true,
                    Some(&pp) if pp > 0 => cur = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

/// Sets the owner of `path` and of everything below it, never following a
/// symlink and never recursing (an explicit stack, `MAX_CHOWN_DEPTH` deep).
/// Entries named in `skip` (at the top level only) are left alone.
pub fn chown_tree(path: &Path, uid: u32, gid: u32, skip: &[&std::ffi::OsStr]) -> io::Result<()> {
    let (u, g) = (
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    );
    let dir_flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let top: OwnedFd = rustix::fs::open(path, dir_flags, Mode::empty())?;
    rustix::fs::fchown(&top, u, g)?;
    let mut stack: Vec<OwnedFd> = vec![top];
    let mut first = true;
    while let Some(dir) = stack.pop() {
        if stack.len() > MAX_CHOWN_DEPTH {
            return Err(io::Error::other(format!(
                "{} is nested deeper than {MAX_CHOWN_DEPTH} levels",
                path.display()
            )));
        }
        let mut iter = rustix::fs::Dir::read_from(dir.as_fd())?;
        let mut subdirs = Vec::new();
        while let Some(ent) = iter.read() {
            let ent = ent?;
            let name = ent.file_name();
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            use std::os::unix::ffi::OsStrExt;
            if first && skip.contains(&std::ffi::OsStr::from_bytes(bytes)) {
                continue;
            }
            match rustix::fs::chownat(&dir, name, u, g, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(()) => {}
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            }
            let is_dir = match ent.file_type() {
                rustix::fs::FileType::Directory => true,
                rustix::fs::FileType::Unknown => {
                    rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
                        rustix::fs::FileType::from_raw_mode(st.st_mode)
                            == rustix::fs::FileType::Directory
                    })
                }
                _ => false,
            };
            if is_dir {
                subdirs.push(name.to_owned());
            }
        }
        first = false;
        for name in subdirs {
            match rustix::fs::openat(&dir, &name, dir_flags, Mode::empty()) {
                Ok(fd) => stack.push(fd),
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// A tenant process's own variables over `env`: its `home`, the XDG
/// directories and TMPDIR inside it, and, when it runs as the tenant user,
/// that user's name.
pub fn overlay(env: &mut BTreeMap<String, String>, home: &str, as_tenant: bool) {
    for (k, sub) in [
        ("XDG_CONFIG_HOME", ".config"),
        ("XDG_CACHE_HOME", ".cache"),
        ("XDG_DATA_HOME", ".local/share"),
        ("XDG_STATE_HOME", ".local/state"),
        ("TMPDIR", "tmp"),
    ] {
        env.insert(k.into(), format!("{home}/{sub}"));
    }
    env.insert("HOME".into(), home.to_owned());
    if as_tenant {
        env.insert("USER".into(), "sandbox".into());
        env.insert("LOGNAME".into(), "sandbox".into());
    }
    env.remove("XDG_RUNTIME_DIR");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_root_is_refused() {
        assert_eq!(parse("none").unwrap(), None);
        assert!(matches!(parse("0:1000"), Err(TenantError::Root(0, 1000))));
        assert!(matches!(parse("1000:0"), Err(TenantError::Root(1000, 0))));
        assert!(matches!(parse("bob"), Err(TenantError::Syntax(_))));
        assert!(matches!(parse("1000"), Err(TenantError::Syntax(_))));
        if rustix::process::geteuid().is_root() {
            assert_eq!(parse("auto").unwrap(), Some((1000, 1000)));
            assert_eq!(parse("2000:3000").unwrap(), Some((2000, 3000)));
        } else {
            assert_eq!(parse("auto").unwrap(), None);
        }
    }

    #[test]
    fn the_environment_points_into_the_lease_home() {
        let t = Tenant::new(Some((1000, 1000)), Path::new("/st"));
        let mut env = BTreeMap::from([
            ("HOME".to_owned(), "/root".to_owned()),
            ("XDG_RUNTIME_DIR".to_owned(), "/run/user/0".to_owned()),
        ]);
        t.env(&mut env);
        assert_eq!(env["HOME"], "/st/home");
        assert_eq!(env["XDG_CONFIG_HOME"], "/st/home/.config");
        assert_eq!(env["TMPDIR"], "/st/home/tmp");
        assert!(!env.contains_key("XDG_RUNTIME_DIR"));
    }

    /// Whether this runs as root; if not, says that `what` is skipped, and
    /// under `CI=true` fails instead: CI runs the tests as root, so a skip
    /// there would leave the test's claim untested without a word.
    fn root_or_skip(what: &str) -> bool {
        let root = rustix::process::geteuid().is_root();
        if !root {
            let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
            assert!(
                !ci,
                "{what} needs root, and CI=true: the test command must run as root in CI"
            );
            eprintln!("skipped: {what} needs root");
        }
        root
    }

    #[test]
    fn chown_tree_does_not_follow_symlinks() {
        if !root_or_skip("giving a tree to another user") {
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        let tree = d.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/f"), "y").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
        std::fs::create_dir(tree.join(".journal")).unwrap();
        chown_tree(&tree, 4321, 4322, &[std::ffi::OsStr::new(".journal")]).unwrap();
        assert_eq!(std::fs::metadata(tree.join("a/b/f")).unwrap().uid(), 4321);
        assert_eq!(std::fs::metadata(tree.join("a/b")).unwrap().gid(), 4322);
        assert_eq!(
            std::fs::symlink_metadata(tree.join("a/link"))
                .unwrap()
                .uid(),
            4321
        );
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0);
        assert_eq!(std::fs::metadata(tree.join(".journal")).unwrap().uid(), 0);
    }
}
