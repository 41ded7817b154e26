//! `web_search`: asks a configured search provider and lists the results as numbered
//! "title — URL" lines with a snippet.
//!
//! The provider comes from the environment, read through a lookup function so that tests
//! can pass their own variables without touching the process environment:
//! `TASKDAEMON_SEARXNG_URL` (a SearXNG instance, or anything answering its JSON API) wins
//! over `BRAVE_SEARCH_API_KEY` (Brave Search API; base URL overridable with
//! `TASKDAEMON_BRAVE_URL`).

use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use serde::Deserialize;
use serde_json::{Value, json};

use super::fetching::{client_for, request_error, request_timeout};
use super::html::{decode_entities, strip_tags};
use td_base::text::truncate_to;
use td_http::error_chain;
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "web_search";

/// Environment variable naming a SearXNG base URL.
pub const SEARXNG_URL_VAR: &str = "TASKDAEMON_SEARXNG_URL";
/// Environment variable holding a Brave Search API key.
pub const BRAVE_KEY_VAR: &str = "BRAVE_SEARCH_API_KEY";
/// Environment variable overriding the Brave Search API base URL.
pub const BRAVE_URL_VAR: &str = "TASKDAEMON_BRAVE_URL";

const BRAVE_DEFAULT_BASE: &str = "https://api.search.brave.com";
const DEFAULT_RESULTS: usize = 5;
const MAX_RESULTS: usize = 20;
/// Largest provider reply read; result pages are far smaller.
const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;
/// Longest snippet shown per result.
const SNIPPET_BYTES: usize = 400;

/// The `web_search` tool.
pub struct WebSearch;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    query: String,
    max_results: Option<u64>,
}

/// A configured search provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Provider {
    /// A SearXNG instance at `base`.
    Searxng { base: String },
    /// The Brave Search API at `base`, with its key.
    Brave { base: String, key: String },
}

impl Provider {
    fn label(&self) -> &'static str {
        match self {
            Provider::Searxng { .. } => "SearXNG",
            Provider::Brave { .. } => "Brave Search",
        }
    }
}

/// The provider the variables of `lookup` configure; blank values count as unset.
pub(crate) fn provider_from(lookup: impl Fn(&str) -> Option<String>) -> Option<Provider> {
    let get = |name: &str| {
        lookup(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(base) = get(SEARXNG_URL_VAR) {
        return Some(Provider::Searxng { base });
    }
    let key = get(BRAVE_KEY_VAR)?;
    let base = get(BRAVE_URL_VAR).unwrap_or_else(|| BRAVE_DEFAULT_BASE.to_string());
    Some(Provider::Brave { base, key })
}

/// The error when no provider is configured.
fn not_configured() -> ToolError {
    ToolError::Unavailable {
        message: format!(
            "web_search has no search provider configured. Set {SEARXNG_URL_VAR} to a SearXNG instance (its JSON format must be enabled) or {BRAVE_KEY_VAR} to a Brave Search API key, then restart taskdaemon. Meanwhile, use web_fetch on a URL you already know (e.g. the official documentation site)."
        ),
    }
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hit {
    title: String,
    url: String,
    snippet: String,
}

#[derive(Debug, Deserialize)]
struct SearxngReply {
    results: Vec<SearxngItem>,
}

#[derive(Debug, Deserialize)]
struct SearxngItem {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct BraveReply {
    /// Absent when the query found no web results.
    #[serde(default)]
    web: Option<BraveWeb>,
}

#[derive(Debug, Deserialize)]
struct BraveWeb {
    #[serde(default)]
    results: Vec<BraveItem>,
}

#[derive(Debug, Deserialize)]
struct BraveItem {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    description: Option<String>,
}

#[async_trait]
impl Tool for WebSearch {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Search the web and list the results as numbered lines \"title — URL\" with a short \
         snippet each. Needs a provider configured by the operator (a SearXNG instance or a \
         Brave Search API key); without one it says so. Follow up with web_fetch on a result's \
         URL to read the page."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "description": "What to search for, as you would type it into a search engine. Required."
                },
                "max_results": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_RESULTS,
                    "description": "Most results to list (default 5, at most 20)."
                }
            },
            "required": ["query"],
            "additionalProperties": false
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let provider = provider_from(|name| std::env::var(name).ok());
        run(provider, input, ctx).await
    }
}

