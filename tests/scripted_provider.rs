//! The scripted provider through the public API, as the engine holds it: loaded from a file
//! and shared as `Arc<dyn LlmClient>` between loops.

use std::sync::Arc;

use td_llm::scripted::ScriptedLlm;
use td_llm::{LlmClient, LlmRequest, Purpose, StopReason};

fn request(loop_name: &str, purpose: Purpose) -> LlmRequest {
    LlmRequest {
        loop_name: loop_name.into(),
        purpose,
        system: "You are a loop.".to_string(),
        messages: Vec::new(),
        tools: Vec::new().into(),
    }
}

#[tokio::test]
async fn a_script_file_drives_two_loops_through_the_trait() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.yml");
    std::fs::write(
        &path,
        "client:\n  turns:\n    - calls:\n        - query_loop: {target_exec_id: api, question: \"Which port?\"}\n\
         api:\n  turns:\n    - calls:\n        - complete_task: {summary: done}\n  answers:\n    - when: port\n      reply: \"8080\"\n",
    )
    .unwrap();
    let llm: Arc<dyn LlmClient> = Arc::new(ScriptedLlm::load(&path).unwrap());

    let asked = llm
        .complete(&request("client", Purpose::Iteration))
        .await
        .unwrap();
    assert_eq!(asked.stop_reason, StopReason::ToolUse);
    assert_eq!(asked.tool_calls[0].id, "client-1-1");
    let question = asked.tool_calls[0].input["question"]
        .as_str()
        .unwrap()
        .to_string();

    let purpose = Purpose::QueryAnswer {
        from: "client".into(),
        question: question.into(),
    };
    let answer = llm.complete(&request("api", purpose)).await.unwrap();
    assert_eq!(answer.text.as_deref(), Some("8080"));
    assert!(answer.usage.input_tokens > 0);

    let done = llm
        .complete(&request("api", Purpose::Iteration))
        .await
        .unwrap();
    assert_eq!(done.tool_calls[0].name, "complete_task");
    assert_eq!(done.tool_calls[0].id, "api-1-1");

    let idle = llm
        .complete(&request("client", Purpose::Iteration))
        .await
        .unwrap();
    assert_eq!(idle.stop_reason, StopReason::EndTurn);
    assert!(idle.tool_calls.is_empty() && idle.text.is_none());
}
