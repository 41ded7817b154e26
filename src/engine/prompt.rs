//! Prompt templates, rendered with minijinja in strict mode: a variable the template uses
//! but the loop does not provide is an error, never an empty string or a stray `{{`.

use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

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

/// The default first user message of every iteration.
pub const DEFAULT_ITERATION: &str = "\
# Task
{{ task }}
{% if progress %}
# Progress from earlier iterations
{% for note in progress %}- {{ note }}
{% endfor %}{% endif %}
This is iteration {{ iteration }} of at most {{ max_iterations }}; your context starts \
fresh each iteration, so the files in your worktree and the notes above are all that \
carries over.";

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

/// Renders `template` with `vars`; unknown variables are errors.
pub fn render<S: Serialize>(template: &str, vars: &S) -> Result<String, String> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.add_template("prompt", template)
        .map_err(|e| format!("prompt template does not parse: {e}"))?;
    env.get_template("prompt")
        .and_then(|t| t.render(minijinja::value::Serde(vars)))
        .map_err(|e| format!("prompt template failed: {e}"))
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
    fn missing_variables_and_bad_syntax_are_errors() {
        let err = render("hello {{ nobody }}", &json!({})).unwrap_err();
        assert!(err.contains("undefined"), "{err}");
        let err = render("{% if x %}", &json!({"x": true})).unwrap_err();
        assert!(err.contains("does not parse"), "{err}");
    }
}
