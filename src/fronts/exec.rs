//! `taskdaemon tool exec`: one JSON call per input line, one flushed JSON answer per call,
//! all against ONE `ToolContext`, each answered before the next line is read.
//!
//! Request:  `{"id": "...", "name": "read_file", "input": {...}}`
//! Answer:   `{"id": "...", "is_error": bool, "content": "..."}`
//!
//! A line that is not a request still gets an answer (`is_error: true`, with the `id` when
//! one could be read), so a caller never waits for a reply that will not come. Blank lines
//! are skipped. With a receipt log, a call whose receipt cannot be written is answered as an
//! error and no later call runs (see [`ReceiptGate`]).

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::context::ToolContext;
use crate::fronts::receipt_gate::ReceiptGate;
use crate::receipts::ReceiptLog;
use crate::registry::ToolSet;

/// Serves the exec protocol until `input` ends. Returns why receipts stopped being written,
/// when they did (the session then ran no call after it).
pub async fn serve<R, W>(
    input: R,
    mut output: W,
    ctx: &ToolContext,
    tools: &ToolSet,
    receipts: Option<&ReceiptLog>,
) -> std::io::Result<Option<String>>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = input.lines();
    let gate = ReceiptGate::new();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let answer = answer_line(&line, ctx, tools, receipts, &gate).await;
        // Results are redacted by the registry already; an answer that echoes a bad request
        // line is not, and this is where text leaves the process.
        let mut text = crate::secrets::redact_json(&answer.to_string()).into_owned();
        text.push('\n');
        output.write_all(text.as_bytes()).await?;
        output.flush().await?;
    }
    Ok(gate.failure())
}

async fn answer_line(
    line: &str,
    ctx: &ToolContext,
    tools: &ToolSet,
    receipts: Option<&ReceiptLog>,
    gate: &ReceiptGate,
) -> Value {
    let request: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            return error_answer(
                Value::Null,
                format!(
                    "invalid request line: {e}. Send one JSON object per line: {{\"id\": \"...\", \"name\": \"tool\", \"input\": {{...}}}}"
                ),
            );
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let Some(name) = request.get("name").and_then(Value::as_str) else {
        return error_answer(
            id,
            "request has no string \"name\"; say which tool to call".to_string(),
        );
    };
    let input = request.get("input").cloned().unwrap_or_else(|| json!({}));
    let call_id = match &id {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    };
    if receipts.is_some()
        && let Err(refused) = gate.admit()
    {
        return error_answer(id, refused);
    }
    let outcome = tools.call(ctx, call_id.as_deref(), name, input).await;
    if let Some(log) = receipts
        && let Some(unrecorded) = gate.keep(log, &outcome)
    {
        return error_answer(id, unrecorded);
    }
    json!({"id": id, "is_error": outcome.is_error, "content": outcome.content})
}

fn error_answer(id: Value, content: String) -> Value {
    json!({"id": id, "is_error": true, "content": content})
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(lines: &str) -> Vec<Value> {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "exec").unwrap();
        let tools = ToolSet::all();
        let mut out = Vec::new();
        serve(lines.as_bytes(), &mut out, &ctx, &tools, None)
            .await
            .unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn bad_lines_still_get_answers() {
        let answers = run("not json\n\n{\"id\": 7}\n{\"id\": \"x\", \"name\": \"nope\"}\n").await;
        assert_eq!(answers.len(), 3);
        assert_eq!(answers[0]["id"], Value::Null);
        assert!(
            answers[0]["content"]
                .as_str()
                .unwrap()
                .contains("invalid request line")
        );
        assert_eq!(answers[1]["id"], 7);
        assert!(answers[1]["content"].as_str().unwrap().contains("\"name\""));
        assert_eq!(answers[2]["id"], "x");
        assert_eq!(answers[2]["is_error"], true);
        assert!(
            answers[2]["content"]
                .as_str()
                .unwrap()
                .contains("unknown tool 'nope'")
        );
    }
}
