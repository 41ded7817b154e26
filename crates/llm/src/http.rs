//! The HTTP side shared by the network providers: a per-request timeout, retries with
//! exponential backoff and full jitter, the run-wide limit on model calls in flight, a cap on
//! the bytes read from a reply, and API keys (from an environment variable or a file; never
//! printed). The pooled clients (rustls; loopback endpoints bypass proxies; redirects are not
//! followed) and the capped body reader are td-http's, shared with the web tools.
//!
//! Retry policy:
//! - a 4xx says our request is wrong, and sending it again cannot change the answer: it is
//!   final, except 408 (the server gave up waiting for the request), 409 (a conflict with
//!   the server's state, which the official OpenAI and Anthropic SDKs retry too) and 429
//!   (rate limit), which are about the server's state at that moment;
//! - a 5xx (Anthropic's 529 "overloaded" included) is retried, but an answer that repeats the
//!   same status and body is taken at most [`SAME_ERROR_ATTEMPTS`] times: some servers
//!   (llama-cpp-python) answer a request they cannot process with a 500, and the identical
//!   request then gets the identical answer however often it is sent. The final error quotes
//!   the body's message and says it repeated;
//! - a refused or broken connection and a timeout are retried.
//!
//! A `retry-after` header (seconds or an HTTP date), or `retry-after-ms` (sent by
//! OpenAI-compatible servers), sets the wait; otherwise the wait is drawn uniformly from
//! `[0, base × 2^(attempt−1)]` ("full jitter": loops that failed together do not retry
//! together), capped at [`MAX_BACKOFF`]. Every retry is reported to the call's
//! [`CallObserver`] (attempt, wait, status, cause) before the wait, so that the run record
//! and the live progress show it.
//!
//! The in-flight permit is held for one attempt only (request and reply body), never while
//! waiting to retry, so a loop that backs off does not block the others.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{StatusCode, Url};
use serde_json::Value;
use td_http::{ClientError, Redirects};
use tokio::sync::Semaphore;

use super::{CallObserver, LlmError, RetryNotice};

/// Replies larger than this are refused, so one bad server cannot exhaust memory.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Upper bound of one computed backoff wait.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A server asking to wait longer than this is not waited for: the call fails at once and
/// says how long the server asked for (a run should not hang silently for an hour).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// How many times one server error (the same 5xx status and body) is taken before the call
/// gives up on it: the first answer and two retries.
pub const SAME_ERROR_ATTEMPTS: u32 = 3;
/// Error messages quoted from a server body are cut to this many bytes.
const ERROR_QUOTE_LIMIT: usize = 1000;

/// How a provider talks HTTP: timeout, retries and the body cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// Time one attempt may take, from connecting to the last byte of the reply.
    pub timeout: Duration,
    /// Retries after the first attempt (so `max_retries + 1` attempts in all).
    pub max_retries: u32,
    /// Backoff base: the first retry waits up to this long, each further one twice as long.
    pub retry_base: Duration,
    /// The largest reply body read.
    pub max_body_bytes: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            timeout: Duration::from_secs(300),
            max_retries: 4,
            retry_base: Duration::from_millis(500),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// Why an API key cannot be had or used. The messages name where the key comes from, never
/// the key. (A cause shown in the message is not also given as `source()`, so that a chain
/// printer does not say it twice.)
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key is empty once trimmed.
    #[error("the API key from {origin} is empty; put the key there")]
    Empty {
        /// Where it came from ("the environment variable X", "the file Y").
        origin: String,
    },
    /// The key holds bytes an HTTP header cannot carry.
    #[error(
        "the API key from {origin} contains characters an HTTP header cannot carry \
         (control characters or non-ASCII); check that it was copied correctly"
    )]
    NotAHeaderValue {
        /// Where it came from.
        origin: String,
    },
    /// The key file named in the config cannot be read.
    #[error("cannot read the API key file {}: {error}", .path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The key with its prefix is not a header value.
    #[error("the API key cannot be used as an HTTP header")]
    Unusable,
}

