//! sandbox-host's Kubernetes fleet, through kubernetes-sigs/agent-sandbox.
//!
//! - [`crd`]: agent-sandbox's resources as typed structs of our own.
//! - [`lease`]: a lease as its claim carries it (labels to find it,
//!   one annotation holding the record), so every host replica reads the
//!   same state and a restarted one loses nothing.
//! - [`fleet`]: claiming a warm sandbox (create the claim, wait bounded
//!   for its sandbox Ready with a pod IP, delete it on any failure or
//!   when the wait is dropped), recording, listing and releasing leases.
//! - [`coord`]: replicas' presence, the reaper's leader, and each owner's
//!   admissions, through `coordination.k8s.io` Leases.
//! - [`error`]: [`KubeError`], by cause (the pool empty past the wait, a
//!   claim that failed, the API server unreachable or forbidding).

pub mod coord;
pub mod crd;
pub mod error;
pub mod fleet;
pub mod lease;
pub mod retry;

pub use error::KubeError;
pub use fleet::{Claimed, Fleet, FleetConfig};
pub use kube;
pub use lease::Lease;
