//! A Toolathlon mail task as its Klavis mode runs it, against sandbox-host:
//! apply-phd-email's sequence (acquire `poste_email_toolathlon` with a
//! `test_account_email` at one of the run's domains, import the task's
//! mailbox through `import_emails(json_string, …)`, the agent's turn
//! through the MCP URL, the task's check of the receiver's mailbox)
//! replayed by `tests/clients/toolathlon_mail.py` with the official MCP
//! client, on a real host, agent, emails-mcp and mail service. The task's
//! data is read from the shared benchmark data at test time.

use std::path::PathBuf;

use serde_json::Value;

use crate::common::host::{Host, KEY_A};

const DRIVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/toolathlon_mail.py"
);
const TASK: &str = "Toolathlon/examples/apply-phd-email";

/// The task's data where this machine has it.
fn task_data() -> Option<PathBuf> {
    crate::common::bench_data::shared_data(TASK, "files/emails_backup.json")
}

/// Each mailbox of a dump, its emails as (folder, from, to, subject): what
/// a failure shows (not the attachments' bytes).
fn outline(dump: &Value) -> String {
    let users = dump["data"]["users"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    users
        .iter()
        .map(|(user, box_)| {
            let mails: Vec<String> = box_["emails"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
                .iter()
                .map(|e| {
                    format!(
                        "  {} | {} -> {} | {}",
                        e["folder"], e["from_addr"], e["to_addr"], e["subject"]
                    )
                })
                .collect();
            format!("{user}:\n{}", mails.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn emails<'a>(dump: &'a Value, user: &str) -> &'a [Value] {
    dump["data"]["users"][user]["emails"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

/// apply-phd-email passes its own check through the sandbox: the account is
/// the `test_account_email` at mcp7.com, the task's three emails arrive
/// through Klavis's `import_emails(json_string)` (a bad one is a tool error
/// naming the field), the agent reads kaiming's mail and sends the ZIP to
/// the address it names (the receiver, at mcp7.com too), and the
/// receiver's mailbox holds the mail with the ground truth's tree.
#[test]
fn apply_phd_email_passes_its_check() {
    let Some(task) = task_data() else {
        crate::common::have_or_skip(
            false,
            "Toolathlon's apply-phd-email task",
            &format!(
                "Toolathlon's apply-phd-email data (set SANDBOX_AGENT_BENCHMARK_DATA to the directory holding {TASK})"
            ),
        );
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &[]);
    let out = std::process::Command::new("python3")
        .arg(DRIVER)
        .arg(&host.base)
        .arg(KEY_A)
        .arg(&task)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "toolathlon_mail.py: {}\nthe host's log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.path().join("host.log")).unwrap_or_default()
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("driver JSON");

    assert_eq!(v["acquire"][0], 200, "{}", v["acquire"]);
    assert_eq!(v["dump_before"]["data"]["users"], serde_json::json!({}));
    // A json_string that is not a mailbox export: an error naming the field.
    let bad = &v["import_bad"];
    assert_eq!(bad["is_error"], true, "{bad}");
    assert!(
        bad["text"]
            .as_str()
            .is_some_and(|t| t.contains("emails[0].to_addr is required")),
        "{bad}"
    );
    assert_eq!(v["import"]["is_error"], false, "{}", v["import"]);
    assert!(
        v["import"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("Successfully imported 3/3 emails")),
        "{}",
        v["import"]
    );
    assert_eq!(v["upload"], 200);
    assert_eq!(v["initialize"], 200);

    // The lease's account is maryc@mcp7.com: the imported mail is its INBOX,
    // and what it sent comes from it.
    let dump = &v["dump"];
    let seen = outline(dump);
    let inbox = emails(dump, "maryc@mcp7.com");
    assert_eq!(
        inbox.iter().filter(|e| e["folder"] == "INBOX").count(),
        3,
        "{seen}"
    );
    assert!(
        inbox
            .iter()
            .any(|e| e["from_addr"] == "kaiming@mcp7.com"
                && e["to_addr"] == "mary.castillo@mcp7.com"),
        "{seen}"
    );
    let receiver = v["receiver"].as_str().expect("receiver");
    assert_eq!(receiver, "myersj@mcp7.com");
    assert_eq!(v["receiver_named"], serde_json::json!([receiver]));
    assert_eq!(v["send"]["is_error"], false, "{}", v["send"]);
    let got = emails(dump, receiver);
    assert!(
        got.iter().any(|e| e["from_addr"]
            .as_str()
            .is_some_and(|f| f.contains("maryc@mcp7.com"))),
        "{seen}"
    );

    // The task's check: one mail with the subject and a ZIP whose tree is
    // the ground truth's.
    let eval = &v["evaluation"];
    assert_eq!(eval["matching_emails"], 1, "{eval}");
    assert_eq!(
        eval["top"],
        serde_json::json!(["Application_Materials_MaryCastillo_2201210606"]),
        "{eval}"
    );
    assert_eq!(eval["differences"], serde_json::json!([]), "{eval}");
    assert_eq!(v["release"], 200);
}
