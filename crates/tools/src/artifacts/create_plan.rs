//! `create_plan`: records a plan — a title, an overview and the specs that carry it out,
//! with the order they depend on each other — as `taskdaemon-artifacts/plan-<name>.json`
//! and `.md`. Structured input, so nobody has to parse Markdown back.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::artifacts::store::{
    Body, Problems, create, hang, inline_code, markdown_head, name_schema, one_line, text_schema,
};
use td_base::text::count;
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolResult;
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "create_plan";

/// The `create_plan` tool.
pub struct CreatePlan;

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Plan {
    name: String,
    title: String,
    overview: String,
    specs: Vec<SpecRef>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct SpecRef {
    name: String,
    title: String,
    description: String,
    #[serde(default)]
    dependencies: Vec<String>,
}

#[async_trait]
impl Tool for CreatePlan {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Create (or replace) a plan: a title, an overview and the specs that implement it, each \
         with the specs it depends on. Written as taskdaemon-artifacts/plan-<name>.json and \
         .md, committed with your work for the stages that follow. Dependencies must name \
         specs of this plan and must not form a cycle."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": name_schema("Plan name, used in the artifact's file names"),
                "title": text_schema("Plan title, one line."),
                "overview": text_schema("What the plan achieves and how, in a few paragraphs."),
                "specs": {
                    "type": "array",
                    "minItems": 1,
                    "description": "The specs that carry out the plan, in a sensible order. Required, at least one.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": name_schema("Spec name, unique within the plan"),
                            "title": text_schema("Spec title, one line."),
                            "description": text_schema("What the spec covers."),
                            "dependencies": {
                                "type": "array",
                                "uniqueItems": true,
                                "items": {"type": "string", "pattern": crate::artifacts::store::NAME_PATTERN},
                                "description": "Names of other specs of this plan that must be done first. Default: none."
                            }
                        },
                        "required": ["name", "title", "description"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["name", "title", "overview", "specs"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        create::<Plan>(input, ctx).await
    }
}

impl Body for Plan {
    const TOOL: &'static str = TOOL;
    const KIND: &'static str = "plan";

    fn name(&self) -> &str {
        &self.name
    }

    fn title(&self) -> &str {
        &self.title
    }

    /// Everything the schema cannot say: blank texts, spec names, unknown or cyclic
    /// dependencies.
    fn check(&self, _ctx: &ToolContext, p: &mut Problems) {
        p.text("/overview", &self.overview, "the overview");
        if self.specs.is_empty() {
            p.push("/specs", "a plan needs at least one spec");
        }
        for (i, spec) in self.specs.iter().enumerate() {
            p.item(
                &format!("/specs/{i}"),
                &spec.name,
                &spec.title,
                &spec.description,
            );
            for (j, dep) in spec.dependencies.iter().enumerate() {
                let pointer = format!("/specs/{i}/dependencies/{j}");
                if *dep == spec.name {
                    p.push(pointer, format!("spec '{dep}' cannot depend on itself"));
                } else if !self.specs.iter().any(|s| s.name == *dep) {
                    let known: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
                    p.push(
                        pointer,
                        format!(
                            "'{dep}' is not a spec of this plan; dependencies must be among: {}",
                            known.join(", ")
                        ),
                    );
                }
            }
        }
        p.unique_names(
            self.specs.iter().map(|s| s.name.as_str()),
            |i| format!("/specs/{i}/name"),
            "spec",
        );
        if let Some((start, cycle)) = find_cycle(self) {
            p.push(
                format!("/specs/{start}/dependencies"),
                format!(
                    "the dependencies form a cycle ({}); remove one of them",
                    cycle.join(" -> ")
                ),
            );
        }
    }

    /// The plan as readable Markdown.
    fn markdown(&self) -> String {
        let mut md = markdown_head(
            "plan",
            &self.title,
            &self.name,
            ("Overview", &self.overview),
            ("Specs", self.specs.len()),
        );
        for (i, spec) in self.specs.iter().enumerate() {
            let deps = if spec.dependencies.is_empty() {
                "nothing".to_string()
            } else {
                spec.dependencies
                    .iter()
                    .map(|d| inline_code(d))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            md.push_str(&format!(
                "\n### {}. {} ({})\n\n{}\n\nDepends on: {deps}\n",
                i + 1,
                one_line(&spec.title),
                inline_code(&spec.name),
                hang(&spec.description, "")
            ));
        }
        md
    }

    fn summary(&self) -> String {
        count(self.specs.len() as u64, "spec")
    }
}

/// The first dependency cycle among the specs, as the index of a spec on it and the names
/// along it (first name repeated at the end). Self-references and unknown names are
/// reported elsewhere and ignored here.
fn find_cycle(plan: &Plan) -> Option<(usize, Vec<String>)> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    let index = |name: &str| plan.specs.iter().position(|s| s.name == name);
    let edges: Vec<Vec<usize>> = plan
        .specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.dependencies
                .iter()
                .filter_map(|d| index(d))
                .filter(|&j| j != i)
                .collect()
        })
        .collect();
    let mut marks = vec![Mark::New; edges.len()];
    for root in 0..edges.len() {
        if marks[root] != Mark::New {
            continue;
        }
        // Iterative depth-first search: (node, next edge to follow); `path` is the stack.
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        marks[root] = Mark::Active;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&to) = edges[node].get(*next) {
                *next += 1;
                match marks[to] {
                    Mark::New => {
                        marks[to] = Mark::Active;
                        stack.push((to, 0));
                    }
                    Mark::Active => {
                        let from = stack.iter().position(|&(n, _)| n == to).unwrap_or(0);
                        let mut names: Vec<String> = stack[from..]
                            .iter()
                            .map(|&(n, _)| plan.specs[n].name.clone())
                            .collect();
                        names.push(plan.specs[to].name.clone());
                        return Some((to, names));
                    }
                    Mark::Done => {}
                }
            } else {
                marks[node] = Mark::Done;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifacts::store::test_support::{run, stored};
    use std::sync::Arc;
    use td_toolkit::receipts::SideEffect;
    use td_toolkit::registry::ToolSet;

    fn good() -> Value {
        json!({
            "name": "auth",
            "title": "Add login",
            "overview": "Users log in with a password.",
            "specs": [
                {"name": "db", "title": "User table", "description": "Store users."},
                {"name": "api", "title": "Login API", "description": "POST /login.\nReturns a token.", "dependencies": ["db"]},
                {"name": "ui", "title": "Login form", "description": "A form.", "dependencies": ["api", "db"]}
            ]
        })
    }

    #[tokio::test]
    async fn writes_json_and_markdown() {
        let (dir, out) = run(&CreatePlan, good()).await;
        let out = out.unwrap();
        assert_eq!(
            out.content,
            "Plan 'auth' created (3 specs).\nWrote taskdaemon-artifacts/plan-auth.json\nWrote taskdaemon-artifacts/plan-auth.md\n"
        );
        let (stored, md) = stored(dir.path(), "plan-auth");
        assert_eq!(stored["kind"], "plan");
        assert_eq!(stored["specs"][0]["dependencies"], json!([]));
        assert_eq!(stored["specs"][2]["dependencies"], json!(["api", "db"]));
        assert!(
            md.starts_with("# Plan: Add login\n\n- Name: `auth`\n- Specs: 3\n"),
            "{md}"
        );
        assert!(
            md.contains(
                "### 2. Login API (`api`)\n\nPOST /login.\nReturns a token.\n\nDepends on: `db`\n"
            ),
            "{md}"
        );
        assert!(md.contains("Depends on: nothing"));
        assert_eq!(out.effects.len(), 2);
        assert!(
            matches!(&out.effects[0], SideEffect::FileWritten { path, .. } if path == "taskdaemon-artifacts/plan-auth.json")
        );
    }

    #[tokio::test]
    async fn same_input_gives_same_bytes_and_replacing_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let first = CreatePlan.execute(good(), &ctx).await.unwrap();
        let second = CreatePlan.execute(good(), &ctx).await.unwrap();
        assert_eq!(first.effects, second.effects);
        assert!(second.content.contains("replacing the earlier one"));
    }

    #[tokio::test]
    async fn unknown_and_self_dependencies_are_pointed_at() {
        let mut input = good();
        input["specs"][1]["dependencies"] = json!(["db", "nope"]);
        input["specs"][0]["dependencies"] = json!(["db"]);
        let (dir, out) = run(&CreatePlan, input).await;
        let text = out.unwrap_err().to_string();
        assert!(
            text.contains("at /specs/1/dependencies/1: 'nope' is not a spec of this plan"),
            "{text}"
        );
        assert!(text.contains("among: db, api, ui"));
        assert!(text.contains("at /specs/0/dependencies/0: spec 'db' cannot depend on itself"));
        assert!(
            !dir.path().join("taskdaemon-artifacts").exists(),
            "nothing is written on error"
        );
    }

    #[tokio::test]
    async fn cycles_are_refused() {
        let mut input = good();
        input["specs"][0]["dependencies"] = json!(["ui"]);
        let (_dir, out) = run(&CreatePlan, input).await;
        let text = out.unwrap_err().to_string();
        assert!(
            text.contains("form a cycle (db -> ui -> api -> db)"),
            "{text}"
        );
        assert!(text.contains("at /specs/0/dependencies"), "{text}");
    }

    #[tokio::test]
    async fn duplicate_names_bad_names_and_blank_texts_are_refused() {
        let mut input = good();
        input["specs"][2]["name"] = json!("db");
        input["name"] = json!("../escape");
        input["overview"] = json!("  ");
        let (dir, out) = run(&CreatePlan, input).await;
        let err = out.unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        let text = err.to_string();
        assert!(
            text.contains("at /specs/2/name: spec name 'db' is used twice"),
            "{text}"
        );
        assert!(text.contains("at /name: '../escape' is not a valid name"));
        assert!(text.contains("at /overview: the overview is blank"));
        assert!(!dir.path().join("taskdaemon-artifacts").exists());
    }

    #[tokio::test]
    async fn schema_enforces_names_and_required_fields() {
        let set = ToolSet::from_tools(vec![Arc::new(CreatePlan)]).unwrap();
        assert!(set.validate(TOOL, &good()).is_ok());
        let mut bad = good();
        bad["name"] = json!("Has Spaces");
        let err = set.validate(TOOL, &bad).unwrap_err().to_string();
        assert!(err.contains("at /name"), "{err}");
        let mut bad = good();
        bad["specs"] = json!([]);
        assert!(set.validate(TOOL, &bad).is_err());
        let mut bad = good();
        bad["specs"][0]["extra"] = json!(1);
        assert!(set.validate(TOOL, &bad).is_err());
        let mut bad = good();
        bad["specs"][1]["dependencies"] = json!(["db", "db"]);
        assert!(set.validate(TOOL, &bad).is_err());
        let mut bad = good();
        bad.as_object_mut().unwrap().remove("overview");
        assert!(set.validate(TOOL, &bad).is_err());
    }
}
