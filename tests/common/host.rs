//! `sandbox-host` as the tests start it: a host on a loopback port with two
//! owners' API keys, and small HTTP helpers (curl, the httpx client).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::AGENT;
use super::mcp::shipped_manifest;

pub use super::HOST;
pub const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/host_client.py");
pub const EXEC_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/exec_client.py");
pub const KEY_A: &str = "key-a-0123456789abcdef";
pub const KEY_B: &str = "key-b-0123456789abcdef";

pub struct Host {
    child: Option<Child>,
    pub base: String,
    pub data: PathBuf,
}

impl Host {
    /// A host with the process backend running the shipped manifest.
    pub fn start(dir: &Path, extra: &[&str]) -> Host {
        Host::start_env(dir, extra, &[])
    }

    /// [`Host::start`] with extra environment.
    pub fn start_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Host {
        let manifest = dir.join("servers.toml");
        if !manifest.exists() {
            // The state root stays as shipped: the host gives each agent its own.
            std::fs::write(&manifest, shipped_manifest(Path::new("${state_root}")))
                .expect("manifest");
        }
        let mut args: Vec<String> = vec![
            "--agent-bin".into(),
            AGENT.to_string(),
            "--manifest".into(),
            manifest.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Host::start_with_env(dir, &args, env)
    }

    /// A host with one idle sandbox, the test's API keys, and `args`.
    pub fn start_with(dir: &Path, args: &[String]) -> Host {
        Host::start_with_env(dir, args, &[])
    }

    /// Like [`Host::start_with`], with extra environment for the host (and
    /// so for its agents).
    pub fn start_with_env(dir: &Path, args: &[String], env: &[(&str, &str)]) -> Host {
        let keys = dir.join("keys");
        std::fs::write(&keys, format!("{KEY_A} alice\n{KEY_B} bob\n")).expect("keys");
        let data = dir.join("data");
        // Appended to across restarts; shown when the host fails to start.
        let log_path = dir.join("host.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("host.log");
        let mut child = Command::new(&*HOST)
            .args(["--listen", "127.0.0.1:0", "--pool-size", "1"])
            .args(sandbox_read_only())
            // Recording catalogs starts every server once (a minute of
            // both cores): only the tests of catalogs ask for it (a later
            // --catalogs wins).
            .args(["--catalogs", "off"])
            .arg("--data-dir")
            .arg(&data)
            .arg("--api-key-file")
            .arg(&keys)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("sandbox-host");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("base URL line");
        let base = line
            .trim()
            .strip_prefix("sandbox-host: base URL ")
            .unwrap_or_else(|| {
                panic!(
                    "unexpected first line {line:?}; the host's log:\n{}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                )
            })
            .to_owned();
        Host {
            child: Some(child),
            base,
            data,
        }
    }

    /// The host process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
    }

    /// Pids of the slots' main processes this host started (agents, or
    /// run-qemu.sh), alive or not; each leads its own process group.
    pub fn agents(&self) -> Vec<i32> {
        super::slots::agents(&self.data)
    }

    /// The end of the host's log and of each slot's `agent.log` (a VM's
    /// console): what a failing wait shows.
    pub fn log_tails(&self) -> String {
        let mut out = format!(
            "the end of the host's log:\n{}",
            tail(&self.data.with_file_name("host.log"), 6000)
        );
        let slots = std::fs::read_dir(self.data.join("slots"))
            .into_iter()
            .flatten();
        for e in slots.flatten() {
            let log = e.path().join("agent.log");
            if log.exists() {
                let t = tail(&log, 3000);
                out.push_str(&format!("\nthe end of {}:\n{t}", log.display()));
            }
        }
        out
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop();
        // Sandboxes outlive the host on purpose (restarts); not the test.
        super::slots::end_all(&self.data);
    }
}

/// `pgrep -a -f s`: the processes whose command line mentions `s`.
pub fn processes_mentioning(s: &str) -> String {
    let out = Command::new("pgrep")
        .args(["-a", "-f", s])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (up to 30 s) until no process mentions the host's data dir (no
/// agent, run-qemu.sh or vhost-device-vsock of its slots) or any of
/// `also`.
pub fn assert_nothing_left(host: &Host, also: &[&str]) {
    let data = host.data.display().to_string();
    super::eventually(
        std::time::Duration::from_secs(30),
        "nothing of the host is left running",
        || {
            let left: String = std::iter::once(data.as_str())
                .chain(also.iter().copied())
                .map(processes_mentioning)
                .collect();
            super::when(left.is_empty(), || {
                format!(
                    "left running:\n{left}\nthe end of the host's log:\n{}",
                    tail(&host.data.with_file_name("host.log"), 6000)
                )
            })
        },
    )
}

pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
}

pub fn py(host: &Host, key: &str, args: &[&str]) -> Value {
    let out = Command::new("python3")
        .arg(CLIENT)
        .arg(&host.base)
        .arg(key)
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "host_client.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client JSON")
}

/// One HTTP request with curl: (status, body).
pub fn http(method: &str, url: &str, key: Option<&str>, body: Option<&str>) -> (u16, Value) {
    let mut c = Command::new("curl");
    c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method, url]);
    if let Some(k) = key {
        c.args(["-H", &format!("authorization: Bearer {k}")]);
    }
    if let Some(b) = body {
        c.args(["-H", "content-type: application/json", "-d", b]);
    }
    answer(&c.output().expect("curl"))
}

