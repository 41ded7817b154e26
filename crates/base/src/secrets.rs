//! Secrets: which environment variables count as secret, and the process-wide set of secret
//! values that are redacted wherever text leaves the process.
//!
//! Two jobs, one list:
//! - Commands get an environment without secrets (`confine::environment` asks
//!   [`is_secret_name`] and [`is_secret_value`]).
//! - Every known secret value is replaced by `[REDACTED:NAME]` in text that reaches a model,
//!   the run record, progress output or an error message ([`redact`]). A command can still
//!   read a key from a file it may read, or a provider can echo it in an error: redaction is
//!   what keeps that text out of the transcript and away from the model.
//!
//! The set is process-wide because the places that emit text (tool results, record writers,
//! provider errors, progress lines) share nothing else; it only grows.
//!
//! Where text leaves the process, and which function redacts it there:
//! - tool results, their receipts and the input they record: `ToolSet::call` ([`redact`],
//!   [`redact_value`]), before the output is hashed or capped;
//! - model replies and provider errors: `llm::redacting`, around every client a run builds;
//! - the run record and receipt logs: their writers ([`redact_json`] on the serialized line);
//! - progress output, `tool exec` answers and stderr (main's messages and every log line,
//!   through [`RedactingWriter`]).
//!
//! Text is always redacted *before* it is cut: a cut could leave half a secret that no longer
//! matches. Where a cut was made before the text got here (a command's capture keeps its head
//! and tail), [`redact`] also replaces the pieces of a secret on either side of the omission
//! marker.

use std::borrow::Cow;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use serde_json::Value;

/// Shortest value that is registered for redaction. Shorter values would mangle ordinary
/// text ("password: abc"); real keys and tokens are far longer.
pub const MIN_SECRET_LEN: usize = 8;

/// Names (upper-cased) that are secrets whatever their shape.
const SECRET_NAMES: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SESSION_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "SSH_AUTH_SOCK",
    "GITHUB_PAT",
    "DATABASE_URL",
];

/// Suffixes (upper-cased) that make a name secret: `OPENAI_API_KEY`, `GH_TOKEN`, ...
const SECRET_SUFFIXES: &[&str] = &[
    "_KEY", "_TOKEN", "_SECRET", "_APIKEY", "_PAT", "_PASS", "_PWD", "_AUTH",
];

/// Names the suffixes would take for secrets that are not: the shell's working directories
/// (`PWD` ends like `DB_PWD`; registering it would redact every path under the directory the
/// daemon was started in, and withhold it from commands).
const NOT_SECRET_NAMES: &[&str] = &["PWD", "OLDPWD"];

/// Parts (upper-cased) that make a name secret wherever they stand.
const SECRET_PARTS: &[&str] = &["PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "PRIVATE_KEY"];

/// Whether an environment variable called `name` holds a secret by its name: the providers'
/// and web-search keys, tokens, passwords, cloud credentials.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if SECRET_NAMES.contains(&upper.as_str()) {
        return true;
    }
    if NOT_SECRET_NAMES.contains(&upper.as_str()) {
        return false;
    }
    // Names such as `TOKEN` or `API_KEY` alone count too.
    let padded = format!("_{upper}");
    SECRET_SUFFIXES.iter().any(|s| padded.ends_with(s))
        || SECRET_PARTS.iter().any(|p| upper.contains(p))
}

/// A piece of a secret shorter than this, left beside an omission marker, is not replaced:
/// three characters of a key give nothing away, and shorter pieces match ordinary text.
const MIN_FRAGMENT_LEN: usize = 4;

/// One registered secret.
#[derive(Debug, Clone)]
struct Secret {
    value: String,
    /// `value` as it appears inside a JSON string (serde_json's escaping of `"`, `\` and
    /// control characters); equal to `value` for the usual keys.
    escaped: String,
    marker: String,
}

/// Whether any secret was registered: until one is, text is redacted without taking the
/// registry's lock (every tool call redacts its input and output).
static ANY_REGISTERED: AtomicBool = AtomicBool::new(false);

