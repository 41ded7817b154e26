//! The HTTP side both web tools share: the time a request may take, the shared clients
//! (td-http's, redirects followed) and the tool errors for a client that cannot be built or
//! a request that failed. The body reader and error chains are td-http's too.

use std::time::Duration;

use reqwest::Url;
use td_http::{Redirects, error_chain};
use td_toolkit::error::{ToolError, ToolResult};

/// The time a request may take: a little under the catalog limit, so that this tool's own
/// timeout message (which names the URL) wins over the registry's generic watchdog.
pub(crate) fn request_timeout(catalog_ms: u64) -> Duration {
    let margin = (catalog_ms / 10).min(1_000);
    Duration::from_millis(catalog_ms.saturating_sub(margin).max(1))
}

/// The shared client for `url`, following redirects. Proxies from the environment are
/// honoured, except for loopback hosts, which no proxy could reach on our behalf.
pub(crate) fn client_for(url: &Url) -> ToolResult<reqwest::Client> {
    td_http::shared_client(url, Redirects::Follow).map_err(|e| client_unavailable(e.cause()))
}

/// The error when no HTTP client can be built (no TLS roots, say).
pub(crate) fn client_unavailable(cause: &str) -> ToolError {
    ToolError::Unavailable {
        message: format!(
            "the HTTP client could not be set up ({cause}); web tools cannot be used in this environment. Continue without them."
        ),
    }
}

/// Maps a failed request to a tool error that names the URL.
pub(crate) fn request_error(url: &Url, err: &reqwest::Error, timeout: Duration) -> ToolError {
    if err.is_timeout() {
        return ToolError::Timeout {
            timeout_ms: timeout.as_millis() as u64,
            detail: format!(
                " fetching {url}; the server is slow or unreachable, try another source"
            ),
        };
    }
    let hint = if err.is_redirect() {
        "The site redirects in a loop or too often; try the final URL directly or another source."
    } else {
        "Check the host name and port in the URL; if the site is down or unreachable, try another source (web_search can find one)."
    };
    ToolError::failed(format!("fetching {url}"), error_chain(err), hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_timeout_stays_under_the_catalog_limit() {
        assert_eq!(request_timeout(30_000), Duration::from_millis(29_000));
        assert_eq!(request_timeout(500), Duration::from_millis(450));
        assert_eq!(request_timeout(0), Duration::from_millis(1));
    }
}
