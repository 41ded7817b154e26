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

use std::borrow::Cow;
use std::sync::{OnceLock, RwLock};

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

/// Parts (upper-cased) that make a name secret wherever they stand.
const SECRET_PARTS: &[&str] = &["PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "PRIVATE_KEY"];

/// Whether an environment variable called `name` holds a secret by its name: the providers'
/// and web-search keys, tokens, passwords, cloud credentials.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if SECRET_NAMES.contains(&upper.as_str()) {
        return true;
    }
    // Names such as `TOKEN` or `API_KEY` alone count too.
    let padded = format!("_{upper}");
    SECRET_SUFFIXES.iter().any(|s| padded.ends_with(s))
        || SECRET_PARTS.iter().any(|p| upper.contains(p))
}

/// One registered secret.
#[derive(Debug, Clone)]
struct Secret {
    name: String,
    value: String,
    marker: String,
}

fn registry() -> &'static RwLock<Vec<Secret>> {
    static SECRETS: OnceLock<RwLock<Vec<Secret>>> = OnceLock::new();
    SECRETS.get_or_init(|| RwLock::new(Vec::new()))
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
    secrets.push(Secret {
        name: name.to_string(),
        value: value.to_string(),
        marker: marker(name),
    });
    // Longest first, so a secret that contains another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.value.len()));
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

/// `text` with every registered secret replaced by `[REDACTED:NAME]`. Borrowed (no copy)
/// when it holds none, which is the common case.
pub fn redact(text: &str) -> Cow<'_, str> {
    let secrets = registry().read().unwrap_or_else(|e| e.into_inner());
    let mut out: Cow<'_, str> = Cow::Borrowed(text);
    for secret in secrets.iter() {
        if out.contains(&secret.value) {
            out = Cow::Owned(out.replace(&secret.value, &secret.marker));
        }
    }
    out
}

/// [`redact`] into an owned string.
pub fn redact_owned(text: String) -> String {
    match redact(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(redacted) => redacted,
    }
}

/// The names of the registered secrets (never their values), for diagnostics.
pub fn registered_names() -> Vec<String> {
    let secrets = registry().read().unwrap_or_else(|e| e.into_inner());
    secrets.iter().map(|s| s.name.clone()).collect()
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
        assert!(registered_names().contains(&"TEST_SECRETS_A_KEY".to_string()));
        assert!(!registered_names().contains(&"TEST_SECRETS_SHORT".to_string()));
    }

    #[test]
    fn markers_carry_only_harmless_characters() {
        assert_eq!(marker("A\"B\\C\nD_E"), "[REDACTED:ABCD_E]");
    }
}
