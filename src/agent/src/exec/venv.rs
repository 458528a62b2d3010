//! The Python side of executions, prepared once per agent: the real
//! interpreter behind `exec.python` (a wrapper such as a pyenv shim is
//! asked once, not per run), `uv` found once, and a base venv that `uv`
//! makes relocatable. Each run gets a copy of that base venv of its own
//! ([`clone_base`]: a few small files and symlinks, well under a
//! millisecond), owned by the tenant, so it may install into it and no run
//! sees another's packages.
//!
//! The base lives in the agent's state root, the agent's own (never the
//! tenant's): no execution can change what the next one copies.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{AtFlags, Mode, OFlags};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::ExecConfig;
use crate::supervisor::Supervisor;
use crate::supervisor::job::{JobEnd, JobGroup, JobSpec, RunAs};
use crate::supervisor::manifest::ResourceLimits;
use crate::supervisor::spawn::Exit;

/// How long preparing may take (an interpreter or uv that hangs).
const PREPARE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most output of a preparing step kept (for its error message).
const MAX_OUTPUT: usize = 16 << 10;
/// Deepest directory of the base venv (`lib/pythonX.Y/site-packages` is 3).
const MAX_DEPTH: usize = 8;

/// What runs share, found once.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    /// The interpreter itself (`sys.executable`), or `exec.python` when it
    /// could not be asked (each run's venv step then says why).
    pub python: String,
    /// `uv`, by the path found once (or configured), if any.
    pub uv: Option<String>,
    /// The base venv each run copies; `None` without uv (each run makes
    /// its venv with `python -m venv`) or when making it failed.
    pub base: Option<PathBuf>,
    /// The base venv as made ([`fingerprint`]), checked at every Release.
    pub fingerprint: Option<Fingerprint>,
}

/// Every entry of a tree by relative path: its type, mode, owner, size,
/// symlink target and (files) the sha256 of its content.
pub(crate) type Fingerprint = BTreeMap<PathBuf, String>;

