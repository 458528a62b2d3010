//! `sandbox-host`: the reference host. Serves Klavis's Local Sandbox REST
//! API over a pool of sandbox agents, and their MCP endpoints.
//!
//! Modules, in layers (each imports only its own and the ones below it;
//! ARCHITECTURE.md): `config` (the flags and their checks; it names the
//! backend kind), `start` (data dir, pool, fleet, store and listener up;
//! the orderly stop); `api` (the REST endpoints, `/openapi.json`, MCP URLs
//! → the agent's data plane, `/metrics`, the TTL reaper) and `error` (every
//! failure by cause, and the one place it becomes a status); `uploads` (the
//! upload store); `fleet` (where sandboxes come from: the local pool, or
//! claimed pods); `store` (the leases), `pool` (the process and qemu
//! backends, isolation and the warm pool), `metrics` (the counters),
//! `signed` (transfer URLs).

#![warn(clippy::too_many_lines)]

mod api;
mod config;
mod error;
mod fleet;
mod lease;
mod metrics;
mod pool;
mod signed;
mod start;
mod store;
mod uploads;

use std::io::Write;
use std::time::Duration;

use clap::Parser;

use config::{API_KEY_ENV, Args, LogFormat};
use lease::Host;
use start::Started;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let env_keys = std::env::var(API_KEY_ENV).ok();
    // SAFETY: no other thread runs yet (the runtime starts below).
    unsafe { std::env::remove_var(API_KEY_ENV) };
    init_logs(args.log_format);
    let checked = Host::check(&args, env_keys)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let started = Host::start(&args, checked).await?;
        // The base URL is printed, and the listener served, once the
        // catalogs are ready; a stop meanwhile stops the host.
        tokio::select! {
            () = started.record_catalogs() => {}
            () = terminated() => {
                Started::stop(started.host, started.pool).await;
                return anyhow::Ok(());
            }
        }
        println!("sandbox-host: base URL {}", started.public_url);
        if let Some(k) = &started.generated_key {
            println!("sandbox-host: API key {k}");
        }
        let _ = std::io::stdout().flush();
        let limits = sandbox_serve::http::HttpLimits {
            max_connections: args.max_connections,
            header_timeout: Duration::from_millis(args.header_timeout_ms),
            // As axum::serve did: requests in flight finish (downloads too).
            drain: Duration::MAX,
        };
        let Started {
            host,
            pool,
            listener,
            metrics_listener,
            ..
        } = started;
        if let Some(l) = metrics_listener {
            let app =
                hyper_util::service::TowerToHyperService::new(api::metrics::router(host.clone()));
            tokio::spawn(sandbox_serve::http::serve_http(
                l,
                limits,
                terminated(),
                app,
            ));
        }
        let app = hyper_util::service::TowerToHyperService::new(api::router(host.clone()));
        sandbox_serve::http::serve_http(listener, limits, terminated(), app).await;
        Started::stop(host, pool).await;
        anyhow::Ok(())
    })
}

/// Logs to stderr, as text or JSON lines, filtered by RUST_LOG (default
/// info).
fn init_logs(format: LogFormat) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        // Colour only for a person at a terminal, never into a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().with_current_span(true).init(),
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
