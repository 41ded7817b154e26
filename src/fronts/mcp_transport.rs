//! The stdio transport of `taskdaemon mcp`: newline-delimited JSON-RPC with a line cap, which
//! answers every request it cannot hand to rmcp.
//!
//! rmcp's own stdio transport drops, without a reply, a line that is not UTF-8, is longer
//! than 16 MiB or is nested deeper than serde_json's recursion limit, and replies to a
//! well-formed message of the wrong shape without its id; in each case a client waits forever
//! on that id. This transport frames lines itself ([`LineReader`], [`MAX_LINE_BYTES`]) in a
//! task of its own, gives rmcp the lines that parse as messages, and answers the others
//! itself on the same serialized output:
//!
//! - not UTF-8, or not JSON (syntax, or deeper than 128 levels): `-32700` parse error;
//! - over the cap, or JSON that is not a JSON-RPC message: `-32600` invalid request;
//! - a request with an id and a method whose parameters do not fit: `-32602` invalid params.
//!
//! The reply carries the request's id when it can be read (from a lossy decoding, or from the
//! first [`super::lines::KEPT_HEAD_BYTES`] of an over-long line), and `null` otherwise, as
//! JSON-RPC 2.0 asks. A notification (a whole object with a method and no id) or a response
//! that cannot be read is dropped with a line on stderr, since nobody waits for an answer to
//! it. Every line written, rmcp's or ours, goes through [`td_base::secrets::redact_json`].

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ErrorCode, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::error::Category;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;

use super::lines::{Line, LineReader, MAX_LINE_BYTES, READ_BUFFER_BYTES};
use super::salvage::{Salvaged, first_bad_byte, salvage, salvage_bytes};

/// How many parsed messages may wait for rmcp: one, so that at most one line beyond the one
/// being read is held in memory (rmcp takes each message at once and runs it on a task).
const READ_AHEAD: usize = 1;

/// A byte order mark, which RFC 8259 lets a parser ignore (and rmcp's transport does).
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The output, shared by rmcp's sends and the reader's own replies; one line at a time.
type Output<W> = Arc<Mutex<W>>;

/// An rmcp server transport over a byte reader and writer; see the module documentation.
pub struct LineTransport<W> {
    incoming: mpsc::Receiver<ClientJsonRpcMessage>,
    output: Output<W>,
    reader: JoinHandle<()>,
}

impl<W> LineTransport<W>
where
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// Starts reading `read` on a task of its own (so must be called inside a Tokio runtime).
    pub fn new<R>(read: R, write: W) -> Self
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        let output = Arc::new(Mutex::new(write));
        let (sender, incoming) = mpsc::channel(READ_AHEAD);
        let lines = LineReader::new(
            BufReader::with_capacity(READ_BUFFER_BYTES, read),
            MAX_LINE_BYTES,
        );
        let reader = tokio::spawn(read_lines(lines, sender, output.clone()));
        Self {
            incoming,
            output,
            reader,
        }
    }
}

impl<W> Drop for LineTransport<W> {
    fn drop(&mut self) {
        // The reader may be waiting on input that never comes; the session is over.
        self.reader.abort();
    }
}

impl<W> Transport<RoleServer> for LineTransport<W>
where
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let output = self.output.clone();
        async move {
            let text = serde_json::to_string(&item).map_err(std::io::Error::other)?;
            write_line(&output, &text).await
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ClientJsonRpcMessage>> + Send {
        // `recv` is cancel-safe: rmcp polls this inside a `select!`.
        self.incoming.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.reader.abort();
        self.output.lock().await.shutdown().await
    }
}

/// Writes one redacted line and flushes it, holding the output for the whole line.
async fn write_line<W: AsyncWrite + Unpin>(output: &Mutex<W>, text: &str) -> std::io::Result<()> {
    let mut line = td_base::secrets::redact_json(text).into_owned();
    line.push('\n');
    let mut out = output.lock().await;
    out.write_all(line.as_bytes()).await?;
    out.flush().await
}

/// The reader task: frames lines until the input ends, passing messages to rmcp and
/// answering the rest. Ending (input closed, rmcp gone, output broken) drops the sender, and
/// rmcp then sees the end of the input.
async fn read_lines<R, W>(
    mut lines: LineReader<R>,
    sender: mpsc::Sender<ClientJsonRpcMessage>,
    output: Output<W>,
) where
    R: tokio::io::AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(e) => {
                tracing::error!("MCP input failed: {e}");
                return;
            }
        };
        match classify(line) {
            Verdict::Skip => {}
            Verdict::Deliver(message) => {
                if sender.send(*message).await.is_err() {
                    return;
                }
            }
            Verdict::Answer(reply) => {
                tracing::warn!("answered a message rmcp could not be given: {reply}");
                if let Err(e) = write_line(&output, &reply.to_string()).await {
                    tracing::error!("MCP output failed: {e}");
                    return;
                }
            }
            // stderr is redacted by `main`'s log writer.
            Verdict::Drop(why) => tracing::warn!("{why}"),
        }
    }
}

