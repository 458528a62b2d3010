//! The process backend isolates (issue 27): a tenant's script, run through
//! the real host's execution API, plays the attacker against the host,
//! another tenant and the next lease. Each test fails on a host without
//! isolation (`--isolation none`, the old default).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::host::*;

const RUN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/run_script.py");
const TASKS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/benchmark_tasks.py"
);

/// Runs `script` as `key`'s tenant (in `sandbox`, or a new one with no
/// servers); returns (sandbox id, final status, log).
fn run(host: &Host, key: &str, sandbox: Option<&str>, script: &str) -> (String, String, String) {
    run_with(host, key, sandbox, script, &[])
}

/// [`run`] with more arguments for run_script.py (`--no-wait`).
fn run_with(
    host: &Host,
    key: &str,
    sandbox: Option<&str>,
    script: &str,
    more: &[&str],
) -> (String, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("main.py");
    std::fs::write(&f, script).expect("script");
    let mut c = Command::new("python3");
    c.arg(RUN).arg(&host.base).arg(key).arg(&f);
    if let Some(s) = sandbox {
        c.args(["--sandbox", s]);
    }
    c.args(more);
    let out = c.output().expect("python3");
    assert!(
        out.status.success(),
        "run_script.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    (
        v["sandbox_id"].as_str().unwrap_or_default().to_owned(),
        v["status"].as_str().unwrap_or_default().to_owned(),
        v["logs"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The lines `name: ...` a probe script printed, by name.
fn verdicts(log: &str) -> std::collections::BTreeMap<String, String> {
    log.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// A tenant's script tries the host's secrets, its processes, another
/// tenant's files and the host's loopback API: it reaches none of them,
/// and it is not root.
#[test]
fn a_tenant_reaches_nothing_of_the_host_or_other_tenants() {
    // A second address of this host, there before its sandboxes start.
    let extra = ExtraAddress::add();
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let port = host.base.rsplit(':').next().expect("port").to_owned();
    // Tenant B's sandbox, with a file in its workspace.
    let (b_id, status, log) = run(
        &host,
        KEY_B,
        None,
        "open('/workspace/secret-of-b', 'w').write('b')\nprint('written')\n",
    );
    assert_eq!(status, "completed", "{log}");
    let b_files: Vec<String> = std::fs::read_dir(host.data.join("slots"))
        .expect("slots")
        .flatten()
        .map(|e| crate::common::slots::slot_workspace(&e.path()).join("secret-of-b"))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(b_files.len(), 1, "B's file on the host: {b_files:?}");
    let data = host.data.display().to_string();
    let host_pid = host.pid().expect("host pid");
    // Services of this host on every address, reached back through the
    // sandbox's outbound network: at a second address of this host, and
    // at its IPv6 link-local address.
    let any4 = std::net::TcpListener::bind("0.0.0.0:0").expect("0.0.0.0");
    let any6 = std::net::TcpListener::bind("[::]:0").ok();
    let link_local = host_link_local().filter(|_| any6.is_some());
    let probe = format!(
        r#"
import errno, os, socket, time
def probe(name, f):
    try:
        f()
        print(f"{{name}}: REACHED")
    except Exception as e:
        print(f"{{name}}: denied ({{type(e).__name__}})")
# A connection must be refused at once, with the error that says why:
# EACCES from the policy's prohibit routes, ECONNREFUSED where nothing
# listens (EPERM elsewhere), never merely time out (a slow network as well
# as a closed one) nor find no route (a machine without a network, which
# would pass for isolation).
REFUSED = {{errno.EACCES, errno.EPERM, errno.ECONNREFUSED}}
def connect(name, addr, family=socket.AF_INET):
    start = time.monotonic()
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(addr)
        s.close()
        print(f"{{name}}: REACHED")
    except socket.timeout:
        print(f"{{name}}: TIMED OUT after {{time.monotonic() - start:.1f}} s")
    except OSError as e:
        took = time.monotonic() - start
        if e.errno in REFUSED and took < 2:
            print(f"{{name}}: denied ({{errno.errorcode[e.errno]}} in {{took:.3f}} s)")
        else:
            print(f"{{name}}: UNCLEAR ({{e!r}} after {{took:.1f}} s)")
# The tenant's default routes (pasta's; not the kernel's IPv6 one on lo):
# without one, an address beyond the namespace is refused whether or not
# the isolation closes it.
def default_route(table, is_default):
    try:
        rows = [l.split() for l in open(table).read().splitlines()]
    except OSError:
        return False
    return any(is_default(f) for f in rows)
print("ipv4 default route:", default_route("/proc/net/route",
      lambda f: f[0] != "Iface" and f[1] == "00000000"))
print("ipv6 default route:", default_route("/proc/net/ipv6_route",
      lambda f: f[0] == "0" * 32 and f[1] == "00" and f[9] != "lo"))
print(f"uid: {{os.getuid()}}")
probe("signing key", lambda: open("{data}/signing.key", "rb").read())
probe("database", lambda: open("{data}/host.db", "rb").read(16))
probe("host cmdline", lambda: open("/proc/{host_pid}/cmdline").read())
probe("other tenant's file", lambda: open("{b_file}").read())
connect("host api", ("127.0.0.1", {port}))
connect("metadata", ("169.254.169.254", 80))
connect("metadata over ipv6", ("fd00:ec2::254", 80), socket.AF_INET6)
probe("agent socket", lambda: socket.socket(socket.AF_UNIX).connect("/run/sandbox-agent/agent.sock"))
connect("host's second address", ("{extra}", {any4}))
if "{link_local}":
    connect("host's link-local address", socket.getaddrinfo("{link_local}", {any6}, socket.AF_INET6)[0][4], socket.AF_INET6)
probe("cgroup root", lambda: open("/sys/fs/cgroup/cgroup.procs", "w").write(str(os.getpid())))
probe("system dirs", lambda: open("/usr/pwned", "w"))
def nested_userns():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
probe("nested user namespace", nested_userns)
"#,
        b_file = b_files[0],
        extra = extra.0,
        any4 = any4.local_addr().expect("addr").port(),
        any6 = any6
            .as_ref()
            .map_or(0, |l| l.local_addr().expect("addr").port()),
        link_local = link_local.clone().unwrap_or_default(),
    );
    let (a_id, status, log) = run(&host, KEY_A, None, &probe);
    assert_eq!(status, "completed", "{log}");
    assert_ne!(a_id, b_id);
    let v = verdicts(&log);
    assert_ne!(v.get("uid").map(String::as_str), Some("0"), "{log}");
    // The tenant has a way out (pasta's default route): the probes below
    // are refused by the isolation, not by a namespace without a network.
    assert_eq!(
        v.get("ipv4 default route").map(String::as_str),
        Some("True"),
        "the tenant's network has no IPv4 default route\nlog:\n{log}"
    );
    for what in [
        "signing key",
        "database",
        "host cmdline",
        "other tenant's file",
        "host api",
        "metadata",
        "agent socket",
        "host's second address",
        "cgroup root",
        "system dirs",
        "nested user namespace",
    ] {
        let got = v.get(what).map(String::as_str).unwrap_or("(not run)");
        assert!(got.starts_with("denied"), "{what}: {got}\nlog:\n{log}");
    }
    // Link-local and the metadata service's addresses: refused by the
    // prohibit routes and rule, each with their EACCES.
    let prohibited = |what: &str| {
        let got = v.get(what).map(String::as_str).unwrap_or("(not run)");
        assert!(
            got.starts_with("denied (EACCES "),
            "{what} must meet the prohibit route: {got}\nlog:\n{log}"
        );
    };
    prohibited("metadata");
    let ipv6 = v.get("ipv6 default route").map(String::as_str) == Some("True");
    if crate::common::have_or_skip(
        ipv6,
        "probing fd00:ec2::254 and the host's link-local address from a sandbox",
        "IPv6 on this machine (a default route pasta copies)",
    ) {
        prohibited("metadata over ipv6");
        if crate::common::have_or_skip(
            link_local.is_some(),
            "probing the host's link-local address from a sandbox",
            "an IPv6 link-local address on an interface other than lo",
        ) {
            prohibited("host's link-local address");
        }
    }
    // The host's own files are its user's alone.
    use std::os::unix::fs::PermissionsExt;
    for f in ["signing.key", "host.db"] {
        let mode = std::fs::metadata(host.data.join(f))
            .expect(f)
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{f} is mode {mode:o}");
    }
    release(&host, KEY_A, &a_id);
    release(&host, KEY_B, &b_id);
}

/// A process that leaves its session and tries to leave its cgroup, then
/// keeps writing into the workspace, is gone once the lease is released:
/// it dies (seen from the host), and the next tenant of the same slot
/// (checked: the host may run one sandbox, so a released one goes back to
/// the pool instead of giving way to a fresh one) never sees it.
#[test]
fn nothing_a_tenant_started_outlives_its_release() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &["--pool-size", "1", "--max-slots", "1"]);
    let marker = format!("ghost-{}-{:x}", std::process::id(), rand_u64());
    let ghost = format!(
        r#"
import os, sys, time
LOOP = """
import time
while True:
    for d in ("/workspace", "/tmp"):
        try:
            open(d + "/ghost", "w").write(str(time.time()))
        except OSError:
            pass
    time.sleep(0.05)
"""
if os.fork() == 0:
    os.setsid()
    for f in ("/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/unified/cgroup.procs"):
        try:
            open(f, "w").write(str(os.getpid()))
        except OSError:
            pass
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", LOOP, "{marker}"])
    os._exit(0)
time.sleep(3600)
"#
    );
    // The script keeps running: the Release, not the end of the run, must
    // end the ghost.
    let (a_id, _, _) = run_with(&host, KEY_A, None, &ghost, &["--no-wait"]);
    let slot_of_a = crate::common::eventually(Duration::from_secs(60), "the ghost writes", || {
        let slot = std::fs::read_dir(host.data.join("slots"))
            .ok()
            .and_then(|d| {
                d.flatten()
                    .find(|e| {
                        crate::common::slots::slot_workspace(&e.path())
                            .join("ghost")
                            .exists()
                    })
                    .map(|e| e.file_name().to_string_lossy().into_owned())
            });
        slot.ok_or_else(|| "no ghost file yet".to_owned())
    });
    assert!(
        !processes_mentioning(&marker).is_empty(),
        "the ghost does not run"
    );
    // --max-slots 1: no second sandbox while A holds the one.
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox", host.base),
        Some(KEY_B),
        Some(r#"{"server_names": []}"#),
    );
    assert_eq!(code, 503, "{v}");
    release(&host, KEY_A, &a_id);
    // The ghost dies, seen from the host's pid namespace.
    crate::common::eventually(Duration::from_secs(30), "the ghost is gone", || {
        let left = processes_mentioning(&marker);
        crate::common::when(left.is_empty(), || format!("still running:\n{left}"))
    });
    // The released slot is back in the pool (the only one), so B gets it.
    wait_metric(
        &host,
        r#"sandbox_host_pool_sandboxes{state="bare",profile=""}"#,
        1.0,
        Duration::from_secs(60),
    );
    let check = r#"
import os
print("workspace ghost:", os.path.exists("/workspace/ghost"))
print("tmp ghost:", os.path.exists("/tmp/ghost"))
"#;
    let check = format!("{SLOT_NAME}{check}");
    let (b_id, status, log) = run(&host, KEY_B, None, &check);
    assert_eq!(status, "completed", "{log}");
    assert_eq!(
        verdicts(&log).get("slot").map(String::as_str),
        Some(slot_of_a.as_str()),
        "B must lease the slot A released\n{log}"
    );
    assert!(log.contains("workspace ghost: False"), "{log}");
    assert!(log.contains("tmp ghost: False"), "{log}");
    release(&host, KEY_B, &b_id);
}

/// With `--on-release replace` the whole sandbox goes: no process of it is
/// left on the host, however it left its session or cgroup.
#[test]
fn replace_ends_every_process_of_the_sandbox() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &["--on-release", "replace"]);
    let marker = format!("ghost-{}", std::process::id());
    let ghost = format!(
        r#"
import os, sys, time
if os.fork() == 0:
    os.setsid()
    for f in ("/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/unified/cgroup.procs"):
        try:
            open(f, "w").write(str(os.getpid()))
        except OSError:
            pass
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(3600)", "{marker}"])
    os._exit(0)
time.sleep(3600)
"#
    );
    let (a_id, _, _) = run_with(&host, KEY_A, None, &ghost, &["--no-wait"]);
    crate::common::eventually(Duration::from_secs(60), "the ghost runs", || {
        crate::common::when(!processes_mentioning(&marker).is_empty(), || {
            "not yet".into()
        })
    });
    release(&host, KEY_A, &a_id);
    crate::common::eventually(Duration::from_secs(20), "the ghost is gone", || {
        let left = processes_mentioning(&marker);
        crate::common::when(left.is_empty(), || format!("still running:\n{left}"))
    });
}

