//! `query_loop`: asks another loop of the run a question and waits for its reply, through
//! the coordination port (only inside `taskdaemon run`).

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::tool::{BoxFuture, Tool, ToolOutput};

const TOOL: &str = "query_loop";

/// Reply timeout when the model gives none.
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// The `query_loop` tool.
pub struct QueryLoop;

/// Borrowed from the input (the registry keeps it for the receipt).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args<'a> {
    target_exec_id: &'a str,
    question: &'a str,
    timeout_ms: Option<u64>,
}

#[async_trait]
impl Tool for QueryLoop {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Ask another loop of this run a question (e.g. \"Which port does the API listen on?\") \
         and wait for its reply. The other loop answers from its task and progress without \
         stopping its work. Use list_loops to see which loops exist."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "target_exec_id": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Exec id (name) of the loop to ask, as shown by list_loops. Required."
                },
                "question": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The question, self-contained (the other loop does not see your conversation). Required."
                },
                "timeout_ms": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "How long to wait for the reply, in milliseconds. Default 30000; at most the catalog timeout of query_loop (300000 unless configured otherwise)."
                }
            },
            "required": ["target_exec_id", "question"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        ask(&input, ctx).await
    }

    fn execute_borrowed<'a>(
        &'a self,
        input: &'a Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, ToolResult<ToolOutput>> {
        Box::pin(ask(input, ctx))
    }
}

