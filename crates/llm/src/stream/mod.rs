//! Streamed model replies (server-sent events) for both network APIs: the `stream:` setting,
//! the detection of servers that do not stream, and the loop that feeds a stream's events to
//! an assembler. What each API's events mean is in [`anthropic`] and [`openai`]; the HTTP
//! side (timeouts, retries before the first byte) is in [`crate::http`].
//!
//! A streamed call ends in the same [`LlmResponse`] as a non-streamed one: each assembler
//! rebuilds the reply the API would have sent whole and hands it to that API's own reply
//! parser, so tool inputs, stop reasons, usage and every leniency are the same either way.
//!
//! `stream: auto` (the default of `taskdaemon.yml`) asks for a stream and falls back to
//! plain calls for the rest of the client's life when the server shows it does not stream
//! fully: it answers with a JSON reply (that reply is used), it refuses the request with a
//! 4xx whose message names the `stream` field, or it closes the event stream before its
//! first event (llama-cpp-python 0.3 with `chatml-function-calling` does so to every
//! streamed request with tools) — in these two cases the request is sent again without
//! streaming — or its stream ends without token usage (llama-cpp-python 0.3 sends none, even
//! when asked with `stream_options.include_usage`; whole replies carry it). `on` always asks
//! for a stream and reports a refusal as the error it is; `off` never asks.
//!
//! A streamed reply without usage (or with zero input and output tokens) would count as
//! free, which budgets and cost accounting cannot accept: its usage is estimated instead
//! and marked [`Usage::estimated`]: input tokens are the request body's bytes / 4 (a
//! generous count: the JSON around the prompt is counted too), output tokens the
//! characters of text and tool input received / 4, both rounded up.
//!
//! The idle timeout counts time without output: see [`crate::http::SseEvents`].

pub mod anthropic;
pub mod openai;

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::endpoint::WireFormat;
use crate::http::{HttpTransport, SseEvent, SseEvents, StreamReply};
use crate::{CallObserver, LlmError, LlmResponse, Usage};

/// Default of `stream-idle-timeout-ms`: the longest wait for more output of a stream.
/// Generous, because some servers say nothing while a model reasons.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether calls ask for a streamed reply (`llm.stream`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamMode {
    /// Stream, and stop asking once the server shows it does not stream.
    #[default]
    Auto,
    /// Always stream.
    On,
    /// Never stream.
    Off,
}

/// How a client streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSettings {
    /// Whether to stream.
    pub mode: StreamMode,
    /// The longest wait for more output of a stream (keep-alives do not count).
    pub idle_timeout: Duration,
}