/// One lease's global git config (HOME) never reaches the next lease's
/// git: the home is the lease's own, emptied at Release. The next lease
/// is on the same slot (checked: the host may run one sandbox).
#[test]
fn a_global_git_config_does_not_reach_the_next_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &["--pool-size", "1", "--max-slots", "1"]);
    let plant = r#"
import subprocess
subprocess.run(["git", "config", "--global", "core.fsmonitor", "touch /workspace/pwned-by-a"], check=True)
print("planted:", subprocess.run(["git", "config", "--global", "core.fsmonitor"], capture_output=True, text=True).stdout.strip())
"#;
    let plant = format!("{SLOT_NAME}{plant}");
    let (a_id, status, log) = run(&host, KEY_A, None, &plant);
    assert_eq!(status, "completed", "{log}");
    assert!(log.contains("planted: touch"), "{log}");
    let slot_of_a = verdicts(&log).get("slot").cloned().expect("slot");
    release(&host, KEY_A, &a_id);
    // Back in the pool (the only one), so B gets it.
    wait_metric(
        &host,
        r#"sandbox_host_pool_sandboxes{state="bare",profile=""}"#,
        1.0,
        Duration::from_secs(60),
    );
    let victim = r#"
import os, subprocess
os.makedirs("/workspace/repo", exist_ok=True)
subprocess.run(["git", "init", "-q", "/workspace/repo"], check=True)
subprocess.run(["git", "-C", "/workspace/repo", "status", "--short"], check=True)
got = subprocess.run(["git", "config", "--global", "core.fsmonitor"], capture_output=True, text=True).stdout.strip()
print("inherited config:", repr(got))
print("pwned:", os.path.exists("/workspace/pwned-by-a"))
"#;
    let victim = format!("{SLOT_NAME}{victim}");
    let (b_id, status, log) = run(&host, KEY_B, None, &victim);
    assert_eq!(status, "completed", "{log}");
    assert_eq!(
        verdicts(&log).get("slot"),
        Some(&slot_of_a),
        "B must lease the slot A released\n{log}"
    );
    assert!(log.contains("inherited config: ''"), "{log}");
    assert!(log.contains("pwned: False"), "{log}");
    release(&host, KEY_B, &b_id);
}

