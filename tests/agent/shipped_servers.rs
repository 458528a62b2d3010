//! Every server of the shipped manifest (packaging/servers.toml), as
//! packaging/install-servers.sh installs it, starts under the real agent:
//! the thirteen that need no outside service each answer one tool call
//! through the agent's data plane (sandboxctl, the real client), and the
//! three that need one (google_cloud, poste_email_toolathlon, canvas) start
//! with credentials of the right form and list their tools (no call reaches
//! the outside service: there is none here). The public-data servers start
//! and list their tools too.

use crate::common::mcp::*;
use crate::common::*;

/// A one-page PDF whose text is `text` (byte offsets computed, so the
/// cross-reference table is valid).
fn pdf(text: &str) -> Vec<u8> {
    let stream = format!("BT /F1 24 Tf 20 100 Td ({text}) Tj ET");
    let objects = [
        "<</Type/Catalog/Pages 2 0 R>>".to_owned(),
        "<</Type/Pages/Kids[3 0 R]/Count 1>>".to_owned(),
        "<</Type/Page/Parent 2 0 R/MediaBox[0 0 300 200]/Contents 4 0 R/Resources<</Font<</F1 5 0 R>>>>>>"
            .to_owned(),
        format!("<</Length {}>>\nstream\n{stream}\nendstream", stream.len()),
        "<</Type/Font/Subtype/Type1/BaseFont/Helvetica>>".to_owned(),
    ];
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{o}\nendobj\n", i + 1).as_bytes());
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for o in offsets {
        out.extend_from_slice(format!("{o:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<</Size {}/Root 1 0 R>>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    out
}

#[test]
fn every_shipped_server_starts_and_answers() {
    let agent = agent_with("", "");
    let ws = agent.dir.path().join("ws");
    let local = [
        "filesystem",
        "git",
        "terminal",
        "desktop-commander",
        "arxiv",
        "excel",
        "word",
        "powerpoint",
        "code-executor",
        "code-runner",
        "pdf-tools",
        "localmemory",
        "playwright",
    ];
    sandboxctl(&agent, &["acquire", "--servers", &local.join(",")]);
    std::fs::write(ws.join("report.pdf"), pdf("sixtytwo")).expect("pdf");
    std::fs::write(ws.join("notes.txt"), "forty-two\n").expect("notes");
    let st = std::process::Command::new("git")
        .args(["init", "-q"])
        .arg(&ws)
        .status()
        .expect("git init");
    assert!(st.success());
    as_tenant(&ws, &ws);
    let w = ws.display().to_string();
    // (server, tool, arguments, what the answer must contain)
    let calls: Vec<(&str, &str, String, &str)> = vec![
        (
            "filesystem",
            "read_text_file",
            format!(r#"{{"path":"{w}/notes.txt"}}"#),
            "forty-two",
        ),
        (
            "git",
            "git_status",
            format!(r#"{{"repo_path":"{w}"}}"#),
            "No commits yet",
        ),
        (
            "terminal",
            "run_command",
            r#"{"command":"cat notes.txt"}"#.into(),
            "forty-two",
        ),
        (
            "desktop-commander",
            "list_directory",
            format!(r#"{{"path":"{w}"}}"#),
            "notes.txt",
        ),
        ("arxiv", "list_papers", "{}".into(), "total_papers"),
        (
            "excel",
            "create_workbook",
            format!(r#"{{"path":"{w}/book.xlsx"}}"#),
            "book.xlsx",
        ),
        (
            "word",
            "create_document",
            format!(r#"{{"filename":"{w}/doc.docx"}}"#),
            "created",
        ),
        (
            "powerpoint",
            "create_presentation",
            "{}".into(),
            "presentation_1",
        ),
        (
            "code-executor",
            "run_python_code",
            r#"{"code":"print(6*7)"}"#.into(),
            "42",
        ),
        (
            "code-runner",
            "run-code",
            r#"{"code":"console.log(6*7)","languageId":"javascript"}"#.into(),
            "42",
        ),
        (
            "pdf-tools",
            "read_pdf_pages",
            format!(r#"{{"pdf_file_path":"{w}/report.pdf","start_page":1,"end_page":1}}"#),
            "sixtytwo",
        ),
        (
            "localmemory",
            "create_entities",
            r#"{"entities":[{"name":"answer","entityType":"number","observations":["42"]}]}"#
                .into(),
            "answer",
        ),
        (
            "playwright",
            "browser_navigate",
            r#"{"url":"data:text/html,<title>sixtytwo</title><p>hi</p>"}"#.into(),
            "sixtytwo",
        ),
    ];
    assert_eq!(calls.len(), local.len());
    for (server, tool, args, want) in &calls {
        let out = sandboxctl(&agent, &["mcp", server, "call", tool, "--args", args]);
        assert!(
            out.contains(want),
            "{server} {tool}: expected '{want}' in:\n{out}"
        );
    }
    assert!(ws.join("book.xlsx").is_file() && ws.join("doc.docx").is_file());
    sandboxctl(&agent, &["release"]);

    // The three that need an outside service: credentials of the right
    // form (a generated service-account key; a mailbox and a Canvas URL on
    // closed loopback ports), so each starts and lists its tools.
    let key = std::process::Command::new("openssl")
        .args(["genrsa", "2048"])
        .output()
        .expect("openssl genrsa");
    assert!(key.status.success());
    let sa = agent.dir.path().join("service-account.json");
    std::fs::write(
        &sa,
        serde_json::json!({
            "type": "service_account",
            "project_id": "sandbox-test",
            "private_key_id": "1",
            "private_key": text(&key.stdout),
            "client_email": "test@sandbox-test.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token",
        })
        .to_string(),
    )
    .expect("service account");
    let sa_arg = format!("google_cloud.credentials_file={}", sa.display());
    sandboxctl(
        &agent,
        &[
            "acquire",
            "--servers",
            "google_cloud,poste_email_toolathlon,canvas",
            "--auth",
            "google_cloud.project_id=sandbox-test",
            "--auth",
            &sa_arg,
            "--auth",
            "poste_email_toolathlon.email=user@sandbox.test",
            "--auth",
            "poste_email_toolathlon.password=secret",
            "--auth",
            "poste_email_toolathlon.imap_server=127.0.0.1",
            "--auth",
            "poste_email_toolathlon.smtp_server=127.0.0.1",
            "--auth",
            "canvas.api_url=https://127.0.0.1:9/api/v1",
            "--auth",
            "canvas.api_token=token",
        ],
    );
    for (server, tool) in [
        ("google_cloud", "bigquery_run_query"),
        ("poste_email_toolathlon", "get_emails"),
        ("canvas", "list_courses"),
    ] {
        let out = sandboxctl(&agent, &["mcp", server, "tools"]);
        assert!(out.contains(tool), "{server}: no {tool} in:\n{out}");
    }
    // The mail account file is the server's state: 0600, gone on release.
    let account = state_dir(&agent).join("emails/account.json");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&account)
            .expect("account file")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    sandboxctl(&agent, &["release"]);
    assert!(!account.exists());
}

/// The public-data servers of the shipped manifest (Klavis serves each as
/// a sandbox of its own): each starts when named and lists its tools. No
/// tool is called, so nothing reaches the public APIs they use. They are
/// the manifest's servers that ALL leaves out (`in_all = false`), so one
/// added to the manifest without a line here fails this test.
#[test]
fn public_data_servers_start_and_list_their_tools() {
    // (server, a tool it lists)
    let servers = [
        ("calculator", "calculate"),
        ("context7", "resolve-library-id"),
        ("open_library", "get_book_by_title"),
        ("osm", "geocode_address"),
        ("wikipedia", "search_wikipedia"),
    ];
    let agent = agent_with("", "");
    let manifest = sandbox_agent::supervisor::manifest::Manifest::load(
        &agent.dir.path().join("servers.toml"),
        &sandbox_agent::supervisor::manifest::Roots {
            workspace: &agent.dir.path().join("ws"),
            state_root: &state_dir(&agent),
            data: None,
        },
    )
    .expect("the shipped manifest");
    let all = manifest.all_names();
    let named_only: Vec<String> = manifest
        .names()
        .into_iter()
        .filter(|n| !all.contains(n))
        .collect();
    assert_eq!(
        named_only,
        servers.map(|(s, _)| s.to_owned()),
        "the servers ALL leaves out"
    );
    let names: Vec<&str> = servers.iter().map(|(s, _)| *s).collect();
    sandboxctl(&agent, &["acquire", "--servers", &names.join(",")]);
    for (server, tool) in servers {
        let out = sandboxctl(&agent, &["mcp", server, "tools"]);
        assert!(out.contains(tool), "{server}: no {tool} in:\n{out}");
    }
    sandboxctl(&agent, &["release"]);
}

/// `--data-path`: the servers also see the workspace there (the
/// benchmarks' `/data`; here a path of the test's own, as a symlink). A
/// benchmark profile's terminal has it as its root, so a task's
/// `/data/...` path reads the uploaded file. (Its filesystem server
/// resolves its one root, the link, to the workspace, and refuses the
/// link's own paths: sandbox-host's slots and the VMs bind-mount /data,
/// `tests/host/benchmark_tasks.rs`.) A restart finds the link in place;
/// something else in the way stops the start with a clear error.
#[test]
fn the_workspace_is_also_at_the_data_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let manifest = dir.path().join("servers.toml");
    std::fs::write(&manifest, shipped_manifest(&state)).expect("manifest");
    let data = dir.path().join("data");
    let (m, d) = (manifest.display().to_string(), data.display().to_string());
    let args = ["--manifest", m.as_str(), "--data-path", d.as_str()];
    let agent = Agent::start_in(dir, &args, &[]);
    let ws = agent.dir.path().join("ws");
    assert_eq!(
        std::fs::read_link(&data).expect("a symlink"),
        ws,
        "data_path points at the workspace"
    );
    sandboxctl(
        &agent,
        &[
            "acquire",
            "--servers",
            "terminal",
            "--benchmark",
            "MCP_Atlas",
        ],
    );
    std::fs::write(ws.join("Barber Shop.csv"), "chair,price\n1,20\n").expect("csv");
    let read = serde_json::json!({ "command": format!("cat '{d}/Barber Shop.csv'") }).to_string();
    let out = sandboxctl(
        &agent,
        &["mcp", "terminal", "call", "run_command", "--args", &read],
    );
    assert!(out.contains("chair,price"), "{out}");
    sandboxctl(&agent, &["release"]);

    let dir = agent.kill9();
    let again = Agent::start_in(dir, &args, &[]);
    let dir = again.kill9();
    std::fs::remove_file(&data).expect("unlink");
    std::fs::create_dir(&data).expect("a directory in the way");
    let mut all = vec![
        "--listen".to_owned(),
        format!("unix://{}", dir.path().join("agent.sock").display()),
        "--workspace".to_owned(),
        dir.path().join("ws").display().to_string(),
    ];
    all.extend(args.iter().map(|s| s.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let out = agent_once(&all, &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("data_path") && err.contains("exists and is not the workspace"),
        "{err}"
    );
}
