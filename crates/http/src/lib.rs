//! The HTTP plumbing the model providers (td-llm) and the web tools (td-tools) share: one
//! pooled reqwest client per way of talking (redirects followed or not, proxy or direct), a
//! body reader that stops at a byte cap, and the full text of an error with its causes.
//!
//! What each caller does with a reply (retries, refusing or cutting an oversized body, the
//! messages shown) stays with the caller; only the mechanics live here.

use std::error::Error;
use std::sync::OnceLock;

use reqwest::redirect::Policy;
use reqwest::{Client, ClientBuilder, Response, Url};

#[cfg(any(test, feature = "test-server"))]
pub mod test_server;

/// Redirects a [`Redirects::Follow`] client follows before giving up.
pub const MAX_REDIRECTS: usize = 10;

/// The `User-Agent` every request is sent with.
pub const USER_AGENT: &str = concat!("taskdaemon/", env!("CARGO_PKG_VERSION"));

/// What a shared client does with a 3xx reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirects {
    /// Hands it back as it is (a model endpoint that redirects is misconfigured, and the
    /// request must not be replayed, key included, somewhere else).
    Never,
    /// Follows it, up to [`MAX_REDIRECTS`] hops.
    Follow,
}

/// A shared client could not be built (no TLS roots, say). Cloneable, because the failure
/// is remembered and given to every later caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the HTTP client could not be set up: {cause}")]
pub struct ClientError {
    cause: String,
}

impl ClientError {
    /// Why, as reqwest and its sources said it.
    pub fn cause(&self) -> &str {
        &self.cause
    }
}

/// A client builder with what every client of TaskDaemon has (the user agent), for callers
/// that need their own client (a resolver that checks addresses, say).
pub fn builder() -> ClientBuilder {
    Client::builder().user_agent(USER_AGENT)
}

