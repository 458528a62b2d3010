//! Where tests stop the agent mid-swap, to kill it there.

/// Test hook: with `SANDBOX_AGENT_TEST_FAULT=<point>`, the agent stops at
/// that point of a swap (sleeping until killed), so tests can SIGKILL it
/// there deterministically. Points: `after-journal`, `mid-move-out`,
/// `mid-move-in`, `before-commit`. Only debug builds (what the tests run)
/// have it: in a release binary this is an empty function.
#[cfg(debug_assertions)]
pub fn fault_point(point: &str) {
    if std::env::var("SANDBOX_AGENT_TEST_FAULT").is_ok_and(|v| v == point) {
        tracing::warn!(point, "SANDBOX_AGENT_TEST_FAULT: pausing here until killed");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Release builds carry no fault points.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn fault_point(_point: &str) {}
