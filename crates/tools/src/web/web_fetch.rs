//! `web_fetch`: fetches one http(s) URL and shows its content as text — HTML reduced to
//! readable text, text and JSON as they are, binary content only described.
//!
//! The body is read as a stream and cut at a byte cap, so memory stays bounded whatever the
//! server sends. Destinations are confined by the context's [`WebAccess`]: by default only
//! public internet addresses are reached (see `web_access`). The HTTP side it shares with
//! `web_search` is in [`super::fetching`] and td-http; the light HTML scanner in
//! [`super::html`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use serde::Deserialize;
use serde_json::{Value, json};

use super::fetching::{client_for, client_unavailable, request_error, request_timeout};
use super::html::{nesting_depth, strip_tags};
use td_base::sync::lock;
use td_base::text::truncate_to;
use td_http::{MAX_REDIRECTS, error_chain};
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::tool::{Tool, ToolOutput};
use td_toolkit::web_access::{GuardedResolver, Refusal, WebAccess, find_refusal, redirect_policy};

const TOOL: &str = "web_fetch";

/// HTML carries much markup per byte of text, so up to this many times `max_bytes` of raw
/// HTML is read before conversion; the text is then cut to `max_bytes`.
const HTML_RAW_FACTOR: usize = 4;

/// Bytes of body text shown with an HTTP error.
const ERROR_EXCERPT_BYTES: usize = 800;

/// Bytes looked at when the content type does not say whether a body is HTML or binary.
const SNIFF_BYTES: usize = 1024;

/// Column width of text rendered from HTML (wide, so that lines rarely wrap).
const HTML_TEXT_WIDTH: usize = 120;

/// The `web_fetch` tool.
pub struct WebFetch;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    url: String,
    max_bytes: Option<u64>,
}

#[async_trait]
impl Tool for WebFetch {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Fetch an http(s) URL and return its content as text. The output starts with the final \
         URL (after redirects), the HTTP status and the content type. HTML is reduced to \
         readable text (links listed as numbered references), text and JSON are returned as \
         they are, binary content (images, PDFs, archives) is only described. Long bodies are \
         cut at max_bytes. HTTP errors (4xx/5xx) come back as errors with a short excerpt of \
         the body. Addresses on this machine or a private network (localhost, 10.x, \
         192.168.x, 169.254.x...) are refused unless the run's configuration allows them. Use \
         web_search first when you do not know the URL."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "url": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Absolute http:// or https:// URL to fetch. Required; other schemes are refused."
                },
                "max_bytes": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Most bytes of content to return (text after HTML conversion). Default and maximum: the catalog output cap of web_fetch (500000 unless configured otherwise)."
                }
            },
            "required": ["url"],
            "additionalProperties": false
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let args: Args = args::parse(TOOL, input)?;
        let spec = ctx.spec(TOOL);
        let cap_max = spec.max_output_bytes;
        let max_bytes = match args.max_bytes {
            None => cap_max,
            Some(0) => return Err(ToolError::invalid(TOOL, "/max_bytes", "must be at least 1")),
            Some(n) if n > cap_max as u64 => {
                return Err(ToolError::invalid(
                    TOOL,
                    "/max_bytes",
                    format!(
                        "{n} is more than the allowed maximum of {cap_max}; pass {cap_max} or less, or omit it for the maximum"
                    ),
                ));
            }
            Some(n) => n as usize,
        };
        let url = parse_http_url(TOOL, "/url", &args.url)?;
        let timeout = request_timeout(spec.timeout_ms);
        fetch(&url, max_bytes, cap_max, timeout, ctx.web_access()).await
    }
}

/// Parses `raw` as an absolute http(s) URL, or explains what is wrong with it.
fn parse_http_url(tool: &str, pointer: &str, raw: &str) -> ToolResult<Url> {
    let url = Url::parse(raw.trim()).map_err(|e| {
        let shown = truncate_to(raw, 200).unwrap_or(raw);
        ToolError::invalid(
            tool,
            pointer,
            format!("'{shown}' is not an absolute URL ({e}); pass a full URL such as https://example.com/page"),
        )
    })?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(ToolError::invalid(
            tool,
            pointer,
            format!(
                "scheme '{other}' is not supported; only http:// and https:// URLs can be fetched"
            ),
        )),
    }
}

/// The client `web_fetch` uses under `access`: with every address allowed, the shared
/// client of [`client_for`]; otherwise one that checks every address it connects to (one
/// per policy for the whole process, so connections are pooled across loops).
fn fetch_client(url: &Url, access: &WebAccess) -> ToolResult<reqwest::Client> {
    type Clients = Vec<(WebAccess, Result<reqwest::Client, String>)>;
    static GUARDED: Mutex<Clients> = Mutex::new(Vec::new());
    if *access == WebAccess::Any {
        return client_for(url);
    }
    let mut clients = lock(&GUARDED);
    if let Some((_, client)) = clients.iter().find(|(a, _)| a == access) {
        return client.clone().map_err(|cause| client_unavailable(&cause));
    }
    let built = td_http::builder()
        // Never through a proxy from the environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY):
        // a proxy resolves the name and connects on our behalf, so the resolver below would
        // never see the address reached, and a proxy inside the private network reaches
        // exactly what this client must not. With `allow-private: true` (the branch above)
        // there is nothing to sidestep, and proxies are honoured as before.
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver::new(access.clone())))
        .redirect(redirect_policy(access.clone(), MAX_REDIRECTS))
        .build()
        .map_err(|e| error_chain(&e));
    clients.push((access.clone(), built.clone()));
    built.map_err(|cause| client_unavailable(&cause))
}

