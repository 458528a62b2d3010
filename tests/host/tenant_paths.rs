//! Issue 35 through the real host: what tenant A leaves or plants never
//! reaches tenant B, whether A's slot is recycled (a host of one sandbox),
//! handed back warm, or replaced. A races the agent's `output.log` with
//! symlinks into the executions' base venv (to plant a `.pth` every later
//! script would run), tries to write there directly, leaves files in every
//! temporary directory, locks the workspace root (mode 0, an xattr), and
//! asks for a `packages.txt` that is a symlink to the agent's environment;
//! B's innocent script then runs clean.

use serde_json::Value;

use crate::common::host::{
    Host, KEY_A, KEY_B, acquire, release, run_script, start_script, wait_metric,
};

/// A's long-running script: plants what it can, then keeps replacing the
/// next execution's `output.log` with a link to a `.pth` in the base venv
/// until the test's last execution (`pkgs`) arrives; says how often it
/// tried. Without a base venv to aim at there is no attack: it fails.
const PLANT: &str = r#"
import glob, os, time
base = glob.glob('/var/lib/sandbox-agent/state/exec-base-venv/lib/python*/site-packages')
if not base:
    venv = '/var/lib/sandbox-agent/state/exec-base-venv'
    raise SystemExit('NO BASE VENV to attack (the agent makes it with uv): ' + venv
                     + (' has no lib/python*/site-packages' if os.path.isdir(venv) else ' is missing'))
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
executions = '/var/lib/sandbox-agent/executions'
log = executions + '/victim/output.log'
tries, linked = 0, 0
end = time.time() + 300
while time.time() < end and not os.path.isdir(executions + '/pkgs'):
    tries += 1
    try:
        os.unlink(log)
    except OSError:
        pass
    try:
        os.symlink(targets[0], log)
        linked += 1
    except OSError:
        pass
print('race ended:', tries, 'tries,', linked, 'links, the last execution seen:',
      os.path.isdir(executions + '/pkgs'), flush=True)
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

/// Waits until execution `name` of `sandbox` logs a line starting with
/// `line`; fails with its log if it ends first.
fn wait_log_line(host: &Host, key: &str, sandbox: &str, name: &str, line: &str) {
    let url = format!(
        "{}/local-sandbox/{sandbox}/execution-logs?execution_name={name}",
        host.base
    );
    crate::common::eventually(
        std::time::Duration::from_secs(120),
        &format!("{name} logs {line:?}"),
        || {
            let (code, v) = crate::common::host::http("GET", &url, Some(key), None);
            let logs = v["logs"].as_str().unwrap_or_default();
            if logs.lines().any(|l| l.starts_with(line)) {
                return Ok(());
            }
            let status = v["status"].as_str().unwrap_or_default();
            assert!(
                status != "completed" && status != "failed",
                "{name} ended ({status}) before logging {line:?}: {logs}"
            );
            Err(format!("{code} {v}"))
        },
    );
}

fn slot_of(host: &Host, key: &str, sandbox: &str) -> String {
    let (_, log) = run_script(host, key, sandbox, "slot", CHECK);
    log.lines()
        .find(|l| l.starts_with("slot "))
        .unwrap_or_else(|| panic!("no slot line in {log}"))
        .to_owned()
}

/// A's attack, then B's check; returns (A's slot, B's slot, the end of
/// the host's log). With `warm` (a profile the host keeps warm), B's
/// Acquire waits until A's slot is warm again and must be a warm hit.
fn attack(args: &[&str], warm: Option<&str>) -> (String, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), args);
    let body = r#"{"server_names": ["terminal"]}"#;
    let a = id(&acquire(&host, KEY_A, body));
    let a_slot = slot_of(&host, KEY_A, &a);
    start_script(&host, KEY_A, &a, "plant", PLANT);
    // Every victim runs while the race does: it started before them, and
    // ends only once the last execution (`pkgs`) arrives.
    wait_log_line(&host, KEY_A, &a, "plant", "racing ['/");
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
    assert!(planted.contains("refused /"), "{planted}");
    let tries: u64 = planted
        .lines()
        .find_map(|l| l.strip_prefix("race ended: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the race did not end: {planted}"));
    assert!(
        tries > 0 && planted.contains("the last execution seen: True"),
        "the race must run until the last execution: {planted}"
    );
    release(&host, KEY_A, &a);
    let hits = warm.map(|profile| {
        // Back in the pool and warm again before B asks.
        wait_metric(
            &host,
            &format!(r#"sandbox_host_pool_sandboxes{{state="warm",profile="{profile}"}}"#),
            1.0,
            std::time::Duration::from_secs(120),
        );
        (profile, warm_hits(&host, profile))
    });
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
    if let Some((profile, before)) = hits {
        assert_eq!(
            warm_hits(&host, profile),
            before + 1.0,
            "B's Acquire must take the warm lease"
        );
    }
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

/// Warm hits of `profile` so far (`/metrics`).
fn warm_hits(host: &Host, profile: &str) -> f64 {
    crate::common::host::metric(
        host,
        &format!(r#"sandbox_host_warm_hits_total{{profile="{profile}"}}"#),
    )
}

#[test]
fn nothing_a_tenant_plants_reaches_the_next_tenant_of_a_recycled_slot() {
    let (a, b, log) = attack(&["--max-slots", "1"], None);
    assert_eq!(
        a, b,
        "B must run on A's recycled slot; the host's log:\n{log}"
    );
}

#[test]
fn nothing_a_tenant_plants_reaches_the_next_tenant_of_a_warm_pool() {
    let (a, b, log) = attack(
        &["--max-slots", "1", "--warm", "terminal=1"],
        Some("terminal"),
    );
    assert_eq!(
        a, b,
        "B must get A's slot back warm; the host's log:\n{log}"
    );
}

#[test]
fn nothing_a_tenant_plants_reaches_the_next_tenant_after_a_replace() {
    let (a, b, log) = attack(&["--on-release", "replace"], None);
    assert_ne!(a, b, "replace gives B a new slot; the host's log:\n{log}");
}
