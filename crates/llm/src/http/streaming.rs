//! The streaming side of [`HttpTransport`]: posts a request that asks for server-sent events
//! (`"stream": true` in the body, added by the caller) and hands the events back one by one.
//!
//! Timeouts: the attempt's `timeout` bounds the time until the first bytes of the reply
//! (connecting, the status line and headers, and the first chunk of the stream: a server
//! evaluating a long prompt says nothing until it has); after that only an idle timeout
//! applies, between chunks, so a long reply that keeps coming is never cut, and a server
//! that stalls mid-reply is given up on after the idle time instead of the whole-request one.
//!
//! Retries: failures before the first byte of the stream (refused or broken connections, a
//! 429 or 5xx, a timeout) are retried exactly as [`HttpTransport::post_json`] retries them,
//! and reported to the call's [`CallObserver`]. Once the stream has begun, a failure is
//! final: the reply was partly generated (and billed), and the caller decides.
//!
//! A server that answers a streaming request with a plain JSON reply (it does not stream)
//! is served all the same: its reply is handed back whole ([`StreamReply::Json`]). The bytes
//! read from a stream are capped like a reply body, so memory stays bounded whatever the
//! server sends; SSE parsing is `eventsource-stream`'s (UTF-8 split across chunks, CR/LF
//! line ends, comments, multi-line data).

use std::fmt;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use eventsource_stream::{EventStreamError, Eventsource};
use futures::stream::{self, Stream, StreamExt};
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use reqwest::{Response, StatusCode, Url};
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::{
    Attempt, HttpTransport, MAX_RETRY_AFTER, api_error_message, backoff_cap, full_jitter, gave_up,
    quote, random_u64, retry_after, with_note,
};
use crate::{CallObserver, LlmError, RetryNotice};

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
}

/// Why reading a stream's bytes stopped.
#[derive(Debug)]
enum ReadError {
    /// The transfer broke.
    Http(reqwest::Error),
    /// More bytes than the cap.
    TooLarge,
    /// Nothing arrived for the idle time.
    Idle,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Http(e) => f.write_str(&td_http::error_chain(e)),
            ReadError::TooLarge => f.write_str("too large"),
            ReadError::Idle => f.write_str("idle"),
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
    idle: Duration,
    done: bool,
}

impl Reader {
    /// The next run of whole lines (or the rest, at the end); `None` when nothing is left.
    async fn next(&mut self) -> Option<Result<Vec<u8>, ReadError>> {
        while !self.done {
            let chunk = match self.first.take() {
                Some(first) => first,
                None => match tokio::time::timeout(self.idle, self.response.chunk()).await {
                    Err(_) => return self.fail(ReadError::Idle),
                    Ok(Err(e)) => return self.fail(ReadError::Http(e)),
                    Ok(Ok(Some(chunk))) => Vec::from(chunk),
                    Ok(Ok(None)) => {
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
            idle,
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
            cap,
            _permit: permit,
        }
    }

    /// The next event; `None` once the server closed the stream.
    pub async fn next(&mut self) -> Result<Option<SseEvent>, LlmError> {
        let url = &self.url;
        match self.events.next().await {
            None => Ok(None),
            Some(Ok(e)) => Ok(Some(SseEvent {
                event: e.event,
                data: e.data,
            })),
            Some(Err(EventStreamError::Transport(ReadError::Idle))) => {
                Err(LlmError::Transport(format!(
                    "the event stream from {url} sent nothing for {} ms (llm.stream-idle-timeout-ms): the server stalled in the middle of its reply",
                    self.idle.as_millis()
                )))
            }
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
    /// byte as the module documentation says. `idle` bounds the silence between chunks.
    pub async fn post_stream(
        &self,
        body: &Value,
        idle: Duration,
        observer: &dyn CallObserver,
    ) -> Result<StreamReply, LlmError> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| LlmError::Transport(format!("cannot encode the request: {e}")))?;
        let attempts = self.settings.max_retries.saturating_add(1);
        let mut attempt = 1;
        loop {
            let (error, retry_after) = match self.stream_attempt(bytes.clone(), idle).await {
                Ok(reply) => return Ok(reply),
                Err(Attempt::Fatal(error)) => return Err(error),
                Err(Attempt::Retry { error, retry_after }) => (error, retry_after),
            };
            if attempt >= attempts {
                return Err(gave_up(error, attempts));
            }
            // The same waits as post_json's retries.
            let wait = match retry_after {
                Some(wait) if wait > MAX_RETRY_AFTER => {
                    return Err(with_note(
                        error,
                        &format!(
                            "the server asked to wait {} s before retrying, more than the {} s this client waits; try again later",
                            wait.as_secs(),
                            MAX_RETRY_AFTER.as_secs()
                        ),
                    ));
                }
                Some(wait) => wait,
                None => full_jitter(backoff_cap(self.settings.retry_base, attempt), random_u64()),
            };
            observer.retrying(&RetryNotice {
                attempt,
                wait,
                status: match &error {
                    LlmError::Api { status, .. } => Some(*status),
                    _ => None,
                },
                cause: error.to_string(),
            });
            tracing::warn!(
                url = %self.url,
                attempt,
                attempts,
                wait_ms = wait.as_millis() as u64,
                error = %error,
                "streamed model call failed before its first byte; retrying"
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    async fn stream_attempt(&self, body: Vec<u8>, idle: Duration) -> Result<StreamReply, Attempt> {
        let permit = self.in_flight.clone().acquire_owned().await.map_err(|_| {
            Attempt::Fatal(LlmError::Transport(
                "the run is shutting down (model call limiter closed)".to_string(),
            ))
        })?;
        let deadline = Instant::now() + self.settings.timeout;
        let late = || Attempt::Retry {
            error: LlmError::Transport(format!(
                "no reply from {} within {} ms",
                self.url,
                self.settings.timeout.as_millis()
            )),
            retry_after: None,
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
            Ok(Ok(None)) => {
                return Err(Attempt::Retry {
                    error: LlmError::Transport(format!(
                        "the event stream from {} ended before its first event",
                        self.url
                    )),
                    retry_after: None,
                });
            }
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

    /// Reads a reply that is not a stream: the JSON of a 2xx, else the API error, retryable
    /// or not as [`HttpTransport::post_json`] decides. (The same steps as its attempt.)
    async fn whole_reply(&self, mut response: Response) -> Result<Value, Attempt> {
        let status = response.status();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let cap = self.settings.max_body_bytes;
        let too_large = || {
            Attempt::Fatal(LlmError::BadReply(format!(
                "the reply from {} is larger than {cap} bytes",
                self.url
            )))
        };
        if response
            .content_length()
            .is_some_and(|len| len > cap as u64)
        {
            return Err(too_large());
        }
        let read = td_http::read_capped(&mut response, cap).await;
        if let Some(e) = &read.interrupted {
            return Err(self.transport_failure(e));
        }
        if read.truncated {
            return Err(too_large());
        }
        let body = read.bytes;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|e| {
                Attempt::Fatal(LlmError::BadReply(format!(
                    "the reply from {} is neither an event stream nor JSON ({e}): {}",
                    self.url,
                    quote(&String::from_utf8_lossy(&body))
                )))
            });
        }
        let error = LlmError::Api {
            status: status.as_u16(),
            message: api_error_message(status, &body),
        };
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            Err(Attempt::Retry { error, retry_after })
        } else {
            Err(Attempt::Fatal(error))
        }
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
