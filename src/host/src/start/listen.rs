//! The host's listeners: the API's (`--listen`, its base URL) and
//! `/metrics`' own (`--metrics-listen`), and the open-file limit their
//! connections need.

use anyhow::Context;
use sandbox_client::transport::Endpoint;
use sandbox_serve::listen::Listener;

use crate::config::Args;

/// Binds `--listen`; returns the listener and the base URL it is reached
/// at (`--public-url`, else the bound address).
pub(super) async fn listen(args: &Args) -> anyhow::Result<(Listener, String)> {
    let endpoint: Endpoint = format!("tcp://{}", args.listen)
        .parse()
        .with_context(|| format!("--listen {}", args.listen))?;
    let listener = Listener::bind(&endpoint)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = match listener.local_endpoint() {
        Endpoint::Tcp { host, port } => {
            anyhow::ensure!(
                !args.sandbox_host_ports.contains(port),
                "--sandbox-host-port {port} is this host's own API port: never forwarded into a sandbox"
            );
            if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        }
        other => other.to_string(),
    };
    let public_url = args
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"))
        .trim_end_matches('/')
        .to_owned();
    Ok((listener, public_url))
}

/// Binds `--metrics-listen` (never the API's address: the bind fails).
pub(super) async fn listen_metrics(addr: &str) -> anyhow::Result<Listener> {
    let endpoint: Endpoint = format!("tcp://{addr}")
        .parse()
        .with_context(|| format!("--metrics-listen {addr}"))?;
    let listener = Listener::bind(&endpoint)
        .await
        .with_context(|| format!("listening on {addr} (--metrics-listen)"))?;
    tracing::info!(
        address = %listener.local_endpoint(),
        "serving /metrics on its own address, without a key"
    );
    Ok(listener)
}

/// Raises the soft open-file limit to the hard one when the connection
/// cap (plus room for the store, the agents and the uploads) does not fit
/// in it, and warns when even the hard limit is too small: then an accept
/// may fail with EMFILE (it is retried; nothing else misjudges it).
pub(super) fn raise_open_files(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let want = max_connections as u64 + 512;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= want {
        return;
    }
    let new = want.min(hard);
    if new > soft && setrlimit(Resource::RLIMIT_NOFILE, new, hard).is_err() {
        tracing::warn!(soft, hard, "could not raise the open-file limit");
    }
    if new < want {
        tracing::warn!(
            limit = new,
            max_connections,
            "the open-file limit is below --max-connections + 512; lower --max-connections or raise `ulimit -n`"
        );
    }
}
