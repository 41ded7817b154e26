//! `ToolSet`: the tools one loop may call, and the single path every call takes —
//! lookup, schema validation, timeout, panic guard, output cap, receipt.
//!
//! Loops, `tool exec`, MCP and replay all call tools through `ToolSet::call`, so limits,
//! receipts and the redaction of secrets cannot differ between fronts.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::FutureExt;
use serde_json::Value;

use crate::catalog::{Route, ToolSpec};
use crate::context::ToolContext;
use crate::error::{ArgumentProblem, ToolError};
use crate::quick_schema::QuickSchema;
use crate::receipts::{CallDraft, CallReceipt, DraftOutput, SideEffect};
use crate::tool::{Tool, ToolOutput};
use td_base::secrets;
use td_base::sync::lock;
use td_base::text::head_tail;
use td_protocol::tool_definition::ToolDefinition;

/// Extra time a self-timing tool (a command) gets before the registry's watchdog fires.
const WATCHDOG_GRACE: Duration = Duration::from_secs(10);

/// Why a tool set could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// A tool's input schema does not compile.
    #[error("schema of tool '{tool}' is invalid: {reason}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// What the schema compiler said.
        reason: String,
    },
    /// A name was given twice.
    #[error("tool '{0}' is listed twice")]
    ListedTwice(String),
    /// A name that is no tool of the box.
    #[error("unknown tool '{name}'{}; known tools: {known}", did_you_mean(.suggestion.as_deref()))]
    UnknownTool {
        /// The name as given.
        name: String,
        /// The closest known name, if one is close.
        suggestion: Option<String>,
        /// Every known name, comma-separated.
        known: String,
    },
}

fn did_you_mean(suggestion: Option<&str>) -> String {
    suggestion
        .map(|s| format!(" (did you mean '{s}'?)"))
        .unwrap_or_default()
}

/// The result of one call as the model sees it, plus its receipt.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    /// Text for the model, capped to the tool's output limit.
    pub content: String,
    /// Whether it is an error result.
    pub is_error: bool,
    /// The call's receipt, read as a [`Receipt`]: its id, date and input hash are made when
    /// it is first read (a receipt log writes it), not by a call whose receipt nobody reads.
    pub receipt: CallReceipt,
}

struct Entry {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
    /// The quick check in front of the validator, when the schema is simple enough.
    quick: Option<QuickSchema>,
}

impl Entry {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: self.tool.name().to_string(),
            description: self.tool.description().to_string(),
            input_schema: self.tool.input_schema(),
        }
    }

    fn compile(tool: Arc<dyn Tool>) -> Result<Self, RegistryError> {
        let schema = tool.input_schema();
        let validator =
            jsonschema::validator_for(&schema).map_err(|e| RegistryError::InvalidSchema {
                tool: tool.name().to_string(),
                reason: e.to_string(),
            })?;
        let quick = QuickSchema::compile(&schema);
        Ok(Self {
            tool,
            validator,
            quick,
        })
    }

    /// Whether `input` passes the schema: the quick check when it is certain, else the
    /// validator.
    fn is_valid(&self, input: &Value) -> bool {
        self.quick.as_ref().is_some_and(|q| q.accepts(input)) || self.validator.is_valid(input)
    }
}

/// A fixed collection of tools with their compiled validators, from which tool sets are
/// chosen by name. The built-in tools form one (`td_tools::builtin()`), made once per process
/// and shared by every tool set: a run builds a tool set per loop, and compiling the schemas
/// again for each (about 120 KB per set) made them most of a loop's memory. Tools are
/// stateless and validators immutable, so sharing them changes nothing.
pub struct ToolBox {
    entries: BTreeMap<&'static str, Result<Arc<Entry>, RegistryError>>,
    names: Vec<&'static str>,
    /// Definitions of the tool lists chosen so far (see [`ToolBox::definitions`]).
    definitions: Mutex<HashMap<Vec<String>, Arc<[ToolDefinition]>>>,
}

impl ToolBox {
    /// Compiles the schemas of `tools`; a schema that does not compile makes every set that
    /// names its tool fail with the reason.
    pub fn new(tools: Vec<Arc<dyn Tool>>) -> Self {
        let names = tools.iter().map(|t| t.name()).collect();
        let entries = tools
            .into_iter()
            .map(|tool| (tool.name(), Entry::compile(tool).map(Arc::new)))
            .collect();
        Self {
            entries,
            names,
            definitions: Mutex::new(HashMap::new()),
        }
    }

