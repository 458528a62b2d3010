//! What a first day with the host runs into: Klavis's bare MCP URLs,
//! case-insensitive Bearer, the reset answer, log files without colour
//! codes, and a host started without a manifest.

use std::process::Command;

use crate::common::HOST;
use crate::common::host::{Host, KEY_A, KEY_B, acquire, http, py, release};
use crate::common::{AGENT, eventually};

/// The MCP URL is a capability: the official MCP client works with the URL
/// alone (as Klavis's notebooks call it), a forged token is refused, and
/// the URL stops working once the sandbox is released. The key still works.
#[test]
fn mcp_urls_work_without_the_key_until_release() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    // The client acquires, uses the bare URL, and releases.
    let v = py(&host, KEY_A, &["mcp-bare"]);
    assert_eq!(v["text"], "through the host", "{v}");
    let url = v["url"].as_str().expect("url").to_owned();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}"#;
    let (code, body) = http("POST", &url, None, Some(init));
    assert_eq!(code, 404, "a released sandbox's URL: {body}");

    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id");
    let url = a["servers"][0]["mcp_server_url"].as_str().expect("url");
    let (code, body) = http("POST", url, None, Some(init));
    assert_eq!(code, 200, "{body}");
    assert!(body["result"]["serverInfo"].is_object(), "{body}");
    // Forged: another sandbox's id with this token, or a changed token.
    let (code, _) = http("POST", &url.replace(id, "0000"), None, Some(init));
    assert_eq!(code, 401);
    let forged = format!("{}0", &url[..url.len() - 1]);
    let forged = if forged == url {
        format!("{}1", &url[..url.len() - 1])
    } else {
        forged
    };
    let (code, _) = http("POST", &forged, None, Some(init));
    assert_eq!(code, 401);
    let no_token = url.split("&mcp_token=").next().expect("url");
    let (code, _) = http("POST", no_token, None, Some(init));
    assert_eq!(code, 401, "no token and no key");
    // The key of the owner works without the token; another owner's not.
    let (code, _) = http("POST", no_token, Some(KEY_A), Some(init));
    assert_eq!(code, 200);
    let (code, _) = http("POST", no_token, Some(KEY_B), Some(init));
    assert_eq!(code, 404);
    release(&host, KEY_A, id);
    eventually(
        std::time::Duration::from_secs(30),
        "the URL refused after release",
        || match http("POST", url, None, Some(init)).0 {
            404 => Ok(()),
            c => Err(format!("answered {c}")),
        },
    );
}

/// `authorization: bearer KEY` works like `Bearer KEY`; reset answers an
/// object with the sandbox as it is after the reset.
#[test]
fn bearer_in_any_case_and_the_reset_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["-H", &format!("Authorization: {scheme} {KEY_A}")])
            .arg(format!("{}/local-sandbox", host.base))
            .output()
            .expect("curl");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{scheme}");
    }
    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id");
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox/{id}/reset", host.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{v}");
    assert!(v.is_object(), "{v}");
    assert_eq!(v["local_sandbox_id"], id, "{v}");
    assert_eq!(v["status"], "occupied", "{v}");
    assert_eq!(v["message"], format!("Local sandbox {id} reset"), "{v}");
    release(&host, KEY_A, id);
    // The host's log file (its stderr redirected) carries no colour codes.
    let log = std::fs::read_to_string(dir.path().join("host.log")).expect("host.log");
    assert!(log.contains("acquired"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escapes in the log file:\n{log}"
    );
}

/// Without --manifest (and none installed) the host does not start, and
/// says what to pass.
#[test]
fn a_host_without_a_manifest_says_what_to_pass() {
    if !crate::common::have_or_skip(
        !std::path::Path::new("/etc/sandbox-agent/servers.toml").exists(),
        "a host without a manifest",
        "no /etc/sandbox-agent/servers.toml (the host would use it)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(&*HOST)
        .args(["--listen", "127.0.0.1:0", "--agent-bin", &AGENT])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .expect("sandbox-host");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--manifest") && err.contains("packaging/servers.toml"),
        "{err}"
    );
}

/// The served OpenAPI document declares the answers the host gives: each
/// answer observed here is declared for its path, and POST /local-sandbox
/// declares no 404 (it never answers one).
#[test]
fn the_openapi_document_declares_the_real_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let (code, spec) = http("GET", &format!("{}/openapi.json", host.base), None, None);
    assert_eq!(code, 200);
    let declared = |method: &str, path: &str, code: u16| {
        spec["paths"][path][method]["responses"]
            .get(code.to_string())
            .is_some()
    };
    let b = &host.base;
    let s = "/local-sandbox/{local_sandbox_id}";
    let mut seen = vec![];
    let (c, _) = http("GET", &format!("{b}/local-sandbox"), None, None);
    seen.push(("get", "/local-sandbox".to_owned(), c));
    let (c, _) = http("POST", &format!("{b}/local-sandbox"), None, Some("{}"));
    seen.push(("post", "/local-sandbox".to_owned(), c));
    let (c, _) = http("GET", &format!("{b}/local-sandbox/nope"), Some(KEY_A), None);
    seen.push(("get", s.to_owned(), c));
    let (c, _) = http(
        "POST",
        &format!("{b}/local-sandbox"),
        Some(KEY_A),
        Some(r#"{"server_names": 1}"#),
    );
    seen.push(("post", "/local-sandbox".to_owned(), c));
    let a = acquire(&host, KEY_A, r#"{"server_names": ["filesystem"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id");
    let (c, _) = http(
        "POST",
        &format!("{b}/local-sandbox/{id}/initialize"),
        Some(KEY_A),
        None,
    );
    seen.push(("post", format!("{s}/initialize"), c));
    let (c, _) = http(
        "PUT",
        &format!("{b}/transfer/upload/{id}?expires=1&signature=00"),
        None,
        Some("x"),
    );
    seen.push(("put", "/transfer/upload/{local_sandbox_id}".to_owned(), c));
    release(&host, KEY_A, id);
    assert_eq!(
        seen.iter().map(|(_, _, c)| *c).collect::<Vec<_>>(),
        [401, 401, 404, 422, 400, 403]
    );
    for (m, p, c) in &seen {
        assert!(
            declared(m, p, *c),
            "{m} {p} answers {c} but does not declare it"
        );
    }
    assert!(!declared("post", "/local-sandbox", 404));
    assert!(declared("post", "/local-sandbox", 503));
}
