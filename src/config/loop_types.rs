//! Loop types: the built-in `plan`, `spec`, `phase`, `code` and `ralph`, and user types that
//! `extends:` one of them (or another user type) and override fields.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::Problem;
use td_engine::prompt;
use td_toolkit::catalog::{BUILTIN_LOOP_TYPES, default_tool_set};

/// A loop type as written in `taskdaemon.yml` (every field optional: unset fields come from
/// the type it extends).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LoopTypeDef {
    /// The type this one starts from (a built-in or another user type).
    pub extends: Option<String>,
    /// Tools its model sees.
    pub tools: Option<Vec<String>>,
    /// System prompt template (minijinja).
    pub system_prompt: Option<String>,
    /// First-message template of each iteration (minijinja).
    pub iteration_prompt: Option<String>,
    /// Validation command; exit code `success-code` completes the loop.
    pub validation: Option<String>,
    /// Exit code of the validation command that means success.
    pub success_code: Option<i32>,
    /// Iterations before the loop fails.
    pub max_iterations: Option<u32>,
    /// Model turns per iteration.
    pub max_turns: Option<u32>,
    /// Limit of one iteration's model turns, in milliseconds.
    pub iteration_timeout_ms: Option<u64>,
    /// Alert event types the loop hears (default: every loop's `broadcast_alert`, no
    /// system alert such as `loop_started` / `loop_completed`).
    pub subscriptions: Option<Vec<String>>,
    /// Command of the `build` tool.
    pub build: Option<String>,
    /// Command of the `test` tool.
    pub test: Option<String>,
    /// The budget of each loop of the type, key by key over the type it extends.
    pub budget: Option<super::BudgetDef>,
    /// What its loops with dependencies start from (a loop's `handover` overrides it).
    pub handover: Option<super::loops::Handover>,
    /// Build state its loops' new worktrees are seeded with (a loop's `warm` overrides it;
    /// see `config::warm`).
    pub warm: Option<Vec<String>>,
}

/// A loop type with every field resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopType {
    /// Its name.
    pub name: String,
    /// Tools its model sees.
    pub tools: Vec<String>,
    /// System prompt template.
    pub system_prompt: String,
    /// Iteration prompt template.
    pub iteration_prompt: String,
    /// Validation command.
    pub validation: Option<String>,
    /// Exit code that means success.
    pub success_code: i32,
    /// Iterations before failing.
    pub max_iterations: u32,
    /// Model turns per iteration.
    pub max_turns: u32,
    /// Limit of one iteration's model turns.
    pub iteration_timeout: Option<Duration>,
    /// Alert event types heard; `None` = loops' broadcasts, no system alerts.
    pub subscriptions: Option<Vec<String>>,
    /// `build` tool command.
    pub build: Option<String>,
    /// `test` tool command.
    pub test: Option<String>,
    /// The budget of each loop of the type.
    pub budget: super::BudgetDef,
    /// What its loops with dependencies start from (default: merged).
    pub handover: super::loops::Handover,
    /// Its own `warm:` or the one of the type it extends; `None`: the run's.
    pub warm: Option<Vec<String>>,
}

/// The built-in type `name`.
fn builtin(name: &str) -> Option<LoopType> {
    let tools = default_tool_set(name)?
        .into_iter()
        .map(str::to_string)
        .collect();
    let (max_iterations, max_turns) = match name {
        "plan" | "spec" => (5, 40),
        "phase" => (8, 60),
        _ => (10, 80),
    };
    Some(LoopType {
        name: name.to_string(),
        tools,
        system_prompt: prompt::DEFAULT_SYSTEM.to_string(),
        iteration_prompt: match name {
            // The stages that build on an earlier stage's plans, specs or phases name them.
            "spec" | "phase" | "code" => prompt::STAGE_ITERATION,
            _ => prompt::DEFAULT_ITERATION,
        }
        .to_string(),
        validation: None,
        success_code: 0,
        max_iterations,
        max_turns,
        iteration_timeout: None,
        subscriptions: None,
        build: None,
        test: None,
        budget: super::BudgetDef::default(),
        handover: super::loops::Handover::default(),
        warm: None,
    })
}