/// Why a transport cannot be set up for a model URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The URL does not parse.
    #[error("invalid model URL {url}: {reason}")]
    InvalidUrl {
        /// The URL as configured.
        url: String,
        /// The parser's reason.
        reason: String,
    },
    /// The URL is not http(s).
    #[error("the model URL {url} must start with http:// or https://")]
    NotHttp {
        /// The URL.
        url: String,
    },
    /// No HTTP client could be built.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Why a provider client cannot be made: its key or its endpoint.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The key cannot be sent.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The endpoint cannot be reached this way.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
}

/// An API key. Its `Debug` and `Display` never show it, so it cannot leak into logs or
/// error messages by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Checks a key: not empty once trimmed, and usable as an HTTP header value.
    /// `origin` (a variable or file name) is named in the error; the key never is.
    pub fn new(key: &str, origin: &str) -> Result<Self, KeyError> {
        let key = key.trim();
        if key.is_empty() {
            return Err(KeyError::Empty {
                origin: origin.to_string(),
            });
        }
        if HeaderValue::from_str(key).is_err() {
            return Err(KeyError::NotAHeaderValue {
                origin: origin.to_string(),
            });
        }
        Ok(ApiKey(key.to_string()))
    }

    /// The key as a header value marked sensitive (reqwest and hyper never print those).
    pub(crate) fn header_value(&self, prefix: &str) -> Result<HeaderValue, KeyError> {
        let mut value = HeaderValue::from_str(&format!("{prefix}{}", self.0))
            .map_err(|_| KeyError::Unusable)?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Where an API key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// An environment variable, by name.
    Env(String),
    /// A file holding the key (surrounding whitespace is ignored).
    File(PathBuf),
}

impl KeySource {
    /// Reads the key. `Ok(None)` means the variable is not set (or empty); a file that
    /// cannot be read is an error, because naming a file says the key must be there.
    /// `env` looks variables up (the process environment outside tests).
    ///
    /// The key read is registered as a secret (under the variable's name, or
    /// `api-key-file`) before anything else is done with it, so that a provider echoing it
    /// back, or a command printing it, shows a marker instead, whatever its name or source.
    pub fn load(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<ApiKey>, KeyError> {
        match self {
            KeySource::Env(name) => match env(name) {
                Some(value) if !value.trim().is_empty() => {
                    td_base::secrets::register(name, &value);
                    ApiKey::new(&value, &format!("the environment variable {name}")).map(Some)
                }
                _ => Ok(None),
            },
            KeySource::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|error| KeyError::Unreadable {
                    path: path.clone(),
                    error,
                })?;
                td_base::secrets::register("api-key-file", &text);
                ApiKey::new(&text, &format!("the file {}", path.display())).map(Some)
            }
        }
    }

    /// Names the source in messages ("the environment variable X", "the file Y").
    pub fn describe(&self) -> String {
        match self {
            KeySource::Env(name) => format!("the environment variable {name}"),
            KeySource::File(path) => format!("the file {}", path.display()),
        }
    }
}

/// Resolves a key file path against the config's directory.
pub fn resolve_path(base_dir: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base_dir.join(path)
    }
}

/// Posts JSON to one endpoint with retries, under the run's in-flight limit.
pub struct HttpTransport {
    client: reqwest::Client,
    url: Url,
    headers: HeaderMap,
    settings: HttpSettings,
    in_flight: Arc<Semaphore>,
}

impl fmt::Debug for HttpTransport {
    // Written by hand so that the headers (which hold the key) are never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTransport")
            .field("url", &self.url.as_str())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// What one failed attempt says about trying again.
enum Attempt {
    /// Final: do not retry.
    Fatal(LlmError),
    /// Retryable; the server may have said how long to wait.
    Retry {
        error: LlmError,
        retry_after: Option<Duration>,
        /// The HTTP status, when the server answered.
        status: Option<u16>,
        /// A server error's status and body, hashed: what "the same error" means.
        same_error: Option<u64>,
    },
}

impl Attempt {
    /// A retryable failure without an answer from the server (a connection refused or
    /// broken, a timeout).
    fn retry_without_reply(error: LlmError) -> Self {
        Attempt::Retry {
            error,
            retry_after: None,
            status: None,
            same_error: None,
        }
    }
}

/// How often each server error was answered during one call.
#[derive(Default)]
struct ErrorRepeats(Vec<(u64, u32)>);

impl ErrorRepeats {
    /// Counts one more answer of the error `key`; returns how many there were.
    fn count(&mut self, key: u64) -> u32 {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => {
                *n = n.saturating_add(1);
                *n
            }
            None => {
                self.0.push((key, 1));
                1
            }
        }
    }
}