/// The registered secrets, and a searcher that finds in one pass whether a text holds any
/// of them (or an omission marker, whose cut pieces [`redact_cut_fragments`] looks for).
///
/// Why the searcher: every record line, tool input and output, progress line and model
/// request is redacted, and almost none holds a secret. Each secret's own search built its
/// matcher again per text (`str::contains`), 5–6% of the head's CPU in a stream of
/// cross-host queries (benches/hosts.rs). A text the searcher finds nothing in is returned
/// as it is; one it finds something in takes the same steps as before, so what is replaced
/// does not change.
#[derive(Default)]
struct Secrets {
    list: Vec<Secret>,
    /// Over every value, every escaped form and [`OMITTED`]; `None` (before the first secret,
    /// or if it could not be built) sends every text the long way.
    finder: Option<Finder>,
}

/// Finds whether a text holds any of a few patterns.
///
/// Why two kinds: the automaton's own prefilter looks for the patterns' rarest bytes, and a
/// secret made of common letters and digits (a passphrase, `the-hosts-bench-secret-0123…`)
/// has none that are rare in record lines full of hashes, ids and dates: it then checked
/// nearly every position, ~1.8 µs for a 700-byte receipt line, against ~0.07 µs for the
/// SIMD searcher of a few patterns (`packed`, Teddy) whatever the secret. The packed one
/// is used when it can be built (a few dozen patterns, a CPU with SSSE3 or AVX2); the
/// automaton otherwise.
enum Finder {
    Packed(aho_corasick::packed::Searcher),
    Automaton(aho_corasick::AhoCorasick),
}

impl Finder {
    fn new(patterns: &[&str]) -> Option<Finder> {
        let packed = aho_corasick::packed::Config::new()
            .match_kind(aho_corasick::packed::MatchKind::LeftmostFirst)
            .builder()
            .extend(patterns)
            .build();
        match packed {
            Some(searcher) => Some(Finder::Packed(searcher)),
            None => aho_corasick::AhoCorasick::new(patterns)
                .ok()
                .map(Finder::Automaton),
        }
    }

    fn is_match(&self, text: &str) -> bool {
        match self {
            Finder::Packed(searcher) => searcher.find(text).is_some(),
            Finder::Automaton(automaton) => automaton.is_match(text),
        }
    }
}

impl std::ops::Deref for Secrets {
    type Target = [Secret];
    fn deref(&self) -> &[Secret] {
        &self.list
    }
}

impl Secrets {
    /// Whether `text` may hold a secret or an omission marker (`true` when unsure).
    fn may_hold(&self, text: &str) -> bool {
        self.finder.as_ref().is_none_or(|f| f.is_match(text))
    }

    /// Rebuilds the searcher over the list as it is now.
    fn rebuild(&mut self) {
        let mut patterns: Vec<&str> = vec![OMITTED];
        for s in &self.list {
            patterns.push(&s.value);
            if s.escaped != s.value {
                patterns.push(&s.escaped);
            }
        }
        self.finder = Finder::new(&patterns);
    }
}

/// What every omission marker holds ([`omission_marker`]).
const OMITTED: &str = "bytes omitted";

fn registry() -> &'static RwLock<Secrets> {
    static SECRETS: OnceLock<RwLock<Secrets>> = OnceLock::new();
    SECRETS.get_or_init(|| RwLock::new(Secrets::default()))
}

/// Registers `value` as the secret called `name` (a variable name, a file, "api key"):
/// from now on [`redact`] replaces it, and [`is_secret_value`] knows it. Values shorter than
/// [`MIN_SECRET_LEN`] (after trimming) are ignored; registering a value twice keeps the
/// first name.
pub fn register(name: &str, value: &str) {
    let value = value.trim();
    if value.len() < MIN_SECRET_LEN {
        return;
    }
    let mut secrets = registry().write().unwrap_or_else(|e| e.into_inner());
    if secrets.iter().any(|s| s.value == value) {
        return;
    }
    ANY_REGISTERED.store(true, Ordering::Release);
    secrets.list.push(Secret {
        value: value.to_string(),
        escaped: json_escaped(value),
        marker: marker(name),
    });
    // Longest first, so a secret that contains another is replaced whole.
    secrets
        .list
        .sort_by_key(|s| std::cmp::Reverse(s.value.len()));
    secrets.rebuild();
}

