//! The key of a catalog: everything that decides what a server answers to
//! discovery. Two launches with the same key run the same build the same
//! way; any change (an argument, a variable, a profile's override, a new
//! lock installed, another version, another interpreter) makes a new key,
//! and a catalog under the old one is not used.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::supervisor::manifest::LaunchSpec;

/// How far up from a path of the launch an install's stamp is looked for.
const STAMP_DEPTH: usize = 8;
/// The stamp `install-servers.sh` writes at the root of each install (its
/// lock's sha256, and the interpreter for a venv).
const STAMP: &str = ".installed";

/// The key of `spec` at `version` (the manifest's `metadata.version` under
/// the profile), hex sha256.
pub fn key_of(spec: &LaunchSpec, version: Option<&str>) -> String {
    let paths = std::iter::once(spec.command.as_str()).chain(spec.args.iter().map(String::as_str));
    let stamps: Vec<(String, String)> = paths
        .filter_map(|p| stamp_of(Path::new(p)))
        .map(|(dir, s)| (dir.display().to_string(), s))
        .collect();
    let program = program_of(spec).map(|p| identity(&p));
    let doc = json!({
        "name": spec.name,
        "command": spec.command,
        "args": spec.args,
        "env": spec.env,
        "cwd": spec.cwd,
        "uid": spec.uid,
        "gid": spec.gid,
        "transport": format!("{:?}", spec.transport),
        "version": version,
        "protocol": sandbox_client::mcp::CLIENT_VERSION,
        "stamps": stamps,
        "program": program,
    });
    hex::encode(Sha256::digest(doc.to_string().as_bytes()))
}

/// The stamp of the install `path` is in: the nearest `.installed` above
/// it, with the directory holding it.
fn stamp_of(path: &Path) -> Option<(PathBuf, String)> {
    if !path.is_absolute() {
        return None;
    }
    path.ancestors().skip(1).take(STAMP_DEPTH).find_map(|dir| {
        let s = std::fs::read(dir.join(STAMP)).ok()?;
        let s = String::from_utf8_lossy(&s[..s.len().min(4096)])
            .trim()
            .to_owned();
        Some((dir.to_owned(), s))
    })
}

/// The program the launch runs: its command, or the first match on the
/// launch's PATH for a bare name.
fn program_of(spec: &LaunchSpec) -> Option<PathBuf> {
    let cmd = Path::new(&spec.command);
    if cmd.is_absolute() {
        return Some(cmd.to_owned());
    }
    let path = spec
        .env
        .get("PATH")
        .map_or("/usr/local/bin:/usr/bin:/bin", String::as_str);
    path.split(':')
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file())
}

/// What tells one build of a program from another without reading it: its
/// resolved path, size and modification time (an interpreter upgraded in
/// place changes them).
fn identity(p: &Path) -> serde_json::Value {
    let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    match std::fs::metadata(&real) {
        Ok(m) => json!([real, m.len(), m.mtime(), m.mtime_nsec()]),
        Err(_) => json!([real]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::manifest::{ResourceLimits, Restart, RestartPolicy, Transport};
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn spec(dir: &Path) -> LaunchSpec {
        LaunchSpec {
            name: "s".into(),
            command: dir.join("venv/bin/server").display().to_string(),
            args: vec!["--flag".into()],
            env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
            cwd: "/workspace".into(),
            uid: Some(1000),
            gid: Some(1000),
            transport: Transport::Stdio,
            ready_timeout: Duration::from_secs(1),
            stop_grace: Duration::from_secs(1),
            restart: Restart {
                policy: RestartPolicy::Never,
                initial_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(1),
                max_restarts: 0,
                window: Duration::from_secs(1),
            },
            limits: ResourceLimits::default(),
        }
    }

    #[test]
    fn any_change_of_launch_install_or_version_changes_the_key() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("venv/bin")).unwrap();
        std::fs::write(d.path().join("venv/bin/server"), "#!/bin/sh\n").unwrap();
        std::fs::write(d.path().join("venv/.installed"), "aaa /usr/bin/python3\n").unwrap();
        let s = spec(d.path());
        let k = key_of(&s, Some("1.0"));
        assert_eq!(k, key_of(&s, Some("1.0")), "the key is stable");
        assert_ne!(k, key_of(&s, Some("1.1")));
        let mut other = s.clone();
        other.args.push("--more".into());
        assert_ne!(k, key_of(&other, Some("1.0")));
        let mut other = s.clone();
        other.env.insert("B".into(), "2".into());
        assert_ne!(k, key_of(&other, Some("1.0")));
        std::fs::write(d.path().join("venv/.installed"), "bbb /usr/bin/python3\n").unwrap();
        assert_ne!(k, key_of(&s, Some("1.0")), "a new lock installed");
    }
}