/// Finds the interpreter and uv and makes the base venv at `base`, as the
/// agent. Never fails: what could not be prepared is left to each run.
pub(super) async fn prepare(cfg: &ExecConfig, sup: &Supervisor, base: &Path) -> Prepared {
    let started = std::time::Instant::now();
    let env = agent_env(cfg);
    let uv = find_uv(&cfg.uv, env.get("PATH").map(String::as_str).unwrap_or(""));
    let python = match run_job(
        sup,
        &cfg.python,
        &["-S", "-c", "import sys; print(sys.executable)"],
        &env,
    )
    .await
    {
        Ok(out) if !out.trim().is_empty() && !out.trim().contains('\n') => out.trim().to_owned(),
        Ok(out) => {
            tracing::warn!(python = %cfg.python, output = %out.trim(), "exec.python did not name its executable; runs use it as configured");
            cfg.python.clone()
        }
        Err(e) => {
            tracing::warn!(python = %cfg.python, error = %e, "cannot ask exec.python for its executable; runs use it as configured");
            cfg.python.clone()
        }
    };
    let mut made = None;
    let mut fingerprint_made = None;
    if let Some(uv) = &uv {
        let b = base.display().to_string();
        if let Some(parent) = base.parent()
            && let Err(e) = std::fs::create_dir_all(parent)
        {
            tracing::warn!(path = %parent.display(), error = %e, "cannot create the base venv's directory");
        }
        // --relocatable: its activate scripts find the venv where it is,
        // so a copy is a venv of its own.
        let args = [
            "venv",
            "--quiet",
            "--clear",
            "--relocatable",
            "--no-cache",
            "--python",
            &python,
            &b,
        ];
        match run_job(sup, uv, &args, &env).await {
            Ok(_) => {
                let b = base.to_owned();
                let sealed = tokio::task::spawn_blocking(move || {
                    seal(&b)?;
                    fingerprint(&b)
                })
                .await
                .map_err(io::Error::other)
                .and_then(|r| r);
                match sealed {
                    Ok(f) => {
                        made = Some(base.to_owned());
                        fingerprint_made = Some(f);
                    }
                    Err(e) => {
                        tracing::warn!(base = %base.display(), error = %e, "cannot seal the base venv; each run makes its own")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(%uv, error = %e, "cannot make the base venv; each run makes its own")
            }
        }
    }
    tracing::info!(
        %python,
        uv = uv.as_deref().unwrap_or("none"),
        base = %made.as_deref().map(|b| b.display().to_string()).unwrap_or_else(|| "none".into()),
        ms = started.elapsed().as_millis() as u64,
        "executions prepared"
    );
    Prepared {
        python,
        uv,
        base: made,
        fingerprint: fingerprint_made,
    }
}

const DIR_FLAGS: OFlags = OFlags::DIRECTORY
    .union(OFlags::RDONLY)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NOFOLLOW);

/// Visits every entry below the directory `root` (by handles, never
/// following a symlink, at most [`MAX_DEPTH`] deep): `f(parent, name,
/// relative path, stat)`.
fn visit(
    root: &Path,
    f: &mut dyn FnMut(BorrowedFd<'_>, &OsStr, &Path, &rustix::fs::Stat) -> io::Result<()>,
) -> io::Result<()> {
    let fd = rustix::fs::open(root, DIR_FLAGS, Mode::empty())?;
    let mut stack = vec![(fd, PathBuf::new(), 0usize)];
    while let Some((dir, rel, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(io::Error::other("the base venv is nested too deep"));
        }
        for name in sandbox_archive::confine::list(dir.as_fd())? {
            let st = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)?;
            let path = rel.join(&name);
            f(dir.as_fd(), &name, &path, &st)?;
            if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory {
                let sub = rustix::fs::openat(&dir, &name, DIR_FLAGS, Mode::empty())?;
                stack.push((sub, path, depth + 1));
            }
        }
    }
    Ok(())
}

/// Makes the base venv the agent's alone: every entry owned by the agent
/// (root), directories 0755, files 0644 (0755 if executable). No tenant
/// can change what every run copies.
pub(super) fn seal(root: &Path) -> io::Result<()> {
    let me = (rustix::process::geteuid(), rustix::process::getegid());
    let top = rustix::fs::open(root, DIR_FLAGS, Mode::empty())?;
    rustix::fs::fchown(&top, Some(me.0), Some(me.1))?;
    rustix::fs::fchmod(&top, Mode::from_raw_mode(0o755))?;
    visit(root, &mut |dir, name, _path, st| {
        use rustix::fs::FileType;
        rustix::fs::chownat(dir, name, Some(me.0), Some(me.1), AtFlags::SYMLINK_NOFOLLOW)?;
        let mode = match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => 0o755,
            FileType::RegularFile if st.st_mode & 0o111 != 0 => 0o755,
            FileType::RegularFile => 0o644,
            // A symlink's mode means nothing; nothing else belongs here.
            _ => return Ok(()),
        };
        rustix::fs::chmodat(dir, name, Mode::from_raw_mode(mode), AtFlags::empty())?;
        Ok(())
    })
}

/// The base venv's [`Fingerprint`] (the top directory's own entry is "").
pub(crate) fn fingerprint(root: &Path) -> io::Result<Fingerprint> {
    use sha2::Digest;
    let mut out = Fingerprint::new();
    let top = rustix::fs::open(root, DIR_FLAGS, Mode::empty())?;
    let st = rustix::fs::fstat(&top)?;
    out.insert(PathBuf::new(), describe(&st, ""));
    visit(root, &mut |dir, name, path, st| {
        use rustix::fs::FileType;
        let extra = match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                let t = rustix::fs::readlinkat(dir, name, Vec::new())?;
                format!("-> {}", String::from_utf8_lossy(t.as_bytes()))
            }
            FileType::RegularFile => {
                let fd = rustix::fs::openat(
                    dir,
                    name,
                    OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK,
                    Mode::empty(),
                )?;
                let mut f = std::fs::File::from(fd);
                let mut h = sha2::Sha256::new();
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = io::Read::read(&mut f, &mut buf)?;
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                }
                let sum: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
                format!("sha256 {sum}")
            }
            _ => String::new(),
        };
        out.insert(path.to_owned(), describe(st, &extra));
        Ok(())
    })?;
    Ok(out)
}