/// The tool's work, with the provider passed in (tests give their own).
async fn run(
    provider: Option<Provider>,
    input: Value,
    ctx: &ToolContext,
) -> ToolResult<ToolOutput> {
    let args: Args = args::parse(TOOL, input)?;
    let query = args.query.trim();
    if query.is_empty() {
        return Err(ToolError::invalid(
            TOOL,
            "/query",
            "the query is blank; pass words to search for",
        ));
    }
    let max = match args.max_results {
        None => DEFAULT_RESULTS,
        Some(n) if (1..=MAX_RESULTS as u64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ToolError::invalid(
                TOOL,
                "/max_results",
                format!("{n} is outside 1..={MAX_RESULTS}"),
            ));
        }
    };
    let provider = provider.ok_or_else(not_configured)?;
    let timeout = request_timeout(ctx.spec(TOOL).timeout_ms);
    let hits = search(&provider, query, max, timeout).await?;
    Ok(ToolOutput::text(render(query, provider.label(), &hits)))
}

/// Builds the provider's request URL for `query`.
fn request_url(provider: &Provider, query: &str, max: usize) -> ToolResult<Url> {
    let (base, path, var) = match provider {
        Provider::Searxng { base } => (base, "search", SEARXNG_URL_VAR),
        Provider::Brave { base, .. } => (base, "res/v1/web/search", BRAVE_URL_VAR),
    };
    let misconfigured = |why: String| ToolError::Unavailable {
        message: format!(
            "web_search is misconfigured: {var} is '{base}', which {why}. The operator must set it to an http(s) base URL such as https://search.example.org. Meanwhile, use web_fetch on a URL you already know."
        ),
    };
    // A base without a trailing slash would lose its last path segment in `join`.
    let base_url = Url::parse(&format!("{}/", base.trim_end_matches('/')))
        .map_err(|e| misconfigured(format!("is not a URL ({e})")))?;
    if !matches!(base_url.scheme(), "http" | "https") {
        return Err(misconfigured("is not an http(s) URL".to_string()));
    }
    let mut url = base_url
        .join(path)
        .map_err(|e| misconfigured(format!("cannot be extended ({e})")))?;
    match provider {
        Provider::Searxng { .. } => {
            url.query_pairs_mut()
                .append_pair("q", query)
                .append_pair("format", "json");
        }
        Provider::Brave { .. } => {
            url.query_pairs_mut()
                .append_pair("q", query)
                .append_pair("count", &max.to_string());
        }
    }
    Ok(url)
}

