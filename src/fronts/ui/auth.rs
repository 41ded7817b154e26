//! Who may use the dashboard, and the headers every answer carries.
//!
//! - Bound to a loopback address, the dashboard is the local user's: no token, but the
//!   `Host` header must name the loopback address and port it listens on, so that a web page
//!   elsewhere cannot reach it through a DNS name rebound to 127.0.0.1.
//! - Bound elsewhere, every request needs the per-start token (32 random bytes from the OS,
//!   hex): `?token=` or `Authorization: Bearer`. Missing or wrong: 403.
//! - A request that changes something (any method but GET and HEAD) is refused when its
//!   `Origin` is another site's: a page elsewhere cannot press the stop buttons through the
//!   user's browser.
//! - Every answer: `Cache-Control: no-cache`, `Content-Security-Policy: default-src 'self'`,
//!   `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer` (the token is in the
//!   page's URL).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// Random bytes of a token.
const TOKEN_BYTES: usize = 32;

/// What a request must show.
#[derive(Debug, Clone)]
pub struct Access {
    /// The token every request needs (non-loopback binds).
    pub token: Option<String>,
    /// The `Host` values accepted (loopback binds); empty: any.
    pub hosts: Vec<String>,
}

impl Access {
    /// The access rules of a server listening on `addr`: a new token when it is not a
    /// loopback address, otherwise the loopback host names with its port.
    pub fn for_address(addr: std::net::SocketAddr) -> Result<Access, String> {
        if addr.ip().is_loopback() {
            let port = addr.port();
            let mut hosts = vec![format!("localhost:{port}"), format!("{addr}")];
            if addr.is_ipv4() {
                hosts.push(format!("[::1]:{port}"));
            } else {
                hosts.push(format!("127.0.0.1:{port}"));
            }
            Ok(Access { token: None, hosts })
        } else {
            Ok(Access {
                token: Some(new_token()?),
                hosts: Vec::new(),
            })
        }
    }
}

/// A new token: [`TOKEN_BYTES`] from the OS random source, hex.
pub fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| format!("cannot draw a token from the OS random source: {e}"))?;
    Ok(hex::encode(bytes))
}

/// Compares in time independent of where the values differ.
fn same(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The middleware: checks the request, then adds the headers to the answer.
pub async fn guard(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    let mut response = match check(&access, &request) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-cache"),
        (header::CONTENT_SECURITY_POLICY, "default-src 'self'"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn check(access: &Access, request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !access.hosts.is_empty() && !access.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
        return Err(forbidden(
            "this dashboard answers only requests addressed to its loopback address",
            "open the address the dashboard printed (http://127.0.0.1:PORT/)",
        ));
    }
    if let Some(token) = &access.token {
        let given = token_of(request).unwrap_or_default();
        if !same(given.as_bytes(), token.as_bytes()) {
            return Err(forbidden(
                "a valid token is needed: this dashboard listens beyond this machine",
                "open the address the dashboard printed, with its ?token=",
            ));
        }
    }
    if request.method() != Method::GET
        && request.method() != Method::HEAD
        && !same_origin(headers, host)
    {
        return Err(forbidden(
            "a request from another site's page is refused",
            "use the dashboard's own page",
        ));
    }
    Ok(())
}

/// The token a request shows: `?token=` or `Authorization: Bearer`.
fn token_of(request: &Request) -> Option<String> {
    if let Some(bearer) = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
    {
        return Some(bearer.trim().to_string());
    }
    let Query(query) = Query::<HashMap<String, String>>::try_from_uri(request.uri()).ok()?;
    query.get("token").cloned()
}

/// Whether the request's `Origin` (when it has one) is this server's.
fn same_origin(headers: &HeaderMap, host: &str) -> bool {
    match headers.get(header::ORIGIN).map(|o| o.to_str()) {
        None => true,
        Some(Ok(origin)) => {
            origin.eq_ignore_ascii_case(&format!("http://{host}"))
                || origin.eq_ignore_ascii_case(&format!("https://{host}"))
        }
        Some(Err(_)) => false,
    }
}

fn forbidden(error: &str, hint: &str) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, error, hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_new_each_time_and_compared_whole() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(same(a.as_bytes(), a.as_bytes()));
        assert!(!same(a.as_bytes(), b.as_bytes()));
        assert!(!same(&a.as_bytes()[..63], a.as_bytes()));
    }

    #[test]
    fn loopback_binds_take_no_token_and_others_do() {
        let local = Access::for_address("127.0.0.1:7420".parse().unwrap()).unwrap();
        assert!(local.token.is_none());
        assert!(local.hosts.contains(&"127.0.0.1:7420".to_string()));
        assert!(local.hosts.contains(&"localhost:7420".to_string()));
        let open = Access::for_address("0.0.0.0:7420".parse().unwrap()).unwrap();
        assert!(open.token.is_some() && open.hosts.is_empty());
    }

    #[test]
    fn only_the_own_origin_may_change_something() {
        let mut headers = HeaderMap::new();
        assert!(same_origin(&headers, "127.0.0.1:1"));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:1"),
        );
        assert!(same_origin(&headers, "127.0.0.1:1"));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&headers, "127.0.0.1:1"));
        headers.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&headers, "127.0.0.1:1"));
    }
}
