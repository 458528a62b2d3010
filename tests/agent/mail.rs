//! The sandbox's mail service through the agent's gRPC API: the lease's
//! account in `Lease.auth_data`, `Servers.LoadData`/`DumpData`, Reset and
//! Release emptying the mailboxes, narrowing, and a start failure that
//! names its cause. Real Dovecot and aiosmtpd, started by the agent.

use std::os::unix::fs::PermissionsExt;

use crate::common::mcp::*;
use sandbox_client::proto;
use tonic::Code;

const POSTE: &str = "poste_email_toolathlon";
/// Free ports for every start: tests run side by side.
const AUTO_PORTS: &str = "mail_ports = \"auto\"\n";

fn acquire(id: &str, names: &[&str], email: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        lease_id: id.into(),
        server_names: names.iter().map(|s| s.to_string()).collect(),
        ttl_seconds: Some(0),
        test_account_email: email.into(),
        ..Default::default()
    }
}

fn field<'a>(lease: &'a proto::Lease, name: &str) -> &'a prost_types::value::Kind {
    lease.auth_data[POSTE].fields[name]
        .kind
        .as_ref()
        .expect("a value")
}

fn port(lease: &proto::Lease, name: &str) -> u16 {
    match field(lease, name) {
        prost_types::value::Kind::NumberValue(n) => *n as u16,
        other => panic!("{name}: {other:?}"),
    }
}

fn accepts(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

async fn dump(c: &sandbox_client::Client) -> serde_json::Value {
    let r = c
        .servers()
        .dump_data(proto::DumpDataRequest {
            server_name: POSTE.into(),
        })
        .await
        .expect("DumpData")
        .into_inner();
    serde_json::from_str(&r.json).expect("JSON")
}

#[tokio::test]
async fn the_lease_account_loads_dumps_and_resets() {
    let agent = agent_with("", AUTO_PORTS);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let lease = c
        .agent()
        .acquire(acquire("m1", &[POSTE], "Ann@MCP.com"))
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()))
        .into_inner()
        .lease
        .expect("lease");
    assert_eq!(
        field(&lease, "email"),
        &prost_types::value::Kind::StringValue("ann@mcp.com".into())
    );
    let imap = port(&lease, "imap_port");
    assert!(accepts(imap) && accepts(port(&lease, "smtp_port")));

    // Data for a server without any: UNIMPLEMENTED; for one not leased:
    // FAILED_PRECONDITION.
    for (server, code) in [
        ("filesystem", Code::Unimplemented),
        ("canvas", Code::FailedPrecondition),
    ] {
        let e = c
            .servers()
            .load_data(proto::LoadDataRequest {
                server_name: server.into(),
                json: "{}".into(),
                ..Default::default()
            })
            .await
            .expect_err(server);
        assert_eq!(e.code(), code, "{server}: {e}");
    }
    let bad = r#"{"users": {"ann@mcp.com": {"emails": [{"subject": "s", "from_addr": "a@mcp.com", "to_addr": "ann@mcp.com", "date": "not a date"}]}}}"#;
    let e = c
        .servers()
        .load_data(proto::LoadDataRequest {
            server_name: POSTE.into(),
            json: bad.into(),
            ..Default::default()
        })
        .await
        .expect_err("bad date");
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().contains("emails[0]"), "{e}");
    let r = c
        .servers()
        .load_data(proto::LoadDataRequest {
            server_name: POSTE.into(),
            default_data: true,
            ..Default::default()
        })
        .await
        .expect("LoadData")
        .into_inner();
    assert!(r.summary.contains("\"emails\": 3"), "{}", r.summary);
    let d = dump(&c).await;
    assert_eq!(d["users"].as_object().map(|u| u.len()), Some(1), "{d}");

    // Reset: the same account, empty mailboxes.
    let after = c
        .agent()
        .reset(proto::ResetRequest {
            lease_id: "m1".into(),
        })
        .await
        .expect("Reset")
        .into_inner()
        .lease
        .expect("lease");
    assert_eq!(after.auth_data, lease.auth_data);
    assert_eq!(dump(&c).await["users"], serde_json::json!({}));

    // Release: the service is gone, and so is its directory.
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: "m1".into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("Release");
    assert!(!accepts(imap), "IMAP still answers after Release");
    let mail_dir = state_dir(&agent).join("mail");
    let left: Vec<_> = std::fs::read_dir(&mail_dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    let e = c
        .servers()
        .dump_data(proto::DumpDataRequest {
            server_name: POSTE.into(),
        })
        .await
        .expect_err("no lease");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
}

