//! Which servers of the manifest are installed: the one place that decides.
//!
//! A server is installed when every path under `install_dir` that its
//! command and arguments name exists (the command executable, a script
//! argument a regular file): what `packaging/install-servers.sh` puts
//! there. Paths outside `install_dir` (`node`, `sh`, a test's own script)
//! are the runner's to find. A server whose default launch is absent is
//! left out of the manifest's servers (so out of every list, `ALL` and the
//! host's catalog) and asking for it names the install command; one whose
//! benchmark profile alone is absent is refused under that profile.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{Benchmark, Manifest, ServerDef};

/// The script that installs the servers, as the error names it.
pub const INSTALL_COMMAND: &str = "packaging/install-servers.sh";

/// A server (or one of its profiles) whose install is absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotInstalled {
    /// The manifest's name.
    pub server: String,
    /// install-servers.sh's name for it (`NAME`, or `NAME@BENCH` for a
    /// benchmark's pinned version).
    pub install_name: String,
    /// The first absent path.
    pub path: PathBuf,
}

impl std::fmt::Display for NotInstalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is not installed here ({} is absent): `{INSTALL_COMMAND} {}` installs it",
            self.server,
            self.path.display(),
            self.install_name
        )
    }
}

/// The first path under `install_dir` among `command` and `args` that is
/// absent: the command not an executable file, an argument not there.
pub fn absent(install_dir: &Path, command: &str, args: &[String]) -> Option<PathBuf> {
    let under = |s: &str| {
        let p = Path::new(s);
        (p.is_absolute() && p.starts_with(install_dir)).then(|| p.to_owned())
    };
    if let Some(c) = under(command) {
        let ok =
            std::fs::metadata(&c).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        if !ok {
            return Some(c);
        }
    }
    args.iter().filter_map(|a| under(a)).find(|p| !p.exists())
}

/// `def` under `bench` (its default launch for `None`), if absent.
pub fn check_server(
    install_dir: &Path,
    def: &ServerDef,
    bench: Option<Benchmark>,
) -> Option<NotInstalled> {
    let o = bench.and_then(|b| def.benchmarks.get(&b));
    let command = o.and_then(|o| o.command.as_deref()).unwrap_or(&def.command);
    let args = o.and_then(|o| o.args.as_deref()).unwrap_or(&def.args);
    let path = absent(install_dir, command, args)?;
    // A benchmark's pins live in node@BENCH or py/NAME@BENCH.
    let install_name = match bench {
        Some(b) if path.to_string_lossy().contains(&format!("@{}", b.as_str())) => {
            format!("{}@{}", def.name, b.as_str())
        }
        _ => def.name.clone(),
    };
    Some(NotInstalled {
        server: def.name.clone(),
        install_name,
        path,
    })
}

impl Manifest {
    /// Moves the servers whose default launch is not installed out of
    /// `servers` into `not_installed`, and records the profiles whose own
    /// install is absent. Nothing to do without `install_dir`.
    pub fn retain_installed(&mut self) {
        let Some(dir) = self.file.install_dir.clone().filter(|d| !d.is_empty()) else {
            return;
        };
        let dir = PathBuf::from(dir);
        let absent: Vec<NotInstalled> = self
            .servers
            .values()
            .filter_map(|d| check_server(&dir, d, None))
            .collect();
        for n in absent {
            self.servers.remove(&n.server);
            self.not_installed.insert(n.server.clone(), n);
        }
        for def in self.servers.values() {
            for b in def.benchmarks.keys() {
                if let Some(n) = check_server(&dir, def, Some(*b)) {
                    self.profiles_not_installed
                        .insert((def.name.clone(), *b), n);
                }
            }
        }
    }

    /// Why `name` cannot be started under `bench`, when its install is
    /// absent.
    pub fn not_installed(&self, name: &str, bench: Option<Benchmark>) -> Option<&NotInstalled> {
        self.not_installed
            .get(name)
            .or_else(|| bench.and_then(|b| self.profiles_not_installed.get(&(name.to_owned(), b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::manifest::Roots;

    #[test]
    fn only_what_the_installer_put_in_place_is_installed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let exe = d.join("py/git/bin/mcp-server-git");
        std::fs::create_dir_all(exe.parent().expect("parent")).expect("mkdir");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let script = d.join("node/node_modules/fs/index.js");
        std::fs::create_dir_all(script.parent().expect("parent")).expect("mkdir");
        std::fs::write(&script, "").expect("write");
        let text = format!(
            r#"
install_dir = "{}"
[servers.git]
command = "${{install_dir}}/py/git/bin/mcp-server-git"
[servers.git.benchmarks.Toolathlon]
command = "${{install_dir}}/py/git@Toolathlon/bin/mcp-server-git"
[servers.filesystem]
command = "node"
args = ["${{install_dir}}/node/node_modules/fs/index.js", "/ws"]
[servers.localmemory]
command = "node"
args = ["${{install_dir}}/node/node_modules/memory/index.js"]
[servers.word]
command = "${{install_dir}}/py/word/bin/word_mcp_server"
[servers.excel]
command = "${{install_dir}}/node/node_modules/fs/index.js"
[servers.own]
command = "/nonexistent/own-server"
"#,
            d.display()
        );
        let roots = Roots {
            workspace: Path::new("/ws"),
            state_root: Path::new("/st"),
            data: None,
        };
        let mut m = Manifest::parse(&text, Path::new("m.toml"), &roots).expect("valid");
        m.retain_installed();
        // Outside install_dir, nothing is judged here (the runner finds it).
        assert_eq!(m.names(), ["filesystem", "git", "own"]);
        let n = m.not_installed("localmemory", None).expect("absent script");
        assert_eq!(n.install_name, "localmemory");
        assert!(n.path.ends_with("memory/index.js"), "{n:?}");
        let e = m.not_installed("word", None).expect("absent").to_string();
        assert!(
            e.contains("word is not installed")
                && e.contains("`packaging/install-servers.sh word`"),
            "{e}"
        );
        // A command that is not executable is not installed.
        assert!(m.not_installed("excel", None).is_some());
        // A profile whose pinned install is absent: refused under it only.
        assert!(m.not_installed("git", None).is_none());
        let n = m
            .not_installed("git", Some(Benchmark::Toolathlon))
            .expect("pin absent");
        assert_eq!(n.install_name, "git@Toolathlon");
        assert!(m.not_installed("git", Some(Benchmark::McpAtlas)).is_none());
    }
}
