//! Request bodies and query parameters, checked as Klavis's FastAPI
//! service checks them: the same messages, `loc`s and error types in the
//! 422 body.

use crate::lease::AcquireAsk;
use std::collections::HashMap;

use sandbox_client::limits::{DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS, MIN_TTL_SECONDS};
use sandbox_client::proto;
use serde_json::Value;

use super::SERVER_NAMES;
use crate::error::{HostError, Loc, ValidationItem};

/// One pydantic error at `loc`.
pub(super) fn verr(
    loc: &[Loc],
    msg: impl Into<String>,
    kind: &str,
    input: &Value,
) -> ValidationItem {
    ValidationItem {
        loc: loc.to_vec(),
        msg: msg.into(),
        kind: kind.into(),
        input: input.clone(),
        ctx: None,
    }
}

/// [`verr`] with pydantic's `ctx` (the constraint that failed).
fn verr_ctx(
    loc: &[Loc],
    msg: impl Into<String>,
    kind: &str,
    input: &Value,
    ctx: serde_json::Map<String, Value>,
) -> ValidationItem {
    ValidationItem {
        ctx: Some(ctx),
        ..verr(loc, msg, kind, input)
    }
}

/// pydantic's `ctx`: the one constraint named.
fn ctx(key: &str, value: impl Into<Value>) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert(key.to_owned(), value.into());
    m
}

/// The name pydantic gives the list member of `server_names`'s union
/// (`list[LocalSandboxMCPServer] | Literal['ALL']`) in error locations.
const LIST_TAG: &str = "list[str-enum[LocalSandboxMCPServer]]";

/// pydantic's list of allowed values: `'a', 'b' or 'c'`.
fn expected(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("'{v}'")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.concat(),
    }
}

/// The union's other member failing: not the literal `'ALL'`.
fn not_all(input: &Value) -> ValidationItem {
    verr_ctx(
        &[
            "body".into(),
            "server_names".into(),
            "literal['ALL']".into(),
        ],
        "Input should be 'ALL'",
        "literal_error",
        input,
        ctx("expected", "'ALL'"),
    )
}

/// An integer as pydantic's lax mode reads one: an integer, a float with
/// no fractional part, a boolean, or a string of digits (surrounding
/// whitespace ignored). Else pydantic's message and error type.
fn lax_int(v: &Value) -> Result<i64, (&'static str, &'static str)> {
    const NOT_INT: (&str, &str) = ("Input should be a valid integer", "int_type");
    match v {
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Ok(i),
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e18 => Ok(f as i64),
            (None, Some(f)) if f.is_finite() => Err((
                "Input should be a valid integer, got a number with a fractional part",
                "int_from_float",
            )),
            _ => Err(NOT_INT),
        },
        Value::String(s) => s.trim().parse::<i64>().map_err(|_| {
            (
                "Input should be a valid integer, unable to parse string as an integer",
                "int_parsing",
            )
        }),
        _ => Err(NOT_INT),
    }
}

/// Validates `POST /local-sandbox` like the Klavis (pydantic) model does:
/// every bad field reported at once, in the model's field order.
pub(super) fn parse_acquire(body: &[u8]) -> Result<AcquireAsk, HostError> {
    let v = body_object(body)?;
    let Some(o) = v.as_object() else {
        return Err(HostError::Internal("a checked body is an object".into()));
    };
    let mut errors: Vec<ValidationItem> = Vec::new();
    let servers = match o.get("server_names") {
        None => {
            errors.push(verr(
                &["body".into(), "server_names".into()],
                "Field required",
                "missing",
                &v,
            ));
            None
        }
        Some(names) => server_names(names, &mut errors),
    };
    let benchmark = benchmark(o.get("benchmark"), &mut errors);
    let email = email(o.get("test_account_email"), &mut errors);
    let ttl = ttl_seconds(o.get("ttl_seconds"), &mut errors);
    if !errors.is_empty() {
        return Err(HostError::Validation(errors));
    }
    Ok(AcquireAsk {
        many: servers.is_none(),
        servers,
        benchmark_proto: benchmark_proto(benchmark.as_deref()),
        benchmark,
        email,
        ttl,
    })
}