/// The error for a destination the context's [`WebAccess`] refuses, reached from
/// `requested`.
fn refused(mut refusal: Refusal, requested: &Url) -> ToolError {
    let requested_host = requested.host_str().unwrap_or_default();
    if refusal.reached_from.is_none()
        && !refusal
            .host
            .trim_end_matches('.')
            .eq_ignore_ascii_case(requested_host.trim_end_matches('.'))
    {
        refusal.reached_from = Some(requested.to_string());
    }
    ToolError::Unavailable {
        message: refusal.to_string(),
    }
}

/// How a body is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Html,
    Text,
    Binary,
}

/// The media type without parameters, lowercased.
fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// What the content type alone says; `None` when the body has to be sniffed.
fn kind_from_type(content_type: Option<&str>) -> Option<Kind> {
    let mime = essence(content_type?);
    let textual_app = [
        "application/json",
        "application/xml",
        "application/javascript",
        "application/ecmascript",
        "application/x-javascript",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/x-toml",
        "application/x-ndjson",
        "application/sql",
        "application/graphql",
        "application/x-sh",
        "application/x-www-form-urlencoded",
    ];
    if mime == "text/html" || mime == "application/xhtml+xml" {
        Some(Kind::Html)
    } else if mime.is_empty() || mime == "application/octet-stream" || mime == "text/plain" {
        // Often sent for anything: plain text, HTML from a misconfigured server, or binary.
        None
    } else if mime.starts_with("text/")
        || textual_app.contains(&mime.as_str())
        || mime.ends_with("+json")
        || mime.ends_with("+xml")
    {
        Some(Kind::Text)
    } else {
        Some(Kind::Binary)
    }
}

/// Decides from the first bytes: an HTML start tag, binary-looking bytes, or text.
fn sniff(bytes: &[u8], declared_text: bool) -> Kind {
    let head = &bytes[..bytes.len().min(SNIFF_BYTES)];
    let without_bom = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
    let start = without_bom
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(without_bom.len());
    let trimmed = &without_bom[start..];
    let lower: Vec<u8> = trimmed
        .iter()
        .take(64)
        .map(u8::to_ascii_lowercase)
        .collect();
    let html_starts: [&[u8]; 4] = [b"<!doctype html", b"<html", b"<head", b"<body"];
    if html_starts.iter().any(|s| lower.starts_with(s)) {
        return Kind::Html;
    }
    if declared_text {
        return Kind::Text;
    }
    let complete = complete_utf8_len(head);
    if head.contains(&0) || std::str::from_utf8(&head[..complete]).is_err() {
        Kind::Binary
    } else {
        Kind::Text
    }
}

/// Length of the longest prefix of `bytes` that does not end inside a UTF-8 sequence, so a
/// body cut at a byte cap never shows half a character.
fn complete_utf8_len(bytes: &[u8]) -> usize {
    let len = bytes.len();
    // Walk back over at most three continuation bytes to the start of the last character.
    let mut start = len;
    while start > 0 && len - start < 3 && (bytes[start - 1] & 0b1100_0000) == 0b1000_0000 {
        start -= 1;
    }
    if start == 0 {
        return len;
    }
    let lead = bytes[start - 1];
    let needed = match lead {
        0x00..=0x7F => return len,
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => return len, // not a lead byte: invalid anyway, leave it to lossy decoding
    };
    let have = len - (start - 1);
    if have < needed { start - 1 } else { len }
}

/// The body as text, dropping a character cut in half at the end.
fn decode(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..complete_utf8_len(bytes)]).into_owned()
}

/// Deepest element nesting html2text is given; deeper pages are only stripped of tags,
/// because html5ever's parse time grows with the square of the depth.
const MAX_HTML_DEPTH: usize = 512;

/// HTML reduced to readable text; on failure, the raw markup with a note.
async fn html_to_text(html: Vec<u8>, base: &Url) -> String {
    if nesting_depth(&html) > MAX_HTML_DEPTH {
        let text = tokio::task::spawn_blocking(move || strip_tags(&decode(&html)))
            .await
            .unwrap_or_default();
        return format!(
            "[the page nests too deeply to lay out; showing its text without structure]\n{text}"
        );
    }
    let converted = tokio::task::spawn_blocking(move || {
        let result = html2text::config::plain()
            .allow_width_overflow()
            .string_from_read(html.as_slice(), HTML_TEXT_WIDTH);
        (result, html)
    })
    .await;
    match converted {
        Ok((Ok(text), _)) => absolute_links(&tidy_lines(&text), base),
        Ok((Err(e), html)) => format!(
            "[the HTML could not be converted to text ({e}); showing it raw]\n{}",
            decode(&html)
        ),
        Err(e) => format!("[the HTML could not be converted to text ({e})]"),
    }
}