/// A sandbox names its own users, as a container image does: the tenant
/// is `sandbox` (uid 1000, which on a host is its first person's), `ls -l`
/// shows its files as `sandbox sandbox`, and the user and group databases
/// (and their backups) hold system accounts, the tenant and nobody: no
/// account of a person of the host, no group member list, no subordinate
/// id range. Without the slot's own database the tenant is named after
/// the host's uid 1000 (or not at all).
#[test]
fn the_sandbox_names_its_own_users_and_none_of_the_hosts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let script = r#"
import grp, os, pwd, subprocess
out = lambda *a: subprocess.run(list(a), capture_output=True, text=True).stdout.strip()
print("user:", out("id", "-un"))
print("group:", out("id", "-gn"))
open("/workspace/mine.txt", "w").write("x")
print("ls:", " ".join(out("ls", "-l", "/workspace/mine.txt").split()[2:4]))
print("users:", ",".join(sorted(f"{p.pw_name}={p.pw_uid}" for p in pwd.getpwall())))
print("members:", ",".join(sorted(m for g in grp.getgrall() for m in g.gr_mem)) or "none")
print("subuid:", repr(open("/etc/subuid").read()) if os.path.exists("/etc/subuid") else "absent")
names = lambda f: ",".join(sorted(l.split(":")[0] for l in open(f))) if os.path.exists(f) else "absent"
print("backup:", names("/etc/passwd-"))
print("db:", names("/etc/passwd"))
"#;
    let (id, status, log) = run(&host, KEY_A, None, script);
    assert_eq!(status, "completed", "{log}");
    let v = verdicts(&log);
    let get = |k: &str| v.get(k).map(String::as_str).unwrap_or_default();
    assert_eq!(get("user"), "sandbox", "{log}");
    assert_eq!(get("group"), "sandbox", "{log}");
    assert_eq!(get("ls"), "sandbox sandbox", "{log}");
    let users: Vec<(&str, u32)> = get("users")
        .split(',')
        .filter_map(|e| e.split_once('='))
        .map(|(n, u)| (n, u.parse().expect("a uid")))
        .collect();
    for want in [("root", 0), ("sandbox", 1000), ("nobody", 65534)] {
        assert!(users.contains(&want), "{want:?} in {users:?}");
    }
    // Nothing but system accounts besides the tenant and nobody: no
    // person of the host (Debian's UID_MIN is 1000).
    assert!(
        users
            .iter()
            .all(|(n, u)| *u < 1000 || matches!(*n, "sandbox" | "nobody")),
        "{users:?}"
    );
    let host_people: Vec<String> = std::fs::read_to_string("/etc/passwd")
        .expect("the host's /etc/passwd")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let uid: u32 = f.get(2)?.parse().ok()?;
            ((1000..65534).contains(&uid)).then(|| f[0].to_owned())
        })
        .collect();
    assert!(
        !users
            .iter()
            .any(|(n, _)| host_people.iter().any(|p| p == n)),
        "a person of the host in the sandbox: {users:?} (host: {host_people:?})"
    );
    assert_eq!(get("members"), "none", "{log}");
    assert!(matches!(get("subuid"), "''" | "absent"), "{log}");
    assert!(
        matches!(get("backup"), b if b == get("db") || b == "absent"),
        "{log}"
    );
    release(&host, KEY_A, &id);
}

