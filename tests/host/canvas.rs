//! canvas's per-server data through sandbox-host: CanvasData loaded into
//! the Canvas LMS of the lease's credentials and dumped back, by the
//! canvas server's data tool (packaging/launchers/canvas-data) over
//! Canvas's REST API. Canvas LMS itself cannot run here, so a test double
//! of the few calls used stands in for it (tests/clients/canvas_standin.py);
//! the canvas MCP server reads the same stand-in.

use std::time::Duration;

use crate::common::host::{Host, KEY_A, KEY_B, acquire, http, py, release, run_script};
use crate::common::standin::StandIn;
use crate::common::{eventually, when};

const TOKEN: &str = "canvas-test-token";

/// The Canvas stand-in; its API base URL.
fn stand_in() -> (StandIn, String) {
    let s = StandIn::start("canvas_standin.py", &[TOKEN]);
    let url = format!("{}/api/v1", s.base);
    (s, url)
}

/// A host whose agents reach Canvas at `url` with `token`: they pass the
/// variables on to the canvas server (its pass_env).
fn host_for(dir: &std::path::Path, url: &str, token: &str) -> Host {
    host_with(dir, url, token, &[])
}

/// [`host_for`] with more environment for the host and its agents.
fn host_with(dir: &std::path::Path, url: &str, token: &str, env: &[(&str, &str)]) -> Host {
    let mut all = vec![
        ("CANVAS_API_URL", url),
        ("CANVAS_API_TOKEN", token),
        // The stand-in speaks plain http on loopback.
        ("CANVAS_ALLOW_INSECURE_HTTP", "true"),
    ];
    all.extend_from_slice(env);
    let mut extra = crate::common::standin::reach(url);
    if env.iter().any(|(k, _)| *k == "TMPDIR") {
        // The agents' own temporary directory, shared with the tenant: the
        // setting of finding 5 (an agent without namespaces, as in a VM
        // whose /tmp the tenant shares), so no --isolation here.
        extra.extend(["--isolation".into(), "none".into()]);
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    Host::start_env(dir, &extra, &all)
}

const COURSE: &str = r#"{"courses": [{
    "name": "Statistics 201", "course_code": "STAT201", "published": true,
    "assignments": [{"name": "Regression project", "points_possible": 20,
                     "submission_types": ["online_upload"]}],
    "quizzes": [{"title": "Midterm", "questions": [
        {"question_text": "<p>Is 7 prime?</p>", "question_type": "true_false_question",
         "answers": [{"answer_text": "True", "answer_weight": 100}]}]}],
    "enrollments": [{"user_email": "ann@mcp.com", "role": "TeacherEnrollment"}],
    "announcements": [{"title": "Office hours", "message": "<p>Fridays at 10.</p>"}]
}]}"#;

#[test]
fn canvas_data_round_trips_through_its_service() {
    let (_canvas, canvas_url) = stand_in();
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host_for(dir.path(), &canvas_url, TOKEN);
    let a = acquire(
        &host,
        KEY_A,
        r#"{"server_names": ["canvas", "filesystem"]}"#,
    );
    let id = a["local_sandbox_id"].as_str().expect("id");
    let base = format!("{}/local-sandbox", host.base);
    let init = format!("{base}/canvas/{id}/initialize");

    // Refused data creates nothing: a missing course_code, an unknown user.
    let (code, v) = http(
        "POST",
        &init,
        Some(KEY_A),
        Some(r#"{"courses": [{"name": "No code"}]}"#),
    );
    assert_eq!(code, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("courses[0].course_code")),
        "{v}"
    );
    let (code, v) = http(
        "POST",
        &init,
        Some(KEY_A),
        Some(
            r#"{"courses": [{"name": "X", "course_code": "X1", "enrollments": [{"user_email": "nobody@mcp.com"}]}]}"#,
        ),
    );
    assert_eq!(code, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("nobody@mcp.com")),
        "{v}"
    );

    let (code, v) = http("POST", &init, Some(KEY_A), Some(COURSE));
    assert_eq!(code, 200, "{v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("\"courses\": 1")),
        "{v}"
    );

    let (code, d) = http(
        "GET",
        &format!("{base}/canvas/{id}/dump"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 200, "{d}");
    assert_eq!(d["server_name"], "canvas", "{d}");
    let courses = d["data"]["courses"].as_array().cloned().unwrap_or_default();
    assert_eq!(courses.len(), 1, "only what was loaded: {d}");
    let c = &courses[0];
    assert_eq!(c["course_code"], "STAT201", "{c}");
    assert_eq!(c["published"], true, "{c}");
    assert_eq!(c["assignments"][0]["name"], "Regression project", "{c}");
    assert_eq!(
        c["quizzes"][0]["questions"][0]["question_text"], "<p>Is 7 prime?</p>",
        "{c}"
    );
    assert_eq!(c["enrollments"][0]["user_email"], "ann@mcp.com", "{c}");
    assert_eq!(c["enrollments"][0]["role"], "TeacherEnrollment", "{c}");
    assert_eq!(c["announcements"][0]["title"], "Office hours", "{c}");

    // The canvas MCP server sees the loaded course in the same service.
    let listed = py(
        &host,
        KEY_A,
        &["profile-bare", "-", "canvas", "list_courses", "{}"],
    );
    assert!(
        listed["text"]
            .as_str()
            .unwrap_or_default()
            .contains("Statistics 201"),
        "{listed}"
    );

    // google_cloud is not in this sandbox; filesystem has no such data.
    let (code, v) = http(
        "GET",
        &format!("{base}/google_cloud/{id}/dump"),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 400, "{v}");
    release(&host, KEY_A, id);
}

