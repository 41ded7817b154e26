//! A loop that lives in another process (a worker host), as the head's coordinator sees it:
//! the [`RemoteLoop`] link it delivers shares and alerts over and asks questions through, and
//! the queue that delivers to one such loop, in order and each delivery bounded in time.
//!
//! The coordinator never awaits a link in its own handler: a share or alert for a remote
//! loop is queued here, and whoever waits for the outcome (the sender's reply, the record)
//! waits for the queue's answer. A delivery counts as delivered only when the link says the
//! item is in the loop's inbox over there; anything else (the link refused it, no answer in
//! time, the loop left the run) is reported as not delivered, with why. A share or alert
//! with remote deliveries under way is recorded and answered once their outcomes are in
//! ([`PendingShare`], [`PendingAlert`]), with each loop's delivery number (given by the
//! coordinator when it queued the item); until then it is counted in [`Settling`], which
//! the head waits on before it reads a lost loop's record back to move it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use td_base::sync::lock;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use serde_json::Value;
use td_protocol::events::{EventKind, EventLog};
use td_protocol::inbox::InboxItem;
use td_protocol::spend::Spend;
use td_toolkit::coordination::Delivery;
use td_toolkit::error::ToolError;

/// How long one delivery to a remote loop may take, from the moment it is queued, before it
/// is reported not delivered.
pub const REMOTE_DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A loop that lives elsewhere, as the head's coordinator sees it (the host agent implements
/// it over the cluster connection).
#[async_trait]
pub trait RemoteLoop: Send + Sync {
    /// Puts `item`, the loop's delivery number `delivery` (see
    /// [`td_protocol::inbox::Delivered`]), into the loop's inbox over there. True only once
    /// it is there; false when it is not known to be (the link is down, the loop is not
    /// running over there).
    async fn deliver(&self, delivery: u64, item: Arc<InboxItem>) -> bool;

    /// The loop's answer to `from`'s `question`, given within `timeout` (the asker's time
    /// left), or why there is none. The coordinator holds the asker's deadline itself too,
    /// and drops this future when the loop leaves the run. What the answer's model calls
    /// spend is added to `spent` as each is settled where it is made (so that the query's
    /// record says what it cost, even when the asker stopped waiting); a link whose calls
    /// are settled elsewhere adds nothing.
    async fn answer(
        &self,
        from: &str,
        question: &str,
        timeout: Duration,
        spent: &Arc<Mutex<Spend>>,
    ) -> Result<String, ToolError>;
}

/// One remote loop, shared by its coordinator entry, its delivery queue and the queries
/// routed to it.
pub(crate) struct RemoteTarget {
    /// The loop's name.
    pub(crate) name: String,
    /// How to reach it.
    pub(crate) link: Arc<dyn RemoteLoop>,
    /// Why it left the run, when it was dropped with a reason (its host was lost); set before
    /// its entry is dropped, so that what waits on it says why.
    pub(crate) left: OnceLock<String>,
}

impl RemoteTarget {
    /// What a query waiting on this loop is told when the loop leaves the run.
    pub(crate) fn left_before_answering(&self) -> String {
        let name = &self.name;
        match self.left.get() {
            Some(reason) => {
                format!(
                    "loop '{name}' did not answer: {reason}; ask again later or ask another loop"
                )
            }
            None => crate::routed_query::stopped_before_answering(name),
        }
    }

    /// What a sender is told of an item that did not reach this loop before it left the run.
    fn left_before_delivery(&self) -> String {
        let name = &self.name;
        match self.left.get() {
            Some(reason) => format!(
                "not delivered: loop '{name}' cannot be reached: {reason}; send it again later or to another loop"
            ),
            None => format!("not delivered: loop '{name}' left the run"),
        }
    }
}

/// The outcome of one queued delivery: `Ok` once it is in the loop's inbox, else why not.
pub(crate) type Delivered = oneshot::Receiver<Result<(), String>>;

struct Job {
    delivery: u64,
    item: Arc<InboxItem>,
    deadline: Instant,
    done: oneshot::Sender<Result<(), String>>,
}

/// The delivery queue of one remote loop: one task per loop delivers its items one at a
/// time, in the order the coordinator queued them (a loop sees two shares from a peer in the
/// order they were sent). Dropping the queue (the loop leaves the run) ends the delivery in
/// progress and answers everything still queued as not delivered.
pub(crate) struct Deliveries {
    target: Arc<RemoteTarget>,
    jobs: mpsc::UnboundedSender<Job>,
    /// Dropped with the queue: the task stops at once.
    _stop: oneshot::Sender<()>,
}

