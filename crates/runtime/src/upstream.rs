//! The head's coordinator as a worker host's runtime sees it: the [`Upstream`] its loops'
//! coordination goes to, and the forwarder that tells it, in order, what the host's loops
//! do (register, change status, announce themselves, leave).
//!
//! A host routes nothing itself: every query, share, alert and listing of its loops goes to
//! the head, which decides every route, rate limit and record, also between two loops on
//! the same host. What stays on the host is the loops' inboxes and answerers, which the head
//! reaches through `Runtime::deliver_local` and `Runtime::answer_local`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ractor::{ActorId, ActorRef, RpcReplyPort};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::coordinator::CoordMsg;
use td_toolkit::coordination::{Delivery, LoopInfo};
use td_toolkit::error::ToolError;

/// How long the host waits for the head on anything but a query (whose bound is the asker's
/// timeout plus this): a backstop for an `Upstream` whose own calls hang.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// How much longer than the asker's timeout a host waits for the head's reply to a query:
/// the head holds the timeout itself; this bounds a head that does not answer at all.
pub const QUERY_GRACE: Duration = Duration::from_secs(5);

/// The head's coordinator, as a host's runtime sees it (the host agent implements it over
/// the cluster connection). Each call is answered by the head's coordinator as if the loop
/// were local there.
#[async_trait]
pub trait Upstream: Send + Sync {
    /// Loop `name` of this host joins the run (before it sends or receives anything).
    async fn register(
        &self,
        name: &str,
        loop_type: &str,
        task: &str,
        subscriptions: Option<&[String]>,
    ) -> Result<(), ToolError>;

    /// Loop `name`'s status changed (running, completed, failed, paused, crashed...).
    async fn set_status(&self, name: &str, status: &str) -> Result<(), ToolError>;

    /// Loop `from` asks `target` a question and waits up to `timeout` for the reply.
    async fn query(
        &self,
        from: &str,
        target: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<String, ToolError>;

    /// Loop `from` shares `data` with `targets`; per target whether it was delivered.
    async fn share(
        &self,
        from: &str,
        targets: &[String],
        data_type: &str,
        data: Value,
    ) -> Result<Vec<Delivery>, ToolError>;

    /// An alert from loop `from`, or a system alert (`from` is
    /// [`crate::coordinator::SYSTEM_SENDER`]) `about` one of this host's loops (which does
    /// not receive its own news); how many loops it reached.
    async fn alert(
        &self,
        from: &str,
        event_type: &str,
        message: &str,
        data: Option<Value>,
        about: Option<&str>,
    ) -> Result<usize, ToolError>;

    /// The loops of the run other than `from`.
    async fn list_loops(&self, from: &str) -> Result<Vec<LoopInfo>, ToolError>;

    /// Loop `name` of this host left the run (its actor ended).
    async fn unregister(&self, name: &str) -> Result<(), ToolError>;
}

/// What the host's coordinator tells the head about its loops, in the order it happened.
pub(crate) enum Told {
    /// A loop registers; `reply` is answered once the head knows it.
    Register {
        name: String,
        loop_type: String,
        task: String,
        subscriptions: Option<Vec<String>>,
        /// The loop's actor, for the coordinator to forget if the head refused it.
        actor: ActorId,
        reply: RpcReplyPort<Result<(), String>>,
    },
    /// A loop's status changed.
    SetStatus { name: String, status: String },
    /// A system alert about one of the host's loops (its start or end).
    SystemAlert {
        event_type: String,
        message: String,
        about: Option<String>,
    },
    /// A loop left.
    Unregister { name: String },
    /// Answered once everything told before it was told.
    Flush(RpcReplyPort<()>),
}

/// The host side of a runtime with an upstream: the upstream itself (queries, shares,
/// alerts and listings of loops go to it from the caller's task or a task of their own) and
/// the ordered queue of what the head is told about the loops.
pub(crate) struct Forwarder {
    pub(crate) upstream: Arc<dyn Upstream>,
    told: mpsc::UnboundedSender<Told>,
}

impl Forwarder {
    /// Starts the queue's task; `coordinator` is told of a registration the head refused.
    pub(crate) fn start(upstream: Arc<dyn Upstream>, coordinator: ActorRef<CoordMsg>) -> Self {
        let (told, rx) = mpsc::unbounded_channel();
        tokio::spawn(tell_in_order(upstream.clone(), rx, coordinator));
        Self { upstream, told }
    }

    /// Queues `what` for the head.
    pub(crate) fn tell(&self, what: Told) {
        // The task ends only when this forwarder is dropped.
        let _ = self.told.send(what);
    }
}

/// An `Unavailable` error for an upstream call that got no answer within `waited`.
pub(crate) fn head_silent(what: &str, waited: Duration) -> ToolError {
    ToolError::Unavailable {
        message: format!(
            "the head did not answer {what} within {} s (the connection to it is slow or lost); \
             it is not known whether it went through: try again later",
            waited.as_secs()
        ),
    }
}

/// `call` bounded by [`UPSTREAM_TIMEOUT`].
pub(crate) async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    tokio::time::timeout(UPSTREAM_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| Err(head_silent(what, UPSTREAM_TIMEOUT)))
}

async fn tell_in_order(
    upstream: Arc<dyn Upstream>,
    mut told: mpsc::UnboundedReceiver<Told>,
    coordinator: ActorRef<CoordMsg>,
) {
    while let Some(what) = told.recv().await {
        let failed = match what {
            Told::Register {
                name,
                loop_type,
                task,
                subscriptions,
                actor,
                reply,
            } => {
                let outcome = bounded(
                    "a loop's registration",
                    upstream.register(&name, &loop_type, &task, subscriptions.as_deref()),
                )
                .await
                .map_err(|e| e.to_string());
                if outcome.is_err() {
                    // The loop will not start: its entry must not take deliveries.
                    let _ = coordinator.cast(CoordMsg::Forget {
                        name: name.clone(),
                        actor,
                    });
                }
                let _ = reply.send(outcome);
                None
            }
            Told::SetStatus { name, status } => {
                bounded("a loop's status", upstream.set_status(&name, &status))
                    .await
                    .err()
                    .map(|e| format!("the status '{status}' of loop {name}: {e}"))
            }
            Told::SystemAlert {
                event_type,
                message,
                about,
            } => bounded(
                "a system alert",
                upstream.alert(
                    crate::coordinator::SYSTEM_SENDER,
                    &event_type,
                    &message,
                    None,
                    about.as_deref(),
                ),
            )
            .await
            .err()
            .map(|e| format!("the alert {event_type}: {e}")),
            Told::Unregister { name } => bounded("a loop's end", upstream.unregister(&name))
                .await
                .err()
                .map(|e| format!("the end of loop {name}: {e}")),
            Told::Flush(reply) => {
                let _ = reply.send(());
                None
            }
        };
        if let Some(what) = failed {
            // Nobody waits for these: the host agent sees a lost head on its own.
            tracing::warn!("the head was not told {what}");
        }
    }
}