    /// Every tool name, in the order the tools were given.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }

    /// Every tool of the box, in order.
    pub fn all(&'static self) -> Result<ToolSet, RegistryError> {
        self.set(&self.names)
    }

    /// The tools named in `names`, in that order. An unknown or repeated name is an error
    /// that names the closest valid tool (never a silent drop).
    pub fn set<S: AsRef<str>>(&'static self, names: &[S]) -> Result<ToolSet, RegistryError> {
        let mut chosen: Vec<Arc<Entry>> = Vec::new();
        let mut taken: HashSet<&str> = HashSet::new();
        for name in names {
            let name = name.as_ref();
            match self.entries.get(name) {
                Some(_) if !taken.insert(name) => {
                    return Err(RegistryError::ListedTwice(name.to_string()));
                }
                Some(Ok(entry)) => chosen.push(entry.clone()),
                Some(Err(e)) => return Err(e.clone()),
                None => {
                    return Err(RegistryError::UnknownTool {
                        name: name.to_string(),
                        suggestion: td_base::suggest::closest(name, self.names.iter().copied())
                            .map(str::to_string),
                        known: self.names.join(", "),
                    });
                }
            }
        }
        let mut set = ToolSet::from_entries(chosen);
        set.toolbox = Some(self);
        Ok(set)
    }

    /// Definitions of the tools named in `order`. Loops of one type have the same tools, so
    /// they share one copy of the definitions instead of each building its own for every
    /// iteration (the schemas were the largest thing a running loop held).
    fn definitions(&self, order: &[String]) -> Arc<[ToolDefinition]> {
        /// Distinct tool lists are few (one per loop type); past this many the cache starts over.
        const MAX_LISTS: usize = 64;
        if let Some(defs) = lock(&self.definitions).get(order) {
            return defs.clone();
        }
        let defs: Arc<[ToolDefinition]> = order
            .iter()
            .filter_map(|n| self.entries.get(n.as_str()).and_then(|e| e.as_ref().ok()))
            .map(|e| e.definition())
            .collect();
        let mut map = lock(&self.definitions);
        if map.len() >= MAX_LISTS {
            map.clear();
        }
        map.insert(order.to_vec(), defs.clone());
        defs
    }
}

/// A set of tools with compiled input validators.
pub struct ToolSet {
    entries: BTreeMap<String, Arc<Entry>>,
    order: Vec<String>,
    /// The box the tools were chosen from by name, whose definitions are shared.
    toolbox: Option<&'static ToolBox>,
    definitions: OnceLock<Arc<[ToolDefinition]>>,
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSet")
            .field("tools", &self.order)
            .finish()
    }
}

impl ToolSet {
    /// A set of arbitrary tools (tests use this to add tools of their own).
    pub fn from_tools(tools: Vec<Arc<dyn Tool>>) -> Result<Self, RegistryError> {
        let entries = tools
            .into_iter()
            .map(|tool| Entry::compile(tool).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_entries(entries))
    }

    fn from_entries(chosen: Vec<Arc<Entry>>) -> Self {
        let mut entries = BTreeMap::new();
        let mut order = Vec::new();
        for entry in chosen {
            let name = entry.tool.name().to_string();
            order.push(name.clone());
            entries.insert(name, entry);
        }
        Self {
            entries,
            order,
            toolbox: None,
            definitions: OnceLock::new(),
        }
    }

    /// Tool names in set order.
    pub fn names(&self) -> &[String] {
        &self.order
    }