/// Validates `POST /sandbox/{server}` like Klavis's model: every field
/// optional (`benchmark`, `ttl_seconds`, `test_account_email`), extras
/// ignored, no body the same as `{}`; the servers are the path's.
pub(super) fn parse_create(
    body: &[u8],
    servers: Vec<String>,
    many: bool,
) -> Result<AcquireAsk, HostError> {
    let v = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        body_object(body)?
    };
    let Some(o) = v.as_object() else {
        return Err(HostError::Internal("a checked body is an object".into()));
    };
    let mut errors: Vec<ValidationItem> = Vec::new();
    let benchmark = benchmark(o.get("benchmark"), &mut errors);
    let email = email(o.get("test_account_email"), &mut errors);
    let ttl = ttl_seconds(o.get("ttl_seconds"), &mut errors);
    if !errors.is_empty() {
        return Err(HostError::Validation(errors));
    }
    Ok(AcquireAsk {
        servers: Some(servers),
        benchmark_proto: benchmark_proto(benchmark.as_deref()),
        benchmark,
        email,
        ttl,
        many,
    })
}

/// `server_names`: `"ALL"` (None) or a list of Klavis's server names.
fn server_names(v: &Value, errors: &mut Vec<ValidationItem>) -> Option<Vec<String>> {
    let a = match v {
        Value::String(s) if s == "ALL" => return None,
        Value::Array(a) => a,
        other => {
            errors.push(verr(
                &["body".into(), "server_names".into(), LIST_TAG.into()],
                "Input should be a valid list",
                "list_type",
                other,
            ));
            errors.push(not_all(other));
            return None;
        }
    };
    // pydantic tries both members of the union and reports both.
    let mut names = Vec::new();
    let mut bad = Vec::new();
    let expected = expected(SERVER_NAMES);
    for (i, n) in a.iter().enumerate() {
        match n.as_str() {
            Some(s) if SERVER_NAMES.contains(&s) => names.push(s.to_owned()),
            _ => bad.push(verr_ctx(
                &[
                    "body".into(),
                    "server_names".into(),
                    LIST_TAG.into(),
                    i.into(),
                ],
                format!("Input should be {expected}"),
                "enum",
                n,
                ctx("expected", expected.clone()),
            )),
        }
    }
    if !bad.is_empty() {
        errors.extend(bad);
        errors.push(not_all(v));
    }
    Some(names)
}

/// `test_account_email`: a string, or none.
fn email(v: Option<&Value>, errors: &mut Vec<ValidationItem>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            errors.push(verr(
                &["body".into(), "test_account_email".into()],
                "Input should be a valid string",
                "string_type",
                other,
            ));
            String::new()
        }
    }
}

/// `benchmark`: one of Klavis's benchmark names, or none.
fn benchmark(v: Option<&Value>, errors: &mut Vec<ValidationItem>) -> Option<String> {
    match v {
        None | Some(Value::Null) => None,
        Some(Value::String(b)) if proto::Benchmark::KLAVIS_NAMES.contains(&b.as_str()) => {
            Some(b.clone())
        }
        Some(other) => {
            let expected = expected(&proto::Benchmark::KLAVIS_NAMES);
            errors.push(verr_ctx(
                &["body".into(), "benchmark".into()],
                format!("Input should be {expected}"),
                "enum",
                other,
                ctx("expected", expected),
            ));
            None
        }
    }
}

