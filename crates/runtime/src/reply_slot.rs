//! Where one lane call's outcome goes: shared by the lane pool and the worker running the
//! call, answered by whichever gets there first.

use std::sync::{Arc, Mutex};

use ractor::RpcReplyPort;
use tokio::sync::oneshot;

use td_base::sync::lock;
use td_toolkit::registry::CallOutcome;

/// The caller's port, taken by whoever answers first (the worker with the outcome, or the
/// pool when the worker died). Only the pool and the worker hold it, never the caller, so
/// that when both are gone the caller's receiver closes.
#[derive(Clone)]
pub(crate) struct ReplySlot(Arc<Mutex<Option<RpcReplyPort<CallOutcome>>>>);

impl ReplySlot {
    /// A slot that answers on `tx`.
    pub(crate) fn new(tx: oneshot::Sender<CallOutcome>) -> Self {
        Self(Arc::new(Mutex::new(Some(tx.into()))))
    }

    /// Answers the call unless it was answered already. A caller that gave up has dropped
    /// its receiver; the outcome is then dropped.
    pub(crate) fn answer(&self, outcome: CallOutcome) {
        if let Some(port) = lock(&self.0).take() {
            let _ = port.send(outcome);
        }
    }

    /// Whether nobody waits for this outcome any more.
    pub(crate) fn abandoned(&self) -> bool {
        lock(&self.0).as_ref().is_none_or(RpcReplyPort::is_closed)
    }
}