/// Python printing `slot: <id>`: the slot's name, from its agent's
/// (PID 1's) `--name`.
const SLOT_NAME: &str = r#"
_argv = open("/proc/1/cmdline", "rb").read().split(b"\0")
print("slot:", _argv[_argv.index(b"--name") + 1].decode())
"#;

/// The host refuses an API key on its command line (every process listing
/// shows it) and says where to put it instead.
#[test]
fn api_keys_never_go_on_the_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(&*crate::common::bins::HOST)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--api-key",
            "a-key-of-sixteen-chars",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--manifest")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/servers.toml"))
        .output()
        .expect("sandbox-host");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--api-key-file") && err.contains("SANDBOX_HOST_API_KEY"),
        "{err}"
    );
}

/// An isolated host refuses a data dir below a directory other users
/// cannot pass through (each sandbox's root mounts its directories from
/// there), and says what to do.
#[test]
fn a_data_dir_below_a_private_directory_is_refused_clearly() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let private = dir.path().join("private");
    std::fs::create_dir(&private).expect("mkdir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let out = Command::new(&*crate::common::bins::HOST)
        .args(["--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(private.join("data"))
        .arg("--manifest")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/servers.toml"))
        .output()
        .expect("sandbox-host");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&*private.display().to_string()) && err.contains("chmod o+x"),
        "{err}"
    );
}