/// What tells one server error from another: its status and its body.
fn error_key(status: StatusCode, body: &[u8]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&status.as_u16(), &mut hasher);
    std::hash::Hash::hash(body, &mut hasher);
    hasher.finish()
}

/// The request body as sent.
fn encode(body: &Value) -> Result<Vec<u8>, LlmError> {
    serde_json::to_vec(body)
        .map_err(|e| LlmError::Transport(format!("cannot encode the request: {e}")))
}

/// The final error of a call made while the run shuts down.
fn limiter_closed() -> Attempt {
    Attempt::Fatal(LlmError::Transport(
        "the run is shutting down (model call limiter closed)".to_string(),
    ))
}

/// Whether a failed status may be retried (see the module documentation).
fn retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || matches!(
            status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS
        )
}

/// What a retry notice says failed: the server's or the transport's message, without the
/// error kind that [`LlmError`]'s `Display` adds (the status is given apart).
fn cause(error: &LlmError) -> String {
    let text = match error {
        LlmError::Transport(m)
        | LlmError::Api { message: m, .. }
        | LlmError::BadReply(m)
        | LlmError::Script(m)
        | LlmError::OverBudget(m) => m,
    };
    td_base::secrets::redact(text).into_owned()
}

impl HttpTransport {
    /// A transport posting to `url` with `headers` (content-type is added).
    pub fn new(
        url: &str,
        mut headers: HeaderMap,
        settings: HttpSettings,
        in_flight: Arc<Semaphore>,
    ) -> Result<Self, EndpointError> {
        let url = Url::parse(url).map_err(|e| EndpointError::InvalidUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(EndpointError::NotHttp {
                url: url.to_string(),
            });
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(HttpTransport {
            // Redirects are not followed: the request (key included) must not be sent on to
            // wherever a misconfigured endpoint points.
            client: td_http::shared_client(&url, Redirects::Never)?,
            url,
            headers,
            settings,
            in_flight,
        })
    }

    /// The endpoint.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Posts `body` and returns the parsed JSON of a 2xx reply, retrying as the module
    /// documentation says and telling `observer` of each retry.
    pub async fn post_json(
        &self,
        body: &Value,
        observer: &dyn CallObserver,
    ) -> Result<Value, LlmError> {
        let bytes = encode(body)?;
        self.with_retries(observer, || self.attempt(bytes.clone()))
            .await
    }

    /// Makes attempts until one succeeds, fails for good, or the retry policy of the
    /// module documentation says to stop; each retry is reported to `observer` before its
    /// wait. Every kind of call ([`HttpTransport::post_json`], and the streamed one) goes
    /// through this one loop, so they retry alike.
    async fn with_retries<T, Fut>(
        &self,
        observer: &dyn CallObserver,
        mut attempt_once: impl FnMut() -> Fut,
    ) -> Result<T, LlmError>
    where
        Fut: Future<Output = Result<T, Attempt>>,
    {
        let attempts = self.settings.max_retries.saturating_add(1);
        let mut repeats = ErrorRepeats::default();
        let mut attempt = 1;
        loop {
            let (error, retry_after, status, same_error) = match attempt_once().await {
                Ok(value) => return Ok(value),
                Err(Attempt::Fatal(error)) => return Err(error),
                Err(Attempt::Retry {
                    error,
                    retry_after,
                    status,
                    same_error,
                }) => (error, retry_after, status, same_error),
            };
            if let Some(key) = same_error {
                let times = repeats.count(key);
                if times >= SAME_ERROR_ATTEMPTS {
                    return Err(gave_up_on_repeats(error, attempt, times));
                }
            }
            if attempt >= attempts {
                return Err(gave_up(error, attempts));
            }
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
                status,
                cause: cause(&error),
            });
            // The observer puts the retry in the run record and the progress line; the log
            // line is for debugging (a warning would cut through the live table on stderr).
            tracing::info!(
                url = %self.url,
                attempt,
                attempts,
                wait_ms = wait.as_millis() as u64,
                error = %error,
                "model call failed; retrying"
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    async fn attempt(&self, body: Vec<u8>) -> Result<Value, Attempt> {
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| limiter_closed())?;
        let response = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .timeout(self.settings.timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_failure(&e))?;
        self.whole_reply(response).await
    }

    /// Reads a whole reply: the JSON of a 2xx, else the API error, retryable or not as the
    /// module documentation says.
    async fn whole_reply(&self, mut response: reqwest::Response) -> Result<Value, Attempt> {
        let status = response.status();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let cap = self.settings.max_body_bytes;
        let too_large = || {
            Attempt::Fatal(LlmError::BadReply(format!(
                "the reply from {} is larger than {cap} bytes",
                self.url
            )))
        };
        // Refused by its announced length before a byte is read, else while streaming.
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
                    "the reply from {} is not JSON ({e}): {}",
                    self.url,
                    quote(&String::from_utf8_lossy(&body))
                )))
            });
        }
        let error = LlmError::Api {
            status: status.as_u16(),
            message: api_error_message(status, &body),
        };
        if retryable(status) {
            Err(Attempt::Retry {
                error,
                retry_after,
                status: Some(status.as_u16()),
                same_error: status.is_server_error().then(|| error_key(status, &body)),
            })
        } else {
            Err(Attempt::Fatal(error))
        }
    }

    fn transport_failure(&self, err: &reqwest::Error) -> Attempt {
        let what = if err.is_timeout() {
            format!(
                "no complete reply from {} within {} ms",
                self.url,
                self.settings.timeout.as_millis()
            )
        } else {
            format!("request to {} failed", self.url)
        };
        let error = LlmError::Transport(format!("{what}: {}", td_http::error_chain(err)));
        if err.is_builder() {
            Attempt::Fatal(error)
        } else {
            Attempt::retry_without_reply(error)
        }
    }
}