    /// The tool called `name`, if in the set.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.entries.get(name).map(|e| &e.tool)
    }

    /// Definitions in set order.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.shared_definitions().to_vec()
    }

    /// Definitions in set order, built once and shared (by every set of the same built-in
    /// tools): what a model request carries.
    pub fn shared_definitions(&self) -> Arc<[ToolDefinition]> {
        self.definitions
            .get_or_init(|| {
                if let Some(toolbox) = self.toolbox {
                    toolbox.definitions(&self.order)
                } else {
                    self.order
                        .iter()
                        .filter_map(|n| self.entries.get(n))
                        .map(|e| e.definition())
                        .collect()
                }
            })
            .clone()
    }

    /// Definitions of the tools of this set that `keep` accepts (by name), in set order;
    /// shared like [`ToolSet::shared_definitions`].
    pub fn shared_subset(&self, keep: impl Fn(&str) -> bool) -> Arc<[ToolDefinition]> {
        let names: Vec<String> = self.order.iter().filter(|n| keep(n)).cloned().collect();
        if let Some(toolbox) = self.toolbox {
            return toolbox.definitions(&names);
        }
        self.shared_definitions()
            .iter()
            .filter(|d| names.contains(&d.name))
            .cloned()
            .collect()
    }

    /// Whether calls of `name` may run beside other such calls of one model response when
    /// its catalog route is `route`: a read-only tool of a worker lane (coordination tools
    /// wait on other loops, so they run alone, in order). These are also the only tools a
    /// query's answer may use.
    pub fn concurrent_on(&self, name: &str, route: Option<Route>) -> bool {
        matches!(route, Some(Route::Lane(_))) && self.get(name).is_some_and(|t| t.read_only())
    }

    /// Definitions of the tools a query's answer may use under `catalog`'s routes
    /// ([`ToolSet::concurrent_on`]), in set order: what an answer's model request offers,
    /// on whichever machine the answer's model call is made.
    pub fn answer_definitions(&self, catalog: &crate::catalog::Catalog) -> Arc<[ToolDefinition]> {
        self.shared_subset(|n| self.concurrent_on(n, Some(catalog.spec(n).lane)))
    }

    /// Checks `input` against the schema of `name`, listing every problem with its pointer.
    pub fn validate(&self, name: &str, input: &Value) -> Result<(), ToolError> {
        let entry = self.entries.get(name).ok_or_else(|| self.unknown(name))?;
        let problems: Vec<ArgumentProblem> = entry
            .validator
            .iter_errors(input)
            .map(|e| ArgumentProblem {
                pointer: e.instance_path().as_str().to_string(),
                message: e.to_string(),
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ToolError::InvalidArguments {
                tool: name.to_string(),
                problems,
            })
        }
    }

    fn unknown(&self, name: &str) -> ToolError {
        ToolError::UnknownTool {
            name: name.to_string(),
            available: self.order.join(", "),
        }
    }

    /// Runs one call with every guard and returns what the model sees plus a receipt.
    /// A panicking tool becomes an error result.
    pub async fn call(
        &self,
        ctx: &ToolContext,
        call_id: Option<&str>,
        name: &str,
        input: impl Into<Arc<Value>>,
    ) -> CallOutcome {
        let spec = ctx.spec(name);
        self.call_with(ctx, spec, call_id, name, input.into(), PanicPolicy::Catch)
            .await
    }

    /// [`ToolSet::call`] with the catalog entry of `name` in `ctx` looked up already (a call
    /// path keeps those of its tools).
    pub(crate) async fn call_specified(
        &self,
        ctx: &ToolContext,
        spec: ToolSpec,
        call_id: Option<&str>,
        name: &str,
        input: Arc<Value>,
    ) -> CallOutcome {
        self.call_with(ctx, spec, call_id, name, input, PanicPolicy::Catch)
            .await
    }

    /// Like [`ToolSet::call`], but a panicking tool unwinds into the caller. Tool lanes use
    /// this so that the worker actor fails and its supervisor restarts it; the lane then
    /// answers the call with [`ToolSet::failed_outcome`].
    pub async fn call_propagating_panics(
        &self,
        ctx: &ToolContext,
        call_id: Option<&str>,
        name: &str,
        input: impl Into<Arc<Value>>,
    ) -> CallOutcome {
        let spec = ctx.spec(name);
        self.call_with(
            ctx,
            spec,
            call_id,
            name,
            input.into(),
            PanicPolicy::Propagate,
        )
        .await
    }

    /// The outcome (and receipt) of a call that never produced a result of its own, e.g.
    /// because the worker running it died.
    pub fn failed_outcome(
        &self,
        ctx: &ToolContext,
        call_id: Option<&str>,
        name: &str,
        input: impl Into<Arc<Value>>,
        error: ToolError,
        latency: Duration,
    ) -> CallOutcome {
        let checked = Checked {
            result: Err(error),
            schema_valid: None,
            tool: self.get(name).map(|t| t.name()),
        };
        let spec = ctx.spec(name);
        // Its receipt's time is now, when the failure is known (as it always was).
        self.outcome(
            ctx,
            &spec,
            call_id,
            name,
            input.into(),
            checked,
            latency,
            Instant::now(),
        )
    }

    async fn call_with(
        &self,
        ctx: &ToolContext,
        spec: ToolSpec,
        call_id: Option<&str>,
        name: &str,
        input: Arc<Value>,
        panics: PanicPolicy,
    ) -> CallOutcome {
        let started = Instant::now();
        // The tool borrows the input: it stays here for the receipt, uncopied.
        let checked = self.run_guarded(ctx, &spec, name, &input, panics).await;
        self.outcome(
            ctx,
            &spec,
            call_id,
            name,
            input,
            checked,
            started.elapsed(),
            started,
        )
    }

    /// The model's view of a result and its receipt. Every known secret is redacted from the
    /// output, the recorded input and the side effects first: what the model, the transcript
    /// and the receipt see is one redacted text, the output is redacted before it is capped
    /// (a cut could leave half a secret), and the hashes cover the redacted text, so that
    /// `replay verify` (which redacts alike) compares like with like. The receipt's id, the
    /// date of `time` (when the call `started`) and its hashes are made when it is first
    /// read ([`CallReceipt`]).
    #[allow(clippy::too_many_arguments)]
    fn outcome(
        &self,
        ctx: &ToolContext,
        spec: &ToolSpec,
        call_id: Option<&str>,
        name: &str,
        mut input: Arc<Value>,
        checked: Checked,
        latency: Duration,
        started: Instant,
    ) -> CallOutcome {
        let Checked {
            result,
            schema_valid,
            tool,
        } = checked;
        secrets::redact_shared_value(&mut input);
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let latency_ms = latency_us / 1000;
        let (full, is_error, mut effects, error_kind) = match result {
            Ok(out) => (out.content, out.is_error, out.effects, None),
            Err(e) => (e.to_string(), true, Vec::new(), Some(e.kind().to_string())),
        };
        let full = secrets::redact_owned(full);
        effects.iter_mut().for_each(redact_side_effect);
        if effects
            .iter()
            .any(|e| matches!(e, SideEffect::CommandRun { .. }))
        {
            // A command may have committed; the next receipt must not reuse a stale HEAD.
            ctx.invalidate_commit();
        }
        let output_bytes = full.len();
        // Most outputs fit: they are handed on as they are, not copied (the receipt hashes
        // the full output, or keeps a copy of a small one to hash when it is made).
        let (content, full) = if output_bytes <= spec.max_output_bytes {
            (full, None)
        } else {
            (head_tail(&full, spec.max_output_bytes), Some(full))
        };
        let output_capped = content.len() != output_bytes;
        let receipt = CallReceipt::new(CallDraft {
            call_id: call_id.map(str::to_string),
            exec_id: Arc::clone(ctx.shared_exec_id()),
            tool: tool.map_or_else(|| Cow::Owned(name.to_string()), Cow::Borrowed),
            input,
            output: DraftOutput::of(full.as_deref().unwrap_or(&content), is_error),
            is_error,
            error_kind,
            output_bytes,
            output_capped,
            latency_ms,
            latency_us,
            side_effects: effects,
            commit: ctx.worktree_commit(),
            schema_valid,
            started,
        });
        CallOutcome {
            content,
            is_error,
            receipt,
        }
    }

    /// Lookup and schema validation, then the guarded run; says whether the schema
    /// accepted the input (`false` for a tool the set does not have).
    async fn run_guarded(
        &self,
        ctx: &ToolContext,
        spec: &ToolSpec,
        name: &str,
        input: &Value,
        panics: PanicPolicy,
    ) -> Checked {
        let Some(entry) = self.entries.get(name) else {
            return Checked {
                result: Err(self.unknown(name)),
                schema_valid: Some(false),
                tool: None,
            };
        };
        let tool = Some(entry.tool.name());
        // The quick checks first; the problems are listed only for an input they refuse.
        if !entry.is_valid(input)
            && let Err(error) = self.validate(name, input)
        {
            return Checked {
                result: Err(error),
                schema_valid: Some(false),
                tool,
            };
        }
        Checked {
            result: run_validated(entry, ctx, spec, name, input, panics).await,
            schema_valid: Some(true),
            tool,
        }
    }
}

