//! The port through which coordination tools reach other loops.
//!
//! Tools know nothing about actors: `query_loop`, `share_data`, `broadcast_alert` and
//! `list_loops` talk to this trait, and the actor runtime provides the implementation that
//! routes through the coordinator. Outside a run (`tool exec`, MCP) there is no port and the
//! tools say so.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ToolError;

/// What one loop knows about another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopInfo {
    /// The loop's exec id (its name in the run).
    pub name: String,
    /// Its loop type.
    pub loop_type: String,
    /// Its status (running, completed, failed, ...).
    pub status: String,
    /// Its task, first line only.
    pub task: String,
}

/// Whether a share reached one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The target's exec id.
    pub target: String,
    /// `None` when delivered; otherwise why not.
    pub error: Option<String>,
}

/// Coordination services offered to a loop's tools.
///
/// The coordination tools run in the calling loop's task, not in a worker lane, and the
/// registry arms no watchdog for them: an implementation must bound every call itself.
/// `query` returns within the `timeout` it is given; the others never wait on another
/// loop's work (the runtime's coordinator answers them from its own state at once, or, for a
/// loop on another host, once its host confirmed or refused the delivery, within a bound).
#[async_trait]
pub trait Coordination: Send + Sync {
    /// Asks `target` a question and waits up to `timeout` for its reply. `from` is the
    /// asking loop's name as its context shares it: the query's record keeps it uncopied.
    async fn query(
        &self,
        from: &Arc<str>,
        target: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<String, ToolError>;

    /// Puts `data` into each target's inbox; reports per target whether it was delivered.
    async fn share(
        &self,
        from: &str,
        targets: &[String],
        data_type: &str,
        data: Value,
    ) -> Result<Vec<Delivery>, ToolError>;

    /// Broadcasts an event to every other loop that listens to `event_type`; returns how
    /// many loops it reached.
    async fn alert(
        &self,
        from: &str,
        event_type: &str,
        message: &str,
        data: Option<Value>,
    ) -> Result<usize, ToolError>;

    /// The loops of the run other than `from`.
    async fn list_loops(&self, from: &str) -> Result<Vec<LoopInfo>, ToolError>;
}