/// packages.txt never changes the host: on the process backend a package
/// already installed passes, and anything else is refused, saying why,
/// before the script runs.
#[test]
fn packages_txt_never_installs_on_the_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let script = "print('the script ran')\n";
    let (id, status, log) = run_with(&host, KEY_A, None, script, &["--packages", "curl"]);
    assert_eq!(status, "completed", "{log}");
    assert!(log.contains("already installed"), "{log}");
    let (_, status, log) = run_with(
        &host,
        KEY_A,
        Some(&id),
        script,
        // No such package anywhere: whatever happens, this host gets none.
        &["--packages", "zz-sandbox-no-such-package", "--name", "more"],
    );
    assert_eq!(status, "failed", "{log}");
    assert!(
        log.contains("zz-sandbox-no-such-package")
            && log.contains("read-only")
            && !log.contains("the script ran"),
        "{log}"
    );
    release(&host, KEY_A, &id);
}

/// A sandbox's processes and memory are bounded (`--slot-pids-max`,
/// `--slot-memory-max`): a fork loop stops at the limit, and a child that
/// grabs more memory than the slot has is killed, while the sandbox lives.
#[test]
fn a_sandbox_cannot_exceed_its_pids_and_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(
        dir.path(),
        &["--slot-pids-max", "150", "--slot-memory-max", "402653184"],
    );
    let script = r#"
import os, signal, subprocess, sys, time
kids = []
try:
    for _ in range(400):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    print("fork refused:", e.errno)
print("forked:", len(kids))
for k in kids:
    os.kill(k, signal.SIGKILL)
    os.waitpid(k, 0)
hog = subprocess.run([sys.executable, "-c", "b = bytearray(1024 * 1024 * 1024); b[::4096] = b'x' * (len(b) // 4096); print('survived')"])
print("hog ended:", hog.returncode)
"#;
    let (id, status, log) = run(&host, KEY_A, None, script);
    assert_eq!(status, "completed", "{log}");
    let forked: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("forked: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{log}"));
    assert!(forked < 150, "{forked} processes under pids.max 150\n{log}");
    assert!(log.contains("fork refused"), "{log}");
    assert!(
        log.contains("hog ended: -9"),
        "the hog must be killed\n{log}"
    );
    assert!(!log.contains("survived"), "{log}");
    release(&host, KEY_A, &id);
}

/// A second address of this host (on `lo`, for the test's lifetime).
struct ExtraAddress(String);

impl ExtraAddress {
    fn add() -> ExtraAddress {
        let a = format!(
            "10.77.{}.{}",
            std::process::id() % 250,
            1 + std::process::id() % 200
        );
        let st = Command::new("ip")
            .args(["addr", "add", &format!("{a}/32"), "dev", "lo"])
            .status()
            .expect("ip addr add");
        assert!(st.success(), "ip addr add {a}");
        ExtraAddress(a)
    }
}

impl Drop for ExtraAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["addr", "del", &format!("{}/32", self.0), "dev", "lo"])
            .status();
    }
}

/// This host's first IPv6 link-local address with its interface
/// (`fe80::…%eth0`), if it has one.
fn host_link_local() -> Option<String> {
    let out = Command::new("ip")
        .args(["-6", "-o", "addr", "show", "scope", "link"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (iface, addr) = (f.get(1)?, f.get(3)?);
        let addr = addr.split('/').next()?;
        (*iface != "lo").then(|| format!("{addr}%{iface}"))
    })
}

/// `env` as a tenant sees it: through the terminal server, both code
/// executors (Klavis's and the code runner) and an execution (probe, text).
fn env_probes(host: &Host) -> Vec<(String, String)> {
    let py = "import os; print('\\n'.join(f'{k}={v}' for k, v in os.environ.items()))";
    let calls = serde_json::json!([
        ["terminal", "run_command", {"command": "env"}],
        ["code-executor", "run_python_code", {"code": py}],
        ["code-runner", "run-code", {"code": py, "languageId": "python"}],
    ]);
    let out = Command::new("python3")
        .arg(TASKS)
        .arg(&host.base)
        .arg(KEY_A)
        .args(["paths", "-", &calls.to_string()])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "benchmark_tasks.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut probes: Vec<(String, String)> = v["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            assert_eq!(r["is_error"], false, "{r}");
            let text = r["text"].as_str().unwrap_or_default().to_owned();
            (r["call"][0].as_str().unwrap_or_default().to_owned(), text)
        })
        .collect();
    let (_, status, log) = run(host, KEY_A, None, &format!("{py}\nprint('ok: done')\n"));
    assert_eq!(status, "completed", "{log}");
    probes.push(("the execution API".to_owned(), log));
    probes
}

/// Variables a sandbox sets itself, whose values may equal the host's by
/// coincidence (`LANG=C.UTF-8` on both).
const SANDBOX_OWN: &[&str] = &[
    "LANG",
    "PYTHONUNBUFFERED",
    "PYTHONIOENCODING",
    "PYTHONHASHSEED",
    "DEBIAN_FRONTEND",
    "SHLVL",
    "_",
];