/// `ttl_seconds`: absent is the default, null is none, else an integer
/// within Klavis's bounds.
fn ttl_seconds(v: Option<&Value>, errors: &mut Vec<ValidationItem>) -> Option<u32> {
    let t = match v {
        None => return Some(DEFAULT_TTL_SECONDS),
        Some(Value::Null) => return None,
        Some(t) => t,
    };
    let loc = ["body".into(), "ttl_seconds".into()];
    match lax_int(t) {
        Ok(n) if (i64::from(MIN_TTL_SECONDS)..=i64::from(MAX_TTL_SECONDS)).contains(&n) => {
            return Some(n as u32);
        }
        Ok(n) if n < i64::from(MIN_TTL_SECONDS) => errors.push(verr_ctx(
            &loc,
            format!("Input should be greater than or equal to {MIN_TTL_SECONDS}"),
            "greater_than_equal",
            t,
            ctx("ge", MIN_TTL_SECONDS),
        )),
        Ok(_) => errors.push(verr_ctx(
            &loc,
            format!("Input should be less than or equal to {MAX_TTL_SECONDS}"),
            "less_than_equal",
            t,
            ctx("le", MAX_TTL_SECONDS),
        )),
        Err((msg, kind)) => errors.push(verr(&loc, msg, kind, t)),
    }
    None
}

/// A JSON request body that must be an object, with pydantic's 422s for
/// invalid JSON and for any other value.
pub(super) fn body_object(body: &[u8]) -> Result<Value, HostError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        HostError::Validation(vec![verr(
            &["body".into(), e.column().into()],
            format!("JSON decode error: {e}"),
            "json_invalid",
            &Value::Object(Default::default()),
        )])
    })?;
    if !v.is_object() {
        return Err(HostError::Validation(vec![verr(
            &["body".into()],
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
pub(super) fn query_error(name: &str, msg: &str, kind: &str, input: &str) -> HostError {
    HostError::Validation(vec![verr(
        &["query".into(), name.into()],
        msg,
        kind,
        &Value::from(input),
    )])
}

/// `?is_ttl=`, parsed as pydantic parses a boolean.
pub(super) fn is_ttl(q: &HashMap<String, String>) -> Result<bool, HostError> {
    query_bool(q, "is_ttl")
}

/// A boolean query parameter (default false), parsed as pydantic does.
pub(super) fn query_bool(q: &HashMap<String, String>, name: &str) -> Result<bool, HostError> {
    let Some(v) = q.get(name) else {
        return Ok(false);
    };
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Ok(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Ok(false),
        _ => Err(query_error(
            name,
            "Input should be a valid boolean, unable to interpret input",
            "bool_parsing",
            v,
        )),
    }
}

/// `?region=` of the transfer endpoints (Klavis's `GCSRegion`): accepted
/// and checked; this host stores archives itself, so it changes nothing.
pub(super) fn check_region(q: &HashMap<String, String>) -> Result<(), HostError> {
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
    use axum::http::StatusCode;
    use serde_json::json;

    fn errors(body: &str) -> Value {
        let e = parse_acquire(body.as_bytes()).err().expect("a 422");
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        match e {
            HostError::Validation(items) => serde_json::to_value(items).expect("JSON"),
            other => panic!("not a 422: {other}"),
        }
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
                json!([
                    "body",
                    "server_names",
                    "list[str-enum[LocalSandboxMCPServer]]",
                    1
                ]),
                json!(["body", "server_names", "literal['ALL']"]),
                json!(["body", "benchmark"]),
                json!(["body", "test_account_email"]),
                json!(["body", "ttl_seconds"]),
            ]
        );
        assert_eq!(d[4]["type"], "greater_than_equal");
        assert_eq!(d[4]["msg"], "Input should be greater than or equal to 60");
        let d = errors(r#"{"server_names": ["git"], "ttl_seconds": 86401}"#);
        assert_eq!(d[0]["type"], "less_than_equal");
        assert_eq!(errors(r#"{"benchmark": null}"#)[0]["type"], "missing");
        assert!(parse_acquire(br#"{"server_names": []}"#).is_ok());
        assert_eq!(errors("[1]")[0]["type"], "model_attributes_type");
        assert_eq!(errors("{")[0]["type"], "json_invalid");
    }
}