/// Registers the value of every variable of this process's environment whose name looks
/// secret ([`is_secret_name`]) or is listed in `extra_names`.
pub fn register_environment(extra_names: &[String]) {
    for (name, value) in std::env::vars_os() {
        let (Some(name), Some(value)) = (name.to_str(), value.to_str()) else {
            continue;
        };
        if is_secret_name(name) || extra_names.iter().any(|n| n == name) {
            register(name, value);
        }
    }
}

/// Whether `value` contains a registered secret.
pub fn is_secret_value(value: &str) -> bool {
    let secrets = registry().read().unwrap_or_else(|e| e.into_inner());
    secrets.iter().any(|s| value.contains(&s.value))
}

/// `text` with every registered secret replaced by `[REDACTED:NAME]`: as it is, as it reads
/// escaped inside a JSON string (text that quotes JSON), and the pieces of one that a head and
/// tail cut left on either side of its omission marker. Borrowed (no copy) when it holds
/// none, which is the common case.
pub fn redact(text: &str) -> Cow<'_, str> {
    if !ANY_REGISTERED.load(Ordering::Acquire) {
        return Cow::Borrowed(text);
    }
    redact_in(text, &registry().read().unwrap_or_else(|e| e.into_inner()))
}

/// [`redact`] with the registered secrets in hand (read once for a whole value).
fn redact_in<'t>(text: &'t str, secrets: &Secrets) -> Cow<'t, str> {
    if !secrets.may_hold(text) {
        return Cow::Borrowed(text);
    }
    let mut out: Cow<'_, str> = Cow::Borrowed(text);
    for secret in secrets.iter() {
        replace_all(&mut out, &secret.value, &secret.marker);
        if secret.escaped != secret.value {
            replace_all(&mut out, &secret.escaped, &secret.marker);
        }
    }
    if let Some(cut) = redact_cut_fragments(&out, secrets) {
        out = Cow::Owned(cut);
    }
    out
}

/// Serialized JSON (one JSONL line, or a whole pretty-printed document) with every
/// registered secret replaced by its marker, for the writers of files: the last line of
/// defence, whatever the serialized value held.
///
/// A string value with a secret reads, in JSON text, as the secret's escaped form (serde_json
/// escapes `"`, `\` and control characters, nothing else), so that form is what is replaced;
/// for a secret without those characters it is the secret itself. The raw form of a secret
/// that has them cannot be the content of a JSON string, so it is not looked for (replacing it
/// would cut through the document's structure). One case is left: an escaped form that starts
/// with a backslash could match from the second backslash of an escaped backslash (`\\`) up
/// into the syntax after the string (`{"a\\":12345678}` holds `\":12345678`), and the
/// replacement would break the document. The result is therefore parsed whenever something
/// was replaced, and a document that no longer parses is redacted value by value instead
/// (written compact).
pub fn redact_json(text: &str) -> Cow<'_, str> {
    if !ANY_REGISTERED.load(Ordering::Acquire) {
        return Cow::Borrowed(text);
    }
    let replaced = {
        let secrets = registry().read().unwrap_or_else(|e| e.into_inner());
        if !secrets.may_hold(text) {
            return Cow::Borrowed(text);
        }
        let mut out: Cow<'_, str> = Cow::Borrowed(text);
        for secret in secrets.iter() {
            replace_all(&mut out, &secret.escaped, &secret.marker);
        }
        out
    };
    let Cow::Owned(redacted) = replaced else {
        return Cow::Borrowed(text);
    };
    if parses(&redacted) || !parses(text) {
        return Cow::Owned(redacted);
    }
    let mut value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => return Cow::Owned(redacted),
    };
    redact_value(&mut value);
    match serde_json::to_string(&value) {
        Ok(rewritten) => Cow::Owned(rewritten),
        Err(_) => Cow::Owned(redacted),
    }
}

