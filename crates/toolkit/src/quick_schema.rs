//! A quick acceptance check in front of the JSON Schema validator, for the schemas most tools
//! have: an object of strings, integers and booleans with a few bounds. Every tool call's
//! input is validated; for such a schema and a small input the general validator was a tenth
//! of a `query_loop` call's own cost (bench query).
//!
//! The check only ever *accepts*: it says an input is valid when it is certain, and anything
//! it does not understand (a keyword it does not know, a float where an integer is wanted, a
//! property it cannot check) sends the input to the validator, which decides and lists the
//! problems. It accepts nothing the validator refuses (a property test compares the two on
//! every built-in tool's schema).

use serde_json::{Map, Value};

/// What the quick check knows of one schema: an object's properties, the required ones, and
/// whether others are refused.
#[derive(Debug, Clone, PartialEq)]
pub struct QuickSchema {
    properties: Vec<(String, Check)>,
    required: Vec<String>,
    /// `additionalProperties: false`.
    closed: bool,
}

/// How one property's value is checked.
#[derive(Debug, Clone, PartialEq)]
enum Check {
    /// A string of `min..=max` characters (Unicode scalar values, as JSON Schema counts
    /// them), one of `one_of` when given.
    String {
        min: Option<u64>,
        max: Option<u64>,
        one_of: Option<Vec<String>>,
    },
    /// An integer within `min..=max`.
    Integer { min: Option<i64>, max: Option<i64> },
    /// `true` or `false`.
    Boolean,
    /// Anything else: the validator decides.
    Validator,
}

/// Keywords that only annotate: they never make an input invalid.
const ANNOTATIONS: &[&str] = &["description", "title", "default", "examples"];

impl QuickSchema {
    /// The quick check of `schema`, when it is an object schema the check understands (only
    /// `type`, `properties`, `required`, `additionalProperties: false` and annotations);
    /// `None` otherwise, and every input goes to the validator.
    pub fn compile(schema: &Value) -> Option<Self> {
        let schema = schema.as_object()?;
        if !only(
            schema,
            &["type", "properties", "required", "additionalProperties"],
        ) {
            return None;
        }
        if schema.get("type")? != "object" {
            return None;
        }
        let closed = match schema.get("additionalProperties") {
            None => false,
            Some(Value::Bool(false)) => true,
            Some(_) => return None,
        };
        let required = match schema.get("required") {
            None => Vec::new(),
            Some(names) => names
                .as_array()?
                .iter()
                .map(|n| n.as_str().map(str::to_string))
                .collect::<Option<_>>()?,
        };
        let properties = match schema.get("properties") {
            None => Vec::new(),
            Some(p) => p
                .as_object()?
                .iter()
                .map(|(name, s)| (name.clone(), Check::of(s)))
                .collect(),
        };
        Some(Self {
            properties,
            required,
            closed,
        })
    }

    /// Whether `input` is certainly valid; `false` when it may not be (the validator
    /// decides then).
    pub fn accepts(&self, input: &Value) -> bool {
        let Some(input) = input.as_object() else {
            return false;
        };
        for (name, value) in input {
            match self.properties.iter().find(|(p, _)| p == name) {
                Some((_, check)) if check.accepts(value) => {}
                Some(_) => return false,
                None if self.closed => return false,
                None => {}
            }
        }
        self.required.iter().all(|name| input.contains_key(name))
    }
}

impl Check {
    /// The check of one property's schema.
    fn of(schema: &Value) -> Self {
        let Some(schema) = schema.as_object() else {
            return Self::Validator;
        };
        match schema.get("type").and_then(Value::as_str) {
            Some("string") if only(schema, &["type", "minLength", "maxLength", "enum"]) => {
                let (Some(min), Some(max)) = (
                    bound(schema, "minLength", Value::as_u64),
                    bound(schema, "maxLength", Value::as_u64),
                ) else {
                    return Self::Validator;
                };
                let one_of = match schema.get("enum") {
                    None => None,
                    Some(values) => {
                        let strings = values.as_array().and_then(|v| {
                            v.iter()
                                .map(|s| s.as_str().map(str::to_string))
                                .collect::<Option<Vec<_>>>()
                        });
                        match strings {
                            Some(strings) => Some(strings),
                            None => return Self::Validator,
                        }
                    }
                };
                Self::String { min, max, one_of }
            }
            Some("integer") if only(schema, &["type", "minimum", "maximum"]) => {
                let (Some(min), Some(max)) = (
                    bound(schema, "minimum", Value::as_i64),
                    bound(schema, "maximum", Value::as_i64),
                ) else {
                    return Self::Validator;
                };
                Self::Integer { min, max }
            }
            Some("boolean") if only(schema, &["type"]) => Self::Boolean,
            _ => Self::Validator,
        }
    }

    /// Whether `value` certainly passes.
    fn accepts(&self, value: &Value) -> bool {
        match (self, value) {
            (Self::String { min, max, one_of }, Value::String(s)) => {
                chars_at_least(s, min.unwrap_or(0))
                    && max.is_none_or(|max| chars_at_most(s, max))
                    && one_of
                        .as_ref()
                        .is_none_or(|values| values.iter().any(|v| v == s))
            }
            (Self::Integer { min, max }, Value::Number(n)) => n
                .as_i64()
                .is_some_and(|n| min.is_none_or(|min| n >= min) && max.is_none_or(|max| n <= max)),
            (Self::Boolean, Value::Bool(_)) => true,
            _ => false,
        }
    }
}

