//! The versions MCP_Atlas and Toolathlon pin, installed side by side by
//! packaging/install-servers.sh: under each profile the servers run those
//! versions (the process is the pinned install, the listing's metadata
//! says which) and answer a tool call through sandboxctl.

use crate::common::as_tenant;
use crate::common::mcp::*;
use sandbox_client::proto;

/// (server, pinned version, tool (`tools`: list them), arguments (`{ws}`:
/// the workspace), what the answer contains)
type Call = (
    &'static str,
    &'static str,
    &'static str,
    String,
    &'static str,
);

async fn check_profile(bench: &str, calls: &[Call]) {
    let agent = agent_with("", "mail_ports = \"auto\"\n");
    let names: Vec<&str> = calls.iter().map(|c| c.0).collect();
    sandboxctl(
        &agent,
        &[
            "acquire",
            "--servers",
            &names.join(","),
            "--benchmark",
            bench,
        ],
    );
    let ws = agent.dir.path().join("ws");
    let st = std::process::Command::new("git")
        .args(["init", "-q"])
        .arg(&ws)
        .status()
        .expect("git init");
    assert!(st.success());
    as_tenant(&ws, &ws);
    let c = sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect");
    let listed = c
        .servers()
        .list(proto::ListServersRequest::default())
        .await
        .expect("List")
        .into_inner()
        .servers;
    for (server, version, tool, args, want) in calls {
        let s = listed
            .iter()
            .find(|s| s.name == *server)
            .unwrap_or_else(|| panic!("{server} listed"));
        assert_eq!(
            s.metadata.get("version").map(String::as_str),
            Some(*version),
            "{bench} {server}"
        );
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", s.pid)).unwrap_or_default();
        assert!(
            String::from_utf8_lossy(&cmdline).contains(&format!("@{bench}")),
            "{bench} {server} runs {}",
            String::from_utf8_lossy(&cmdline).replace('\0', " ")
        );
        let args = args.replace("{ws}", &ws.display().to_string());
        // "tools": list them (a call would need the outside service).
        let out = if *tool == "tools" {
            sandboxctl(&agent, &["mcp", server, "tools"])
        } else {
            sandboxctl(&agent, &["mcp", server, "call", tool, "--args", &args])
        };
        assert!(
            out.contains(want),
            "{bench} {server} {tool}: expected '{want}' in:\n{out}"
        );
    }
    sandboxctl(&agent, &["release"]);
}

#[tokio::test]
async fn mcp_atlas_runs_the_versions_it_pins() {
    let memory = r#"{"entities":[{"name":"pinned","entityType":"t","observations":["x"]}]}"#;
    check_profile(
        "MCP_Atlas",
        &[
            (
                "filesystem",
                "2025.12.18",
                "list_allowed_directories",
                "{}".into(),
                "/",
            ),
            (
                "localmemory",
                "2025.8.4",
                "create_entities",
                memory.into(),
                "pinned",
            ),
            (
                "code-runner",
                "0.1.7",
                "run-code",
                r#"{"code":"console.log(6*7)","languageId":"javascript"}"#.into(),
                "42",
            ),
            (
                "git",
                "2025.7.1",
                "git_status",
                r#"{"repo_path":"{ws}"}"#.into(),
                "No commits yet",
            ),
            ("arxiv", "0.2.11", "tools", String::new(), "search_papers"),
        ],
    )
    .await;
}

#[tokio::test]
async fn toolathlon_runs_the_versions_it_pins() {
    let memory = r#"{"entities":[{"name":"pinned","entityType":"t","observations":["x"]}]}"#;
    check_profile(
        "Toolathlon",
        &[
            (
                "filesystem",
                "2025.7.1",
                "list_allowed_directories",
                "{}".into(),
                "/",
            ),
            (
                "localmemory",
                "2025.4.25",
                "create_entities",
                memory.into(),
                "pinned",
            ),
            (
                "git",
                "2025.1.14",
                "git_status",
                r#"{"repo_path":"{ws}"}"#.into(),
                "No commits yet",
            ),
            ("arxiv", "0.2.10", "tools", String::new(), "search_papers"),
            (
                "excel",
                "0.1.4",
                "create_workbook",
                r#"{"filepath":"{ws}/book.xlsx"}"#.into(),
                "book.xlsx",
            ),
            (
                "word",
                "1.1.9",
                "create_document",
                r#"{"filename":"{ws}/doc.docx"}"#.into(),
                "doc.docx",
            ),
            (
                "powerpoint",
                "2.0.6",
                "create_presentation",
                "{}".into(),
                "presentation",
            ),
            (
                "poste_email_toolathlon",
                "0.1.12",
                "get_emails",
                "{}".into(),
                "INBOX",
            ),
        ],
    )
    .await;
}