/// What the reader does with one line.
#[derive(Debug)]
enum Verdict {
    /// A blank line: nothing.
    Skip,
    /// A message for rmcp.
    Deliver(Box<ClientJsonRpcMessage>),
    /// A JSON-RPC error response, written by the transport.
    Answer(Value),
    /// Nobody waits for an answer: say why on stderr and go on.
    Drop(String),
}

fn classify(line: Line) -> Verdict {
    let bytes = match line {
        Line::TooLong { head, len } => {
            return answer_or_drop(
                salvage_bytes(&head),
                ErrorCode::INVALID_REQUEST,
                format!(
                    "Invalid request: the message is {len} bytes, over the limit of \
                     {MAX_LINE_BYTES} bytes ({} MiB) per line; it was dropped unread. Send \
                     smaller requests.",
                    MAX_LINE_BYTES >> 20
                ),
            );
        }
        Line::Complete(bytes) => bytes,
    };
    let bytes = bytes.strip_prefix(UTF8_BOM).unwrap_or(&bytes);
    if bytes.trim_ascii().is_empty() {
        return Verdict::Skip;
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(_) => {
            let place = first_bad_byte(bytes)
                .map(|(at, byte)| format!(" (first bad byte 0x{byte:02x} at byte offset {at})"))
                .unwrap_or_default();
            return answer_or_drop(
                salvage_bytes(bytes),
                ErrorCode::PARSE_ERROR,
                format!(
                    "Parse error: the message is not valid UTF-8{place}. JSON text must be \
                     UTF-8: write other characters as \\u escapes."
                ),
            );
        }
    };
    let error = match serde_json::from_str::<ClientJsonRpcMessage>(text) {
        Ok(message) => return Verdict::Deliver(Box::new(message)),
        Err(e) => e,
    };
    let found = salvage(text);
    match error.classify() {
        Category::Syntax | Category::Eof => answer_or_drop(
            found,
            ErrorCode::PARSE_ERROR,
            format!("Parse error: {error}"),
        ),
        Category::Data | Category::Io => {
            // Everything a request needs is there and readable, so what does not fit is
            // the method's parameters.
            let request_like = found.complete
                && found.jsonrpc.as_ref().and_then(Value::as_str) == Some("2.0")
                && found.method.as_ref().is_some_and(Value::is_string)
                && found
                    .id
                    .as_ref()
                    .is_some_and(|id| id.is_string() || id.is_i64());
            if request_like {
                answer_or_drop(
                    found,
                    ErrorCode::INVALID_PARAMS,
                    format!("Invalid params: {error}"),
                )
            } else {
                answer_or_drop(
                    found,
                    ErrorCode::INVALID_REQUEST,
                    format!("Invalid request: {error}"),
                )
            }
        }
    }
}

