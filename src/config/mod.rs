//! Loading `taskdaemon.yml`: the model provider, concurrency, lane sizes, coordinator
//! limits, tool catalog overrides, what the web tools may reach, loop types and the loops
//! of a run.
//!
//! Every key is checked: an unknown key is an error that gives the file, line and column
//! and the nearest valid key, so a typo never silently does nothing. Names, types,
//! dependencies (no cycles), tools and prompt templates are checked when the file loads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use td_runtime::coordinator::CoordinatorLimits;
use td_runtime::tool_lanes::LaneSizes;
use td_toolkit::catalog::{Catalog, ToolSpecOverride};
use td_toolkit::web_access::WebAccess;

pub mod budget;
pub mod compiler_cache;
pub mod hosts;
pub mod locate;
pub mod loop_types;
pub mod loops;
pub mod warm;
pub mod web;

pub use budget::BudgetDef;
pub use loop_types::{LoopType, LoopTypeDef};
pub use loops::{LoopDef, WorktreeMode};
pub use web::{AllowPrivate, WebConfig};

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

/// Whether running loops are compared for merge conflicts (`conflict-warnings: on | off`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConflictWarnings {
    /// After each iteration a loop's worktree is compared with the other running loops'
    /// (`git merge-tree`, nothing checked out), and both loops of a conflict are told.
    #[default]
    On,
    /// No comparison, no warning.
    Off,
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
    pub llm: Option<td_llm::config::LlmConfig>,
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
    /// What `web_fetch` may reach besides the public internet.
    #[serde(default)]
    pub web: WebConfig,
    /// Keep the loops' worktrees after the run (branches are always kept).
    #[serde(default)]
    pub keep_worktrees: bool,
    /// Integrate every completed loop into its base branch (the user's) rather than into
    /// the run's integration branch (a loop's `merge` overrides it).
    #[serde(default)]
    pub merge: bool,
    /// Warn running loops whose work will conflict (`on`, the default, or `off`; see
    /// `run::conflict_watch`).
    #[serde(default)]
    pub conflict_warnings: ConflictWarnings,
    /// How many times the merge queue gives a loop's work back to it before the loop is
    /// blocked (a loop's `merge-attempts` overrides it; default 3).
    pub merge_attempts: Option<u32>,
    /// User loop types (extending the built-in ones).
    #[serde(default)]
    pub loop_types: BTreeMap<String, LoopTypeDef>,
    /// The loops of the run.
    #[serde(default)]
    pub loops: Vec<LoopDef>,
    /// How commands are confined (see `td_confine`).
    #[serde(default)]
    pub sandbox: td_confine::SandboxSettings,
    /// What models cost, per model name, over the built-in table (dollars per million
    /// tokens).
    #[serde(default)]
    pub prices: BTreeMap<String, td_llm::prices::PriceConfig>,
    /// The run's budget (loop types and loops have their own).
    #[serde(default)]
    pub budget: BudgetDef,
    /// Build state each new worktree is seeded with from the base checkout (loop types and
    /// loops have their own; see `config::warm` and `run::warm`).
    #[serde(default)]
    pub warm: Vec<String>,
    /// A compiler cache shared by the loops' builds (see `config::compiler_cache` and
    /// `run::compiler_cache`); none by default.
    #[serde(default)]
    pub compiler_cache: compiler_cache::CompilerCacheConfig,
    /// Worker hosts: the head listens for them (see `config::hosts` and `run::hosts`).
    pub hosts: Option<hosts::HostsConfig>,
}

/// A problem found in a parsed config: where (a YAML path such as `loops[2].type`, which
/// finds its line) and what, in words that say how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The YAML path of the field at fault.
    pub at: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl Problem {
    /// A problem of the field at `at`.
    pub fn new(at: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            at: at.into(),
            message: message.into(),
        }
    }
}

/// The messages of several problems, a line each (where there is no file text to locate
/// them in).
pub trait Messages {
    /// Every message, a line each.
    fn messages(&self) -> String;
}

impl Messages for [Problem] {
    fn messages(&self) -> String {
        self.iter()
            .map(|p| p.message.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Config {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses `text`; `origin` names the file in error messages. Every problem found after
    /// parsing is reported (a line each), with the line and column of the field at fault.
    pub fn parse(text: &str, origin: &str) -> Result<Self, String> {
        let config: Config = serde_yaml_ng::from_str(text).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!(":{}:{}", l.line(), l.column()))
                .unwrap_or_default();
            format!(
                "{origin}{at}: {}",
                td_base::suggest::serde_with_suggestion(&e.to_string())
            )
        })?;
        config.check().map_err(|problems| {
            problems
                .iter()
                .map(|p| format!("{origin}{}: {}", position(text, &p.at), p.message))
                .collect::<Vec<_>>()
                .join("\n")
        })?;
        Ok(config)
    }