/// The wait a reply asks for: `retry-after-ms` (milliseconds), else `retry-after` as
/// seconds or as an HTTP date (a date in the past means "now").
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(parse_seconds) {
        return Some(ms / 1000);
    }
    let value = text("retry-after")?;
    if let Some(wait) = parse_seconds(value) {
        return Some(wait);
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(date.timestamp()).ok()?);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A non-negative decimal number of seconds ("2", "0.5").
fn parse_seconds(text: &str) -> Option<Duration> {
    let secs: f64 = text.parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    // Beyond any sane wait: clamp instead of overflowing Duration.
    Some(Duration::from_secs_f64(secs.min(1e9)))
}

/// The most the wait before retry number `attempt` (1-based) may be: `base × 2^(attempt−1)`,
/// capped at [`MAX_BACKOFF`].
pub fn backoff_cap(base: Duration, attempt: u32) -> Duration {
    let factor = 1u32
        .checked_shl(attempt.saturating_sub(1))
        .unwrap_or(u32::MAX);
    base.checked_mul(factor)
        .unwrap_or(MAX_BACKOFF)
        .min(MAX_BACKOFF)
}

/// A wait drawn uniformly from `[0, cap]` using `random`.
pub fn full_jitter(cap: Duration, random: u64) -> Duration {
    let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(random % nanos.saturating_add(1))
}

/// Randomness for jitter without a dependency: each `RandomState` is freshly keyed.
fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default(),
    );
    hasher.finish()
}

