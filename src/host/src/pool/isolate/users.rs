//! The sandbox's own user database. A slot sees the host's `/etc` read
//! only, and with it the host's users: `ls -l` in the workspace would name
//! the tenant's uid after whichever host user has it (a machine's first
//! user is uid 1000, as the tenant is). Its `/etc/passwd` and `/etc/group`
//! (and their `-` backups) are instead the sandbox's own, as a container
//! image's: the system accounts of the installed software (uid and gid
//! below 1000: root, `mail` for the mail service, `dovecot`, …, their
//! groups without members), the tenant `sandbox` (1000) and `nobody`
//! (the id a slot shows for those it does not map); no account of a
//! person. The host's `/etc/subuid` and `/etc/subgid` (which name users)
//! are shown empty; the shadow files are unreadable in a slot already (the
//! host's root and shadow group are not mapped).

use std::path::{Path, PathBuf};

/// The tenant's ids inside a slot (the agent's `tenant_user = "auto"`).
const TENANT: u32 = 1000;
/// The overflow id: what a slot shows for ids it does not map.
const NOBODY: u32 = 65534;
/// The first id of a person's account (Debian's `UID_MIN`, `GID_MIN`):
/// below it, system accounts.
const FIRST_PERSON: u32 = 1000;

/// The sandbox's database from the host's (`passwd`, `group`): its system
/// accounts, the tenant and nobody.
fn database(passwd: &str, group: &str) -> (String, String) {
    let home = format!("{}/home", super::IN_STATE);
    let system = |line: &&str| {
        line.split(':')
            .nth(2)
            .and_then(|id| id.parse::<u32>().ok())
            .is_some_and(|id| id < FIRST_PERSON)
    };
    let mut p: String = passwd
        .lines()
        .filter(system)
        .map(|l| format!("{l}\n"))
        .collect();
    if !p.starts_with("root:") && !p.contains("\nroot:") {
        p.insert_str(0, "root:x:0:0:root:/root:/bin/sh\n");
    }
    p.push_str(&format!(
        "sandbox:x:{TENANT}:{TENANT}:sandbox:{home}:/bin/sh\n\
         nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n"
    ));
    // Groups without their members (a member list names accounts).
    let mut g: String = group
        .lines()
        .filter(system)
        .filter_map(|l| {
            l.rsplit_once(':')
                .map(|(head, _members)| format!("{head}:\n"))
        })
        .collect();
    if !g.starts_with("root:") && !g.contains("\nroot:") {
        g.insert_str(0, "root:x:0:\n");
    }
    g.push_str(&format!("sandbox:x:{TENANT}:\nnogroup:x:{NOBODY}:\n"));
    (p, g)
}

/// The files that cover the host's, by their name in `/etc`.
fn files() -> Vec<(&'static str, String)> {
    let read = |f: &str| std::fs::read_to_string(f).unwrap_or_default();
    let (passwd, group) = database(&read("/etc/passwd"), &read("/etc/group"));
    vec![
        ("passwd", passwd.clone()),
        ("passwd-", passwd),
        ("group", group.clone()),
        ("group-", group),
        ("subuid", String::new()),
        ("subuid-", String::new()),
        ("subgid", String::new()),
        ("subgid-", String::new()),
    ]
}

/// Where a slot's copies are: `<slot>/users`.
fn dir_of(slot: &Path) -> PathBuf {
    slot.join("users")
}

/// Writes the slot's copies (read-only for everyone; the host's root owns
/// them).
pub(super) fn write(slot: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = dir_of(slot);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    for (name, text) in files() {
        let p = dir.join(name);
        std::fs::write(&p, text)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444))?;
    }
    Ok(())
}

/// The bind mounts over the host's files, for those the host has (a
/// mount needs its point; the slot's `/etc` is read only).
pub(super) fn mounts(slot: &Path) -> Vec<(PathBuf, PathBuf)> {
    files()
        .iter()
        .map(|(name, _)| (dir_of(slot).join(name), Path::new("/etc").join(name)))
        .filter(|(_, inside)| inside.is_file())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_keeps_system_accounts_and_no_person() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nmail:x:8:8:mail:/var/mail:/usr/sbin/nologin\n\
                      alice:x:1000:1000:Alice:/home/alice:/bin/bash\nbob:x:1001:1001::/home/bob:/bin/sh\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
        let group = "root:x:0:\nsudo:x:27:alice,bob\nmail:x:8:\nalice:x:1000:\nnogroup:x:65534:\n";
        let (p, g) = database(passwd, group);
        let names = |t: &str| {
            t.lines()
                .filter_map(|l| l.split(':').next())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&p), ["root", "mail", "sandbox", "nobody"]);
        assert!(
            p.contains("sandbox:x:1000:1000:sandbox:/var/lib/sandbox-agent/state/home:/bin/sh\n")
        );
        assert_eq!(names(&g), ["root", "sudo", "mail", "sandbox", "nogroup"]);
        assert!(!g.contains("alice") && !g.contains("bob"), "{g}");
        // A host without a database still gives root, the tenant and nobody.
        let (p, g) = database("", "");
        assert_eq!(names(&p), ["root", "sandbox", "nobody"]);
        assert_eq!(names(&g), ["root", "sandbox", "nogroup"]);
    }

    #[test]
    fn the_files_cover_the_host_s_that_exist() {
        let slot = tempfile::tempdir().expect("tempdir");
        write(slot.path()).expect("write");
        assert_eq!(
            std::fs::read_to_string(slot.path().join("users/subuid")).expect("subuid"),
            ""
        );
        // /etc/passwd is on every machine this runs on.
        assert!(
            mounts(slot.path())
                .iter()
                .any(|(from, to)| from.ends_with("users/passwd") && to == Path::new("/etc/passwd"))
        );
    }
}