fn describe(st: &rustix::fs::Stat, extra: &str) -> String {
    format!(
        "mode {:o} owner {}:{} size {} {extra}",
        st.st_mode, st.st_uid, st.st_gid, st.st_size
    )
}

/// What differs between two fingerprints, by path (at most a few named).
pub(crate) fn differences(made: &Fingerprint, now: &Fingerprint) -> Vec<String> {
    let mut out = Vec::new();
    for (p, d) in made {
        match now.get(p) {
            None => out.push(format!("{} removed", p.display())),
            Some(n) if n != d => out.push(format!("{} changed ({d} → {n})", p.display())),
            Some(_) => {}
        }
    }
    for p in now.keys().filter(|p| !made.contains_key(*p)) {
        out.push(format!("{} added", p.display()));
    }
    out
}

/// The preparing steps' environment: the agent's own PATH and what the
/// operator gives executions (`exec.pass_env`, `exec.env`: a pyenv
/// version, proxies).
fn agent_env(cfg: &ExecConfig) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = cfg
        .pass_env
        .iter()
        .chain(["HOME".to_owned(), "PYENV_ROOT".to_owned()].iter())
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)))
        .collect();
    let path = std::env::var("PATH").unwrap_or_else(|_| crate::tenant::env::PATH.into());
    env.insert("PATH".into(), path);
    env.insert("LANG".into(), "C.UTF-8".into());
    env.insert("UV_PYTHON_DOWNLOADS".into(), "never".into());
    for (k, v) in &cfg.env {
        env.insert(k.clone(), v.clone());
    }
    env
}

/// Runs `command args` as the agent in `/`; its output if it exits 0.
async fn run_job(
    sup: &Supervisor,
    command: &str,
    args: &[&str],
    env: &BTreeMap<String, String>,
) -> Result<String, String> {
    let spec = JobSpec {
        group: JobGroup::Service("exec-prepare"),
        command: command.to_owned(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: env.clone(),
        cwd: PathBuf::from("/"),
        limits: ResourceLimits::default(),
        run_as: RunAs::Agent,
    };
    let mut job = sup
        .spawn_job(&spec)
        .await
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    let output = job.take_output();
    let read = async {
        let mut out = Vec::new();
        if let Some(fd) = output
            && let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
        {
            let _ = rx.take(MAX_OUTPUT as u64).read_to_end(&mut out).await;
        }
        out
    };
    let stop = CancellationToken::new();
    let timer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(PREPARE_TIMEOUT).await;
            stop.cancel();
        })
    };
    let (out, end) = tokio::join!(read, job.wait(&stop, Duration::from_millis(500)));
    timer.abort();
    let out = String::from_utf8_lossy(&out).into_owned();
    match end {
        JobEnd::Exited(Exit::Code(0)) => Ok(out),
        JobEnd::Exited(e) => Err(format!("{command} ended with {e}: {}", out.trim())),
        JobEnd::Stopped(_) => Err(format!(
            "{command} took more than {} s",
            PREPARE_TIMEOUT.as_secs()
        )),
    }
}