/// Canvas refusing the lease's token is the caller's to fix: a 400 that
/// says so, not a server error.
#[test]
fn a_refused_canvas_token_is_named() {
    let (_canvas, canvas_url) = stand_in();
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host_for(dir.path(), &canvas_url, "wrong-token");
    let a = acquire(&host, KEY_A, r#"{"server_names": ["canvas"]}"#);
    let id = a["local_sandbox_id"].as_str().expect("id");
    let (code, v) = http(
        "GET",
        &format!("{}/local-sandbox/canvas/{id}/dump", host.base),
        Some(KEY_A),
        None,
    );
    assert_eq!(code, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("CANVAS_API_TOKEN")),
        "{v}"
    );
    release(&host, KEY_A, id);
}

/// The attack of issue 27's finding 5: a tenant's script plants symlinks
/// at the names data tools wrote to (`$TMPDIR/load-<agent pid>-<n>.json`,
/// `dump-…`, the same in the mail service's directory), pointing at a file
/// it wants overwritten, then runs loads and dumps. Each run now writes in
/// a fresh private directory, so the file stays as it was and the loads
/// work.
#[test]
fn planted_symlinks_are_never_written_through() {
    let (_canvas, canvas_url) = stand_in();
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    // World-writable and sticky, as /tmp is.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "the operator's file\n").expect("victim");
    let tmp_s = tmp.display().to_string();
    let host = host_with(dir.path(), &canvas_url, TOKEN, &[("TMPDIR", &tmp_s)]);
    let a = acquire(
        &host,
        KEY_A,
        r#"{"server_names": ["canvas", "poste_email_toolathlon"]}"#,
    );
    let id = a["local_sandbox_id"].as_str().expect("id");
    let plant = format!(
        r#"import os
TMP, VICTIM = {tmp:?}, {victim:?}
def parent(p):
    return int(open(f"/proc/{{p}}/stat").read().rsplit(")", 1)[1].split()[1])
def argv(p):
    return open(f"/proc/{{p}}/cmdline", "rb").read().decode().split("\0")
agent = os.getppid()
while agent > 1 and not argv(agent)[0].endswith("sandbox-agent"):
    agent = parent(agent)
a = argv(agent)
dirs = [TMP, os.path.join(a[a.index("--state-root") + 1], "mail")]
n = 0
for d in dirs:
    for kind in ("load", "dump"):
        for seq in range(64):
            os.symlink(VICTIM, os.path.join(d, f"{{kind}}-{{agent}}-{{seq}}.json"))
            n += 1
print(f"planted {{n}} links for agent {{agent}} in {{dirs}}")
"#,
        tmp = tmp_s,
        victim = victim.display().to_string(),
    );
    let (status, log) = run_script(&host, KEY_A, id, "plant", &plant);
    assert_eq!(status, "completed", "{log}");
    assert!(log.contains("planted 256 links"), "{log}");

    let base = format!("{}/local-sandbox", host.base);
    for server in ["canvas", "poste_email_toolathlon"] {
        let data = if server == "canvas" {
            COURSE
        } else {
            r#"{"users": {"ann@mcp.com": {"emails": [{"subject": "s", "from_addr": "b@mcp.com", "to_addr": "ann@mcp.com"}]}}}"#
        };
        let (code, v) = http(
            "POST",
            &format!("{base}/{server}/{id}/initialize"),
            Some(KEY_A),
            Some(data),
        );
        assert_eq!(code, 200, "{server}: {v}");
        let (code, v) = http(
            "GET",
            &format!("{base}/{server}/{id}/dump"),
            Some(KEY_A),
            None,
        );
        assert_eq!(code, 200, "{server}: {v}");
    }
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "the operator's file\n",
        "a data tool wrote through a planted symlink"
    );
    // Each run's directory went with it.
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .expect("tmp")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("sandbox-data-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    release(&host, KEY_A, id);
}

