//! `create_spec`: records a spec — an overview and 3 to 7 phases, each with the command
//! that proves it done — as `taskdaemon-artifacts/spec-<name>.json` and `.md`.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::artifacts::store::{
    Body, Problems, code_block, create, hang, inline_code, markdown_head, name_schema, one_line,
    text_schema,
};
use td_base::text::count;
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolResult;
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "create_spec";

/// Fewest phases a spec may have.
const MIN_PHASES: usize = 3;
/// Most phases a spec may have.
const MAX_PHASES: usize = 7;

/// The `create_spec` tool.
pub struct CreateSpec;

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    name: String,
    title: String,
    overview: String,
    phases: Vec<Phase>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Phase {
    name: String,
    title: String,
    description: String,
    validation: String,
}

#[async_trait]
impl Tool for CreateSpec {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Create (or replace) a spec: an overview and 3 to 7 phases in order, each with a shell \
         command that validates it (e.g. \"cargo test auth::\"). Written as \
         taskdaemon-artifacts/spec-<name>.json and .md, committed with your work for the \
         stages that follow."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": name_schema("Spec name, used in the artifact's file names"),
                "title": text_schema("Spec title, one line."),
                "overview": text_schema("What the spec delivers and the approach."),
                "phases": {
                    "type": "array",
                    "minItems": MIN_PHASES,
                    "maxItems": MAX_PHASES,
                    "description": "The phases in the order they are done: 3 to 7. Required.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": name_schema("Phase name, unique within the spec"),
                            "title": text_schema("Phase title, one line."),
                            "description": text_schema("What the phase does."),
                            "validation": text_schema("Shell command that passes once the phase is done, run in the worktree (e.g. \"cargo test parser::\").")
                        },
                        "required": ["name", "title", "description", "validation"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["name", "title", "overview", "phases"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        create::<Spec>(input, ctx).await
    }
}

impl Body for Spec {
    const TOOL: &'static str = TOOL;
    const KIND: &'static str = "spec";

    fn name(&self) -> &str {
        &self.name
    }

    fn title(&self) -> &str {
        &self.title
    }

    /// Blank texts and commands, phase count, phase names and their uniqueness.
    fn check(&self, _ctx: &ToolContext, p: &mut Problems) {
        p.text("/overview", &self.overview, "the overview");
        let n = self.phases.len();
        if !(MIN_PHASES..=MAX_PHASES).contains(&n) {
            p.push(
                "/phases",
                format!(
                    "a spec has {MIN_PHASES} to {MAX_PHASES} phases, not {n}; merge or split phases"
                ),
            );
        }
        for (i, phase) in self.phases.iter().enumerate() {
            p.item(
                &format!("/phases/{i}"),
                &phase.name,
                &phase.title,
                &phase.description,
            );
            p.text(
                format!("/phases/{i}/validation"),
                &phase.validation,
                "the validation command",
            );
        }
        p.unique_names(
            self.phases.iter().map(|ph| ph.name.as_str()),
            |i| format!("/phases/{i}/name"),
            "phase",
        );
    }

    /// The spec as readable Markdown.
    fn markdown(&self) -> String {
        let mut md = markdown_head(
            "spec",
            &self.title,
            &self.name,
            ("Overview", &self.overview),
            ("Phases", self.phases.len()),
        );
        for (i, phase) in self.phases.iter().enumerate() {
            md.push_str(&format!(
                "\n### {}. {} ({})\n\n{}\n\nValidation:\n\n{}",
                i + 1,
                one_line(&phase.title),
                inline_code(&phase.name),
                hang(&phase.description, ""),
                code_block(&phase.validation, "sh")
            ));
        }
        md
    }

    fn summary(&self) -> String {
        count(self.phases.len() as u64, "phase")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifacts::store::test_support::{run, stored};
    use std::sync::Arc;
    use td_toolkit::registry::ToolSet;

    fn phase(name: &str) -> Value {
        json!({"name": name, "title": format!("Do {name}"), "description": "Work.", "validation": format!("cargo test {name}")})
    }

    fn good() -> Value {
        json!({
            "name": "parser",
            "title": "Config parser",
            "overview": "Parse the config.",
            "phases": [phase("lexer"), phase("grammar"), phase("errors")]
        })
    }

    #[tokio::test]
    async fn writes_json_and_markdown() {
        let (dir, out) = run(&CreateSpec, good()).await;
        let out = out.unwrap();
        assert_eq!(
            out.content,
            "Spec 'parser' created (3 phases).\nWrote taskdaemon-artifacts/spec-parser.json\nWrote taskdaemon-artifacts/spec-parser.md\n"
        );
        let (stored, md) = stored(dir.path(), "spec-parser");
        assert_eq!(stored["kind"], "spec");
        assert_eq!(stored["phases"][1]["validation"], "cargo test grammar");
        assert!(
            md.starts_with("# Spec: Config parser\n\n- Name: `parser`\n- Phases: 3\n"),
            "{md}"
        );
        assert!(md.contains("### 3. Do errors (`errors`)\n\nWork.\n\nValidation:\n\n```sh\ncargo test errors\n```\n"), "{md}");
        assert_eq!(out.effects.len(), 2);
    }

    #[tokio::test]
    async fn phase_count_is_checked_in_code_too() {
        let mut input = good();
        input["phases"] = json!([phase("a"), phase("b")]);
        let (_d, out) = run(&CreateSpec, input).await;
        assert!(
            out.unwrap_err()
                .to_string()
                .contains("at /phases: a spec has 3 to 7 phases, not 2")
        );
        let mut input = good();
        input["phases"] = json!((0..8).map(|i| phase(&format!("p{i}"))).collect::<Vec<_>>());
        let (_d, out) = run(&CreateSpec, input).await;
        assert!(out.unwrap_err().to_string().contains("not 8"));
    }

    #[tokio::test]
    async fn blank_validation_and_duplicate_phases_are_refused() {
        let mut input = good();
        input["phases"][1]["validation"] = json!("   ");
        input["phases"][2]["name"] = json!("lexer");
        let (dir, out) = run(&CreateSpec, input).await;
        let text = out.unwrap_err().to_string();
        assert!(
            text.contains("at /phases/1/validation: the validation command is blank"),
            "{text}"
        );
        assert!(
            text.contains("at /phases/2/name: phase name 'lexer' is used twice"),
            "{text}"
        );
        assert!(!dir.path().join("taskdaemon-artifacts").exists());
    }

    #[tokio::test]
    async fn schema_requires_validation_and_bounds_phases() {
        let set = ToolSet::from_tools(vec![Arc::new(CreateSpec)]).unwrap();
        assert!(set.validate(TOOL, &good()).is_ok());
        let mut bad = good();
        bad["phases"][0]
            .as_object_mut()
            .unwrap()
            .remove("validation");
        let err = set.validate(TOOL, &bad).unwrap_err().to_string();
        assert!(
            err.contains("at /phases/0") && err.contains("validation"),
            "{err}"
        );
        let mut bad = good();
        bad["phases"][0]["validation"] = json!("");
        assert!(set.validate(TOOL, &bad).is_err());
        let mut bad = good();
        bad["phases"] = json!([phase("a"), phase("b")]);
        assert!(set.validate(TOOL, &bad).is_err());
        let mut bad = good();
        bad["phases"] = json!((0..8).map(|i| phase(&format!("p{i}"))).collect::<Vec<_>>());
        assert!(set.validate(TOOL, &bad).is_err());
        let mut ok = good();
        ok["phases"] = json!((0..7).map(|i| phase(&format!("p{i}"))).collect::<Vec<_>>());
        assert!(set.validate(TOOL, &ok).is_ok());
        let mut bad = good();
        bad["phases"][0]["name"] = json!("a/b");
        assert!(set.validate(TOOL, &bad).is_err());
    }
}
