//! Receipts of a `tool exec` or `mcp` session, failing closed: a call whose receipt cannot
//! be appended (a full disk) is answered as an error that says so — with its result, since
//! it ran — and every later call of the session is refused without running. A caller thus
//! never takes an unrecorded call for a recorded one, and the log never has a hole followed
//! by more receipts. The session ends with a non-zero exit status that says why.
//!
//! The receipts themselves are saved by the session's call path
//! ([`CallPath`](td_toolkit::call_path::CallPath)), as every caller's are; the gate decides
//! what a receipt that could not be saved means for the session.

use std::sync::OnceLock;

use td_toolkit::call_path::Called;

/// Whether a session's calls may still run: closed once a receipt could not be written.
#[derive(Debug, Default)]
pub struct ReceiptGate {
    /// Why a receipt could not be written (the first time).
    failure: OnceLock<String>,
}

impl ReceiptGate {
    /// A gate that lets calls through.
    pub fn new() -> Self {
        Self::default()
    }

    /// Before a call: `Err(answer)` once an earlier receipt could not be written.
    pub fn admit(&self) -> Result<(), String> {
        match self.failure.get() {
            None => Ok(()),
            Some(why) => Err(format!(
                "not run: {why} earlier in this session, and nothing more runs so that no \
                 call goes unrecorded. Free space (or fix the disk), then start a new session"
            )),
        }
    }

    /// After a call: when its receipt could not be saved, closes the gate and returns what
    /// to answer instead of the plain result (an error that says the receipt is missing,
    /// followed by the result, since the call ran).
    pub fn keep(&self, called: &Called) -> Option<String> {
        let e = called.saved.as_ref().err()?;
        let outcome = &called.outcome;
        let why = format!(
            "a receipt could not be written to {}: {}",
            e.path.display(),
            e.source
        );
        tracing::error!("{why}");
        let _ = self.failure.set(why.clone());
        Some(format!(
            "the call ran, but {why}. Nothing more runs in this session, so that no call goes \
             unrecorded: free space (or fix the disk), then start a new session. The call's \
             result{}:\n{}",
            if outcome.is_error { " (an error)" } else { "" },
            outcome.content
        ))
    }

    /// Why the gate closed, if it did (for the session's exit message).
    pub fn failure(&self) -> Option<String> {
        self.failure.get().cloned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use td_toolkit::call_path::{CallPath, InCallerTask};
    use td_toolkit::context::ToolContext;
    use td_toolkit::receipts::ReceiptLog;

    fn calls(dir: &std::path::Path, log: ReceiptLog) -> CallPath {
        let ctx = ToolContext::new(dir, "gate").unwrap();
        CallPath::new(
            Arc::new(ctx),
            Arc::new(td_tools::all_tools()),
            Arc::new(InCallerTask),
            Some(Arc::new(log)),
        )
    }

    #[tokio::test]
    async fn a_receipt_that_cannot_be_written_closes_the_gate() {
        let dir = tempfile::tempdir().unwrap();
        let log = ReceiptLog::open(&dir.path().join("receipts.jsonl")).unwrap();
        let called = calls(dir.path(), log)
            .call(None, "list_directory", serde_json::json!({}))
            .await;
        let gate = ReceiptGate::new();
        assert!(gate.admit().is_ok());
        assert_eq!(gate.keep(&called), None);
        assert_eq!(gate.failure(), None);

        // /dev/full answers every write with "no space left on device".
        let Ok(broken) = ReceiptLog::open(std::path::Path::new("/dev/full")) else {
            eprintln!("SKIPPED: no /dev/full here; the tmpfs tests cover a real full disk");
            return;
        };
        let called = calls(dir.path(), broken)
            .call(None, "list_directory", serde_json::json!({}))
            .await;
        let answer = gate.keep(&called).unwrap();
        assert!(answer.starts_with("the call ran, but a receipt could not be written to"));
        assert!(answer.ends_with(&called.outcome.content), "{answer}");
        let refusal = gate.admit().unwrap_err();
        assert!(
            refusal.starts_with("not run: a receipt could not be written"),
            "{refusal}"
        );
        assert!(gate.failure().unwrap().contains("/dev/full"));
        assert!(gate.failure().unwrap().contains("No space left"));
    }
}
