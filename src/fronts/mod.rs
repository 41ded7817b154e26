//! The ways to reach the tools from outside a run: the JSONL `tool exec` protocol, the MCP
//! server, and receipt replay.

pub mod exec;
pub mod mcp;
pub mod receipt_gate;
pub mod replay;
