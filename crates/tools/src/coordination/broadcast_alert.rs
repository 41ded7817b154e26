//! `broadcast_alert`: announces an event (e.g. "api_ready") to every other loop of the run
//! that listens for it, through the coordination port (only inside `taskdaemon run`).

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ArgumentProblem, ToolError, ToolResult};
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "broadcast_alert";

/// The `broadcast_alert` tool.
pub struct BroadcastAlert;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    event_type: String,
    message: String,
    #[serde(default)]
    data: Option<Value>,
}

#[async_trait]
impl Tool for BroadcastAlert {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Announce an event to the other loops of this run (e.g. event_type \"api_ready\" once \
         the API you build is usable). Every loop listening for that event type sees the \
         message at its next turn. Returns how many loops it reached."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "event_type": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Kind of event, a short snake_case word (e.g. \"api_ready\", \"schema_changed\"). Required."
                },
                "message": {
                    "type": "string",
                    "minLength": 1,
                    "description": "What happened, for the other loops' models. Required."
                },
                "data": {
                    "description": "Optional JSON details (e.g. {\"port\": 8080}). Default: none."
                }
            },
            "required": ["event_type", "message"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let args: Args = args::parse(TOOL, input)?;
        let event_type = args.event_type.trim();
        let mut problems = Vec::new();
        if event_type.is_empty() {
            problems.push(ArgumentProblem {
                pointer: "/event_type".into(),
                message: "the event type is blank; name the event (e.g. \"api_ready\")".into(),
            });
        }
        if args.message.trim().is_empty() {
            problems.push(ArgumentProblem {
                pointer: "/message".into(),
                message: "the message is blank; say what happened".into(),
            });
        }
        if !problems.is_empty() {
            return Err(ToolError::InvalidArguments {
                tool: TOOL.into(),
                problems,
            });
        }
        let port = ctx.coordination()?;
        let reached = port
            .alert(ctx.exec_id(), event_type, &args.message, args.data)
            .await?;
        let content = match reached {
            0 => format!(
                "Alert '{event_type}' sent; it reached no loop (no other loop listens for '{event_type}')."
            ),
            1 => format!("Alert '{event_type}' sent; it reached 1 loop."),
            n => format!("Alert '{event_type}' sent; it reached {n} loops."),
        };
        Ok(ToolOutput::text(content))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{
        Call, FakeCoordination, assert_unavailable_outside_a_run, coordinated,
    };
    use std::sync::Arc;

    /// A port whose alerts reach `reach` loops, or fail when `None`.
    fn setup(reach: Option<usize>) -> (tempfile::TempDir, Arc<FakeCoordination>, ToolContext) {
        let fail: Option<fn() -> ToolError> = match reach {
            Some(_) => None,
            None => Some(|| ToolError::LimitExceeded {
                what: "alert rate".into(),
                hint: "Send fewer alerts.".into(),
            }),
        };
        coordinated(
            "api",
            FakeCoordination {
                reach: reach.unwrap_or(0),
                fail,
                ..FakeCoordination::default()
            },
        )
    }

    #[tokio::test]
    async fn broadcasts_with_and_without_data() {
        let (_d, fake, ctx) = setup(Some(3));
        let out = BroadcastAlert
            .execute(
                json!({"event_type": "api_ready", "message": "API up", "data": {"port": 8080}}),
                &ctx,
            )
            .await
            .unwrap();
        assert_eq!(out.content, "Alert 'api_ready' sent; it reached 3 loops.");
        BroadcastAlert
            .execute(json!({"event_type": "done", "message": "m"}), &ctx)
            .await
            .unwrap();
        assert_eq!(
            fake.calls(),
            [
                Call::Alert {
                    from: "api".into(),
                    event_type: "api_ready".into(),
                    message: "API up".into(),
                    data: Some(json!({"port": 8080}))
                },
                Call::Alert {
                    from: "api".into(),
                    event_type: "done".into(),
                    message: "m".into(),
                    data: None
                }
            ]
        );
    }

    #[tokio::test]
    async fn counts_are_worded_for_zero_and_one() {
        let (_d, _f, ctx) = setup(Some(0));
        let out = BroadcastAlert
            .execute(json!({"event_type": "x", "message": "m"}), &ctx)
            .await
            .unwrap();
        assert_eq!(
            out.content,
            "Alert 'x' sent; it reached no loop (no other loop listens for 'x')."
        );
        let (_d, _f, ctx) = setup(Some(1));
        let out = BroadcastAlert
            .execute(json!({"event_type": "x", "message": "m"}), &ctx)
            .await
            .unwrap();
        assert_eq!(out.content, "Alert 'x' sent; it reached 1 loop.");
    }

    #[tokio::test]
    async fn port_errors_pass_through_and_blanks_are_refused() {
        let (_d, fake, ctx) = setup(None);
        let err = BroadcastAlert
            .execute(json!({"event_type": "x", "message": "m"}), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "limit_exceeded");
        let err = BroadcastAlert
            .execute(json!({"event_type": " ", "message": ""}), &ctx)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("at /event_type") && text.contains("at /message"),
            "{text}"
        );
        assert_eq!(fake.calls().len(), 1);
    }

    #[tokio::test]
    async fn outside_a_run_it_says_so() {
        assert_unavailable_outside_a_run(
            &BroadcastAlert,
            json!({"event_type": "x", "message": "m"}),
        )
        .await;
    }

    #[tokio::test]
    async fn schema_requires_event_and_message() {
        let set =
            td_toolkit::registry::ToolSet::from_tools(vec![Arc::new(BroadcastAlert)]).unwrap();
        assert!(
            set.validate(
                TOOL,
                &json!({"event_type": "x", "message": "m", "data": [1]})
            )
            .is_ok()
        );
        assert!(set.validate(TOOL, &json!({"event_type": "x"})).is_err());
        assert!(
            set.validate(TOOL, &json!({"event_type": "", "message": "m"}))
                .is_err()
        );
        assert!(
            set.validate(
                TOOL,
                &json!({"event_type": "x", "message": "m", "extra": 1})
            )
            .is_err()
        );
    }
}
