//! Request bodies and query parameters, checked as Klavis's FastAPI
//! service checks them: the same messages, `loc`s and error types in the
//! 422 body.

use std::collections::HashMap;

use sandbox_client::proto;
use serde_json::{Value, json};

use super::*;
use sandbox_client::limits::{DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS, MIN_TTL_SECONDS};

pub(super) struct AcquireBody {
    pub servers: Option<Vec<String>>,
    pub benchmark: Option<String>,
    pub email: String,
    pub ttl: Option<u32>,
}

/// Validates `POST /local-sandbox` like the Klavis (pydantic) model does.
pub(super) fn parse_acquire(body: &[u8]) -> Result<AcquireBody, ApiError> {
    let v = body_object(body)?;
    let Some(o) = v.as_object() else {
        return Err(internal("a checked body is an object"));
    };
    let mut errors = Vec::new();
    let servers = match o.get("server_names") {
        None => {
            errors.push(verr(
                &[json!("body"), json!("server_names")],
                "Field required",
                "missing",
                &v,
            ));
            None
        }
        Some(Value::String(s)) if s == "ALL" => None,
        Some(Value::Array(a)) => {
            let mut names = Vec::new();
            for (i, n) in a.iter().enumerate() {
                match n.as_str() {
                    Some(s) if SERVER_NAMES.contains(&s) => names.push(s.to_owned()),
                    _ => errors.push(verr(
                        &[json!("body"), json!("server_names"), json!(i)],
                        format!(
                            "Input should be {}",
                            SERVER_NAMES
                                .iter()
                                .map(|s| format!("'{s}'"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        "enum",
                        n,
                    )),
                }
            }
            if a.is_empty() {
                errors.push(verr(
                    &[json!("body"), json!("server_names")],
                    "List should have at least 1 item after validation, not 0",
                    "too_short",
                    &json!([]),
                ));
            }
            Some(names)
        }
        Some(other) => {
            errors.push(verr(
                &[json!("body"), json!("server_names")],
                "Input should be a valid list, or the literal 'ALL'",
                "union_tag_invalid",
                other,
            ));
            None
        }
    };
    let benchmark = match o.get("benchmark") {
        None | Some(Value::Null) => None,
        Some(Value::String(b)) if proto::Benchmark::KLAVIS_NAMES.contains(&b.as_str()) => {
            Some(b.clone())
        }
        Some(other) => {
            errors.push(verr(
                &[json!("body"), json!("benchmark")],
                "Input should be 'MCP_Atlas', 'Toolathlon' or 'MCP_Mark'",
                "enum",
                other,
            ));
            None
        }
    };
    let ttl = match o.get("ttl_seconds") {
        None => Some(DEFAULT_TTL_SECONDS),
        Some(Value::Null) => None,
        Some(t) => match t.as_i64() {
            Some(n) if (i64::from(MIN_TTL_SECONDS)..=i64::from(MAX_TTL_SECONDS)).contains(&n) => {
                Some(n as u32)
            }
            Some(n) => {
                let (msg, kind) = if n < i64::from(MIN_TTL_SECONDS) {
                    (
                        format!("Input should be greater than or equal to {MIN_TTL_SECONDS}"),
                        "greater_than_equal",
                    )
                } else {
                    (
                        format!("Input should be less than or equal to {MAX_TTL_SECONDS}"),
                        "less_than_equal",
                    )
                };
                errors.push(verr(&[json!("body"), json!("ttl_seconds")], msg, kind, t));
                None
            }
            None => {
                errors.push(verr(
                    &[json!("body"), json!("ttl_seconds")],
                    "Input should be a valid integer",
                    "int_type",
                    t,
                ));
                None
            }
        },
    };
    let email = match o.get("test_account_email") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            errors.push(verr(
                &[json!("body"), json!("test_account_email")],
                "Input should be a valid string",
                "string_type",
                other,
            ));
            String::new()
        }
    };
    if !errors.is_empty() {
        return Err(invalid(errors));
    }
    Ok(AcquireBody {
        servers,
        benchmark,
        email,
        ttl,
    })
}

/// A JSON request body that must be an object, with pydantic's 422s for
/// invalid JSON and for any other value.
pub(super) fn body_object(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        invalid(vec![verr(
            &[json!("body"), json!(e.column())],
            format!("JSON decode error: {e}"),
            "json_invalid",
            &json!({}),
        )])
    })?;
    if !v.is_object() {
        return Err(invalid(vec![verr(
            &[json!("body")],
            "Input should be a valid dictionary or object to extract fields from",
            "model_attributes_type",
            &v,
        )]));
    }
    Ok(v)
}