/// curl's output with `-w "\n%{http_code}"`: (status, body).
fn answer(out: &std::process::Output) -> (u16, Value) {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("status");
    (
        code.parse().expect("code"),
        serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())),
    )
}

/// `PUT url` with `body`, as a client PUTs to a signed upload URL (no
/// key): (status, body).
pub fn put(url: &str, body: &[u8]) -> (u16, Value) {
    use std::io::Write;
    let mut c = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", "PUT"])
        .args(["-H", "content-type: application/gzip"])
        .args(["--data-binary", "@-", url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl");
    if let Some(mut stdin) = c.stdin.take() {
        stdin.write_all(body).expect("the body to curl");
    }
    answer(&c.wait_with_output().expect("curl"))
}

/// A tar.gz holding `main.py`, an execution archive.
pub fn script_archive(main_py: &str) -> Vec<u8> {
    super::ws::gzip(
        &super::ws::Tar::new()
            .file("main.py", main_py.as_bytes())
            .end(),
    )
}

/// Uploads archive `archive` (tar.gz) as execution `name` of sandbox `id`
/// and starts it (upload URL, PUT, execute), without waiting for it; a
/// refusal (of the PUT or the execute) is `Err` with the answer.
pub fn try_start_archive(
    host: &Host,
    key: &str,
    id: &str,
    name: &str,
    archive: &[u8],
) -> Result<(), String> {
    let b = format!("{}/local-sandbox/{id}", host.base);
    let body = format!(r#"{{"execution_name": "{name}"}}"#);
    let (code, u) = http(
        "POST",
        &format!("{b}/execution-upload-url"),
        Some(key),
        Some(&body),
    );
    assert_eq!(code, 200, "{u}");
    let (code, v) = put(u["upload_url"].as_str().expect("upload_url"), archive);
    if code != 200 {
        return Err(format!("PUT: {code} {v}"));
    }
    let (code, v) = http("POST", &format!("{b}/execute"), Some(key), Some(&body));
    if code != 200 {
        return Err(format!("execute: {code} {v}"));
    }
    Ok(())
}

/// Waits for execution `name` of sandbox `id` to end: (its Klavis status,
/// its log).
pub fn wait_execution(host: &Host, key: &str, id: &str, name: &str) -> (String, String) {
    let b = format!("{}/local-sandbox/{id}", host.base);
    super::eventually(
        std::time::Duration::from_secs(120),
        "the execution ends",
        || {
            let (code, v) = http(
                "GET",
                &format!("{b}/execution-logs?execution_name={name}"),
                Some(key),
                None,
            );
            let status = v["status"].as_str().unwrap_or_default().to_owned();
            super::when(
                code == 200 && (status == "completed" || status == "failed"),
                || format!("{code} {v}"),
            )
            .map(|()| (status, v["logs"].as_str().unwrap_or_default().to_owned()))
        },
    )
}

/// Runs execution archive `archive` (tar.gz) as execution `name` of
/// sandbox `id`, as [`run_script`] does, but a refusal (of the PUT or the
/// execute) is `Err` with the answer, not a failed test.
pub fn try_run_archive(
    host: &Host,
    key: &str,
    id: &str,
    name: &str,
    archive: &[u8],
) -> Result<(String, String), String> {
    try_start_archive(host, key, id, name, archive)?;
    Ok(wait_execution(host, key, id, name))
}

/// Starts `main_py` as execution `name` of sandbox `id` through the host's
/// execution endpoints, without waiting for it.
pub fn start_script(host: &Host, key: &str, id: &str, name: &str, main_py: &str) {
    if let Err(e) = try_start_archive(host, key, id, name, &script_archive(main_py)) {
        panic!("starting execution {name}: {e}");
    }
}

/// Runs `main_py` as execution `name` of sandbox `id` through the host's
/// execution endpoints (upload URL, PUT, execute) and waits for its end:
/// (its Klavis status, its log).
pub fn run_script(host: &Host, key: &str, id: &str, name: &str, main_py: &str) -> (String, String) {
    start_script(host, key, id, name, main_py);
    wait_execution(host, key, id, name)
}

/// Acquires with `body` as `key`'s owner; asserts 201 and returns the
/// answer.
pub fn acquire(host: &Host, key: &str, body: &str) -> Value {
    let (code, a) = http(
        "POST",
        &format!("{}/local-sandbox", host.base),
        Some(key),
        Some(body),
    );
    assert_eq!(code, 201, "{body}: {a}");
    a
}

/// The `server_name`s of an Acquire answer's servers, sorted.
pub fn server_names(acquired: &Value) -> Vec<&str> {
    let mut names: Vec<&str> = acquired["servers"]
        .as_array()
        .map(|v| v.iter().filter_map(|s| s["server_name"].as_str()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// `DELETE /local-sandbox/{id}`, which must be accepted (the release
/// itself ends in the background).
pub fn release(host: &Host, key: &str, id: &str) {
    let (code, v) = http(
        "DELETE",
        &format!("{}/local-sandbox/{id}", host.base),
        Some(key),
        None,
    );
    assert_eq!(code, 200, "release of {id}: {v}");
}

/// What `host_client.py notebook` reports when the Klavis notebook's
/// steps went as in the notebook: the dump lists exactly its three files
/// with their sizes, and the release answers the notebook's message.
pub fn assert_notebook_outcome(v: &Value) {
    let id = v["acquire"]["local_sandbox_id"].as_str().expect("id");
    assert_eq!(v["acquire_status"], 201, "{v}");
    assert_eq!(v["upload_status"], 200, "{v}");
    assert_eq!(v["initialize"]["sandbox_id"], id, "{v}");
    assert_eq!(v["initialize"]["status"], "occupied", "{v}");
    // Klavis's text, word for word.
    assert_eq!(
        v["initialize"]["message"], "Extracted archive from GCS to workspace",
        "{v}"
    );
    assert_eq!(
        v["members"],
        serde_json::json!([
            [".", 0],
            ["./config.json", 33],
            ["./hello.txt", 32],
            ["./notes.md", 25]
        ]),
        "{v}"
    );
    assert_eq!(
        v["release"]["message"],
        format!(
            "Local sandbox release started for {id}: it will be released asynchronously in background."
        )
    );
}

/// A raw MCP `initialize` through the host's MCP URL of `server` in sandbox
/// `id` is answered with the server's info.
pub fn assert_mcp_initializes(base: &str, server: &str, id: &str) {
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}"#;
    let (code, v) = http(
        "POST",
        &format!("{base}/{server}/mcp/?local_sandbox_id={id}"),
        Some(KEY_A),
        Some(init),
    );
    assert_eq!(code, 200, "{v}");
    assert!(v["result"]["serverInfo"].is_object(), "{v}");
}

/// The official Python MCP client, through the host's `mcp_server_url`,
/// lists the filesystem server's tools and writes then reads a file.
pub fn assert_mcp_client_works(host: &Host) {
    let v = py(host, KEY_A, &["mcp"]);
    assert!(
        v["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|n| n == "read_text_file")),
        "{v}"
    );
    assert_eq!(v["text"], "through the host", "{v}");
}

/// The value of one sample on the host's `/metrics` (0 when absent).
pub fn metric(host: &Host, sample: &str) -> f64 {
    // On the API's address /metrics needs a key.
    let (code, v) = http("GET", &format!("{}/metrics", host.base), Some(KEY_A), None);
    assert_eq!(code, 200, "{v}");
    let text = v.as_str().unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits until a `/metrics` sample reads `want`.
pub fn wait_metric(host: &Host, sample: &str, want: f64, within: std::time::Duration) {
    wait_host(host, within, sample, || {
        let got = metric(host, sample);
        super::when(got == want, || format!("{got}, not {want}"))
    });
}

/// [`super::eventually`] on a host: on timeout the failure carries the end
/// of the host's log and of each slot's (a VM's console).
pub fn wait_host(
    host: &Host,
    within: std::time::Duration,
    what: &str,
    mut check: impl FnMut() -> Result<(), String>,
) {
    let deadline = std::time::Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return,
            Err(last) if std::time::Instant::now() >= deadline => panic!(
                "{what}: not within {within:?}; last seen: {last}\n{}",
                host.log_tails()
            ),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    }
}

/// The last `n` bytes of a text file (from a character boundary).
fn tail(path: &Path, n: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let mut from = log.len().saturating_sub(n);
    while !log.is_char_boundary(from) {
        from += 1;
    }
    log[from..].to_owned()
}

/// What the tests' isolated sandboxes must see besides the system
/// directories: this source tree (the test servers and clients) and the
/// Python the tests installed their packages into (pyenv under $HOME on
/// the CI machines).
pub fn sandbox_read_only() -> Vec<String> {
    super::slots::sandbox_read_only(super::bench_data::prefix())
}

/// `root` and every process below it (by parent pid, from /proc), alive
/// now.
pub fn process_tree(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter_map(|pid| {
                    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                    let ppid = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
                    Some((pid, ppid))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

impl Host {
    /// [`Host::start`] with its data dir at `data` instead of `<dir>/data`
    /// (the later `--data-dir` wins).
    pub fn start_at(dir: &Path, data: &Path, extra: &[&str]) -> Host {
        let data_arg = data.display().to_string();
        let mut args = vec!["--data-dir", data_arg.as_str()];
        args.extend_from_slice(extra);
        let mut host = Host::start(dir, &args);
        host.data = data.to_owned();
        host
    }
}

/// Starts the host as [`Host::start_at`] would, expecting it to refuse to
/// start: its exit status, its stderr and how long it ran. It fails the
/// test when the host prints its base URL or still runs after `within`.
pub fn start_refused(
    dir: &Path,
    data: &Path,
    extra: &[&str],
    within: std::time::Duration,
) -> (std::process::ExitStatus, String, std::time::Duration) {
    use std::io::Read;
    let manifest = dir.join("servers.toml");
    if !manifest.exists() {
        std::fs::write(&manifest, shipped_manifest(Path::new("${state_root}"))).expect("manifest");
    }
    let keys = dir.join("keys");
    std::fs::write(&keys, format!("{KEY_A} alice\n{KEY_B} bob\n")).expect("keys");
    let started = std::time::Instant::now();
    let mut child = Command::new(&*HOST)
        .args(["--listen", "127.0.0.1:0", "--pool-size", "1"])
        .args(sandbox_read_only())
        .args(["--catalogs", "off"])
        .arg("--data-dir")
        .arg(data)
        .arg("--api-key-file")
        .arg(&keys)
        .arg("--agent-bin")
        .arg(&*AGENT)
        .arg("--manifest")
        .arg(&manifest)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sandbox-host");
    let status = loop {
        if let Some(st) = child.try_wait().expect("waiting for sandbox-host") {
            break st;
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            super::slots::end_all(data);
            panic!(
                "sandbox-host with --data-dir {} still runs after {within:?}: it must refuse at start",
                data.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let took = started.elapsed();
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(
        !out.contains("sandbox-host: base URL"),
        "sandbox-host with --data-dir {} started ({out:?}) before it exited: {err}",
        data.display()
    );
    (status, err, took)
}
