//! The loops of a run as written in `taskdaemon.yml`, and the checks made when the file
//! loads: unique, well-formed names; known types; `depends-on` naming loops of the file
//! without cycles.

use std::collections::{BTreeMap, BTreeSet};

use super::Problem;
use serde::Deserialize;

/// Where a loop works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorktreeMode {
    /// Its own `git worktree` on its own branch (the default).
    Own,
    /// A worktree shared by every loop naming the same group.
    Shared(String),
    /// The repository's own checkout.
    Repo,
}

impl<'de> Deserialize<'de> for WorktreeMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "own" => Ok(WorktreeMode::Own),
            "repo" => Ok(WorktreeMode::Repo),
            other => match other.strip_prefix("shared:") {
                Some(group) if valid_name(group) => Ok(WorktreeMode::Shared(group.to_string())),
                _ => Err(serde::de::Error::custom(format!(
                    "worktree must be `own`, `repo` or `shared:<group>` (group: letters, digits, - and _), not `{other}`"
                ))),
            },
        }
    }
}

/// One loop of the run.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LoopDef {
    /// Its name: the loop's exec id, and part of its branch name.
    pub name: String,
    /// Its loop type (built-in or from `loop-types`).
    #[serde(rename = "type")]
    pub loop_type: String,
    /// What it has to do.
    pub task: String,
    /// Loops that must complete before this one starts.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Validation command, overriding the type's.
    pub validation: Option<String>,
    /// Where it works (default: its own worktree).
    pub worktree: Option<WorktreeMode>,
    /// Branch its worktree starts from (default: the repository's current branch).
    pub base: Option<String>,
    /// Integrate its work into its base branch (the user's) when it completes, rather than
    /// into the run's integration branch (default: the run's `merge`).
    pub merge: Option<bool>,
    /// What it starts from when it has dependencies (default: `merged`).
    pub handover: Option<Handover>,
    /// How many times the merge queue gives its work back to it (a conflict, a failing
    /// merged validation) before it is blocked (default: the run's `merge-attempts`).
    pub merge_attempts: Option<u32>,
    /// Its budget, key by key over its type's.
    pub budget: Option<super::BudgetDef>,
    /// Build state its new worktree is seeded with, over its type's and the run's (`[]`:
    /// none; see `config::warm`).
    pub warm: Option<Vec<String>>,
}

/// What a loop with dependencies starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Handover {
    /// Its dependencies' work, once each of them is integrated: the head of its integration
    /// target, with the work of dependencies that landed in another target merged in.
    #[default]
    Merged,
    /// Its base branch as it is (dependencies only order the loops).
    Base,
}

/// The name of the run's integration branch (`taskdaemon/<run>/integration`, and
/// `integration-<base>` for other bases): no loop may be called so, or its branch would be
/// the integration branch.
pub const INTEGRATION: &str = "integration";

/// Loop names become branch and directory names.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.starts_with('-')
}

