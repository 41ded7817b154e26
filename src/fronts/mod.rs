//! The ways to reach the tools from outside a run: the JSONL `tool exec` protocol, the MCP
//! server, and receipt replay; and the web dashboard of a run (`ui`).

pub mod exec;
pub mod lines;
pub mod mcp;
pub mod mcp_transport;
pub mod policy;
pub mod receipt_gate;
pub mod receipt_session;
pub mod replay;
pub mod salvage;
pub mod ui;