/// Rewrites the link references html2text lists (`[3]: /docs`) as absolute URLs, so the
/// model can pass them to web_fetch as they are.
fn absolute_links(text: &str, base: &Url) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let rewritten = line
            .strip_prefix('[')
            .and_then(|rest| rest.split_once("]: "))
            .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|(n, target)| {
                let target = target.trim_end();
                let joined = base.join(target).ok()?;
                let nl = if line.ends_with('\n') { "\n" } else { "" };
                Some(format!("[{n}]: {joined}{nl}"))
            });
        match rewritten {
            Some(r) => out.push_str(&r),
            None => out.push_str(line),
        }
    }
    out
}

/// Trims trailing spaces and collapses runs of blank lines left by layout markup.
fn tidy_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            if blank_run > 1 || out.is_empty() {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// Counts the bytes of a body without keeping them, up to `cap`.
async fn count_capped(resp: &mut reqwest::Response, cap: usize) -> (usize, bool) {
    let mut n = 0usize;
    while let Ok(Some(chunk)) = resp.chunk().await {
        n = n.saturating_add(chunk.len());
        if n > cap {
            return (cap, true);
        }
    }
    (n, false)
}

/// The first lines of every answer: where the content came from and what it is.
fn header(final_url: &Url, requested: &Url, status: reqwest::StatusCode, ct: &str) -> String {
    let redirected = if final_url != requested {
        format!(" (redirected from {requested})")
    } else {
        String::new()
    };
    let reason = status.canonical_reason().unwrap_or("");
    format!(
        "URL: {final_url}{redirected}\nStatus: {} {reason}\nContent-Type: {ct}\n",
        status.as_u16()
    )
    .replace(" \n", "\n")
}

/// The body's content rendered as text of at most `max_bytes`, plus notes on what was cut.
async fn render_body(
    resp: &mut reqwest::Response,
    base: &Url,
    content_type: Option<&str>,
    max_bytes: usize,
) -> (Kind, String, Vec<String>) {
    let declared = kind_from_type(content_type);
    let mut notes = Vec::new();
    if declared == Some(Kind::Binary) {
        let shown_type = content_type.map(essence).unwrap_or_default();
        let size = match resp.content_length() {
            Some(n) => format!("{n} bytes"),
            None => match count_capped(resp, max_bytes).await {
                (n, false) => format!("{n} bytes"),
                (n, true) => format!("more than {n} bytes"),
            },
        };
        return (
            Kind::Binary,
            format!("binary content of type {shown_type}, {size}, not shown."),
            notes,
        );
    }
    let may_be_html = matches!(declared, Some(Kind::Html) | None);
    let raw_cap = if may_be_html {
        max_bytes.saturating_mul(HTML_RAW_FACTOR)
    } else {
        max_bytes
    };
    let mut body = td_http::read_capped(resp, raw_cap).await;
    let declared_text = content_type.map(essence).as_deref() == Some("text/plain");
    let kind = declared.unwrap_or_else(|| sniff(&body.bytes, declared_text));
    if kind == Kind::Binary {
        let shown_type = content_type
            .map(essence)
            .unwrap_or_else(|| "unknown".into());
        let more = if body.truncated { "more than " } else { "" };
        return (
            Kind::Binary,
            format!(
                "binary content of type {shown_type}, {more}{} bytes, not shown.",
                body.bytes.len()
            ),
            notes,
        );
    }
    if kind != Kind::Html && body.bytes.len() > max_bytes {
        body.bytes.truncate(max_bytes);
        body.truncated = true;
    }
    let read = body.bytes.len();
    let raw_truncated = body.truncated;
    let interrupted = body.interrupted.take().map(|e| error_chain(&e));
    let mut text = if kind == Kind::Html {
        html_to_text(body.bytes, base).await
    } else {
        decode(&body.bytes)
    };
    let mut text_cut = false;
    if let Some(cut) = truncate_to(&text, max_bytes) {
        text = cut.to_string();
        text_cut = true;
    }
    if raw_truncated || text_cut {
        let what = if kind == Kind::Html && !raw_truncated {
            format!("the page's text is longer than max_bytes={max_bytes}")
        } else {
            format!("only the first {read} bytes of the body were read (max_bytes={max_bytes})")
        };
        notes.push(format!(
            "[cut: {what}. Pass a larger max_bytes, or fetch a more specific URL.]"
        ));
    }
    if let Some(err) = interrupted {
        notes.push(format!(
            "[the transfer broke after {read} bytes ({err}); the content above may be incomplete. Fetch again to retry.]"
        ));
    }
    if text.trim().is_empty() {
        text = "(empty body)".to_string();
    }
    (kind, text, notes)
}

/// Fetches `url`, reaching only what `access` allows, and renders the answer.
async fn fetch(
    url: &Url,
    max_bytes: usize,
    cap_max: usize,
    timeout: Duration,
    access: &WebAccess,
) -> ToolResult<ToolOutput> {
    // The client connects to an IP literal without resolving it, so the resolver's check
    // never sees it: check it here (redirect hops are checked by the redirect policy).
    access
        .check_literal(url)
        .map_err(|refusal| refused(refusal, url))?;
    let client = fetch_client(url, access)?;
    let mut resp = client
        .get(url.clone())
        .header(
            reqwest::header::ACCEPT,
            "text/html, text/plain;q=0.9, application/json;q=0.9, */*;q=0.5",
        )
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| match find_refusal(&e) {
            Some(refusal) => refused(refusal.clone(), url),
            None => request_error(url, &e, timeout),
        })?;
    let status = resp.status();
    let final_url = resp.url().clone();
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let shown_ct = content_type.clone().unwrap_or_else(|| "(none)".to_string());
    let mut content = header(&final_url, url, status, &shown_ct);

    if status.is_client_error() || status.is_server_error() {
        let (_, text, _) = render_body(
            &mut resp,
            &final_url,
            content_type.as_deref(),
            ERROR_EXCERPT_BYTES,
        )
        .await;
        let hint = match status.as_u16() {
            401 | 403 => "The page needs access you do not have; use another source.",
            404 | 410 => {
                "The page does not exist; check the URL or find the right one with web_search."
            }
            429 => "The site is rate limiting; wait before retrying or use another source.",
            s if s >= 500 => "The server failed; retry later or use another source.",
            _ => "The request was refused; check the URL or use another source.",
        };
        content.push_str(&format!(
            "\nHTTP error {} {}. Body excerpt:\n{}\n\n{hint}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            text.trim_end()
        ));
        return Ok(ToolOutput {
            content,
            is_error: true,
            effects: Vec::new(),
        });
    }

    let (kind, mut text, mut notes) =
        render_body(&mut resp, &final_url, content_type.as_deref(), max_bytes).await;
    // The whole answer must fit the catalog cap, or the registry would cut it in the middle.
    let overhead = content.len() + notes.iter().map(|n| n.len() + 1).sum::<usize>() + 400;
    let room = cap_max.saturating_sub(overhead);
    if let Some(cut) = truncate_to(&text, room) {
        text = cut.to_string();
        if !notes.iter().any(|n| n.starts_with("[cut:")) {
            notes.insert(0, format!("[cut: the answer is limited to {cap_max} bytes in all. Fetch a more specific URL.]"));
        }
    }
    content.push('\n');
    content.push_str(text.trim_end());
    content.push('\n');
    for note in notes {
        content.push_str(&note);
        content.push('\n');
    }
    if kind == Kind::Binary {
        content.push_str(&format!(
            "web_fetch only shows text (HTML, plain text, JSON; up to {cap_max} bytes). Look for a text or HTML version of this resource.\n"
        ));
    }
    Ok(ToolOutput::text(content))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{peak_rss_kib, run_isolated, with_limits, worktree};
    use td_http::test_server::{Canned, start};
    use td_toolkit::catalog::ToolSpecOverride;
    use td_toolkit::registry::ToolSet;
    use td_toolkit::web_access::AllowedHost;

    fn routes(path: &str) -> Canned {
        match path {
            "/page" => Canned::new(
                "200 OK",
                "text/html; charset=utf-8",
                "<!doctype html><html><head><title>T</title><style>.x{color:red}</style>\
                 <script>var secret = 1;</script></head><body><h1>Hello héllo</h1>\
                 <p>First <b>para</b>.</p><p>See <a href=\"/docs\">the docs</a>.</p></body></html>",
            ),
            "/sniffed" => Canned {
                headers: vec![],
                ..Canned::new("200 OK", "", "  <HTML><body><p>no type</p></body></html>")
            },
            "/plain" => Canned::new("200 OK", "text/plain", "line one\n<b>not a tag</b>\n"),
            "/json" => Canned::new("200 OK", "application/json", "{\"a\": [1, 2]}"),
            "/png" => Canned::new("200 OK", "image/png", vec![0x89, b'P', b'N', b'G', 0, 0]),
            "/octet" => Canned::new("200 OK", "application/octet-stream", vec![1, 0, 2, 0xff]),
            "/missing" => Canned::new(
                "404 Not Found",
                "text/html",
                "<html><body><p>No such page here</p></body></html>",
            ),
            "/boom" => Canned::new("503 Service Unavailable", "text/plain", "x".repeat(5000)),
            "/big" => Canned {
                repeat: 5 * 1024,
                ..Canned::new("200 OK", "text/plain", "é".repeat(512))
            },
            "/bightml" => Canned {
                repeat: 50_000,
                ..Canned::new("200 OK", "text/html", "<p>para</p>\n")
            },
            "/huge" => Canned {
                repeat: 64 * 1024,
                ..Canned::new("200 OK", "text/plain", "z".repeat(1024))
            },
            "/medium" => Canned::new("200 OK", "text/plain", "m".repeat(1800)),
            "/empty" => Canned::new("200 OK", "text/plain", ""),
            "/redirect" => Canned {
                headers: vec![("Location".into(), "/plain".into())],
                ..Canned::new("302 Found", "text/plain", "")
            },
            "/loop" => Canned {
                headers: vec![("Location".into(), "/loop".into())],
                ..Canned::new("302 Found", "text/plain", "")
            },
            _ => Canned::new("500 Internal Server Error", "text/plain", "unrouted"),
        }
    }

    /// Calls web_fetch with every address allowed: the test servers listen on 127.0.0.1.
    async fn call(url: &str, max_bytes: Option<u64>) -> ToolResult<ToolOutput> {
        call_with(url, max_bytes, WebAccess::Any).await
    }

    async fn call_with(
        url: &str,
        max_bytes: Option<u64>,
        access: WebAccess,
    ) -> ToolResult<ToolOutput> {
        let (_dir, ctx) = worktree();
        let mut input = json!({ "url": url });
        if let Some(m) = max_bytes {
            input["max_bytes"] = json!(m);
        }
        WebFetch.execute(input, &ctx.with_web_access(access)).await
    }

    fn allow(hosts: &[&str]) -> WebAccess {
        WebAccess::PublicAnd(
            hosts
                .iter()
                .map(|h| AllowedHost::parse(h).unwrap())
                .collect(),
        )
    }

    fn port(s: &td_http::test_server::Server) -> u16 {
        s.base.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Asserts that `err` is web_fetch's refusal of a private address, naming `needle`.
    fn assert_refused(err: &ToolError, needle: &str) {
        assert_eq!(err.kind(), "unavailable", "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with("web_fetch refuses private and loopback addresses: "),
            "{text}"
        );
        assert!(text.contains(needle), "{needle}: {text}");
        assert!(text.contains("`web: {allow-private: true}`"), "{text}");
    }

    #[tokio::test]
    async fn loopback_literals_are_refused_by_default_in_every_spelling() {
        let s = start(routes).await;
        let p = port(&s);
        for (url, shown) in [
            (
                format!("http://127.0.0.1:{p}/plain"),
                "127.0.0.1 (loopback)",
            ),
            (
                format!("http://2130706433:{p}/plain"),
                "127.0.0.1 (loopback)",
            ),
            (format!("http://0x7f.1:{p}/plain"), "127.0.0.1 (loopback)"),
            (format!("http://127.1:{p}/plain"), "127.0.0.1 (loopback)"),
            (
                format!("http://[::ffff:127.0.0.1]:{p}/plain"),
                "::ffff:127.0.0.1 (loopback: 127.0.0.1 in IPv4-mapped form)",
            ),
            (
                format!("http://[::ffff:7f00:1]:{p}/plain"),
                "::ffff:127.0.0.1 (loopback",
            ),
            (
                "http://169.254.169.254/latest/meta-data/".to_string(),
                "169.254.169.254 (link-local)",
            ),
            ("http://[::]:9/".to_string(), ":: (unspecified)"),
        ] {
            let err = call_with(&url, None, WebAccess::PublicOnly)
                .await
                .unwrap_err();
            assert_refused(&err, shown);
        }
        assert!(s.requests.lock().unwrap().is_empty(), "nothing was sent");
        // The same server, allowed: it answers.
        let out = call(&format!("http://127.0.0.1:{p}/plain"), None)
            .await
            .unwrap();
        assert!(out.content.contains("line one"));
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_after_resolution() {
        let s = start(routes).await;
        let url = format!("http://localhost:{}/plain", port(&s));
        let err = call_with(&url, None, WebAccess::PublicOnly)
            .await
            .unwrap_err();
        assert_refused(&err, "localhost resolves only to ");
        assert!(err.to_string().contains("127.0.0.1 (loopback)"), "{err}");
        assert!(!err.to_string().contains("redirect"), "{err}");
        assert!(s.requests.lock().unwrap().is_empty());
        // Listed by name, it is reached; its address is not listed and stays refused.
        let out = call_with(&url, None, allow(&["localhost"])).await.unwrap();
        assert!(out.content.contains("line one"));
        let literal = format!("http://127.0.0.1:{}/plain", port(&s));
        let err = call_with(&literal, None, allow(&["localhost"]))
            .await
            .unwrap_err();
        assert_refused(&err, "127.0.0.1 (loopback)");
        let out = call_with(&literal, None, allow(&["127.0.0.1"]))
            .await
            .unwrap();
        assert!(out.content.contains("line one"));
    }

    #[tokio::test]
    async fn every_redirect_hop_is_checked() {
        let target = start(routes).await;
        let tp = port(&target);
        let hops = start(move |path: &str| {
            let location = match path {
                "/to-literal" => format!("http://127.0.0.1:{tp}/plain"),
                "/to-name" => format!("http://localhost:{tp}/plain"),
                _ => "/nowhere".to_string(),
            };
            Canned {
                headers: vec![("Location".into(), location)],
                ..Canned::new("302 Found", "text/plain", "")
            }
        })
        .await;
        let hp = port(&hops);

        // Allowed host (by name) redirecting to an address that is not on the list.
        let from = format!("http://localhost:{hp}/to-literal");
        let err = call_with(&from, None, allow(&["localhost"]))
            .await
            .unwrap_err();
        assert_refused(&err, "127.0.0.1 (loopback)");
        assert!(
            err.to_string()
                .contains(&format!("reached through a redirect from {from}")),
            "{err}"
        );
        // Allowed host (by address) redirecting to a name that resolves to loopback.
        let from = format!("http://127.0.0.1:{hp}/to-name");
        let err = call_with(&from, None, allow(&["127.0.0.1"]))
            .await
            .unwrap_err();
        assert_refused(&err, "localhost resolves only to ");
        assert!(
            err.to_string()
                .contains(&format!("reached through a redirect from {from}")),
            "{err}"
        );
        assert!(target.requests.lock().unwrap().is_empty(), "never reached");
        assert_eq!(hops.requests.lock().unwrap().len(), 2);

        // A redirect that stays on the list is followed.
        let out = call_with(
            &format!("http://localhost:{hp}/to-name"),
            None,
            allow(&["localhost"]),
        )
        .await
        .unwrap();
        assert!(out.content.contains("line one"), "{}", out.content);
        assert!(
            out.content.starts_with(&format!(
                "URL: http://localhost:{tp}/plain (redirected from"
            )),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn html_becomes_text_without_tags_scripts_or_styles() {
        let s = start(routes).await;
        let out = call(&format!("{}/page", s.base), None).await.unwrap();
        assert!(!out.is_error);
        let c = &out.content;
        assert!(
            c.starts_with(&format!(
                "URL: {}/page\nStatus: 200 OK\nContent-Type: text/html; charset=utf-8\n",
                s.base
            )),
            "{c}"
        );
        assert!(c.contains("Hello héllo"), "{c}");
        assert!(c.contains("First **para**."), "{c}");
        assert!(c.contains("See [the docs][1]."), "{c}");
        // Relative links are made absolute so that they can be fetched next.
        assert!(c.contains(&format!("[1]: {}/docs\n", s.base)), "{c}");
        assert!(!c.contains("<p>") && !c.contains("<b>"), "{c}");
        assert!(!c.contains("secret") && !c.contains("color:red"), "{c}");
        assert!(out.effects.is_empty());
    }

    #[tokio::test]
    async fn html_without_content_type_is_sniffed() {
        let s = start(routes).await;
        let out = call(&format!("{}/sniffed", s.base), None).await.unwrap();
        assert!(
            out.content.contains("Content-Type: (none)"),
            "{}",
            out.content
        );
        assert!(out.content.contains("no type"));
        assert!(!out.content.contains("<p>"));
    }

    #[tokio::test]
    async fn plain_text_and_json_pass_through() {
        let s = start(routes).await;
        let out = call(&format!("{}/plain", s.base), None).await.unwrap();
        assert!(
            out.content.ends_with("\nline one\n<b>not a tag</b>\n"),
            "{}",
            out.content
        );
        let out = call(&format!("{}/json", s.base), None).await.unwrap();
        assert!(
            out.content
                .contains("Content-Type: application/json\n\n{\"a\": [1, 2]}\n")
        );
    }

    #[tokio::test]
    async fn binary_is_described_not_shown() {
        let s = start(routes).await;
        let out = call(&format!("{}/png", s.base), None).await.unwrap();
        assert!(!out.is_error);
        assert!(
            out.content
                .contains("binary content of type image/png, 6 bytes, not shown"),
            "{}",
            out.content
        );
        assert!(!out.content.contains("PNG"));
        let out = call(&format!("{}/octet", s.base), None).await.unwrap();
        assert!(
            out.content
                .contains("binary content of type application/octet-stream, 4 bytes, not shown"),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn http_404_is_an_error_with_status_and_excerpt() {
        let s = start(routes).await;
        let out = call(&format!("{}/missing", s.base), None).await.unwrap();
        assert!(out.is_error);
        assert!(out.content.contains("Status: 404 Not Found"));
        assert!(out.content.contains("HTTP error 404 Not Found"));
        assert!(out.content.contains("No such page here"));
        assert!(!out.content.contains("<p>"));
        assert!(out.content.contains("web_search"));
    }

    #[tokio::test]
    async fn http_5xx_excerpt_is_short() {
        let s = start(routes).await;
        let out = call(&format!("{}/boom", s.base), None).await.unwrap();
        assert!(out.is_error);
        assert!(out.content.contains("HTTP error 503"));
        assert!(
            out.content.len() < ERROR_EXCERPT_BYTES + 600,
            "{}",
            out.content.len()
        );
        assert!(out.content.contains("retry later"));
    }

    #[tokio::test]
    async fn five_megabytes_are_cut_at_the_cap_on_a_char_boundary() {
        let s = start(routes).await;
        // 1001 is odd, so the cap falls inside a two-byte 'é'.
        let out = call(&format!("{}/big", s.base), Some(1001)).await.unwrap();
        assert!(!out.is_error);
        let body = out.content.split_once("\n\n").unwrap().1;
        let text = body.lines().next().unwrap();
        assert_eq!(text, "é".repeat(500));
        assert!(
            out.content
                .contains("only the first 1001 bytes of the body were read (max_bytes=1001)"),
            "{}",
            out.content
        );
        assert!(out.content.len() < 1001 + 400);
    }

    #[tokio::test]
    async fn a_huge_body_does_not_raise_peak_memory_much() {
        // Peak memory is per process: measure where no other test allocates meanwhile.
        if !run_isolated("web::web_fetch::tests::a_huge_body_does_not_raise_peak_memory_much") {
            return;
        }
        let s = start(routes).await;
        // A first small fetch sets up the client (TLS roots and all), which is not the body.
        call(&format!("{}/plain", s.base), None).await.unwrap();
        let before = peak_rss_kib();
        let out = call(&format!("{}/huge", s.base), None).await.unwrap();
        let after = peak_rss_kib();
        assert!(out.content.contains("[cut:"));
        if let (Some(before), Some(after)) = (before, after) {
            eprintln!("peak RSS before {before} KiB, after {after} KiB");
            // 64 MiB were offered; keeping ~0.5 MB must not cost anywhere near that.
            assert!(
                after.saturating_sub(before) < 16 * 1024,
                "{before} -> {after}"
            );
        }
    }

    #[tokio::test]
    async fn default_cap_is_the_catalog_maximum() {
        let s = start(routes).await;
        let out = call(&format!("{}/big", s.base), None).await.unwrap();
        let cap = td_toolkit::catalog::Catalog::default()
            .spec(TOOL)
            .max_output_bytes;
        assert!(out.content.contains(&format!("max_bytes={cap}")));
        // Header and notes included, the answer fits the cap, so the registry never cuts it.
        assert!(out.content.len() <= cap, "{}", out.content.len());
        assert!(out.content.len() > cap - 1000);
    }

    #[tokio::test]
    async fn a_silent_server_times_out_with_the_url_named() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock); // never answer
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let limits = ToolSpecOverride {
            timeout_ms: Some(300),
            ..Default::default()
        };
        let ctx = with_limits(dir.path(), TOOL, limits).with_web_access(WebAccess::Any);
        let input = json!({"url": format!("http://{addr}/slow")});
        let err = WebFetch.execute(input, &ctx).await.unwrap_err();
        assert_eq!(err.kind(), "timeout");
        assert!(
            err.to_string()
                .contains(&format!("fetching http://{addr}/slow")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_configured_cap_bounds_the_whole_answer() {
        let s = start(routes).await;
        let dir = tempfile::tempdir().unwrap();
        let limits = ToolSpecOverride {
            max_output_bytes: Some(2000),
            ..Default::default()
        };
        let ctx = with_limits(dir.path(), TOOL, limits).with_web_access(WebAccess::Any);
        let input = json!({"url": format!("{}/medium", s.base)});
        let out = WebFetch.execute(input, &ctx).await.unwrap();
        assert!(out.content.len() <= 2000, "{}", out.content.len());
        assert!(out.content.contains("mmmm"));
        assert!(
            out.content
                .contains("[cut: the answer is limited to 2000 bytes in all")
        );
        let input = json!({"url": format!("{}/medium", s.base), "max_bytes": 2001});
        let err = WebFetch.execute(input, &ctx).await.unwrap_err();
        assert!(err.to_string().contains("allowed maximum of 2000"), "{err}");
    }

    #[tokio::test]
    async fn long_html_text_is_cut_to_max_bytes() {
        let s = start(routes).await;
        let out = call(&format!("{}/bightml", s.base), Some(2000))
            .await
            .unwrap();
        let body = out.content.split_once("\n\n").unwrap().1;
        assert!(body.contains("para"));
        assert!(!body.contains("<p>"));
        assert!(out.content.contains("[cut:"), "{}", out.content);
        assert!(out.content.len() < 2000 + 400);
    }

    #[tokio::test]
    async fn empty_body_says_so() {
        let s = start(routes).await;
        let out = call(&format!("{}/empty", s.base), None).await.unwrap();
        assert!(out.content.ends_with("\n(empty body)\n"), "{}", out.content);
    }

    #[tokio::test]
    async fn redirect_reports_the_final_url() {
        let s = start(routes).await;
        let out = call(&format!("{}/redirect", s.base), None).await.unwrap();
        assert!(
            out.content.starts_with(&format!(
                "URL: {0}/plain (redirected from {0}/redirect)\nStatus: 200 OK",
                s.base
            )),
            "{}",
            out.content
        );
        assert!(out.content.contains("line one"));
    }

    #[tokio::test]
    async fn redirect_loop_is_a_clear_error() {
        let s = start(routes).await;
        let err = call(&format!("{}/loop", s.base), None).await.unwrap_err();
        assert_eq!(err.kind(), "failed");
        assert!(err.to_string().contains("redirects"), "{err}");
        // The same through the client that checks every hop.
        let err = call_with(&format!("{}/loop", s.base), None, allow(&["127.0.0.1"]))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "failed");
        assert!(
            err.to_string()
                .contains("too many redirects (more than 10)"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn bad_scheme_and_bad_url_are_invalid_arguments() {
        for url in [
            "file:///etc/passwd",
            "ftp://example.com/x",
            "not a url",
            "javascript:alert(1)",
        ] {
            let err = call(url, None).await.unwrap_err();
            assert_eq!(err.kind(), "invalid_arguments", "{url}");
            assert!(err.to_string().contains("at /url"), "{err}");
        }
        let err = call("file:///etc/passwd", None).await.unwrap_err();
        assert!(err.to_string().contains("scheme 'file'"));
    }

    #[tokio::test]
    async fn max_bytes_above_the_catalog_cap_is_refused() {
        let err = call("http://127.0.0.1:9/", Some(10_000_000))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(err.to_string().contains("at /max_bytes"));
        let err = call("http://127.0.0.1:9/", Some(0)).await.unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
    }

    #[tokio::test]
    async fn connection_refused_is_a_clear_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = call(&format!("http://{addr}/x"), None).await.unwrap_err();
        assert_eq!(err.kind(), "failed");
        let text = err.to_string();
        assert!(
            text.contains(&format!("fetching http://{addr}/x")),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
        assert!(text.contains("try another source"));
    }

    #[tokio::test]
    async fn schema_accepts_good_input_and_rejects_bad() {
        let set = ToolSet::from_tools(vec![Arc::new(WebFetch)]).unwrap();
        assert!(set.validate(TOOL, &json!({"url": "https://a.b/"})).is_ok());
        assert!(
            set.validate(TOOL, &json!({"url": "https://a.b/", "max_bytes": 0}))
                .is_err()
        );
        assert!(
            set.validate(TOOL, &json!({"url": "https://a.b/", "extra": 1}))
                .is_err()
        );
        assert!(set.validate(TOOL, &json!({})).is_err());
        assert!(WebFetch.read_only());
    }

    #[test]
    fn utf8_prefix_drops_only_a_cut_character() {
        let s = "aé€😀".as_bytes();
        assert_eq!(complete_utf8_len(s), s.len());
        for cut in 0..s.len() {
            let n = complete_utf8_len(&s[..cut]);
            assert!(std::str::from_utf8(&s[..n]).is_ok(), "cut {cut}");
            assert!(cut - n < 4);
        }
        assert_eq!(complete_utf8_len(&s[..2]), 1);
    }

    #[test]
    fn kinds_from_types_and_sniffing() {
        assert_eq!(
            kind_from_type(Some("TEXT/HTML; charset=x")),
            Some(Kind::Html)
        );
        assert_eq!(
            kind_from_type(Some("application/problem+json")),
            Some(Kind::Text)
        );
        assert_eq!(kind_from_type(Some("text/csv")), Some(Kind::Text));
        assert_eq!(kind_from_type(Some("application/pdf")), Some(Kind::Binary));
        assert_eq!(kind_from_type(Some("text/plain")), None);
        assert_eq!(kind_from_type(None), None);
        assert_eq!(sniff(b"\xEF\xBB\xBF <!DOCTYPE html>", false), Kind::Html);
        assert_eq!(sniff(b"<b>x</b>", true), Kind::Text);
        assert_eq!(sniff(b"\x00\x01", false), Kind::Binary);
        assert_eq!(sniff(b"\xff\xfe\xfd", false), Kind::Binary);
        assert_eq!(sniff("plain é".as_bytes(), false), Kind::Text);
        assert_eq!(sniff(b"", false), Kind::Text);
    }

    #[test]
    fn link_references_become_absolute() {
        let base = Url::parse("http://h.example/a/b.html").unwrap();
        let text = "Body [1] and [x]: y\n[1]: c.html\n[2]: https://o.example/z\n[12]: /root";
        assert_eq!(
            absolute_links(text, &base),
            "Body [1] and [x]: y\n[1]: http://h.example/a/c.html\n[2]: https://o.example/z\n[12]: http://h.example/root"
        );
    }

    #[tokio::test]
    async fn deeply_nested_html_does_not_crash() {
        let base = Url::parse("http://h.example/").unwrap();
        // html5ever needs time quadratic in the nesting depth (100 s for 50 000 levels in a
        // debug build), so such pages take the plain tag-stripping path instead.
        let depth = 200_000;
        let html = format!(
            "{}deep &amp; deeper{}",
            "<div>".repeat(depth),
            "</div>".repeat(depth)
        );
        let started = std::time::Instant::now();
        let text = html_to_text(html.into_bytes(), &base).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            text.contains("deep & deeper"),
            "{}",
            &text[..text.len().min(300)]
        );
        assert!(text.contains("nests too deeply"));
    }
}
