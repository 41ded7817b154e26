//! Turning a validated JSON input into a tool's typed arguments.

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
    }
}
