//! The host's `/openapi.json`, as the running binary serves it, against
//! Klavis's own document of the Local Sandbox API: every one of Klavis's
//! `/local-sandbox` operations is there with the same parameters, request
//! body and answers, schema for schema once every `$ref` is resolved on
//! both sides (only annotations, which say nothing a client can check,
//! are left out). The host may answer more statuses than Klavis lists
//! (its 401, 404, 503, …); each of Klavis's is there as Klavis has it.
//!
//! Klavis's document is not kept in this repository: it is read from
//! `SANDBOX_AGENT_KLAVIS_API` when set, else `../shared/klavis-api` beside
//! the checkout, else `/work/shared/klavis-api`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::common::host::*;

/// Keywords that annotate and constrain nothing.
const ANNOTATIONS: [&str; 7] = [
    "title",
    "description",
    "summary",
    "operationId",
    "tags",
    "example",
    "examples",
];

/// Arrays whose order means nothing.
const UNORDERED: [&str; 3] = ["required", "enum", "anyOf"];

/// Klavis's document, where this machine has it (it is Klavis's, kept
/// beside the checkout, not in it).
fn klavis_document() -> Option<Value> {
    let dirs: Vec<PathBuf> = match std::env::var_os("SANDBOX_AGENT_KLAVIS_API") {
        Some(d) => vec![PathBuf::from(d)],
        None => vec![
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/klavis-api"),
            PathBuf::from("/work/shared/klavis-api"),
        ],
    };
    let file = dirs
        .iter()
        .map(|d| d.join("local-sandbox-openapi.json"))
        .find(|f| f.is_file());
    let needs = format!(
        "Klavis's local-sandbox-openapi.json, in none of {dirs:?} (set SANDBOX_AGENT_KLAVIS_API to the directory holding it)"
    );
    if !crate::common::have_or_skip(
        file.is_some(),
        "comparing with Klavis's OpenAPI document",
        &needs,
    ) {
        return None;
    }
    let file = file?;
    let text = std::fs::read_to_string(&file).expect("Klavis's document");
    Some(serde_json::from_str(&text).expect("Klavis's document is JSON"))
}

/// `v` with every `$ref` of `doc` replaced by what it names (a reference
/// back into itself by `{"$recursive": true}`), no annotations, and whole
/// numbers as integers.
fn resolved(doc: &Value, v: &Value, seen: &[String], properties: bool) -> Value {
    match v {
        Value::Object(o) => {
            if let (false, Some(Value::String(r))) = (properties, o.get("$ref")) {
                let name = r.rsplit('/').next().unwrap_or_default().to_owned();
                if seen.contains(&name) {
                    return serde_json::json!({"$recursive": true});
                }
                let target = &doc["components"]["schemas"][&name];
                assert!(!target.is_null(), "{r} does not resolve");
                let seen = [seen, &[name]].concat();
                return resolved(doc, target, &seen, false);
            }
            let keep = |k: &String| properties || !ANNOTATIONS.contains(&k.as_str());
            Value::Object(
                o.iter()
                    .filter(|(k, _)| keep(k))
                    .map(|(k, x)| {
                        let is_props = !properties && k == "properties";
                        (k.clone(), resolved(doc, x, seen, is_props))
                    })
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| resolved(doc, x, seen, false)).collect()),
        // 86400.0 is 86400 (pydantic writes bounds as floats).
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => v.clone(),
        },
        other => other.clone(),
    }
}