/// The provider's error message from an error body: `{"error": {"type", "message"}}`
/// (Anthropic, OpenAI, vLLM), `{"error": "text"}` (Ollama), `{"message": ...}`, or the raw
/// text. Authentication failures get a hint on where the key comes from.
pub fn api_error_message(status: StatusCode, body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let from_json = parsed.as_ref().and_then(|v| {
        let error = v.get("error");
        // An empty message (llama-cpp-python's 500 to `tool_choice: "required"`) says
        // nothing: the whole body is quoted instead.
        let message = error
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .or_else(|| error.and_then(Value::as_str))
            .or_else(|| v.get("message").and_then(Value::as_str))
            .filter(|m| !m.trim().is_empty())?;
        let kind = error
            .and_then(|e| e.get("type"))
            .and_then(Value::as_str)
            .filter(|k| !k.is_empty());
        Some(match kind {
            Some(kind) => format!("{kind}: {message}"),
            None => message.to_string(),
        })
    });
    let message = match from_json {
        Some(m) => quote(&m),
        None => {
            let text = String::from_utf8_lossy(body);
            if text.trim().is_empty() {
                status
                    .canonical_reason()
                    .unwrap_or("no error message")
                    .to_string()
            } else {
                quote(text.trim())
            }
        }
    };
    if matches!(status.as_u16(), 401 | 403) {
        format!(
            "{message} (check the API key: llm.api-key-env names the variable that holds it, llm.api-key-file a file)"
        )
    } else {
        message
    }
}

/// Cuts server text for a message, on a character boundary.
fn quote(text: &str) -> String {
    quote_limited(text, ERROR_QUOTE_LIMIT)
}

/// A JSON reply quoted in an error, cut short.
pub(crate) fn quote_json(body: &Value) -> String {
    quote_limited(&body.to_string(), 300)
}

/// `text` redacted, then cut to `limit` bytes: redacting first, because a cut could leave
/// part of a secret that would no longer be recognised.
fn quote_limited(text: &str, limit: usize) -> String {
    let text = td_base::secrets::redact(text);
    match td_base::text::truncate_to(&text, limit) {
        Some(cut) => format!("{cut}…"),
        None => text.to_string(),
    }
}

/// Adds the attempt count to the final error of a retryable failure.
fn gave_up(error: LlmError, attempts: u32) -> LlmError {
    let plural = if attempts == 1 { "" } else { "s" };
    with_note(error, &format!("gave up after {attempts} attempt{plural}"))
}

/// The final error of a call whose server gave the same error `times` times, at `attempt`.
fn gave_up_on_repeats(error: LlmError, attempt: u32, times: u32) -> LlmError {
    with_note(
        error,
        &format!(
            "gave up after {attempt} attempts: the server answered with the same error {times} \
             times, so sending the request again will not change it"
        ),
    )
}

fn with_note(error: LlmError, note: &str) -> LlmError {
    match error {
        LlmError::Transport(m) => LlmError::Transport(format!("{m} ({note})")),
        LlmError::Api { status, message } => LlmError::Api {
            status,
            message: format!("{message} ({note})"),
        },
        other => other,
    }
}

