//! The streaming side of [`HttpTransport`]: posts a request that asks for server-sent events
//! (`"stream": true` in the body, added by the caller) and hands the events back one by one.
//!
//! Timeouts: the attempt's `timeout` bounds the time until the first bytes of the reply
//! (connecting, the status line and headers, and the first chunk of the stream: a server
//! evaluating a long prompt says nothing until it has); after that only the idle timeout
//! applies, and it counts time without *output*: it is reset only when the caller says the
//! reply grew ([`SseEvents::output_seen`]), not by keep-alive comments or `ping` events. So a
//! long reply that keeps coming is never cut, while a server that stalls mid-reply, or that
//! sends nothing but keep-alives forever, is given up on after the idle time.
//!
//! Retries: failures before the first byte of the stream (refused or broken connections,
//! an error status, a timeout) go through the transport's one retry loop, with the policy
//! of [`HttpTransport::post_json`], and are reported to the call's [`CallObserver`]. Once
//! the stream has begun, a failure is final: the reply was partly generated (and billed),
//! and the caller decides.
//!
//! A server that answers a streaming request with a plain JSON reply (it does not stream)
//! is served all the same: its reply is handed back whole ([`StreamReply::Json`]). The bytes
//! read from a stream are capped like a reply body, so memory stays bounded whatever the
//! server sends; SSE parsing is `eventsource-stream`'s (UTF-8 split across chunks, CR/LF
//! line ends, comments, multi-line data).

use std::fmt;
use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::stream::{self, Stream, StreamExt};
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use reqwest::{Response, Url};
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::{Attempt, HttpTransport, encode, limiter_closed};
use crate::{CallObserver, LlmError};

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; `message` when the server gave none (OpenAI-style streams).
    pub event: String,
    /// The `data:` lines, joined with newlines.
    pub data: String,
}

/// What a server answered to a request that asked for a stream.
pub enum StreamReply {
    /// A `text/event-stream` reply: its events, read one by one.
    Events(SseEvents),
    /// A 2xx reply of another type: the server does not stream; its whole reply as JSON.
    Json(Value),
    /// A 2xx event stream that ended before its first byte: the server accepted the
    /// request but could not stream it.
    Empty,
}

/// Why reading a stream's bytes stopped.
#[derive(Debug)]
enum ReadError {
    /// The transfer broke.
    Http(reqwest::Error),
    /// More bytes than the cap.
    TooLarge,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Http(e) => f.write_str(&td_http::error_chain(e)),
            ReadError::TooLarge => f.write_str("too large"),
        }
    }
}

type Events = Pin<
    Box<dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<ReadError>>> + Send>,
>;

/// The events of a streamed reply. Holds the call's in-flight permit until dropped, so a
/// stream being read counts against the run's limit on model calls in flight.
pub struct SseEvents {
    events: Events,
    url: Url,
    idle: Duration,
    /// When the stream is given up on unless output comes first.
    deadline: Instant,
    cap: usize,
    _permit: OwnedSemaphorePermit,
}

impl fmt::Debug for SseEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseEvents")
            .field("url", &self.url.as_str())
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

/// The byte reader under the SSE parser. It hands on whole lines only: the parser
/// re-reads its whole buffer on every chunk until a line ends, so a long line fed in many
/// chunks cost quadratic time (a 3 MiB line without a newline took a minute).
struct Reader {
    response: Response,
    first: Option<Vec<u8>>,
    /// The bytes after the last newline handed on.
    pending: Vec<u8>,
    read: usize,
    cap: usize,
    done: bool,
}

impl Reader {
    /// The next run of whole lines (or the rest, at the end); `None` when nothing is left.
    async fn next(&mut self) -> Option<Result<Vec<u8>, ReadError>> {
        while !self.done {
            let chunk = match self.first.take() {
                Some(first) => first,
                None => match self.response.chunk().await {
                    Err(e) => return self.fail(ReadError::Http(e)),
                    Ok(Some(chunk)) => Vec::from(chunk),
                    Ok(None) => {
                        self.done = true;
                        break;
                    }
                },
            };
            self.read = self.read.saturating_add(chunk.len());
            if self.read > self.cap {
                return self.fail(ReadError::TooLarge);
            }
            let Some(end) = chunk.iter().rposition(|&b| b == b'\n') else {
                self.pending.extend_from_slice(&chunk);
                continue;
            };
            let mut lines = std::mem::take(&mut self.pending);
            lines.extend_from_slice(&chunk[..=end]);
            self.pending = chunk[end + 1..].to_vec();
            return Some(Ok(lines));
        }
        (!self.pending.is_empty()).then(|| Ok(std::mem::take(&mut self.pending)))
    }

    fn fail(&mut self, error: ReadError) -> Option<Result<Vec<u8>, ReadError>> {
        self.done = true;
        self.pending.clear();
        Some(Err(error))
    }
}