/// Timeout and panic guard around `execute`, for an input the schema accepted.
///
/// The catalog timeout is the registry's to enforce, except for the coordination tools
/// ([`Route::Coordinator`]): the coordinator bounds them (it never waits on a loop in its
/// handler, and a query's answer ends at the asker's deadline: see
/// [`Coordination`](crate::coordination::Coordination)), so no watchdog is armed for them.
/// A tool that enforces its own timeout (a command, which must kill its process group
/// rather than be dropped) gets a late watchdog as a backstop.
async fn run_validated(
    entry: &Entry,
    ctx: &ToolContext,
    spec: &ToolSpec,
    name: &str,
    input: &Value,
    panics: PanicPolicy,
) -> Result<ToolOutput, ToolError> {
    let deadline = match spec.lane {
        Route::Coordinator => None,
        Route::Lane(_) => {
            let limit = Duration::from_millis(spec.timeout_ms);
            let watchdog = if entry.tool.enforces_own_timeout() {
                limit + WATCHDOG_GRACE
            } else {
                limit
            };
            Some((tokio::time::Instant::now() + watchdog, watchdog))
        }
    };
    let timed_out = |watchdog: Duration| ToolError::Timeout {
        timeout_ms: watchdog.as_millis() as u64,
        detail: format!(" ({name})"),
    };
    let run = entry.tool.execute_borrowed(input, ctx);
    if panics == PanicPolicy::Propagate {
        return match deadline {
            None => run.await,
            Some((at, watchdog)) => watched(run, at)
                .await
                .unwrap_or_else(|| Err(timed_out(watchdog))),
        };
    }
    let run = std::panic::AssertUnwindSafe(run).catch_unwind();
    let ran = match deadline {
        None => Some(run.await),
        Some((at, _)) => watched(run, at).await,
    };
    match ran {
        Some(Ok(result)) => result,
        Some(Err(panic)) => Err(ToolError::failed(
            format!("tool {name}"),
            format!("it panicked: {}", panic_message(&panic)),
            "This is a bug in the tool; try a different approach or other arguments.",
        )),
        None => Err(timed_out(deadline.map_or(Duration::ZERO, |(_, w)| w))),
    }
}