/// Copies the base venv to `name` in the directory `parent` (replacing
/// whatever is there), every entry owned by `owner`. By handles, never
/// following a symlink: the tenant owns `parent`.
pub(super) fn clone_base(
    base: &Path,
    parent: &Path,
    name: &OsStr,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    let dir_flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let parent_fd = rustix::fs::open(parent, dir_flags, Mode::empty())?;
    match rustix::fs::statat(&parent_fd, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => sandbox_archive::confine::remove_at(parent_fd.as_fd(), name, &parent.join(name))
            .map_err(|e| io::Error::other(e.to_string()))?,
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let src = rustix::fs::open(base, dir_flags, Mode::empty())?;
    let st = rustix::fs::fstat(&src)?;
    rustix::fs::mkdirat(&parent_fd, name, Mode::from_raw_mode(0o700))?;
    let dst = rustix::fs::openat(&parent_fd, name, dir_flags, Mode::empty())?;
    copy_dir(src.as_fd(), dst.as_fd(), owner, 0)?;
    finish(dst.as_fd(), &st, owner)
}

/// Makes `name` in the directory `parent` (the agent's) an empty directory
/// owned by `owner`, 0755, removing whatever was there (by handles).
pub(super) fn empty_dir(parent: &Path, name: &OsStr, owner: Option<(u32, u32)>) -> io::Result<()> {
    let dir_flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let parent_fd = rustix::fs::open(parent, dir_flags, Mode::empty())?;
    match rustix::fs::statat(&parent_fd, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => sandbox_archive::confine::remove_at(parent_fd.as_fd(), name, &parent.join(name))
            .map_err(|e| io::Error::other(e.to_string()))?,
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    rustix::fs::mkdirat(&parent_fd, name, Mode::from_raw_mode(0o700))?;
    let fd = rustix::fs::openat(&parent_fd, name, dir_flags, Mode::empty())?;
    if let Some((u, g)) = owner {
        rustix::fs::fchown(
            &fd,
            Some(rustix::fs::Uid::from_raw(u)),
            Some(rustix::fs::Gid::from_raw(g)),
        )?;
    }
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755))?;
    Ok(())
}

/// A copied entry takes the owner and its original's mode.
fn finish(fd: BorrowedFd<'_>, st: &rustix::fs::Stat, owner: Option<(u32, u32)>) -> io::Result<()> {
    if let Some((u, g)) = owner {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(u)),
            Some(rustix::fs::Gid::from_raw(g)),
        )?;
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(st.st_mode & 0o777))?;
    Ok(())
}

