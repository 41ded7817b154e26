//! A query the coordinator accepted ([`RoutedQuery`]), run in the asker's task: the target's
//! answer (a local loop's answerer, or a remote loop's link) under the asker's deadline and
//! the target's staying in the run, or, on a worker host, the head asked; and the query's
//! record, written exactly once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::Either;
use tokio::sync::oneshot;

use crate::remote_loop::RemoteTarget;
use crate::upstream::{QUERY_GRACE, Upstream, head_silent};
use td_base::sync::lock;
use td_engine::{AnswerError, Answerer};
use td_protocol::events::{EventKind, EventLog};
use td_protocol::spend::Spend;
use td_toolkit::error::ToolError;

/// An accepted query: the target loop's [`Answerer`] (or, for a loop of another process,
/// its link) and what the answer is held to (the asker's deadline, the target staying in
/// the run).
///
/// The asker runs it in its own task ([`RoutedQuery::run`]): it waits for the answer anyway,
/// and running the answer there spares a task and two task switches per query. The answer
/// is still the target's (its task, progress, worktree and transcript); it ends at the
/// asker's deadline, or at once when the target leaves the run (the coordinator drops the
/// cancel handle). Its outcome is recorded as an event exactly once.
///
/// On a worker host the query is the head's to route: running it asks the head.
pub struct RoutedQuery(Routed);

enum Routed {
    /// A loop of this process answers; checked and recorded by this coordinator.
    Local(Accepted),
    /// A loop of another process answers through its link; checked and recorded by this
    /// coordinator. Boxed, so that a local query stays as small as it was.
    Remote(Box<RemoteQuery>),
    /// A host's query, which the head checks, records and routes.
    Upstream(Box<UpstreamQuery>),
}

/// A query a local loop answers.
struct Accepted {
    answerer: Arc<Answerer>,
    question: Arc<str>,
    cancelled: oneshot::Receiver<()>,
    record: QueryRecord,
}

/// A query a remote loop answers.
struct RemoteQuery {
    target: Arc<RemoteTarget>,
    question: Arc<str>,
    deadline: tokio::time::Instant,
    cancelled: oneshot::Receiver<()>,
    record: QueryRecord,
}

/// The instant `timeout` from now, or a year from now when the clock cannot hold it: a
/// deadline comes from a model's input or another process's request, and `Instant + Duration`
/// panics past the clock's range (inside the coordinator's actor, which would end it).
fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    const FAR: Duration = Duration::from_secs(365 * 24 * 3600);
    let now = tokio::time::Instant::now();
    now.checked_add(timeout.min(FAR)).unwrap_or(now)
}

impl RoutedQuery {
    /// A query the coordinator accepted for local loop `answerer`: the asker waits up to
    /// its record's timeout, unless `cancelled` first (the target left the run).
    pub(crate) fn local(
        answerer: Arc<Answerer>,
        question: Arc<str>,
        cancelled: oneshot::Receiver<()>,
        record: QueryRecord,
    ) -> Self {
        RoutedQuery(Routed::Local(Accepted {
            answerer,
            question,
            cancelled,
            record,
        }))
    }

    /// A query the coordinator accepted for remote loop `target` (as [`RoutedQuery::local`]).
    pub(crate) fn remote(
        target: Arc<RemoteTarget>,
        question: Arc<str>,
        timeout: Duration,
        cancelled: oneshot::Receiver<()>,
        record: QueryRecord,
    ) -> Self {
        RoutedQuery(Routed::Remote(Box::new(RemoteQuery {
            target,
            question,
            deadline: deadline_after(timeout),
            cancelled,
            record,
        })))
    }

    /// A host's query for the head.
    pub(crate) fn upstream(
        upstream: Arc<dyn Upstream>,
        from: Arc<str>,
        target: Arc<str>,
        question: Arc<str>,
        timeout: Duration,
    ) -> Self {
        RoutedQuery(Routed::Upstream(Box::new(UpstreamQuery {
            upstream,
            from,
            target,
            question,
            timeout,
        })))
    }

