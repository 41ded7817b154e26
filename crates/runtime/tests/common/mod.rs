//! What the runtime's integration tests share: the spec of a loop with everything off but
//! what a test names.

use std::sync::Arc;

use td_engine::transcript::NoTranscript;
use td_engine::{EngineConfig, prompt};
use td_llm::LlmClient;
use td_protocol::events::EventLog;
use td_runtime::daemon::Runtime;
use td_runtime::loop_actor::LoopSpec;
use td_toolkit::context::ToolContext;
use td_toolkit::registry::ToolSet;

/// The spec of loop `name` in `rt` with `tools` and model `llm`: the default prompts, one
/// iteration of one turn, no receipts, no budgets, nothing in its inbox; it announces
/// nothing and listens to nobody. A test changes the fields it is about.
pub fn loop_spec(
    rt: &Runtime,
    events: &Arc<EventLog>,
    ctx: Arc<ToolContext>,
    name: &str,
    tools: Arc<ToolSet>,
    llm: Arc<dyn LlmClient>,
) -> LoopSpec {
    LoopSpec {
        config: EngineConfig {
            name: name.into(),
            loop_type: "ralph".into(),
            task: String::new(),
            max_iterations: 1,
            max_turns: 1,
            iteration_timeout: None,
            success_code: 0,
            system_template: prompt::DEFAULT_SYSTEM.into(),
            iteration_template: prompt::DEFAULT_ITERATION.into(),
            peers: Vec::new(),
            first_iteration: 1,
        },
        ctx,
        tools,
        validation_tools: Arc::new(ToolSet::from_tools(Vec::new()).unwrap()),
        llm,
        runner: Arc::new(rt.lanes.clone()),
        coordinator: rt.coordinator.clone(),
        events: events.clone(),
        transcript: Arc::new(NoTranscript),
        receipts: None,
        subscriptions: Some(Vec::new()),
        ended: None,
        gate: None,
        initial_inbox: Vec::new(),
        initial_progress: Vec::new(),
        announced: false,
        budgets: td_engine::budget::Budgets::unlimited(),
    }
}