/// Runs `call` until `deadline`: its output, or `None` when the deadline came first.
///
/// The timer is armed only when the call does not finish at its first poll. Many calls do
/// (a small read, `complete_task`), and arming a timer wakes the thread parked on tokio's
/// timer driver, which costs more than such a call; the deadline still counts from the
/// start of the call.
async fn watched<F: Future>(call: F, deadline: tokio::time::Instant) -> Option<F::Output> {
    let mut call = pin!(call);
    let mut timer = pin!(None::<tokio::time::Sleep>);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = call.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if timer.is_none() {
            timer.set(Some(tokio::time::sleep_until(deadline)));
        }
        match timer.as_mut().as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    })
    .await
}

/// A side effect with every known secret redacted (a command line may spell a key out).
fn redact_side_effect(effect: &mut SideEffect) {
    match effect {
        SideEffect::FileWritten { path, .. } => *path = secrets::redact_owned(std::mem::take(path)),
        SideEffect::CommandRun { command, .. } => {
            *command = secrets::redact_owned(std::mem::take(command));
        }
    }
}

/// A call's result, whether the schema accepted its input (`None`: not known), and the
/// tool's own name when the set has it.
struct Checked {
    result: Result<ToolOutput, ToolError>,
    schema_valid: Option<bool>,
    tool: Option<&'static str>,
}

/// What to do when a tool panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PanicPolicy {
    /// Turn the panic into an error result.
    Catch,
    /// Let it unwind into the caller (a supervised worker).
    Propagate,
}

