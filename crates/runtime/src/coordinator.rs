//! The coordinator actor: the registry of live loops and the router of `query_loop`,
//! `share_data`, alerts and listings between them.
//!
//! It never awaits a loop inside its own handler: it checks and records a query, and hands
//! the asker a [`RoutedQuery`] holding the target loop's [`Answerer`] (which the loop handed
//! over when it registered); the asker's task runs the answer, under the asker's timeout.
//! So a query costs one coordinator message and no task of its own. The coordinator
//! monitors every registered loop actor: a loop that stops or panics is unregistered at
//! once and the answers still in progress for it are cancelled, so every query waiting on
//! it fails immediately. Unknown, stopped and self targets are refused at once with the
//! list of live loops. Rate and size limits answer the
//! sender with an error; nothing is dropped silently. Every message is recorded as an event.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::FutureExt as _;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::messages::LoopMsg;
use td_base::sync::lock;
use td_engine::{AnswerError, Answerer, Inbox};
use td_protocol::events::{EventKind, EventLog};
use td_protocol::inbox::InboxItem;
use td_protocol::spend::Spend;
use td_toolkit::coordination::{Coordination, Delivery, LoopInfo};
use td_toolkit::error::ToolError;

/// The sender name of system alerts.
pub const SYSTEM_SENDER: &str = "taskdaemon";

/// Limits the coordinator enforces per sender.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct CoordinatorLimits {
    /// Messages (queries, shares, alerts) a loop may send in a burst.
    pub burst: u32,
    /// Messages per second a loop regains after a burst.
    pub per_second: f64,
    /// Largest `share_data` / alert payload, in bytes of JSON.
    pub max_payload_bytes: usize,
}

impl Default for CoordinatorLimits {
    fn default() -> Self {
        Self {
            burst: 30,
            per_second: 10.0,
            max_payload_bytes: 256 * 1024,
        }
    }
}

/// Messages the coordinator handles.
pub enum CoordMsg {
    /// A loop joins the run.
    Register {
        /// Its exec id.
        name: String,
        /// Its loop type.
        loop_type: String,
        /// Its task (first line is shown in listings).
        task: String,
        /// Alert event types it listens to; `None` = every loop's alert, no system alert
        /// (see [`hears`]).
        subscriptions: Option<Vec<String>>,
        /// Its actor.
        actor: ActorRef<LoopMsg>,
        /// Its inbox: shares and alerts go straight in, so "delivered" means it is there.
        inbox: Arc<Inbox>,
        /// Answers the questions other loops ask it.
        answerer: Arc<Answerer>,
        /// Answered once registered (so the loop may start sending right after).
        reply: RpcReplyPort<()>,
    },
    /// A loop's status changed (running, completed, failed...).
    SetStatus {
        /// Loop name.
        name: String,
        /// New status.
        status: String,
    },
    /// Ask `target` a question.
    Query {
        /// Asking loop.
        from: String,
        /// Target loop.
        target: String,
        /// The question.
        question: String,
        /// How long the asker waits.
        timeout: Duration,
        /// The accepted query, for the asker to run, or why it was refused.
        reply: RpcReplyPort<Result<RoutedQuery, ToolError>>,
    },
    /// Put data into targets' inboxes.
    Share {
        /// Sender.
        from: String,
        /// Targets.
        targets: Vec<String>,
        /// Kind of data.
        data_type: String,
        /// The data.
        data: Value,
        /// Per-target delivery, or an error for the whole share.
        reply: RpcReplyPort<Result<Vec<Delivery>, ToolError>>,
    },
    /// Broadcast an alert to the other running loops that listen to its event type.
    Alert {
        /// Sender (`taskdaemon` for system alerts, which are not rate-limited).
        from: String,
        /// Event type.
        event_type: String,
        /// Message.
        message: String,
        /// Optional data.
        data: Option<Value>,
        /// The loop a system alert is about; it does not receive its own news.
        about: Option<String>,
        /// How many loops it reached, when the sender waits for it.
        reply: Option<RpcReplyPort<Result<usize, ToolError>>>,
    },
    /// Put a system alert into one named loop's inbox, whatever its subscriptions: news
    /// about that loop's own work (a predicted merge conflict), not a broadcast.
    Notify {
        /// The loop it is for.
        to: String,
        /// Event type.
        event_type: String,
        /// Message.
        message: String,
        /// Whether it reached the loop (false when the loop is not running).
        reply: Option<RpcReplyPort<bool>>,
    },
    /// The loops of the run other than `from`.
    List {
        /// Asking loop.
        from: String,
        /// The listing.
        reply: RpcReplyPort<Vec<LoopInfo>>,
    },
}