/// Checks names, types and dependencies of `loops`; every problem, not only the first.
pub fn check(loops: &[LoopDef], types: &BTreeSet<String>) -> Result<(), Vec<Problem>> {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, l) in loops.iter().enumerate() {
        let at = format!("loops[{i}] ({})", l.name);
        let mut problem = |field: &str, message: String| {
            problems.push(Problem::new(format!("loops[{i}].{field}"), message));
        };
        if !valid_name(&l.name) {
            problem(
                "name",
                format!(
                    "{at}: a loop name uses letters, digits, - and _ (at most 64, not starting with -)"
                ),
            );
        }
        if l.name == INTEGRATION || l.name.starts_with("integration-") {
            problem(
                "name",
                format!(
                    "{at}: `{INTEGRATION}` and names starting with `{INTEGRATION}-` are taken by the run's integration branches (taskdaemon/<run>/{INTEGRATION}); rename the loop"
                ),
            );
        }
        if !seen.insert(l.name.as_str()) {
            problem("name", format!("{at}: the name `{}` is used twice", l.name));
        }
        if !types.contains(&l.loop_type) {
            let hint = td_base::suggest::closest(&l.loop_type, types.iter().map(String::as_str))
                .map(|s| format!(" (did you mean `{s}`?)"))
                .unwrap_or_default();
            problem(
                "type",
                format!(
                    "{at}: unknown type `{}`{hint}; known types: {}",
                    l.loop_type,
                    types.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
        }
        if l.task.trim().is_empty() {
            problem("task", format!("{at}: the task is empty"));
        }
    }
    for (i, l) in loops.iter().enumerate() {
        for (j, dep) in l.depends_on.iter().enumerate() {
            let at = format!("loops[{i}].depends-on[{j}]");
            if !seen.contains(dep.as_str()) {
                let hint = td_base::suggest::closest(dep, seen.iter().copied())
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                problems.push(Problem::new(
                    at,
                    format!(
                        "loops[{i}] ({}): depends-on names unknown loop `{dep}`{hint}",
                        l.name
                    ),
                ));
            } else if dep == &l.name {
                problems.push(Problem::new(
                    at,
                    format!("loops[{i}] ({}): a loop cannot depend on itself", l.name),
                ));
            }
        }
    }
    if problems.is_empty()
        && let Some(cycle) = find_cycle(loops)
    {
        problems.push(Problem::new(
            "loops",
            format!("loops: depends-on forms a cycle: {}", cycle.join(" -> ")),
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

fn find_cycle(loops: &[LoopDef]) -> Option<Vec<String>> {
    let deps: BTreeMap<&str, &[String]> = loops
        .iter()
        .map(|l| (l.name.as_str(), l.depends_on.as_slice()))
        .collect();
    // 0 = unvisited, 1 = on the current path, 2 = done.
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    fn visit<'a>(
        n: &'a str,
        deps: &BTreeMap<&'a str, &'a [String]>,
        state: &mut BTreeMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|p| *p == n).unwrap_or(0);
                let mut cycle: Vec<String> = path[start..].iter().map(|s| s.to_string()).collect();
                cycle.push(n.to_string());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(n, 1);
        path.push(n);
        for d in deps.get(n).copied().unwrap_or(&[]) {
            if let Some(c) = visit(d.as_str(), deps, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n, 2);
        None
    }
    for l in loops {
        if let Some(c) = visit(&l.name, &deps, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Messages;

    fn parse(yaml: &str) -> Vec<LoopDef> {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    fn types() -> BTreeSet<String> {
        ["code", "plan"].iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_good_list_passes_and_every_field_parses() {
        let loops = parse(
            r#"
- name: api
  type: code
  task: build the api
  validation: cargo test
  worktree: own
  base: main
  merge: true
- name: client
  type: code
  task: build the client
  depends-on: [api]
  worktree: "shared:front"
- name: docs
  type: plan
  task: write docs
  worktree: repo
"#,
        );
        check(&loops, &types()).unwrap();
        assert_eq!(loops[0].validation.as_deref(), Some("cargo test"));
        assert_eq!(loops[0].base.as_deref(), Some("main"));
        assert_eq!(loops[0].merge, Some(true));
        assert_eq!(loops[0].worktree, Some(WorktreeMode::Own));
        assert_eq!(
            loops[1].worktree,
            Some(WorktreeMode::Shared("front".into()))
        );
        assert_eq!(loops[2].worktree, Some(WorktreeMode::Repo));
        assert_eq!(loops[1].depends_on, vec!["api"]);
    }

    #[test]
    fn every_problem_is_reported_with_the_path_of_its_field() {
        let problems = check(
            &parse("- {name: a, type: cdoe, task: ''}\n- {name: a, type: code, task: t, depends-on: [a, zz]}\n"),
            &types(),
        )
        .unwrap_err();
        let at: Vec<&str> = problems.iter().map(|p| p.at.as_str()).collect();
        assert_eq!(
            at,
            vec![
                "loops[0].type",
                "loops[0].task",
                "loops[1].name",
                "loops[1].depends-on[0]",
                "loops[1].depends-on[1]"
            ]
        );
    }

    #[test]
    fn the_integration_branch_names_are_not_loop_names() {
        for name in ["integration", "integration-main"] {
            let problems = check(
                &parse(&format!("- {{name: {name}, type: code, task: t}}\n")),
                &types(),
            )
            .unwrap_err();
            assert_eq!(problems[0].at, "loops[0].name");
            assert!(
                problems[0].message.contains("integration branch"),
                "{problems:?}"
            );
        }
        check(
            &parse(
                "- {name: integrations, type: code, task: t, handover: base, merge-attempts: 1}\n",
            ),
            &types(),
        )
        .unwrap();
    }

    #[test]
    fn bad_lists_are_refused_with_reasons() {
        let t = types();
        let err = check(&parse("- {name: a, type: code, task: t, depends-on: [b]}\n- {name: b, type: code, task: t, depends-on: [a]}\n"), &t).unwrap_err().messages();
        assert!(err.contains("cycle: a -> b -> a"), "{err}");
        let err = check(
            &parse("- {name: a, type: code, task: t, depends-on: [aa]}\n"),
            &t,
        )
        .unwrap_err()
        .messages();
        assert!(
            err.contains("unknown loop `aa`") && err.contains("did you mean `a`"),
            "{err}"
        );
        let err = check(
            &parse("- {name: a, type: code, task: t, depends-on: [a]}\n"),
            &t,
        )
        .unwrap_err()
        .messages();
        assert!(err.contains("itself"), "{err}");
        let err = check(&parse("- {name: a, type: cdoe, task: t}\n"), &t)
            .unwrap_err()
            .messages();
        assert!(err.contains("did you mean `code`"), "{err}");
        let err = check(
            &parse("- {name: a, type: code, task: t}\n- {name: a, type: code, task: t}\n"),
            &t,
        )
        .unwrap_err()
        .messages();
        assert!(err.contains("used twice"), "{err}");
        let err = check(&parse("- {name: 'a b', type: code, task: t}\n"), &t)
            .unwrap_err()
            .messages();
        assert!(err.contains("letters, digits"), "{err}");
        let err = check(&parse("- {name: a, type: code, task: '  '}\n"), &t)
            .unwrap_err()
            .messages();
        assert!(err.contains("empty"), "{err}");
        let bad: Result<Vec<LoopDef>, _> =
            serde_yaml_ng::from_str("- {name: a, type: code, task: t, worktree: mine}\n");
        assert!(bad.unwrap_err().to_string().contains("shared:<group>"));
    }
}