/// Bound `key` of `schema` as `read` reads it: `Some(None)` when there is none, `None` when
/// it is not a number `read` takes.
fn bound<T>(
    schema: &Map<String, Value>,
    key: &str,
    read: impl Fn(&Value) -> Option<T>,
) -> Option<Option<T>> {
    match schema.get(key) {
        None => Some(None),
        Some(value) => read(value).map(Some),
    }
}

/// Whether `schema` has no keyword but `known` and annotations.
fn only(schema: &Map<String, Value>, known: &[&str]) -> bool {
    schema
        .keys()
        .all(|k| known.contains(&k.as_str()) || ANNOTATIONS.contains(&k.as_str()))
}

/// Whether `s` has at least `n` characters. A character takes one to four bytes, so the
/// length in bytes settles most cases without counting.
fn chars_at_least(s: &str, n: u64) -> bool {
    let bytes = s.len() as u64;
    bytes >= n.saturating_mul(4) || (bytes >= n && s.chars().count() as u64 >= n)
}

/// Whether `s` has at most `n` characters.
fn chars_at_most(s: &str, n: u64) -> bool {
    s.len() as u64 <= n || s.chars().count() as u64 <= n
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn query_loop_like() -> Value {
        json!({
            "type": "object",
            "properties": {
                "target": {"type": "string", "minLength": 1, "description": "who"},
                "question": {"type": "string", "minLength": 2, "maxLength": 5},
                "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 10},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "flag": {"type": "boolean"},
                "list": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["target", "question"],
            "additionalProperties": false
        })
    }

    #[test]
    fn accepts_what_is_certainly_valid_and_leaves_the_rest_to_the_validator() {
        let schema = query_loop_like();
        let quick = QuickSchema::compile(&schema).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let accepted = [
            json!({"target": "b", "question": "ab"}),
            json!({"target": "ünï", "question": "ééééé", "timeout_ms": 10, "mode": "b", "flag": false}),
        ];
        for input in &accepted {
            assert!(quick.accepts(input), "{input}");
            assert!(validator.is_valid(input), "{input}");
        }
        let not_certain = [
            // Invalid.
            json!({"target": "b"}),
            json!({"target": "", "question": "ab"}),
            json!({"target": "b", "question": "a"}),
            json!({"target": "b", "question": "éééééé"}),
            json!({"target": "b", "question": "ab", "timeout_ms": 0}),
            json!({"target": "b", "question": "ab", "timeout_ms": 11}),
            json!({"target": "b", "question": "ab", "mode": "c"}),
            json!({"target": "b", "question": "ab", "flag": "yes"}),
            json!({"target": "b", "question": "ab", "other": 1}),
            json!({"target": 1, "question": "ab"}),
            json!(["target"]),
            // Valid, but not for the quick check to say.
            json!({"target": "b", "question": "ab", "timeout_ms": 5.0}),
            json!({"target": "b", "question": "ab", "list": ["x"]}),
        ];
        for input in &not_certain {
            assert!(!quick.accepts(input), "{input}");
        }
        assert!(validator.is_valid(&not_certain[11]));
        assert!(validator.is_valid(&not_certain[12]));
    }

    #[test]
    fn schemas_with_keywords_it_does_not_know_are_left_to_the_validator() {
        for schema in [
            json!({"type": "object", "properties": {}, "patternProperties": {"^x": {}}}),
            json!({"type": "object", "additionalProperties": {"type": "string"}}),
            json!({"type": "array"}),
            json!({"type": ["object", "null"]}),
            json!({"type": "object", "required": "x"}),
            json!(true),
        ] {
            assert_eq!(QuickSchema::compile(&schema), None, "{schema}");
        }
        // An open object: other properties pass.
        let open = QuickSchema::compile(&json!({"type": "object"})).unwrap();
        assert!(open.accepts(&json!({"anything": [1, {}]})));
        // A property it cannot check sends inputs that have it to the validator.
        let odd = QuickSchema::compile(&json!({"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 0.5},
            "s": {"type": "string", "pattern": "^a"},
            "e": {"type": "string", "enum": ["a", 1]},
        }}))
        .unwrap();
        for input in [json!({"n": 1}), json!({"s": "a"}), json!({"e": "a"})] {
            assert!(!odd.accepts(&input), "{input}");
        }
        assert!(odd.accepts(&json!({})));
    }

    #[test]
    fn characters_are_counted_as_json_schema_counts_them() {
        for (s, n) in [
            ("", 0),
            ("a", 1),
            ("é", 1),
            ("\u{1F600}x", 2),
            ("aé\u{1F600}", 3),
        ] {
            let count = s.chars().count() as u64;
            assert_eq!(count, n, "{s}");
            for k in 0..6 {
                assert_eq!(chars_at_least(s, k), count >= k, "{s} >= {k}");
                assert_eq!(chars_at_most(s, k), count <= k, "{s} <= {k}");
            }
        }
    }
}