/// `value` written as one line of JSON with every registered secret redacted: what
/// [`redact_value`] on its tree, then [`redact_json`] on the tree's text, make of it.
///
/// Why not always that way: it builds a tree of every value and writes it twice, and almost
/// no line holds a secret (every receipt of every tool call is written through here). A
/// string that holds a secret, or a cut one's omission marker, reads in the text as its
/// escaped form, which holds the secret's escaped form (escaping goes character by
/// character) or the marker: so a text in which the one-pass searcher finds none of those is
/// the line as the long way would write it, and is returned as it is. (Only the order of an
/// object's keys may differ: a tree keeps them sorted, the text as `value` writes them.)
pub fn to_redacted_line<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    let line = serde_json::to_string(value)?;
    if !ANY_REGISTERED.load(Ordering::Acquire)
        || !registry()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .may_hold(&line)
    {
        return Ok(line);
    }
    let mut tree = serde_json::to_value(value)?;
    redact_value(&mut tree);
    let line = serde_json::to_string(&tree)?;
    Ok(redact_json(&line).into_owned())
}

/// Redacts every string inside `value` (object keys too), in place; returns whether anything
/// was replaced.
pub fn redact_value(value: &mut Value) -> bool {
    // The secrets are read once for the whole value (every tool call's input comes here);
    // with none registered there is nothing to look for.
    if !ANY_REGISTERED.load(Ordering::Acquire) {
        return false;
    }
    let secrets = registry().read().unwrap_or_else(|e| e.into_inner());
    !secrets.is_empty() && redact_value_in(value, &secrets)
}

/// Redacts every string inside a shared `value` (object keys too); returns whether anything
/// was replaced. The value is copied only when it holds a secret: a tool call's input is
/// shared by the conversation, the call and its receipt, and almost never holds one.
pub fn redact_shared_value(value: &mut Arc<Value>) -> bool {
    if !ANY_REGISTERED.load(Ordering::Acquire) {
        return false;
    }
    let secrets = registry().read().unwrap_or_else(|e| e.into_inner());
    !secrets.is_empty()
        && holds_secret_in(value, &secrets)
        && redact_value_in(Arc::make_mut(value), &secrets)
}