/// Checks the arguments in `input` and asks the target through the coordination port.
async fn ask(input: &Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
    let args: Args<'_> = args::parse_ref(TOOL, input)?;
    let target = args.target_exec_id.trim();
    if target.is_empty() {
        return Err(ToolError::invalid(
            TOOL,
            "/target_exec_id",
            "the target is blank; name a loop from list_loops",
        ));
    }
    if target == ctx.exec_id() {
        return Err(ToolError::invalid(
            TOOL,
            "/target_exec_id",
            format!(
                "'{target}' is this loop itself; ask another loop, or answer the question from your own work"
            ),
        ));
    }
    if args.question.trim().is_empty() {
        return Err(ToolError::invalid(
            TOOL,
            "/question",
            "the question is blank; write it out",
        ));
    }
    let max = ctx.spec(TOOL).timeout_ms;
    let timeout_ms = match args.timeout_ms {
        None => DEFAULT_TIMEOUT_MS.min(max),
        Some(0) => {
            return Err(ToolError::invalid(
                TOOL,
                "/timeout_ms",
                "must be at least 1",
            ));
        }
        Some(t) if t > max => {
            return Err(ToolError::invalid(
                TOOL,
                "/timeout_ms",
                format!("{t} is more than the allowed maximum of {max}; pass {max} or less"),
            ));
        }
        Some(t) => t,
    };
    let port = ctx.coordination()?;
    let reply = port
        .query(
            ctx.shared_exec_id(),
            target,
            args.question,
            Duration::from_millis(timeout_ms),
        )
        .await?;
    // Joined rather than formatted: one allocation of the right size, no formatter.
    Ok(ToolOutput::text(
        ["Reply from ", target, ":\n", &reply].concat(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{
        Call, FakeCoordination, assert_unavailable_outside_a_run, coordinated,
    };
    use std::sync::Arc;

    fn setup() -> (tempfile::TempDir, Arc<FakeCoordination>, ToolContext) {
        coordinated(
            "client",
            FakeCoordination {
                reply: "8080".into(),
                ..FakeCoordination::default()
            },
        )
    }

    fn timeouts(fake: &FakeCoordination) -> Vec<Duration> {
        fake.calls()
            .into_iter()
            .map(|c| match c {
                Call::Query { timeout, .. } => timeout,
                other => panic!("query_loop only queries, got {other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn asks_the_target_with_the_default_timeout() {
        let (_d, fake, ctx) = setup();
        let out = QueryLoop
            .execute(
                json!({"target_exec_id": "api", "question": "Which port?"}),
                &ctx,
            )
            .await
            .unwrap();
        assert_eq!(out.content, "Reply from api:\n8080");
        assert!(!out.is_error);
        assert_eq!(
            fake.calls(),
            [Call::Query {
                from: "client".into(),
                target: "api".into(),
                question: "Which port?".into(),
                timeout: Duration::from_millis(30_000)
            }]
        );
    }

    #[tokio::test]
    async fn passes_the_given_timeout() {
        let (_d, fake, ctx) = setup();
        QueryLoop
            .execute(
                json!({"target_exec_id": "api", "question": "q", "timeout_ms": 300_000}),
                &ctx,
            )
            .await
            .unwrap();
        QueryLoop
            .execute(
                json!({"target_exec_id": "api", "question": "q", "timeout_ms": 1}),
                &ctx,
            )
            .await
            .unwrap();
        assert_eq!(
            timeouts(&fake),
            [Duration::from_millis(300_000), Duration::from_millis(1)]
        );
    }

    #[tokio::test]
    async fn timeout_above_the_catalog_limit_is_refused_before_asking() {
        let (_d, fake, ctx) = setup();
        let err = QueryLoop
            .execute(
                json!({"target_exec_id": "api", "question": "q", "timeout_ms": 300_001}),
                &ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(
            err.to_string()
                .contains("at /timeout_ms: 300001 is more than the allowed maximum of 300000"),
            "{err}"
        );
        let err = QueryLoop
            .execute(
                json!({"target_exec_id": "api", "question": "q", "timeout_ms": 0}),
                &ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(fake.calls().is_empty());
    }

    #[tokio::test]
    async fn blank_fields_and_self_queries_are_refused() {
        let (_d, fake, ctx) = setup();
        for (input, pointer) in [
            (
                json!({"target_exec_id": " ", "question": "q"}),
                "/target_exec_id",
            ),
            (
                json!({"target_exec_id": "client", "question": "q"}),
                "/target_exec_id",
            ),
            (
                json!({"target_exec_id": "api", "question": "\n"}),
                "/question",
            ),
        ] {
            let err = QueryLoop.execute(input, &ctx).await.unwrap_err();
            assert!(err.to_string().contains(&format!("at {pointer}")), "{err}");
        }
        assert!(fake.calls().is_empty());
    }

    #[tokio::test]
    async fn port_errors_pass_through() {
        let (_d, fake, ctx) = coordinated(
            "client",
            FakeCoordination {
                fail: Some(|| ToolError::NotFound {
                    path: "gone".into(),
                    hint: "No loop of that name; call list_loops.".into(),
                }),
                ..FakeCoordination::default()
            },
        );
        let err = QueryLoop
            .execute(json!({"target_exec_id": "gone", "question": "q"}), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "not_found");
        assert!(err.to_string().contains("list_loops"));
        assert_eq!(fake.calls().len(), 1);
    }

    #[tokio::test]
    async fn through_the_registry_it_reads_the_input_the_receipt_keeps() {
        let (_d, fake, ctx) = setup();
        let set = td_toolkit::registry::ToolSet::from_tools(vec![Arc::new(QueryLoop)]).unwrap();
        let input = json!({"target_exec_id": " api ", "question": "Which port?", "timeout_ms": 5});
        let out = set.call(&ctx, Some("c1"), TOOL, input.clone()).await;
        assert_eq!(out.content, "Reply from api:\n8080");
        assert!(!out.is_error);
        assert_eq!(
            fake.calls(),
            [Call::Query {
                from: "client".into(),
                target: "api".into(),
                question: "Which port?".into(),
                timeout: Duration::from_millis(5)
            }]
        );
        let receipt = out.receipt.into_receipt();
        assert_eq!(*receipt.input, input);
        assert_eq!(receipt.input_hash, td_toolkit::receipts::hash_value(&input));
        assert_eq!((receipt.tool.as_ref(), &*receipt.exec_id), (TOOL, "client"));
        assert_eq!(receipt.call_id.as_deref(), Some("c1"));
        // Refused arguments are refused alike on both paths.
        let bad = json!({"target_exec_id": "client", "question": "q"});
        let direct = QueryLoop.execute(bad.clone(), &ctx).await.unwrap_err();
        let out = set.call(&ctx, None, TOOL, bad).await;
        assert!(out.is_error);
        assert_eq!(out.content, direct.to_string());
    }

    #[tokio::test]
    async fn outside_a_run_it_says_so() {
        assert_unavailable_outside_a_run(
            &QueryLoop,
            json!({"target_exec_id": "api", "question": "q"}),
        )
        .await;
    }
    #[tokio::test]
    async fn schema_rejects_missing_and_extra_fields() {
        let set = td_toolkit::registry::ToolSet::from_tools(vec![Arc::new(QueryLoop)]).unwrap();
        assert!(
            set.validate(
                TOOL,
                &json!({"target_exec_id": "a", "question": "q", "timeout_ms": 5})
            )
            .is_ok()
        );
        assert!(set.validate(TOOL, &json!({"target_exec_id": "a"})).is_err());
        assert!(
            set.validate(TOOL, &json!({"target_exec_id": "", "question": "q"}))
                .is_err()
        );
        assert!(
            set.validate(
                TOOL,
                &json!({"target_exec_id": "a", "question": "q", "timeout_ms": 0})
            )
            .is_err()
        );
        assert!(
            set.validate(
                TOOL,
                &json!({"target_exec_id": "a", "question": "q", "x": 0})
            )
            .is_err()
        );
    }
}