/// Asks the provider and returns at most `max` results.
async fn search(
    provider: &Provider,
    query: &str,
    max: usize,
    timeout: Duration,
) -> ToolResult<Vec<Hit>> {
    let url = request_url(provider, query, max)?;
    let mut request = client_for(&url)?
        .get(url.clone())
        .header(reqwest::header::ACCEPT, "application/json")
        .timeout(timeout);
    if let Provider::Brave { key, .. } = provider {
        request = request.header("X-Subscription-Token", key);
    }
    let mut resp = request
        .send()
        .await
        .map_err(|e| request_error(&url, &e, timeout))?;
    let status = resp.status();
    let body = td_http::read_capped(&mut resp, MAX_REPLY_BYTES).await;
    let label = provider.label();
    let action = format!("searching with {label}");
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body.bytes);
        let excerpt = clean(&text);
        let excerpt = truncate_to(&excerpt, 300).unwrap_or(&excerpt);
        let hint = match (provider, status.as_u16()) {
            (Provider::Brave { .. }, 401 | 403) => format!(
                "The API key in {BRAVE_KEY_VAR} was refused; the operator must fix it. Meanwhile, use web_fetch on a URL you already know."
            ),
            (Provider::Searxng { .. }, 403) => "The SearXNG instance refuses JSON output; the operator must enable the json format in its settings. Meanwhile, use web_fetch on a URL you already know.".to_string(),
            (_, 429) => "The provider is rate limiting; wait before searching again, or use web_fetch on a URL you already know.".to_string(),
            _ => "Retry later, or use web_fetch on a URL you already know.".to_string(),
        };
        return Err(ToolError::failed(
            action,
            format!("{label} answered HTTP {status}: {excerpt}"),
            hint,
        ));
    }
    if body.truncated {
        return Err(ToolError::failed(
            action,
            format!("the reply is larger than {MAX_REPLY_BYTES} bytes"),
            "Ask for fewer results (max_results) or a more specific query.",
        ));
    }
    if let Some(err) = body.interrupted {
        return Err(ToolError::failed(
            action,
            format!("the reply broke off: {}", error_chain(&err)),
            "Search again.",
        ));
    }
    let malformed = |e: serde_json::Error| {
        ToolError::failed(
            action.clone(),
            format!("the reply is not the JSON {label} should send ({e})"),
            "The provider may be misconfigured or down; retry later, or use web_fetch on a URL you already know.",
        )
    };
    let items: Vec<(Option<String>, Option<String>, Option<String>)> = match provider {
        Provider::Searxng { .. } => serde_json::from_slice::<SearxngReply>(&body.bytes)
            .map_err(malformed)?
            .results
            .into_iter()
            .map(|r| (r.title, r.url, r.content))
            .collect(),
        Provider::Brave { .. } => serde_json::from_slice::<BraveReply>(&body.bytes)
            .map_err(malformed)?
            .web
            .map(|w| w.results)
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.title, r.url, r.description))
            .collect(),
    };
    Ok(items
        .into_iter()
        .filter_map(|(title, url, snippet)| {
            let url = url
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty())?;
            let title = title
                .map(|t| clean(&t))
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| url.clone());
            let snippet = snippet.map(|s| clean(&s)).unwrap_or_default();
            Some(Hit {
                title,
                url,
                snippet,
            })
        })
        .take(max)
        .collect())
}

/// `text` on one line, runs of whitespace collapsed.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Provider text as plain text: highlighting tags and entities removed, on one line.
fn clean(text: &str) -> String {
    let plain = if text.contains('<') {
        strip_tags(text)
    } else {
        decode_entities(text)
    };
    one_line(&plain)
}

