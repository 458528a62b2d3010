//! `/local-sandbox`: Klavis's Local Sandbox API's sandboxes (acquire,
//! list, get, reset, release) and their workspaces' transfers (upload URL,
//! initialize, dump, and the signed URLs behind them).

pub mod lifecycle;
pub mod transfer;
