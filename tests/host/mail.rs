//! poste_email_toolathlon without outside credentials, through sandbox-host:
//! the sandbox's own mail service (Dovecot + aiosmtpd, real IMAP and SMTP)
//! behind Klavis's per-server initialize and dump endpoints, read and
//! written by the real emails-mcp server through the official MCP client.

use serde_json::Value;

use crate::common::host::{Host, KEY_A, acquire, http, py, release};

/// The emails of `user` in a PosteEmailData dump.
fn emails<'a>(dump: &'a Value, user: &str) -> Vec<&'a Value> {
    dump["data"]["users"][user]["emails"]
        .as_array()
        .map(|v| v.iter().collect())
        .unwrap_or_default()
}

#[test]
fn a_mailbox_round_trips_through_the_mail_service() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let out = py(&host, KEY_A, &["mail"]);

    // The acquire answer carries the account, as Klavis's does.
    let auth = &out["acquire"]["servers"][0]["auth_data"];
    assert_eq!(auth["email"], "jsmith@mcp.com", "{out}");
    assert_eq!(auth["imap_server"], "127.0.0.1", "{out}");
    assert!(auth["imap_port"].as_u64().is_some_and(|p| p > 0), "{out}");
    assert!(auth["smtp_port"].as_u64().is_some_and(|p| p > 0), "{out}");
    assert!(
        auth["password"].as_str().is_some_and(|p| p.len() >= 32),
        "{out}"
    );
    assert_eq!(out["initialize"][0], 200, "{out}");
    assert_eq!(out["initialize"][1]["status"], "occupied", "{out}");

    // The emails server reads the loaded mailbox and sends through SMTP.
    let inbox = out["inbox"].as_str().unwrap_or_default();
    assert!(inbox.contains("Quarterly report due Friday"), "{out}");
    assert!(!inbox.contains("Old newsletter"), "INBOX only: {out}");
    assert!(
        out["sent"]
            .as_str()
            .unwrap_or_default()
            .to_lowercase()
            .contains("sent"),
        "{out}"
    );

    // The dump: what was loaded (flags, folders, dates, cc) plus what the
    // tools changed (bob's new mail).
    let dump = &out["dump"][1];
    assert_eq!(out["dump"][0], 200, "{out}");
    assert_eq!(dump["server_name"], "poste_email_toolathlon", "{out}");
    assert!(
        dump["dumped_at"]
            .as_str()
            .is_some_and(|d| d.starts_with("20")),
        "{out}"
    );
    let js = emails(dump, "jsmith@mcp.com");
    let q3 = js
        .iter()
        .find(|e| e["subject"] == "Quarterly report due Friday")
        .unwrap_or_else(|| panic!("the loaded email: {dump}"));
    assert_eq!(q3["folder"], "INBOX", "{q3}");
    assert_eq!(q3["is_important"], true, "{q3}");
    assert_eq!(q3["cc_addr"], "team@mcp.com", "{q3}");
    assert_eq!(q3["message_id"], "<q3-report@mcp.com>", "{q3}");
    assert_eq!(q3["date"], "Wed, 10 Sep 2025 18:31:19 +0000", "{q3}");
    assert_eq!(
        q3["body_text"], "Please send the Q3 numbers by Friday.",
        "{q3}"
    );
    let old = js
        .iter()
        .find(|e| e["subject"] == "Old newsletter")
        .unwrap_or_else(|| panic!("the archived email: {dump}"));
    assert_eq!(old["folder"], "Archive", "{old}");
    assert_eq!(old["is_read"], true, "{old}");
    let bob = emails(dump, "bob@mcp.com");
    assert!(
        bob.iter().any(|e| e["subject"] == "Q3 numbers"
            && e["from_addr"]
                .as_str()
                .is_some_and(|f| f.contains("jsmith@mcp.com"))),
        "the sent mail in bob's mailbox: {dump}"
    );

    // Release emptied it: the next lease's mail service starts empty.
    assert_eq!(out["dump_after_release"][0], 200, "{out}");
    assert_eq!(
        out["dump_after_release"][1]["data"]["users"],
        serde_json::json!({}),
        "{out}"
    );
    assert_eq!(out["initialize_default"][0], 200, "{out}");
    let default = emails(&out["dump_default"][1], "jsmith@mcp.com");
    assert!(default.len() >= 2, "{out}");
    assert!(
        default.iter().all(|e| e["subject"] != "Q3 numbers"),
        "{out}"
    );
}

