//! A POST body's JSON-RPC messages, parsed with the batch's count checked
//! element by element: a batch over `gateway.max_batch_messages` is
//! refused at its first message past the limit, before the rest is parsed
//! or any of it answered.

use std::cell::Cell;
use std::fmt;

use http::{Response, StatusCode};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::gateway::{Body, json_response, rpc_error};
use sandbox_client::mcp::code;

/// What the body held.
enum Parsed {
    One(Value),
    Batch(Vec<Value>),
    /// Neither an object nor an array (or an empty array).
    Other,
}

/// Parses a body, stopping at the batch's `max + 1`-th message.
struct Messages<'a> {
    max: usize,
    too_many: &'a Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for Messages<'_> {
    type Value = Parsed;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Parsed, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Messages<'_> {
    type Value = Parsed;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON-RPC message object or a batch")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Parsed, A::Error> {
        let mut all = Vec::new();
        while let Some(m) = seq.next_element::<Value>()? {
            if all.len() == self.max {
                self.too_many.set(true);
                return Err(de::Error::custom("too many messages"));
            }
            all.push(m);
        }
        Ok(if all.is_empty() {
            Parsed::Other
        } else {
            Parsed::Batch(all)
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Parsed, A::Error> {
        Value::deserialize(de::value::MapAccessDeserializer::new(map)).map(Parsed::One)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Parsed, E> {
        Ok(Parsed::Other)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Parsed, E> {
        Ok(Parsed::Other)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Parsed, E> {
        Ok(Parsed::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Parsed, E> {
        Ok(Parsed::Other)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Parsed, E> {
        Ok(Parsed::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Parsed, E> {
        Ok(Parsed::Other)
    }
}

fn refuse(code: i64, message: String) -> Box<Response<Body>> {
    Box::new(json_response(
        StatusCode::BAD_REQUEST,
        &rpc_error(&Value::Null, code, message),
    ))
}

/// The body's messages and whether they came as a batch (2026-07-28: one
/// object, no batches); a batch of at most `max_batch` messages.
pub(super) fn parse(
    body: &[u8],
    modern: bool,
    max_batch: usize,
) -> Result<(Vec<Value>, bool), Box<Response<Body>>> {
    let too_many = Cell::new(false);
    let seed = Messages {
        max: max_batch,
        too_many: &too_many,
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = seed.deserialize(&mut de).and_then(|p| de.end().map(|()| p));
    let parsed = match parsed {
        Ok(p) => p,
        Err(_) if too_many.get() => {
            return Err(refuse(
                code::INVALID_REQUEST,
                format!(
                    "a batch of more than {max_batch} messages; send at most \
                     gateway.max_batch_messages = {max_batch} per POST"
                ),
            ));
        }
        Err(e) => return Err(refuse(code::PARSE_ERROR, format!("parse error: {e}"))),
    };
    match parsed {
        Parsed::Batch(all) if !modern => Ok((all, true)),
        Parsed::One(m) => Ok((vec![m], false)),
        _ => {
            let what = if modern {
                "the body must be one JSON-RPC request or notification object (2026-07-28 has no batches)"
            } else {
                "expected a JSON-RPC message object or a batch"
            };
            Err(refuse(code::INVALID_REQUEST, what.to_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_over_the_limit_is_refused_and_one_at_it_is_parsed() {
        let batch = |n: usize| {
            let one = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
            format!("[{}]", vec![one; n].join(","))
        };
        let (all, is_batch) = parse(batch(3).as_bytes(), false, 3).expect("at the limit");
        assert!(is_batch);
        assert_eq!(all.len(), 3);
        let refused = parse(batch(10_000).as_bytes(), false, 3).expect_err("refused");
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        let (one, is_batch) =
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#, false, 1).expect("one message");
        assert!(!is_batch && one.len() == 1);
        for bad in [&b"[]"[..], b"3", b"\"x\"", b"null", b"{} {}", b"[1,"] {
            assert!(
                parse(bad, false, 3).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(
            parse(batch(2).as_bytes(), true, 3).is_err(),
            "2026-07-28 has no batches"
        );
    }
}
