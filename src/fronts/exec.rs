//! `taskdaemon tool exec`: one JSON call per input line, one flushed JSON answer per call,
//! all against ONE `ToolContext`, each answered before the next line is read.
//!
//! Request:  `{"id": "...", "name": "read_file", "input": {...}}`
//! Answer:   `{"id": "...", "is_error": bool, "content": "..."}`
//!
//! Every non-blank line gets exactly one answer, in order, so a caller never waits for a
//! reply that will not come: a line that is not a request, is not UTF-8, is nested deeper
//! than serde_json's recursion limit or is longer than [`MAX_LINE_BYTES`] is answered with
//! `is_error: true` (and its `id` when one can be read from it), nothing is run for it, and
//! the stream goes on with the same context. Blank lines are skipped. With a receipt log, a
//! call whose receipt cannot be written is answered as an error and no later call runs (see
//! [`ReceiptGate`]).

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};

use super::lines::{Line, LineReader, MAX_LINE_BYTES};
use super::salvage::{first_bad_byte, salvage, salvage_bytes};
use crate::fronts::receipt_gate::ReceiptGate;
use td_toolkit::call_path::CallPath;

/// What a request line looks like, for error answers.
const REQUEST_SHAPE: &str =
    "Send one JSON object per line: {\"id\": \"...\", \"name\": \"tool\", \"input\": {...}}";

/// Serves the exec protocol until `input` ends, running each call on `calls` (its context,
/// tools and receipt log; calls run in this task, one at a time). Returns why receipts
/// stopped being written, when they did (the session then ran no call after it).
pub async fn serve<R, W>(
    input: R,
    mut output: W,
    calls: &CallPath,
) -> std::io::Result<Option<String>>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = LineReader::new(input, MAX_LINE_BYTES);
    let mut number: u64 = 0;
    let gate = ReceiptGate::new();
    while let Some(line) = lines.next_line().await? {
        number = number.saturating_add(1);
        let answer = match line {
            Line::Complete(bytes) if bytes.trim_ascii().is_empty() => continue,
            Line::Complete(bytes) => match std::str::from_utf8(&bytes) {
                Ok(text) => answer_line(text, calls, &gate).await,
                Err(_) => not_utf8_answer(&bytes, number),
            },
            Line::TooLong { head, len } => too_long_answer(&head, len, number),
        };
        // Results are redacted by the registry already; an answer that echoes a bad request
        // line is not, and this is where text leaves the process.
        let mut text = td_base::secrets::redact_json(&answer.to_string()).into_owned();
        text.push('\n');
        output.write_all(text.as_bytes()).await?;
        output.flush().await?;
    }
    Ok(gate.failure())
}

/// The answer to a line that is not UTF-8: nothing is run, since the request cannot be read
/// as it was meant. The id is read from a lossy decoding.
fn not_utf8_answer(bytes: &[u8], number: u64) -> Value {
    let id = salvage_bytes(bytes).id.unwrap_or(Value::Null);
    let place = match first_bad_byte(bytes) {
        Some((at, byte)) => format!(" (first bad byte 0x{byte:02x} at byte offset {at})"),
        None => String::new(),
    };
    error_answer(
        id,
        format!(
            "request line {number} is not valid UTF-8{place}; nothing was run. JSON text must \
             be UTF-8: write other characters as \\u escapes. {REQUEST_SHAPE}"
        ),
    )
}

/// The answer to a line over the cap: it was dropped unread, so the id is found only if it
/// comes before the bulk of the line.
fn too_long_answer(head: &[u8], len: u64, number: u64) -> Value {
    let id = salvage_bytes(head).id.unwrap_or(Value::Null);
    error_answer(
        id,
        format!(
            "request line {number} is {len} bytes, over the limit of {MAX_LINE_BYTES} bytes \
             ({} MiB) per line; it was dropped and nothing was run. Send requests under this \
             size.",
            MAX_LINE_BYTES >> 20
        ),
    )
}

