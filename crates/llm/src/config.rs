//! The `llm:` section of `taskdaemon.yml` and the factory that turns it into a client.
//!
//! ```yaml
//! llm:
//!   provider: anthropic          # scripted (default) | anthropic | openai
//!   model: claude-sonnet-4-5     # required for anthropic and openai
//!   base-url: https://api.anthropic.com   # default per provider; e.g. http://localhost:11434/v1
//!   api-key-env: ANTHROPIC_API_KEY        # default ANTHROPIC_API_KEY / OPENAI_API_KEY
//!   api-key-file: secrets/key.txt         # instead of api-key-env; relative to the config
//!   max-tokens: 8192             # output limit per call; anthropic default 4096, openai: server's
//!   temperature: 0.2             # default: the provider's
//!   max-retries: 4               # retries after the first attempt (0–10)
//!   retry-base-ms: 500           # first backoff wait bound; doubles per retry
//!   timeout-ms: 300000           # one attempt, connect to last byte (streamed: to the first byte)
//!   tool-choice: auto            # auto (default) | required | none | omit (send none)
//!   prompt-cache: on             # anthropic only: cache breakpoints (on | off; default on)
//!   stream: auto                 # auto (default) | on | off: streamed replies (see crate::stream)
//!   stream-idle-timeout-ms: 120000  # longest wait for more output of a stream
//!   script: script.yml           # scripted only; relative to the config
//! ```
//!
//! A key that does not apply to the chosen provider is an error rather than being ignored
//! (a `model:` under `provider: scripted` would otherwise suggest a model is used).
//! Keys: with `api-key-file` the key must be in that file; with `api-key-env` the variable
//! must be set; with neither, Anthropic requires `ANTHROPIC_API_KEY` while OpenAI-compatible
//! servers may run without a key (`OPENAI_API_KEY` is sent when set).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::Semaphore;

use super::LlmClient;
use super::anthropic::{self, AnthropicClient, AnthropicSettings};
use super::endpoint::{EndpointSettings, ToolChoice};
use super::http::{self, DEFAULT_MAX_BODY_BYTES, HttpSettings, KeyError, KeySource, SetupError};
use super::openai::{self, OpenAiClient, OpenAiSettings};
use super::redacting::RedactingClient;
use super::scripted::{ScriptError, ScriptedLlm};
use super::stream::{StreamMode, StreamSettings};

/// Default output limit for Anthropic, which requires one.
pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = 4096;
/// Default retries after the first attempt.
pub const DEFAULT_MAX_RETRIES: u32 = 4;
/// Most retries accepted.
pub const MAX_MAX_RETRIES: u32 = 10;
/// Default backoff base, in milliseconds.
pub const DEFAULT_RETRY_BASE_MS: u64 = 500;
/// Most backoff base accepted, in milliseconds.
pub const MAX_RETRY_BASE_MS: u64 = 60_000;
/// Default time one attempt may take, in milliseconds (long replies take minutes).
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// Most timeout accepted, in milliseconds (one hour).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// An `llm:` section that cannot be used, with every reason (each says what to change).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("llm: {}", .problems.join("; "))]
pub struct InvalidConfig {
    /// One sentence per wrong or missing key.
    pub problems: Vec<String>,
}

/// Why no client could be built from an `llm:` section. (A cause shown in the message is
/// not also given as `source()`, so that a chain printer does not say it twice.)
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The section itself is wrong.
    #[error(transparent)]
    Invalid(#[from] InvalidConfig),
    /// The scripted provider's script cannot be read or parsed.
    #[error(transparent)]
    Script(#[from] ScriptError),
    /// The configured key source cannot be read, or its key is unusable.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// Anthropic needs a key and the variable holding it is not set.
    #[error(
        "llm: provider anthropic needs an API key: set the environment variable {variable} \
         (or name another variable with `api-key-env`, or a file with `api-key-file`)"
    )]
    AnthropicKeyMissing {
        /// The variable looked in.
        variable: String,
    },
    /// The key source gave no key.
    #[error("llm: no API key in {origin}")]
    NoKey {
        /// The source, described ("the file k.txt").
        origin: String,
    },
    /// `api-key-env` names a variable that is not set.
    #[error(
        "llm: `api-key-env` names {origin}, which is not set; set it or remove `api-key-env` for a server that needs no key"
    )]
    KeyVariableUnset {
        /// The variable, described.
        origin: String,
    },
    /// The provider's client cannot be made (its key or its URL).
    #[error("llm: {0}")]
    Client(SetupError),
    /// A network provider without a key source (a bug: every network provider has one).
    #[error("no key source")]
    NoKeySource,
}