#[tokio::test]
async fn narrowing_keeps_the_account_or_refuses() {
    let agent = agent_with("", AUTO_PORTS);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let warm = c
        .agent()
        .acquire(acquire("warm", &[POSTE, "filesystem"], ""))
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()))
        .into_inner()
        .lease
        .expect("lease");
    assert_eq!(
        field(&warm, "email"),
        &prost_types::value::Kind::StringValue("sandbox@mcp.com".into())
    );
    let imap = port(&warm, "imap_port");
    let narrow = |names: &[&str], email: &str| proto::NarrowRequest {
        lease_id: "warm".into(),
        new_lease_id: "tenant".into(),
        server_names: names.iter().map(|s| s.to_string()).collect(),
        ttl_seconds: Some(0),
        test_account_email: email.into(),
        ..Default::default()
    };
    let e = c
        .agent()
        .narrow(narrow(&[POSTE], "bob@mcp.com"))
        .await
        .expect_err("another account");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("mail account"), "{e}");
    // Without the mail server: it stops with the trim.
    c.agent()
        .narrow(narrow(&["filesystem"], ""))
        .await
        .expect("Narrow");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while accepts(imap) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!accepts(imap), "the mail service outlived the narrow");
}

/// The mail service works wherever the state root is: here below two 0700
/// directories, which user `mail` (as whom Dovecot keeps mail when the
/// agent is root) cannot pass through. Loading, IMAP, and SMTP delivery all
/// work (before, every Acquire failed).
#[tokio::test]
async fn a_mail_directory_below_a_private_directory_works() {
    // An agent whose tenants are its own user (a root agent's tenants could
    // not pass through a private directory to their state either; it says
    // so at start): the mail service's own user must still reach its mail.
    let config = format!("{AUTO_PORTS}\n[supervisor]\ntenant_user = \"none\"\n");
    let agent = agent_with("", &config);
    let state = state_dir(&agent);
    for d in [state.parent().expect("the agent's dir"), &state] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    }
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let lease = c
        .agent()
        .acquire(acquire("m", &[POSTE], "ann@mcp.com"))
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()))
        .into_inner()
        .lease
        .expect("lease");
    c.servers()
        .load_data(proto::LoadDataRequest {
            server_name: POSTE.into(),
            default_data: true,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("LoadData: {e}\n{}", agent.stderr.all()));
    // SMTP delivery (dovecot-lda) into the loaded mailbox.
    let sent = std::process::Command::new("python3")
        .args([
            "-c",
            "import smtplib, sys\n\
             smtplib.SMTP('127.0.0.1', int(sys.argv[1])).sendmail('bob@mcp.com', ['ann@mcp.com'], \
             'Subject: through SMTP\\r\\n\\r\\nhello\\r\\n')",
            &port(&lease, "smtp_port").to_string(),
        ])
        .output()
        .expect("python3");
    assert!(
        sent.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&sent.stderr),
        agent.stderr.all()
    );
    let d = dump(&c).await;
    let emails = d["users"]["ann@mcp.com"]["emails"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(emails.iter().any(|e| e["subject"] == "through SMTP"), "{d}");
    let jsmith = d["users"]["jsmith@mcp.com"]["emails"]
        .as_array()
        .map(Vec::len);
    assert_eq!(jsmith, Some(3), "{d}");
    assert!(accepts(port(&lease, "imap_port")));
}

/// Mail among Toolathlon's accounts, as `FLOW` sends and reads it.
const FLOW: &str = r#"
import base64, imaplib, json, smtplib, sys
from email.message import EmailMessage
imap, smtp, password = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out = {"zip_b64": base64.b64encode(bytes(range(256))).decode()}
def send(frm, to, subject, attachment=None):
    m = EmailMessage()
    m["From"], m["To"], m["Subject"] = frm, to, subject
    m.set_content("hello")
    if attachment:
        m.add_attachment(attachment, maintype="application", subtype="zip", filename="a.zip")
    try:
        smtplib.SMTP("127.0.0.1", smtp).send_message(m)
        return "sent"
    except smtplib.SMTPRecipientsRefused as e:
        return " ".join(f"{c} {r.decode()}" for c, r in e.recipients.values())
out["to_others"] = send("mary.castillo@mcp7.com", "kaiming@mcp.com, myersj@mcp110.com", "zip",
                        bytes(range(256)))