/// The names of `courses` (a Canvas list or a dump's `courses`), sorted.
fn names(courses: &serde_json::Value) -> Vec<String> {
    let mut n: Vec<String> = courses
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    n.sort();
    n
}

/// Every course in the stand-in's account, read with the operator's token
/// outside any sandbox.
fn in_canvas(url: &str) -> Vec<String> {
    let (code, v) = http(
        "GET",
        &format!("{url}/accounts/1/courses?per_page=100"),
        Some(TOKEN),
        None,
    );
    assert_eq!(code, 200, "{v}");
    names(&v)
}

/// The courses sandbox `id`'s dump shows its owner `key`.
fn dumped(host: &Host, key: &str, id: &str) -> Vec<String> {
    let (code, d) = http(
        "GET",
        &format!("{}/local-sandbox/canvas/{id}/dump", host.base),
        Some(key),
        None,
    );
    assert_eq!(code, 200, "{d}");
    names(&d["data"]["courses"])
}

/// Two tenants on the operator's Canvas account (the host's environment,
/// shared by every sandbox): B's fresh sandbox dumps none of A's courses,
/// nor the account's own; Reset and Release delete from Canvas what the
/// lease loaded, and nothing else.
#[test]
fn tenants_of_the_operators_canvas_account_see_and_delete_only_their_own() {
    let (_canvas, url) = stand_in();
    // A course the account had before any sandbox.
    let (code, v) = http(
        "POST",
        &format!("{url}/accounts/1/courses"),
        Some(TOKEN),
        Some(r#"{"course": {"name": "Operator course", "course_code": "OPS"}, "offer": true}"#),
    );
    assert_eq!(code, 200, "{v}");
    let dir = tempfile::tempdir().expect("tempdir");
    let host = host_for(dir.path(), &url, TOKEN);
    let body = r#"{"server_names": ["canvas"]}"#;
    let a = acquire(&host, KEY_A, body);
    let a = a["local_sandbox_id"].as_str().expect("id");
    let init = |id: &str| format!("{}/local-sandbox/canvas/{id}/initialize", host.base);
    let (code, v) = http("POST", &init(a), Some(KEY_A), Some(COURSE));
    assert_eq!(code, 200, "{v}");
    assert_eq!(dumped(&host, KEY_A, a), ["Statistics 201"]);

    let b = acquire(&host, KEY_B, body);
    let b = b["local_sandbox_id"].as_str().expect("id");
    assert_ne!(a, b);
    assert_eq!(
        dumped(&host, KEY_B, b),
        Vec::<String>::new(),
        "B's fresh sandbox shows another tenant's courses"
    );
    let (code, v) = http(
        "POST",
        &init(b),
        Some(KEY_B),
        Some(r#"{"courses": [{"name": "B course", "course_code": "B1"}]}"#),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(dumped(&host, KEY_B, b), ["B course"]);
    assert_eq!(
        in_canvas(&url),
        ["B course", "Operator course", "Statistics 201"]
    );

    // Reset is what a fresh Acquire gives: B's course is gone from Canvas.
    let (code, v) = http(
        "POST",
        &format!("{}/local-sandbox/{b}/reset", host.base),
        Some(KEY_B),
        None,
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(dumped(&host, KEY_B, b), Vec::<String>::new());
    assert_eq!(in_canvas(&url), ["Operator course", "Statistics 201"]);

    // A's Release deletes A's course (the release ends in the background).
    release(&host, KEY_A, a);
    eventually(
        Duration::from_secs(60),
        "A's course deleted from Canvas at A's Release",
        || {
            let left = in_canvas(&url);
            when(left == ["Operator course"], || format!("{left:?}"))
        },
    );
    release(&host, KEY_B, b);
}