/// Resolves every loop type (built-ins and `defs`), following `extends` chains; every
/// type's problem, not only the first.
pub fn resolve(
    defs: &BTreeMap<String, LoopTypeDef>,
) -> Result<BTreeMap<String, LoopType>, Vec<Problem>> {
    let mut done = BTreeMap::new();
    let mut problems: Vec<Problem> = Vec::new();
    for name in defs.keys() {
        if let Err(p) = resolve_one(name, defs, &mut done, &mut Vec::new()) {
            // A type that extends a broken one meets the same problem: report it once.
            if !problems.contains(&p) {
                problems.push(p);
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let mut out: BTreeMap<String, LoopType> = BUILTIN_LOOP_TYPES
        .iter()
        .filter_map(|n| builtin(n).map(|t| (n.to_string(), t)))
        .collect();
    out.extend(done);
    Ok(out)
}

fn unknown(name: &str, defs: &BTreeMap<String, LoopTypeDef>) -> String {
    let mut known: Vec<&str> = BUILTIN_LOOP_TYPES.to_vec();
    known.extend(defs.keys().map(String::as_str));
    known.sort_unstable();
    known.dedup();
    let hint = td_base::suggest::closest(name, known.iter().copied())
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default();
    format!(
        "unknown loop type `{name}`{hint}; known types: {}",
        known.join(", ")
    )
}

fn resolve_one(
    name: &str,
    defs: &BTreeMap<String, LoopTypeDef>,
    done: &mut BTreeMap<String, LoopType>,
    chain: &mut Vec<String>,
) -> Result<LoopType, Problem> {
    if let Some(t) = done.get(name) {
        return Ok(t.clone());
    }
    let Some(def) = defs.get(name) else {
        return builtin(name).ok_or_else(|| Problem::new("loop-types", unknown(name, defs)));
    };
    let extends = format!("loop-types.{name}.extends");
    if chain.iter().any(|c| c == name) {
        chain.push(name.to_string());
        return Err(Problem::new(
            extends,
            format!(
                "loop-types: `extends` forms a cycle: {}",
                chain.join(" -> ")
            ),
        ));
    }
    chain.push(name.to_string());
    let base = match &def.extends {
        // Redefining a built-in in place: `code: {extends: code, ...}`.
        Some(parent) if parent == name => builtin(name).ok_or_else(|| {
            Problem::new(
                &extends,
                format!("loop-types.{name}: `extends: {name}` names itself"),
            )
        })?,
        Some(parent) if !defs.contains_key(parent) && builtin(parent).is_none() => {
            return Err(Problem::new(
                extends,
                format!("loop-types.{name}: {}", unknown(parent, defs)),
            ));
        }
        Some(parent) => resolve_one(parent, defs, done, chain)?,
        None => builtin(name).ok_or_else(|| {
            Problem::new(
                format!("loop-types.{name}"),
                format!(
                    "loop-types.{name}: a new type needs `extends:` (one of {}, or another type of this file)",
                    BUILTIN_LOOP_TYPES.join(", ")
                ),
            )
        })?,
    };
    chain.pop();
    let resolved = LoopType {
        name: name.to_string(),
        tools: def.tools.clone().unwrap_or(base.tools),
        system_prompt: def.system_prompt.clone().unwrap_or(base.system_prompt),
        iteration_prompt: def
            .iteration_prompt
            .clone()
            .unwrap_or(base.iteration_prompt),
        validation: def.validation.clone().or(base.validation),
        success_code: def.success_code.unwrap_or(base.success_code),
        max_iterations: def.max_iterations.unwrap_or(base.max_iterations),
        max_turns: def.max_turns.unwrap_or(base.max_turns),
        iteration_timeout: def
            .iteration_timeout_ms
            .map(Duration::from_millis)
            .or(base.iteration_timeout),
        subscriptions: def.subscriptions.clone().or(base.subscriptions),
        build: def.build.clone().or(base.build),
        test: def.test.clone().or(base.test),
        budget: def.budget.unwrap_or_default().over(&base.budget),
        handover: def.handover.unwrap_or(base.handover),
        warm: def.warm.clone().or(base.warm),
    };
    check(&resolved)?;
    done.insert(name.to_string(), resolved.clone());
    Ok(resolved)
}

/// Load-time checks of a resolved type: known tools, limits above zero, templates that
/// render with the variables a loop provides.
fn check(t: &LoopType) -> Result<(), Problem> {
    let at = format!("loop-types.{}", t.name);
    let problem = |field: &str, message: String| Problem::new(format!("{at}.{field}"), message);
    td_tools::tool_set(&t.tools).map_err(|e| problem("tools", format!("{at}.tools: {e}")))?;
    for (field, value) in [
        ("max-iterations", t.max_iterations),
        ("max-turns", t.max_turns),
    ] {
        if value == 0 {
            return Err(problem(field, format!("{at}: {field} must be at least 1")));
        }
    }
    if t.iteration_timeout == Some(Duration::ZERO) {
        return Err(problem(
            "iteration-timeout-ms",
            format!("{at}: iteration-timeout-ms must be at least 1"),
        ));
    }
    let (peers, progress) = (["other".to_string()], ["a note".to_string()]);
    let artifacts = [td_toolkit::artifact_files::ArtifactRef {
        kind: "plan".to_string(),
        name: "example".to_string(),
        path: "taskdaemon-artifacts/plan-example.md".to_string(),
    }];
    let sample = prompt::PromptVars {
        loop_name: "example",
        loop_type: &t.name,
        task: "example task",
        validation: t.validation.as_deref(),
        peers: &peers,
        progress: &progress,
        iteration: 1,
        max_iterations: t.max_iterations,
        artifacts: &artifacts,
    };
    prompt::render(&t.system_prompt, &sample.system()).map_err(|e| {
        // The system prompt is sent unchanged with every iteration (the prompt cache
        // depends on it): say so when it uses a variable that changes between them.
        let why = if prompt::render(&t.system_prompt, &sample.iteration()).is_ok() {
            format!(
                "it uses a variable that changes between iterations ({}), and the system \
                 prompt must be the same for every iteration so that it can be cached; move \
                 that part to iteration-prompt",
                prompt::ITERATION_VARIABLES.join(", ")
            )
        } else {
            e.to_string()
        };
        problem("system-prompt", format!("{at}.system-prompt: {why}"))
    })?;
    prompt::render(&t.iteration_prompt, &sample.iteration())
        .map_err(|e| problem("iteration-prompt", format!("{at}.iteration-prompt: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Messages;

    fn defs(yaml: &str) -> BTreeMap<String, LoopTypeDef> {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn builtins_exist_with_their_tool_sets() {
        let types = resolve(&BTreeMap::new()).unwrap();
        for name in BUILTIN_LOOP_TYPES {
            assert!(types[*name].tools.contains(&"complete_task".to_string()));
        }
        assert!(!types["plan"].tools.contains(&"run_command".to_string()));
    }

    #[test]
    fn user_types_extend_and_override_every_field() {
        let types = resolve(&defs(
            r#"
rust:
  extends: code
  validation: cargo test
  success-code: 0
  max-iterations: 3
  max-turns: 7
  iteration-timeout-ms: 1000
  subscriptions: [api_ready]
  build: cargo build
  test: cargo test --lib
  system-prompt: "You are {{ loop_name }}{% if has_validation %} (validated){% endif %}"
  iteration-prompt: "{{ task }}"
strict:
  extends: rust
  tools: [read_file, complete_task]
  success-code: 2
"#,
        ))
        .unwrap();
        let r = &types["rust"];
        assert_eq!(r.validation.as_deref(), Some("cargo test"));
        assert_eq!((r.max_iterations, r.max_turns), (3, 7));
        assert_eq!(r.iteration_timeout, Some(Duration::from_millis(1000)));
        assert_eq!(r.subscriptions, Some(vec!["api_ready".to_string()]));
        assert_eq!(r.build.as_deref(), Some("cargo build"));
        assert_eq!(r.test.as_deref(), Some("cargo test --lib"));
        assert_eq!(r.tools, types["code"].tools);
        let s = &types["strict"];
        assert_eq!(s.tools, vec!["read_file", "complete_task"]);
        assert_eq!(s.success_code, 2);
        assert_eq!(
            s.validation.as_deref(),
            Some("cargo test"),
            "inherited from rust"
        );
        assert_eq!(s.system_prompt, r.system_prompt);
    }

    #[test]
    fn a_builtin_can_be_overridden_in_place() {
        let types = resolve(&defs("code:\n  max-iterations: 2\n")).unwrap();
        assert_eq!(types["code"].max_iterations, 2);
        assert_eq!(
            types["code"].tools,
            resolve(&BTreeMap::new()).unwrap()["code"].tools
        );
    }

    #[test]
    fn bad_types_are_refused_with_reasons() {
        let err = resolve(&defs("a: {extends: b}\nb: {extends: a}\n"))
            .unwrap_err()
            .messages();
        assert!(err.contains("cycle"), "{err}");
        let err = resolve(&defs("a: {extends: cdoe}\n"))
            .unwrap_err()
            .messages();
        assert!(err.contains("did you mean `code`"), "{err}");
        let err = resolve(&defs("a: {max-turns: 3}\n"))
            .unwrap_err()
            .messages();
        assert!(err.contains("needs `extends:`"), "{err}");
        let err = resolve(&defs("a: {extends: code, tools: [read_fil]}\n"))
            .unwrap_err()
            .messages();
        assert!(
            err.contains("loop-types.a.tools") && err.contains("read_file"),
            "{err}"
        );
        let err = resolve(&defs("a: {extends: code, max-iterations: 0}\n"))
            .unwrap_err()
            .messages();
        assert!(err.contains("at least 1"), "{err}");
        let err = resolve(&defs("a: {extends: code, iteration-timeout-ms: 0}\n"))
            .unwrap_err()
            .messages();
        assert!(err.contains("at least 1"), "{err}");
        let err = resolve(&defs("a: {extends: code, system-prompt: \"{{ nope }}\"}\n"))
            .unwrap_err()
            .messages();
        assert!(
            err.contains("system-prompt") && err.contains("undefined"),
            "{err}"
        );
        let err = resolve(&defs(
            "a: {extends: code, iteration-prompt: \"{% if %}\"}\n",
        ))
        .unwrap_err()
        .messages();
        assert!(err.contains("iteration-prompt"), "{err}");
    }

    #[test]
    fn a_system_prompt_that_changes_between_iterations_is_refused() {
        for var in ["iteration", "progress", "max_iterations", "artifacts"] {
            let yaml = format!("a: {{extends: code, system-prompt: \"Turn {{{{ {var} }}}}\"}}\n");
            let err = resolve(&defs(&yaml)).unwrap_err().messages();
            assert!(
                err.contains(
                    "loop-types.a.system-prompt: it uses a variable that changes between iterations"
                ) && err.contains("move that part to iteration-prompt"),
                "{var}: {err}"
            );
        }
        // In the iteration prompt they are fine.
        resolve(&defs(
            "a: {extends: code, iteration-prompt: \"{{ iteration }} {{ progress }} {% for a in artifacts %}{{ a.kind }} {{ a.name }} {{ a.path }}{% endfor %}\"}\n",
        ))
        .unwrap();
    }

    #[test]
    fn the_stages_after_a_plan_name_its_artifacts() {
        let types = resolve(&BTreeMap::new()).unwrap();
        for name in ["spec", "phase", "code"] {
            assert_eq!(
                types[name].iteration_prompt,
                prompt::STAGE_ITERATION,
                "{name}"
            );
        }
        for name in ["plan", "ralph"] {
            assert_eq!(
                types[name].iteration_prompt,
                prompt::DEFAULT_ITERATION,
                "{name}"
            );
        }
        // A type extending one of them inherits it.
        let types = resolve(&defs("rust: {extends: code}\n")).unwrap();
        assert_eq!(types["rust"].iteration_prompt, prompt::STAGE_ITERATION);
    }
}
