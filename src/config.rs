//! Loading `taskdaemon.yml`. Today the file holds the tool catalog overrides; the run
//! schema (loop types, loops, provider) grows here with `taskdaemon run`.
//!
//! Every key is checked: an unknown key is an error that gives the file, line and column
//! and the nearest valid key, so a typo never silently does nothing.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::catalog::{Catalog, ToolSpecOverride};

/// The parsed configuration file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// Per-tool overrides of lane, timeout and output cap.
    #[serde(default)]
    pub catalog: BTreeMap<String, ToolSpecOverride>,
}

impl Config {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses `text`; `origin` names the file in error messages.
    pub fn parse(text: &str, origin: &str) -> Result<Self, String> {
        let config: Config = serde_yaml_ng::from_str(text).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!(":{}:{}", l.line(), l.column()))
                .unwrap_or_default();
            format!("{origin}{at}: {}", with_suggestion(&e.to_string()))
        })?;
        // Resolve overrides now so that an unknown tool name fails at load time.
        config.catalog().map_err(|e| format!("{origin}: {e}"))?;
        Ok(config)
    }

    /// The default catalog with this file's overrides applied.
    pub fn catalog(&self) -> Result<Catalog, String> {
        let mut catalog = Catalog::default();
        catalog.apply_overrides(&self.catalog)?;
        Ok(catalog)
    }
}

/// Adds "did you mean" to serde's "unknown field `x`, expected one of `a`, `b`" messages,
/// and drops the trailing "at line L column C" that the caller already shows as a prefix.
pub(crate) fn with_suggestion(message: &str) -> String {
    let message = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    let Some(start) = message.find("unknown field `") else {
        return message.to_string();
    };
    let rest = &message[start + "unknown field `".len()..];
    let Some((wrong, tail)) = rest.split_once('`') else {
        return message.to_string();
    };
    let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
    match crate::suggest::closest(wrong, expected.iter().copied()) {
        Some(s) => format!("{message} (did you mean `{s}`?)"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Lane;

    #[test]
    fn catalog_overrides_are_applied() {
        let c = Config::parse(
            "catalog:\n  grep:\n    timeout-ms: 5000\n    max-output-bytes: 2048\n  build:\n    lane: no-net\n",
            "t.yml",
        )
        .unwrap();
        let cat = c.catalog().unwrap();
        assert_eq!(cat.spec("grep").timeout_ms, 5000);
        assert_eq!(cat.spec("grep").max_output_bytes, 2048);
        assert_eq!(cat.spec("build").lane, Lane::NoNet);
        assert_eq!(cat.spec("read_file").timeout_ms, 10_000);
    }

    #[test]
    fn unknown_keys_name_the_place_and_the_nearest_key() {
        let err = Config::parse("catalog:\n  grep:\n    timeout-msec: 5\n", "t.yml").unwrap_err();
        assert!(err.starts_with("t.yml:3:"), "{err}");
        assert!(err.contains("did you mean `timeout-ms`"), "{err}");
        let err = Config::parse("catalgo: {}\n", "t.yml").unwrap_err();
        assert!(err.contains("did you mean `catalog`"), "{err}");
    }

    #[test]
    fn unknown_tools_and_bad_values_are_refused() {
        let err = Config::parse("catalog:\n  gerp: {timeout-ms: 1}\n", "t.yml").unwrap_err();
        assert!(err.contains("unknown tool 'gerp'"), "{err}");
        let err = Config::parse("catalog:\n  grep: {lane: fast}\n", "t.yml").unwrap_err();
        assert!(err.contains("t.yml:2:"), "{err}");
        let err = Config::parse("catalog:\n  grep: {timeout-ms: -3}\n", "t.yml").unwrap_err();
        assert!(err.contains("t.yml:2:"), "{err}");
    }

    #[test]
    fn empty_file_is_the_default() {
        assert_eq!(Config::parse("{}", "t.yml").unwrap(), Config::default());
    }

    #[test]
    fn the_repository_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("taskdaemon.yml");
        Config::load(&path).unwrap();
    }
}