/// What of the host a sandbox's `env` text shows: the marker (in the
/// host's PATH, user and TMPDIR), a variable with the host's own value
/// (but [`SANDBOX_OWN`]), and
/// (isolated) the host's data dir or home in any value.
fn host_traces(text: &str, host: &Host, marker: &str, isolated: bool) -> Vec<String> {
    let data = host.data.display().to_string();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    text.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, v)| {
            let same_as_host = !SANDBOX_OWN.contains(k) && std::env::var(k).is_ok_and(|h| h == *v);
            v.contains(marker)
                || same_as_host
                || (isolated && (v.contains(&data) || v.split(':').any(|p| p.starts_with(&home))))
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// The real uid of a process.
fn uid_of(pid: i32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().next().map(str::to_owned)
}

/// Whether `pid` of a slot's process `tree` is its agent's launcher or
/// runs as its agent does (the agent and the jobs it runs for itself, such
/// as resolving the executions' interpreter), which use the host's PATH to
/// find their tools and pass none of it on. A tenant cannot read their
/// environment.
fn runs_as_agent(pid: i32, tree: &[i32]) -> bool {
    let comm = |p: i32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
    if comm(pid).trim() == "bwrap" {
        return true;
    }
    let agent_uids: Vec<String> = tree
        .iter()
        .filter(|p| comm(**p).trim() == "sandbox-agent")
        .filter_map(|p| uid_of(*p))
        .collect();
    uid_of(pid).is_some_and(|u| agent_uids.contains(&u))
}

/// Agents start with an allow-listed environment, never the host's: an
/// operator's secret in the host's environment is in no process of a
/// sandbox (read from the host, so what a tenant could make the agent
/// quote is covered too), nor in what a tenant reads of `/proc/1/environ`,
/// `/proc/self/environ`, `env` or (isolated) any `/proc/*/environ` it can
/// open; isolated or not. And nothing else of the host either (issue 50):
/// its PATH (a marker directory put first), its user, its TMPDIR are in no
/// process of an isolated sandbox but those running as its agent (which
/// finds its tools on the host's PATH and passes none of it on; without
/// isolation every process is the host's user), and `env` through the
/// terminal server, both
/// code executors and the execution API shows none of them, nor (isolated)
/// the host's data dir or home.
#[test]
fn agents_never_get_the_hosts_environment() {
    let canary = format!("canary-{:016x}", rand_u64());
    let marker = format!("hostmark-{:016x}", rand_u64());
    for extra in [&[][..], &["--isolation", "none"][..]] {
        let dir = tempfile::tempdir().expect("tempdir");
        let host_tmp = dir.path().join(format!("tmp-{marker}"));
        std::fs::create_dir(&host_tmp).expect("host TMPDIR");
        let host_path = format!(
            "/opt/{marker}/bin:{}",
            std::env::var("PATH").unwrap_or_default()
        );
        let host_user = format!("user-{marker}");
        let host = Host::start_env(
            dir.path(),
            extra,
            &[
                ("SANDBOX_TEST_OPERATOR_SECRET", &canary),
                // First in the environment's order: in the head of
                // anything that quotes it (a truncated error message).
                ("AAAA_SANDBOX_TEST_OPERATOR_SECRET", &canary),
                ("PATH", &host_path),
                ("USER", &host_user),
                ("TMPDIR", &host_tmp.display().to_string()),
            ],
        );
        let isolated = extra.is_empty();
        // The servers' probes on the isolated backend (the default; the
        // environment is built the same way without isolation, which the
        // execution below reads too).
        let probes = if isolated {
            env_probes(&host)
        } else {
            Vec::new()
        };
        for (probe, text) in probes {
            let traces = host_traces(&text, &host, &marker, isolated);
            assert!(
                traces.is_empty() && !text.contains(&canary),
                "{extra:?}: {probe} shows the host's environment: {traces:?}\n{text}"
            );
            assert!(text.contains("USER=sandbox"), "{extra:?}: {probe}:\n{text}");
        }
        let script = r#"
import glob, os, subprocess, time
def show(name, f):
    try:
        print(f"{name}: {f()!r}")
    except Exception as e:
        print(f"{name}: unreadable ({type(e).__name__})")
show("pid1 environ", lambda: open("/proc/1/environ", "rb").read())
show("self environ", lambda: open("/proc/self/environ", "rb").read())
show("env", lambda: subprocess.run(["env"], capture_output=True, text=True).stdout)
for p in glob.glob("/proc/[0-9]*/environ"):
    show(p, lambda: open(p, "rb").read())
print("ok: done")
time.sleep(5)
"#;
        let (id, _, _) = run_with(
            &host,
            KEY_A,
            None,
            script,
            &["--servers", "terminal", "--no-wait"],
        );
        // While the script and the terminal server run: every process of
        // every slot, read from the host.
        let agents = host.agents();
        assert!(!agents.is_empty(), "no agent");
        let mut seen = 0;
        for a in agents {
            let tree = process_tree(a);
            for &pid in &tree {
                if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
                    seen += 1;
                    let env = String::from_utf8_lossy(&env);
                    assert!(
                        !isolated || runs_as_agent(pid, &tree) || !env.contains(&marker),
                        "{extra:?}: process {pid} of a sandbox ({}) has the host's PATH, user or TMPDIR: {env}",
                        std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                            .unwrap_or_default()
                            .replace('\0', " ")
                    );
                    assert!(
                        !env.contains(&canary),
                        "{extra:?}: process {pid} of a sandbox ({}) has the host's secret",
                        std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                            .unwrap_or_default()
                            .replace('\0', " ")
                    );
                }
            }
        }
        assert!(
            seen > 1,
            "{extra:?}: only {seen} processes of sandboxes read"
        );
        let (_, status, log) = run_with(&host, KEY_A, Some(&id), script, &["--name", "again"]);
        assert_eq!(status, "completed", "{log}");
        assert!(log.contains("ok: done"), "{log}");
        assert!(log.contains("self environ: b'"), "{log}");
        // Without isolation a tenant is the host's user and reads the
        // host's own /proc/<pid>/environ (documented): only its own
        // environment and PID 1's count there.
        let leaked: Vec<&str> = log
            .lines()
            .filter(|l| isolated || !l.starts_with("/proc/"))
            .filter(|l| l.contains(&canary))
            .collect();
        assert!(
            leaked.is_empty(),
            "{extra:?}: a tenant read the host's secret:\n{leaked:?}"
        );
        let own: Vec<&str> = log
            .lines()
            .filter(|l| l.starts_with("self environ") || l.starts_with("env"))
            .filter(|l| l.contains(&marker))
            .collect();
        assert!(
            own.is_empty(),
            "{extra:?}: an execution's environment has the host's:\n{own:?}"
        );
        // The attack of issue 35: packages.txt a symlink to the agent's
        // environment, which the agent reads as root and quotes in the log.
        // Refused or run, no answer carries the secret.
        let archive = crate::common::ws::gzip(
            &crate::common::ws::Tar::new()
                .file("main.py", b"print('ran')\n")
                .symlink("packages.txt", "/proc/1/environ")
                .end(),
        );
        let got = try_run_archive(&host, KEY_A, &id, "environ", &archive);
        let text = format!("{got:?}");
        assert!(
            !text.contains(&canary),
            "{extra:?}: the host's secret through packages.txt:\n{text}"
        );
        release(&host, KEY_A, &id);
    }
}

