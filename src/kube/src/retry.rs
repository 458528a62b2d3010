//! Transient API errors, tried again within a short window before they
//! are reported: a 403 while the API server's authorizer warms after a
//! restart (seen: 4 within 25 ms of a kube-apiserver restart), 429, and
//! for a call that may be repeated, a 5xx or a connection that failed.
//! What persists past the window is reported as it is ([`KubeError::api`]
//! says which permission a 403 lacks).
//!
//! [`KubeError::api`]: crate::KubeError

use std::future::Future;
use std::time::{Duration, Instant};

/// How long errors are tried again before they are reported.
pub const WINDOW: Duration = Duration::from_millis(1500);
/// The first pause; each next one is twice as long.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// Whether a call may be sent twice: a create answered 5xx may have been
/// made, so only a 403 or 429 (refused before anything was done) repeats
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Repeatable,
    Create,
}

/// `f` until it succeeds, fails for good, or [`WINDOW`] has passed.
pub(crate) async fn retried<T, Fut>(
    call: Call,
    mut f: impl FnMut() -> Fut,
) -> Result<T, kube::Error>
where
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + WINDOW;
    let mut pause = FIRST_PAUSE;
    loop {
        match f().await {
            Err(e) if transient(&e, call) && Instant::now() + pause < deadline => {
                tracing::info!(error = %e, "a transient error of the Kubernetes API server; trying again");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            r => return r,
        }
    }
}

pub(crate) fn transient(e: &kube::Error, call: Call) -> bool {
    match e {
        kube::Error::Api(s) => match s.code {
            403 | 429 => true,
            500 | 502 | 503 | 504 => call == Call::Repeatable,
            _ => false,
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) => call == Call::Repeatable,
        _ => false,
    }
}