impl SseEvents {
    fn new(
        response: Response,
        first: Vec<u8>,
        idle: Duration,
        cap: usize,
        url: Url,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        let reader = Reader {
            response,
            first: Some(first),
            pending: Vec::new(),
            read: 0,
            cap,
            done: false,
        };
        let bytes = stream::unfold(reader, |mut r| async move {
            let next = r.next().await?;
            Some((next, r))
        });
        SseEvents {
            events: Box::pin(bytes.eventsource()),
            url,
            idle,
            deadline: Instant::now() + idle,
            cap,
            _permit: permit,
        }
    }

    /// Says that the reply grew (text or tool input came): the idle timeout starts again.
    /// Events that carry no output (keep-alive `ping`s, role-only deltas) do not call it,
    /// and SSE comments never reach the caller, so neither resets the timeout.
    pub fn output_seen(&mut self) {
        self.deadline = Instant::now() + self.idle;
    }

    /// The next event; `None` once the server closed the stream. An error once the idle
    /// timeout has passed since the stream began or since [`SseEvents::output_seen`].
    pub async fn next(&mut self) -> Result<Option<SseEvent>, LlmError> {
        let url = &self.url;
        let Ok(next) = tokio::time::timeout_at(self.deadline, self.events.next()).await else {
            return Err(LlmError::Transport(format!(
                "the event stream from {url} sent no output for {} ms \
                 (llm.stream-idle-timeout-ms; keep-alives do not count): the server stalled \
                 in the middle of its reply",
                self.idle.as_millis()
            )));
        };
        match next {
            None => Ok(None),
            Some(Ok(e)) => Ok(Some(SseEvent {
                event: e.event,
                data: e.data,
            })),
            Some(Err(EventStreamError::Transport(ReadError::TooLarge))) => {
                Err(LlmError::BadReply(format!(
                    "the event stream from {url} is larger than {} bytes",
                    self.cap
                )))
            }
            Some(Err(EventStreamError::Transport(e @ ReadError::Http(_)))) => Err(
                LlmError::Transport(format!("the event stream from {url} broke: {e}")),
            ),
            Some(Err(EventStreamError::Utf8(e))) => Err(LlmError::BadReply(format!(
                "the event stream from {url} is not UTF-8 text ({e})"
            ))),
            // The parser's error holds the rest of the input; it is not quoted.
            Some(Err(EventStreamError::Parser(_))) => Err(LlmError::BadReply(format!(
                "the reply from {url} is not a valid event stream"
            ))),
        }
    }
}

/// Whether a reply's content type is `text/event-stream`.
fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
}

impl HttpTransport {
    /// Posts `body` (which asks for a stream) and returns the events of a 2xx event-stream
    /// reply, or the JSON of a 2xx reply of another type, retrying failures before the first
    /// byte as the module documentation says. `idle` bounds the time without output.
    pub async fn post_stream(
        &self,
        body: &Value,
        idle: Duration,
        observer: &dyn CallObserver,
    ) -> Result<StreamReply, LlmError> {
        let bytes = encode(body)?;
        self.with_retries(observer, || self.stream_attempt(bytes.clone(), idle))
            .await
    }

    async fn stream_attempt(&self, body: Vec<u8>, idle: Duration) -> Result<StreamReply, Attempt> {
        let permit = self
            .in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| limiter_closed())?;
        let deadline = Instant::now() + self.settings.timeout;
        let late = || {
            Attempt::retry_without_reply(LlmError::Transport(format!(
                "no reply from {} within {} ms",
                self.url,
                self.settings.timeout.as_millis()
            )))
        };
        // No reqwest timeout: it would bound the whole stream. The deadline bounds the wait
        // for the first bytes; the idle timeout the rest.
        let sent = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(body)
            .send();
        let mut response = match tokio::time::timeout_at(deadline, sent).await {
            Err(_) => return Err(late()),
            Ok(sent) => sent.map_err(|e| self.transport_failure(&e))?,
        };
        if !response.status().is_success() || !is_event_stream(response.headers()) {
            return match tokio::time::timeout_at(deadline, self.whole_reply(response)).await {
                Err(_) => Err(late()),
                Ok(reply) => reply.map(StreamReply::Json),
            };
        }
        let first = match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => return Err(late()),
            Ok(Err(e)) => return Err(self.transport_failure(&e)),
            // Not retried: llama-cpp-python (0.3, chatml-function-calling) answers every
            // streamed request with tools so ("Automatic streaming tool choice is not
            // supported", on its side), however often it is sent.
            Ok(Ok(None)) => return Ok(StreamReply::Empty),
            Ok(Ok(Some(first))) => Vec::from(first),
        };
        Ok(StreamReply::Events(SseEvents::new(
            response,
            first,
            idle,
            self.settings.max_body_bytes,
            self.url.clone(),
            permit,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn only_text_event_stream_is_a_stream() {
        let mut h = HeaderMap::new();
        assert!(!is_event_stream(&h));
        for (value, want) in [
            ("text/event-stream", true),
            ("Text/Event-Stream; charset=utf-8", true),
            ("application/json", false),
            ("text/event-streamx", false),
        ] {
            h.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_event_stream(&h), want, "{value}");
        }
    }
}