/// Bad data and wrong servers get a clear answer, and bad data loads
/// nothing.
#[test]
fn server_data_errors_are_clear() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let a = acquire(
        &host,
        KEY_A,
        r#"{"server_names": ["poste_email_toolathlon", "filesystem"]}"#,
    );
    let id = a["local_sandbox_id"].as_str().expect("id");
    let base = format!("{}/local-sandbox", host.base);
    let init = format!("{base}/poste_email_toolathlon/{id}/initialize");
    // The second email lacks its subject: nothing is loaded.
    let bad = r#"{"users": {"a@mcp.com": {"emails": [
        {"subject": "fine", "from_addr": "x@mcp.com", "to_addr": "a@mcp.com"},
        {"from_addr": "x@mcp.com", "to_addr": "a@mcp.com"}]}}}"#;
    let (code, v) = http("POST", &init, Some(KEY_A), Some(bad));
    assert_eq!(code, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("emails[1].subject")),
        "{v}"
    );
    let other = r#"{"users": {"a@example.org": {"emails": []}}}"#;
    let (code, v) = http("POST", &init, Some(KEY_A), Some(other));
    assert_eq!(code, 400, "{v}");
    assert!(
        v["detail"].as_str().is_some_and(|d| d.contains("@mcp.com")),
        "{v}"
    );
    let (code, v) = http("POST", &init, Some(KEY_A), Some("[1, 2]"));
    assert_eq!(code, 422, "{v}");
    let (code, v) = http(
        "GET",
        &format!("{base}/poste_email_toolathlon/{id}/dump"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        v["data"]["users"],
        serde_json::json!({}),
        "nothing was loaded: {v}"
    );
    // A server the sandbox does not have, and one without such data.
    let (code, v) = http(
        "POST",
        &format!("{base}/canvas/{id}/initialize"),
        Some(KEY_A),
        Some(r#"{"courses": []}"#),
    );
    assert_eq!(code, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no canvas server")),
        "{v}"
    );
    let (code, _) = http("GET", &format!("{base}/excel/{id}/dump"), Some(KEY_A), None);
    assert_eq!(code, 404);
    // Another key's sandbox does not exist for it.
    let (code, _) = http(
        "GET",
        &format!("{base}/poste_email_toolathlon/{id}/dump"),
        Some(crate::common::host::KEY_B),
        None,
    );
    assert_eq!(code, 404);
    release(&host, KEY_A, id);
    // The served OpenAPI document declares these answers.
    let (_, spec) = http("GET", &format!("{}/openapi.json", host.base), None, None);
    for (method, path, codes) in [
        ("post", "initialize", &["200", "400", "422", "501"][..]),
        ("get", "dump", &["200", "400", "404", "501"][..]),
    ] {
        let p = format!("/local-sandbox/poste_email_toolathlon/{{sandbox_id}}/{path}");
        for code in codes {
            assert!(
                spec["paths"][&p][method]["responses"].get(code).is_some(),
                "{method} {p} {code} undeclared"
            );
        }
    }
}

/// The folders of `account` (an Acquire answer's mail auth_data), listed
/// over IMAP by Python's imaplib.
fn imap_folders(auth: &Value) -> Vec<String> {
    let script = "import imaplib, json, sys\n\
                  m = imaplib.IMAP4('127.0.0.1', int(sys.argv[1]))\n\
                  m.login(sys.argv[2], sys.argv[3])\n\
                  print(json.dumps([l.decode() for l in m.list()[1] if isinstance(l, bytes)]))\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(auth["imap_port"].to_string())
        .arg(auth["email"].as_str().expect("email"))
        .arg(auth["password"].as_str().expect("password"))
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The attack of issue 27's finding 8: a folder name with CR LF in it
/// ended the IMAP command it was sent in and ran the next line as a
/// command of its own (here CREATE Injected); the load answered 500 with
/// the injected folder made. Now a control character is refused (400)
/// before any IMAP command, a name Dovecot refuses is a 400 with nothing
/// loaded and no folder left, and names with quotes, backslashes, `&` and
/// non-ASCII letters load and dump back as they were. The sandbox's dir is
/// 0700, which user `mail` cannot pass through: the mail service works
/// anyway. (That is an agent without namespaces, as `--isolation none`
/// runs them: an isolated host refuses a data dir others cannot pass
/// through, and its agents keep the mail below their own root.)
#[test]
fn an_injected_folder_name_is_refused_before_imap() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let host = Host::start(dir.path(), &["--isolation", "none"]);
    let a = acquire(
        &host,
        KEY_A,
        r#"{"server_names": ["poste_email_toolathlon"], "test_account_email": "ann@mcp.com"}"#,
    );
    let id = a["local_sandbox_id"].as_str().expect("id");
    let auth = &a["servers"][0]["auth_data"];
    let init = format!(
        "{}/local-sandbox/poste_email_toolathlon/{id}/initialize",
        host.base
    );
    let dump = format!(
        "{}/local-sandbox/poste_email_toolathlon/{id}/dump",
        host.base
    );
    let email = |folder: &str| serde_json::json!({"subject": "s", "from_addr": "b@mcp.com", "to_addr": "ann@mcp.com", "folder": folder});
    let doc = |emails: Vec<Value>| {
        serde_json::json!({"users": {"ann@mcp.com": {"emails": emails}}}).to_string()
    };
    for (folder, code) in [
        ("Evil\r\nA1 CREATE Injected\r\nA2 NOOP", "U+000D"),
        ("Bad\u{7f}name", "U+007F"),
        ("Tab\tbed", "U+0009"),
    ] {
        let (status, v) = http("POST", &init, Some(KEY_A), Some(&doc(vec![email(folder)])));
        assert_eq!(status, 400, "{folder:?}: {v}");
        let d = v["detail"].as_str().unwrap_or_default();
        assert!(
            d.contains("emails[0].folder") && d.contains(code) && d.contains("control character"),
            "{folder:?}: {v}"
        );
    }
    // A name Dovecot refuses ('.' in Maildir++): refused whole, and the
    // folder the same document made first is gone again.
    let (status, v) = http(
        "POST",
        &init,
        Some(KEY_A),
        Some(&doc(vec![email("Fine"), email("a.b")])),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("refuses the folder 'a.b'")),
        "{v}"
    );
    let folders = imap_folders(auth);
    assert!(
        !folders
            .iter()
            .any(|f| f.contains("Injected") || f.contains("Fine")),
        "{folders:?}"
    );
    let (status, v) = http("GET", &dump, Some(KEY_A), None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["data"]["users"],
        serde_json::json!({}),
        "nothing loaded: {v}"
    );

    // Quotes, a backslash, '&' and non-ASCII letters are names like any.
    let odd = r#"Q3 "final" \ Überblick & 日本"#;
    let (status, v) = http("POST", &init, Some(KEY_A), Some(&doc(vec![email(odd)])));
    assert_eq!(status, 200, "{v}");
    let (status, v) = http("GET", &dump, Some(KEY_A), None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["data"]["users"]["ann@mcp.com"]["emails"][0]["folder"], odd,
        "{v}"
    );
    release(&host, KEY_A, id);
}
