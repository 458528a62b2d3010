//! No fidelity test passes by skipping in CI: each one, run without its
//! data under `CI=true`, fails and names what it lacks (outside CI it
//! says SKIPPED on the terminal, past the harness's capture).

use std::process::Command;

/// This test binary's fidelity tests, each with what its failure must
/// name.
const FIDELITY: &[(&str, &str)] = &[
    (
        "openapi::the_document_is_klavis_s_for_every_local_sandbox_operation",
        "local-sandbox-openapi.json",
    ),
    ("profiles::mcp_atlas_comes_with_its_data", "MCP_Atlas/data"),
    (
        "benchmark_tasks::toolathlon_privacy_desensitization_passes_its_check",
        "privacy-desensitization",
    ),
    (
        "benchmark_tasks::mcp_atlas_task_over_data_with_desktop_commander_and_memory",
        "MCP_Atlas/data",
    ),
    (
        "benchmark_tasks::mcp_atlas_genres_task_passes_its_claims",
        "MCP_Atlas/data",
    ),
    (
        "toolathlon_mail::apply_phd_email_passes_its_check",
        "apply-phd-email",
    ),
];

#[test]
fn fidelity_tests_without_their_data_fail_in_ci() {
    let me = std::env::current_exe().expect("this test binary");
    let empty = tempfile::tempdir().expect("tempdir");
    for (test, names) in FIDELITY {
        let out = Command::new(&me)
            .args([test, "--exact", "--test-threads", "1"])
            .env("CI", "true")
            .env("SANDBOX_AGENT_BENCHMARK_DATA", empty.path())
            .env("SANDBOX_AGENT_KLAVIS_API", empty.path())
            .output()
            .expect("the test binary");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains("running 1 test"),
            "{test} is not a test of this binary any more:\n{text}"
        );
        assert!(
            !out.status.success(),
            "{test} passed under CI=true without its data:\n{text}"
        );
        assert!(
            text.contains("CI=true") && text.contains(names),
            "{test} failed without naming {names:?}:\n{text}"
        );
    }
}