    /// Runs the answer and returns it, or why there is none.
    ///
    /// Not an `async fn`: one would keep this query in its future beside the future it
    /// awaits, which holds the query too (an async fn's arguments stay in its future across
    /// every await), and every `query_loop` call boxes that future (+45% of its size, +7% of
    /// a query's time, bench query).
    pub fn run(self) -> impl Future<Output = Result<String, ToolError>> + Send {
        match self.0 {
            Routed::Local(accepted) => Either::Left(accepted.run()),
            // Boxed: only queries that cross processes need them.
            Routed::Remote(query) => Either::Right(Either::Left(Box::pin(query.run()))),
            Routed::Upstream(query) => Either::Right(Either::Right(Box::pin(query.run()))),
        }
    }
}

impl Accepted {
    async fn run(self) -> Result<String, ToolError> {
        let Accepted {
            answerer,
            question,
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
                // every query's future (moved a few times per query) larger. The deadline
                // is read only here too: an answer taken at once needs no clock read for it
                // (one poll later than its acceptance, which took no time of its own).
                None => {
                    Box::pin(wait_for_answer(
                        answering,
                        deadline_after(record.timeout),
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

impl RemoteQuery {
    async fn run(self) -> Result<String, ToolError> {
        let RemoteQuery {
            target,
            question,
            deadline,
            cancelled,
            mut record,
        } = self;
        // Outside the answer's future, which a timeout or the target's end drops.
        let spent = Arc::new(Mutex::new(Spend::default()));
        let outcome = ask_remote(
            &target,
            &record.from,
            &question,
            deadline,
            cancelled,
            record.timeout,
            &spent,
        )
        .await;
        // What the answer's model calls spent, as the link saw them settled (they are
        // charged where they were made).
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
            Err(_) => Err(no_reply(target, timeout)),
        },
        _ = cancelled => Err(stopped_before_answering(target)),
    }
}

/// The answer of remote loop `target` through its link, held to the asker's `deadline`
/// and to the loop staying in the run (`cancelled`). An error the link gives (the host's
/// answer failed, the host could not be reached) is passed on as it is.
async fn ask_remote(
    target: &RemoteTarget,
    from: &str,
    question: &str,
    deadline: tokio::time::Instant,
    cancelled: oneshot::Receiver<()>,
    timeout: Duration,
    spent: &Arc<Mutex<Spend>>,
) -> Result<String, String> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let asking = target.link.answer(from, question, left, spent);
    tokio::select! {
        r = tokio::time::timeout_at(deadline, asking) => match r {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(ToolError::Unavailable { message })) => Err(message),
            Ok(Err(other)) => Err(other.to_string()),
            Err(_) => Err(no_reply(&target.name, timeout)),
        },
        _ = cancelled => Err(target.left_before_answering()),
    }
}

/// A host's query, asked of the head.
struct UpstreamQuery {
    upstream: Arc<dyn Upstream>,
    from: Arc<str>,
    target: Arc<str>,
    question: Arc<str>,
    timeout: Duration,
}

impl UpstreamQuery {
    async fn run(self) -> Result<String, ToolError> {
        // The head holds the asker's timeout; this bounds a head that does not answer at all.
        let waited = self.timeout.saturating_add(QUERY_GRACE);
        let asked = self
            .upstream
            .query(&self.from, &self.target, &self.question, self.timeout);
        tokio::time::timeout(waited, asked)
            .await
            .unwrap_or_else(|_| Err(head_silent("a query_loop", waited)))
    }
}

/// Records the outcome of one accepted query as an event, once; a query dropped before its
/// outcome (the asker stopped waiting: its iteration or loop ended) is recorded as such.
pub(crate) struct QueryRecord {
    pub(crate) id: u64,
    pub(crate) from: Arc<str>,
    pub(crate) target: Arc<str>,
    pub(crate) timeout: Duration,
    pub(crate) events: Arc<EventLog>,
    /// Recorded already (or never to be: a host answering for the head, which records).
    pub(crate) done: bool,
}

impl QueryRecord {
    pub(crate) fn record(&mut self, outcome: &Result<String, String>, spend: Option<Spend>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        // Recorded once; the event shares the names.
        let (id, from, to) = (self.id, Arc::clone(&self.from), Arc::clone(&self.target));
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

/// The message for a query that got no answer within the asker's `timeout`.
fn no_reply(target: &str, timeout: Duration) -> String {
    format!(
        "no reply from loop '{target}' within {} ms; ask again later with a larger timeout_ms, or continue without the answer",
        timeout.as_millis()
    )
}

/// The one message for a query whose target went away.
pub(crate) fn stopped_before_answering(target: &str) -> String {
    format!("loop '{target}' stopped before answering your query; continue without the answer")
}