// Streamed calls (server-sent events): a child module, so that it shares this transport's
// client, settings and retry pieces without widening their visibility.
mod streaming;
pub use streaming::{SseEvent, SseEvents, StreamReply};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 2015-10-21 07:28:00 UTC
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(3)));
        h.insert("retry-after", HeaderValue::from_static("0.25"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(250)));
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:07 GMT"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        // A date already past: retry at once.
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:27:00 GMT"),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::ZERO));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), None);
        h.insert("retry-after", HeaderValue::from_static("-1"));
        assert_eq!(retry_after(&h, now), None);
        // The millisecond header wins over the seconds one.
        h.insert("retry-after", HeaderValue::from_static("9"));
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let base = Duration::from_millis(100);
        assert_eq!(backoff_cap(base, 1), Duration::from_millis(100));
        assert_eq!(backoff_cap(base, 2), Duration::from_millis(200));
        assert_eq!(backoff_cap(base, 4), Duration::from_millis(800));
        assert_eq!(backoff_cap(base, 30), MAX_BACKOFF);
        assert_eq!(backoff_cap(base, u32::MAX), MAX_BACKOFF);
        assert_eq!(backoff_cap(Duration::ZERO, 3), Duration::ZERO);
    }

    #[test]
    fn full_jitter_stays_within_its_cap() {
        let cap = Duration::from_millis(10);
        for r in [0, 1, 9_999_999, 10_000_000, 10_000_001, u64::MAX] {
            assert!(full_jitter(cap, r) <= cap);
        }
        assert_eq!(full_jitter(cap, 0), Duration::ZERO);
        assert_eq!(full_jitter(cap, 10_000_000), cap);
        assert_eq!(full_jitter(Duration::ZERO, 12345), Duration::ZERO);
        // Real randomness spreads the waits.
        let waits: std::collections::BTreeSet<_> =
            (0..20).map(|_| full_jitter(cap, random_u64())).collect();
        assert!(waits.len() > 10, "{waits:?}");
    }

    #[test]
    fn error_messages_are_found_in_each_provider_shape() {
        let bad = StatusCode::BAD_REQUEST;
        assert_eq!(
            api_error_message(
                bad,
                br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too big"}}"#
            ),
            "invalid_request_error: max_tokens: too big"
        );
        assert_eq!(
            api_error_message(
                bad,
                br#"{"error":{"message":"bad model","type":"","code":null}}"#
            ),
            "bad model"
        );
        assert_eq!(
            api_error_message(bad, br#"{"error":"model 'x' not found"}"#),
            "model 'x' not found"
        );
        assert_eq!(api_error_message(bad, br#"{"message":"nope"}"#), "nope");
        let empty = br#"{"error":{"message":"","type":"internal_server_error"}}"#;
        assert_eq!(
            api_error_message(StatusCode::INTERNAL_SERVER_ERROR, empty),
            String::from_utf8_lossy(empty)
        );
        assert_eq!(
            api_error_message(bad, b"<html>oops</html>"),
            "<html>oops</html>"
        );
        assert_eq!(api_error_message(bad, b"  "), "Bad Request");
        let long = "é".repeat(2000);
        let cut = api_error_message(bad, long.as_bytes());
        assert!(cut.len() <= ERROR_QUOTE_LIMIT + '…'.len_utf8());
        assert!(cut.ends_with('…'));
        let auth = api_error_message(
            StatusCode::UNAUTHORIZED,
            br#"{"error":{"message":"invalid x-api-key"}}"#,
        );
        assert!(
            auth.starts_with("invalid x-api-key (check the API key"),
            "{auth}"
        );
    }

    #[test]
    fn keys_are_trimmed_checked_and_never_printed() {
        let key = ApiKey::new("  sk-secret-123\n", "the file k").unwrap();
        assert_eq!(key, ApiKey("sk-secret-123".to_string()));
        assert!(!format!("{key:?}").contains("secret"));
        let header = key.header_value("Bearer ").unwrap();
        assert!(header.is_sensitive());
        assert_eq!(header.to_str().unwrap(), "Bearer sk-secret-123");

        assert!(matches!(
            ApiKey::new(" \n", "the file k"),
            Err(KeyError::Empty { origin }) if origin == "the file k"
        ));
        assert!(matches!(
            ApiKey::new("a\u{1}b", "x"),
            Err(KeyError::NotAHeaderValue { .. })
        ));
        let empty = ApiKey::new(" \n", "the file k").unwrap_err().to_string();
        assert!(empty.contains("the file k is empty"), "{empty}");
        let weird = ApiKey::new("sk-\u{7}bell", "the environment variable K")
            .unwrap_err()
            .to_string();
        assert!(weird.contains("environment variable K"), "{weird}");
        assert!(!weird.contains("bell"), "{weird}");
    }

    #[test]
    fn key_sources_read_variables_and_files() {
        let env = |name: &str| match name {
            "SET" => Some("sk-env\n".to_string()),
            "BLANK" => Some("   ".to_string()),
            _ => None,
        };
        let got = KeySource::Env("SET".into()).load(&env).unwrap();
        assert_eq!(got, Some(ApiKey("sk-env".into())));
        assert_eq!(KeySource::Env("BLANK".into()).load(&env).unwrap(), None);
        assert_eq!(KeySource::Env("UNSET".into()).load(&env).unwrap(), None);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "\n sk-file \n").unwrap();
        let got = KeySource::File(file.clone()).load(&env).unwrap();
        assert_eq!(got, Some(ApiKey("sk-file".into())));
        let missing = KeySource::File(dir.path().join("nope"))
            .load(&env)
            .unwrap_err();
        assert!(
            matches!(&missing, KeyError::Unreadable { path, error }
                if path.ends_with("nope") && error.kind() == std::io::ErrorKind::NotFound),
            "{missing:?}"
        );
        let missing = missing.to_string();
        assert!(
            missing.contains("cannot read the API key file"),
            "{missing}"
        );
        std::fs::write(&file, "").unwrap();
        let empty = KeySource::File(file).load(&env).unwrap_err().to_string();
        assert!(empty.contains("is empty"), "{empty}");
    }

    #[test]
    fn loaded_keys_are_registered_as_secrets_under_their_source() {
        let env = |name: &str| (name == "TEST_HTTP_ENV_KEY").then(|| "sk-http-env-h7h7h7".into());
        KeySource::Env("TEST_HTTP_ENV_KEY".into())
            .load(&env)
            .unwrap();
        assert_eq!(
            td_base::secrets::redact("sk-http-env-h7h7h7"),
            "[REDACTED:TEST_HTTP_ENV_KEY]"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "sk-http-file-h8h8h8\n").unwrap();
        KeySource::File(file).load(&env).unwrap();
        assert_eq!(
            td_base::secrets::redact("sk-http-file-h8h8h8"),
            "[REDACTED:api-key-file]"
        );
    }

    #[test]
    fn error_bodies_are_redacted_before_they_are_cut() {
        td_base::secrets::register("TEST_HTTP_ECHO_KEY", "sk-http-echo-h9h9h9");
        // The key straddles the quote limit: cutting first would leave its first bytes.
        let body = format!("{}sk-http-echo-h9h9h9", "x".repeat(ERROR_QUOTE_LIMIT - 5));
        let message = api_error_message(StatusCode::UNAUTHORIZED, body.as_bytes());
        assert!(!message.contains("sk-ht"), "{message}");
        let body = serde_json::json!({"error": {"message": "bad key sk-http-echo-h9h9h9"}});
        let message = api_error_message(StatusCode::UNAUTHORIZED, body.to_string().as_bytes());
        assert!(
            message.starts_with("bad key [REDACTED:TEST_HTTP_ECHO_KEY]"),
            "{message}"
        );
    }

    #[test]
    fn relative_key_paths_resolve_against_the_config_directory() {
        let base = Path::new("/etc/td");
        assert_eq!(
            resolve_path(base, Path::new("k.txt")),
            PathBuf::from("/etc/td/k.txt")
        );
        assert_eq!(
            resolve_path(base, Path::new("/k.txt")),
            PathBuf::from("/k.txt")
        );
    }

    #[test]
    fn only_http_urls_are_accepted() {
        let sem = Arc::new(Semaphore::new(1));
        assert!(matches!(
            HttpTransport::new("ftp://x/y", HeaderMap::new(), HttpSettings::default(), sem.clone()),
            Err(EndpointError::NotHttp { url }) if url == "ftp://x/y"
        ));
        let err = HttpTransport::new(
            "ftp://x/y",
            HeaderMap::new(),
            HttpSettings::default(),
            sem.clone(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("http://"), "{err}");
        let err = HttpTransport::new("not a url", HeaderMap::new(), HttpSettings::default(), sem)
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid model URL"), "{err}");
    }

    #[test]
    fn debug_output_hides_the_headers() {
        let mut headers = HeaderMap::new();
        let key = ApiKey::new("sk-hidden", "test").unwrap();
        headers.insert("x-api-key", key.header_value("").unwrap());
        let t = HttpTransport::new(
            "http://127.0.0.1:9/v1/messages",
            headers,
            HttpSettings::default(),
            Arc::new(Semaphore::new(1)),
        )
        .unwrap();
        let shown = format!("{t:?}");
        assert!(shown.contains("127.0.0.1:9"), "{shown}");
        assert!(!shown.contains("sk-hidden"), "{shown}");
    }

    #[test]
    fn final_errors_name_the_attempts() {
        let e = gave_up(LlmError::Transport("refused".into()), 5);
        assert_eq!(
            e,
            LlmError::Transport("refused (gave up after 5 attempts)".into())
        );
        let e = gave_up(
            LlmError::Api {
                status: 529,
                message: "overloaded".into(),
            },
            1,
        );
        assert_eq!(
            e,
            LlmError::Api {
                status: 529,
                message: "overloaded (gave up after 1 attempt)".into()
            }
        );
    }
}
