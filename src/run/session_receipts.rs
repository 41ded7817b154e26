//! The receipt chain of a run: the run's key (`<run-dir>/receipt-chain.key`, made before the
//! first receipt, mode 0600, hidden from commands) and the session receipt each loop's record
//! closes with (`loops/<name>/RECEIPT.json`) when the loop ends — completed, failed, blocked
//! or stopped.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::run::record::LoopSummary;
use td_base::sync::lock;
use td_toolkit::receipts::chain::{ChainKey, RUN_KEY_FILE};
use td_toolkit::receipts::session::{
    SESSION_RECEIPT_FILE, SessionEnd, SessionReceipt, SessionValidation,
};
use td_toolkit::receipts::{LogTally, ReceiptLog};

/// A run's chain key and which loops' session receipts this process wrote.
pub struct RunChain {
    dir: PathBuf,
    key: Mutex<Option<Arc<ChainKey>>>,
    closed: Mutex<HashSet<String>>,
}

impl RunChain {
    /// The chain of the run recorded in `dir`.
    pub fn new(dir: &Path) -> Self {
        RunChain {
            dir: dir.to_path_buf(),
            key: Mutex::new(None),
            closed: Mutex::new(HashSet::new()),
        }
    }

    /// Where the key is kept.
    pub fn key_path(&self) -> PathBuf {
        self.dir.join(RUN_KEY_FILE)
    }

    /// The run's key: read from the run directory, or made there (a new run, or a run
    /// recorded before chains) the first time it is asked for.
    pub fn key(&self) -> Result<Arc<ChainKey>, String> {
        let mut slot = lock(&self.key);
        if let Some(key) = slot.as_ref() {
            return Ok(key.clone());
        }
        let key = Arc::new(ChainKey::load_or_create(&self.key_path()).map_err(|e| e.to_string())?);
        *slot = Some(key.clone());
        Ok(key)
    }

    /// Whether this process already wrote the session receipt of `name`.
    pub fn is_closed(&self, name: &str) -> bool {
        lock(&self.closed).contains(name)
    }

    /// Writes `loops/<name>/RECEIPT.json` for the loop summed up by `summary`, whose log
    /// holds what `tally` counts.
    pub fn close(
        &self,
        run_id: &str,
        loop_dir: &Path,
        summary: &LoopSummary,
        tally: &LogTally,
        tool_set: Option<Vec<String>>,
    ) -> Result<(), String> {
        let key = self.key()?;
        let end = SessionEnd {
            session_id: format!("{run_id}/{}", summary.name),
            exec_id: summary.name.clone(),
            status: summary.status.as_str().to_string(),
            reason: summary.reason.clone(),
            validation: summary.validation.map(|v| SessionValidation {
                exit_code: v.exit_code,
                passed: v.passed,
            }),
            tool_set,
        };
        std::fs::create_dir_all(loop_dir)
            .map_err(|e| format!("cannot create {}: {e}", loop_dir.display()))?;
        SessionReceipt::from_tally(end, tally)
            .write(&loop_dir.join(SESSION_RECEIPT_FILE), &key)
            .map_err(|e| e.to_string())?;
        lock(&self.closed).insert(summary.name.clone());
        Ok(())
    }
}

/// The tools of a loop, as its open log was told (`None`: the loop never ran here).
pub fn tool_set_of(open: Option<&Arc<ReceiptLog>>) -> Option<Vec<String>> {
    open.and_then(|log| log.tool_set())
}

/// The tally of a loop's log: from the open log when there is one, else read from the file
/// (a loop that ended in an earlier process), else empty (a loop that never ran).
pub fn tally_for(
    open: Option<&Arc<ReceiptLog>>,
    path: &Path,
    key: Arc<ChainKey>,
) -> Result<LogTally, String> {
    if let Some(log) = open {
        return Ok(log.tally());
    }
    if !path.exists() {
        return Ok(LogTally::default());
    }
    ReceiptLog::open_chained(path, key)
        .map(|log| log.tally())
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}