out["back"] = send("myersj@mcp110.com", "Mary.Castillo@MCP7.com", "thanks")
out["mcp111"] = send("mary.castillo@mcp7.com", "x@mcp111.com", "nowhere")
out["outside"] = send("mary.castillo@mcp7.com", "x@example.org", "nowhere")
def inbox(user, pw):
    m = imaplib.IMAP4("127.0.0.1", imap)
    try:
        m.login(user, pw)
    except imaplib.IMAP4.error as e:
        return f"refused: {e}"
    m.select("INBOX", readonly=True)
    return len(m.search(None, "ALL")[1][0].split())
out["myersj"] = inbox("myersj@mcp110.com", password)
out["myersj_own_password"] = inbox("myersj@mcp110.com", "jason1984%lt")
out["mary"] = inbox("mary.castillo@mcp7.com", password)
# A login as `..@mcp.com` makes Dovecot's home the mailboxes' own directory;
# a dump must still read every real mailbox. Mail to it is refused.
out["dotdot_login"] = str(inbox("..@mcp.com", password))
out["dotdot"] = send("mary.castillo@mcp7.com", "..@mcp.com", "nowhere")
print(json.dumps(out))
"#;

/// Toolathlon's Klavis mode acquires with `test_account_email` at a domain
/// of `mcp1.com` … `mcp110.com`: that address is the lease's account.
/// Every address of the served domains is an account that logs in with the
/// lease's password (not with the password Toolathlon's users_data.json
/// gives it); mail goes both ways among them, other domains are refused, a
/// load takes their addresses, and a dump carries an attachment's bytes.
#[tokio::test]
async fn toolathlon_domains_are_accounts_that_mail_each_other() {
    let agent = agent_with("", AUTO_PORTS);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let lease = c
        .agent()
        .acquire(acquire("t", &[POSTE], "Mary.Castillo@MCP7.com"))
        .await
        .unwrap_or_else(|e| panic!("Acquire: {e}\n{}", agent.stderr.all()))
        .into_inner()
        .lease
        .expect("lease");
    assert_eq!(
        field(&lease, "email"),
        &prost_types::value::Kind::StringValue("mary.castillo@mcp7.com".into())
    );
    let password = match field(&lease, "password") {
        prost_types::value::Kind::StringValue(p) => p.clone(),
        other => panic!("password: {other:?}"),
    };
    let out = std::process::Command::new("python3")
        .args(["-c", FLOW])
        .arg(port(&lease, "imap_port").to_string())
        .arg(port(&lease, "smtp_port").to_string())
        .arg(&password)
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{}", agent.stderr.all());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["to_others"], "sent", "{v}");
    assert_eq!(v["back"], "sent", "{v}");
    for refused in ["mcp111", "outside", "dotdot"] {
        assert!(
            v[refused].as_str().is_some_and(|r| r.starts_with("550")),
            "{v}"
        );
    }
    assert_eq!(v["myersj"], 1, "{v}");
    assert_eq!(v["mary"], 1, "{v}");
    assert!(
        v["myersj_own_password"]
            .as_str()
            .is_some_and(|r| r.starts_with("refused")),
        "{v}"
    );

    let load = |json: &str| proto::LoadDataRequest {
        server_name: POSTE.into(),
        json: json.into(),
        ..Default::default()
    };
    let other = r#"{"users": {"x@mcp111.com": {"emails": []}}}"#;
    let e = c
        .servers()
        .load_data(load(other))
        .await
        .expect_err("mcp111");
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let ok = r#"{"users": {"kaiming@mcp42.com": {"emails": [{"subject": "loaded", "from_addr": "a@mcp.com", "to_addr": "kaiming@mcp42.com", "attachments": [{"filename": "n.txt", "content_type": "text/plain", "content": "bm90ZXM="}]}]}}}"#;
    c.servers()
        .load_data(load(ok))
        .await
        .unwrap_or_else(|e| panic!("LoadData: {e}\n{}", agent.stderr.all()));
    let d = dump(&c).await;
    let att = |user: &str| d["users"][user]["emails"][0]["attachments"][0].clone();
    let zip = att("myersj@mcp110.com");
    assert_eq!(zip["filename"], "a.zip", "{d}");
    assert_eq!(zip["size"], 256, "{d}");
    assert_eq!(zip["content"], v["zip_b64"], "{d}");
    assert_eq!(att("kaiming@mcp42.com")["content"], "bm90ZXM=", "{d}");
    assert_eq!(
        d["users"]["kaiming@mcp.com"]["emails"][0]["subject"], "zip",
        "{d}"
    );
}
