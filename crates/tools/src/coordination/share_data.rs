//! `share_data`: puts a piece of JSON data into other loops' inboxes through the
//! coordination port (only inside `taskdaemon run`); the recipients' models see it at their
//! next turn.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::coordination::Delivery;
use td_toolkit::error::{ArgumentProblem, ToolError, ToolResult};
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "share_data";

/// The `share_data` tool.
pub struct ShareData;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    target_exec_ids: Vec<String>,
    data_type: String,
    data: Value,
}

#[async_trait]
impl Tool for ShareData {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Send data (an API schema, a port, a config value...) to other loops of this run; each \
         recipient's model sees it at its next turn. Reports per loop whether it was delivered; \
         the result is an error if any delivery failed. Use list_loops to see which loops exist."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "target_exec_ids": {
                    "type": "array",
                    "minItems": 1,
                    "uniqueItems": true,
                    "items": {"type": "string", "minLength": 1},
                    "description": "Exec ids (names) of the loops to send to, each once. Required, at least one."
                },
                "data_type": {
                    "type": "string",
                    "minLength": 1,
                    "description": "What the data is, so recipients can tell shares apart (e.g. \"api_schema\", \"config\"). Required."
                },
                "data": {
                    "description": "The data: any JSON value (object, array, string, number...). Required."
                }
            },
            "required": ["target_exec_ids", "data_type", "data"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let args: Args = args::parse(TOOL, input)?;
        check(&args, ctx.exec_id())?;
        let targets: Vec<String> = args
            .target_exec_ids
            .iter()
            .map(|t| t.trim().to_string())
            .collect();
        let data_type = args.data_type.trim();
        let port = ctx.coordination()?;
        let deliveries = port
            .share(ctx.exec_id(), &targets, data_type, args.data)
            .await?;
        Ok(report(data_type, &targets, &deliveries))
    }
}

/// Blank, repeated or self targets and a blank data type, all at once.
fn check(args: &Args, me: &str) -> ToolResult<()> {
    let mut problems = Vec::new();
    let mut problem =
        |pointer: String, message: String| problems.push(ArgumentProblem { pointer, message });
    if args.target_exec_ids.is_empty() {
        problem("/target_exec_ids".into(), "name at least one loop".into());
    }
    let mut seen: Vec<&str> = Vec::new();
    for (i, t) in args.target_exec_ids.iter().enumerate() {
        let t = t.trim();
        let pointer = format!("/target_exec_ids/{i}");
        if t.is_empty() {
            problem(
                pointer,
                "the target is blank; name a loop from list_loops".into(),
            );
        } else if t == me {
            problem(
                pointer,
                format!("'{t}' is this loop itself; you already have the data"),
            );
        } else if seen.contains(&t) {
            problem(
                pointer,
                format!("'{t}' is listed twice; list each loop once"),
            );
        } else {
            seen.push(t);
        }
    }
    if args.data_type.trim().is_empty() {
        problem(
            "/data_type".into(),
            "the data type is blank; say what the data is (e.g. \"api_schema\")".into(),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ToolError::InvalidArguments {
            tool: TOOL.to_string(),
            problems,
        })
    }
}