/// 64 random bits from the OS.
fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .expect("/dev/urandom");
    u64::from_le_bytes(b)
}

/// With the data dir on a filesystem of its own (docs/security.md: the
/// root field of a bind mount in /proc/self/mountinfo is the path inside
/// its filesystem, which no bubblewrap option changes), a tenant reading
/// its mountinfo finds no trace of the data dir's path.
#[test]
fn a_tenant_never_reads_the_data_dir_path_in_mountinfo() {
    if !crate::common::root_or_skip("mounting a tmpfs data dir") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let _data = Tmpfs::mount(&dir.path().join("data"));
    let host = Host::start(dir.path(), &[]);
    let data = host.data.display().to_string();
    let script = "print(open('/proc/self/mountinfo').read())\n";
    let (id, status, log) = run(&host, KEY_A, None, script);
    assert_eq!(status, "completed", "{log}");
    assert!(log.contains(" /workspace "), "{log}");
    assert!(!log.contains(&data), "the data dir {data} in:\n{log}");
    release(&host, KEY_A, &id);
}

/// A tmpfs mounted at a directory for the test's lifetime.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Tmpfs {
        std::fs::create_dir_all(at).expect("mkdir");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=0755", "sandbox-data"])
            .arg(at)
            .status()
            .expect("mount");
        assert!(st.success(), "mount -t tmpfs {}", at.display());
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// An id block claimed by a host that died (its slot directory left
/// behind, no process of the block's ids running) is taken by the next
/// host, and `/metrics` counts the blocks claimed machine-wide.
#[test]
fn an_id_block_of_a_host_that_died_is_taken_again() {
    if !crate::common::root_or_skip("claiming an id block in /run/sandbox-host") {
        return;
    }
    // Hosts of tests running beside this one take blocks from the same
    // registry, the lowest free first, as this one does: one may take the
    // dead claim first, or free a lower block this host takes instead.
    // Neither says anything: try again with a new claim and a new host.
    let mut last = String::new();
    for attempt in 1..=5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let left = dir.path().join("slot-of-a-dead-host");
        std::fs::create_dir(&left).expect("mkdir");
        let claim = DeadClaim::make(&left);
        // One slot: the lowest free block, the dead claim's.
        let host = Host::start(dir.path(), &["--pool-size", "1"]);
        let slots = host.data.join("slots");
        let (slot, taken) = crate::common::eventually(
            Duration::from_secs(60),
            "the host's slot takes a block",
            || {
                let slot = std::fs::read_dir(&slots)
                    .map_err(|e| e.to_string())?
                    .flatten()
                    .next()
                    .ok_or("no slot yet")?
                    .path();
                let block = std::fs::read_to_string(slot.join("uid_block"))
                    .map_err(|e| format!("{}: {e}", slot.display()))?;
                let block: u32 = block
                    .trim()
                    .parse()
                    .map_err(|e| format!("{block:?}: {e}"))?;
                Ok((slot, block))
            },
        );
        let target = std::fs::read_link(&claim.link).unwrap_or_default();
        if taken == claim.block {
            // This host's, for this slot, and the owner file says so.
            assert_eq!(target, slot, "block {} links to", claim.block);
            let owner = std::fs::read_to_string(claim.link.with_extension("owner"))
                .expect("the block's owner");
            let host_pid = host.pid().expect("the host's pid");
            assert_eq!(
                owner.split_whitespace().next(),
                Some(host_pid.to_string().as_str()),
                "the owner of block {}: {owner:?}",
                claim.block
            );
            assert!(metric(&host, "sandbox_host_uid_blocks_claimed") >= 1.0);
            assert!(metric(&host, "sandbox_host_uid_blocks") >= 1.0);
            let (_, m) = http("GET", &format!("{}/metrics", host.base), Some(KEY_A), None);
            assert!(
                m.as_str()
                    .unwrap_or_default()
                    .contains("sandbox_host_uid_blocks_exhausted_total 0"),
                "{m}"
            );
            return;
        }
        // Not taken: another host took it first, or freed a lower block
        // this host took instead, or a process of the block's ids still
        // ran then (a slot of another test's host exiting), which keeps a
        // dead claim claimed by design. A host that never takes a dead
        // claim again fails every attempt.
        let why = if taken < claim.block {
            format!("block {taken} was freed meanwhile, and taken")
        } else if target != claim.target {
            format!(
                "another host took block {} first ({})",
                claim.block,
                target.display()
            )
        } else {
            format!(
                "the host took block {taken} and left the dead host's block {} to it",
                claim.block
            )
        };
        eprintln!("attempt {attempt}: {why}: again");
        last = why;
    }
    panic!("five attempts, the dead claim never taken again; the last: {last}");
}