/// Whether any string inside `value` (object keys too) would be redacted.
fn holds_secret_in(value: &Value, secrets: &Secrets) -> bool {
    let redacts = |text: &str| matches!(redact_in(text, secrets), Cow::Owned(_));
    match value {
        Value::String(s) => redacts(s),
        Value::Array(items) => items.iter().any(|item| holds_secret_in(item, secrets)),
        Value::Object(map) => map
            .iter()
            .any(|(key, item)| redacts(key) || holds_secret_in(item, secrets)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

fn redact_value_in(value: &mut Value, secrets: &Secrets) -> bool {
    match value {
        Value::String(s) => match redact_in(s, secrets) {
            Cow::Borrowed(_) => false,
            Cow::Owned(r) => {
                *s = r;
                true
            }
        },
        Value::Array(items) => items.iter_mut().fold(false, |changed, item| {
            redact_value_in(item, secrets) | changed
        }),
        Value::Object(map) => {
            if map
                .keys()
                .any(|k| matches!(redact_in(k, secrets), Cow::Owned(_)))
            {
                // Keys cannot be changed in place: the map is rebuilt, in its order.
                let old = std::mem::take(map);
                for (key, mut item) in old {
                    redact_value_in(&mut item, secrets);
                    let key = match redact_in(&key, secrets) {
                        Cow::Borrowed(_) => key,
                        Cow::Owned(redacted) => redacted,
                    };
                    map.insert(key, item);
                }
                true
            } else {
                map.values_mut().fold(false, |changed, item| {
                    redact_value_in(item, secrets) | changed
                })
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// A writer that redacts what passes through it. Each `write` call is redacted as a whole,
/// so it suits writers that are handed whole messages: tracing's formatter writes each log
/// line with one `write_all`. Bytes that are not UTF-8 pass unchanged.
#[derive(Debug)]
pub struct RedactingWriter<W>(pub W);

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(redact(text).as_bytes())?,
            Err(_) => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

fn replace_all(text: &mut Cow<'_, str>, needle: &str, marker: &str) {
    if text.contains(needle) {
        *text = Cow::Owned(text.replace(needle, marker));
    }
}

fn parses(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// How [`crate::text::head_tail`] and the command capture mark what they left out.
fn omission_marker() -> Option<&'static regex::Regex> {
    static MARKER: OnceLock<Option<regex::Regex>> = OnceLock::new();
    MARKER
        .get_or_init(|| regex::Regex::new(r"\n\[\.\.\. \d+ bytes omitted \.\.\.\]\n").ok())
        .as_ref()
}

/// `text` with the pieces of secrets that end just before, or start just after, an omission
/// marker replaced; `None` when there are none. A cut made before the text was redacted
/// splits a secret the cut went through into a head piece and a tail piece, neither of which
/// the whole value matches.
fn redact_cut_fragments(text: &str, secrets: &[Secret]) -> Option<String> {
    if secrets.is_empty() || !text.contains(OMITTED) {
        return None;
    }
    let marker = omission_marker()?;
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    let mut changed = false;
    for found in marker.find_iter(text) {
        let before = &text[done..found.start()];
        let head = secrets.iter().find_map(|s| {
            longest_piece(s, |k| before.ends_with(&s.value[..k]), |k| k).map(|k| (s, k))
        });
        match head {
            Some((secret, k)) => {
                out.push_str(&before[..before.len() - k]);
                out.push_str(&secret.marker);
                changed = true;
            }
            None => out.push_str(before),
        }
        out.push_str(found.as_str());
        let after = &text[found.end()..];
        let tail = secrets.iter().find_map(|s| {
            let n = s.value.len();
            longest_piece(s, |k| after.starts_with(&s.value[n - k..]), |k| n - k).map(|k| (s, k))
        });
        done = found.end();
        if let Some((secret, k)) = tail {
            out.push_str(&secret.marker);
            done += k;
            changed = true;
        }
    }
    out.push_str(&text[done..]);
    changed.then_some(out)
}

/// The longest proper piece length `k` (at least [`MIN_FRAGMENT_LEN`]) of `secret` for which
/// `fits(k)` holds, where `boundary(k)` is the byte index in the value the piece starts or
/// ends at (pieces are cut on character boundaries, as the cuts are).
fn longest_piece(
    secret: &Secret,
    fits: impl Fn(usize) -> bool,
    boundary: impl Fn(usize) -> usize,
) -> Option<usize> {
    (MIN_FRAGMENT_LEN..secret.value.len())
        .rev()
        .find(|&k| secret.value.is_char_boundary(boundary(k)) && fits(k))
}

/// [`redact`] into an owned string.
pub fn redact_owned(text: String) -> String {
    match redact(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(redacted) => redacted,
    }
}

/// `value` as serde_json writes it inside a JSON string, without the quotes.
fn json_escaped(value: &str) -> String {
    let quoted = Value::String(value.to_string()).to_string();
    quoted[1..quoted.len() - 1].to_string()
}

/// The marker that stands for the secret called `name`. The name is cut to characters that
/// cannot themselves form a secret's value or break JSON.
fn marker(name: &str) -> String {
    let clean: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' '))
        .take(64)
        .collect();
    format!("[REDACTED:{clean}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_secret_registered_later_is_found_by_the_one_pass_search_too() {
        // The searcher is rebuilt at each registration: a text holding only the newest
        // secret (as it is, or escaped in JSON) must not take the fast way out.
        register("FIRST_SEARCH_KEY", "first-search-secret-0001");
        assert_eq!(
            redact("x first-search-secret-0001 y"),
            "x [REDACTED:FIRST_SEARCH_KEY] y"
        );
        register("LATER_SEARCH_KEY", "later\"search\"secret-0002");
        let plain = "a later\"search\"secret-0002 b";
        assert!(!redact(plain).contains("secret-0002"), "{}", redact(plain));
        let line =
            serde_json::to_string(&serde_json::json!({"v": "later\"search\"secret-0002"})).unwrap();
        let redacted = redact_json(&line);
        assert!(!redacted.contains("secret-0002"), "{redacted}");
        // A text holding none is handed back as it is.
        assert!(matches!(redact("nothing to see"), Cow::Borrowed(_)));
        assert!(matches!(redact_json("{\"v\":1}"), Cow::Borrowed(_)));
    }

    #[test]
    fn both_finders_find_each_pattern_anywhere_and_nothing_else() {
        let patterns = [
            "bytes omitted",
            "the-finder-secret-0123",
            "quoted\\\"form-4567",
        ];
        let chosen = Finder::new(&patterns).unwrap();
        // A few patterns get the packed searcher on a CPU that has it.
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("ssse3") {
            assert!(matches!(chosen, Finder::Packed(_)));
        }
        let automaton = Finder::Automaton(aho_corasick::AhoCorasick::new(patterns).unwrap());
        let long = "0123456789abcdef-the-".repeat(60);
        for finder in [chosen, automaton] {
            for p in patterns {
                assert!(finder.is_match(p), "{p}");
                assert!(finder.is_match(&format!("{long}{p}{long}")), "{p}");
                assert!(finder.is_match(&format!("x{p}")), "{p}");
            }
            for text in ["", "the-finder-secret-012", "bytes omitte", long.as_str()] {
                assert!(!finder.is_match(text), "{text}");
            }
        }
    }

    #[test]
    fn each_of_many_secrets_is_redacted() {
        // More patterns than the packed searcher takes: the automaton finds them.
        let values: Vec<String> = (0..150)
            .map(|n| format!("many-secrets-value-{n:04}"))
            .collect();
        for (n, value) in values.iter().enumerate() {
            register(&format!("MANY_{n}"), value);
        }
        let automaton = matches!(
            registry().read().unwrap().finder,
            Some(Finder::Automaton(_))
        );
        assert!(
            automaton,
            "150 secrets and their forms are past the packed searcher"
        );
        for n in [0, 77, 149] {
            let text = format!("before {} after", values[n]);
            assert_eq!(redact(&text), format!("before [REDACTED:MANY_{n}] after"));
        }
    }

    #[test]
    fn a_line_written_redacted_is_what_the_long_way_makes_of_it() {
        // Its own words: the registry is the test binary's, and another test's secrets (`MANY_n`,
        // `…-value-0003`) would also match a cut piece of a shared tail.
        register("LINE_KEY", "line-secret\"zq-only-in-here");
        // The long way: a tree, each string redacted, written, and the text redacted.
        let long_way = |value: &Value| {
            let mut tree = value.clone();
            redact_value(&mut tree);
            redact_json(&serde_json::to_string(&tree).unwrap()).into_owned()
        };
        let secret = "line-secret\"zq-only-in-here";
        let cut = format!(
            "{}\n[... 120 bytes omitted ...]\n{}",
            &secret[..14],
            &secret[14..]
        );
        for value in [
            serde_json::json!({"a": 1, "b": ["plain", {"c": "text"}]}),
            serde_json::json!({"a": format!("x {secret} y")}),
            serde_json::json!({format!("key {secret}"): true}),
            serde_json::json!({"out": cut}),
            serde_json::json!({"out": "a cut of nothing\n[... 9 bytes omitted ...]\nat all"}),
        ] {
            let line = to_redacted_line(&value).unwrap();
            assert_eq!(line, long_way(&value), "{value}");
            assert!(!line.contains("only-in-here"), "{line}");
            assert!(!line.contains("line-secret"), "{line}");
        }
        // A line without one is the value's own text, keys in its order.
        #[derive(serde::Serialize)]
        struct Unsorted {
            z: u8,
            a: &'static str,
        }
        let line = to_redacted_line(&Unsorted {
            z: 1,
            a: "no secret",
        })
        .unwrap();
        assert_eq!(line, r#"{"z":1,"a":"no secret"}"#);
    }

    #[test]
    fn secret_names_by_name_suffix_and_part() {
        for name in [
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "BRAVE_SEARCH_API_KEY",
            "GH_TOKEN",
            "github_token",
            "MY_SECRET",
            "DB_PASSWORD",
            "PGPASSWORD",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "TOKEN",
            "API_KEY",
            "SSH_AUTH_SOCK",
            "DB_PWD",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "PATH",
            "HOME",
            "KEYBOARD",
            "TOKENIZERS_PARALLELISM",
            "LANG",
            "CARGO_HOME",
            "PWD",
            "OLDPWD",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn registered_values_are_redacted_everywhere_and_short_ones_ignored() {
        register("TEST_SECRETS_A_KEY", "sk-unit-test-aaaaaaaaaaaa");
        register("TEST_SECRETS_SHORT", "abc");
        register("TEST_SECRETS_INNER", "unit-test-aaaa");
        let text = "key=sk-unit-test-aaaaaaaaaaaa and abc and unit-test-aaaa.";
        assert_eq!(
            redact(text),
            "key=[REDACTED:TEST_SECRETS_A_KEY] and abc and [REDACTED:TEST_SECRETS_INNER]."
        );
        assert!(is_secret_value("x sk-unit-test-aaaaaaaaaaaa y"));
        assert!(!is_secret_value("abc"));
        assert!(matches!(redact("nothing here"), Cow::Borrowed(_)));
        assert!(is_secret_value("sk-unit-test-aaaaaaaaaaaa"));
    }

    #[test]
    fn secrets_with_json_special_characters_are_found_raw_and_escaped() {
        let secret = "sk-quote\"back\\slash\nline-q1";
        register("TEST_SECRETS_QUOTED", secret);
        let marker = "[REDACTED:TEST_SECRETS_QUOTED]";
        // Plain text, and plain text quoting JSON.
        assert_eq!(redact(&format!("a {secret} b")), format!("a {marker} b"));
        let line = serde_json::json!({"out": format!("x{secret}y")}).to_string();
        assert_eq!(redact(&line), format!("{{\"out\":\"x{marker}y\"}}"));
        // A JSON writer's line: only the escaped form is content; the result still parses.
        let redacted = redact_json(&line);
        assert!(!redacted.contains("sk-quote"), "{redacted}");
        let back: Value = serde_json::from_str(&redacted).unwrap();
        assert_eq!(back["out"], format!("x{marker}y"));
        // Pretty-printed documents escape alike.
        let pretty = serde_json::to_string_pretty(&serde_json::json!({"k": [secret]})).unwrap();
        let redacted = redact_json(&pretty);
        assert!(!redacted.contains("sk-quote"), "{redacted}");
        assert_eq!(
            serde_json::from_str::<Value>(&redacted).unwrap()["k"][0],
            marker
        );
        assert!(matches!(redact_json("{\"a\": 1}"), Cow::Borrowed(_)));
    }

    #[test]
    fn an_escaped_form_matching_across_json_syntax_does_not_break_the_document() {
        // Its escaped form, `\":987654321`, also reads across the end of the key `a\`.
        register("TEST_SECRETS_SYNTAX", "\":987654321");
        let text = r#"{"a\\":987654321}"#;
        let redacted = redact_json(text);
        let back: Value = serde_json::from_str(&redacted).unwrap();
        assert_eq!(back, serde_json::json!({"a\\": 987654321}));
        // As the content of a string it is redacted.
        let line = serde_json::json!({"b": "x\":987654321"}).to_string();
        let back: Value = serde_json::from_str(&redact_json(&line)).unwrap();
        assert_eq!(back["b"], "x[REDACTED:TEST_SECRETS_SYNTAX]");
    }

    #[test]
    fn values_are_redacted_in_every_string_and_key() {
        register("TEST_SECRETS_VALUE", "sk-value-test-v1v1");
        let mut value = serde_json::json!({
            "command": "echo sk-value-test-v1v1",
            "list": [1, "sk-value-test-v1v1", {"sk-value-test-v1v1": true}],
            "n": 3,
        });
        assert!(redact_value(&mut value));
        let m = "[REDACTED:TEST_SECRETS_VALUE]";
        assert_eq!(
            value,
            serde_json::json!({"command": format!("echo {m}"), "list": [1, m, {m: true}], "n": 3})
        );
        assert!(!redact_value(&mut value));
    }

    #[test]
    fn a_shared_value_is_copied_only_when_it_holds_a_secret() {
        register("TEST_SECRETS_SHARED", "sk-shared-test-s2s2");
        let m = "[REDACTED:TEST_SECRETS_SHARED]";
        // Without a secret: nothing replaced, and the value is still the one shared.
        let clean = Arc::new(serde_json::json!({"path": "a.rs", "n": [1, "x"]}));
        let mut held = Arc::clone(&clean);
        assert!(!redact_shared_value(&mut held));
        assert!(Arc::ptr_eq(&held, &clean));
        // A secret anywhere, a key included: the holder gets a redacted copy, and the other
        // holders keep what they had.
        for (original, redacted) in [
            (
                serde_json::json!({"deep": [{"x": "sk-shared-test-s2s2"}]}),
                serde_json::json!({"deep": [{"x": m}]}),
            ),
            (
                serde_json::json!({"sk-shared-test-s2s2": 1}),
                serde_json::json!({m: 1}),
            ),
        ] {
            let shared = Arc::new(original.clone());
            let mut held = Arc::clone(&shared);
            assert!(redact_shared_value(&mut held));
            assert_eq!(*held, redacted);
            assert_eq!(*shared, original);
        }
    }

    #[test]
    fn pieces_of_a_secret_beside_an_omission_marker_are_redacted() {
        let secret = "sk-fragment-test-0123456789";
        register("TEST_SECRETS_FRAGMENT", secret);
        let m = "[REDACTED:TEST_SECRETS_FRAGMENT]";
        let gap = "\n[... 1234 bytes omitted ...]\n";
        let cut = format!("out: {}{gap}{} end", &secret[..9], &secret[9..]);
        assert_eq!(redact(&cut), format!("out: {m}{gap}{m} end"));
        // Pieces too short to tell anything stay; text without a marker is not searched.
        let short = format!("x{}{gap}{}y", &secret[..3], &secret[secret.len() - 3..]);
        assert_eq!(redact(&short), short);
        let whole = format!("{}{gap}", &secret[..9]);
        assert_eq!(redact(&whole), format!("{m}{gap}"));
        assert!(matches!(redact(&secret[..9]), Cow::Borrowed(_)));
    }

    #[test]
    fn the_redacting_writer_redacts_each_write() {
        register("TEST_SECRETS_WRITER", "sk-writer-test-w2w2");
        let mut out = RedactingWriter(Vec::new());
        out.write_all(b"key sk-writer-test-w2w2\n").unwrap();
        out.write_all(&[0xff, 0xfe]).unwrap();
        out.flush().unwrap();
        let mut expected = b"key [REDACTED:TEST_SECRETS_WRITER]\n".to_vec();
        expected.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(out.0, expected);
    }

    #[test]
    fn markers_carry_only_harmless_characters() {
        assert_eq!(marker("A\"B\\C\nD_E"), "[REDACTED:ABCD_E]");
    }
}