/// The message of a caught panic payload.
pub fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receipts::{hash_output, hash_value};
    use crate::test_support::FnTool;
    use serde_json::json;

    /// Answers its `text` a thousand times; `panic` panics and `sleep` sleeps a minute.
    fn echo() -> impl Tool {
        FnTool::new(
            "echo",
            json!({"type":"object","properties":{"text":{"type":"string"},"n":{"type":"integer","minimum":1}},"required":["text"],"additionalProperties":false}),
            |input: Value| async move {
                let text = input["text"].as_str().unwrap_or_default();
                if text == "panic" {
                    panic!("boom");
                }
                if text == "sleep" {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                Ok(ToolOutput::text(text.repeat(1000)))
            },
        )
    }

    fn ctx(dir: &std::path::Path) -> ToolContext {
        ToolContext::new(dir, "tester").unwrap()
    }

    #[tokio::test]
    async fn invalid_input_lists_pointers() {
        let dir = tempfile::tempdir().unwrap();
        let set = ToolSet::from_tools(vec![Arc::new(echo())]).unwrap();
        let out = set
            .call(&ctx(dir.path()), None, "echo", json!({"n": 0, "x": 1}))
            .await;
        assert!(out.is_error);
        assert!(out.content.contains("at /n:"), "{}", out.content);
        assert!(out.content.contains("\"text\" is a required property"));
        assert_eq!(out.receipt.error_kind.as_deref(), Some("invalid_arguments"));
        assert_eq!(out.receipt.schema_valid, Some(false));
        let ok = set
            .call(&ctx(dir.path()), None, "echo", json!({"text": "a"}))
            .await;
        assert_eq!(ok.receipt.schema_valid, Some(true));
    }

    #[tokio::test]
    async fn unknown_tool_names_the_available_ones() {
        let dir = tempfile::tempdir().unwrap();
        let set = ToolSet::from_tools(vec![Arc::new(echo())]).unwrap();
        let out = set.call(&ctx(dir.path()), None, "nope", json!({})).await;
        assert!(out.is_error);
        assert!(out.content.contains("Available tools: echo"));
        assert_eq!(out.receipt.schema_valid, Some(false));
    }

    #[tokio::test]
    async fn panic_becomes_an_error_and_the_set_still_works() {
        let dir = tempfile::tempdir().unwrap();
        let set = ToolSet::from_tools(vec![Arc::new(echo())]).unwrap();
        let c = ctx(dir.path());
        let out = set.call(&c, None, "echo", json!({"text": "panic"})).await;
        assert!(out.is_error);
        assert!(out.content.contains("panicked: boom"));
        let out = set
            .call(&c, Some("id1"), "echo", json!({"text": "a"}))
            .await;
        assert!(!out.is_error);
        assert_eq!(out.receipt.call_id.as_deref(), Some("id1"));
    }

    #[tokio::test(start_paused = true)]
    async fn catalog_timeout_applies() {
        let dir = tempfile::tempdir().unwrap();
        let set = ToolSet::from_tools(vec![Arc::new(echo())]).unwrap();
        let out = set
            .call(&ctx(dir.path()), None, "echo", json!({"text": "sleep"}))
            .await;
        assert!(out.is_error);
        assert_eq!(out.receipt.error_kind.as_deref(), Some("timeout"));
    }

    /// A tool under a given catalog name that sleeps `ms` (virtual time in these tests).
    fn sleepy(name: &'static str) -> impl Tool {
        FnTool::new(
            name,
            json!({"type": "object", "properties": {"ms": {"type": "integer"}}}),
            |input: Value| async move {
                let ms = input["ms"].as_u64().unwrap_or(0);
                if ms > 0 {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Ok(ToolOutput::text("woke"))
            },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_counts_from_the_start_of_the_call_for_lane_tools_only() {
        let dir = tempfile::tempdir().unwrap();
        let set = ToolSet::from_tools(vec![
            Arc::new(sleepy("grep")),
            Arc::new(sleepy("list_loops")),
        ])
        .unwrap();
        let c = ctx(dir.path());
        // grep: 60 s in the catalog.
        let out = set.call(&c, None, "grep", json!({"ms": 59_000})).await;
        assert_eq!(out.content, "woke");
        let started = tokio::time::Instant::now();
        let out = set.call(&c, None, "grep", json!({"ms": 61_000})).await;
        assert_eq!(
            out.receipt.error_kind.as_deref(),
            Some("timeout"),
            "{}",
            out.content
        );
        assert!(out.content.contains("60000"), "{}", out.content);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        // list_loops: 5 s in the catalog, but the coordinator bounds coordination tools.
        let out = set.call(&c, None, "list_loops", json!({"ms": 6_000})).await;
        assert_eq!(out.content, "woke");
        assert!(!out.is_error);
    }

    /// A sub-millisecond call reads 0 in `latency_ms`: the receipt gives the wall time in
    /// µs too (the cross-host query bench reads it), consistent with the milliseconds.
    #[tokio::test]
    async fn a_receipt_gives_its_latency_in_microseconds_too() {
        let dir = tempfile::tempdir().unwrap();
        let set = ToolSet::from_tools(vec![Arc::new(sleepy("grep"))]).unwrap();
        let c = ctx(dir.path());
        let started = std::time::Instant::now();
        let out = set.call(&c, None, "grep", json!({"ms": 3})).await;
        let wall = started.elapsed();
        let us = out.receipt.latency_us.expect("latency in µs");
        assert!(us >= 3_000, "{us} µs for a 3 ms sleep");
        assert!(u128::from(us) <= wall.as_micros(), "{us} µs in {wall:?}");
        assert_eq!(out.receipt.latency_ms, us / 1000);
        // A quick call: 0 ms, but not 0 µs of nothing.
        let out = set.call(&c, None, "grep", json!({"ms": 0})).await;
        assert_eq!(out.receipt.latency_ms, 0);
        assert!(out.receipt.latency_us.is_some());
    }

    #[test]
    fn set_errors_are_typed_and_say_what_to_fix() {
        assert_eq!(
            test_box().set(&["echo", "patern"]).unwrap_err(),
            RegistryError::UnknownTool {
                name: "patern".into(),
                suggestion: Some("pattern".into()),
                known: "echo, pattern".into(),
            }
        );
        assert_eq!(
            test_box().set(&["zzzzzzzz"]).unwrap_err().to_string(),
            "unknown tool 'zzzzzzzz'; known tools: echo, pattern"
        );
        let broken = FnTool::new("broken", json!({"type": 7}), |_: Value| async {
            Ok(ToolOutput::text(""))
        });
        let err = ToolSet::from_tools(vec![Arc::new(broken)]).unwrap_err();
        assert!(
            matches!(&err, RegistryError::InvalidSchema { tool, .. } if tool == "broken"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("schema of tool 'broken' is invalid: "),
            "{err}"
        );
    }

    #[tokio::test]
    async fn output_is_capped_but_hashed_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let mut catalog = crate::catalog::Catalog::default();
        let mut o = BTreeMap::new();
        o.insert(
            "read_file".to_string(),
            crate::catalog::ToolSpecOverride {
                max_output_bytes: Some(300),
                ..Default::default()
            },
        );
        catalog.apply_overrides(&o).unwrap();
        let c = ToolContext::new(dir.path(), "t")
            .unwrap()
            .with_catalog(Arc::new(catalog));
        // The unknown tool "echo" gets the default cap; use a renamed echo via read_file's cap.
        let big = FnTool::new("read_file", json!({"type":"object"}), |_: Value| async {
            Ok(ToolOutput::text(format!("HEAD{}TAIL", "x".repeat(5000))))
        });
        let set = ToolSet::from_tools(vec![Arc::new(big)]).unwrap();
        let out = set.call(&c, None, "read_file", json!({})).await;
        assert!(out.content.len() <= 360);
        assert!(out.content.starts_with("HEAD") && out.content.ends_with("TAIL"));
        assert!(out.receipt.output_capped);
        assert_eq!(out.receipt.output_bytes, 5008);
        assert_eq!(
            out.receipt.output_hash,
            hash_output(&format!("HEAD{}TAIL", "x".repeat(5000)), false)
        );
    }

    #[tokio::test]
    async fn secrets_are_redacted_from_output_input_and_receipt_alike() {
        td_base::secrets::register("TEST_REGISTRY_KEY", "sk-registry-test-r3r3");
        let marker = "[REDACTED:TEST_REGISTRY_KEY]";
        let dir = tempfile::tempdir().unwrap();
        let set = ToolSet::from_tools(vec![Arc::new(echo())]).unwrap();
        let out = set
            .call(
                &ctx(dir.path()),
                None,
                "echo",
                json!({"text": "sk-registry-test-r3r3"}),
            )
            .await;
        assert!(!out.content.contains("sk-registry"), "{}", out.content);
        assert!(out.content.starts_with(marker), "{}", out.content);
        let r = &out.receipt;
        assert_eq!(*r.input, json!({"text": marker}));
        assert_eq!(r.input_hash, hash_value(&json!({"text": marker})));
        let full = marker.repeat(1000);
        assert_eq!(r.output_hash, hash_output(&full, false));
        assert_eq!(r.output_bytes, full.len());
    }

    #[test]
    fn side_effects_are_redacted() {
        td_base::secrets::register("TEST_REGISTRY_EFFECT", "sk-effect-test-e4e4");
        let mut effect = SideEffect::CommandRun {
            command: "curl -H 'x: sk-effect-test-e4e4' url".into(),
            exit_code: Some(0),
            timed_out: false,
        };
        redact_side_effect(&mut effect);
        assert!(
            matches!(&effect, SideEffect::CommandRun { command, .. } if command == "curl -H 'x: [REDACTED:TEST_REGISTRY_EFFECT]' url"),
            "{effect:?}"
        );
    }

    /// A tool whose schema wants a string `pattern`.
    fn pattern() -> impl Tool {
        FnTool::new(
            "pattern",
            json!({"type": "object", "additionalProperties": false,
                   "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}),
            |_: Value| async { Ok(ToolOutput::text("ok")) },
        )
    }

    /// A box of the two test tools, made once (sets keep a `&'static` to their box).
    fn test_box() -> &'static ToolBox {
        static BOX: OnceLock<ToolBox> = OnceLock::new();
        BOX.get_or_init(|| ToolBox::new(vec![Arc::new(echo()), Arc::new(pattern())]))
    }

    #[test]
    fn sets_by_name_refuse_unknown_and_duplicate_names() {
        let err = test_box().set(&["echo", "patern"]).unwrap_err().to_string();
        assert!(err.contains("did you mean 'pattern'"), "{err}");
        let err = test_box().set(&["pattern", "pattern"]).unwrap_err();
        assert_eq!(err.to_string(), "tool 'pattern' is listed twice");
        let set = test_box().set(&["pattern", "echo"]).unwrap();
        assert_eq!(set.names(), &["pattern".to_string(), "echo".to_string()]);
        assert_eq!(
            test_box().all().unwrap().names(),
            &["echo".to_string(), "pattern".to_string()]
        );
    }

    #[test]
    fn sets_by_name_share_compiled_tools() {
        let a = test_box().set(&["echo", "pattern"]).unwrap();
        let b = test_box().set(&["pattern"]).unwrap();
        assert!(Arc::ptr_eq(&a.entries["pattern"], &b.entries["pattern"]));
        assert_eq!(b.names(), &["pattern".to_string()]);
        assert!(b.get("echo").is_none());
        let err = b.validate("pattern", &json!({"pattern": 3})).unwrap_err();
        assert!(err.to_string().contains("/pattern"), "{err}");
    }

    #[test]
    fn definitions_are_shared_by_sets_of_the_same_box_and_follow_set_order() {
        let a = test_box().set(&["pattern", "echo"]).unwrap();
        let b = test_box().set(&["pattern", "echo"]).unwrap();
        assert!(Arc::ptr_eq(
            &a.shared_definitions(),
            &b.shared_definitions()
        ));
        let names: Vec<String> = a.definitions().into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["pattern", "echo"]);
        let c = test_box().set(&["echo", "pattern"]).unwrap();
        assert_eq!(c.shared_definitions()[0].name, "echo");
        let only_pattern = a.shared_subset(|n| n == "pattern");
        assert!(Arc::ptr_eq(
            &only_pattern,
            &test_box().set(&["pattern"]).unwrap().shared_definitions()
        ));
        let custom_none = ToolSet::from_tools(vec![Arc::new(echo())])
            .unwrap()
            .shared_subset(|_| false);
        assert!(custom_none.is_empty());
        let custom = ToolSet::from_tools(vec![Arc::new(echo())]).unwrap();
        assert_eq!(
            custom.shared_definitions()[0].input_schema,
            echo().input_schema()
        );
    }
}
