//! A cloneable handle on a runtime's coordinator for what crosses processes: the head's
//! host agent registers, updates and drops the loops that live on hosts, and forwards their
//! system alerts; a host's agent delivers to and asks the loops that live on it. (A loop's
//! own `query_loop`, `share_data`, `broadcast_alert` and `list_loops` take its
//! [`CoordinatorPort`](crate::coordinator::CoordinatorPort), wherever the loop runs.)

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use serde_json::Value;

use crate::coordinator::{CoordMsg, ask};
use crate::daemon::RuntimeError;
use crate::remote_loop::RemoteLoop;
use td_protocol::inbox::InboxItem;
use td_toolkit::error::ToolError;

/// A handle on a coordinator (see the module doc); cheap to clone.
#[derive(Clone)]
pub struct CoordinatorHandle {
    coordinator: ActorRef<CoordMsg>,
}

impl CoordinatorHandle {
    /// A handle on `coordinator`.
    pub fn new(coordinator: ActorRef<CoordMsg>) -> Self {
        Self { coordinator }
    }

    /// Head side: loop `name`, which lives in another process, joins the run; the
    /// coordinator reaches it through `link` and routes, limits and records its messages as
    /// a local loop's. Refused when a loop of that name runs in this process; a remote loop
    /// of that name is replaced (its host registered it again).
    pub async fn register_remote(
        &self,
        name: &str,
        loop_type: &str,
        task: &str,
        subscriptions: Option<Vec<String>>,
        link: Arc<dyn RemoteLoop>,
    ) -> Result<(), RuntimeError> {
        let registered = ask(&self.coordinator, |reply| CoordMsg::RegisterRemote {
            name: name.to_string(),
            loop_type: loop_type.to_string(),
            task: task.to_string(),
            subscriptions,
            link,
            reply,
        })
        .await
        .map_err(|e| RuntimeError::DaemonGone(e.to_string()))?;
        registered.map_err(|reason| RuntimeError::LoopStart {
            name: name.to_string(),
            reason,
        })
    }

    /// Head side: remote loop `name`'s status changed (what its host says); ignored for a
    /// loop that is not remote.
    pub fn set_remote_status(&self, name: &str, status: &str) {
        let _ = self.coordinator.cast(CoordMsg::SetRemoteStatus {
            name: name.to_string(),
            status: status.to_string(),
        });
    }

    /// Head side: remote loop `name` ended and left the run (its host says its actor
    /// stopped); queries waiting on it fail at once as for a local loop that stopped. False
    /// when there was no such remote loop.
    pub async fn unregister_remote(&self, name: &str) -> bool {
        self.leave(name, None).await
    }

    /// Head side: remote loop `name` leaves the run because of `reason` (e.g. "its host h1
    /// was lost: no heartbeat for 3 s"): the queries and deliveries waiting on it fail at
    /// once with an error that names the loop and gives `reason`; a running loop is
    /// recorded as interrupted, and later messages to it get the usual ended-loop error.
    /// False when there was no such remote loop.
    pub async fn drop_remote(&self, name: &str, reason: &str) -> bool {
        self.leave(name, Some(reason.to_string())).await
    }

    async fn leave(&self, name: &str, reason: Option<String>) -> bool {
        ask(&self.coordinator, |reply| CoordMsg::DropRemote {
            name: name.to_string(),
            reason,
            reply: Some(reply),
        })
        .await
        .unwrap_or(false)
    }

    /// Head side: an alert a host forwards for one of its loops, or (`from` =
    /// [`crate::coordinator::SYSTEM_SENDER`]) a system alert `about` one of them; routed,
    /// limited and recorded as a local loop's. How many loops it reached.
    pub async fn alert(
        &self,
        from: &str,
        event_type: &str,
        message: &str,
        data: Option<Value>,
        about: Option<&str>,
    ) -> Result<usize, ToolError> {
        ask(&self.coordinator, |reply| CoordMsg::Alert {
            from: from.to_string(),
            event_type: event_type.to_string(),
            message: message.to_string(),
            data,
            about: about.map(str::to_string),
            reply: Some(reply),
        })
        .await?
    }

    /// Head side: loop `name`'s next delivery numbers come after `after`, the last one its
    /// record holds (a resumed loop), so that none is given twice.
    pub fn number_after(&self, name: &str, after: u64) {
        let _ = self.coordinator.cast(CoordMsg::NumberAfter {
            name: name.to_string(),
            after,
        });
    }

    /// Head side: waits, at most `limit`, until no share or alert delivered to remote loop
    /// `name` (dropped from the run: its host was lost) waits to be recorded; false when
    /// the limit passed first. A share or alert is recorded once all its remote deliveries
    /// settle, each within [`crate::remote_loop::REMOTE_DELIVERY_TIMEOUT`]: read back
    /// before, the loop's record could miss an item it was delivered.
    pub async fn settled(&self, name: &str, limit: Duration) -> bool {
        let waited = ask(&self.coordinator, |reply| CoordMsg::Settled {
            name: name.to_string(),
            reply,
        });
        matches!(tokio::time::timeout(limit, waited).await, Ok(Ok(())))
    }

    /// Host side: puts `item` (a share or alert the head routed, `delivery` its number)
    /// into the inbox of the loop `name` running here; false when no such loop is running
    /// here. Not recorded here: the head records it.
    pub async fn deliver_local(
        &self,
        name: &str,
        delivery: Option<u64>,
        item: Arc<InboxItem>,
    ) -> bool {
        ask(&self.coordinator, |reply| CoordMsg::DeliverLocal {
            name: name.to_string(),
            delivery,
            item,
            reply,
        })
        .await
        .unwrap_or(false)
    }

    /// Host side: the answer of loop `name` (running here) to `from`'s `question`, within
    /// `timeout`: the same answer a local query gets (read-only tools, the loop's
    /// transcript, its lanes and receipts), cancelled at once if the loop leaves, not
    /// recorded here (the head records the query). The answer is charged to `from`'s
    /// account in the loop's budgets; an asker unknown there (a loop of the head or of
    /// another host) is charged at the run level of those budgets only.
    pub async fn answer_local(
        &self,
        name: &str,
        from: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<String, ToolError> {
        ask(&self.coordinator, |reply| CoordMsg::AnswerLocal {
            name: name.to_string(),
            from: from.to_string(),
            question: question.to_string(),
            timeout,
            reply,
        })
        .await??
        .run()
        .await
    }
}
