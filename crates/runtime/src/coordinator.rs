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
//!
//! Every share and alert it puts in a loop's inbox gets that loop's next delivery number
//! (`td_protocol::inbox::Delivered`), recorded with it; the loop's `inbox_shown` events
//! name the numbers shown, which is how a resumed or moved loop knows exactly what it has
//! not seen. Numbers are kept per loop for the whole run (a loop moved to another host goes
//! on with them; a resumed run starts each loop after its record's, [`CoordMsg::NumberAfter`]).
//! A host's coordinator gives none: the head's come with what it delivers there.
//!
//! Loops of other processes (worker hosts) take part as remote entries: the head's
//! coordinator holds a [`RemoteLoop`] link for each instead of an actor, inbox and answerer,
//! and routes, limits and records their messages exactly as a local loop's. A query to a
//! remote loop awaits the link's answer in the asker's task, under the same deadline and
//! cancellation; shares and alerts for it go through its delivery queue
//! ([`crate::remote_loop`]), and are reported delivered only when the link says so.
//! [`CoordMsg::DropRemote`] takes a remote loop out of the run (its host was lost): what waits
//! on it fails at once, saying why.
//!
//! A host's runtime is started with an [`Upstream`] (the head): its coordinator keeps its
//! loops' inboxes and answerers and routes nothing itself. Its loops' queries, shares,
//! alerts and listings go to the head, and what the head sends them arrives through
//! [`CoordMsg::DeliverLocal`] and [`CoordMsg::AnswerLocal`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::messages::LoopMsg;
use crate::remote_loop::{
    Alerted, Deliveries, Notified, PendingAlert, PendingShare, RemoteLoop, RemoteTarget, Settling,
    Shared,
};
use crate::routed_query::QueryRecord;
pub use crate::routed_query::RoutedQuery;
use crate::upstream::{Forwarder, Told, Upstream, bounded};
use td_engine::{Answerer, Inbox};
use td_protocol::events::{EventKind, EventLog};
use td_protocol::inbox::InboxItem;
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
        /// Answered once registered (so the loop may start sending right after); on a
        /// host, once the head knows the loop, or with why it refused it.
        reply: RpcReplyPort<Result<(), String>>,
    },
    /// A loop that lives in another process joins the run (head side): routed through
    /// `link`. Refused when a local loop of that name is in the run; a remote one of that
    /// name is replaced (its host registered it again after a restart).
    RegisterRemote {
        /// Its exec id.
        name: String,
        /// Its loop type.
        loop_type: String,
        /// Its task.
        task: String,
        /// Alert event types it listens to (as for [`CoordMsg::Register`]).
        subscriptions: Option<Vec<String>>,
        /// How to reach it.
        link: Arc<dyn RemoteLoop>,
        /// Answered once registered, or with why not.
        reply: RpcReplyPort<Result<(), String>>,
    },
    /// A remote loop's status changed (ignored for a loop that is not remote).
    SetRemoteStatus {
        /// Loop name.
        name: String,
        /// New status.
        status: String,
    },
    /// A remote loop leaves the run: queries and deliveries waiting on it fail at once.
    /// With a `reason` (its host was lost), they say it, and a running loop is recorded as
    /// interrupted; without one, it ended as a local loop's actor does.
    DropRemote {
        /// Loop name.
        name: String,
        /// Why it left, as the askers waiting on it are told.
        reason: Option<String>,
        /// Whether there was such a remote loop.
        reply: Option<RpcReplyPort<bool>>,
    },
    /// Internal (host side): the head refused the registration of loop `name`, whose actor
    /// `actor` will not start: its entry goes, if it is still that actor's.
    Forget {
        /// Loop name.
        name: String,
        /// Its actor.
        actor: ractor::ActorId,
    },
    /// Put an item into the inbox of local loop `name` (host side: a share or alert the
    /// head routed to it). Not recorded here: the head records it.
    DeliverLocal {
        /// Loop name.
        name: String,
        /// Its delivery number, as the head gave it.
        delivery: Option<u64>,
        /// The item.
        item: Arc<InboxItem>,
        /// True once it is in the inbox; false when no such loop is running here.
        reply: RpcReplyPort<bool>,
    },
    /// Ask local loop `name` a question for `from` (host side: a query the head routed to
    /// it). The answer runs as a local query's does, in the caller's task; it is not
    /// recorded here (the head records it).
    AnswerLocal {
        /// Loop name.
        name: String,
        /// The asking loop.
        from: String,
        /// The question.
        question: String,
        /// How long the asker waits.
        timeout: Duration,
        /// The answer to run, or why there is none.
        reply: RpcReplyPort<Result<RoutedQuery, ToolError>>,
    },
    /// Answered once every message sent before it was handled (on a host, also once the
    /// head was told everything queued for it before).
    Flush(RpcReplyPort<()>),
    /// Loop `name`'s next delivery numbers come after `after` (a resumed loop: the numbers
    /// its record holds are not given again). Numbers never go down.
    NumberAfter {
        /// Loop name.
        name: String,
        /// The last number of its record.
        after: u64,
    },
    /// Answered once no share or alert delivered to loop `name` (a remote loop, dropped
    /// from the run) waits to be recorded: its record may then be read back.
    Settled {
        /// Loop name.
        name: String,
        /// Answered then.
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
        from: Arc<str>,
        /// Target loop.
        target: Arc<str>,
        /// The question (shared: its event and its answer both keep it).
        question: Arc<str>,
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
        /// The listing (on a host: or why the head gave none).
        reply: RpcReplyPort<Result<Vec<LoopInfo>, ToolError>>,
    },
}