/// The numbered result list.
fn render(query: &str, label: &str, hits: &[Hit]) -> String {
    if hits.is_empty() {
        return format!(
            "No results for \"{query}\" ({label}). Try other or fewer words, or web_fetch a URL you already know.\n"
        );
    }
    let mut out = format!("Results for \"{query}\" ({label}):\n");
    for (i, hit) in hits.iter().enumerate() {
        out.push_str(&format!("\n{}. {} — {}\n", i + 1, hit.title, hit.url));
        if !hit.snippet.is_empty() {
            let snippet = match truncate_to(&hit.snippet, SNIPPET_BYTES) {
                Some(cut) => format!("{cut}…"),
                None => hit.snippet.clone(),
            };
            out.push_str(&format!("   {snippet}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::worktree;
    use std::collections::HashMap;
    use std::sync::Arc;
    use td_http::test_server::{Canned, Server, start};
    use td_toolkit::registry::ToolSet;

    fn searx_routes(path: &str) -> Canned {
        let body = json!({
            "query": "q",
            "results": (1..=8).map(|i| json!({
                "title": format!("Result &amp; {i}"),
                "url": format!("https://example.com/{i}"),
                "content": format!("Snippet <b>{i}</b>\nmore")
            })).chain([json!({"title": "no url"})]).collect::<Vec<_>>()
        });
        match path {
            p if p.starts_with("/sub/search?") => {
                Canned::new("200 OK", "application/json", body.to_string())
            }
            p if p.starts_with("/search?q=empty") => {
                Canned::new("200 OK", "application/json", r#"{"results": []}"#)
            }
            p if p.starts_with("/search?q=broken") => {
                Canned::new("200 OK", "application/json", "{\"results\": [ {")
            }
            p if p.starts_with("/search?q=shape") => {
                Canned::new("200 OK", "application/json", r#"{"answers": []}"#)
            }
            p if p.starts_with("/search?q=down") => {
                Canned::new("502 Bad Gateway", "text/html", "<h1>upstream\n down</h1>")
            }
            p if p.starts_with("/search?") => {
                Canned::new("200 OK", "application/json", body.to_string())
            }
            _ => Canned::new("404 Not Found", "text/plain", "no"),
        }
    }

    fn brave_routes(path: &str) -> Canned {
        if !path.starts_with("/res/v1/web/search?") {
            return Canned::new("404 Not Found", "text/plain", "wrong path");
        }
        if path.contains("q=nothing") {
            return Canned::new(
                "200 OK",
                "application/json",
                r#"{"type": "search", "query": {}}"#,
            );
        }
        if path.contains("q=denied") {
            return Canned::new(
                "401 Unauthorized",
                "application/json",
                r#"{"error": "bad token"}"#,
            );
        }
        let body = json!({"web": {"results": [
            {"title": "Tokio <strong>docs</strong>", "url": "https://tokio.rs/", "description": "An <strong>async</strong> runtime"},
            {"title": "", "url": "https://docs.rs/tokio", "description": "é".repeat(300)},
        ]}});
        Canned::new("200 OK", "application/json", body.to_string())
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    async fn call(provider: Option<Provider>, input: Value) -> ToolResult<ToolOutput> {
        let (_dir, ctx) = worktree();
        run(provider, input, &ctx).await
    }

    fn searx(s: &Server) -> Option<Provider> {
        provider_from(env(&[(SEARXNG_URL_VAR, &s.base)]))
    }

    fn brave(s: &Server) -> Option<Provider> {
        provider_from(env(&[
            (BRAVE_KEY_VAR, "secret-key"),
            (BRAVE_URL_VAR, &s.base),
        ]))
    }

    #[tokio::test]
    async fn searxng_results_are_numbered_with_snippets() {
        let s = start(searx_routes).await;
        let out = call(searx(&s), json!({"query": "rust async"}))
            .await
            .unwrap();
        assert!(!out.is_error);
        let c = &out.content;
        assert!(c.starts_with("Results for \"rust async\" (SearXNG):\n\n1. Result & 1 — https://example.com/1\n   Snippet 1 more\n"), "{c}");
        assert!(c.contains("5. Result & 5 — https://example.com/5"));
        assert!(!c.contains("6. "), "default is 5 results: {c}");
        let req = s.requests.lock().unwrap()[0].clone();
        assert!(
            req.starts_with("GET /search?q=rust+async&format=json "),
            "{req}"
        );
    }

    #[tokio::test]
    async fn max_results_limits_and_results_without_url_are_skipped() {
        let s = start(searx_routes).await;
        let out = call(searx(&s), json!({"query": "q", "max_results": 2}))
            .await
            .unwrap();
        assert!(out.content.contains("2. Result & 2"));
        assert!(!out.content.contains("3. "));
        let out = call(searx(&s), json!({"query": "q", "max_results": 20}))
            .await
            .unwrap();
        assert!(out.content.contains("8. Result & 8"));
        assert!(!out.content.contains("9. "), "{}", out.content);
        assert!(!out.content.contains("no url"));
    }

    #[tokio::test]
    async fn searxng_base_with_a_path_keeps_it() {
        let s = start(searx_routes).await;
        let provider = provider_from(env(&[(SEARXNG_URL_VAR, &format!("{}/sub/", s.base))]));
        let out = call(provider, json!({"query": "x"})).await.unwrap();
        assert!(out.content.contains("1. Result & 1"));
        assert!(s.requests.lock().unwrap()[0].starts_with("GET /sub/search?q=x&format=json "));
    }

    #[tokio::test]
    async fn brave_results_use_the_key_and_clean_snippets() {
        let s = start(brave_routes).await;
        let out = call(brave(&s), json!({"query": "tokio", "max_results": 7}))
            .await
            .unwrap();
        let c = &out.content;
        assert!(c.starts_with("Results for \"tokio\" (Brave Search):\n\n1. Tokio docs — https://tokio.rs/\n   An async runtime\n"), "{c}");
        // An empty title falls back to the URL; a long snippet is cut on a char boundary.
        assert!(c.contains("2. https://docs.rs/tokio — https://docs.rs/tokio\n"));
        assert!(c.contains(&format!("   {}…\n", "é".repeat(200))), "{c}");
        let req = s.requests.lock().unwrap()[0].to_lowercase();
        assert!(
            req.starts_with("get /res/v1/web/search?q=tokio&count=7 "),
            "{req}"
        );
        assert!(req.contains("x-subscription-token: secret-key"), "{req}");
    }

    #[tokio::test]
    async fn no_results_is_not_an_error() {
        let s = start(brave_routes).await;
        let out = call(brave(&s), json!({"query": "nothing"})).await.unwrap();
        assert!(!out.is_error);
        assert!(
            out.content
                .starts_with("No results for \"nothing\" (Brave Search)")
        );
        let s = start(searx_routes).await;
        let out = call(searx(&s), json!({"query": "empty"})).await.unwrap();
        assert!(
            out.content
                .starts_with("No results for \"empty\" (SearXNG)")
        );
    }

    #[tokio::test]
    async fn nothing_configured_names_the_variables() {
        assert_eq!(provider_from(env(&[])), None);
        assert_eq!(
            provider_from(env(&[(SEARXNG_URL_VAR, "  "), (BRAVE_URL_VAR, "http://x")])),
            None
        );
        let err = call(None, json!({"query": "x"})).await.unwrap_err();
        assert_eq!(err.kind(), "unavailable");
        let text = err.to_string();
        assert!(
            text.contains(SEARXNG_URL_VAR) && text.contains(BRAVE_KEY_VAR),
            "{text}"
        );
        assert!(text.contains("web_fetch"));
    }

    #[test]
    fn searxng_wins_over_brave_and_brave_has_a_default_base() {
        let both = env(&[(SEARXNG_URL_VAR, "http://s"), (BRAVE_KEY_VAR, "k")]);
        assert_eq!(
            provider_from(both),
            Some(Provider::Searxng {
                base: "http://s".into()
            })
        );
        assert_eq!(
            provider_from(env(&[(BRAVE_KEY_VAR, " k ")])),
            Some(Provider::Brave {
                base: BRAVE_DEFAULT_BASE.into(),
                key: "k".into()
            })
        );
    }

    #[tokio::test]
    async fn provider_http_errors_are_clear() {
        let s = start(searx_routes).await;
        let err = call(searx(&s), json!({"query": "down"})).await.unwrap_err();
        assert_eq!(err.kind(), "failed");
        let text = err.to_string();
        assert!(
            text.contains("SearXNG answered HTTP 502 Bad Gateway: upstream down."),
            "{text}"
        );
        let s = start(brave_routes).await;
        let err = call(brave(&s), json!({"query": "denied"}))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("HTTP 401"));
        assert!(err.to_string().contains(BRAVE_KEY_VAR));
    }

    #[tokio::test]
    async fn malformed_replies_are_clear_errors() {
        let s = start(searx_routes).await;
        for q in ["broken", "shape"] {
            let err = call(searx(&s), json!({"query": q})).await.unwrap_err();
            assert_eq!(err.kind(), "failed");
            assert!(
                err.to_string().contains("not the JSON SearXNG should send"),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn unreachable_provider_and_bad_base_are_errors() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = call(
            Some(Provider::Searxng {
                base: format!("http://{addr}"),
            }),
            json!({"query": "x"}),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), "failed");
        assert!(err.to_string().contains("refused"), "{err}");
        let err = call(
            Some(Provider::Searxng {
                base: "ftp://x".into(),
            }),
            json!({"query": "x"}),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), "unavailable");
        assert!(err.to_string().contains(SEARXNG_URL_VAR));
    }

    #[tokio::test]
    async fn blank_query_and_out_of_range_counts_are_invalid() {
        let err = call(None, json!({"query": "   "})).await.unwrap_err();
        assert!(err.to_string().contains("at /query"));
        let err = call(None, json!({"query": "x", "max_results": 21}))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("at /max_results"));
        let set = ToolSet::from_tools(vec![Arc::new(WebSearch)]).unwrap();
        assert!(
            set.validate(TOOL, &json!({"query": "x", "max_results": 20}))
                .is_ok()
        );
        assert!(
            set.validate(TOOL, &json!({"query": "x", "max_results": 0}))
                .is_err()
        );
        assert!(set.validate(TOOL, &json!({"query": ""})).is_err());
        assert!(set.validate(TOOL, &json!({"query": "x", "n": 1})).is_err());
    }
}
