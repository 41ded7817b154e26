//! Prompt templates, rendered with minijinja in strict mode: a variable the template uses
//! but the loop does not provide is an error, never an empty string or a stray `{{`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;
use serde_json::{Value, json};

use td_base::sync::lock;
use td_toolkit::artifact_files::ArtifactRef;

/// The default system prompt of a loop.
pub const DEFAULT_SYSTEM: &str = "\
You are `{{ loop_name }}`, a {{ loop_type }} loop of TaskDaemon. You work in your own git \
worktree; every path is relative to its root and tools cannot leave it.
Work in small verified steps. Read a file before you edit it; if a tool says a file \
changed, read it again.{% if has_validation %} When you believe the task is done, call \
complete_task: the loop completes only if the validation command `{{ validation }}` \
passes.{% else %} When the task is done, call complete_task.{% endif %}{% if peers %}
Other loops in this run: {{ peers | join(\", \") }}. Ask them with query_loop, hand them \
data with share_data.{% endif %}";

/// The start of an iteration's first message: the task. A macro, not a `const`, so that
/// `concat!` can build both iteration templates from the same words.
macro_rules! task_section {
    () => {
        "# Task\n{{ task }}\n"
    };
}

/// The end of an iteration's first message: the notes of earlier iterations and where this
/// one stands.
macro_rules! progress_section {
    () => {
        "\
{% if progress %}
# Progress from earlier iterations
{% for note in progress %}- {{ note }}
{% endfor %}{% endif %}
This is iteration {{ iteration }} of at most {{ max_iterations }}; your context starts \
fresh each iteration, so the files in your worktree and the notes above are all that \
carries over."
    };
}

/// The default first user message of every iteration.
pub const DEFAULT_ITERATION: &str = concat!(task_section!(), progress_section!());

/// The first user message of every iteration of the built-in `spec`, `phase` and `code` loop
/// types: [`DEFAULT_ITERATION`] that also names the plans, specs and phases in the worktree
/// (the stage before wrote them; a dependency's handover or the loop's base branch brought
/// them), so that a stage starts from the artifacts of the stage before. Without any it is
/// the same text as [`DEFAULT_ITERATION`] (a test keeps it so).
pub const STAGE_ITERATION: &str = concat!(
    task_section!(),
    "\
{% if artifacts %}
# Plans/specs from earlier stages
These artifact files are in your worktree (written by the stages before this loop, or by \
this loop in an earlier iteration); read the ones your task builds on before you start:
{% for a in artifacts %}- {{ a.kind }} `{{ a.name }}`: {{ a.path }}
{% endfor %}{% endif %}",
    progress_section!()
);

/// The variables of an iteration's first message that change from one iteration to the next.
/// A system prompt does not see them: it must be byte-identical for every iteration of a
/// loop, so that the provider's prompt cache serves it, and the tool definitions sent before
/// it, to every iteration. (Anything else that changes — inbox items, file-change notices —
/// is added after the conversation so far, never before.) `artifacts` is one of them: the
/// artifact files in the worktree at the iteration's start, which the loop itself adds to.
pub const ITERATION_VARIABLES: [&str; 4] = ["progress", "iteration", "max_iterations", "artifacts"];

/// What a loop's prompts are rendered from.
#[derive(Debug, Clone)]
pub struct PromptVars<'a> {
    /// The loop's name.
    pub loop_name: &'a str,
    /// Its type.
    pub loop_type: &'a str,
    /// Its task.
    pub task: &'a str,
    /// Its validation command, if any.
    pub validation: Option<&'a str>,
    /// The other loops of the run.
    pub peers: &'a [String],
    /// Notes from earlier iterations.
    pub progress: &'a [String],
    /// This iteration's number.
    pub iteration: u32,
    /// The loop's iteration limit.
    pub max_iterations: u32,
    /// The artifact files in the loop's worktree at the iteration's start (kind, name,
    /// worktree-relative path), see [`td_toolkit::artifact_files::present`].
    pub artifacts: &'a [ArtifactRef],
}

impl PromptVars<'_> {
    /// What the system prompt sees: the same for every iteration of the loop.
    pub fn system(&self) -> Value {
        json!({
            "loop_name": self.loop_name,
            "loop_type": self.loop_type,
            "task": self.task,
            "has_validation": self.validation.is_some(),
            "validation": self.validation.unwrap_or_default(),
            "peers": self.peers,
        })
    }

    /// What an iteration's first message sees: the system prompt's variables and
    /// [`ITERATION_VARIABLES`].
    pub fn iteration(&self) -> Value {
        let mut vars = self.system();
        if let Some(map) = vars.as_object_mut() {
            map.insert("progress".into(), json!(self.progress));
            map.insert("iteration".into(), json!(self.iteration));
            map.insert("max_iterations".into(), json!(self.max_iterations));
            map.insert("artifacts".into(), json!(self.artifacts));
        }
        vars
    }
}

/// The system prompt of a side call that answers another loop's question.
pub const ANSWER_SYSTEM: &str = "\
You are `{{ loop_name }}`, a {{ loop_type }} loop of TaskDaemon. Loop `{{ from }}` asks you \
a question. Answer it briefly and precisely from your task, your progress and your \
worktree (read-only tools are available). If you do not know, say so.

# Your task
{{ task }}
{% if progress %}
# Your progress
{% for note in progress %}- {{ note }}
{% endfor %}{% endif %}";

/// [`ANSWER_SYSTEM`] rendered without the template engine. The answer prompt is fixed (not
/// configurable) and is rendered for every question a loop answers, where running the
/// template took half the cost of routing and answering a query. A test keeps the two
/// identical.
pub fn answer_system(
    loop_name: &str,
    loop_type: &str,
    from: &str,
    task: &str,
    progress: &[String],
) -> String {
    let notes: usize = progress.iter().map(|n| n.len() + 3).sum();
    let mut out = String::with_capacity(320 + loop_name.len() + from.len() + task.len() + notes);
    for part in [
        "You are `",
        loop_name,
        "`, a ",
        loop_type,
        " loop of TaskDaemon. Loop `",
        from,
        "` asks you a question. Answer it briefly and precisely from your task, your progress \
         and your worktree (read-only tools are available). If you do not know, say so.\n\n\
         # Your task\n",
        task,
        "\n",
    ] {
        out.push_str(part);
    }
    if !progress.is_empty() {
        out.push_str("\n# Your progress\n");
        for note in progress {
            out.push_str("- ");
            out.push_str(note);
            out.push('\n');
        }
    }
    out
}

/// Compiled templates by source text. A run has a handful of templates (the defaults and
/// those of its loop types), rendered on every iteration and every answered query; parsing
/// and compiling one costs far more than rendering it.
type Compiled = HashMap<String, Arc<Environment<'static>>>;

/// More distinct templates than this means they are being generated; the cache then starts
/// over rather than grow without bound.
const MAX_CACHED: usize = 64;

/// A prompt template that does not parse or does not render.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// Bad syntax.
    #[error("prompt template does not parse: {0}")]
    Parse(#[source] minijinja::Error),
    /// It parsed, but rendering failed (an unknown variable, a failing filter...).
    #[error("prompt template failed: {0}")]
    Render(#[source] minijinja::Error),
}

fn compiled(template: &str) -> Result<Arc<Environment<'static>>, PromptError> {
    static CACHE: OnceLock<Mutex<Compiled>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(env) = lock(cache).get(template) {
        return Ok(env.clone());
    }
    // Compiled outside the lock: a slow parse must not stall other loops' renders.
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.add_template_owned("prompt", template.to_string())
        .map_err(PromptError::Parse)?;
    let env = Arc::new(env);
    let mut map = lock(cache);
    if map.len() >= MAX_CACHED {
        map.clear();
    }
    map.insert(template.to_string(), env.clone());
    Ok(env)
}

/// Renders `template` with `vars`; unknown variables are errors.
pub fn render<S: Serialize>(template: &str, vars: &S) -> Result<String, PromptError> {
    compiled(template)?
        .get_template("prompt")
        .and_then(|t| t.render(minijinja::value::Serde(vars)))
        .map_err(PromptError::Render)
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    #[test]
    fn defaults_render_with_conditionals_and_loops() {
        let sys = render(
            DEFAULT_SYSTEM,
            &json!({"loop_name": "api", "loop_type": "code", "has_validation": true,
                    "validation": "cargo test", "peers": ["client", "docs"]}),
        )
        .unwrap();
        assert!(sys.contains("`cargo test` passes"));
        assert!(sys.contains("client, docs"));
        assert!(!sys.contains("{%") && !sys.contains("{{"));
        let it = render(
            DEFAULT_ITERATION,
            &json!({"task": "T", "progress": ["a", "b"], "iteration": 2, "max_iterations": 5}),
        )
        .unwrap();
        assert!(it.contains("- a\n- b\n"));
        assert!(it.contains("iteration 2 of at most 5"));
        let first = render(
            DEFAULT_ITERATION,
            &json!({"task": "T", "progress": [], "iteration": 1, "max_iterations": 5}),
        )
        .unwrap();
        assert!(!first.contains("Progress"));
    }

    #[test]
    fn the_system_prompt_sees_no_iteration_variable() {
        let progress = vec!["a note".to_string()];
        let peers = vec!["client".to_string()];
        let vars = |iteration| PromptVars {
            loop_name: "api",
            loop_type: "code",
            task: "T",
            validation: Some("cargo test"),
            peers: &peers,
            progress: &progress,
            iteration,
            max_iterations: 9,
            artifacts: &[],
        };
        assert_eq!(vars(1).system(), vars(7).system());
        for name in ITERATION_VARIABLES {
            assert!(vars(1).system().get(name).is_none(), "{name}");
            assert!(vars(1).iteration().get(name).is_some(), "{name}");
            let err = render(&format!("{{{{ {name} }}}}"), &vars(1).system()).unwrap_err();
            assert!(err.to_string().contains("undefined"), "{name}: {err}");
        }
        let it = render(DEFAULT_ITERATION, &vars(3).iteration()).unwrap();
        assert!(it.starts_with("# Task\nT\n"), "{it}");
        assert!(it.contains("- a note\n") && it.contains("iteration 3 of at most 9"));
        render(DEFAULT_SYSTEM, &vars(1).system()).unwrap();
    }

    #[test]
    fn the_stage_prompt_names_the_artifacts_and_is_the_default_without_them() {
        let progress = vec!["a note".to_string()];
        let artifacts = vec![
            ArtifactRef {
                kind: "plan".into(),
                name: "x".into(),
                path: "taskdaemon-artifacts/plan-x.json".into(),
            },
            ArtifactRef {
                kind: "spec".into(),
                name: "y".into(),
                path: "taskdaemon-artifacts/spec-y.md".into(),
            },
        ];
        fn vars<'a>(progress: &'a [String], artifacts: &'a [ArtifactRef]) -> PromptVars<'a> {
            PromptVars {
                loop_name: "s",
                loop_type: "spec",
                task: "T",
                validation: None,
                peers: &[],
                progress,
                iteration: 1,
                max_iterations: 5,
                artifacts,
            }
        }
        for notes in [&[][..], &progress] {
            assert_eq!(
                render(STAGE_ITERATION, &vars(notes, &[]).iteration()).unwrap(),
                render(DEFAULT_ITERATION, &vars(notes, &[]).iteration()).unwrap()
            );
        }
        let text = render(STAGE_ITERATION, &vars(&progress, &artifacts).iteration()).unwrap();
        assert!(
            text.starts_with(
                "# Task\nT\n\n# Plans/specs from earlier stages\nThese artifact files are in your worktree"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "before you start:\n- plan `x`: taskdaemon-artifacts/plan-x.json\n- spec `y`: taskdaemon-artifacts/spec-y.md\n\n# Progress"
            ),
            "{text}"
        );
    }

    #[test]
    fn answer_system_is_the_template_rendered() {
        let cases: [(&str, &str, &str, &str, Vec<String>); 4] = [
            ("api", "code", "client", "Build the API", vec![]),
            (
                "api",
                "code",
                "client",
                "Two\nlines {{ not a tag }}",
                vec!["a".into()],
            ),
            (
                "x",
                "ralph",
                "y",
                "",
                vec!["first".into(), "sec\nond <b>&".into()],
            ),
            ("ünï", "spec", "çödé", "tâche\n", vec![String::new()]),
        ];
        for (name, ty, from, task, progress) in cases {
            let by_template = render(
                ANSWER_SYSTEM,
                &json!({"loop_name": name, "loop_type": ty, "from": from, "task": task,
                        "progress": progress}),
            )
            .unwrap();
            assert_eq!(answer_system(name, ty, from, task, &progress), by_template);
        }
    }

    #[test]
    fn cached_templates_render_each_call_with_its_own_variables() {
        let t = "{{ who }} {% if more %}and more{% endif %}";
        assert_eq!(
            render(t, &json!({"who": "a", "more": false})).unwrap(),
            "a "
        );
        assert_eq!(
            render(t, &json!({"who": "b", "more": true})).unwrap(),
            "b and more"
        );
        assert!(
            render(t, &json!({}))
                .unwrap_err()
                .to_string()
                .contains("undefined")
        );
    }

    #[test]
    fn missing_variables_and_bad_syntax_are_errors() {
        let err = render("hello {{ nobody }}", &json!({})).unwrap_err();
        assert!(matches!(err, PromptError::Render(_)), "{err:?}");
        assert!(
            err.to_string().starts_with("prompt template failed: "),
            "{err}"
        );
        assert!(err.to_string().contains("undefined"), "{err}");
        let err = render("{% if x %}", &json!({"x": true})).unwrap_err();
        assert!(matches!(err, PromptError::Parse(_)), "{err:?}");
        assert!(err.to_string().contains("does not parse"), "{err}");
    }
}