/// Whether Anthropic requests carry prompt-cache breakpoints (`prompt-cache: on | off`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptCache {
    /// Breakpoints on the tools, the system prompt and the conversation (the default):
    /// cache writes cost 1.25x the input price once, reads 0.1x on every later turn.
    #[default]
    On,
    /// No breakpoints: every request is billed in full.
    Off,
}

/// Which model provider a run uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Replays a script: offline and deterministic.
    #[default]
    Scripted,
    /// The Anthropic Messages API.
    Anthropic,
    /// An OpenAI-compatible Chat Completions endpoint.
    Openai,
}

impl ProviderKind {
    fn name(self) -> &'static str {
        match self {
            ProviderKind::Scripted => "scripted",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Openai => "openai",
        }
    }
}

/// The `llm:` section. Every key is optional in the file; [`LlmConfig::validate`] says
/// which ones each provider needs and refuses the ones it would not use.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LlmConfig {
    /// The provider; `scripted` when absent.
    #[serde(default)]
    pub provider: ProviderKind,
    /// Model name (anthropic, openai).
    #[serde(default)]
    pub model: Option<String>,
    /// API root (anthropic, openai).
    #[serde(default)]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key (anthropic, openai).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// File holding the API key, relative to the config's directory (anthropic, openai).
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// Output token limit per call (anthropic, openai).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Sampling temperature (anthropic 0–1, openai 0–2).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Retries after the first attempt (anthropic, openai).
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// Backoff base in milliseconds (anthropic, openai).
    #[serde(default)]
    pub retry_base_ms: Option<u64>,
    /// Time one attempt may take, in milliseconds (anthropic, openai).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The `tool_choice` sent with tools (anthropic, openai); `auto` when absent.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// The script to replay, relative to the config's directory (scripted).
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// Prompt-cache breakpoints (anthropic; on when absent). OpenAI-compatible servers
    /// cache prompts on their own, without markers.
    #[serde(default)]
    pub prompt_cache: Option<PromptCache>,
    /// Whether replies are streamed (anthropic, openai); `auto` when absent.
    #[serde(default)]
    pub stream: Option<StreamMode>,
    /// The longest wait for more output of a stream (keep-alives do not count), in
    /// milliseconds (anthropic, openai).
    #[serde(default)]
    pub stream_idle_timeout_ms: Option<u64>,
}

