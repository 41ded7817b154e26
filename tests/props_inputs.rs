//! No configuration file, scripted-LLM script or model reply makes the daemon panic: each
//! parser gets random documents (valid ones with one part replaced by anything, and random
//! ones built from the keys it knows) and must answer `Ok` or a clear `Err`.

use proptest::prelude::*;
use serde_json::{Value, json};
use taskdaemon::config::Config;
use td_llm::scripted::ScriptedLlm;
use td_llm::{anthropic, openai};

mod props_support;

/// Keys the parsers know, so that random documents get past the first check often.
const KEYS: &[&str] = &[
    // taskdaemon.yml
    "llm",
    "provider",
    "script",
    "model",
    "base-url",
    "api-key-env",
    "max-tokens",
    "loops",
    "name",
    "type",
    "task",
    "depends-on",
    "worktree",
    "branch",
    "catalog",
    "timeout-ms",
    "max-output-bytes",
    "lane",
    "lanes",
    "no-net",
    "net",
    "heavy",
    "concurrency",
    "max-loops",
    "max-model-calls",
    "limits",
    "burst",
    "per-second",
    "max-payload-bytes",
    "loop-types",
    "extends",
    "tools",
    "system-prompt",
    "iteration-prompt",
    "validation",
    "success-code",
    "max-iterations",
    "max-turns",
    "iteration-timeout-ms",
    "subscriptions",
    "build",
    "test",
    "repo",
    // scripted script
    "turns",
    "say",
    "calls",
    "answers",
    "when",
    "reply",
    "read_file",
    "path",
    // model replies
    "content",
    "text",
    "tool_use",
    "id",
    "input",
    "stop_reason",
    "choices",
    "message",
    "tool_calls",
    "function",
    "arguments",
    "finish_reason",
    "usage",
    "role",
    "error",
    // values the seeds use, so that references between parts still meet
    "api",
    "client",
    "ralph",
    "api-type",
    "code",
    "grep",
    "read_file",
    "loop_completed",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(KEYS).prop_map(str::to_string),
        1 => "\\PC{0,8}",
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    props_support::arb_json(4, key().boxed(), key().boxed())
}

/// The number of nodes of `v` (itself included).
fn nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(items) => items.iter().map(nodes).sum(),
        Value::Object(map) => map.values().map(nodes).sum(),
        _ => 0,
    }
}

/// `seed` with its node number `at` (pre-order) replaced by `with`.
fn replace(seed: &Value, at: usize, with: &Value) -> Value {
    fn walk(v: &mut Value, at: &mut usize, with: &Value) -> bool {
        if *at == 0 {
            *v = with.clone();
            return true;
        }
        *at -= 1;
        match v {
            Value::Array(items) => items.iter_mut().any(|i| walk(i, at, with)),
            Value::Object(map) => map.values_mut().any(|i| walk(i, at, with)),
            _ => false,
        }
    }
    let mut out = seed.clone();
    let mut at = at % nodes(seed);
    walk(&mut out, &mut at, with);
    out
}

fn config_seed() -> Value {
    json!({
        "llm": {"provider": "scripted", "script": "script.yml"},
        "concurrency": {"max-loops": 2, "max-model-calls": 2},
        "limits": {"burst": 5, "per-second": 2.0, "max-payload-bytes": 1024},
        "catalog": {"grep": {"timeout-ms": 5000, "lane": "no-net"}},
        "loop-types": {"api-type": {"extends": "ralph", "max-iterations": 3,
                                     "tools": ["read_file", "write_file"],
                                     "subscriptions": ["loop_completed"]}},
        "loops": [
            {"name": "api", "type": "api-type", "task": "build it"},
            {"name": "client", "type": "ralph", "task": "use it", "depends-on": ["api"]}
        ]
    })
}

fn script_seed() -> Value {
    json!({
        "client": {
            "turns": [
                {"say": "asking", "calls": [{"query_loop": {"target_exec_id": "api", "question": "port?"}}]},
                {"calls": [{"write_file": {"path": "a.txt", "content": "x"}}, {"complete_task": {"summary": "done"}}]}
            ],
            "answers": [{"when": "port", "reply": "8080"}, {"reply": "no idea"}]
        }
    })
}

fn anthropic_seed() -> Value {
    json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [
            {"type": "text", "text": "Reading"},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5}
    })
}

fn openai_seed() -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Reading",
                        "tool_calls": [{"id": "call_1", "type": "function",
                                        "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}]},
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}
    })
}

fn yaml(v: &Value) -> String {
    serde_yaml_ng::to_string(v).unwrap_or_default()
}

#[test]
fn the_seeds_are_valid() {
    Config::parse(&yaml(&config_seed()), "t.yml").unwrap();
    ScriptedLlm::from_yaml(&yaml(&script_seed()), "s.yml").unwrap();
    assert_eq!(
        anthropic::parse_response(&anthropic_seed())
            .unwrap()
            .tool_calls
            .len(),
        1
    );
    assert_eq!(
        openai::parse_response(&openai_seed())
            .unwrap()
            .tool_calls
            .len(),
        1
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn config_files_never_panic(at in any::<usize>(), with in arb_json(), doc in arb_json()) {
        let _ = Config::parse(&yaml(&replace(&config_seed(), at, &with)), "t.yml");
        let _ = Config::parse(&yaml(&doc), "t.yml");
    }

    #[test]
    fn config_text_never_panics(text in "\\PC{0,200}") {
        let _ = Config::parse(&text, "t.yml");
        let _ = ScriptedLlm::from_yaml(&text, "s.yml");
    }

    #[test]
    fn scripts_never_panic(at in any::<usize>(), with in arb_json(), doc in arb_json()) {
        let _ = ScriptedLlm::from_yaml(&yaml(&replace(&script_seed(), at, &with)), "s.yml");
        let _ = ScriptedLlm::from_yaml(&yaml(&doc), "s.yml");
    }

    #[test]
    fn model_replies_never_panic(at in any::<usize>(), with in arb_json(), doc in arb_json()) {
        let _ = anthropic::parse_response(&replace(&anthropic_seed(), at, &with));
        let _ = anthropic::parse_response(&doc);
        let _ = openai::parse_response(&replace(&openai_seed(), at, &with));
        let _ = openai::parse_response(&doc);
    }
}