// Local only: never sent to another node (ractor's `cluster` feature needs the impl said).
impl ractor::Message for CoordMsg {}

struct Entry {
    actor: ActorRef<LoopMsg>,
    inbox: Arc<Inbox>,
    answerer: Arc<Answerer>,
    /// One per answer in progress for another loop: dropped when the loop leaves the run,
    /// which cancels them. Closed ones (answer done) are pruned as new queries arrive.
    answering: Vec<oneshot::Sender<()>>,
    loop_type: String,
    task: String,
    status: String,
    subscriptions: Option<BTreeSet<String>>,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The coordinator's state.
pub struct CoordState {
    loops: BTreeMap<String, Entry>,
    /// Loops whose actor is gone, with their last status.
    gone: BTreeMap<String, String>,
    next_query: u64,
    buckets: HashMap<String, Bucket>,
    limits: CoordinatorLimits,
    events: Arc<EventLog>,
}

/// The coordinator actor.
pub struct Coordinator;

/// Arguments of the coordinator.
pub struct CoordinatorArgs {
    /// Limits per sender.
    pub limits: CoordinatorLimits,
    /// Where events go.
    pub events: Arc<EventLog>,
}

impl CoordState {
    fn live_names(&self, except: &str) -> String {
        let names: Vec<&str> = self
            .loops
            .keys()
            .map(String::as_str)
            .filter(|n| *n != except)
            .collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }

    /// Why `target` cannot be reached by `from`, if it cannot.
    fn unreachable(&self, from: &str, target: &str) -> Option<String> {
        if target == from {
            return Some(format!(
                "a loop cannot message itself; other live loops: {}",
                self.live_names(from)
            ));
        }
        if self.loops.contains_key(target) {
            return None;
        }
        Some(match self.gone.get(target) {
            Some(status) => format!(
                "loop '{target}' has stopped ({status}); live loops: {}",
                self.live_names(from)
            ),
            None => format!(
                "unknown loop '{target}'; live loops: {}",
                self.live_names(from)
            ),
        })
    }

    /// Takes one message token from `from`, or says why not.
    fn take_token(&mut self, from: &str) -> Result<(), ToolError> {
        if from == SYSTEM_SENDER {
            return Ok(());
        }
        let limits = self.limits;
        let now = Instant::now();
        let fresh = || Bucket {
            tokens: f64::from(limits.burst),
            last: now,
        };
        // Looked up before it is added: a sender's name is copied once, not per message.
        let bucket = match self.buckets.get_mut(from) {
            Some(bucket) => bucket,
            None => self.buckets.entry(from.to_string()).or_insert_with(fresh),
        };
        let refill = now.duration_since(bucket.last).as_secs_f64() * limits.per_second;
        bucket.tokens = (bucket.tokens + refill).min(f64::from(limits.burst));
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(ToolError::LimitExceeded {
                what: format!(
                    "message rate of loop '{from}' (at most {} in a burst, then {}/s); this message was NOT sent",
                    limits.burst, limits.per_second
                ),
                hint: "Wait a little and send it again, or combine several messages into one."
                    .to_string(),
            })
        }
    }

    fn check_payload(&self, data: &Value) -> Result<(), ToolError> {
        let size = serde_json::to_string(data)
            .map(|s| s.len())
            .unwrap_or(usize::MAX);
        if size > self.limits.max_payload_bytes {
            return Err(ToolError::LimitExceeded {
                what: format!(
                    "payload of {size} bytes is over the limit of {} bytes; it was NOT sent",
                    self.limits.max_payload_bytes
                ),
                hint: "Write the data to a file in your worktree and share its path and a summary instead."
                    .to_string(),
            });
        }
        Ok(())
    }