/// The error response for a message that cannot be served, or why there is none.
fn answer_or_drop(found: Salvaged, code: ErrorCode, message: String) -> Verdict {
    if found.is_notification() {
        let method = found.method.unwrap_or(Value::Null);
        return Verdict::Drop(format!(
            "dropped a notification (method {method}) that cannot be served: {message}"
        ));
    }
    if found.complete && found.response && found.method.is_none() {
        return Verdict::Drop(format!(
            "dropped a response (id {}) that cannot be read: {message}",
            found.id.unwrap_or(Value::Null)
        ));
    }
    // JSON-RPC ids are strings or numbers; anything else cannot be matched by the client,
    // and an id that cannot be read is answered as null.
    let id = match found.id {
        Some(id @ (Value::String(_) | Value::Number(_))) => id,
        _ => Value::Null,
    };
    Verdict::Answer(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code.0, "message": message},
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    use super::*;
    use crate::fronts::lines::hostile_line;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn any_line_is_delivered_answered_or_dropped_without_panic(line in hostile_line()) {
            if let Verdict::Answer(reply) = classify(Line::Complete(line)) {
                let id = &reply["id"];
                prop_assert!(id.is_string() || id.is_number() || id.is_null(), "{}", reply);
                prop_assert!(reply["error"]["code"].is_i64(), "{}", reply);
            }
        }
    }

    fn complete(text: &[u8]) -> Verdict {
        classify(Line::Complete(text.to_vec()))
    }

    /// The error response in `verdict`: (id, code, message).
    fn answer(verdict: Verdict) -> (Value, i64, String) {
        let Verdict::Answer(reply) = verdict else {
            panic!("expected an answer, got {verdict:?}");
        };
        assert_eq!(reply["jsonrpc"], "2.0");
        let message = reply["error"]["message"].as_str().unwrap().to_string();
        (
            reply["id"].clone(),
            reply["error"]["code"].as_i64().unwrap(),
            message,
        )
    }

    #[test]
    fn messages_rmcp_can_read_are_delivered() {
        for text in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#[..],
            b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}",
            br#"{"jsonrpc":"2.0","id":"x","method":"no/such/method","params":{}}"#,
        ] {
            let verdict = complete(text);
            assert!(matches!(verdict, Verdict::Deliver(_)), "{verdict:?}");
        }
        assert!(matches!(complete(b"  \t"), Verdict::Skip));
    }

    #[test]
    fn bad_utf8_is_a_parse_error_with_the_id_when_it_can_be_read() {
        let (id, code, message) = answer(complete(
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"read_file\",\"arguments\":{\"path\":\"a\xff\"}}}",
        ));
        assert_eq!((id, code), (json!(7), -32700));
        assert!(message.contains("not valid UTF-8"), "{message}");
        assert!(message.contains("0xff at byte offset 97"), "{message}");
        let (id, code, _) = answer(complete(b"\xff\xfe{\"id\": 3"));
        assert_eq!((id, code), (Value::Null, -32700));
    }

    #[test]
    fn too_deep_is_a_parse_error_with_the_id() {
        let depth = 10_000;
        let text = format!(
            r#"{{"jsonrpc":"2.0","id":"deep","method":"tools/call","params":{{"name":"x","arguments":{{"a":{}{}}}}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let (id, code, message) = answer(complete(text.as_bytes()));
        assert_eq!((id, code), (json!("deep"), -32700));
        assert!(message.contains("recursion limit exceeded"), "{message}");
    }

    #[test]
    fn too_long_is_an_invalid_request_with_the_id_from_the_head() {
        let (id, code, message) = answer(classify(Line::TooLong {
            head: br#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"arguments":{"content":"aaaa"#.to_vec(),
            len: 20_000_000,
        }));
        assert_eq!((id, code), (json!(12), -32600));
        assert!(message.contains("20000000 bytes"), "{message}");
        assert!(message.contains("16 MiB"), "{message}");
        // The head of a long notification may hide a later id: it is answered, with null.
        let (id, _, _) = answer(classify(Line::TooLong {
            head: br#"{"jsonrpc":"2.0","method":"notifications/x","params":"aaaa"#.to_vec(),
            len: 20_000_000,
        }));
        assert_eq!(id, Value::Null);
    }

    #[test]
    fn wrong_shapes_are_invalid_requests_or_params() {
        let (id, code, _) = answer(complete(
            br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":5}"#,
        ));
        assert_eq!((id, code), (json!(5), -32602));
        let (id, code, _) = answer(complete(br#"{"jsonrpc":"1.0","id":"v","method":"ping"}"#));
        assert_eq!((id, code), (json!("v"), -32600));
        let (id, code, _) = answer(complete(b"[1, 2]"));
        assert_eq!((id, code), (Value::Null, -32600));
        // An id that is not a string or number cannot be matched: null.
        let (id, _, _) = answer(complete(
            br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
        ));
        assert_eq!(id, Value::Null);
        let (id, code, _) = answer(complete(b"{\"id\": 4, nonsense"));
        assert_eq!((id, code), (json!(4), -32700));
    }

    #[test]
    fn unreadable_notifications_and_responses_are_dropped() {
        for text in [
            &br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":"bad"}"#[..],
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\",\"params\":\"\xff\"}",
            br#"{"jsonrpc":"2.0","id":3,"result":5,"error":5}"#,
        ] {
            let verdict = complete(text);
            assert!(matches!(verdict, Verdict::Drop(_)), "{verdict:?}");
        }
    }

    /// A raw client over an in-memory pipe: what an rmcp session with this transport
    /// answers, line by line.
    #[tokio::test]
    async fn a_session_answers_bad_lines_and_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Arc::new(td_toolkit::context::ToolContext::new(dir.path(), "t").unwrap());
        let tools = Arc::new(td_tools::all_tools());
        let (server_io, client_io) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(server_io);
        let server = super::super::mcp::McpServer::new(ctx, tools, None);
        let session = tokio::spawn(super::super::mcp::serve(
            server,
            LineTransport::new(read, write),
        ));
        let (client_read, mut client_write) = tokio::io::split(client_io);
        let mut replies = tokio::io::BufReader::new(client_read).lines();
        let mut next = async || -> Value {
            let line = tokio::time::timeout(Duration::from_secs(10), replies.next_line())
                .await
                .expect("no reply within 10 s")
                .unwrap()
                .unwrap();
            serde_json::from_str(&line).unwrap()
        };

        // Before the handshake too.
        client_write
            .write_all(b"{\"id\": \"early\", \xff}\n")
            .await
            .unwrap();
        let r = next().await;
        assert_eq!(r["id"], "early");
        assert_eq!(r["error"]["code"], -32700);

        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}});
        client_write
            .write_all(format!("{init}\n").as_bytes())
            .await
            .unwrap();
        assert_eq!(next().await["id"], 1);
        let lines = concat!(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":"bad"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":5}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
            "\n",
        );
        client_write.write_all(lines.as_bytes()).await.unwrap();
        let mut got = [next().await, next().await];
        got.sort_by_key(|r| r["id"].as_i64());
        assert_eq!(got[0]["id"], 2);
        assert_eq!(got[0]["error"]["code"], -32602);
        assert_eq!(got[1]["id"], 3);
        assert!(got[1]["result"]["tools"].is_array());

        // The end of the input ends the session.
        client_write.shutdown().await.unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(10), session).await;
        assert_eq!(ended.unwrap().unwrap(), Ok(()));
    }
}