impl LlmConfig {
    /// Checks the section without touching files or the environment, so a config can be
    /// refused at load time with every reason a key is wrong.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let provider = self.provider.name();
        let mut problems = Vec::new();
        let network_keys = [
            ("model", self.model.is_some()),
            ("base-url", self.base_url.is_some()),
            ("api-key-env", self.api_key_env.is_some()),
            ("api-key-file", self.api_key_file.is_some()),
            ("max-tokens", self.max_tokens.is_some()),
            ("temperature", self.temperature.is_some()),
            ("max-retries", self.max_retries.is_some()),
            ("retry-base-ms", self.retry_base_ms.is_some()),
            ("timeout-ms", self.timeout_ms.is_some()),
            ("tool-choice", self.tool_choice.is_some()),
            ("prompt-cache", self.prompt_cache.is_some()),
            ("stream", self.stream.is_some()),
            (
                "stream-idle-timeout-ms",
                self.stream_idle_timeout_ms.is_some(),
            ),
        ];
        match self.provider {
            ProviderKind::Scripted => {
                if self.script.is_none() {
                    problems.push(
                        "provider scripted needs `script`: the path of the YAML script to replay"
                            .to_string(),
                    );
                }
                for (key, set) in network_keys {
                    if set {
                        problems.push(format!(
                            "`{key}` does not apply to provider scripted; remove it (or choose provider anthropic or openai)"
                        ));
                    }
                }
            }
            ProviderKind::Anthropic | ProviderKind::Openai => {
                if self.script.is_some() {
                    problems.push(format!(
                        "`script` only applies to provider scripted; remove it from provider {provider}"
                    ));
                }
                if self.prompt_cache.is_some() && self.provider == ProviderKind::Openai {
                    problems.push(
                        "`prompt-cache` only applies to provider anthropic (OpenAI-compatible \
                         servers cache prompts without markers); remove it"
                            .to_string(),
                    );
                }
                match self.model.as_deref().map(str::trim) {
                    None | Some("") => problems.push(format!(
                        "provider {provider} needs `model` (e.g. {})",
                        match self.provider {
                            ProviderKind::Anthropic => "claude-sonnet-4-5",
                            _ => "gpt-4.1, or llama3.1 on Ollama",
                        }
                    )),
                    Some(_) => {}
                }
                if let Some(url) = &self.base_url {
                    match reqwest::Url::parse(url) {
                        Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                        _ => problems.push(format!(
                            "`base-url` {url:?} is not an http:// or https:// URL"
                        )),
                    }
                }
                if self.api_key_env.is_some() && self.api_key_file.is_some() {
                    problems.push(
                        "`api-key-env` and `api-key-file` both name a key; keep one".to_string(),
                    );
                }
                if let Some(name) = &self.api_key_env
                    && (name.is_empty() || name.contains(['=', '\0']))
                {
                    problems.push(format!(
                        "`api-key-env` {name:?} is not a valid environment variable name"
                    ));
                }
                if self.max_tokens == Some(0) {
                    problems.push("`max-tokens` must be at least 1".to_string());
                }
                if let Some(t) = self.temperature {
                    let top = if self.provider == ProviderKind::Anthropic {
                        1.0
                    } else {
                        2.0
                    };
                    if !(0.0..=top).contains(&t) {
                        problems.push(format!(
                            "`temperature` {t} is out of range for provider {provider}: use 0 to {top}"
                        ));
                    }
                }
                if self.max_retries.is_some_and(|n| n > MAX_MAX_RETRIES) {
                    problems.push(format!("`max-retries` must be at most {MAX_MAX_RETRIES}"));
                }
                if self.retry_base_ms.is_some_and(|n| n > MAX_RETRY_BASE_MS) {
                    problems.push(format!(
                        "`retry-base-ms` must be at most {MAX_RETRY_BASE_MS}"
                    ));
                }
                if self
                    .timeout_ms
                    .is_some_and(|ms| !(1..=MAX_TIMEOUT_MS).contains(&ms))
                {
                    problems.push(format!(
                        "`timeout-ms` must be between 1 and {MAX_TIMEOUT_MS}"
                    ));
                }
                if self
                    .stream_idle_timeout_ms
                    .is_some_and(|ms| !(1..=MAX_TIMEOUT_MS).contains(&ms))
                {
                    problems.push(format!(
                        "`stream-idle-timeout-ms` must be between 1 and {MAX_TIMEOUT_MS}"
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(InvalidConfig { problems })
        }
    }

    /// The HTTP settings these keys describe (defaults where absent).
    pub fn http_settings(&self) -> HttpSettings {
        HttpSettings {
            timeout: Duration::from_millis(self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
            max_retries: self.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
            retry_base: Duration::from_millis(self.retry_base_ms.unwrap_or(DEFAULT_RETRY_BASE_MS)),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }

    /// The endpoint settings these keys describe, for `model` (`default_url` when
    /// `base-url` is absent).
    fn endpoint(&self, model: String, default_url: &str) -> EndpointSettings {
        EndpointSettings {
            base_url: self
                .base_url
                .clone()
                .unwrap_or_else(|| default_url.to_string()),
            model,
            temperature: self.temperature,
            tool_choice: self.tool_choice.unwrap_or_default(),
        }
    }

    /// How replies are streamed (defaults where absent: `auto`, the default idle timeout).
    pub fn stream_settings(&self) -> StreamSettings {
        let default = StreamSettings::default();
        StreamSettings {
            mode: self.stream.unwrap_or(default.mode),
            idle_timeout: self
                .stream_idle_timeout_ms
                .map_or(default.idle_timeout, Duration::from_millis),
        }
    }

    /// Where the key comes from for this provider (scripted has none).
    fn key_source(&self, base_dir: &Path) -> Option<KeySource> {
        if let Some(file) = &self.api_key_file {
            return Some(KeySource::File(http::resolve_path(base_dir, file)));
        }
        let default = match self.provider {
            ProviderKind::Scripted => return None,
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
            ProviderKind::Openai => "OPENAI_API_KEY",
        };
        Some(KeySource::Env(
            self.api_key_env
                .clone()
                .unwrap_or_else(|| default.to_string()),
        ))
    }
}

/// Builds the run's client from the `llm:` section. `base_dir` (the config's directory)
/// resolves relative `script` and `api-key-file` paths; `in_flight` limits the model calls
/// in flight across every client of the run. Keys come from the process environment; the
/// key loaded is registered as a secret, and the client redacts secrets from its responses
/// and errors ([`super::redacting`]).
pub fn build_client(
    cfg: &LlmConfig,
    base_dir: &Path,
    in_flight: Arc<Semaphore>,
) -> Result<Arc<dyn LlmClient>, BuildError> {
    build_client_with_env(cfg, base_dir, in_flight, &|name| std::env::var(name).ok())
}

/// [`build_client`] with the environment lookup given (tests pass a closure instead of
/// changing the process environment).
pub fn build_client_with_env(
    cfg: &LlmConfig,
    base_dir: &Path,
    in_flight: Arc<Semaphore>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn LlmClient>, BuildError> {
    let client = build_provider(cfg, base_dir, in_flight, env)?;
    Ok(Arc::new(RedactingClient::new(client)))
}

/// The provider's own client, without redaction.
fn build_provider(
    cfg: &LlmConfig,
    base_dir: &Path,
    in_flight: Arc<Semaphore>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn LlmClient>, BuildError> {
    cfg.validate()?;
    let model = cfg.model.clone().unwrap_or_default().trim().to_string();
    match cfg.provider {
        ProviderKind::Scripted => {
            let script = cfg.script.as_deref().unwrap_or(Path::new(""));
            let llm = ScriptedLlm::load(&http::resolve_path(base_dir, script))?;
            Ok(Arc::new(llm))
        }
        ProviderKind::Anthropic => {
            let source = cfg.key_source(base_dir).ok_or(BuildError::NoKeySource)?;
            let api_key = source.load(env)?.ok_or_else(|| match &source {
                KeySource::Env(name) => BuildError::AnthropicKeyMissing {
                    variable: name.clone(),
                },
                KeySource::File(_) => BuildError::NoKey {
                    origin: source.describe(),
                },
            })?;
            let settings = AnthropicSettings {
                endpoint: cfg.endpoint(model, anthropic::DEFAULT_BASE_URL),
                max_tokens: cfg.max_tokens.unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS),
                api_key,
            };
            let client = AnthropicClient::new(settings, cfg.http_settings(), in_flight)
                .map_err(BuildError::Client)?
                .with_prompt_cache(cfg.prompt_cache.unwrap_or_default() == PromptCache::On)
                .with_streaming(cfg.stream_settings());
            Ok(Arc::new(client))
        }
        ProviderKind::Openai => {
            let source = cfg.key_source(base_dir).ok_or(BuildError::NoKeySource)?;
            let api_key = source.load(env)?;
            // A variable the user named must exist; the default one is optional because
            // local servers (Ollama, llama.cpp, vLLM) need no key.
            if api_key.is_none() && cfg.api_key_env.is_some() {
                return Err(BuildError::KeyVariableUnset {
                    origin: source.describe(),
                });
            }
            let settings = OpenAiSettings {
                endpoint: cfg.endpoint(model, openai::DEFAULT_BASE_URL),
                max_tokens: cfg.max_tokens,
                api_key,
            };
            let client = OpenAiClient::new(settings, cfg.http_settings(), in_flight)
                .map_err(BuildError::Client)?
                .with_streaming(cfg.stream_settings());
            Ok(Arc::new(client))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<LlmConfig, String> {
        serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn build_err(
        cfg: &LlmConfig,
        dir: &Path,
        in_flight: Arc<Semaphore>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> String {
        match build_client_with_env(cfg, dir, in_flight, env) {
            Ok(_) => panic!("{cfg:?} built"),
            Err(e) => e.to_string(),
        }
    }

    fn sem() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(1))
    }

    #[test]
    fn every_key_is_read_in_kebab_case() {
        let cfg = parse(
            "provider: openai\nmodel: m\nbase-url: http://localhost:11434/v1\napi-key-env: K\n\
             max-tokens: 10\ntemperature: 0.5\nmax-retries: 2\nretry-base-ms: 7\ntimeout-ms: 99\n\
             tool-choice: required\nstream: on\nstream-idle-timeout-ms: 45\n",
        )
        .unwrap();
        assert_eq!(
            cfg,
            LlmConfig {
                provider: ProviderKind::Openai,
                model: Some("m".into()),
                base_url: Some("http://localhost:11434/v1".into()),
                api_key_env: Some("K".into()),
                api_key_file: None,
                max_tokens: Some(10),
                temperature: Some(0.5),
                max_retries: Some(2),
                retry_base_ms: Some(7),
                timeout_ms: Some(99),
                tool_choice: Some(ToolChoice::Required),
                script: None,
                prompt_cache: None,
                stream: Some(StreamMode::On),
                stream_idle_timeout_ms: Some(45),
            }
        );
        assert_eq!(
            cfg.stream_settings(),
            StreamSettings {
                mode: StreamMode::On,
                idle_timeout: Duration::from_millis(45),
            }
        );
        for (word, mode) in [("off", StreamMode::Off), ("auto", StreamMode::Auto)] {
            let cfg = parse(&format!("provider: openai\nmodel: m\nstream: {word}\n")).unwrap();
            assert_eq!(cfg.stream_settings().mode, mode);
        }
        let err = parse("provider: openai\nmodel: m\nstream: yes\n").unwrap_err();
        assert!(err.contains("unknown variant `yes`"), "{err}");
        cfg.validate().unwrap();
        assert_eq!(
            cfg.http_settings(),
            HttpSettings {
                timeout: Duration::from_millis(99),
                max_retries: 2,
                retry_base: Duration::from_millis(7),
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            }
        );
        let file = parse("provider: anthropic\nmodel: m\napi-key-file: k.txt\n").unwrap();
        assert_eq!(file.api_key_file, Some(PathBuf::from("k.txt")));
        let scripted = parse("script: s.yml\n").unwrap();
        assert_eq!(scripted.provider, ProviderKind::Scripted);
        assert_eq!(scripted.script, Some(PathBuf::from("s.yml")));
    }

    #[test]
    fn defaults_apply_when_keys_are_absent() {
        let cfg = parse("provider: anthropic\nmodel: m\n").unwrap();
        assert_eq!(cfg.stream_settings(), StreamSettings::default());
        assert_eq!(cfg.stream_settings().mode, StreamMode::Auto);
        assert_eq!(
            cfg.http_settings(),
            HttpSettings {
                timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
                max_retries: DEFAULT_MAX_RETRIES,
                retry_base: Duration::from_millis(DEFAULT_RETRY_BASE_MS),
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            }
        );
        assert_eq!(
            cfg.key_source(Path::new("/c")),
            Some(KeySource::Env("ANTHROPIC_API_KEY".into()))
        );
        let openai = parse("provider: openai\nmodel: m\n").unwrap();
        assert_eq!(
            openai.key_source(Path::new("/c")),
            Some(KeySource::Env("OPENAI_API_KEY".into()))
        );
        let file = parse("provider: openai\nmodel: m\napi-key-file: k\n").unwrap();
        assert_eq!(
            file.key_source(Path::new("/c")),
            Some(KeySource::File("/c/k".into()))
        );
    }

    #[test]
    fn prompt_cache_is_on_or_off() {
        let on = parse("provider: anthropic\nmodel: m\nprompt-cache: on\n").unwrap();
        assert_eq!(on.prompt_cache, Some(PromptCache::On));
        on.validate().unwrap();
        let off = parse("provider: anthropic\nmodel: m\nprompt-cache: off\n").unwrap();
        assert_eq!(off.prompt_cache, Some(PromptCache::Off));
        off.validate().unwrap();
        assert_eq!(PromptCache::default(), PromptCache::On);
        let err = parse("provider: anthropic\nmodel: m\nprompt-cache: yes\n").unwrap_err();
        assert!(err.contains("unknown variant `yes`"), "{err}");
    }

    #[test]
    fn unknown_keys_and_providers_are_refused() {
        let err = parse("provider: anthropic\nmodle: m\n").unwrap_err();
        assert!(err.contains("unknown field `modle`"), "{err}");
        let err = parse("provider: gemini\n").unwrap_err();
        assert!(err.contains("unknown variant `gemini`"), "{err}");
        let err = parse("max_tokens: 3\n").unwrap_err();
        assert!(err.contains("unknown field `max_tokens`"), "{err}");
        let err = parse("provider: openai\nmodel: m\ntool-choice: requird\n").unwrap_err();
        assert!(
            err.contains(
                "unknown variant `requird`, expected one of `auto`, `required`, `none`, `omit`"
            ),
            "{err}"
        );
        assert!(
            td_base::suggest::serde_with_suggestion(&err).ends_with("(did you mean `required`?)"),
            "{err}"
        );
    }

    #[test]
    fn each_provider_checks_its_keys() {
        let cases = [
            ("provider: scripted\n", "needs `script`"),
            (
                "script: s.yml\nmodel: m\n",
                "`model` does not apply to provider scripted",
            ),
            (
                "script: s.yml\ntimeout-ms: 5\n",
                "`timeout-ms` does not apply",
            ),
            (
                "script: s.yml\ntool-choice: auto\n",
                "`tool-choice` does not apply",
            ),
            ("provider: anthropic\n", "provider anthropic needs `model`"),
            (
                "provider: openai\nmodel: \" \"\n",
                "provider openai needs `model`",
            ),
            (
                "provider: anthropic\nmodel: m\nscript: s\n",
                "`script` only applies",
            ),
            (
                "provider: openai\nmodel: m\nbase-url: localhost:8080\n",
                "not an http:// or https:// URL",
            ),
            (
                "provider: openai\nmodel: m\nbase-url: \"not a url\"\n",
                "not an http:// or https:// URL",
            ),
            (
                "provider: openai\nmodel: m\napi-key-env: A\napi-key-file: b\n",
                "keep one",
            ),
            (
                "provider: openai\nmodel: m\napi-key-env: \"A=B\"\n",
                "not a valid environment variable name",
            ),
            (
                "provider: openai\nmodel: m\nmax-tokens: 0\n",
                "`max-tokens` must be at least 1",
            ),
            (
                "provider: anthropic\nmodel: m\ntemperature: 1.5\n",
                "use 0 to 1",
            ),
            (
                "provider: openai\nmodel: m\ntemperature: -0.1\n",
                "use 0 to 2",
            ),
            (
                "provider: openai\nmodel: m\nmax-retries: 11\n",
                "`max-retries` must be at most 10",
            ),
            (
                "provider: openai\nmodel: m\nretry-base-ms: 60001\n",
                "`retry-base-ms` must be at most",
            ),
            (
                "provider: openai\nmodel: m\ntimeout-ms: 0\n",
                "`timeout-ms` must be between",
            ),
            (
                "provider: openai\nmodel: m\nprompt-cache: on\n",
                "`prompt-cache` only applies to provider anthropic",
            ),
            (
                "script: s.yml\nprompt-cache: off\n",
                "`prompt-cache` does not apply to provider scripted",
            ),
            (
                "provider: openai\nmodel: m\nstream-idle-timeout-ms: 0\n",
                "`stream-idle-timeout-ms` must be between",
            ),
            ("script: s.yml\nstream: on\n", "`stream` does not apply"),
        ];
        for (yaml, want) in cases {
            let err = parse(yaml).unwrap().validate().unwrap_err().to_string();
            assert!(err.contains(want), "{yaml:?}: {err}");
        }
        parse("provider: openai\nmodel: m\ntemperature: 1.5\n")
            .unwrap()
            .validate()
            .unwrap();
        // Every problem is reported at once.
        let err = parse("provider: anthropic\nscript: s\nmax-tokens: 0\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(err.problems.len(), 3, "{err}");
        let err = err.to_string();
        assert!(err.starts_with("llm: "), "{err}");
        assert!(
            err.contains("`script`") && err.contains("`model`") && err.contains("max-tokens"),
            "{err}"
        );
    }

    #[test]
    fn anthropic_without_a_key_names_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = parse("provider: anthropic\nmodel: m\n").unwrap();
        assert!(matches!(
            build_client_with_env(&cfg, dir.path(), sem(), &no_env),
            Err(BuildError::AnthropicKeyMissing { variable }) if variable == "ANTHROPIC_API_KEY"
        ));
        let err = build_err(&cfg, dir.path(), sem(), &no_env);
        assert!(
            err.starts_with("llm: provider anthropic needs an API key: set the environment variable ANTHROPIC_API_KEY (or name"),
            "{err}"
        );
        let cfg = parse("provider: anthropic\nmodel: m\napi-key-env: MY_KEY\n").unwrap();
        let err = build_err(&cfg, dir.path(), sem(), &no_env);
        assert!(err.contains("set the environment variable MY_KEY"), "{err}");
        let env = |n: &str| (n == "MY_KEY").then(|| "sk-ant-x".to_string());
        build_client_with_env(&cfg, dir.path(), sem(), &env).unwrap();
        let cfg = parse("provider: anthropic\nmodel: m\napi-key-file: missing.txt\n").unwrap();
        let err = build_err(&cfg, dir.path(), sem(), &no_env);
        assert!(err.contains("missing.txt"), "{err}");
    }

    #[test]
    fn openai_keys_are_optional_unless_named() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = parse("provider: openai\nmodel: llama3.1\nbase-url: http://localhost:11434/v1\n")
            .unwrap();
        build_client_with_env(&cfg, dir.path(), sem(), &no_env).unwrap();
        let named = parse("provider: openai\nmodel: m\napi-key-env: OPENROUTER_API_KEY\n").unwrap();
        let err = build_err(&named, dir.path(), sem(), &no_env);
        assert!(
            err.contains("OPENROUTER_API_KEY, which is not set"),
            "{err}"
        );
        let env = |n: &str| (n == "OPENROUTER_API_KEY").then(|| "sk-or".to_string());
        build_client_with_env(&named, dir.path(), sem(), &env).unwrap();
    }

    #[test]
    fn scripted_scripts_resolve_against_the_config_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.yml"), "a:\n  turns: []\n").unwrap();
        let cfg = parse("script: s.yml\n").unwrap();
        build_client_with_env(&cfg, dir.path(), sem(), &no_env).unwrap();
        let other = tempfile::tempdir().unwrap();
        let err = build_err(&cfg, other.path(), sem(), &no_env);
        assert!(err.contains("s.yml"), "{err}");
        let invalid = parse("provider: scripted\n").unwrap();
        let err = build_err(&invalid, dir.path(), sem(), &no_env);
        assert!(err.contains("needs `script`"), "{err}");
    }
}