    fn unregister(&mut self, name: &str, crashed: bool) {
        if let Some(entry) = self.loops.remove(name) {
            // Dropping the cancel handles ends every answer in progress for this loop: each
            // asker learns at once that it stopped.
            drop(entry.answering);
            let status = match entry.status.as_str() {
                _ if crashed => "crashed".to_string(),
                "running" => "stopped".to_string(),
                other => other.to_string(),
            };
            self.gone.insert(name.to_string(), status);
            self.events.record(EventKind::LoopUnregistered {
                loop_name: name.to_string(),
            });
        }
    }
}

impl Actor for Coordinator {
    type Msg = CoordMsg;
    type State = CoordState;
    type Arguments = CoordinatorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<CoordMsg>,
        args: CoordinatorArgs,
    ) -> Result<CoordState, ActorProcessingErr> {
        Ok(CoordState {
            loops: BTreeMap::new(),
            gone: BTreeMap::new(),
            next_query: 1,
            buckets: HashMap::new(),
            limits: args.limits,
            events: args.events,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<CoordMsg>,
        message: CoordMsg,
        state: &mut CoordState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            CoordMsg::Register {
                name,
                loop_type,
                task,
                subscriptions,
                actor,
                inbox,
                answerer,
                reply,
            } => {
                myself.get_cell().monitor(actor.get_cell());
                state.gone.remove(&name);
                state.loops.insert(
                    name,
                    Entry {
                        actor,
                        inbox,
                        answerer,
                        answering: Vec::new(),
                        loop_type,
                        task,
                        status: "running".to_string(),
                        subscriptions: subscriptions.map(|s| s.into_iter().collect()),
                    },
                );
                let _ = reply.send(());
            }
            CoordMsg::SetStatus { name, status } => {
                if let Some(e) = state.loops.get_mut(&name) {
                    e.status = status;
                }
            }
            CoordMsg::Query {
                from,
                target,
                question,
                timeout,
                reply,
            } => handle_query(state, from, target, question, timeout, reply),
            CoordMsg::Share {
                from,
                targets,
                data_type,
                data,
                reply,
            } => {
                let _ = reply.send(handle_share(state, &from, &targets, &data_type, data));
            }
            CoordMsg::Alert {
                from,
                event_type,
                message,
                data,
                about,
                reply,
            } => {
                let result =
                    handle_alert(state, &from, &event_type, &message, data, about.as_deref());
                if let Some(reply) = reply {
                    let _ = reply.send(result);
                }
            }
            CoordMsg::Notify {
                to,
                event_type,
                message,
                reply,
            } => {
                let delivered = handle_notify(state, &to, &event_type, &message);
                if let Some(reply) = reply {
                    let _ = reply.send(delivered);
                }
            }
            CoordMsg::List { from, reply } => {
                let list = state
                    .loops
                    .iter()
                    .filter(|(n, _)| **n != from)
                    .map(|(n, e)| LoopInfo {
                        name: n.clone(),
                        loop_type: e.loop_type.clone(),
                        status: e.status.clone(),
                        task: e.task.lines().next().unwrap_or("").to_string(),
                    })
                    .collect();
                let _ = reply.send(list);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<CoordMsg>,
        event: SupervisionEvent,
        state: &mut CoordState,
    ) -> Result<(), ActorProcessingErr> {
        // We only monitor loop actors: when one ends, for whatever reason, it leaves the run.
        let (cell, crashed) = match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => (cell, false),
            SupervisionEvent::ActorFailed(cell, _) => (cell, true),
            _ => return Ok(()),
        };
        let id = cell.get_id();
        let name = state
            .loops
            .iter()
            .find(|(_, e)| e.actor.get_id() == id)
            .map(|(n, _)| n.clone());
        if let Some(name) = name {
            state.unregister(&name, crashed);
        }
        Ok(())
    }
}

/// Refuses or accepts one query. An accepted query goes back to the asker as a
/// [`RoutedQuery`]; the coordinator keeps only its cancel handle and waits for nothing.
fn handle_query(
    state: &mut CoordState,
    from: String,
    target: String,
    question: String,
    timeout: Duration,
    reply: RpcReplyPort<Result<RoutedQuery, ToolError>>,
) {
    let id = state.next_query;
    state.next_query += 1;
    let refused = state.take_token(&from).err().or_else(|| {
        state
            .unreachable(&from, &target)
            .map(|message| ToolError::Unavailable {
                message: format!("query not sent: {message}"),
            })
    });
    if let Some(err) = refused {
        state.events.record(EventKind::QueryFailed {
            id,
            from,
            to: target,
            error: err.to_string(),
            spend: None,
        });
        let _ = reply.send(Err(err));
        return;
    }
    let Some(entry) = state.loops.get_mut(&target) else {
        return;
    };
    state.events.record(EventKind::QueryAsked {
        id,
        from: from.clone(),
        to: target.clone(),
        question: question.clone(),
    });
    let (cancel_tx, cancelled) = oneshot::channel();
    entry.answering.retain(|c| !c.is_closed());
    entry.answering.push(cancel_tx);
    let routed = RoutedQuery {
        answerer: entry.answerer.clone(),
        question,
        deadline: tokio::time::Instant::now() + timeout,
        cancelled,
        record: QueryRecord {
            id,
            from,
            target,
            timeout,
            events: state.events.clone(),
            done: false,
        },
    };
    // An asker that is gone drops the query unrun; its record says so.
    let _ = reply.send(Ok(routed));
}

/// An accepted query: the target loop's [`Answerer`] and what the answer is held to (the
/// asker's deadline, the target staying in the run).
///
/// The asker runs it in its own task ([`RoutedQuery::run`]): it waits for the answer anyway,
/// and running the answer there spares a task and two task switches per query. The answer
/// is still the target's (its task, progress, worktree and transcript); it ends at the
/// asker's deadline, or at once when the target leaves the run (the coordinator drops the
/// cancel handle). Its outcome is recorded as an event exactly once.
pub struct RoutedQuery {
    answerer: Arc<Answerer>,
    question: String,
    deadline: tokio::time::Instant,
    cancelled: oneshot::Receiver<()>,
    record: QueryRecord,
}

impl RoutedQuery {
    /// Runs the answer and returns it, or why there is none.
    pub async fn run(self) -> Result<String, ToolError> {
        let RoutedQuery {
            answerer,
            question,
            deadline,
            cancelled,
            mut record,
        } = self;
        // Outside the answer's future, which a timeout or the target's end drops.
        let spent = Mutex::new(Spend::default());
        let outcome = {
            // Boxed on its own: `Coordination::query` boxes its future on every query, and
            // with the answer inside it that box grew past the allocator's small sizes, whose
            // allocation then merged freed memory first (glibc's malloc_consolidate: about a
            // tenth of a `query_loop` call, bench query).
            let mut answering = Box::pin(answerer.answer_counting(&record.from, &question, &spent));
            // An answer that needs no waiting (a local or scripted model) is taken without
            // arming a timer: on the multi-threaded runtime arming one wakes the thread parked
            // on the timer driver, which cost more than the rest of the query (query bench).
            // Polling once first changes nothing else: `timeout_at` polls the answer first too.
            match answering.as_mut().now_or_never() {
                Some(r) => answered(&record.target, r),
                // Boxed: the timer and the select are only needed here, and inline they made
                // every query's future (moved a few times per query) larger.
                None => {
                    Box::pin(wait_for_answer(
                        answering,
                        deadline,
                        cancelled,
                        &record.target,
                        record.timeout,
                    ))
                    .await
                }
            }
        };
        let spent = *lock(&spent);
        record.record(&outcome, (!spent.is_empty()).then_some(spent));
        outcome.map_err(|message| ToolError::Unavailable { message })
    }
}

/// An answer of loop `target`, or why there is none, as the asker is told.
fn answered(target: &str, answer: Result<String, AnswerError>) -> Result<String, String> {
    answer.map_err(|why| format!("loop '{target}' could not answer: {why}"))
}

/// Waits for an answer that was not ready at once: until the asker's `deadline` (`timeout`
/// after it asked), or until `target` leaves the run (`cancelled`).
async fn wait_for_answer<F>(
    answering: Pin<Box<F>>,
    deadline: tokio::time::Instant,
    cancelled: oneshot::Receiver<()>,
    target: &str,
    timeout: Duration,
) -> Result<String, String>
where
    F: Future<Output = Result<String, AnswerError>>,
{
    tokio::select! {
        r = tokio::time::timeout_at(deadline, answering) => match r {
            Ok(r) => answered(target, r),
            Err(_) => Err(format!(
                "no reply from loop '{target}' within {} ms; ask again later with a larger timeout_ms, or continue without the answer",
                timeout.as_millis()
            )),
        },
        _ = cancelled => Err(stopped_before_answering(target)),
    }
}

/// Records the outcome of one accepted query as an event, once; a query dropped before its
/// outcome (the asker stopped waiting: its iteration or loop ended) is recorded as such.
struct QueryRecord {
    id: u64,
    from: String,
    target: String,
    timeout: Duration,
    events: Arc<EventLog>,
    done: bool,
}

impl QueryRecord {
    fn record(&mut self, outcome: &Result<String, String>, spend: Option<Spend>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        // Recorded once: the names are handed to the event, not copied.
        let (id, from, to) = (
            self.id,
            std::mem::take(&mut self.from),
            std::mem::take(&mut self.target),
        );
        self.events.record(match outcome {
            Ok(answer) => EventKind::QueryAnswered {
                id,
                from,
                to,
                reply: answer.clone(),
                spend,
            },
            Err(error) => EventKind::QueryFailed {
                id,
                from,
                to,
                error: error.clone(),
                spend,
            },
        });
    }
}

impl Drop for QueryRecord {
    fn drop(&mut self) {
        if !self.done {
            let message = format!(
                "loop '{}' stopped waiting before the answer came (its iteration or the loop ended)",
                self.from
            );
            // What the answer spent is in the answering loop's transcript.
            self.record(&Err(message), None);
        }
    }
}

/// The one message for a query whose target went away.
fn stopped_before_answering(target: &str) -> String {
    format!("loop '{target}' stopped before answering your query; continue without the answer")
}

fn handle_share(
    state: &mut CoordState,
    from: &str,
    targets: &[String],
    data_type: &str,
    data: Value,
) -> Result<Vec<Delivery>, ToolError> {
    let refused = state
        .take_token(from)
        .and_then(|()| state.check_payload(&data));
    if let Err(err) = refused {
        for to in targets {
            state.events.record(EventKind::Shared {
                from: from.to_string(),
                to: to.clone(),
                data_type: data_type.to_string(),
                data: Value::Null,
                error: Some(err.to_string()),
            });
        }
        return Err(err);
    }
    let mut deliveries = Vec::with_capacity(targets.len());
    for to in targets {
        let error = match state.unreachable(from, to) {
            Some(why) => Some(why),
            None => match state.loops.get(to) {
                Some(e) if e.status != "running" => Some(format!(
                    "loop '{to}' has {} and no longer reads its inbox",
                    e.status
                )),
                Some(e) => {
                    e.inbox.push(Arc::new(InboxItem::Share {
                        from: from.to_string(),
                        data_type: data_type.to_string(),
                        data: data.clone(),
                    }));
                    None
                }
                None => Some(format!("unknown loop '{to}'")),
            },
        };
        state.events.record(EventKind::Shared {
            from: from.to_string(),
            to: to.clone(),
            data_type: data_type.to_string(),
            data: data.clone(),
            error: error.clone(),
        });
        deliveries.push(Delivery {
            target: to.clone(),
            error,
        });
    }
    Ok(deliveries)
}

fn handle_alert(
    state: &mut CoordState,
    from: &str,
    event_type: &str,
    message: &str,
    data: Option<Value>,
    about: Option<&str>,
) -> Result<usize, ToolError> {
    let refused = state.take_token(from).and_then(|()| match &data {
        Some(d) => state.check_payload(d),
        None => Ok(()),
    });
    if let Err(err) = refused {
        state.events.record(EventKind::Alert {
            from: from.to_string(),
            event_type: event_type.to_string(),
            message: message.to_string(),
            data,
            recipients: Vec::new(),
            error: Some(err.to_string()),
        });
        return Err(err);
    }
    let mut recipients = Vec::new();
    let item = Arc::new(InboxItem::Alert {
        from: from.to_string(),
        event_type: event_type.to_string(),
        message: message.to_string(),
        data: data.clone(),
        about: about.filter(|_| from == SYSTEM_SENDER).map(str::to_string),
    });
    for (name, entry) in &state.loops {
        let listens = hears(entry.subscriptions.as_ref(), from, event_type);
        if name == from || Some(name.as_str()) == about || entry.status != "running" || !listens {
            continue;
        }
        entry.inbox.push(item.clone());
        recipients.push(name.clone());
    }
    state.events.record(EventKind::Alert {
        from: from.to_string(),
        event_type: event_type.to_string(),
        message: message.to_string(),
        data,
        recipients: recipients.clone(),
        error: None,
    });
    Ok(recipients.len())
}

/// Puts a system alert into the inbox of `to` when it is running; records it as an `alert`
/// event either way (so a resumed run shows it again if its model had not seen it).
fn handle_notify(state: &mut CoordState, to: &str, event_type: &str, message: &str) -> bool {
    let error = match state.loops.get(to) {
        Some(entry) if entry.status == "running" => {
            entry.inbox.push(Arc::new(InboxItem::Alert {
                from: SYSTEM_SENDER.to_string(),
                event_type: event_type.to_string(),
                message: message.to_string(),
                data: None,
                about: None,
            }));
            None
        }
        Some(entry) => Some(format!(
            "loop '{to}' has {} and no longer reads its inbox",
            entry.status
        )),
        None => Some(
            state
                .unreachable(SYSTEM_SENDER, to)
                .unwrap_or_else(|| format!("unknown loop '{to}'")),
        ),
    };
    state.events.record(EventKind::Alert {
        from: SYSTEM_SENDER.to_string(),
        event_type: event_type.to_string(),
        message: message.to_string(),
        data: None,
        recipients: if error.is_none() {
            vec![to.to_string()]
        } else {
            Vec::new()
        },
        error: error.clone(),
    });
    error.is_none()
}

/// Sends system alerts addressed to one loop each (see [`CoordMsg::Notify`]).
#[derive(Clone)]
pub struct Notifier {
    coordinator: ActorRef<CoordMsg>,
}

impl Notifier {
    /// A notifier talking to `coordinator`.
    pub fn new(coordinator: ActorRef<CoordMsg>) -> Self {
        Self { coordinator }
    }

    /// Sends loop `to` a system alert of `event_type`, whatever its subscriptions; true
    /// once it is in the loop's inbox.
    pub async fn notify(&self, to: &str, event_type: &str, message: &str) -> bool {
        ask(&self.coordinator, |reply| CoordMsg::Notify {
            to: to.to_string(),
            event_type: event_type.to_string(),
            message: message.to_string(),
            reply: Some(reply),
        })
        .await
        .unwrap_or(false)
    }
}

/// Whether a loop with `subscriptions` hears an alert of `event_type` sent by `from`.
///
/// A loop that lists its subscriptions hears exactly those event types, system ones
/// included. A loop that lists none hears every other loop's `broadcast_alert`, but no
/// system alert (`loop_started`, `loop_completed`, `loop_failed`, `loop_paused`): in a run
/// of N loops those are about 2N lines of news no task asked for, which opened prompts
/// with peers' start notices and cost every loop tokens and attention. A loop that must
/// know when a peer finishes subscribes to `loop_completed`.
fn hears(subscriptions: Option<&BTreeSet<String>>, from: &str, event_type: &str) -> bool {
    match subscriptions {
        Some(s) => s.contains(event_type),
        None => from != SYSTEM_SENDER,
    }
}

/// The `Coordination` port of one loop's tools, backed by the coordinator actor.
pub struct CoordinatorPort {
    coordinator: ActorRef<CoordMsg>,
}

impl CoordinatorPort {
    /// A port talking to `coordinator`.
    pub fn new(coordinator: ActorRef<CoordMsg>) -> Self {
        Self { coordinator }
    }
}

fn coordinator_gone() -> ToolError {
    ToolError::Unavailable {
        message: "the coordinator is not running (the run is shutting down); continue without coordination"
            .to_string(),
    }
}

async fn ask<T: Send + 'static>(
    coordinator: &ActorRef<CoordMsg>,
    build: impl FnOnce(RpcReplyPort<T>) -> CoordMsg,
) -> Result<T, ToolError> {
    match coordinator.call(build, None).await {
        Ok(CallResult::Success(v)) => Ok(v),
        _ => Err(coordinator_gone()),
    }
}

