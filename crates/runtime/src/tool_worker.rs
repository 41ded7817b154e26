//! The tool worker actor: runs one tool call at a time for its lane pool.
//!
//! A worker owns nothing but its place in the pool. It runs each call with
//! [`ToolSet::call_propagating_panics`](td_toolkit::registry::ToolSet::call_propagating_panics)
//! inside its own handler, so the registry still applies validation, the catalog timeout and
//! the output cap, while a panicking tool unwinds into the actor: ractor turns that into
//! `SupervisionEvent::ActorFailed` for the pool, which answers the call and starts a
//! replacement. A worker that finishes answers the caller itself (one hop fewer on every
//! call's way back) and then tells the pool it is idle.
//!
//! A call whose caller stops waiting is cancelled: the worker checks every `ABANDON_POLL`
//! and drops the call once nobody waits for it (dropping a command's call kills its process
//! group), so that abandoned work frees the worker.
//!
//! The worker knows its pool only as somewhere to report `WorkerIdle` (a ractor
//! `DerivedActorRef`), so this module does not depend on the pool's.

use std::sync::Arc;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, DerivedActorRef};

use crate::reply_slot::ReplySlot;
use td_toolkit::call_path::ToolJob;

/// A worker's report that it answered its call and waits for the next one.
pub(crate) struct WorkerIdle {
    /// The worker's slot.
    pub(crate) slot: usize,
    /// The worker, to tell its report from one of a worker that slot had before.
    pub(crate) worker: ActorId,
    /// Whether the tool returned (its outcome answered the call); `false` when the call
    /// was dropped because its caller gave up.
    pub(crate) finished: bool,
}

/// Messages a worker handles.
pub(crate) enum WorkerMsg {
    /// Run this call, answer it, and report to the pool.
    Run {
        /// The call.
        job: Arc<ToolJob>,
        /// Where its outcome goes (shared with the pool, which answers if we die).
        reply: ReplySlot,
    },
}

// Local only: never sent to another node (ractor's `cluster` feature needs the impl said).
impl ractor::Message for WorkerMsg {}

/// The worker actor (stateless apart from its [`WorkerState`]).
pub(crate) struct ToolWorker;

/// Where a worker reports.
pub(crate) struct WorkerState {
    /// The pool that supervises this worker, as somewhere to report to.
    pub(crate) pool: DerivedActorRef<WorkerIdle>,
    /// This worker's slot in the pool (a replacement takes over the slot of the one it
    /// replaces).
    pub(crate) slot: usize,
}

impl Actor for ToolWorker {
    type Msg = WorkerMsg;
    type State = WorkerState;
    type Arguments = WorkerState;

    async fn pre_start(
        &self,
        _myself: ActorRef<WorkerMsg>,
        args: WorkerState,
    ) -> Result<WorkerState, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<WorkerMsg>,
        message: WorkerMsg,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        let WorkerMsg::Run { job, reply } = message;
        let call = job.tools.call_propagating_panics(
            &job.ctx,
            job.call_id.as_deref(),
            &job.name,
            // The pool keeps the job (and so this input) to answer for us if the tool
            // panics; the registry holds the input shared, not copied.
            Arc::clone(&job.input),
        );
        // A caller that gave up (its iteration timed out, its loop stopped) no longer wants
        // the result: dropping the call ends it (a command's process group is killed) and
        // frees the worker for the next job.
        let finished = tokio::select! {
            outcome = call => {
                reply.answer(outcome);
                true
            }
            () = caller_gone(&reply) => false,
        };
        // Release our share of the call before reporting, so that once the pool has taken
        // the report nothing of the call is left anywhere.
        drop((job, reply));
        let worker: ActorId = myself.get_id();
        // A pool that is gone no longer hands out calls; there is nobody to tell.
        let _ = state.pool.send_message(WorkerIdle {
            slot: state.slot,
            worker,
            finished,
        });
        Ok(())
    }
}

/// How often a running call checks whether its caller still waits.
pub(crate) const ABANDON_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Resolves once nobody waits for the call's outcome any more.
async fn caller_gone(reply: &ReplySlot) {
    loop {
        tokio::time::sleep(ABANDON_POLL).await;
        if reply.abandoned() {
            return;
        }
    }
}
