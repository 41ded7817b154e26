//! `list_loops`: the other loops of the run with their type, status and task, through the
//! coordination port (only inside `taskdaemon run`).

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::coordination::LoopInfo;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "list_loops";

/// Longest task text shown per loop.
const TASK_CHARS: usize = 120;

/// The `list_loops` tool.
pub struct ListLoops;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(default)]
    status: Option<String>,
}

#[async_trait]
impl Tool for ListLoops {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "List the other loops of this run, one per line: name, type, status and task. Use the \
         names with query_loop and share_data."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "status": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Only list loops with this status (e.g. \"running\", \"completed\", \"failed\"; case-insensitive). Default: all loops."
                }
            },
            "additionalProperties": false
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let args: Args = args::parse(TOOL, input)?;
        let filter = match args.status.as_deref().map(str::trim) {
            Some("") => {
                return Err(ToolError::invalid(
                    TOOL,
                    "/status",
                    "the status is blank; name one (e.g. \"running\") or leave it out",
                ));
            }
            other => other.map(str::to_string),
        };
        let port = ctx.coordination()?;
        let mut loops = port.list_loops(ctx.exec_id()).await?;
        loops.retain(|l| l.name != ctx.exec_id());
        loops.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(ToolOutput::text(render(&loops, filter.as_deref())))
    }
}

/// A field on one line: no control characters, whitespace runs collapsed.
fn cell(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The task's first line, cut to a readable length.
fn task_line(task: &str) -> String {
    let first = cell(task.lines().find(|l| !l.trim().is_empty()).unwrap_or(""));
    if first.chars().count() > TASK_CHARS {
        let cut: String = first.chars().take(TASK_CHARS).collect();
        format!("{cut}…")
    } else {
        first
    }
}

/// Aligned columns `name  type  status  task`, or a sentence when nothing matches.
fn render(all: &[LoopInfo], filter: Option<&str>) -> String {
    let shown: Vec<&LoopInfo> = all
        .iter()
        .filter(|l| filter.is_none_or(|f| l.status.eq_ignore_ascii_case(f)))
        .collect();
    if shown.is_empty() {
        return match filter {
            None => "No other loops in this run.".to_string(),
            Some(f) => {
                let mut statuses: Vec<String> = all.iter().map(|l| cell(&l.status)).collect();
                statuses.sort();
                statuses.dedup();
                if statuses.is_empty() {
                    format!("No loops with status '{f}': there are no other loops in this run.")
                } else {
                    format!(
                        "No loops with status '{f}'. Statuses present: {}.",
                        statuses.join(", ")
                    )
                }
            }
        };
    }
    let rows: Vec<[String; 4]> =
        std::iter::once(["name", "type", "status", "task"].map(String::from))
            .chain(shown.iter().map(|l| {
                [
                    cell(&l.name),
                    cell(&l.loop_type),
                    cell(&l.status),
                    task_line(&l.task),
                ]
            }))
            .collect();
    let width = |col: usize| {
        rows.iter()
            .map(|r| r[col].chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths = [width(0), width(1), width(2)];
    let mut out = String::new();
    for row in &rows {
        for (col, w) in widths.iter().enumerate() {
            let pad = w - row[col].chars().count();
            out.push_str(&row[col]);
            out.push_str(&" ".repeat(pad + 2));
        }
        out.push_str(&row[3]);
        out.truncate(out.trim_end().len());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{
        Call, FakeCoordination, assert_unavailable_outside_a_run, coordinated,
    };
    use std::sync::Arc;

    fn info(name: &str, loop_type: &str, status: &str, task: &str) -> LoopInfo {
        LoopInfo {
            name: name.into(),
            loop_type: loop_type.into(),
            status: status.into(),
            task: task.into(),
        }
    }

    /// A port listing `loops`, or failing when `None`.
    fn setup(
        loops: Option<Vec<LoopInfo>>,
    ) -> (tempfile::TempDir, Arc<FakeCoordination>, ToolContext) {
        let fail: Option<fn() -> ToolError> = match loops {
            Some(_) => None,
            None => Some(|| ToolError::Unavailable {
                message: "the coordinator stopped".into(),
            }),
        };
        coordinated(
            "me",
            FakeCoordination {
                loops: loops.unwrap_or_default(),
                fail,
                ..FakeCoordination::default()
            },
        )
    }

    fn sample() -> Vec<LoopInfo> {
        vec![
            info("web", "code", "running", "Build the web UI\nwith details"),
            info("api", "code", "completed", "Serve /login"),
            info("me", "plan", "running", "myself"),
            info("docs-writer", "ralph", "Failed", "Write docs"),
        ]
    }

    #[tokio::test]
    async fn lists_other_loops_sorted_and_aligned() {
        let (_d, fake, ctx) = setup(Some(sample()));
        let out = ListLoops.execute(json!({}), &ctx).await.unwrap();
        assert_eq!(
            out.content,
            "name         type   status     task\n\
             api          code   completed  Serve /login\n\
             docs-writer  ralph  Failed     Write docs\n\
             web          code   running    Build the web UI\n"
        );
        assert_eq!(fake.calls(), [Call::List { from: "me".into() }]);
    }

    #[tokio::test]
    async fn status_filter_is_case_insensitive() {
        let (_d, _f, ctx) = setup(Some(sample()));
        let out = ListLoops
            .execute(json!({"status": "failed"}), &ctx)
            .await
            .unwrap();
        assert_eq!(
            out.content,
            "name         type   status  task\ndocs-writer  ralph  Failed  Write docs\n"
        );
        let out = ListLoops
            .execute(json!({"status": "paused"}), &ctx)
            .await
            .unwrap();
        assert_eq!(
            out.content,
            "No loops with status 'paused'. Statuses present: Failed, completed, running."
        );
        let err = ListLoops
            .execute(json!({"status": "  "}), &ctx)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("at /status"));
    }

    #[tokio::test]
    async fn empty_runs_and_long_tasks() {
        let (_d, _f, ctx) = setup(Some(vec![]));
        let out = ListLoops.execute(json!({}), &ctx).await.unwrap();
        assert_eq!(out.content, "No other loops in this run.");
        let out = ListLoops
            .execute(json!({"status": "running"}), &ctx)
            .await
            .unwrap();
        assert!(out.content.contains("there are no other loops"));
        let (_d, _f, ctx) = setup(Some(vec![info(
            "a\tb",
            "code",
            "running",
            &"é".repeat(200),
        )]));
        let out = ListLoops.execute(json!({}), &ctx).await.unwrap();
        assert!(
            out.content.contains(&format!(
                "a b   code  running  {}…\n",
                "é".repeat(TASK_CHARS)
            )),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn port_errors_pass_through_and_outside_a_run_it_says_so() {
        let (_d, _f, ctx) = setup(None);
        let err = ListLoops.execute(json!({}), &ctx).await.unwrap_err();
        assert!(err.to_string().contains("coordinator stopped"));
        assert_unavailable_outside_a_run(&ListLoops, json!({})).await;
    }

    #[tokio::test]
    async fn schema_allows_no_input_and_a_status() {
        let set = td_toolkit::registry::ToolSet::from_tools(vec![Arc::new(ListLoops)]).unwrap();
        assert!(set.validate(TOOL, &json!({})).is_ok());
        assert!(set.validate(TOOL, &json!({"status": "running"})).is_ok());
        assert!(set.validate(TOOL, &json!({"status": ""})).is_err());
        assert!(set.validate(TOOL, &json!({"other": 1})).is_err());
        assert!(ListLoops.read_only());
    }
}