#[async_trait]
impl Coordination for CoordinatorPort {
    async fn query(
        &self,
        from: &str,
        target: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<String, ToolError> {
        ask(&self.coordinator, |reply| CoordMsg::Query {
            from: from.to_string(),
            target: target.to_string(),
            question: question.to_string(),
            timeout,
            reply,
        })
        .await??
        .run()
        .await
    }

    async fn share(
        &self,
        from: &str,
        targets: &[String],
        data_type: &str,
        data: Value,
    ) -> Result<Vec<Delivery>, ToolError> {
        ask(&self.coordinator, |reply| CoordMsg::Share {
            from: from.to_string(),
            targets: targets.to_vec(),
            data_type: data_type.to_string(),
            data,
            reply,
        })
        .await?
    }

    async fn alert(
        &self,
        from: &str,
        event_type: &str,
        message: &str,
        data: Option<Value>,
    ) -> Result<usize, ToolError> {
        ask(&self.coordinator, |reply| CoordMsg::Alert {
            from: from.to_string(),
            event_type: event_type.to_string(),
            message: message.to_string(),
            data,
            about: None,
            reply: Some(reply),
        })
        .await?
    }

    async fn list_loops(&self, from: &str) -> Result<Vec<LoopInfo>, ToolError> {
        ask(&self.coordinator, |reply| CoordMsg::List {
            from: from.to_string(),
            reply,
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(events: &Arc<EventLog>) -> QueryRecord {
        QueryRecord {
            id: 7,
            from: "a".to_string(),
            target: "b".to_string(),
            timeout: Duration::from_secs(1),
            events: events.clone(),
            done: false,
        }
    }

    #[test]
    fn without_subscriptions_a_loop_hears_peers_broadcasts_but_no_system_alert() {
        assert!(hears(None, "api", "api_ready"));
        assert!(!hears(None, SYSTEM_SENDER, "loop_started"));
        assert!(!hears(None, SYSTEM_SENDER, "loop_completed"));
        let listed: BTreeSet<String> = ["loop_completed".to_string()].into();
        assert!(hears(Some(&listed), SYSTEM_SENDER, "loop_completed"));
        assert!(!hears(Some(&listed), SYSTEM_SENDER, "loop_started"));
        assert!(!hears(Some(&listed), "api", "api_ready"));
    }

    #[test]
    fn a_query_outcome_is_recorded_once() {
        let events = Arc::new(EventLog::in_memory());
        let mut r = record(&events);
        r.record(&Ok("8080".to_string()), None);
        r.record(&Err("late".to_string()), None);
        drop(r);
        let kinds: Vec<EventKind> = events.events().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds.len(), 1, "{kinds:?}");
        assert!(
            matches!(&kinds[0], EventKind::QueryAnswered { id: 7, reply, .. } if reply == "8080"),
            "{kinds:?}"
        );
    }

    #[test]
    fn a_query_dropped_before_its_outcome_is_recorded_as_abandoned_by_the_asker() {
        let events = Arc::new(EventLog::in_memory());
        drop(record(&events));
        let kinds: Vec<EventKind> = events.events().into_iter().map(|e| e.kind).collect();
        assert!(
            matches!(&kinds[..], [EventKind::QueryFailed { id: 7, from, to, error, .. }]
                if from == "a" && to == "b" && error.contains("stopped waiting")),
            "{kinds:?}"
        );
    }
}
