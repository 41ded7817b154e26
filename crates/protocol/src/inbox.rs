//! What waits in a loop's inbox for its model's next turn.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Something waiting in a loop's inbox until its model's next turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InboxItem {
    /// Data another loop shared.
    Share {
        /// Sender.
        from: String,
        /// Kind of data.
        data_type: String,
        /// The data.
        data: Value,
    },
    /// A broadcast alert (from a loop, or `taskdaemon` for system alerts).
    Alert {
        /// Sender.
        from: String,
        /// Event type.
        event_type: String,
        /// Message.
        message: String,
        /// Optional data.
        data: Option<Value>,
        /// For a system alert: the loop it is about (whose start or end it announces).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        about: Option<String>,
    },
}
