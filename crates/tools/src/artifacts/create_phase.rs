//! `create_phase`: records a phase — an objective, concrete tasks (optionally naming the
//! file each touches) and the command that validates it — as
//! `taskdaemon-artifacts/phase-<name>.json` and `.md`.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::artifacts::store::{
    Body, Problems, code_block, create, hang, inline_code, markdown_head, name_schema, text_schema,
};
use td_base::text::count;
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolResult;
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "create_phase";

/// The `create_phase` tool.
pub struct CreatePhase;

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Phase {
    name: String,
    title: String,
    objective: String,
    tasks: Vec<Task>,
    validation_command: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Task {
    description: String,
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    action: Option<Action>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum Action {
    Create,
    Modify,
    Delete,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Modify => "modify",
            Action::Delete => "delete",
        }
    }
}

#[async_trait]
impl Tool for CreatePhase {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Create (or replace) a phase: its objective, the concrete tasks (each optionally naming \
         the worktree file it creates, modifies or deletes) and the shell command that \
         validates the phase. Written as taskdaemon-artifacts/phase-<name>.json and .md, \
         committed with your work for the code loops that follow."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": name_schema("Phase name, used in the artifact's file names"),
                "title": text_schema("Phase title, one line."),
                "objective": text_schema("What is true once the phase is done."),
                "tasks": {
                    "type": "array",
                    "minItems": 1,
                    "description": "The tasks in the order to do them. Required, at least one.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "description": text_schema("What to do."),
                            "file": {
                                "type": "string",
                                "minLength": 1,
                                "description": "Worktree-relative path of the file the task touches. Optional, default: none."
                            },
                            "action": {
                                "type": "string",
                                "enum": ["create", "modify", "delete"],
                                "description": "What the task does to `file`. Optional, default: unspecified."
                            }
                        },
                        "required": ["description"],
                        "additionalProperties": false
                    }
                },
                "validation_command": text_schema("Shell command, run in the worktree, that passes once the phase is done (e.g. \"cargo test lexer::\").")
            },
            "required": ["name", "title", "objective", "tasks", "validation_command"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        create::<Phase>(input, ctx).await
    }
}

impl Body for Phase {
    const TOOL: &'static str = TOOL;
    const KIND: &'static str = "phase";

    fn name(&self) -> &str {
        &self.name
    }

    fn title(&self) -> &str {
        &self.title
    }

    /// Blank texts, at least one task, and task files that stay in the worktree.
    fn check(&self, ctx: &ToolContext, p: &mut Problems) {
        p.text("/objective", &self.objective, "the objective");
        p.text(
            "/validation_command",
            &self.validation_command,
            "the validation command",
        );
        if self.tasks.is_empty() {
            p.push("/tasks", "a phase needs at least one task");
        }
        for (i, task) in self.tasks.iter().enumerate() {
            p.text(
                format!("/tasks/{i}/description"),
                &task.description,
                "the description",
            );
            if let Some(file) = &task.file {
                if file.trim().is_empty() {
                    p.push(
                        format!("/tasks/{i}/file"),
                        "the file is blank; name a path or leave it out",
                    );
                } else if let Err(e) = ctx.resolve(file) {
                    p.push(format!("/tasks/{i}/file"), e.to_string());
                }
            }
        }
    }

    /// The phase as readable Markdown.
    fn markdown(&self) -> String {
        let mut md = markdown_head(
            "phase",
            &self.title,
            &self.name,
            ("Objective", &self.objective),
            ("Tasks", self.tasks.len()),
        );
        md.push('\n');
        for (i, task) in self.tasks.iter().enumerate() {
            let number = format!("{}. ", i + 1);
            let target = match (task.action, &task.file) {
                (Some(a), Some(f)) => format!("[{}] {}: ", a.as_str(), inline_code(f)),
                (None, Some(f)) => format!("{}: ", inline_code(f)),
                (Some(a), None) => format!("[{}] ", a.as_str()),
                (None, None) => String::new(),
            };
            let indent = " ".repeat(number.len());
            md.push_str(&format!(
                "{number}{target}{}\n",
                hang(&task.description, &indent)
            ));
        }
        md.push_str(&format!(
            "\n## Validation\n\n{}",
            code_block(&self.validation_command, "sh")
        ));
        md
    }