impl StreamSettings {
    /// No streaming (what a client made with `new` does until told otherwise).
    pub fn off() -> Self {
        StreamSettings {
            mode: StreamMode::Off,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

impl Default for StreamSettings {
    /// `auto` with the default idle timeout.
    fn default() -> Self {
        StreamSettings {
            mode: StreamMode::Auto,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// What feeding one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// More events are expected.
    More,
    /// The stream's last event: the reply is complete.
    Done,
}

/// Rebuilds one API's reply from its stream events.
pub trait Assembler: Default + Send {
    /// Takes one event.
    fn feed(&mut self, event: &SseEvent) -> Result<Step, LlmError>;
    /// Characters of text and tool input received so far.
    fn chars(&self) -> u64;
    /// Whether the stream reported token usage so far.
    fn has_usage(&self) -> bool;
    /// The reply, once the stream is over: `done` says whether its last event came (false:
    /// the server closed the stream before).
    fn finish(self, done: bool) -> Result<LlmResponse, LlmError>;
}

/// A client's streaming state: its settings and whether its server was found not to stream.
#[derive(Debug)]
pub(crate) struct Streaming {
    settings: StreamSettings,
    unsupported: AtomicBool,
}

impl Streaming {
    pub(crate) fn new(settings: StreamSettings) -> Self {
        Streaming {
            settings,
            unsupported: AtomicBool::new(false),
        }
    }

    /// Whether the next call asks for a stream.
    pub(crate) fn wanted(&self) -> bool {
        match self.settings.mode {
            StreamMode::Off => false,
            StreamMode::On => true,
            StreamMode::Auto => !self.unsupported.load(Ordering::Relaxed),
        }
    }

    fn give_up_streaming(&self, transport: &HttpTransport, why: &str) {
        if !self.unsupported.swap(true, Ordering::Relaxed) {
            tracing::info!(url = %transport.url(), "{why}; later calls are not streamed");
        }
    }

    /// Makes one call of the API `F`, streamed if wanted: `body` is the non-streamed request.
    pub(crate) async fn call<F: WireFormat>(
        &self,
        transport: &HttpTransport,
        body: Value,
        observer: &dyn CallObserver,
    ) -> Result<LlmResponse, LlmError> {
        if !self.wanted() {
            return F::parse_response(&transport.post_json(&body, observer).await?);
        }
        let mut streamed = body.clone();
        if let Some(map) = streamed.as_object_mut() {
            F::add_stream_fields(map);
        }
        let auto = self.settings.mode == StreamMode::Auto;
        match transport
            .post_stream(&streamed, self.settings.idle_timeout, observer)
            .await
        {
            Ok(StreamReply::Events(events)) => {
                let prompt_bytes = body.to_string().len();
                let Assembled {
                    mut reply,
                    usage_seen,
                    chars,
                } = assemble(events, F::Assembler::default(), observer).await?;
                if !usage_seen || reply.usage == Usage::default() {
                    if auto {
                        self.give_up_streaming(
                            transport,
                            "the server's stream carried no token usage (whole replies do)",
                        );
                    }
                    reply.usage = estimated_usage(prompt_bytes, chars);
                }
                Ok(reply)
            }
            Ok(StreamReply::Json(reply)) => {
                if auto {
                    self.give_up_streaming(
                        transport,
                        "the server answered a streaming request with JSON",
                    );
                }
                F::parse_response(&reply)
            }
            Ok(StreamReply::Empty) if auto => {
                self.give_up_streaming(
                    transport,
                    "the server closed a streaming reply before its first event",
                );
                // A server that breaks off a stream may close the connection it used a moment
                // later, after the pool has handed that connection to this request (seen with
                // llama-cpp-python: "connection reset by peer" with `max-retries: 0`). The
                // failed connection is not pooled again, so one more try goes out on a new one.
                let reply = match transport.post_json(&body, observer).await {
                    Err(LlmError::Transport(_)) => transport.post_json(&body, observer).await?,
                    other => other?,
                };
                F::parse_response(&reply)
            }
            Ok(StreamReply::Empty) => Err(LlmError::Transport(format!(
                "the event stream from {} ended before its first event: the server accepted \
                 the request but did not stream it (llama-cpp-python does so for requests with \
                 tools); set `stream: auto` or `stream: off` under `llm:`",
                transport.url()
            ))),
            Err(e) if rejects_streaming(&e) => {
                if !auto {
                    return Err(with_hint(e));
                }
                self.give_up_streaming(transport, "the server refused a streaming request");
                F::parse_response(&transport.post_json(&body, observer).await?)
            }
            Err(e) => Err(e),
        }
    }
}

/// A reply rebuilt from a stream.
struct Assembled {
    reply: LlmResponse,
    /// Whether the stream reported token usage.
    usage_seen: bool,
    /// Characters of text and tool input received.
    chars: u64,
}

/// Feeds a stream's events to `assembler` until its last event, telling `observer` (and the
/// idle timeout) of each growth of the reply.
async fn assemble<A: Assembler>(
    mut events: SseEvents,
    mut assembler: A,
    observer: &dyn CallObserver,
) -> Result<Assembled, LlmError> {
    let mut reported = 0;
    loop {
        let event = events.next().await?;
        let done = match &event {
            None => false,
            Some(event) => assembler.feed(event)? == Step::Done,
        };
        let chars = assembler.chars();
        if chars > reported {
            reported = chars;
            events.output_seen();
            observer.output_growing(chars);
        }
        if done || event.is_none() {
            let usage_seen = assembler.has_usage();
            return Ok(Assembled {
                reply: assembler.finish(done)?,
                usage_seen,
                chars,
            });
        }
    }
}

/// The usage of a reply whose server reported none, estimated as the module documentation
/// says and marked as such.
fn estimated_usage(prompt_bytes: usize, output_chars: u64) -> Usage {
    Usage {
        input_tokens: u64::try_from(prompt_bytes).unwrap_or(u64::MAX).div_ceil(4),
        output_tokens: output_chars.div_ceil(4),
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        estimated: true,
    }
}

/// Whether an error is a server refusing the `stream` field (or `stream_options`): a 4xx
/// caused by the request (not a key, rate or missing-endpoint problem) whose message names it.
pub(crate) fn rejects_streaming(error: &LlmError) -> bool {
    static NAMES_STREAM: LazyLock<Option<regex::Regex>> =
        LazyLock::new(|| regex::Regex::new(r"(?i)\bstream").ok());
    match error {
        LlmError::Api { status, message } => {
            (400..500).contains(status)
                && !matches!(status, 401 | 403 | 404 | 408 | 429)
                && NAMES_STREAM.as_ref().is_some_and(|r| r.is_match(message))
        }
        _ => false,
    }
}

fn with_hint(error: LlmError) -> LlmError {
    match error {
        LlmError::Api { status, message } => LlmError::Api {
            status,
            message: format!(
                "{message} (the server refused a streaming request: set `stream: auto` or `stream: off` under `llm:`)"
            ),
        },
        other => other,
    }
}

/// Parses an event's data as JSON, or says which API's stream sent something else.
pub(crate) fn event_json(api: &str, event: &SseEvent) -> Result<Value, LlmError> {
    serde_json::from_str(&event.data).map_err(|e| {
        LlmError::BadReply(format!(
            "{api} stream event `{}` is not JSON ({e}): {}",
            event.event,
            crate::http::quote_json(&Value::String(event.data.clone()))
        ))
    })
}

/// Counts characters for progress, without overflow.
pub(crate) fn add_chars(total: &mut u64, text: &str) {
    *total = total.saturating_add(text.chars().count() as u64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    use serde_json::json;

    /// Feeds `wire` to the SSE parser in the two pieces cut at `at` and the events to `a`.
    async fn assemble(wire: &[u8], at: usize, mut a: impl Assembler) -> LlmResponse {
        let pieces = vec![
            Ok::<_, std::convert::Infallible>(wire[..at].to_vec()),
            Ok(wire[at..].to_vec()),
        ];
        let mut events = futures::stream::iter(pieces).eventsource();
        while let Some(event) = events.next().await {
            let event = event.unwrap();
            let event = SseEvent {
                event: event.event,
                data: event.data,
            };
            if a.feed(&event).unwrap() == Step::Done {
                return a.finish(true).unwrap();
            }
        }
        a.finish(false).unwrap()
    }

    /// Both APIs' streams cut at every byte (inside multi-byte characters, escapes, line
    /// ends and field names) give the reply of the uncut stream.
    #[tokio::test]
    async fn streams_cut_at_every_byte_give_the_same_reply() {
        let args = r#"{"text":"é — 日本 \"q\" \u00e9 😀"}"#;
        let data = |v: Value| format!("data: {v}\r\n\r\n");
        let mut openai = String::from(": keep-alive comment\n\n");
        openai += &data(json!({"choices": [{"index": 0, "delta": {"content": "ça"}}]}));
        openai += &data(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "w", "arguments": &args[..9]}}]}}]}),
        );
        openai += &data(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": &args[9..]}}]}, "finish_reason": "tool_calls"}]}),
        );
        openai += "data: [DONE]\n\n";
        let mut anthropic = String::new();
        for (name, v) in [
            (
                "message_start",
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "w", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": &args[..9]}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": &args[9..]}}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ] {
            anthropic += &format!("event: {name}\ndata: {v}\n\n");
        }
        let want_input: Value = serde_json::from_str(args).unwrap();
        let whole = assemble(openai.as_bytes(), 0, openai::OpenAiAssembler::default()).await;
        assert_eq!(whole.text.as_deref(), Some("ça"));
        assert_eq!(*whole.tool_calls[0].input, want_input);
        for at in 1..openai.len() {
            let r = assemble(openai.as_bytes(), at, openai::OpenAiAssembler::default()).await;
            assert_eq!(r, whole, "openai cut at byte {at}");
        }
        let whole = assemble(
            anthropic.as_bytes(),
            0,
            anthropic::AnthropicAssembler::default(),
        )
        .await;
        assert_eq!(*whole.tool_calls[0].input, want_input);
        for at in 1..anthropic.len() {
            let r = assemble(
                anthropic.as_bytes(),
                at,
                anthropic::AnthropicAssembler::default(),
            )
            .await;
            assert_eq!(r, whole, "anthropic cut at byte {at}");
        }
    }

    #[test]
    fn refusals_of_the_stream_field_are_recognised() {
        let api = |status, message: &str| LlmError::Api {
            status,
            message: message.into(),
        };
        assert!(rejects_streaming(&api(
            400,
            "Unrecognized request argument supplied: stream"
        )));
        assert!(rejects_streaming(&api(
            422,
            "extra fields not permitted: `stream_options`"
        )));
        assert!(rejects_streaming(&api(400, "'Stream' is not supported")));
        assert!(!rejects_streaming(&api(400, "max_tokens: too big")));
        assert!(!rejects_streaming(&api(400, "upstream model failed")));
        assert!(!rejects_streaming(&api(401, "streaming needs a paid key")));
        assert!(!rejects_streaming(&api(429, "stream limit reached")));
        assert!(!rejects_streaming(&api(500, "stream broke")));
        assert!(!rejects_streaming(&LlmError::Transport("stream".into())));
    }

    #[test]
    fn the_default_is_auto_and_new_clients_do_not_stream() {
        assert_eq!(StreamSettings::default().mode, StreamMode::Auto);
        assert_eq!(StreamSettings::off().mode, StreamMode::Off);
        let s = Streaming::new(StreamSettings::default());
        assert!(s.wanted());
        s.unsupported.store(true, Ordering::Relaxed);
        assert!(!s.wanted());
        let on = Streaming::new(StreamSettings {
            mode: StreamMode::On,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        });
        on.unsupported.store(true, Ordering::Relaxed);
        assert!(on.wanted());
        assert!(!Streaming::new(StreamSettings::off()).wanted());
    }
}
