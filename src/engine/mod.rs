//! The Ralph iteration engine: fresh context per iteration, model turns with tool calls,
//! validation, progress carried in files and notes rather than the model's memory.

use serde::{Deserialize, Serialize};

/// How a loop ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum LoopEnd {
    /// Validation passed.
    Completed {
        /// Iterations used.
        iterations: u32,
        /// The model's completion summary, if any.
        summary: Option<String>,
    },
    /// Gave up (max iterations, model errors...).
    Failed {
        /// Iterations used.
        iterations: u32,
        /// Why.
        reason: String,
    },
    /// Stopped on request.
    Stopped {
        /// Iterations used.
        iterations: u32,
    },
}