/// Where `ours` differs from `klavis`, one line each.
fn diff(klavis: &Value, ours: &Value, at: &str, out: &mut Vec<String>) {
    match (klavis, ours) {
        (Value::Object(k), Value::Object(o)) => {
            for key in k.keys().chain(o.keys().filter(|x| !k.contains_key(*x))) {
                let here = format!("{at}/{key}");
                match (k.get(key), o.get(key)) {
                    (Some(a), Some(b)) if UNORDERED.contains(&key.as_str()) => {
                        if sorted(a) != sorted(b) {
                            out.push(format!("{here}: Klavis's {a}, ours {b}"));
                        }
                    }
                    (Some(a), Some(b)) => diff(a, b, &here, out),
                    (Some(a), None) => out.push(format!("{here}: only Klavis's: {a}")),
                    (None, Some(b)) => out.push(format!("{here}: only ours: {b}")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(k), Value::Array(o)) if k.len() == o.len() => {
            for (i, (a, b)) in k.iter().zip(o).enumerate() {
                diff(a, b, &format!("{at}/{i}"), out);
            }
        }
        (a, b) if a != b => out.push(format!("{at}: Klavis's {a}, ours {b}")),
        _ => {}
    }
}

fn sorted(v: &Value) -> Vec<String> {
    let mut items: Vec<String> = v
        .as_array()
        .map(|a| a.iter().map(Value::to_string).collect())
        .unwrap_or_else(|| vec![v.to_string()]);
    items.sort();
    items
}

/// An operation's parameters by `name@in`.
fn parameters(doc: &Value, op: &Value) -> Value {
    let mut by_name = Map::new();
    for p in op["parameters"].as_array().into_iter().flatten() {
        let p = resolved(doc, p, &[], false);
        by_name.insert(format!("{}@{}", p["name"], p["in"]), p);
    }
    Value::Object(by_name)
}

/// Every difference of `ours` from Klavis's operation `method path`.
fn operation_diff(klavis: &Value, ours: &Value, path: &str, method: &str) -> Vec<String> {
    let (k, o) = (&klavis["paths"][path][method], &ours["paths"][path][method]);
    if o.is_null() {
        return vec!["missing".into()];
    }
    let mut out = Vec::new();
    diff(
        &parameters(klavis, k),
        &parameters(ours, o),
        "parameters",
        &mut out,
    );
    let body = |doc: &Value, op: &Value| resolved(doc, &op["requestBody"], &[], false);
    diff(&body(klavis, k), &body(ours, o), "requestBody", &mut out);
    for (code, answer) in k["responses"].as_object().into_iter().flatten() {
        let here = format!("responses/{code}");
        match o["responses"].get(code) {
            None => out.push(format!("{here}: only Klavis's")),
            Some(mine) => diff(
                &resolved(klavis, answer, &[], false),
                &resolved(ours, mine, &[], false),
                &here,
                &mut out,
            ),
        }
    }
    out
}

/// All 19 of Klavis's `/local-sandbox` operations, compared; any
/// difference fails, each listed.
#[test]
fn the_document_is_klavis_s_for_every_local_sandbox_operation() {
    let Some(klavis) = klavis_document() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Host::start(dir.path(), &["--pool-size", "0"]);
    let (code, ours) = http("GET", &format!("{}/openapi.json", host.base), None, None);
    assert_eq!(code, 200, "{ours}");
    let mut compared = 0;
    let mut report = Vec::new();
    for (path, ops) in klavis["paths"].as_object().expect("Klavis's paths") {
        for method in ops.as_object().expect("operations").keys() {
            compared += 1;
            let found = operation_diff(&klavis, &ours, path, method);
            report.extend(found.iter().map(|d| format!("{method} {path}: {d}")));
        }
    }
    assert_eq!(
        compared, 19,
        "Klavis's document has 19 /local-sandbox operations"
    );
    assert!(
        report.is_empty(),
        "{} difference(s) from Klavis's document:\n{}",
        report.len(),
        report.join("\n")
    );
}

/// The comparison sees what it must: a nullable field written another
/// way, a missing required name and an extra constraint are differences;
/// the order of `required` and a `$ref` in place of its schema are not.
#[test]
fn the_comparison_catches_a_changed_schema() {
    let doc = |item: Value| {
        serde_json::json!({
            "paths": {"/x": {"get": {"responses": {"200": {"content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Item"}}}}}}}},
            "components": {"schemas": {"Item": item}},
        })
    };
    let klavis = doc(
        serde_json::json!({"type": "object", "required": ["a", "b"], "properties": {
        "a": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "A"},
        "b": {"type": "string"}}}),
    );
    let same = doc(
        serde_json::json!({"type": "object", "required": ["b", "a"], "properties": {
        "b": {"type": "string", "description": "b"},
        "a": {"anyOf": [{"type": "null"}, {"type": "string"}]}}}),
    );
    assert_eq!(
        operation_diff(&klavis, &same, "/x", "get"),
        Vec::<String>::new()
    );
    let other = doc(
        serde_json::json!({"type": "object", "required": ["b"], "properties": {
        "a": {"type": ["string", "null"]},
        "b": {"type": "string", "pattern": "^b$"}}}),
    );
    let found = operation_diff(&klavis, &other, "/x", "get");
    assert_eq!(found.len(), 4, "{found:#?}");
}