/// A claim of the lowest free id block, in the machine's registry, by a
/// host that is gone, for a slot directory that still exists; removed
/// at the end if it is still there.
struct DeadClaim {
    block: u32,
    link: std::path::PathBuf,
    target: std::path::PathBuf,
}

impl DeadClaim {
    fn make(target: &Path) -> DeadClaim {
        let reg = Path::new("/run/sandbox-host/uid-blocks");
        std::fs::create_dir_all(reg).expect("registry");
        let lock = std::fs::File::create(reg.join(".lock")).expect("lock");
        let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .expect("flock");
        let block = (0..64u32)
            .find(|b| reg.join(b.to_string()).symlink_metadata().is_err())
            .expect("a free block");
        let link = reg.join(block.to_string());
        std::os::unix::fs::symlink(target, &link).expect("claim");
        let mut gone = Command::new("true").spawn().expect("true");
        let pid = gone.id();
        gone.wait().expect("wait");
        std::fs::write(link.with_extension("owner"), format!("{pid} 1\n")).expect("owner");
        DeadClaim {
            block,
            link,
            target: target.to_owned(),
        }
    }
}

impl Drop for DeadClaim {
    fn drop(&mut self) {
        if std::fs::read_link(&self.link).is_ok_and(|t| t == self.target) {
            let _ = std::fs::remove_file(&self.link);
            let _ = std::fs::remove_file(self.link.with_extension("owner"));
        }
    }
}

/// `/metrics` (pool and lease counts) needs an API key on the API's
/// address; with `--metrics-listen` it is served without one on that
/// address alone, and the API's address answers 404.
#[test]
fn metrics_need_a_key_or_an_address_of_their_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &["--pool-size", "0"]);
    let url = format!("{}/metrics", host.base);
    let (code, v) = http("GET", &url, None, None);
    assert_eq!(code, 401, "{v}");
    let (code, v) = http("GET", &url, Some("not-a-key-0123456789"), None);
    assert_eq!(code, 401, "{v}");
    let (code, v) = http("GET", &url, Some(KEY_B), None);
    assert_eq!(code, 200, "{v}");
    assert!(
        v.as_str()
            .unwrap_or_default()
            .contains("sandbox_host_pool_sandboxes"),
        "{v}"
    );
    drop(host);
    // An address of its own (a port that was free a moment ago).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{port}");
    let host = Host::start(dir.path(), &["--pool-size", "0", "--metrics-listen", &addr]);
    let (code, v) = http("GET", &format!("http://{addr}/metrics"), None, None);
    assert_eq!(code, 200, "{v}");
    assert!(
        v.as_str()
            .unwrap_or_default()
            .contains("sandbox_host_pool_sandboxes"),
        "{v}"
    );
    let (code, v) = http("GET", &format!("{}/metrics", host.base), Some(KEY_A), None);
    assert_eq!(code, 404, "{v}");
    // Nothing else of the API there.
    let (code, _) = http(
        "GET",
        &format!("http://{addr}/local-sandbox"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 404);
}
