//! The error type every tool returns, and the text the model sees for each error.
//!
//! Each variant's message ends with what the model should do next: an error is an
//! instruction to the next model turn, not just a diagnosis.

/// One problem found by schema validation: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentProblem {
    /// JSON pointer into the input (`""` is the whole input object).
    pub pointer: String,
    /// What is wrong at that place.
    pub message: String,
}

impl std::fmt::Display for ArgumentProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(f, "at {at}: {}", self.message)
    }
}

fn list_problems(problems: &[ArgumentProblem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Everything that can go wrong in a tool call.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The path resolves outside the loop's worktree.
    #[error(
        "sandbox violation: '{path}' resolves outside the worktree{detail}. Use a path relative to the worktree root that stays inside it."
    )]
    SandboxViolation {
        /// The path as the model gave it.
        path: String,
        /// Optional extra detail (e.g. "through symlink x").
        detail: String,
    },

    /// The path is inside the worktree but the loop may not write it (git metadata, the
    /// daemon's own directory).
    #[error("'{path}' is protected: {reason}")]
    ProtectedPath {
        /// The path as the model gave it.
        path: String,
        /// Why, and what to do instead.
        reason: String,
    },

    /// The file or directory does not exist.
    #[error("not found: '{path}'. {hint}")]
    NotFound {
        /// The path as the model gave it.
        path: String,
        /// What to try instead.
        hint: String,
    },

    /// `edit_file` on a file that this loop never read.
    #[error(
        "edit refused: '{path}' has not been read by this loop. Call read_file on it first, then retry the edit."
    )]
    EditWithoutRead {
        /// The path as the model gave it.
        path: String,
    },

    /// The file changed since this loop read it.
    #[error(
        "edit refused: '{path}' changed on disk since you last read it (another loop, the user or a command modified it). Read it again with read_file, then redo the edit against what is there now."
    )]
    StaleRead {
        /// The path as the model gave it.
        path: String,
    },

    /// The input does not match the tool's schema or is otherwise unusable.
    #[error("invalid arguments for {tool}:\n{}\nFix these fields and call {tool} again.", list_problems(.problems))]
    InvalidArguments {
        /// The tool's name.
        tool: String,
        /// Every problem found, each with its JSON pointer.
        problems: Vec<ArgumentProblem>,
    },

    /// The call ran longer than its timeout.
    #[error(
        "timed out after {timeout_ms} ms{detail}. Narrow the work (a smaller path, a more specific pattern) or, for commands, pass a larger timeout_ms up to the allowed maximum."
    )]
    Timeout {
        /// The limit that was hit.
        timeout_ms: u64,
        /// Optional extra detail.
        detail: String,
    },

    /// No tool of that name in this loop's tool set.
    #[error("unknown tool '{name}'. Available tools: {available}.")]
    UnknownTool {
        /// The name the model asked for.
        name: String,
        /// Comma-separated names that do exist.
        available: String,
    },

    /// A size or rate limit was hit.
    #[error("limit exceeded: {what}. {hint}")]
    LimitExceeded {
        /// Which limit.
        what: String,
        /// What to do instead.
        hint: String,
    },

    /// The tool cannot do this here (missing configuration, unsupported platform...).
    #[error("{message}")]
    Unavailable {
        /// Full explanation, including what to do next.
        message: String,
    },

    /// An operation the tool attempted failed (I/O, network...).
    #[error("{action} failed: {message}. {hint}")]
    Failed {
        /// What was being done.
        action: String,
        /// The underlying error.
        message: String,
        /// What to try next.
        hint: String,
    },
}

impl ToolError {
    /// Shorthand for a single invalid-argument problem.
    pub fn invalid(tool: &str, pointer: &str, message: impl Into<String>) -> Self {
        ToolError::InvalidArguments {
            tool: tool.to_string(),
            problems: vec![ArgumentProblem {
                pointer: pointer.to_string(),
                message: message.into(),
            }],
        }
    }

    /// Shorthand for a failed operation.
    pub fn failed(
        action: impl Into<String>,
        message: impl std::fmt::Display,
        hint: impl Into<String>,
    ) -> Self {
        ToolError::Failed {
            action: action.into(),
            message: message.to_string(),
            hint: hint.into(),
        }
    }

    /// Maps an I/O error on `path` to the most useful tool error.
    pub fn from_io(action: &str, path: &str, err: &std::io::Error) -> Self {
        match err.kind() {
            std::io::ErrorKind::NotFound => ToolError::NotFound {
                path: path.to_string(),
                hint: "Check the spelling, or use list_directory or glob to find the right path."
                    .to_string(),
            },
            std::io::ErrorKind::PermissionDenied => ToolError::failed(
                format!("{action} '{path}'"),
                err,
                "The file is not accessible; choose another path.",
            ),
            _ => ToolError::failed(
                format!("{action} '{path}'"),
                err,
                "Check the path and try again.",
            ),
        }
    }

    /// A short stable name for the variant (used in receipts and tests).
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::SandboxViolation { .. } | ToolError::ProtectedPath { .. } => {
                "sandbox_violation"
            }
            ToolError::NotFound { .. } => "not_found",
            ToolError::EditWithoutRead { .. } => "edit_without_read",
            ToolError::StaleRead { .. } => "stale_read",
            ToolError::InvalidArguments { .. } => "invalid_arguments",
            ToolError::Timeout { .. } => "timeout",
            ToolError::UnknownTool { .. } => "unknown_tool",
            ToolError::LimitExceeded { .. } => "limit_exceeded",
            ToolError::Unavailable { .. } => "unavailable",
            ToolError::Failed { .. } => "failed",
        }
    }
}

/// Convenience alias.
pub type ToolResult<T> = Result<T, ToolError>;

/// A path as shown to a model: worktree-relative when possible, escaped when its name is not
/// plain text (`td_base::shown_path`), so that it can be passed back.
pub fn display_path(root: &std::path::Path, path: &std::path::Path) -> String {
    match path.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_string(),
        Ok(rel) => td_base::shown_path::show(rel.as_os_str()).into_owned(),
        Err(_) => td_base::shown_path::show(path.as_os_str()).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_arguments_lists_every_pointer_and_says_what_to_do() {
        let err = ToolError::InvalidArguments {
            tool: "read_file".into(),
            problems: vec![
                ArgumentProblem {
                    pointer: "".into(),
                    message: "\"path\" is a required property".into(),
                },
                ArgumentProblem {
                    pointer: "/limit".into(),
                    message: "-1 is less than the minimum of 1".into(),
                },
            ],
        };
        let text = err.to_string();
        assert!(text.contains("at /: \"path\" is a required property"));
        assert!(text.contains("at /limit: -1 is less than the minimum of 1"));
        assert!(text.contains("call read_file again"));
        assert_eq!(err.kind(), "invalid_arguments");
    }

    #[test]
    fn io_not_found_maps_to_not_found_with_hint() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let err = ToolError::from_io("read", "a.txt", &io);
        assert_eq!(err.kind(), "not_found");
        assert!(err.to_string().contains("glob"));
    }
}