async fn answer_line(line: &str, calls: &CallPath, gate: &ReceiptGate) -> Value {
    let request: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            // serde_json stops at 128 levels of nesting ("recursion limit exceeded"), so a
            // deep line ends here too, with its id if it came first.
            let id = salvage(line).id.unwrap_or(Value::Null);
            return error_answer(id, format!("invalid request line: {e}. {REQUEST_SHAPE}"));
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
    if calls.receipts().is_some()
        && let Err(refused) = gate.admit()
    {
        return error_answer(id, refused);
    }
    let called = calls.call(call_id.as_deref(), name, input).await;
    if let Some(unrecorded) = gate.keep(&called) {
        return error_answer(id, unrecorded);
    }
    let outcome = called.outcome;
    json!({"id": id, "is_error": outcome.is_error, "content": outcome.content})
}

fn error_answer(id: Value, content: String) -> Value {
    json!({"id": id, "is_error": true, "content": content})
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::fronts::lines::hostile_line;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_non_blank_line_gets_exactly_one_answer(
            lines in proptest::collection::vec(hostile_line(), 0..8)
        ) {
            let input: Vec<u8> = lines.iter().flat_map(|l| l.iter().copied().chain([b'\n'])).collect();
            let expected = lines.iter().filter(|l| !l.trim_ascii().is_empty()).count();
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            // `run_bytes` also checks that each answer is one JSON line.
            let answers = runtime.block_on(run_bytes(&input));
            prop_assert_eq!(answers.len(), expected);
            for answer in &answers {
                prop_assert!(answer["is_error"].is_boolean(), "{}", answer);
            }
        }
    }

    async fn run(lines: &str) -> Vec<Value> {
        run_bytes(lines.as_bytes()).await
    }

    async fn run_bytes(lines: &[u8]) -> Vec<Value> {
        let dir = tempfile::tempdir().unwrap();
        let ctx = td_toolkit::context::ToolContext::new(dir.path(), "exec").unwrap();
        let calls = CallPath::new(
            std::sync::Arc::new(ctx),
            std::sync::Arc::new(td_tools::all_tools()),
            std::sync::Arc::new(td_toolkit::call_path::InCallerTask),
            None,
        );
        let mut out = Vec::new();
        serve(lines, &mut out, &calls).await.unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn a_line_that_is_not_utf8_is_answered_alone() {
        let answers = run_bytes(
            b"{\"id\": \"u\", \"name\": \"glob\", \"input\": {\"pattern\": \"\xff\"}}\n\
              \xc3\n\
              {\"id\": \"next\", \"name\": \"glob\", \"input\": {\"pattern\": \"*\"}}\n",
        )
        .await;
        assert_eq!(answers.len(), 3);
        assert_eq!(answers[0]["id"], "u");
        assert_eq!(answers[0]["is_error"], true);
        let content = answers[0]["content"].as_str().unwrap();
        assert!(
            content.contains("request line 1 is not valid UTF-8"),
            "{content}"
        );
        assert!(content.contains("0xff at byte offset 50"), "{content}");
        assert_eq!(answers[1]["id"], Value::Null);
        assert!(answers[1]["content"].as_str().unwrap().contains("line 2"));
        assert_eq!(answers[2]["id"], "next");
        assert_eq!(answers[2]["is_error"], false, "{}", answers[2]);
    }

    #[tokio::test]
    async fn a_deeply_nested_line_is_answered_with_its_id() {
        let depth = 50_000;
        let line = format!(
            "{{\"id\": \"deep\", \"name\": \"glob\", \"input\": {}{}}}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let answers = run(&line).await;
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0]["id"], "deep");
        assert_eq!(answers[0]["is_error"], true);
        let content = answers[0]["content"].as_str().unwrap();
        assert!(content.contains("recursion limit exceeded"), "{content}");
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
