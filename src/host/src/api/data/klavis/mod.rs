//! The per-server data documents of Klavis's API (`GoogleCloudData`,
//! `PosteEmailData`, `CanvasData`), field for field as its pydantic models
//! declare them. A per-server initialize body is checked against its model
//! here ([`check`]) before the agent sees it, and these types generate the
//! document's schemas for those bodies and for the dumps.
//!
//! Like pydantic, unknown fields are ignored, a field's absence takes its
//! default, and numbers and booleans are read as its lax mode reads them
//! (`1024.0` and `"10"` are integers, `1` and `"yes"` true); a wrong type
//! or a missing required field is refused naming where. Unlike pydantic, the answer is a 400 (what this API answered for
//! bad data before, from the agent) and names the first misfit only.

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::error::HostError;

mod canvas;
mod google_cloud;
mod mail;
mod memory;

pub use canvas::*;
pub use google_cloud::*;
pub use mail::*;
pub use memory::*;

/// An integer as pydantic's lax mode reads one: an integer, a float with
/// no fraction, a string of digits, a boolean.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(transparent)]
pub struct LaxInt(pub i64);

/// A number as pydantic's lax mode reads one: a number, a numeric string,
/// a boolean.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(transparent)]
pub struct LaxFloat(pub f64);

/// A boolean as pydantic's lax mode reads one: a boolean, 0 or 1, or one
/// of its words (`true`/`false`, `yes`/`no`, `on`/`off`, `t`/`f`,
/// `y`/`n`, `1`/`0`, any case).
#[derive(Debug, Clone, Copy, Default, Serialize)]
#[serde(transparent)]
pub struct LaxBool(pub bool);

impl<'de> Deserialize<'de> for LaxInt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let n = match &v {
            Value::Bool(b) => Some(i64::from(*b)),
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e18)
                    .map(|f| f as i64)
            }),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        n.map(LaxInt)
            .ok_or_else(|| D::Error::custom(format!("invalid type: {v}, expected i64")))
    }
}

impl<'de> Deserialize<'de> for LaxFloat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let n = match &v {
            Value::Bool(b) => Some(f64::from(u8::from(*b))),
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse().ok().filter(|f: &f64| f.is_finite()),
            _ => None,
        };
        n.map(LaxFloat)
            .ok_or_else(|| D::Error::custom(format!("invalid type: {v}, expected f64")))
    }
}

impl<'de> Deserialize<'de> for LaxBool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let b = match &v {
            Value::Bool(b) => Some(*b),
            Value::Number(n) => match n.as_i64() {
                Some(0) => Some(false),
                Some(1) => Some(true),
                _ => None,
            },
            Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "t" | "yes" | "y" | "on" => Some(true),
                "0" | "false" | "f" | "no" | "n" | "off" => Some(false),
                _ => None,
            },
            _ => None,
        };
        b.map(LaxBool)
            .ok_or_else(|| D::Error::custom(format!("invalid type: {v}, expected a boolean")))
    }
}

/// Checks a per-server initialize body against the server's model; a
/// document that does not fit is a 400 naming where and why
/// (`users.a@b.c.emails[1].subject: Field required`), the answer this API
/// gave for bad data before it checked here (the agent checks the mail
/// data the same way). Servers without a model pass.
pub fn check(server: &str, body: &Value) -> Result<(), HostError> {
    let found = match server {
        "google_cloud" => misfit::<GoogleCloudData>(body),
        "poste_email_toolathlon" => misfit::<PosteEmailData>(body),
        "canvas" => misfit::<CanvasData>(body),
        "localmemory" => misfit::<LocalMemoryData>(body),
        _ => None,
    };
    match found {
        None => Ok(()),
        Some((path, msg)) => Err(HostError::BadRequest(format!(
            "the {server} data does not fit its model: {path}: {msg}"
        ))),
    }
}

/// Where and why `body` does not deserialize as `T`, in pydantic's words.
fn misfit<T: DeserializeOwned>(body: &Value) -> Option<(String, String)> {
    let e = serde_path_to_error::deserialize::<_, T>(body).err()?;
    let mut path = String::new();
    for seg in e.path().iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => path.push_str(&format!("[{index}]")),
            serde_path_to_error::Segment::Map { key }
            | serde_path_to_error::Segment::Enum { variant: key } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
            }
            serde_path_to_error::Segment::Unknown => {}
        }
    }
    let (field, msg) = pydantic_words(&e.into_inner().to_string());
    if let Some(f) = field {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(&f);
    }
    if path.is_empty() {
        path.push_str("(the document)");
    }
    Some((path, msg))
}

