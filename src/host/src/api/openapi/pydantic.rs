//! The generated schemas in the spelling of Klavis's document (FastAPI's,
//! from pydantic models), so that they read as Klavis's do: utoipa writes
//! a nullable value as `"type": ["string", "null"]` or `"oneOf": [{"type":
//! "null"}, …]` where pydantic writes `"anyOf": [{…}, {"type": "null"}]`;
//! it adds `format`s and `minimum: 0` to integers and numbers (from the
//! Rust type's width and sign) and `propertyNames` to maps, which pydantic
//! never writes. The meaning is unchanged: each rewrite accepts exactly
//! what the schema accepted before (the answers hold no other numbers).

use serde_json::{Map, Value, json};

/// Keywords that annotate a schema rather than constrain its type: they
/// stay beside an `anyOf`, as pydantic places them.
const ANNOTATIONS: [&str; 6] = [
    "default",
    "description",
    "title",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Rewrites every schema in `v`, depth first.
pub fn respell(v: &mut Value) {
    match v {
        Value::Object(o) => {
            let under_properties = |k: &str| k == "properties";
            for (k, child) in o.iter_mut() {
                if under_properties(k) {
                    if let Value::Object(props) = child {
                        props.values_mut().for_each(respell);
                    }
                } else {
                    respell(child);
                }
            }
            drop_widths(o);
            nullable_as_any_of(o);
        }
        Value::Array(a) => a.iter_mut().for_each(respell),
        _ => {}
    }
}

/// `format`s and `minimum: 0` of integers and numbers, and
/// `propertyNames: {"type": "string"}` (JSON's keys are strings anyway).
fn drop_widths(o: &mut Map<String, Value>) {
    let numeric = |t: &Value| t == "integer" || t == "number";
    let is_numeric = match o.get("type") {
        Some(Value::Array(ts)) => ts.iter().any(numeric),
        Some(t) => numeric(t),
        None => false,
    };
    if is_numeric {
        o.remove("format");
        if o.get("minimum").and_then(Value::as_f64) == Some(0.0) {
            o.remove("minimum");
        }
    }
    if o.get("propertyNames") == Some(&json!({"type": "string"})) {
        o.remove("propertyNames");
    }
}

/// `"type": [T, "null"]` and a two-way `oneOf` with `{"type": "null"}` as
/// `"anyOf": [{…}, {"type": "null"}]`.
fn nullable_as_any_of(o: &mut Map<String, Value>) {
    let null = json!({"type": "null"});
    if let Some(Value::Array(types)) = o.get("type")
        && types.len() == 2
        && types.contains(&Value::from("null"))
    {
        let Some(t) = types.iter().find(|t| *t != "null").cloned() else {
            return;
        };
        let mut typed = Map::new();
        typed.insert("type".into(), t);
        let keys: Vec<String> = o
            .keys()
            .filter(|k| *k != "type" && !ANNOTATIONS.contains(&k.as_str()))
            .cloned()
            .collect();
        for k in keys {
            if let Some(x) = o.remove(&k) {
                typed.insert(k, x);
            }
        }
        o.remove("type");
        o.insert(
            "anyOf".into(),
            Value::Array(vec![Value::Object(typed), null]),
        );
        return;
    }
    if let Some(Value::Array(alts)) = o.get("oneOf")
        && alts.len() == 2
        && alts.contains(&null)
        && let Some(other) = alts.iter().find(|a| **a != null).cloned()
    {
        o.remove("oneOf");
        o.insert("anyOf".into(), Value::Array(vec![other, null]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spelled(v: Value) -> Value {
        let mut v = v;
        respell(&mut v);
        v
    }

    #[test]
    fn nullable_values_read_as_pydantic_writes_them() {
        assert_eq!(
            spelled(json!({"type": ["string", "null"], "default": "x"})),
            json!({"anyOf": [{"type": "string"}, {"type": "null"}], "default": "x"})
        );
        assert_eq!(
            spelled(json!({"type": ["array", "null"], "items": {"$ref": "#/a"}})),
            json!({"anyOf": [{"type": "array", "items": {"$ref": "#/a"}}, {"type": "null"}]})
        );
        assert_eq!(
            spelled(json!({"oneOf": [{"type": "null"}, {"$ref": "#/s"}]})),
            json!({"anyOf": [{"$ref": "#/s"}, {"type": "null"}]})
        );
        // A one-of of two real alternatives stays.
        let both = json!({"oneOf": [{"type": "string"}, {"type": "integer"}]});
        assert_eq!(spelled(both.clone()), both);
    }

    #[test]
    fn widths_go_and_a_property_named_like_a_keyword_stays() {
        assert_eq!(
            spelled(json!({"type": "integer", "format": "int64", "minimum": 0})),
            json!({"type": "integer"})
        );
        assert_eq!(
            spelled(json!({"type": "integer", "minimum": 60})),
            json!({"type": "integer", "minimum": 60})
        );
        assert_eq!(
            spelled(json!({"type": "string", "format": "date-time"})),
            json!({"type": "string", "format": "date-time"})
        );
        let object = json!({"type": "object", "properties": {
            "format": {"type": ["number", "null"], "format": "double"},
            "map": {"type": "object", "propertyNames": {"type": "string"}},
        }});
        assert_eq!(
            spelled(object),
            json!({"type": "object", "properties": {
                "format": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                "map": {"type": "object"},
            }})
        );
    }
}
