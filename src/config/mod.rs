//! Loading `taskdaemon.yml`: the model provider, concurrency, lane sizes, coordinator
//! limits, tool catalog overrides, loop types and the loops of a run.
//!
//! Every key is checked: an unknown key is an error that gives the file, line and column
//! and the nearest valid key, so a typo never silently does nothing. Names, types,
//! dependencies (no cycles), tools and prompt templates are checked when the file loads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::actors::coordinator::CoordinatorLimits;
use crate::actors::tool_lanes::LaneSizes;
use crate::catalog::{Catalog, ToolSpecOverride};

pub mod loop_types;
pub mod loops;

pub use loop_types::{LoopType, LoopTypeDef};
pub use loops::{LoopDef, WorktreeMode};

/// How much runs at once.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Concurrency {
    /// Loops running at the same time (others wait for a slot).
    pub max_loops: usize,
    /// Model calls in flight across all loops.
    pub max_model_calls: usize,
}

impl Default for Concurrency {
    fn default() -> Self {
        Self {
            max_loops: 4,
            max_model_calls: 8,
        }
    }
}

/// The parsed configuration file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// The git repository the loops work on (default: the one holding the config file),
    /// relative to the config file.
    pub repo: Option<PathBuf>,
    /// Run on a fresh git copy of `repo` made inside the run directory (samples, demos):
    /// the original gains no branch and its checkout stays untouched.
    #[serde(default)]
    pub copy_repo: bool,
    /// The model provider.
    pub llm: Option<crate::llm::config::LlmConfig>,
    /// Loops and model calls at once.
    #[serde(default)]
    pub concurrency: Concurrency,
    /// Workers per tool lane.
    #[serde(default)]
    pub lanes: LaneSizes,
    /// Coordinator limits per sending loop.
    #[serde(default)]
    pub limits: CoordinatorLimits,
    /// Per-tool overrides of lane, timeout and output cap.
    #[serde(default)]
    pub catalog: BTreeMap<String, ToolSpecOverride>,
    /// Keep the loops' worktrees after the run (branches are always kept).
    #[serde(default)]
    pub keep_worktrees: bool,
    /// Merge every completed loop's branch into its base (a loop's `merge` overrides it).
    #[serde(default)]
    pub merge: bool,
    /// User loop types (extending the built-in ones).
    #[serde(default)]
    pub loop_types: BTreeMap<String, LoopTypeDef>,
    /// The loops of the run.
    #[serde(default)]
    pub loops: Vec<LoopDef>,
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
        config.check().map_err(|e| format!("{origin}: {e}"))?;
        Ok(config)
    }

    /// Everything that can be checked without running: catalog overrides, lane sizes,
    /// concurrency, loop types (tools, templates, extends chains) and loops.
    fn check(&self) -> Result<(), String> {
        self.catalog()?;
        if let Some(llm) = &self.llm {
            llm.validate()?;
        }
        self.lanes.validate().map_err(|e| format!("lanes: {e}"))?;
        if self.concurrency.max_loops == 0 || self.concurrency.max_model_calls == 0 {
            return Err("concurrency: max-loops and max-model-calls must be at least 1".into());
        }
        if self.limits.burst == 0
            || self.limits.per_second <= 0.0
            || self.limits.max_payload_bytes == 0
        {
            return Err("limits: burst, per-second and max-payload-bytes must be above 0".into());
        }
        let types: BTreeSet<String> = self.loop_types()?.into_keys().collect();
        loops::check(&self.loops, &types)
    }

    /// Every loop type, resolved.
    pub fn loop_types(&self) -> Result<BTreeMap<String, LoopType>, String> {
        loop_types::resolve(&self.loop_types)
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
    fn run_keys_parse_and_are_checked() {
        let c = Config::parse(
            r#"
repo: ..
concurrency: {max-loops: 2, max-model-calls: 3}
lanes: {heavy: 1}
limits: {burst: 5, per-second: 2.5, max-payload-bytes: 1000}
keep-worktrees: true
merge: true
loop-types:
  rust: {extends: code, validation: cargo test}
loops:
  - {name: api, type: rust, task: build it}
  - {name: client, type: code, task: use it, depends-on: [api]}
"#,
            "t.yml",
        )
        .unwrap();
        assert_eq!(c.repo.as_deref(), Some(Path::new("..")));
        assert_eq!(
            c.concurrency,
            Concurrency {
                max_loops: 2,
                max_model_calls: 3
            }
        );
        assert_eq!(c.lanes.heavy, 1);
        assert_eq!(c.lanes.no_net, LaneSizes::default().no_net);
        assert_eq!(c.limits.burst, 5);
        assert_eq!(c.limits.max_payload_bytes, 1000);
        assert!(c.keep_worktrees && c.merge);
        assert_eq!(
            c.loop_types().unwrap()["rust"].validation.as_deref(),
            Some("cargo test")
        );
        assert_eq!(c.loops[1].depends_on, vec!["api"]);

        for (bad, needle) in [
            ("concurrency: {max-loops: 0}\n", "at least 1"),
            ("lanes: {heavy: 0}\n", "lanes"),
            ("limits: {burst: 0}\n", "above 0"),
            ("loops: [{name: a, type: rsut, task: t}]\n", "unknown type"),
            ("loop-types: {x: {extends: y}}\n", "unknown loop type `y`"),
            ("concurency: {}\n", "did you mean `concurrency`"),
        ] {
            let err = Config::parse(&bad.replace("\\n", "\n"), "t.yml").unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn empty_file_is_the_default() {
        assert_eq!(Config::parse("{}", "t.yml").unwrap(), Config::default());
    }

    #[test]
    fn the_readme_schema_example_loads() {
        let readme =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
                .unwrap();
        let start = readme
            .find("```yaml\nrepo: .")
            .expect("schema example in README")
            + 8;
        let len = readme[start..].find("```").unwrap();
        let config = Config::parse(&readme[start..start + len], "README.md").unwrap();
        assert_eq!(config.loops.len(), 1);
        assert_eq!(config.loop_types().unwrap()["rust"].max_turns, 80);
    }

    #[test]
    fn the_repository_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("taskdaemon.yml");
        Config::load(&path).unwrap();
    }
}