/// serde's message as pydantic words it: `missing field `x`` is "Field
/// required" at `x`; a wrong type "Input should be a valid <type>".
fn pydantic_words(serde_msg: &str) -> (Option<String>, String) {
    if let Some(rest) = serde_msg.strip_prefix("missing field `")
        && let Some(field) = rest.split('`').next()
    {
        return (Some(field.to_owned()), "Field required".into());
    }
    let expected = serde_msg.split(", expected ").nth(1).unwrap_or("");
    let typed = [
        ("a string", "Input should be a valid string"),
        ("a boolean", "Input should be a valid boolean"),
        ("i64", "Input should be a valid integer"),
        ("f64", "Input should be a valid number"),
        ("a sequence", "Input should be a valid list"),
        ("a map", "Input should be a valid dictionary"),
        (
            "struct",
            "Input should be a valid dictionary or object to extract fields from",
        ),
    ];
    let msg = typed
        .iter()
        .find(|(word, _)| expected.contains(word))
        .map_or_else(|| serde_msg.to_owned(), |(_, m)| (*m).to_owned());
    (None, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(server: &str, body: &str) -> String {
        let v: Value = serde_json::from_str(body).expect("test JSON");
        match check(server, &v) {
            Err(HostError::BadRequest(m)) => m,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn well_formed_documents_pass_and_unknown_fields_are_ignored() {
        let ok = |server: &str, body: &str| {
            check(server, &serde_json::from_str(body).expect("JSON")).expect("valid")
        };
        ok("poste_email_toolathlon", r#"{"users": {}}"#);
        ok(
            "poste_email_toolathlon",
            r#"{"users": {"a@b.c": {"emails": [{"subject": "s", "from_addr": "x@y", "to_addr": "a@b.c", "extra": 1}]}}}"#,
        );
        ok(
            "canvas",
            r#"{"courses": [{"name": "n", "course_code": "c"}]}"#,
        );
        ok(
            "google_cloud",
            r#"{"datasets": [{"id": "d"}], "tables": [{"dataset_id": "d", "id": "t", "fields": [{"name": "f", "type": "RECORD", "fields": [{"name": "g", "type": "STRING"}]}]}]}"#,
        );
        ok("filesystem", r#"{"anything": true}"#);
        // pydantic's lax mode: numbers and booleans as Klavis accepts them.
        ok(
            "poste_email_toolathlon",
            r#"{"users": {"a@b.c": {"emails": [{"subject": "s", "from_addr": "x@y", "to_addr": "a@b.c", "is_read": 1, "is_important": "yes", "attachments": [{"filename": "f", "size": 1024.0}, {"filename": "g", "size": "10"}]}]}}}"#,
        );
        ok(
            "canvas",
            r#"{"courses": [{"name": "n", "course_code": "c", "published": "false", "assignments": [{"name": "a", "points_possible": "2.5"}]}]}"#,
        );
    }

    #[test]
    fn a_missing_required_field_is_named_where_it_is_missing() {
        let m = err(
            "poste_email_toolathlon",
            r#"{"users": {"a@b.c": {"emails": [{"subject": "s", "to_addr": "a@b.c"}]}}}"#,
        );
        assert!(
            m.ends_with("users.a@b.c.emails[0].from_addr: Field required"),
            "{m}"
        );
    }

    #[test]
    fn a_wrong_type_says_which_type() {
        let m = err(
            "canvas",
            r#"{"courses": [{"name": 3, "course_code": "c"}]}"#,
        );
        assert!(
            m.ends_with("courses[0].name: Input should be a valid string"),
            "{m}"
        );
        let m = err(
            "google_cloud",
            r#"{"buckets": [{"name": "b", "versioning_enabled": "x"}]}"#,
        );
        assert!(
            m.ends_with("buckets[0].versioning_enabled: Input should be a valid boolean"),
            "{m}"
        );
        let m = err("poste_email_toolathlon", r#"{"users": []}"#);
        assert!(
            m.ends_with("users: Input should be a valid dictionary"),
            "{m}"
        );
        let m = err(
            "google_cloud",
            r#"{"log_buckets": [{"name": "l", "retention_days": 1.5}]}"#,
        );
        assert!(
            m.ends_with("log_buckets[0].retention_days: Input should be a valid integer"),
            "{m}"
        );
    }
}