// Local only: never sent to another node (ractor's `cluster` feature needs the impl said).
impl ractor::Message for CoordMsg {}

/// Where a loop of the run lives.
enum Place {
    /// In this process.
    Local {
        actor: ActorRef<LoopMsg>,
        /// Its inbox: shares and alerts go straight in, so "delivered" means it is there.
        inbox: Arc<Inbox>,
        answerer: Arc<Answerer>,
    },
    /// In another process, reached through its link and delivery queue.
    Remote(Deliveries),
}

struct Entry {
    place: Place,
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
    /// On a host: the head, where all routing happens.
    upstream: Option<Forwarder>,
    /// The last delivery number given to each loop (kept when it leaves: a loop moved to
    /// another host goes on with the next).
    numbers: HashMap<String, u64>,
    /// Shares and alerts with remote deliveries not yet recorded, per loop.
    settling: Arc<Settling>,
}

/// The coordinator actor.
pub struct Coordinator;

/// Arguments of the coordinator.
pub struct CoordinatorArgs {
    /// Limits per sender.
    pub limits: CoordinatorLimits,
    /// Where events go.
    pub events: Arc<EventLog>,
    /// On a worker host: the head's coordinator, which routes everything the loops send.
    pub upstream: Option<Arc<dyn Upstream>>,
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
        self.take_token_at(from, Instant::now())
    }

    /// [`CoordState::take_token`] with the clock read already (`now`).
    fn take_token_at(&mut self, from: &str, now: Instant) -> Result<(), ToolError> {
        if from == SYSTEM_SENDER {
            return Ok(());
        }
        let limits = self.limits;
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

    /// A message's or question's own text against the payload limit: from a model or a
    /// worker host it could otherwise be megabytes, kept by every recipient's inbox and the
    /// event log.
    fn check_text(&self, what: &str, text: &str) -> Result<(), ToolError> {
        if text.len() > self.limits.max_payload_bytes {
            return Err(ToolError::LimitExceeded {
                what: format!(
                    "{what} of {} bytes is over the limit of {} bytes; it was NOT sent",
                    text.len(),
                    self.limits.max_payload_bytes
                ),
                hint: "Say it in fewer words: write the details to a file in your worktree and send its path."
                    .to_string(),
            });
        }
        Ok(())
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

    /// The next delivery number of loop `to`: given where the delivery is decided, the
    /// head (a host's coordinator routes nothing and gives none: the head's come with its
    /// deliveries).
    fn number(&mut self, to: &str) -> Option<u64> {
        if self.upstream.is_some() {
            return None;
        }
        let last = match self.numbers.get_mut(to) {
            Some(last) => last,
            None => self.numbers.entry(to.to_string()).or_insert(0),
        };
        *last = last.saturating_add(1);
        Some(*last)
    }

    fn unregister(&mut self, name: &str, leaving: Leaving) {
        if let Some(entry) = self.loops.remove(name) {
            // Dropping the cancel handles ends every answer in progress for this loop: each
            // asker learns at once that it stopped (a remote loop's delivery queue goes with
            // the entry, answering what it still holds as not delivered).
            drop(entry.answering);
            let status = match (entry.status.as_str(), leaving) {
                (_, Leaving::Crashed) => "crashed".to_string(),
                ("running", Leaving::Lost) => "interrupted".to_string(),
                ("running", Leaving::Ended) => "stopped".to_string(),
                (other, _) => other.to_string(),
            };
            self.gone.insert(name.to_string(), status);
            self.events.record(EventKind::LoopUnregistered {
                loop_name: name.to_string(),
            });
        }
    }

    /// Loop `name` leaves the run; on a host the head is told.
    fn leave(&mut self, name: &str, leaving: Leaving) {
        if !self.loops.contains_key(name) {
            return;
        }
        self.unregister(name, leaving);
        if let Some(up) = &self.upstream {
            if matches!(leaving, Leaving::Crashed) {
                up.tell(Told::SetStatus {
                    name: name.to_string(),
                    status: "crashed".to_string(),
                });
            }
            up.tell(Told::Unregister {
                name: name.to_string(),
            });
        }
    }

    /// Drops remote loop `name` (see [`CoordMsg::DropRemote`]); false when there is none.
    fn drop_remote(&mut self, name: &str, reason: Option<String>) -> bool {
        let Some(entry) = self.loops.get(name) else {
            return false;
        };
        let Place::Remote(deliveries) = &entry.place else {
            return false;
        };
        let leaving = match &reason {
            Some(reason) => {
                // Set before the entry goes: what waits on the loop reads it when woken.
                let _ = deliveries.target().left.set(reason.clone());
                Leaving::Lost
            }
            None => Leaving::Ended,
        };
        self.unregister(name, leaving);
        if let Some(reason) = reason {
            // What is asked of it later reads why too (it may be moving to another host).
            self.gone
                .insert(name.to_string(), format!("interrupted: {reason}"));
        }
        true
    }
}

/// How a loop leaves the run.
#[derive(Clone, Copy)]
enum Leaving {
    /// Its actor ended (or its host says it did).
    Ended,
    /// Its actor failed.
    Crashed,
    /// Its host was lost.
    Lost,
}

impl Actor for Coordinator {
    type Msg = CoordMsg;
    type State = CoordState;
    type Arguments = CoordinatorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<CoordMsg>,
        args: CoordinatorArgs,
    ) -> Result<CoordState, ActorProcessingErr> {
        Ok(CoordState {
            loops: BTreeMap::new(),
            gone: BTreeMap::new(),
            next_query: 1,
            buckets: HashMap::new(),
            limits: args.limits,
            events: args.events,
            upstream: args.upstream.map(|up| Forwarder::start(up, myself)),
            numbers: HashMap::new(),
            settling: Arc::new(Settling::default()),
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
                // On a host the head is told, and the loop answered once the head knows it.
                let reply = match &state.upstream {
                    Some(up) => {
                        up.tell(Told::Register {
                            name: name.clone(),
                            loop_type: loop_type.clone(),
                            task: task.clone(),
                            subscriptions: subscriptions.clone(),
                            actor: actor.get_id(),
                            reply,
                        });
                        None
                    }
                    None => Some(reply),
                };
                state.loops.insert(
                    name,
                    Entry {
                        place: Place::Local {
                            actor,
                            inbox,
                            answerer,
                        },
                        answering: Vec::new(),
                        loop_type,
                        task,
                        status: "running".to_string(),
                        subscriptions: subscriptions.map(|s| s.into_iter().collect()),
                    },
                );
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(()));
                }
            }
            CoordMsg::RegisterRemote {
                name,
                loop_type,
                task,
                subscriptions,
                link,
                reply,
            } => {
                let _ = reply.send(register_remote(
                    state,
                    name,
                    loop_type,
                    task,
                    subscriptions,
                    link,
                ));
            }
            CoordMsg::SetStatus { name, status } => {
                if let Some(e) = state.loops.get_mut(&name) {
                    if let Some(up) = &state.upstream {
                        up.tell(Told::SetStatus {
                            name,
                            status: status.clone(),
                        });
                    }
                    e.status = status;
                }
            }
            CoordMsg::SetRemoteStatus { name, status } => {
                if let Some(e) = state.loops.get_mut(&name)
                    && matches!(e.place, Place::Remote(_))
                {
                    e.status = status;
                }
            }
            CoordMsg::DropRemote {
                name,
                reason,
                reply,
            } => {
                let dropped = state.drop_remote(&name, reason);
                if let Some(reply) = reply {
                    let _ = reply.send(dropped);
                }
            }
            CoordMsg::Forget { name, actor } => {
                let same = state.loops.get(&name).is_some_and(
                    |e| matches!(&e.place, Place::Local { actor: a, .. } if a.get_id() == actor),
                );
                if same {
                    state.loops.remove(&name);
                }
            }
            CoordMsg::Query {
                from,
                target,
                question,
                timeout,
                reply,
            } => match &state.upstream {
                // A host routes nothing: the head checks, records and routes the query.
                Some(up) => {
                    let _ = reply.send(Ok(RoutedQuery::upstream(
                        up.upstream.clone(),
                        from,
                        target,
                        question,
                        timeout,
                    )));
                }
                None => handle_query(state, from, target, question, timeout, reply),
            },
            CoordMsg::AnswerLocal {
                name,
                from,
                question,
                timeout,
                reply,
            } => {
                let _ = reply.send(answer_local(state, name, from, question, timeout));
            }
            CoordMsg::DeliverLocal {
                name,
                delivery,
                item,
                reply,
            } => {
                let delivered = match state.loops.get(&name) {
                    Some(Entry {
                        place: Place::Local { inbox, .. },
                        status,
                        ..
                    }) if status == "running" => {
                        inbox.push(delivery, item);
                        true
                    }
                    _ => false,
                };
                let _ = reply.send(delivered);
            }
            CoordMsg::Share {
                from,
                targets,
                data_type,
                data,
                reply,
            } => {
                if let Some(up) = &state.upstream {
                    let up = up.upstream.clone();
                    tokio::spawn(async move {
                        let shared =
                            bounded("a share_data", up.share(&from, &targets, &data_type, data));
                        let _ = reply.send(shared.await);
                    });
                    return Ok(());
                }
                match handle_share(state, &from, &targets, &data_type, data) {
                    Ok(Shared::Done(deliveries)) => {
                        let _ = reply.send(Ok(deliveries));
                    }
                    Ok(Shared::Pending(pending)) => {
                        tokio::spawn(async move {
                            let _ = reply.send(Ok(pending.settle().await));
                        });
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            CoordMsg::Alert {
                from,
                event_type,
                message,
                data,
                about,
                reply,
            } => {
                if let Some(up) = &state.upstream {
                    match reply {
                        // A loop's alert: the loop waits for it, concurrently with others.
                        Some(reply) => {
                            let up = up.upstream.clone();
                            tokio::spawn(async move {
                                let sent = bounded(
                                    "a broadcast_alert",
                                    up.alert(&from, &event_type, &message, data, about.as_deref()),
                                );
                                let _ = reply.send(sent.await);
                            });
                        }
                        // A system alert about a loop's start or end: in order with the
                        // loop's registration and status.
                        None => up.tell(Told::SystemAlert {
                            event_type,
                            message,
                            about,
                        }),
                    }
                    return Ok(());
                }
                match handle_alert(state, &from, &event_type, &message, data, about.as_deref()) {
                    Ok(Alerted::Done(reached)) => {
                        if let Some(reply) = reply {
                            let _ = reply.send(Ok(reached));
                        }
                    }
                    Ok(Alerted::Pending(pending)) => {
                        tokio::spawn(async move {
                            let reached = pending.settle().await;
                            if let Some(reply) = reply {
                                let _ = reply.send(Ok(reached));
                            }
                        });
                    }
                    Err(e) => {
                        if let Some(reply) = reply {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
            }
            CoordMsg::Notify {
                to,
                event_type,
                message,
                reply,
            } => match handle_notify(state, &to, &event_type, &message) {
                Notified::Done(delivered) => {
                    if let Some(reply) = reply {
                        let _ = reply.send(delivered);
                    }
                }
                Notified::Pending(pending) => {
                    tokio::spawn(async move {
                        let delivered = pending.settle().await > 0;
                        if let Some(reply) = reply {
                            let _ = reply.send(delivered);
                        }
                    });
                }
            },
            CoordMsg::List { from, reply } => {
                if let Some(up) = &state.upstream {
                    let up = up.upstream.clone();
                    tokio::spawn(async move {
                        let listed = bounded("a list_loops", up.list_loops(&from));
                        let _ = reply.send(listed.await);
                    });
                    return Ok(());
                }
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
                let _ = reply.send(Ok(list));
            }
            CoordMsg::Flush(reply) => match &state.upstream {
                Some(up) => up.tell(Told::Flush(reply)),
                None => {
                    let _ = reply.send(());
                }
            },
            CoordMsg::NumberAfter { name, after } => {
                let last = state.numbers.entry(name).or_insert(0);
                *last = (*last).max(after);
            }
            CoordMsg::Settled { name, reply } => {
                let settling = state.settling.clone();
                tokio::spawn(async move {
                    settling.settled(&name).await;
                    let _ = reply.send(());
                });
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
            .find(|(_, e)| matches!(&e.place, Place::Local { actor, .. } if actor.get_id() == id))
            .map(|(n, _)| n.clone());
        if let Some(name) = name {
            let leaving = if crashed {
                Leaving::Crashed
            } else {
                Leaving::Ended
            };
            state.leave(&name, leaving);
        }
        Ok(())
    }
}

/// Adds remote loop `name` (see [`CoordMsg::RegisterRemote`]).
fn register_remote(
    state: &mut CoordState,
    name: String,
    loop_type: String,
    task: String,
    subscriptions: Option<Vec<String>>,
    link: Arc<dyn RemoteLoop>,
) -> Result<(), String> {
    if state.upstream.is_some() {
        return Err(format!(
            "loop '{name}' cannot be registered here: this runtime is a host's, which routes nothing itself"
        ));
    }
    if let Some(Entry {
        place: Place::Local { .. },
        ..
    }) = state.loops.get(&name)
    {
        return Err(format!(
            "a loop named '{name}' is already running on the head"
        ));
    }
    state.gone.remove(&name);
    let target = Arc::new(RemoteTarget {
        name: name.clone(),
        link,
        left: OnceLock::new(),
    });
    state.loops.insert(
        name,
        Entry {
            place: Place::Remote(Deliveries::start(target)),
            answering: Vec::new(),
            loop_type,
            task,
            status: "running".to_string(),
            subscriptions: subscriptions.map(|s| s.into_iter().collect()),
        },
    );
    Ok(())
}

/// Refuses or accepts one query. An accepted query goes back to the asker as a
/// [`RoutedQuery`]; the coordinator keeps only its cancel handle and waits for nothing.
fn handle_query(
    state: &mut CoordState,
    from: Arc<str>,
    target: Arc<str>,
    question: Arc<str>,
    timeout: Duration,
    reply: RpcReplyPort<Result<RoutedQuery, ToolError>>,
) {
    let id = state.next_query;
    state.next_query += 1;
    // One clock read for the rate and the event's date (clock reads are not cheap on a
    // virtual machine; bench query).
    let now = Instant::now();
    let refused = state
        .take_token_at(&from, now)
        .and_then(|()| state.check_text("question", &question))
        .err()
        .or_else(|| {
            state
                .unreachable(&from, &target)
                .map(|message| ToolError::Unavailable {
                    message: format!("query not sent: {message}"),
                })
        });
    if let Some(err) = refused {
        state.events.record_at(
            EventKind::QueryFailed {
                id,
                from,
                to: target,
                error: err.to_string(),
                spend: None,
            },
            now,
        );
        let _ = reply.send(Err(err));
        return;
    }
    let Some(entry) = state.loops.get_mut(&*target) else {
        return;
    };
    state.events.record_at(
        EventKind::QueryAsked {
            id,
            from: Arc::clone(&from),
            to: Arc::clone(&target),
            question: Arc::clone(&question),
        },
        now,
    );
    let (cancel_tx, cancelled) = oneshot::channel();
    entry.answering.retain(|c| !c.is_closed());
    entry.answering.push(cancel_tx);
    let record = QueryRecord {
        id,
        from,
        target,
        timeout,
        events: state.events.clone(),
        done: false,
    };
    let routed = match &entry.place {
        Place::Local { answerer, .. } => {
            RoutedQuery::local(answerer.clone(), question, cancelled, record)
        }
        Place::Remote(deliveries) => {
            let target = deliveries.target().clone();
            RoutedQuery::remote(target, question, timeout, cancelled, record)
        }
    };
    // An asker that is gone drops the query unrun; its record says so.
    let _ = reply.send(Ok(routed));
}

/// The answer of local loop `name` to `from`, asked from elsewhere (see
/// [`CoordMsg::AnswerLocal`]): run as a local query's, cancelled as one when the loop leaves,
/// and recorded by the head, not here.
fn answer_local(
    state: &mut CoordState,
    name: String,
    from: String,
    question: String,
    timeout: Duration,
) -> Result<RoutedQuery, ToolError> {
    let Some(Entry {
        place: Place::Local { answerer, .. },
        answering,
        ..
    }) = state.loops.get_mut(&name)
    else {
        return Err(ToolError::Unavailable {
            message: format!(
                "loop '{name}' is not running on this host any more; continue without the answer"
            ),
        });
    };
    let (cancel_tx, cancelled) = oneshot::channel();
    answering.retain(|c| !c.is_closed());
    answering.push(cancel_tx);
    // Done from the start: the head records the query.
    let record = QueryRecord {
        id: 0,
        from: from.into(),
        target: name.into(),
        timeout,
        events: state.events.clone(),
        done: true,
    };
    let answerer = answerer.clone();
    Ok(RoutedQuery::local(
        answerer,
        question.into(),
        cancelled,
        record,
    ))
}

fn handle_share(
    state: &mut CoordState,
    from: &str,
    targets: &[String],
    data_type: &str,
    data: Value,
) -> Result<Shared, ToolError> {
    let refused = state
        .take_token(from)
        .and_then(|()| state.check_text("data type", data_type))
        .and_then(|()| state.check_payload(&data));
    if let Err(err) = refused {
        let data_type = td_base::text::head_tail(data_type, state.limits.max_payload_bytes);
        for to in targets {
            state.events.record(EventKind::Shared {
                from: from.to_string(),
                to: to.clone(),
                data_type: data_type.clone(),
                data: Value::Null,
                error: Some(err.to_string()),
                delivery: None,
            });
        }
        return Err(err);
    }
    let mut deliveries = Vec::with_capacity(targets.len());
    // Remote deliveries under way (none for local targets: no allocation).
    let mut waiting = Vec::new();
    for to in targets {
        let mut number = None;
        let error = match state.unreachable(from, to) {
            Some(why) => Some(why),
            None => match state.loops.get(to).map(|e| e.status == "running") {
                Some(false) => state
                    .loops
                    .get(to)
                    .map(|e| format!("loop '{to}' has {} and no longer reads its inbox", e.status)),
                Some(true) => {
                    number = state.number(to);
                    let item = Arc::new(InboxItem::Share {
                        from: from.to_string(),
                        data_type: data_type.to_string(),
                        data: data.clone(),
                    });
                    match state.loops.get(to).map(|e| &e.place) {
                        None => Some(format!("unknown loop '{to}'")),
                        Some(Place::Local { inbox, .. }) => {
                            inbox.push(number, item);
                            None
                        }
                        Some(Place::Remote(queue)) => {
                            // Recorded once its outcome is known (the head always numbers).
                            let number = number.unwrap_or(0);
                            waiting.push((deliveries.len(), number, queue.send(number, item)));
                            deliveries.push(Delivery {
                                target: to.clone(),
                                error: None,
                            });
                            continue;
                        }
                    }
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
            delivery: number,
        });
        deliveries.push(Delivery {
            target: to.clone(),
            error,
        });
    }
    if waiting.is_empty() {
        return Ok(Shared::Done(deliveries));
    }
    let remote = waiting
        .iter()
        .filter_map(|(i, _, _)| deliveries.get(*i).map(|d| d.target.clone()))
        .collect();
    Ok(Shared::Pending(PendingShare {
        deliveries,
        waiting,
        from: from.to_string(),
        data_type: data_type.to_string(),
        data,
        events: state.events.clone(),
        _settling: state.settling.hold(remote),
    }))
}

fn handle_alert(
    state: &mut CoordState,
    from: &str,
    event_type: &str,
    message: &str,
    data: Option<Value>,
    about: Option<&str>,
) -> Result<Alerted, ToolError> {
    let refused = state
        .take_token(from)
        .and_then(|()| state.check_text("event type", event_type))
        .and_then(|()| state.check_text("message", message))
        .and_then(|()| match &data {
            Some(d) => state.check_payload(d),
            None => Ok(()),
        });
    if let Err(err) = refused {
        // What was refused, within the limit: an oversized message is not kept either.
        let limit = state.limits.max_payload_bytes;
        state.events.record(EventKind::Alert {
            from: from.to_string(),
            event_type: td_base::text::head_tail(event_type, limit),
            message: td_base::text::head_tail(message, limit),
            data,
            recipients: Vec::new(),
            error: Some(err.to_string()),
            deliveries: BTreeMap::new(),
        });
        return Err(err);
    }
    let mut recipients = Vec::new();
    let mut waiting = Vec::new();
    let item = Arc::new(InboxItem::Alert {
        from: from.to_string(),
        event_type: event_type.to_string(),
        message: message.to_string(),
        data: data.clone(),
        about: about.filter(|_| from == SYSTEM_SENDER).map(str::to_string),
    });
    let mut numbers = BTreeMap::new();
    let mut next = std::mem::take(&mut state.numbers);
    let head = state.upstream.is_none();
    for (name, entry) in &state.loops {
        let listens = hears(entry.subscriptions.as_ref(), from, event_type);
        if name == from || Some(name.as_str()) == about || entry.status != "running" || !listens {
            continue;
        }
        // Numbered as `CoordState::number` does (the map is taken out of the state while
        // its loops are walked).
        let number = head.then(|| {
            // Looked up before it is added: a name is copied once per loop, not per alert.
            let last = match next.get_mut(name) {
                Some(last) => last,
                None => next.entry(name.clone()).or_insert(0),
            };
            *last = last.saturating_add(1);
            *last
        });
        if let Some(n) = number {
            numbers.insert(name.clone(), n);
        }
        match &entry.place {
            Place::Local { inbox, .. } => {
                inbox.push(number, item.clone());
                recipients.push(name.clone());
            }
            Place::Remote(queue) => {
                waiting.push((name.clone(), queue.send(number.unwrap_or(0), item.clone())))
            }
        }
    }
    state.numbers = next;
    if !waiting.is_empty() {
        let remote = waiting.iter().map(|(name, _)| name.clone()).collect();
        return Ok(Alerted::Pending(Box::new(PendingAlert {
            recipients,
            numbers,
            waiting,
            from: from.to_string(),
            event_type: event_type.to_string(),
            message: message.to_string(),
            data,
            notice: false,
            events: state.events.clone(),
            _settling: state.settling.hold(remote),
        })));
    }
    state.events.record(EventKind::Alert {
        from: from.to_string(),
        event_type: event_type.to_string(),
        message: message.to_string(),
        data,
        recipients: recipients.clone(),
        error: None,
        deliveries: numbers,
    });
    Ok(Alerted::Done(recipients.len()))
}

/// Puts a system alert into the inbox of `to` when it is running; records it as an `alert`
/// event either way (so a resumed run shows it again if its model had not seen it).
fn handle_notify(state: &mut CoordState, to: &str, event_type: &str, message: &str) -> Notified {
    let item = || {
        Arc::new(InboxItem::Alert {
            from: SYSTEM_SENDER.to_string(),
            event_type: event_type.to_string(),
            message: message.to_string(),
            data: None,
            about: None,
        })
    };
    let running = state.loops.get(to).map(|e| e.status == "running");
    let number = match running {
        Some(true) => state.number(to),
        _ => None,
    };
    let numbers: BTreeMap<String, u64> = number.map(|n| (to.to_string(), n)).into_iter().collect();
    let error = match state.loops.get(to) {
        Some(entry) if entry.status == "running" => match &entry.place {
            Place::Local { inbox, .. } => {
                inbox.push(number, item());
                None
            }
            Place::Remote(queue) => {
                return Notified::Pending(Box::new(PendingAlert {
                    recipients: Vec::new(),
                    numbers,
                    waiting: vec![(to.to_string(), queue.send(number.unwrap_or(0), item()))],
                    from: SYSTEM_SENDER.to_string(),
                    event_type: event_type.to_string(),
                    message: message.to_string(),
                    data: None,
                    notice: true,
                    events: state.events.clone(),
                    _settling: state.settling.hold(vec![to.to_string()]),
                }));
            }
        },
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
        deliveries: if error.is_none() {
            numbers
        } else {
            BTreeMap::new()
        },
    });
    Notified::Done(error.is_none())
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

/// Sends the coordinator the request `build` makes and waits for its reply.
///
/// What `ActorRef::call` does without a timeout (a oneshot reply port, a send, a wait),
/// written out: `call`'s future nests three more (`call`, `internal_call`, its async block),
/// each built on the stack and copied into its parent, and a query paid those copies twice
/// (bench `query`, `tool`).
pub(crate) async fn ask<T: Send + 'static>(
    coordinator: &ActorRef<CoordMsg>,
    build: impl FnOnce(RpcReplyPort<T>) -> CoordMsg,
) -> Result<T, ToolError> {
    let (reply, replied) = oneshot::channel();
    coordinator
        .cast(build(RpcReplyPort::from(reply)))
        .map_err(|_| coordinator_gone())?;
    replied.await.map_err(|_| coordinator_gone())
}

#[async_trait]
impl Coordination for CoordinatorPort {
    async fn query(
        &self,
        from: &Arc<str>,
        target: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<String, ToolError> {
        ask(&self.coordinator, |reply| CoordMsg::Query {
            from: Arc::clone(from),
            target: target.into(),
            question: question.into(),
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
        .await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(events: &Arc<EventLog>) -> QueryRecord {
        QueryRecord {
            id: 7,
            from: "a".into(),
            target: "b".into(),
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
                if &**from == "a" && &**to == "b" && error.contains("stopped waiting")),
            "{kinds:?}"
        );
    }
}
