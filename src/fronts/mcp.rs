//! PLACEHOLDER: MCP server on stdio.

use std::sync::Arc;

use crate::context::ToolContext;
use crate::receipts::ReceiptLog;
use crate::registry::ToolSet;

/// Serves `tools` over MCP on stdin/stdout until the client disconnects.
pub async fn serve_stdio(
    _ctx: Arc<ToolContext>,
    _tools: Arc<ToolSet>,
    _receipts: Option<Arc<ReceiptLog>>,
) -> Result<(), String> {
    Err("PLACEHOLDER: MCP not implemented".to_string())
}