    /// Everything that can be checked without running: catalog overrides, lane sizes,
    /// concurrency, loop types (tools, templates, extends chains) and loops.
    fn check(&self) -> Result<(), Vec<Problem>> {
        let mut problems = Vec::new();
        if let Err(e) = self.catalog() {
            problems.push(Problem::new("catalog", e));
        }
        if let Err(mut p) = self.web.access() {
            problems.append(&mut p);
        }
        if let Some(llm) = &self.llm
            && let Err(e) = llm.validate()
        {
            problems.push(Problem::new("llm", e.to_string()));
        }
        if let Err(e) = self.lanes.validate() {
            problems.push(Problem::new("lanes", format!("lanes: {e}")));
        }
        if self.concurrency.max_loops == 0 || self.concurrency.max_model_calls == 0 {
            problems.push(Problem::new(
                "concurrency",
                "concurrency: max-loops and max-model-calls must be at least 1",
            ));
        }
        if self.limits.burst == 0
            || self.limits.per_second <= 0.0
            || self.limits.max_payload_bytes == 0
        {
            problems.push(Problem::new(
                "limits",
                "limits: burst, per-second and max-payload-bytes must be above 0",
            ));
        }
        // Loops are checked against every type the file names, even one with a problem of
        // its own (reported above), so that its loops are not reported as well.
        let mut types: BTreeSet<String> = td_toolkit::catalog::BUILTIN_LOOP_TYPES
            .iter()
            .map(|t| t.to_string())
            .collect();
        types.extend(self.loop_types.keys().cloned());
        if let Err(mut p) = loop_types::resolve(&self.loop_types) {
            problems.append(&mut p);
        }
        if let Err(mut p) = loops::check(&self.loops, &types) {
            problems.append(&mut p);
        }
        if let Some(h) = &self.hosts {
            problems.extend(h.problems(&self.loops, &types));
        }
        problems.extend(self.sandbox_problems());
        problems.extend(self.budget_problems());
        problems.extend(self.warm_problems());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Problems of `prices:` and of every `budget:`, and what the budgets need of the model
    /// (a price, a known output limit).
    fn budget_problems(&self) -> Vec<Problem> {
        let mut budgets: Vec<(String, BudgetDef)> = vec![("budget".into(), self.budget)];
        for (name, def) in &self.loop_types {
            if let Some(b) = def.budget {
                budgets.push((format!("loop-types.{name}.budget"), b));
            }
        }
        for (i, def) in self.loops.iter().enumerate() {
            if let Some(b) = def.budget {
                budgets.push((format!("loops[{i}].budget"), b));
            }
        }
        let mut problems: Vec<Problem> =
            budgets.iter().flat_map(|(at, b)| b.problems(at)).collect();
        match budget::price_table(&self.prices) {
            Ok(table) => problems.extend(budget::needs(self.llm.as_ref(), &table, &budgets)),
            Err(mut p) => problems.append(&mut p),
        }
        problems
    }

    /// The prices of this file's runs: the built-in table with `prices:` over it.
    pub fn price_table(&self) -> Result<td_llm::prices::PriceTable, String> {
        budget::price_table(&self.prices).map_err(|p| p.messages())
    }

    /// How this file's model calls are priced.
    pub fn pricing(&self) -> Result<td_engine::budget::Pricing, String> {
        Ok(budget::pricing(self.llm.as_ref(), &self.price_table()?))
    }

    /// Problems of every `warm:` list (the run's, each type's, each loop's).
    fn warm_problems(&self) -> Vec<Problem> {
        let mut problems = warm::problems(&self.warm, "warm");
        for (name, def) in &self.loop_types {
            if let Some(list) = &def.warm {
                problems.extend(warm::problems(list, &format!("loop-types.{name}.warm")));
            }
        }
        for (i, def) in self.loops.iter().enumerate() {
            if let Some(list) = &def.warm {
                problems.extend(warm::problems(list, &format!("loops[{i}].warm")));
            }
        }
        problems
    }

    /// The paths loop `def` of type `loop_type` seeds its new worktree with: its own
    /// `warm:`, else its type's, else the run's.
    pub fn warm_paths(&self, def: &LoopDef, loop_type: &LoopType) -> Vec<PathBuf> {
        let list = def
            .warm
            .as_ref()
            .or(loop_type.warm.as_ref())
            .unwrap_or(&self.warm);
        warm::paths(list)
    }

    /// The budget of loop `def` of type `loop_type`: its own keys over its type's.
    pub fn loop_limits(&self, def: &LoopDef, loop_type: &LoopType) -> td_engine::budget::Limits {
        def.budget
            .unwrap_or_default()
            .over(&loop_type.budget)
            .limits()
    }

    /// Problems of `sandbox.env`: names and values a process environment cannot hold.
    fn sandbox_problems(&self) -> Vec<Problem> {
        let env = &self.sandbox.env;
        let bad_name = |n: &str| n.is_empty() || n.contains('=') || n.contains('\0');
        let mut problems = Vec::new();
        for (list, key) in [(&env.pass, "pass"), (&env.secret, "secret")] {
            for name in list.iter().filter(|n| bad_name(n)) {
                problems.push(Problem::new(
                    format!("sandbox.env.{key}"),
                    format!("sandbox.env.{key}: {name:?} is not an environment variable name (no '=', no NUL, not empty)"),
                ));
            }
        }
        for (name, value) in &env.set {
            if bad_name(name) || value.contains('\0') {
                problems.push(Problem::new(
                    "sandbox.env.set",
                    format!("sandbox.env.set: {name:?} must be a variable name without '=' or NUL, and its value must not hold a NUL byte"),
                ));
            }
        }
        problems
    }

    /// The sandbox settings with their paths made absolute against `base_dir` (the config
    /// file's directory). The model's `api-key-file` is always hidden from commands: a
    /// command that read it could send the key anywhere the net lane reaches, and redaction
    /// only protects what passes through the daemon.
    pub fn sandbox_settings(&self, base_dir: &Path) -> td_confine::SandboxSettings {
        let mut settings = self.sandbox.clone();
        if let Some(file) = self.llm.as_ref().and_then(|l| l.api_key_file.as_ref()) {
            settings.hide.push(file.clone());
        }
        // The hosts' secret too: a command that read it could join a host of its own.
        if let Some(file) = self.hosts.as_ref().and_then(|h| h.secret_file.as_ref()) {
            settings.hide.push(file.clone());
        }
        settings.resolved(base_dir)
    }

    /// Every loop type, resolved.
    pub fn loop_types(&self) -> Result<BTreeMap<String, LoopType>, String> {
        loop_types::resolve(&self.loop_types).map_err(|p| p.messages())
    }

    /// The default catalog with this file's overrides applied.
    pub fn catalog(&self) -> Result<Catalog, String> {
        let mut catalog = Catalog::default();
        catalog
            .apply_overrides(&self.catalog)
            .map_err(|e| e.to_string())?;
        Ok(catalog)
    }

    /// What `web_fetch` may reach under this file's `web:` section.
    pub fn web_access(&self) -> Result<WebAccess, String> {
        self.web.access().map_err(|p| p.messages())
    }
}

/// `:line:column` of the field at `at` in `text`, or of the nearest enclosing field that is
/// written there (a value may come from a default or a parent type); empty if none is.
fn position(text: &str, at: &str) -> String {
    let mut path = at;
    loop {
        if let Some((line, column)) = locate::locate(text, path) {
            return format!(":{line}:{column}");
        }
        match path.rfind(['.', '[']) {
            Some(cut) => path = &path[..cut],
            None => return String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use td_toolkit::catalog::{Lane, Route};
    use td_toolkit::web_access::AllowedHost;

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
        assert_eq!(cat.spec("build").lane, Route::Lane(Lane::NoNet));
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
    fn every_problem_after_parsing_names_its_line_and_column() {
        let text = "\
concurrency: {max-loops: 0}
loop-types:
  api:
    extends: ralph
    tools: [read_file, grpe]
loops:
  - name: a
    type: api
    task: t
  - name: b
    type: ralhp
    task: t
    depends-on: [a, c]
";
        let err = Config::parse(text, "t.yml").unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 4, "{err}");
        assert!(lines[0].starts_with("t.yml:1:1: concurrency:"), "{err}");
        assert!(
            lines[1].starts_with("t.yml:5:5: loop-types.api.tools:") && lines[1].contains("grep"),
            "{err}"
        );
        // A loop of a type with a problem of its own is not reported as of an unknown type.
        assert!(
            lines[2].starts_with("t.yml:11:5: loops[1] (b): unknown type `ralhp`"),
            "{err}"
        );
        assert!(
            lines[3].starts_with("t.yml:13:21: loops[1] (b): depends-on names unknown loop `c`"),
            "{err}"
        );
    }

    #[test]
    fn a_problem_of_a_field_not_written_points_at_the_nearest_one_that_is() {
        let text = "loops:\n  - name: a\n    depends-on: [x]\n";
        assert_eq!(position(text, "loops[0].depends-on[0]"), ":3:18");
        assert_eq!(position(text, "loops[0].depends-on[5]"), ":3:5");
        assert_eq!(position(text, "loops[0].task"), ":2:5");
        assert_eq!(position(text, "lanes.heavy"), "");
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
    fn conflict_warnings_are_on_or_off() {
        let off = Config::parse("conflict-warnings: off\n", "t.yml").unwrap();
        assert_eq!(off.conflict_warnings, ConflictWarnings::Off);
        let on = Config::parse("conflict-warnings: on\n", "t.yml").unwrap();
        assert_eq!(on.conflict_warnings, ConflictWarnings::On);
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
        assert_eq!(c.conflict_warnings, ConflictWarnings::On, "the default");
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
            ("conflict-warnings: yes\n", "unknown variant `yes`"),
        ] {
            let err = Config::parse(&bad.replace("\\n", "\n"), "t.yml").unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn web_allow_private_is_a_flag_or_a_host_list() {
        // As a loop's start carries it to its host: as written.
        let sent = |text: &str| {
            Config::parse(text, "t.yml")
                .unwrap()
                .web
                .allow_private
                .to_value()
        };
        assert_eq!(sent("{}"), serde_json::json!(false));
        assert_eq!(
            sent("web: {allow-private: true}\n"),
            serde_json::json!(true)
        );
        assert_eq!(
            sent("web: {allow-private: [localhost, Internal.Example]}\n"),
            serde_json::json!(["localhost", "Internal.Example"])
        );
        let access = |text: &str| Config::parse(text, "t.yml").unwrap().web_access().unwrap();
        assert_eq!(access("{}"), WebAccess::PublicOnly);
        assert_eq!(access("web: {}\n"), WebAccess::PublicOnly);
        assert_eq!(
            access("web: {allow-private: false}\n"),
            WebAccess::PublicOnly
        );
        assert_eq!(access("web: {allow-private: true}\n"), WebAccess::Any);
        assert_eq!(
            access("web: {allow-private: []}\n"),
            WebAccess::PublicAnd(vec![])
        );
        assert_eq!(
            access("web:\n  allow-private: [localhost, 127.0.0.1, \"::1\", Internal.Example]\n"),
            WebAccess::PublicAnd(vec![
                AllowedHost::Name("localhost".into()),
                AllowedHost::Ip("127.0.0.1".parse().unwrap()),
                AllowedHost::Ip("::1".parse().unwrap()),
                AllowedHost::Name("internal.example".into()),
            ])
        );
    }

    #[test]
    fn web_problems_name_their_line_and_column() {
        let err = Config::parse("web:\n  allow-privat: true\n", "t.yml").unwrap_err();
        assert!(err.starts_with("t.yml:2:"), "{err}");
        assert!(err.contains("did you mean `allow-private`"), "{err}");
        let err = Config::parse("web:\n  allow-private: yes\n", "t.yml").unwrap_err();
        assert!(err.starts_with("t.yml:2:"), "{err}");
        assert!(
            err.contains("expected true, false or a list of host names and IP addresses"),
            "{err}"
        );
        let err = Config::parse("web: {allow-private: [localhost, 8080]}\n", "t.yml").unwrap_err();
        assert!(
            err.starts_with("t.yml:1:34: web.allow-private[1]: `8080` would be read as the IP address 0.0.31.144"),
            "{err}"
        );
        let text = "web:\n  allow-private:\n    - localhost\n    - http://internal.example:8080/\n    - '*.corp'\n";
        let err = Config::parse(text, "t.yml").unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(
            lines[0].starts_with("t.yml:4:7: web.allow-private[1]: `http://internal.example:8080/` is not a host name"),
            "{err}"
        );
        assert!(lines[0].contains("without scheme, port, path"), "{err}");
        assert!(
            lines[1].starts_with("t.yml:5:7: web.allow-private[2]: `*.corp`"),
            "{err}"
        );
    }

    #[test]
    fn budgets_and_prices_are_checked_against_the_model() {
        let openai = "llm: {provider: openai, model: gpt-4o, base-url: 'http://127.0.0.1:1/v1'}\n";
        let err =
            Config::parse(&format!("{openai}budget: {{tokens: 1000}}\n"), "t.yml").unwrap_err();
        assert!(
            err.starts_with("t.yml:1:1: llm: a money or token budget (budget)"),
            "{err}"
        );
        assert!(err.contains("needs `max-tokens`"), "{err}");
        // Iterations and wall time need no reservation.
        Config::parse(&format!("{openai}budget: {{iterations: 3}}\n"), "t.yml").unwrap();
        let local = "llm: {provider: openai, model: smollm2, base-url: 'http://127.0.0.1:1/v1', max-tokens: 64}\n";
        let text =
            format!("{local}loops:\n  - {{name: a, type: code, task: t, budget: {{usd: 1}}}}\n");
        let err = Config::parse(&text, "t.yml").unwrap_err();
        assert!(
            err.starts_with("t.yml:3:45: loops[0].budget.usd: the model `smollm2` has no price"),
            "{err}"
        );
        let priced = format!("{text}prices:\n  smollm2: {{input: 0, output: 0}}\n");
        let c = Config::parse(&priced, "t.yml").unwrap();
        assert_eq!(c.pricing().unwrap().max_output_tokens, 64);
        let types = c.loop_types().unwrap();
        assert_eq!(
            c.loop_limits(&c.loops[0], &types["code"]).nano_usd,
            Some(1_000_000_000)
        );
        let err = Config::parse(
            "prices:\n  m: {input: -1, output: 1}\nbudget: {soft-percent: 101, wall-seconds: 0}\n",
            "t.yml",
        )
        .unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert!(
            lines[0].starts_with("t.yml:3:") && lines[0].contains("wall-seconds"),
            "{err}"
        );
        assert!(
            lines[1].contains("soft-percent: 101 is not a percentage"),
            "{err}"
        );
        assert!(
            lines[2].starts_with("t.yml:2:3: prices.m: `input` is -1"),
            "{err}"
        );
        let err = Config::parse("budget: {ussd: 1}\n", "t.yml").unwrap_err();
        assert!(err.contains("did you mean `usd`"), "{err}");
    }

    #[test]
    fn warm_lists_resolve_loop_then_type_then_run_and_bad_entries_name_their_place() {
        let c = Config::parse(
            "warm: [cargo]\nloop-types:\n  web: {extends: code, warm: [node, dist/]}\n  web2: {extends: web}\nloops:\n  - {name: a, type: code, task: t}\n  - {name: b, type: web2, task: t}\n  - {name: c, type: web, task: t, warm: []}\n  - {name: d, type: web, task: t, warm: [python]}\n",
            "t.yml",
        )
        .unwrap();
        let types = c.loop_types().unwrap();
        let of = |i: usize| {
            let def = &c.loops[i];
            c.warm_paths(def, &types[&def.loop_type])
        };
        assert_eq!(of(0), vec![PathBuf::from("target")], "the run's");
        assert_eq!(
            of(1),
            vec![PathBuf::from("node_modules"), PathBuf::from("dist")],
            "its type's, inherited through extends"
        );
        assert!(of(2).is_empty(), "its own empty list turns it off");
        assert_eq!(of(3), vec![PathBuf::from(".venv")], "its own");
        assert!(Config::default().warm.is_empty(), "none by default");

        let text = "warm: [cargo, ../x]\nloop-types:\n  web: {extends: code, warm: [.git]}\nloops:\n  - name: a\n    type: code\n    task: t\n    warm: [node, /abs]\n";
        let err = Config::parse(text, "t.yml").unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert!(
            lines[0].starts_with("t.yml:1:15: warm[1]: `../x` leaves the repository"),
            "{err}"
        );
        assert!(
            lines[1].starts_with("t.yml:3:31: loop-types.web.warm[0]: `.git` is git's own data"),
            "{err}"
        );
        assert!(
            lines[2].starts_with("t.yml:8:18: loops[0].warm[1]: `/abs` is absolute"),
            "{err}"
        );
        assert!(lines[2].contains("such as `target`"), "{err}");
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
        assert!(matches!(
            config.compiler_cache,
            compiler_cache::CompilerCacheConfig::Sccache { .. }
        ));
    }

    #[test]
    fn the_repository_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("taskdaemon.yml");
        Config::load(&path).unwrap();
    }
}