/// One line per target, sorted by name; an error result when any delivery failed.
fn report(data_type: &str, targets: &[String], deliveries: &[Delivery]) -> ToolOutput {
    let mut lines: Vec<(String, Option<String>)> = targets
        .iter()
        .map(|t| {
            let outcome = match deliveries.iter().find(|d| d.target == *t) {
                Some(d) => d.error.clone(),
                None => Some("the coordinator gave no delivery report for it".to_string()),
            };
            (t.clone(), outcome)
        })
        .collect();
    lines.sort();
    let failed = lines.iter().filter(|(_, e)| e.is_some()).count();
    let delivered = lines.len() - failed;
    let mut content = format!(
        "Shared '{data_type}' with {delivered} of {} loop{}:\n",
        lines.len(),
        if lines.len() == 1 { "" } else { "s" }
    );
    for (target, error) in &lines {
        match error {
            None => content.push_str(&format!("  {target}: delivered\n")),
            Some(e) => content.push_str(&format!("  {target}: NOT delivered: {e}\n")),
        }
    }
    if failed > 0 {
        content.push_str("Fix the cause for the loops not reached (check names with list_loops) and share again with only those loops.\n");
    }
    ToolOutput {
        content,
        is_error: failed > 0,
        effects: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{
        Call, FakeCoordination, assert_unavailable_outside_a_run, coordinated,
    };
    use std::sync::Arc;

    /// "full" has a full inbox, "silent" gets no delivery report, the rest succeed.
    fn fake() -> FakeCoordination {
        FakeCoordination {
            undeliverable: vec![("full", "inbox full; the loop is not reading")],
            unreported: vec!["silent"],
            ..FakeCoordination::default()
        }
    }

    fn setup(fake: FakeCoordination) -> (tempfile::TempDir, Arc<FakeCoordination>, ToolContext) {
        coordinated("api", fake)
    }

    /// The data of every share received.
    fn shared_data(fake: &FakeCoordination) -> Vec<Value> {
        fake.calls()
            .into_iter()
            .map(|c| match c {
                Call::Share { data, .. } => data,
                other => panic!("share_data only shares, got {other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn delivers_to_every_target_and_lists_them_sorted() {
        let (_d, fake, ctx) = setup(fake());
        let data = json!({"port": 8080, "routes": ["/a"]});
        let out = ShareData
            .execute(
                json!({"target_exec_ids": ["web", "cli"], "data_type": "config", "data": data}),
                &ctx,
            )
            .await
            .unwrap();
        assert!(!out.is_error);
        assert_eq!(
            out.content,
            "Shared 'config' with 2 of 2 loops:\n  cli: delivered\n  web: delivered\n"
        );
        assert_eq!(
            fake.calls(),
            [Call::Share {
                from: "api".into(),
                targets: vec!["web".into(), "cli".into()],
                data_type: "config".into(),
                data
            }]
        );
    }

    #[tokio::test]
    async fn any_json_value_is_data() {
        let (_d, fake, ctx) = setup(fake());
        for data in [
            json!(null),
            json!("text"),
            json!(3.5),
            json!([1, {"a": true}]),
        ] {
            let out = ShareData
                .execute(
                    json!({"target_exec_ids": ["web"], "data_type": "t", "data": data.clone()}),
                    &ctx,
                )
                .await
                .unwrap();
            assert_eq!(
                out.content,
                "Shared 't' with 1 of 1 loop:\n  web: delivered\n"
            );
            assert_eq!(shared_data(&fake).last(), Some(&data));
        }
    }

    #[tokio::test]
    async fn a_failed_delivery_makes_it_an_error_but_keeps_the_successes() {
        let (_d, _fake, ctx) = setup(fake());
        let out = ShareData
            .execute(json!({"target_exec_ids": ["web", "full", "silent"], "data_type": "schema", "data": {}}), &ctx)
            .await
            .unwrap();
        assert!(out.is_error);
        assert!(
            out.content
                .starts_with("Shared 'schema' with 1 of 3 loops:\n"),
            "{}",
            out.content
        );
        assert!(
            out.content
                .contains("  full: NOT delivered: inbox full; the loop is not reading\n")
        );
        assert!(
            out.content
                .contains("  silent: NOT delivered: the coordinator gave no delivery report")
        );
        assert!(out.content.contains("  web: delivered\n"));
        assert!(out.content.contains("share again with only those loops"));
    }

    #[tokio::test]
    async fn port_errors_pass_through() {
        let (_d, _fake, ctx) = setup(FakeCoordination {
            fail: Some(|| ToolError::LimitExceeded {
                what: "share rate".into(),
                hint: "Wait a moment.".into(),
            }),
            ..fake()
        });
        let err = ShareData
            .execute(
                json!({"target_exec_ids": ["web"], "data_type": "t", "data": 1}),
                &ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "limit_exceeded");
    }

    #[tokio::test]
    async fn bad_targets_are_refused_before_sending() {
        let (_d, fake, ctx) = setup(fake());
        let err = ShareData
            .execute(json!({"target_exec_ids": ["web", " web ", "api", ""], "data_type": " ", "data": 1}), &ctx)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("at /target_exec_ids/1: 'web' is listed twice"),
            "{text}"
        );
        assert!(
            text.contains("at /target_exec_ids/2: 'api' is this loop itself"),
            "{text}"
        );
        assert!(
            text.contains("at /target_exec_ids/3: the target is blank"),
            "{text}"
        );
        assert!(
            text.contains("at /data_type: the data type is blank"),
            "{text}"
        );
        let err = ShareData
            .execute(
                json!({"target_exec_ids": [], "data_type": "t", "data": 1}),
                &ctx,
            )
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("at /target_exec_ids: name at least one loop")
        );
        assert!(fake.calls().is_empty());
    }

    #[tokio::test]
    async fn outside_a_run_it_says_so() {
        assert_unavailable_outside_a_run(
            &ShareData,
            json!({"target_exec_ids": ["web"], "data_type": "t", "data": 1}),
        )
        .await;
    }

    #[tokio::test]
    async fn schema_requires_unique_targets_and_data() {
        let set = td_toolkit::registry::ToolSet::from_tools(vec![Arc::new(ShareData)]).unwrap();
        assert!(
            set.validate(
                TOOL,
                &json!({"target_exec_ids": ["a"], "data_type": "t", "data": null})
            )
            .is_ok()
        );
        assert!(
            set.validate(
                TOOL,
                &json!({"target_exec_ids": ["a", "a"], "data_type": "t", "data": 1})
            )
            .is_err()
        );
        assert!(
            set.validate(
                TOOL,
                &json!({"target_exec_ids": [], "data_type": "t", "data": 1})
            )
            .is_err()
        );
        assert!(
            set.validate(TOOL, &json!({"target_exec_ids": ["a"], "data_type": "t"}))
                .is_err()
        );
        assert!(
            set.validate(
                TOOL,
                &json!({"target_exec_ids": ["a"], "data_type": "", "data": 1})
            )
            .is_err()
        );
    }
}
