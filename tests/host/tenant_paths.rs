//! Issue 35 through the real host: what tenant A leaves or plants never
//! reaches tenant B, whether A's slot is recycled (a host of one sandbox),
//! handed back warm, or replaced. A races the agent's `output.log` with
//! symlinks into the executions' base venv (to plant a `.pth` every later
//! script would run), tries to write there directly, leaves files in every
//! temporary directory, locks the workspace root (mode 0, an xattr), and
//! asks for a `packages.txt` that is a symlink to the agent's environment;
//! B's innocent script then runs clean.

use serde_json::Value;

use crate::common::host::{Host, KEY_A, KEY_B, acquire, release, run_script, start_script};

/// A's long-running script: plants what it can, then keeps replacing the
/// next execution's `output.log` with a link to a `.pth` in the base venv.
const PLANT: &str = r#"
import glob, os, time
base = glob.glob('/var/lib/sandbox-agent/state/exec-base-venv/lib/python*/site-packages')
targets = [d + '/planted_by_a.pth' for d in base]
for t in targets:
    try:
        with open(t, 'w') as f:
            f.write("import os; print('PLANTED-BY-A')\n")
        print('PLANTED directly', t, flush=True)
    except OSError as e:
        print('refused', t, e.errno, flush=True)
for d in ['/tmp', '/var/tmp', '/dev/shm']:
    try:
        with open(d + '/planted-by-a', 'w') as f:
            f.write('a')
        os.symlink('/etc/passwd', d + '/planted-link-by-a')
    except OSError as e:
        print('temp', d, e.errno, flush=True)
# The workspace root itself: a message in an xattr, then locked.
os.setxattr('/workspace', 'user.msg', b'by-a')
os.chmod('/workspace', 0)
print('racing', targets, flush=True)
log = '/var/lib/sandbox-agent/executions/victim/output.log'
end = time.time() + 25
while time.time() < end and targets:
    try:
        os.unlink(log)
    except OSError:
        pass
    try:
        os.symlink(targets[0], log)
    except OSError:
        pass
"#;

/// What the victim prints: a line a `.pth` would run.
const VICTIM: &str = "print(\"import os; print('PLANTED-BY-A')\")\n";

/// B's script: what it finds.
const CHECK: &str = r#"
import os
started = open('/proc/1/stat').read().rsplit(') ', 1)[1].split()[19]
print('slot', open('/proc/self/uid_map').read().split()[1], started)
for d in ['/tmp', '/var/tmp', '/dev/shm']:
    print('left in', d, sorted(n for n in os.listdir(d) if 'by-a' in n))
print('root', oct(os.stat('/workspace').st_mode & 0o7777), os.listxattr('/workspace'))
"#;

/// A tar.gz of `main.py` and a `packages.txt` that links to the agent's
/// environment.
fn linked_packages() -> Vec<u8> {
    let mut t = crate::common::ws::Tar::new();
    t.file("main.py", b"print('ran')\n");
    t.symlink("packages.txt", "/proc/1/environ");
    crate::common::ws::gzip(&t.end())
}

fn id(v: &Value) -> String {
    v["local_sandbox_id"].as_str().expect("id").to_owned()
}

fn slot_of(host: &Host, key: &str, sandbox: &str) -> String {
    let (_, log) = run_script(host, key, sandbox, "slot", CHECK);
    log.lines()
        .find(|l| l.starts_with("slot "))
        .unwrap_or_else(|| panic!("no slot line in {log}"))
        .to_owned()
}

/// A's attack, then B's check; returns (A's slot, B's slot, the end of
/// the host's log).
fn attack(args: &[&str]) -> (String, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), args);
    let body = r#"{"server_names": ["terminal"]}"#;
    let a = id(&acquire(&host, KEY_A, body));
    let a_slot = slot_of(&host, KEY_A, &a);
    start_script(&host, KEY_A, &a, "plant", PLANT);
    for _ in 0..8 {
        run_script(&host, KEY_A, &a, "victim", VICTIM);
    }
    let r = crate::common::host::try_run_archive(&host, KEY_A, &a, "pkgs", &linked_packages());
    let (status, log) = r.expect("the packages.txt execution runs");
    assert_eq!(status, "failed", "{log}");
    assert!(
        !log.contains("PATH=") && !log.contains("SANDBOX_AGENT"),
        "the agent's environment was quoted: {log}"
    );
    let (_, planted) = crate::common::host::wait_execution(&host, KEY_A, &a, "plant");
    assert!(!planted.contains("PLANTED directly"), "{planted}");
    release(&host, KEY_A, &a);
    let b = crate::common::eventually(
        std::time::Duration::from_secs(60),
        "B leases a sandbox",
        || {
            let (code, v) = crate::common::host::http(
                "POST",
                &format!("{}/local-sandbox", host.base),
                Some(KEY_B),
                Some(body),
            );
            crate::common::when(code == 201, || format!("{code} {v}")).map(|()| id(&v))
        },
    );
    let (status, log) = run_script(&host, KEY_B, &b, "innocent", CHECK);
    assert_eq!(status, "completed", "{log}");
    assert!(
        !log.contains("PLANTED-BY-A"),
        "A's .pth ran in B's script: {log}"
    );
    for d in ["/tmp", "/var/tmp", "/dev/shm"] {
        assert!(log.contains(&format!("left in {d} []")), "{log}");
    }
    assert!(log.contains("root 0o755 []"), "the workspace root: {log}");
    let b_slot = log
        .lines()
        .find(|l| l.starts_with("slot "))
        .unwrap_or_default()
        .to_owned();
    release(&host, KEY_B, &b);
    let log = std::fs::read_to_string(dir.path().join("host.log")).unwrap_or_default();
    let mut from = log.len().saturating_sub(5000);
    while !log.is_char_boundary(from) {
        from += 1;
    }
    (a_slot, b_slot, log[from..].to_owned())
}

#[test]
fn nothing_a_tenant_plants_reaches_the_next_tenant_of_a_recycled_slot() {
    let (a, b, log) = attack(&["--max-slots", "1"]);
    assert_eq!(
        a, b,
        "B must run on A's recycled slot; the host's log:\n{log}"
    );
}

#[test]
fn nothing_a_tenant_plants_reaches_the_next_tenant_of_a_warm_pool() {
    attack(&["--max-slots", "1", "--warm", "terminal=1"]);
}

#[test]
fn nothing_a_tenant_plants_reaches_the_next_tenant_after_a_replace() {
    let (a, b, log) = attack(&["--on-release", "replace"]);
    assert_ne!(a, b, "replace gives B a new slot; the host's log:\n{log}");
}
