//! canvas's per-server data through sandbox-host: CanvasData loaded into
//! the Canvas LMS of the lease's credentials and dumped back, by the
//! canvas server's data tool (packaging/launchers/canvas-data) over
//! Canvas's REST API. Canvas LMS itself cannot run here, so a test double
//! of the few calls used stands in for it (tests/clients/canvas_standin.py);
//! the canvas MCP server reads the same stand-in.

use std::time::Duration;

use crate::common::host::{Host, KEY_A, KEY_B, acquire, http, py, release};
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
    Host::start_env(
        dir,
        &[],
        &[
            ("CANVAS_API_URL", url),
            ("CANVAS_API_TOKEN", token),
            // The stand-in speaks plain http on loopback.
            ("CANVAS_ALLOW_INSECURE_HTTP", "true"),
        ],
    )
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