/// Whether `url` names this machine (`localhost` or a loopback address).
pub fn is_loopback(url: &Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The process-wide client for requests to `url` handling redirects as `redirects` says, so
/// that connections are pooled across loops. Proxies from the environment are honoured,
/// except for loopback hosts (Ollama, llama.cpp, a test server), which no proxy could reach
/// on our behalf.
pub fn shared_client(url: &Url, redirects: Redirects) -> Result<Client, ClientError> {
    static CLIENTS: [OnceLock<Result<Client, ClientError>>; 4] = [const { OnceLock::new() }; 4];
    let loopback = is_loopback(url);
    let (slot, policy) = match redirects {
        Redirects::Never => (0, Policy::none()),
        Redirects::Follow => (2, Policy::limited(MAX_REDIRECTS)),
    };
    CLIENTS[slot + usize::from(loopback)]
        .get_or_init(|| {
            let mut builder = builder().redirect(policy);
            if loopback {
                builder = builder.no_proxy();
            }
            builder.build().map_err(|e| ClientError {
                cause: error_chain(&e),
            })
        })
        .clone()
}

/// The error and all its sources, joined with `: `, each said once: reqwest's own message
/// alone rarely says why ("error sending request" hides "connection refused").
pub fn error_chain(err: &(dyn Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// A body read up to a cap.
#[derive(Debug, Default)]
pub struct CappedBody {
    /// The bytes kept (at most the cap).
    pub bytes: Vec<u8>,
    /// Whether the server had more to send than the cap.
    pub truncated: bool,
    /// Why reading stopped early, if the transfer broke.
    pub interrupted: Option<reqwest::Error>,
}

/// Reads the body of `response` chunk by chunk, keeping at most `cap` bytes, and stops
/// reading (so the connection is dropped) as soon as the cap is passed: memory stays bounded
/// whatever the server sends or announces.
pub async fn read_capped(response: &mut Response, cap: usize) -> CappedBody {
    let announced = response.content_length().unwrap_or(0);
    let initial = usize::try_from(announced).unwrap_or(usize::MAX).min(cap);
    let mut body = CappedBody {
        bytes: Vec::with_capacity(initial),
        ..CappedBody::default()
    };
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = cap.saturating_sub(body.bytes.len());
                if chunk.len() > room {
                    body.bytes.extend_from_slice(&chunk[..room]);
                    body.truncated = true;
                    break;
                }
                body.bytes.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => {
                body.interrupted = Some(e);
                break;
            }
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::test_server::{Canned, Server, start};
    use super::*;
    use std::fmt;

    async fn get(server: &Server, redirects: Redirects) -> Response {
        let url = Url::parse(&format!("{}/x", server.base)).unwrap();
        shared_client(&url, redirects)
            .unwrap()
            .get(url)
            .send()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_body_under_the_cap_is_read_whole() {
        let server = start(|_| Canned::new("200 OK", "text/plain", "hello")).await;
        let body = read_capped(&mut get(&server, Redirects::Never).await, 5).await;
        assert_eq!(body.bytes, b"hello");
        assert!(!body.truncated);
        assert!(body.interrupted.is_none());
    }

    #[tokio::test]
    async fn a_body_over_the_cap_is_cut_at_the_cap() {
        let server = start(|_| Canned {
            repeat: 1000,
            ..Canned::new("200 OK", "text/plain", "hello world")
        })
        .await;
        let body = read_capped(&mut get(&server, Redirects::Never).await, 4).await;
        assert_eq!(body.bytes, b"hell");
        assert!(body.truncated);
        assert!(body.interrupted.is_none());
    }

    #[tokio::test]
    async fn a_transfer_that_breaks_off_is_reported_with_what_came() {
        // 100 bytes announced, 3 sent, then the connection closes.
        let server = start(|_| Canned {
            announced_length: Some(100),
            ..Canned::new("200 OK", "text/plain", "abc")
        })
        .await;
        let body = read_capped(&mut get(&server, Redirects::Never).await, 1000).await;
        assert_eq!(body.bytes, b"abc");
        assert!(!body.truncated);
        assert!(body.interrupted.is_some());
    }

    #[tokio::test]
    async fn each_mode_handles_redirects_as_it_says_and_names_itself() {
        // Redirects to itself, forever.
        let server = start(|_| Canned {
            headers: vec![("Location".into(), "/x".into())],
            ..Canned::new("302 Found", "text/plain", "")
        })
        .await;
        assert_eq!(get(&server, Redirects::Never).await.status(), 302);
        let head = server.requests.lock().unwrap()[0].clone();
        assert!(
            head.contains(&format!("user-agent: {USER_AGENT}")),
            "{head}"
        );
        let url = Url::parse(&format!("{}/x", server.base)).unwrap();
        let err = shared_client(&url, Redirects::Follow)
            .unwrap()
            .get(url)
            .send()
            .await
            .unwrap_err();
        assert!(err.is_redirect(), "{err}");
        // The first request, then the one sent and the ones followed.
        assert_eq!(server.requests.lock().unwrap().len(), 1 + 1 + MAX_REDIRECTS);
    }

    #[test]
    fn loopback_hosts_are_recognised() {
        for (url, loopback) in [
            ("http://localhost:11434/v1", true),
            ("http://LOCALHOST/", true),
            ("http://127.0.0.1:8080/", true),
            ("http://127.3.4.5/", true),
            ("http://[::1]:9/", true),
            ("https://api.openai.com/v1", false),
            ("http://10.0.0.1/", false),
            ("http://localhost.example.com/", false),
        ] {
            assert_eq!(is_loopback(&Url::parse(url).unwrap()), loopback, "{url}");
        }
    }

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    #[test]
    fn error_chains_name_every_cause_once() {
        let err = Layer(
            "error sending request",
            Some(Box::new(Layer(
                "client error (Connect)",
                Some(Box::new(Layer(
                    "Connection refused",
                    // Already said by the layer above: left out.
                    Some(Box::new(Layer("refused", None))),
                ))),
            ))),
        );
        assert_eq!(
            error_chain(&err),
            "error sending request: client error (Connect): Connection refused"
        );
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
    }
}
