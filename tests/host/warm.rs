//! Warm pools: idle sandboxes that already run a profile's servers, and an
//! Acquire of any subset of them answered by narrowing that lease. The
//! lease must look cold: only its servers routed and listed, the others
//! stopped with their whole process tree, no seed data of a server it did
//! not ask for; requests no warm lease covers start cold; `/metrics`
//! counts hits and misses.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::eventually;
use crate::common::host::{
    Host, KEY_A, acquire, alive, assert_mcp_initializes, http, metric, release, wait_metric,
};
use crate::common::mcp::shipped_manifest;

pub(crate) fn slot_dirs(host: &Host) -> Vec<PathBuf> {
    std::fs::read_dir(host.data.join("slots"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// The lease an agent holds, and the (host) pid of each server it runs.
pub(crate) async fn agent_state(slot: &Path) -> Option<(String, Vec<(String, u32)>)> {
    let c = sandbox_client::connect(&format!("unix://{}", slot.join("run/agent.sock").display()))
        .await
        .ok()?;
    let info = c
        .agent()
        .get_info(sandbox_client::proto::GetInfoRequest {})
        .await
        .ok()?
        .into_inner();
    let lease = info.lease?.lease_id;
    let servers = c
        .servers()
        .list(sandbox_client::proto::ListServersRequest {})
        .await
        .ok()?
        .into_inner()
        .servers
        .into_iter()
        .filter(|s| s.in_lease && s.pid != 0)
        .map(|s| (s.name, host_pid(slot, s.pid)))
        .collect();
    Some((lease, servers))
}

/// The host's pid of the process an isolated agent knows as `pid` (in its
/// own pid namespace); `pid` itself when the slot shares the host's.
fn host_pid(slot: &Path, pid: u32) -> u32 {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let Some(agent) = std::fs::read_to_string(slot.join("agent.pid")).ok() else {
        return pid;
    };
    let Some(theirs) = ns(agent.trim()) else {
        return pid;
    };
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return pid;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || ns(&name).as_ref() != Some(&theirs) {
            continue;
        }
        let inner = std::fs::read_to_string(format!("/proc/{name}/status"))
            .ok()
            .and_then(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|v| v.split_whitespace().last().map(str::to_owned))
            });
        if inner.as_deref() == Some(&pid.to_string()) {
            return name.parse().unwrap_or(pid);
        }
    }
    pid
}

/// Waits until exactly one slot exists and its agent holds a lease with
/// `server` running; returns (slot dir, lease id, server pid).
pub(crate) fn wait_warm(host: &Host, server: &str, not: &[PathBuf]) -> (PathBuf, String, u32) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let what = format!("a warm lease of {server}");
    eventually(Duration::from_secs(60), &what, || {
        for dir in slot_dirs(host).into_iter().filter(|d| !not.contains(d)) {
            if let Some((lease, servers)) = rt.block_on(agent_state(&dir))
                && let Some((_, pid)) = servers.iter().find(|(n, _)| n == server)
            {
                return Ok((dir, lease, *pid));
            }
        }
        Err("no slot holds it".into())
    })
}

#[test]
fn warm_leases_serve_matching_acquires_and_give_way_to_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    // This host's sandboxes carry every local Klavis server but playwright
    // (the cut also drops the public-data servers and the profiles).
    let shipped = shipped_manifest(Path::new("${state_root}"));
    let cut = shipped
        .find("[servers.playwright]")
        .expect("playwright entry");
    // The mail service's table (the manifest's last) stays: poste uses it.
    let mail = shipped.find("\n[mail]").expect("[mail] table");
    assert!(mail > cut, "[mail] follows the servers");
    std::fs::write(
        dir.path().join("servers.toml"),
        format!("{}{}", &shipped[..cut], &shipped[mail..]),
    )
    .expect("manifest");
    let host = Host::start(dir.path(), &["--warm-servers", "filesystem"]);
    let b = host.base.clone();

    // The idle sandbox already runs filesystem under a lease of its own.
    let (slot, lease, pid) = wait_warm(&host, "filesystem", &[]);

    // A Klavis server these sandboxes lack: a 400 that names it, before any
    // slot is taken, so the warm lease stays as it was.
    let (code, v) = http(
        "POST",
        &format!("{b}/local-sandbox"),
        Some(KEY_A),
        Some(r#"{"server_names": ["filesystem", "playwright"]}"#),
    );
    assert_eq!(code, 400, "{v}");
    let said = v["detail"].as_str().unwrap_or_default();
    assert!(
        said.contains("unknown server playwright") && said.contains("filesystem"),
        "{v}"
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    assert_eq!(
        rt.block_on(agent_state(&slot)),
        Some((lease.clone(), vec![("filesystem".to_owned(), pid)])),
        "the warm lease survives a refused Acquire"
    );

    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    // That lease became the sandbox under an id of its own, and its server
    // was not restarted.
    let lease = a["local_sandbox_id"].as_str().expect("id").to_owned();
    assert_eq!(a["servers"][0]["server_name"], "filesystem", "{a}");
    let (held, servers) = rt.block_on(agent_state(&slot)).expect("agent state");
    assert_eq!(held, lease);
    assert_eq!(servers, [("filesystem".to_owned(), pid)]);
    assert_mcp_initializes(&b, "filesystem", &lease);

    // Another request on a warm slot: its warm lease ends first, and the
    // sandbox runs only what was asked for.
    let (slot2, lease2, _) = wait_warm(&host, "filesystem", std::slice::from_ref(&slot));
    let a = acquire(
        &host,
        KEY_A,
        r#"{"server_names": ["localmemory"], "benchmark": null}"#,
    );
    let id2 = a["local_sandbox_id"].as_str().expect("id").to_owned();
    assert_ne!(id2, lease2, "a new lease, not the warm one");
    let (held, servers) = rt.block_on(agent_state(&slot2)).expect("agent state");
    assert_eq!(held, id2);
    assert_eq!(
        servers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["localmemory"]
    );
    for id in [&lease, &id2] {
        release(&host, KEY_A, id);
    }
    let (_, list) = http("GET", &format!("{b}/local-sandbox"), Some(KEY_A), None);
    assert_eq!(list["total_count"], 0, "{list}");
}

/// `pid` and every process below it.
fn tree(pid: u32) -> BTreeSet<u32> {
    let mut all = BTreeSet::from([pid]);
    loop {
        let before = all.len();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let ppid = std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let (_, rest) = s.rsplit_once(") ")?;
                    rest.split(' ').nth(1)?.parse::<u32>().ok()
                });
            if ppid.is_some_and(|pp| all.contains(&pp)) {
                all.insert(p);
            }
        }
        if all.len() == before {
            return all;
        }
    }
}

