//! [`Fence`]: the lease a workspace request was admitted under, checked
//! where the request reads or changes the workspace
//! (`sandbox_client::lease`).

use std::sync::Arc;

use super::WorkspaceError;

/// The lease a request was admitted under, checked with the workspace
/// claimed, right before an operation reads or changes it: a request whose
/// lease has ended since it arrived (its body still arriving when the next
/// tenant leased the sandbox) is refused there (`sandbox_client::lease`).
#[derive(Clone)]
pub struct Fence(Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl Fence {
    /// `check` says why the request may no longer proceed.
    pub fn new(check: impl Fn() -> Result<(), String> + Send + Sync + 'static) -> Fence {
        Fence(Arc::new(check))
    }

    pub(super) fn check(f: &Option<Fence>) -> Result<(), WorkspaceError> {
        match f {
            Some(f) => (f.0)().map_err(WorkspaceError::LeaseEnded),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fence")
    }
}