pub(crate) fn benchmark_proto(b: Option<&str>) -> i32 {
    b.and_then(proto::Benchmark::from_klavis)
        .unwrap_or(proto::Benchmark::Unspecified) as i32
}

/// A query parameter FastAPI would check: the 422 its validation gives.
pub(super) fn query_error(name: &str, msg: &str, kind: &str, input: &str) -> ApiError {
    invalid(vec![verr(
        &[json!("query"), json!(name)],
        msg,
        kind,
        &json!(input),
    )])
}

/// `?is_ttl=`, parsed as pydantic parses a boolean.
pub(super) fn is_ttl(q: &HashMap<String, String>) -> Result<bool, ApiError> {
    let Some(v) = q.get("is_ttl") else {
        return Ok(false);
    };
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Ok(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Ok(false),
        _ => Err(query_error(
            "is_ttl",
            "Input should be a valid boolean, unable to interpret input",
            "bool_parsing",
            v,
        )),
    }
}

/// `?region=` of the transfer endpoints (Klavis's `GCSRegion`): accepted
/// and checked; this host stores archives itself, so it changes nothing.
pub(super) fn check_region(q: &HashMap<String, String>) -> Result<(), ApiError> {
    match q.get("region").map(String::as_str) {
        None | Some("us") | Some("asia") => Ok(()),
        Some(v) => Err(query_error(
            "region",
            "Input should be 'us' or 'asia'",
            "enum",
            v,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(body: &str) -> Value {
        let e = parse_acquire(body.as_bytes()).err().expect("a 422");
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        e.detail
    }

    #[test]
    fn all_names_or_defaults_parse_like_klavis() {
        let b = parse_acquire(br#"{"server_names": "ALL"}"#).unwrap();
        assert_eq!(b.servers, None);
        assert_eq!(b.ttl, Some(DEFAULT_TTL_SECONDS));
        let b = parse_acquire(
            br#"{"server_names": ["git", "excel"], "benchmark": "Toolathlon", "ttl_seconds": null, "test_account_email": "a@b"}"#,
        )
        .unwrap();
        assert_eq!(
            b.servers.as_deref(),
            Some(&["git".to_owned(), "excel".to_owned()][..])
        );
        assert_eq!(b.benchmark.as_deref(), Some("Toolathlon"));
        assert_eq!(b.ttl, None);
        assert_eq!(b.email, "a@b");
        let b = parse_acquire(br#"{"server_names": ["git"], "ttl_seconds": 86400}"#).unwrap();
        assert_eq!(b.ttl, Some(MAX_TTL_SECONDS));
    }

    #[test]
    fn every_bad_field_is_reported_at_once_with_its_loc() {
        let d = errors(
            r#"{"server_names": ["git", "nope"], "benchmark": "X", "ttl_seconds": 59, "test_account_email": 3}"#,
        );
        let locs: Vec<Value> = d
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["loc"].clone())
            .collect();
        assert_eq!(
            locs,
            [
                json!(["body", "server_names", 1]),
                json!(["body", "benchmark"]),
                json!(["body", "ttl_seconds"]),
                json!(["body", "test_account_email"]),
            ]
        );
        assert_eq!(d[2]["type"], "greater_than_equal");
        assert_eq!(d[2]["msg"], "Input should be greater than or equal to 60");
        let d = errors(r#"{"server_names": ["git"], "ttl_seconds": 86401}"#);
        assert_eq!(d[0]["type"], "less_than_equal");
        assert_eq!(errors(r#"{"benchmark": null}"#)[0]["type"], "missing");
        assert_eq!(errors(r#"{"server_names": []}"#)[0]["type"], "too_short");
        assert_eq!(errors("[1]")[0]["type"], "model_attributes_type");
        assert_eq!(errors("{")[0]["type"], "json_invalid");
    }
}