fn copy_dir(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    owner: Option<(u32, u32)>,
    depth: usize,
) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("the base venv is nested too deep"));
    }
    let dir_flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    for name in sandbox_archive::confine::list(src)? {
        let st = rustix::fs::statat(src, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::Directory => {
                rustix::fs::mkdirat(dst, &name, Mode::from_raw_mode(0o700))?;
                let s = rustix::fs::openat(src, &name, dir_flags, Mode::empty())?;
                let d = rustix::fs::openat(dst, &name, dir_flags, Mode::empty())?;
                copy_dir(s.as_fd(), d.as_fd(), owner, depth + 1)?;
                finish(d.as_fd(), &st, owner)?;
            }
            rustix::fs::FileType::Symlink => {
                let target = rustix::fs::readlinkat(src, &name, Vec::new())?;
                rustix::fs::symlinkat(target.as_c_str(), dst, &name)?;
                if let Some((u, g)) = owner {
                    rustix::fs::chownat(
                        dst,
                        &name,
                        Some(rustix::fs::Uid::from_raw(u)),
                        Some(rustix::fs::Gid::from_raw(g)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )?;
                }
            }
            rustix::fs::FileType::RegularFile => {
                let s: OwnedFd = rustix::fs::openat(
                    src,
                    &name,
                    OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                    Mode::empty(),
                )?;
                let d: OwnedFd = rustix::fs::openat(
                    dst,
                    &name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                let (mut s, mut d) = (std::fs::File::from(s), std::fs::File::from(d));
                io::copy(&mut s, &mut d)?;
                finish(d.as_fd(), &st, owner)?;
            }
            // Nothing else belongs in a venv.
            _ => {}
        }
    }
    Ok(())
}

/// `uv` to use: the configured path, the one on `path` ("auto"), or none.
fn find_uv(setting: &str, path: &str) -> Option<String> {
    match setting {
        "off" => None,
        "auto" => which("uv", path),
        path => Some(path.to_owned()),
    }
}

fn which(name: &str, path: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map(|p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_sealed_base_is_roots_and_any_change_shows_in_its_fingerprint() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        std::fs::create_dir_all(base.join("lib/site-packages")).unwrap();
        std::fs::create_dir_all(base.join("bin")).unwrap();
        std::fs::write(base.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(base.join("bin/tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            base.join("bin/tool"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        std::fs::set_permissions(
            base.join("lib/site-packages"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3", base.join("bin/python")).unwrap();
        seal(&base).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&base.join("lib/site-packages")), 0o755);
        assert_eq!(mode(&base.join("bin/tool")), 0o755);
        assert_eq!(mode(&base.join("pyvenv.cfg")), 0o644);
        let made = fingerprint(&base).unwrap();
        assert!(differences(&made, &fingerprint(&base).unwrap()).is_empty());
        // Planted, changed in place (same size), re-pointed: each named.
        std::fs::write(base.join("lib/site-packages/zz.pth"), "import os\n").unwrap();
        std::fs::write(base.join("pyvenv.cfg"), "home = /usr/biN\n").unwrap();
        std::fs::remove_file(base.join("bin/python")).unwrap();
        std::os::unix::fs::symlink("/tmp/evil", base.join("bin/python")).unwrap();
        let d = differences(&made, &fingerprint(&base).unwrap()).join("; ");
        assert!(d.contains("lib/site-packages/zz.pth added"), "{d}");
        assert!(d.contains("pyvenv.cfg changed"), "{d}");
        assert!(d.contains("bin/python changed"), "{d}");
    }

    #[test]
    fn a_clone_has_the_files_links_and_modes_of_the_base() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        std::fs::create_dir_all(base.join("lib/python3/site-packages")).unwrap();
        std::fs::create_dir_all(base.join("bin")).unwrap();
        std::fs::write(base.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(base.join("bin/activate"), "echo hi\n").unwrap();
        std::fs::set_permissions(
            base.join("bin/activate"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3", base.join("bin/python")).unwrap();
        std::os::unix::fs::symlink("lib", base.join("lib64")).unwrap();
        let run = t.path().join("run");
        std::fs::create_dir(&run).unwrap();
        // A leftover of an earlier run, with a link out: replaced, never
        // followed.
        std::fs::create_dir_all(run.join("venv/lib")).unwrap();
        std::fs::write(t.path().join("outside"), "keep").unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), run.join("venv/lib/x")).unwrap();
        std::fs::write(run.join("venv/lib/evil.pth"), "import os").unwrap();
        clone_base(&base, &run, OsStr::new("venv"), None).unwrap();
        let v = run.join("venv");
        assert_eq!(
            std::fs::read_to_string(v.join("pyvenv.cfg")).unwrap(),
            "home = /usr/bin\n"
        );
        assert_eq!(
            std::fs::read_link(v.join("bin/python")).unwrap(),
            Path::new("/usr/bin/python3")
        );
        assert_eq!(
            std::fs::read_link(v.join("lib64")).unwrap(),
            Path::new("lib")
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&v.join("bin/activate")), 0o755);
        assert_eq!(
            mode(&v.join("lib/python3/site-packages")),
            mode(&base.join("lib"))
        );
        assert!(v.join("lib/python3/site-packages").is_dir());
        assert!(!v.join("lib/evil.pth").exists());
        assert_eq!(
            std::fs::read_to_string(t.path().join("outside")).unwrap(),
            "keep"
        );
        // Replacing works again (a run started twice).
        clone_base(&base, &run, OsStr::new("venv"), None).unwrap();
        assert!(v.join("bin/activate").is_file());
    }
}