impl Deliveries {
    /// Starts the queue of `target` (its task runs until the queue is dropped).
    pub(crate) fn start(target: Arc<RemoteTarget>) -> Self {
        let (jobs, rx) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(deliver_in_order(target.clone(), rx, stopped));
        Self {
            target,
            jobs,
            _stop: stop,
        }
    }

    /// The loop this queue delivers to.
    pub(crate) fn target(&self) -> &Arc<RemoteTarget> {
        &self.target
    }

    /// Queues `item`, the loop's delivery number `delivery`; the receiver says whether it
    /// was delivered.
    pub(crate) fn send(&self, delivery: u64, item: Arc<InboxItem>) -> Delivered {
        let (done, outcome) = oneshot::channel();
        let job = Job {
            delivery,
            item,
            deadline: Instant::now() + REMOTE_DELIVERY_TIMEOUT,
            done,
        };
        if let Err(mpsc::error::SendError(job)) = self.jobs.send(job) {
            // The task is gone (the runtime is shutting down).
            let _ = job.done.send(Err(self.target.left_before_delivery()));
        }
        outcome
    }
}

async fn deliver_in_order(
    target: Arc<RemoteTarget>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        let job = tokio::select! {
            biased;
            _ = &mut stop => break,
            job = jobs.recv() => match job {
                Some(job) => job,
                None => break,
            },
        };
        if Instant::now() >= job.deadline {
            // Queued behind slow deliveries for too long: not even tried, so surely not there.
            let _ = job.done.send(Err(format!(
                "not delivered: loop '{}' did not take earlier items within {} s (its host is \
                 slow or unreachable); send it again later",
                target.name,
                REMOTE_DELIVERY_TIMEOUT.as_secs()
            )));
            continue;
        }
        let outcome = tokio::select! {
            biased;
            _ = &mut stop => {
                let _ = job.done.send(Err(target.left_before_delivery()));
                break;
            }
            delivered = tokio::time::timeout_at(job.deadline, target.link.deliver(job.delivery, job.item)) => {
                match delivered {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(format!(
                        "not delivered: the link to loop '{}' is down or the loop no longer \
                         reads its inbox; send it again later",
                        target.name
                    )),
                    Err(_) => Err(format!(
                        "not confirmed within {} s (the host of loop '{}' is slow or \
                         unreachable): it may or may not have arrived; ask the loop with \
                         query_loop before sending it again",
                        REMOTE_DELIVERY_TIMEOUT.as_secs(),
                        target.name
                    )),
                }
            }
        };
        let _ = job.done.send(outcome);
    }
    // The loop left the run: nothing still queued reaches it.
    jobs.close();
    while let Ok(job) = jobs.try_recv() {
        let _ = job.done.send(Err(target.left_before_delivery()));
    }
}

/// What the coordinator did with a share: done, or waiting for remote deliveries.
pub(crate) enum Shared {
    /// Every target's outcome is known.
    Done(Vec<Delivery>),
    /// Some targets are remote loops whose deliveries are under way.
    Pending(PendingShare),
}

/// A share with remote deliveries under way: settled (recorded, answered) once their
/// outcomes are in, outside the coordinator's handler.
pub(crate) struct PendingShare {
    pub(crate) deliveries: Vec<Delivery>,
    /// Index in `deliveries`, delivery number and outcome of each remote delivery.
    pub(crate) waiting: Vec<(usize, u64, Delivered)>,
    pub(crate) from: String,
    pub(crate) data_type: String,
    pub(crate) data: Value,
    pub(crate) events: Arc<EventLog>,
    /// Held until every delivery is recorded (see [`Settling`]).
    pub(crate) _settling: SettleGuard,
}

impl PendingShare {
    /// Waits for the remote deliveries, records each and returns every target's outcome.
    pub(crate) async fn settle(mut self) -> Vec<Delivery> {
        for (i, number, delivered) in self.waiting {
            let Some(delivery) = self.deliveries.get_mut(i) else {
                continue;
            };
            let error = delivered
                .await
                .unwrap_or_else(|_| Err(queue_stopped()))
                .err();
            self.events.record(EventKind::Shared {
                from: self.from.clone(),
                to: delivery.target.clone(),
                data_type: self.data_type.clone(),
                data: self.data.clone(),
                error: error.clone(),
                delivery: Some(number),
            });
            delivery.error = error;
        }
        self.deliveries
    }
}

