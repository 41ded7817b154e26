//! `taskdaemon mcp`: the tool set served over the Model Context Protocol on stdin/stdout.
//!
//! One server process is one session: it holds one `ToolContext` (so read stamps carry from
//! `read_file` to `edit_file`), lists the tools of its `ToolSet`, and sends every call through
//! `ToolSet::call` — the same schema validation, timeouts, output caps and receipts as the
//! other fronts. stdout carries only protocol messages; logs go to stderr (see `main`). The
//! stdio transport is ours (`mcp_transport`): it answers every request, even one rmcp could
//! not read.
//!
//! The handler is written by hand rather than with rmcp's `#[tool]` macros because the tool
//! set is chosen at run time (`--tools`).

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    ToolAnnotations,
};
use rmcp::service::{QuitReason, RequestContext, ServerInitializeError};
use rmcp::transport::IntoTransport;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use tokio::sync::RwLock;

use super::mcp_transport::LineTransport;
use crate::fronts::receipt_gate::ReceiptGate;
use td_toolkit::call_path::{CallPath, InCallerTask};
use td_toolkit::context::ToolContext;
use td_toolkit::receipts::ReceiptLog;
use td_toolkit::registry::ToolSet;

/// What the server tells clients at `initialize`.
const INSTRUCTIONS: &str = "TaskDaemon tools, confined to one git worktree. Paths are \
relative to the worktree root. Read a file with read_file before editing it.";

/// An MCP server over one tool set and one session context.
pub struct McpServer {
    /// The session's context, tools and receipt log; calls run in the request's task.
    calls: CallPath,
    /// Closed once a receipt could not be written: no call runs after that.
    gate: Arc<ReceiptGate>,
    /// The tool list as sent to clients; the set never changes during a session.
    listed: Arc<Vec<rmcp::model::Tool>>,
    /// rmcp runs each request on its own task. Read-only calls share this lock; a call that
    /// may change the worktree takes it alone, so an edit never races a read or another
    /// edit of the same session (the `tool exec` front gets the same effect by running calls
    /// one at a time).
    lane: RwLock<()>,
}

impl McpServer {
    /// A server for `tools`, running every call in `ctx` and logging receipts to `receipts`.
    pub fn new(
        ctx: Arc<ToolContext>,
        tools: Arc<ToolSet>,
        receipts: Option<Arc<ReceiptLog>>,
    ) -> Self {
        let listed = tools
            .definitions()
            .into_iter()
            .map(|def| {
                let read_only = tools.get(&def.name).is_some_and(|t| t.read_only());
                rmcp::model::Tool::new(def.name, def.description, schema_object(def.input_schema))
                    .with_annotations(ToolAnnotations::new().read_only(read_only))
            })
            .collect();
        Self {
            calls: CallPath::new(ctx, tools, Arc::new(InCallerTask), receipts),
            gate: Arc::new(ReceiptGate::new()),
            listed: Arc::new(listed),
            lane: RwLock::new(()),
        }
    }
}

