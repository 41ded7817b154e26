//! What can still be read from a request line that cannot be served: its id (so the error
//! answer reaches the caller waiting on it), its method, and whether it was whole.
//!
//! The line is read as far as serde_json gets: the top-level object's keys are visited in
//! order, `id` and `method` are kept and every other value is skipped, and when the parser
//! stops (bad syntax, the recursion limit, the end of a truncated head) whatever was seen
//! before that point is the answer. serde_json skips values without recursing, and reads the
//! kept ones under its recursion limit (128 levels), so no input can exhaust the stack here.

use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

/// What was read from the start of a request line.
#[derive(Debug, Default, PartialEq)]
pub struct Salvaged {
    /// The value of the last `id` key seen (serde_json keeps the last of duplicate keys too).
    pub id: Option<Value>,
    /// The value of the last `method` key seen.
    pub method: Option<Value>,
    /// The value of the last `jsonrpc` key seen.
    pub jsonrpc: Option<Value>,
    /// Whether a `result` or `error` key was seen (a JSON-RPC response, not a request).
    pub response: bool,
    /// Whether the whole line was one JSON object that could be read to its end.
    pub complete: bool,
}

impl Salvaged {
    /// Whether this is a JSON-RPC notification: a whole object with a method and no id.
    pub fn is_notification(&self) -> bool {
        self.complete && self.id.is_none() && self.method.is_some() && !self.response
    }
}

/// Reads what it can of `text`, which may be cut off or broken anywhere.
pub fn salvage(text: &str) -> Salvaged {
    let mut found = Salvaged::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let whole = Fields { found: &mut found }.deserialize(&mut de).is_ok() && de.end().is_ok();
    found.complete = whole;
    found
}

/// Like [`salvage`] for bytes that may not be UTF-8: each bad sequence is read as U+FFFD, so
/// keys and values around it are still found (an id that itself holds bad bytes comes back
/// with U+FFFD in their place).
pub fn salvage_bytes(bytes: &[u8]) -> Salvaged {
    salvage(&String::from_utf8_lossy(bytes))
}

/// Where the first bad byte of `bytes` is, for an error message: `None` if it is UTF-8.
pub fn first_bad_byte(bytes: &[u8]) -> Option<(usize, u8)> {
    let err = std::str::from_utf8(bytes).err()?;
    let at = err.valid_up_to();
    bytes.get(at).map(|&b| (at, b))
}

/// Visits the top-level object, recording into `found` as it goes, so that what was read
/// before an error is kept.
struct Fields<'a> {
    found: &'a mut Salvaged,
}

impl<'de> DeserializeSeed<'de> for Fields<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Fields<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "id" => self.found.id = Some(map.next_value()?),
                "method" => self.found.method = Some(map.next_value()?),
                "jsonrpc" => self.found.jsonrpc = Some(map.next_value()?),
                "result" | "error" => {
                    self.found.response = true;
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_whole_request_is_read_completely() {
        let s = salvage(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}"#);
        assert_eq!(s.id, Some(json!(7)));
        assert_eq!(s.method, Some(json!("tools/call")));
        assert!(s.complete && !s.response && !s.is_notification());
    }

    #[test]
    fn the_id_before_a_break_is_kept() {
        for text in [
            r#"{"id": "a", "input": {"x": tru"#,
            r#"{"id": "a", "input": "cut off"#,
            r#"{"id": "a", "input": {} } trailing"#,
            r#"{"id": "a", "input": [1, 2,, 3]}"#,
        ] {
            let s = salvage(text);
            assert_eq!(s.id, Some(json!("a")), "{text}");
            assert!(!s.complete, "{text}");
        }
    }

    #[test]
    fn an_id_after_the_break_is_not_found() {
        let s = salvage(r#"{"input": {"x": tru}, "id": 3}"#);
        assert_eq!(s.id, None);
        assert!(!s.complete);
    }

    #[test]
    fn deep_nesting_is_skipped_and_the_id_kept() {
        let depth = 100_000;
        let text = format!(
            r#"{{"id": 9, "input": {}{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        // Too deep for serde_json to build a `Value` from...
        assert!(serde_json::from_str::<Value>(&text).is_err());
        // ...but skipping it needs no recursion, so the whole line is read.
        let s = salvage(&text);
        assert_eq!(s.id, Some(json!(9)));
        assert!(s.complete);
        // The id itself may be deep too: it is not kept then, and nothing overflows.
        let text = format!(r#"{{"id": {}{}}}"#, "[".repeat(depth), "]".repeat(depth));
        assert_eq!(salvage(&text).id, None);
    }

    #[test]
    fn the_last_of_duplicate_ids_wins_as_in_serde_json() {
        let s = salvage(r#"{"id": 1, "id": 2}"#);
        assert_eq!(s.id, Some(json!(2)));
        let parsed: Value = serde_json::from_str(r#"{"id": 1, "id": 2}"#).unwrap();
        assert_eq!(parsed["id"], json!(2));
    }

    #[test]
    fn notifications_and_responses_are_told_apart() {
        assert!(
            salvage(r#"{"jsonrpc":"2.0","method":"notifications/x","params":1}"#).is_notification()
        );
        // Cut off: the id may have come later, so it is not known to be a notification.
        assert!(
            !salvage(r#"{"jsonrpc":"2.0","method":"notifications/x","params":"#).is_notification()
        );
        let r = salvage(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        assert!(r.response && !r.is_notification());
    }

    #[test]
    fn non_objects_yield_nothing() {
        for text in ["[1, 2]", "7", "\"id\"", "", "nonsense"] {
            assert_eq!(salvage(text), Salvaged::default(), "{text}");
        }
    }

    #[test]
    fn bad_utf8_is_read_around() {
        let bytes = b"{\"id\": \"x\", \"input\": {\"path\": \"a\xffb\"}, \"name\": \"read_file\"}";
        assert_eq!(first_bad_byte(bytes), Some((32, 0xff)));
        let s = salvage_bytes(bytes);
        assert_eq!(s.id, Some(json!("x")));
        assert!(s.complete);
        // An id written after the bad byte is still found.
        let s = salvage_bytes(b"{\"input\": \"\xc3\x28\", \"id\": 4}");
        assert_eq!(s.id, Some(json!(4)));
        assert_eq!(first_bad_byte(b"plain"), None);
    }
}
