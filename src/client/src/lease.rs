//! Binding a request to the lease that admitted it.
//!
//! A host checks a tenant's request once, when it arrives, against the
//! sandbox the tenant holds then; the request may reach the agent (or its
//! body may finish arriving) after that lease ended and the next tenant's
//! began in the same sandbox. So the host names the lease it admitted the
//! request under, in every call it makes for it: the [`HEADER`] metadata
//! on gRPC calls ([`crate::Client::for_lease`]), the same header on MCP
//! requests it forwards. The agent refuses a request whose lease is no
//! longer current, checked once its body is read and right before it
//! touches a server or the workspace. A request without the header (a
//! developer's `sandboxctl`) is bound to the lease current when it arrived.

/// The lease a request was admitted under: gRPC metadata key and HTTP
/// header name (lowercase, as both want it).
pub const HEADER: &str = "sandbox-lease";