/// MCP requires an object schema; ours always are, but a tool's schema is just a `Value`.
fn schema_object(schema: Value) -> JsonObject {
    match schema {
        Value::Object(map) => map,
        other => {
            // `true` (accept anything) is the only non-object schema that makes sense here;
            // an empty object schema means the same.
            if other != Value::Bool(true) {
                tracing::warn!("tool schema is not a JSON object ({other}); listing it as {{}}");
            }
            JsonObject::new()
        }
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                env!("CARGO_PKG_NAME"),
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // A few dozen tools fit in one page, so the cursor is ignored and none is returned.
        Ok(ListToolsResult::with_all_items(
            self.listed.as_ref().clone(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.as_ref();
        // MCP lets a client omit `arguments`; for tools whose fields are all optional that
        // means "all defaults", which is what an empty object says to the schema.
        let input = Value::Object(request.arguments.unwrap_or_default());
        let tool = self.calls.tools().get(name);
        if self.calls.receipts().is_some()
            && let Err(refused) = self.gate.admit()
        {
            return Ok(CallToolResult::error(vec![ContentBlock::text(refused)]).into());
        }
        let exclusive = tool.is_some_and(|t| !t.read_only());
        // A cancelled request is not aborted: its tool may already be writing files or
        // running a command, and the registry's timeout bounds how long it can take. rmcp
        // drops the late answer.
        let called = if exclusive {
            let _turn = self.lane.write().await;
            self.calls.call(None, name, input).await
        } else {
            let _turn = self.lane.read().await;
            self.calls.call(None, name, input).await
        };
        if let Some(unrecorded) = self.gate.keep(&called) {
            return Ok(CallToolResult::error(vec![ContentBlock::text(unrecorded)]).into());
        }
        let outcome = called.outcome;
        if tool.is_none() {
            // The MCP spec (tools, "Error Handling") lists unknown tools among protocol
            // errors, with -32602 in its example; a client only offers listed tools, so this
            // is a client bug rather than a model mistake. The message still names the tools
            // that exist, and the receipt above records the attempt like any other call.
            return Err(ErrorData::invalid_params(outcome.content, None));
        }
        let content = vec![ContentBlock::text(outcome.content)];
        Ok(if outcome.is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        }
        .into())
    }
}

/// Serves `tools` over MCP on stdin/stdout until the client disconnects. Returns why
/// receipts stopped being written, when they did (no call ran after it).
pub async fn serve_stdio(
    ctx: Arc<ToolContext>,
    tools: Arc<ToolSet>,
    receipts: Option<Arc<ReceiptLog>>,
) -> Result<Option<String>, String> {
    let server = McpServer::new(ctx, tools, receipts);
    let gate = server.gate.clone();
    // `stdio_pipes` reads pipes through the non-blocking reactor (falling back to the blocking
    // handles for files and terminals), so a pending stdin read never holds up runtime
    // shutdown. Our transport frames the lines, so that every request gets an answer.
    let (read, write) = rmcp::transport::stdio_pipes();
    serve(server, LineTransport::new(read, write)).await?;
    Ok(gate.failure())
}

/// Serves `server` on any rmcp transport until the peer disconnects. A peer that leaves
/// before completing the handshake ends the session cleanly too.
pub async fn serve<T, E, A>(server: McpServer, transport: T) -> Result<(), String>
where
    T: IntoTransport<RoleServer, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let running = match server.serve(transport).await {
        Ok(running) => running,
        Err(ServerInitializeError::ConnectionClosed(during)) => {
            tracing::info!("client closed the connection during {during}");
            return Ok(());
        }
        Err(e) => return Err(format!("MCP handshake failed: {e}")),
    };
    match running.waiting().await {
        Ok(QuitReason::JoinError(e)) => Err(format!("MCP session task failed: {e}")),
        Ok(reason) => {
            tracing::info!("MCP session ended: {reason:?}");
            Ok(())
        }
        Err(e) => Err(format!("MCP session task failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use rmcp::model::ErrorCode;
    use rmcp::service::{RoleClient, RunningService};
    use rmcp::{ServiceError, ServiceExt};
    use serde_json::json;

    use super::*;
    use td_toolkit::error::ToolResult;
    use td_toolkit::tool::{Tool, ToolOutput};

    /// Read-only; echoes `text`, or fails as a tool when `text` is "fail".
    struct Echo;
    #[async_trait]
    impl Tool for Echo {
        fn name(&self) -> &'static str {
            "echo"
        }
        fn description(&self) -> &'static str {
            "Echoes text."
        }
        fn input_schema(&self) -> Value {
            json!({"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"], "additionalProperties": false})
        }
        fn read_only(&self) -> bool {
            true
        }
        async fn execute(&self, input: Value, _ctx: &ToolContext) -> ToolResult<ToolOutput> {
            let text = input["text"].as_str().unwrap_or_default().to_string();
            Ok(ToolOutput {
                is_error: text == "fail",
                ..ToolOutput::text(text)
            })
        }
    }

    /// Counts how many of its calls overlap. The read-only variant also waits (bounded) for
    /// a second call, so overlapping is required, not just likely.
    struct Overlap {
        name: &'static str,
        read_only: bool,
        active: AtomicUsize,
        peak: AtomicUsize,
        meet: tokio::sync::Barrier,
    }
    impl Overlap {
        fn new(name: &'static str, read_only: bool) -> Arc<Self> {
            Arc::new(Self {
                name,
                read_only,
                active: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                meet: tokio::sync::Barrier::new(2),
            })
        }
    }
    #[async_trait]
    impl Tool for Overlap {
        fn name(&self) -> &'static str {
            self.name
        }
        fn description(&self) -> &'static str {
            "Counts overlapping calls."
        }
        fn input_schema(&self) -> Value {
            json!({"type": "object", "additionalProperties": false})
        }
        fn read_only(&self) -> bool {
            self.read_only
        }
        async fn execute(&self, _input: Value, _ctx: &ToolContext) -> ToolResult<ToolOutput> {
            let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            if self.read_only {
                let met = tokio::time::timeout(Duration::from_secs(5), self.meet.wait()).await;
                if met.is_err() {
                    self.active.fetch_sub(1, Ordering::SeqCst);
                    return Ok(ToolOutput {
                        is_error: true,
                        ..ToolOutput::text("the other call never ran alongside")
                    });
                }
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.active.fetch_sub(1, Ordering::SeqCst);
            Ok(ToolOutput::text("done"))
        }
    }

    struct Session {
        client: RunningService<RoleClient, ()>,
        server: tokio::task::JoinHandle<Result<(), String>>,
        log: Arc<ReceiptLog>,
        _dir: tempfile::TempDir,
    }

    /// Starts a server over `tools` on an in-memory pipe and connects rmcp's client to it.
    async fn connect(tools: Vec<Arc<dyn Tool>>) -> Session {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Arc::new(ToolContext::new(dir.path(), "mcp-test").unwrap());
        let log = Arc::new(ReceiptLog::open(&dir.path().join("receipts.jsonl")).unwrap());
        let set = Arc::new(ToolSet::from_tools(tools).unwrap());
        let (server_io, client_io) = tokio::io::duplex(1 << 16);
        let server = McpServer::new(ctx, set, Some(log.clone()));
        let server = tokio::spawn(serve(server, server_io));
        let client = ().serve(client_io).await.unwrap();
        Session {
            client,
            server,
            log,
            _dir: dir,
        }
    }

    fn call(name: &'static str, args: Value) -> CallToolRequestParams {
        let params = CallToolRequestParams::new(name);
        match args {
            Value::Object(map) => params.with_arguments(map),
            _ => params,
        }
    }

    fn text(result: &CallToolResult) -> &str {
        assert_eq!(result.content.len(), 1, "{result:?}");
        &result.content[0].as_text().unwrap().text
    }

    fn receipts(s: &Session) -> Vec<td_toolkit::receipts::Receipt> {
        let read = td_toolkit::receipts::read_log(s.log.path()).unwrap();
        assert!(read.bad_lines.is_empty());
        read.items
    }

    #[tokio::test]
    async fn handshake_names_the_server_and_lists_every_tool_with_its_schema() {
        let s = connect(vec![Arc::new(Echo), Overlap::new("edit", false)]).await;
        let info = s.client.peer_info().unwrap();
        let server = info.server_info.as_ref().unwrap();
        assert_eq!(server.name, "taskdaemon");
        assert_eq!(server.version, env!("CARGO_PKG_VERSION"));
        assert!(info.capabilities.tools.is_some());
        assert!(info.instructions.as_deref().unwrap().contains("read_file"));

        let listed = s.client.list_all_tools().await.unwrap();
        let names: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, ["echo", "edit"]);
        assert_eq!(listed[0].description.as_deref(), Some("Echoes text."));
        assert_eq!(
            Value::Object((*listed[0].input_schema).clone()),
            Echo.input_schema()
        );
        let hints: Vec<Option<bool>> = listed
            .iter()
            .map(|t| t.annotations.as_ref().and_then(|a| a.read_only_hint))
            .collect();
        assert_eq!(hints, [Some(true), Some(false)]);
        s.client.cancel().await.unwrap();
        assert_eq!(s.server.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn calls_go_through_the_tool_set_and_leave_receipts() {
        let s = connect(vec![Arc::new(Echo)]).await;
        let ok = s
            .client
            .call_tool(call("echo", json!({"text": "hi"})))
            .await
            .unwrap();
        assert_eq!(ok.is_error, Some(false));
        assert_eq!(text(&ok), "hi");

        let failed = s
            .client
            .call_tool(call("echo", json!({"text": "fail"})))
            .await
            .unwrap();
        assert_eq!(failed.is_error, Some(true));
        assert_eq!(text(&failed), "fail");

        let invalid = s
            .client
            .call_tool(call("echo", json!({"text": 7, "extra": true})))
            .await
            .unwrap();
        assert_eq!(invalid.is_error, Some(true));
        let message = text(&invalid);
        assert!(message.contains("invalid arguments for echo"), "{message}");
        assert!(message.contains("at /text:"), "{message}");
        assert!(message.contains("extra"), "{message}");

        let r = receipts(&s);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].tool, "echo");
        assert_eq!(*r[0].input, json!({"text": "hi"}));
        assert_eq!(&*r[0].exec_id, "mcp-test");
        assert!(!r[0].is_error);
        assert!(r[1].is_error && r[1].error_kind.is_none());
        assert_eq!(r[2].error_kind.as_deref(), Some("invalid_arguments"));
        assert!(r.iter().all(|r| r.call_id.is_none()));
        s.client.cancel().await.unwrap();
    }

    #[tokio::test]
    async fn missing_arguments_mean_an_empty_object() {
        let s = connect(vec![Arc::new(Echo), Overlap::new("edit", false)]).await;
        let ok = s.client.call_tool(call("edit", Value::Null)).await.unwrap();
        assert_eq!(ok.is_error, Some(false), "{ok:?}");
        // Echo requires `text`, so the empty object is reported field by field, not as
        // "null is not an object".
        let invalid = s.client.call_tool(call("echo", Value::Null)).await.unwrap();
        assert_eq!(invalid.is_error, Some(true));
        assert!(text(&invalid).contains("\"text\" is a required property"));
        assert_eq!(*receipts(&s)[1].input, json!({}));
        s.client.cancel().await.unwrap();
    }

    #[tokio::test]
    async fn unknown_tool_is_an_invalid_params_error_naming_the_tools() {
        let s = connect(vec![Arc::new(Echo)]).await;
        let err = s
            .client
            .call_tool(call("ecko", json!({})))
            .await
            .unwrap_err();
        let ServiceError::McpError(data) = err else {
            panic!("expected a JSON-RPC error, got {err:?}");
        };
        assert_eq!(data.code, ErrorCode::INVALID_PARAMS);
        assert!(
            data.message.contains("unknown tool 'ecko'"),
            "{}",
            data.message
        );
        assert!(
            data.message.contains("Available tools: echo"),
            "{}",
            data.message
        );
        let r = receipts(&s);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].error_kind.as_deref(), Some("unknown_tool"));
        // The session goes on after a protocol error.
        let ok = s
            .client
            .call_tool(call("echo", json!({"text": "still here"})))
            .await
            .unwrap();
        assert_eq!(text(&ok), "still here");
        s.client.cancel().await.unwrap();
    }

    #[tokio::test]
    async fn writing_calls_run_alone_and_read_only_calls_together() {
        let writer = Overlap::new("edit", false);
        let reader = Overlap::new("look", true);
        let s = connect(vec![writer.clone(), reader.clone()]).await;
        let (a, b) = tokio::join!(
            s.client.call_tool(call("edit", json!({}))),
            s.client.call_tool(call("edit", json!({})))
        );
        assert_eq!(a.unwrap().is_error, Some(false));
        assert_eq!(b.unwrap().is_error, Some(false));
        assert_eq!(writer.peak.load(Ordering::SeqCst), 1);

        let (a, b) = tokio::join!(
            s.client.call_tool(call("look", json!({}))),
            s.client.call_tool(call("look", json!({})))
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.is_error, Some(false), "{a:?}");
        assert_eq!(b.is_error, Some(false), "{b:?}");
        assert_eq!(reader.peak.load(Ordering::SeqCst), 2);
        s.client.cancel().await.unwrap();
    }

    #[tokio::test]
    async fn the_session_ends_cleanly_when_the_client_goes_away() {
        let s = connect(vec![Arc::new(Echo)]).await;
        drop(s.client);
        let ended = tokio::time::timeout(Duration::from_secs(10), s.server).await;
        assert_eq!(ended.unwrap().unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn a_client_leaving_before_the_handshake_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Arc::new(ToolContext::new(dir.path(), "t").unwrap());
        let set = Arc::new(ToolSet::from_tools(vec![Arc::new(Echo)]).unwrap());
        let (server_io, client_io) = tokio::io::duplex(1024);
        drop(client_io);
        let result = serve(McpServer::new(ctx, set, None), server_io).await;
        assert_eq!(result, Ok(()));
    }

    #[test]
    fn a_non_object_schema_is_listed_as_an_empty_object() {
        assert_eq!(schema_object(Value::Bool(true)), JsonObject::new());
        assert_eq!(schema_object(json!([1])), JsonObject::new());
        let obj = json!({"type": "object"});
        assert_eq!(Value::Object(schema_object(obj.clone())), obj);
    }
}