/// What a delivery is told when its queue ended without a word (the runtime shut down).
fn queue_stopped() -> String {
    "not delivered: the run is shutting down".to_string()
}

/// What the coordinator did with an alert: done (how many loops it reached), or waiting for
/// remote deliveries.
pub(crate) enum Alerted {
    Done(usize),
    Pending(Box<PendingAlert>),
}

/// An alert with remote deliveries under way: recorded (one event, with every loop it
/// reached) once their outcomes are in.
pub(crate) struct PendingAlert {
    /// The loops it reached so far.
    pub(crate) recipients: Vec<String>,
    /// The delivery number of each loop it reached or is on its way to.
    pub(crate) numbers: BTreeMap<String, u64>,
    /// The remote loops it is on its way to.
    pub(crate) waiting: Vec<(String, Delivered)>,
    pub(crate) from: String,
    pub(crate) event_type: String,
    pub(crate) message: String,
    pub(crate) data: Option<Value>,
    /// A notice to one loop: not reaching it is recorded as the alert's error.
    pub(crate) notice: bool,
    pub(crate) events: Arc<EventLog>,
    /// Held until it is recorded (see [`Settling`]).
    pub(crate) _settling: SettleGuard,
}

impl PendingAlert {
    /// Waits for the remote deliveries, records the alert and returns how many loops it
    /// reached.
    pub(crate) async fn settle(mut self) -> usize {
        let mut error = None;
        for (name, delivered) in self.waiting {
            match delivered.await.unwrap_or_else(|_| Err(queue_stopped())) {
                Ok(()) => self.recipients.push(name),
                Err(why) => {
                    tracing::info!("alert {} to loop {name}: {why}", self.event_type);
                    if self.notice {
                        error = Some(why);
                    }
                }
            }
        }
        let reached = self.recipients.len();
        let mut numbers = std::mem::take(&mut self.numbers);
        numbers.retain(|name, _| self.recipients.contains(name));
        self.events.record(EventKind::Alert {
            from: self.from,
            event_type: self.event_type,
            message: self.message,
            data: self.data,
            recipients: self.recipients,
            error,
            deliveries: numbers,
        });
        reached
    }
}

/// What the coordinator did with a notice to one loop.
pub(crate) enum Notified {
    /// Whether it reached the loop.
    Done(bool),
    /// On its way to a remote loop.
    Pending(Box<PendingAlert>),
}

/// The remote loops with a share or alert on its way whose outcome is not recorded yet: a
/// share or alert is recorded once all its remote deliveries settle (up to
/// [`REMOTE_DELIVERY_TIMEOUT`] each), so an item a loop got may reach the record after the
/// loop's host is lost. Whoever reads a lost loop's record back to move it waits for its
/// deliveries here first ([`crate::coordinator_handle::CoordinatorHandle::settled`]), so
/// that no item it got is missing from what it goes on with.
#[derive(Default)]
pub(crate) struct Settling {
    /// Per loop, the shares and alerts with a delivery to it not yet recorded.
    counts: Mutex<HashMap<String, usize>>,
    /// Bumped whenever a count goes down.
    changed: watch::Sender<()>,
}

impl Settling {
    /// Counts a share or alert on its way to `names` until the guard is dropped.
    pub(crate) fn hold(self: &Arc<Self>, names: Vec<String>) -> SettleGuard {
        let mut counts = lock(&self.counts);
        for name in &names {
            *counts.entry(name.clone()).or_insert(0) += 1;
        }
        SettleGuard {
            settling: self.clone(),
            names,
        }
    }

    /// Returns once no share or alert with a delivery to `name` waits to be recorded.
    pub(crate) async fn settled(&self, name: &str) {
        // Subscribed before the count is read: a drop between the two is not missed.
        let mut changed = self.changed.subscribe();
        loop {
            if !lock(&self.counts).contains_key(name) {
                return;
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    }
}

/// A share or alert counted in [`Settling`] until it is recorded.
pub(crate) struct SettleGuard {
    settling: Arc<Settling>,
    names: Vec<String>,
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        {
            let mut counts = lock(&self.settling.counts);
            for name in &self.names {
                if let Some(n) = counts.get_mut(name) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        counts.remove(name);
                    }
                }
            }
        }
        self.settling.changed.send_modify(|_| {});
    }
}