/// A raw MCP `initialize` on the agent's own data plane (the slot's unix
/// socket), past the host: the status code.
fn agent_mcp_status(slot: &Path, server: &str) -> String {
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}"#;
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--unix-socket",
        ])
        .arg(slot.join("run/mcp.sock"))
        .args([
            "-H",
            "content-type: application/json",
            "-H",
            "accept: application/json, text/event-stream",
            "-d",
            init,
        ])
        .arg(format!("http://localhost/{server}/mcp"))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const PLAIN: &str = "filesystem,git,terminal";

#[test]
fn a_warm_lease_narrows_to_any_subset_and_the_rest_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(
        dir.path(),
        &["--pool-size", "2", "--warm", &format!("{PLAIN}=1")],
    );
    let b = host.base.clone();
    let warm = format!("sandbox_host_pool_sandboxes{{state=\"warm\",profile=\"{PLAIN}\"}}");
    wait_metric(&host, &warm, 1.0, Duration::from_secs(60));
    let (slot, warm_lease, _) = wait_warm(&host, "terminal", &[]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (_, before) = rt.block_on(agent_state(&slot)).expect("agent state");
    let pid = |n: &str| before.iter().find(|(s, _)| s == n).map(|(_, p)| *p);
    let terminal = tree(pid("terminal").expect("terminal runs"));
    let (git, fs) = (pid("git").expect("git"), pid("filesystem").expect("fs"));

    let a = acquire(&host, KEY_A, r#"{"server_names": ["git", "filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    assert_ne!(id, warm_lease, "the tenant gets an id nobody saw before");
    let names: Vec<&str> = a["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .filter_map(|s| s["server_name"].as_str())
        .collect();
    assert_eq!(names, ["git", "filesystem"], "{a}");
    // Served by the warm sandbox, its two servers not restarted.
    let (held, now) = rt.block_on(agent_state(&slot)).expect("agent state");
    assert_eq!(held, id);
    let mut now = now;
    now.sort();
    assert_eq!(
        now,
        [("filesystem".to_owned(), fs), ("git".to_owned(), git)]
    );
    assert_mcp_initializes(&b, "git", &id);
    // terminal is not this sandbox's: not through the host, not on the
    // agent's own data plane.
    let (code, v) = http(
        "POST",
        &format!("{b}/terminal/mcp/?local_sandbox_id={id}"),
        Some(KEY_A),
        Some("{}"),
    );
    assert_eq!(code, 404, "{v}");
    assert_eq!(agent_mcp_status(&slot, "terminal"), "404");
    assert_eq!(agent_mcp_status(&slot, "filesystem"), "200");
    // And its whole process tree is gone within the stop grace (3 s).
    eventually(Duration::from_secs(6), "terminal's processes gone", || {
        let left: Vec<u32> = terminal
            .iter()
            .copied()
            .filter(|p| alive(*p as i32))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    let (_, got) = http("GET", &format!("{b}/local-sandbox/{id}"), Some(KEY_A), None);
    assert_eq!(got["servers"].as_array().map(Vec::len), Some(2), "{got}");
    assert_eq!(
        metric(
            &host,
            &format!("sandbox_host_warm_hits_total{{profile=\"{PLAIN}\"}}")
        ),
        1.0
    );
    assert_eq!(
        metric(&host, "sandbox_host_acquire_seconds_count{path=\"warm\"}"),
        1.0
    );

    // Outside the warm set: the bare sandbox starts it cold.
    let c = acquire(&host, KEY_A, r#"{"server_names": ["localmemory"]}"#);
    let cold = c["local_sandbox_id"].as_str().expect("id").to_owned();
    assert_eq!(
        metric(
            &host,
            "sandbox_host_warm_misses_total{reason=\"uncovered\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(&host, "sandbox_host_acquire_seconds_count{path=\"cold\"}"),
        1.0
    );
    assert_mcp_initializes(&b, "localmemory", &cold);
    for s in [&id, &cold] {
        release(&host, KEY_A, s);
    }
    // The pool refills: the released sandboxes come back, one warmed again.
    wait_metric(&host, &warm, 1.0, Duration::from_secs(60));
    assert_eq!(
        metric(
            &host,
            "sandbox_host_pool_sandboxes{state=\"leased\",profile=\"\"}"
        ),
        0.0
    );
}

/// A benchmark profile warms its servers under the benchmark (with its
/// seed data) and serves only that benchmark. A narrowing that would keep
/// seed data of a server the tenant did not ask for is refused by the
/// agent, and the host starts that Acquire cold instead.
#[test]
fn benchmark_profiles_serve_their_benchmark_and_never_leak_seed_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = dir.path().join("atlas-seed");
    std::fs::create_dir_all(&seed).expect("seed dir");
    std::fs::write(seed.join("atlas.txt"), "git's MCP_Atlas data\n").expect("seed");
    // Into the shipped profile's git table (it pins git's version).
    let table = "[servers.git.benchmarks.MCP_Atlas]\n";
    let shipped = shipped_manifest(Path::new("${state_root}"));
    assert!(shipped.contains(table), "the shipped MCP_Atlas git table");
    let manifest = shipped.replace(
        table,
        &format!("{table}seed = [{{ from = \"{}\" }}]\n", seed.display()),
    );
    std::fs::write(dir.path().join("servers.toml"), manifest).expect("manifest");
    let profile = "MCP_Atlas:filesystem,git";
    // The seed is shown to the isolated sandboxes, as a real host shows
    // what its manifest names outside the system directories.
    let seed_s = seed.display().to_string();
    let host = Host::start(dir.path(), &["--warm", profile, "--sandbox-ro", &seed_s]);
    let warm = format!("sandbox_host_pool_sandboxes{{state=\"warm\",profile=\"{profile}\"}}");
    let hits = format!("sandbox_host_warm_hits_total{{profile=\"{profile}\"}}");
    wait_metric(&host, &warm, 1.0, Duration::from_secs(60));

    let a = acquire(
        &host,
        KEY_A,
        r#"{"server_names": ["git", "filesystem"], "benchmark": "MCP_Atlas"}"#,
    );
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    assert_eq!(a["benchmark"], "MCP_Atlas", "{a}");
    assert_eq!(metric(&host, &hits), 1.0);
    let slot = slot_dirs(&host)
        .into_iter()
        .find(|d| {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(agent_state(d)).is_some_and(|(l, _)| l == id)
        })
        .expect("the sandbox's slot");
    assert!(
        crate::common::slots::slot_workspace(&slot)
            .join("atlas.txt")
            .is_file(),
        "the profile's seed data"
    );
    release(&host, KEY_A, &id);
    wait_metric(&host, &warm, 1.0, Duration::from_secs(60));

    // Only filesystem: git's seed must not stay in the workspace, so the
    // agent refuses to narrow and the sandbox starts cold.
    let a = acquire(
        &host,
        KEY_A,
        r#"{"server_names": ["filesystem"], "benchmark": "MCP_Atlas"}"#,
    );
    let id = a["local_sandbox_id"].as_str().expect("id").to_owned();
    assert_eq!(
        metric(&host, "sandbox_host_warm_misses_total{reason=\"refused\"}"),
        1.0
    );
    assert_eq!(metric(&host, &hits), 1.0);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let slot = slot_dirs(&host)
        .into_iter()
        .find(|d| rt.block_on(agent_state(d)).is_some_and(|(l, _)| l == id))
        .expect("the sandbox's slot");
    let (_, servers) = rt.block_on(agent_state(&slot)).expect("agent state");
    assert_eq!(
        servers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["filesystem"]
    );
    assert!(
        !crate::common::slots::slot_workspace(&slot)
            .join("atlas.txt")
            .exists(),
        "no seed of git"
    );
    assert_mcp_initializes(&host.base, "filesystem", &id);

    // A plain Acquire is no MCP_Atlas one: the warm lease does not serve it.
    wait_metric(&host, &warm, 1.0, Duration::from_secs(60));
    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    assert!(a["benchmark"].is_null(), "{a}");
    assert_eq!(
        metric(
            &host,
            "sandbox_host_warm_misses_total{reason=\"uncovered\"}"
        ),
        1.0
    );
    assert_eq!(metric(&host, &hits), 1.0);
}