    fn summary(&self) -> String {
        count(self.tasks.len() as u64, "task")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifacts::store::test_support::{run, stored};
    use std::sync::Arc;
    use td_toolkit::registry::ToolSet;

    fn good() -> Value {
        json!({
            "name": "lexer",
            "title": "Write the lexer",
            "objective": "Tokens come out of config text.",
            "tasks": [
                {"description": "Token types.", "file": "src/token.rs", "action": "create"},
                {"description": "Wire it in.\nAlso export it.", "file": "src/lib.rs"},
                {"description": "Drop the old one.", "action": "delete"},
                {"description": "Think."}
            ],
            "validation_command": "cargo test lexer"
        })
    }

    #[tokio::test]
    async fn writes_json_and_markdown() {
        let (dir, out) = run(&CreatePhase, good()).await;
        let out = out.unwrap();
        assert_eq!(
            out.content,
            "Phase 'lexer' created (4 tasks).\nWrote taskdaemon-artifacts/phase-lexer.json\nWrote taskdaemon-artifacts/phase-lexer.md\n"
        );
        let (stored, md) = stored(dir.path(), "phase-lexer");
        assert_eq!(stored["kind"], "phase");
        assert_eq!(stored["tasks"][0]["action"], "create");
        assert_eq!(stored["tasks"][3]["file"], Value::Null);
        assert_eq!(stored["validation_command"], "cargo test lexer");
        assert_eq!(
            md,
            "# Phase: Write the lexer\n\n- Name: `lexer`\n- Tasks: 4\n\n## Objective\n\nTokens come out of config text.\n\n## Tasks\n\n\
             1. [create] `src/token.rs`: Token types.\n\
             2. `src/lib.rs`: Wire it in.\n   Also export it.\n\
             3. [delete] Drop the old one.\n\
             4. Think.\n\n## Validation\n\n```sh\ncargo test lexer\n```\n"
        );
    }

    #[tokio::test]
    async fn task_files_must_stay_in_the_worktree() {
        let mut input = good();
        input["tasks"][1]["file"] = json!("../../etc/passwd");
        input["tasks"][2]["file"] = json!(" ");
        let (dir, out) = run(&CreatePhase, input).await;
        let text = out.unwrap_err().to_string();
        assert!(
            text.contains("at /tasks/1/file: sandbox violation"),
            "{text}"
        );
        assert!(
            text.contains("at /tasks/2/file: the file is blank"),
            "{text}"
        );
        assert!(!dir.path().join("taskdaemon-artifacts").exists());
    }

    #[tokio::test]
    async fn blank_command_and_missing_tasks_are_refused() {
        let mut input = good();
        input["validation_command"] = json!(" \n");
        input["tasks"] = json!([]);
        let (_d, out) = run(&CreatePhase, input).await;
        let text = out.unwrap_err().to_string();
        assert!(
            text.contains("at /validation_command: the validation command is blank"),
            "{text}"
        );
        assert!(
            text.contains("at /tasks: a phase needs at least one task"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn schema_requires_command_and_a_task() {
        let set = ToolSet::from_tools(vec![Arc::new(CreatePhase)]).unwrap();
        assert!(set.validate(TOOL, &good()).is_ok());
        for (field, value) in [
            ("tasks", json!([])),
            ("validation_command", json!("")),
            ("name", json!("UPPER")),
        ] {
            let mut bad = good();
            bad[field] = value;
            assert!(set.validate(TOOL, &bad).is_err(), "{field}");
        }
        let mut bad = good();
        bad["tasks"][0]["action"] = json!("rename");
        assert!(set.validate(TOOL, &bad).is_err());
        let mut bad = good();
        bad.as_object_mut().unwrap().remove("validation_command");
        assert!(set.validate(TOOL, &bad).is_err());
    }
}
