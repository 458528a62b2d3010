//! `GET /metrics` (the counters are `crate::metrics`'s): behind an API key
//! on the API's address ([`guard`]), or alone and without one on
//! `--metrics-listen`'s ([`router`]).

use crate::error::HostError;

/// In front of `/metrics` on the API's address: an API key, as every
/// route; 404 when `--metrics-listen` serves it elsewhere.
pub async fn guard(
    axum::extract::State(h): axum::extract::State<super::Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if !h.metrics.keyed {
        return (
            http::StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"detail": "Not Found"})),
        )
            .into_response();
    }
    // The scheme is case-insensitive (RFC 9110 11.1), as on every route.
    let key = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, k)| k.trim());
    match key {
        None => HostError::NoKey.into_response(),
        Some(k) if !h.keys.contains_key(k) => HostError::BadKey.into_response(),
        Some(_) => next.run(req).await,
    }
}

/// `--metrics-listen`'s server: `GET /metrics` alone, without a key.
pub fn router(h: super::Shared) -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(unkeyed))
        .with_state(h)
}

/// `GET /metrics`: the pool and Acquire metrics, for Prometheus.
pub async fn unkeyed(
    axum::extract::State(h): axum::extract::State<super::Shared>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match h.metrics.render() {
        Ok(text) => (
            [(
                http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => (
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed",
        )
            .into_response(),
    }
}
