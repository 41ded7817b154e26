//! Turning a validated JSON input into a tool's typed arguments.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ToolError, ToolResult};

/// Deserializes `input` into `T`; any mismatch becomes an `InvalidArguments` error for `tool`.
///
/// Schema validation runs before this, so a failure here means the schema and the struct
/// disagree or a value is out of the struct's range; both are reported, never a panic.
pub fn parse<T: DeserializeOwned>(tool: &str, input: Value) -> ToolResult<T> {
    serde_json::from_value(input).map_err(|e| ToolError::invalid(tool, "", e.to_string()))
}

/// Deserializes a borrowed `input` into `T`, which may borrow its strings from it (for
/// [`Tool::execute_borrowed`](crate::tool::Tool::execute_borrowed)); errors as [`parse`].
pub fn parse_ref<'a, T: Deserialize<'a>>(tool: &str, input: &'a Value) -> ToolResult<T> {
    T::deserialize(input).map_err(|e| ToolError::invalid(tool, "", e.to_string()))
}

/// The default of a tool's `path` argument, the worktree root; for
/// `#[serde(default = "args::root")]`.
pub fn root() -> String {
    ".".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct A {
        #[allow(dead_code)]
        n: u32,
    }

    #[test]
    fn mismatch_is_invalid_arguments() {
        let err = parse::<A>("t", serde_json::json!({"n": -1})).unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(err.to_string().contains("call t again"));
        let input = serde_json::json!({"n": -1});
        let by_ref = parse_ref::<A>("t", &input).unwrap_err();
        assert_eq!(by_ref.to_string(), err.to_string());
    }

    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Borrowing<'a> {
        s: &'a str,
        n: Option<u32>,
    }

    #[test]
    fn borrowed_parse_borrows_strings_and_refuses_what_parse_refuses() {
        let input = serde_json::json!({"s": "quoted \"text\"\n"});
        let args: Borrowing<'_> = parse_ref("t", &input).unwrap();
        assert_eq!(
            args,
            Borrowing {
                s: "quoted \"text\"\n",
                n: None
            }
        );
        assert!(
            std::ptr::eq(args.s, input["s"].as_str().unwrap()),
            "not copied"
        );
        for bad in [
            serde_json::json!({"s": "x", "extra": 1}),
            serde_json::json!({"s": 1}),
            serde_json::json!({"n": 1}),
        ] {
            let err = parse_ref::<Borrowing<'_>>("t", &bad).unwrap_err();
            assert_eq!(err.kind(), "invalid_arguments", "{bad}");
        }
    }
}
