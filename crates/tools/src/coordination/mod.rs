//! Coordination tools: asking, sharing with and alerting other loops, listing them, and ending the loop.

pub mod broadcast_alert;
pub mod complete_task;
pub mod list_loops;
pub mod query_loop;
pub mod share_data;
