//! The session receipt (`RECEIPT.json`, after the dsrs tool spec's `SessionReceipt`): what
//! one loop (or one `tool exec` / `mcp` session) did, written when it ends — its tool
//! receipts by id, the chain's head and length, total latency, every side effect, the
//! validation result and per-tool counts — sealed with the chain key.
//!
//! The log says what each call did; the session receipt says where the log ended. Dropping
//! receipts from the end of a log leaves a shorter chain that still verifies link by link;
//! the session receipt's `chain_seq` and `chain_head` catch it, and its `mac` (HMAC-SHA256 with
//! the chain key) keeps it from being rewritten to match.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chain::{ChainKey, replace_file};
use super::{LogTally, SideEffect, ToolCounts, canonical_json};

/// The file name of a loop's session receipt, beside its `receipts.jsonl`.
pub const SESSION_RECEIPT_FILE: &str = "RECEIPT.json";

/// The format version written into session receipts.
pub const SESSION_RECEIPT_VERSION: u32 = 1;

/// A session receipt larger than this is not read (one id and a few side effects per call
/// make a long loop's receipt a few MB at most).
const MAX_SESSION_RECEIPT_BYTES: u64 = 256 << 20;

/// Why a session receipt could not be written or read; each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum SessionReceiptError {
    /// The receipt could not be turned into JSON.
    #[error("cannot serialize a session receipt: {0}")]
    Serialize(#[source] serde_json::Error),
    /// The receipt did not serialize to a JSON object.
    #[error("a session receipt is not a JSON object")]
    NotAnObject,
    /// The file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The session receipt file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file could not be opened or read.
    #[error("cannot read the session receipt {}: {source}", path.display())]
    Unreadable {
        /// The session receipt file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is larger than any session receipt.
    #[error(
        "{} is over {} MiB: not a session receipt",
        path.display(),
        MAX_SESSION_RECEIPT_BYTES >> 20
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a session receipt's JSON.
    #[error("{} is not a session receipt: {source}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What the JSON reader said.
        source: serde_json::Error,
    },
}

/// The last validation of a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionValidation {
    /// Exit code (`None`: killed, timed out, or no command ran).
    pub exit_code: Option<i32>,
    /// Whether it passed.
    pub passed: bool,
}

/// The content of `RECEIPT.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionReceipt {
    /// Format version ([`SESSION_RECEIPT_VERSION`]).
    pub version: u32,
    /// `<run-id>/<loop>` for a loop of a run; a fresh id for a `tool exec` / `mcp` session.
    pub session_id: String,
    /// The loop's exec id (its name), or the session's `--exec-id`.
    pub exec_id: String,
    /// How it ended: completed, failed, blocked, stopped (a loop), or ended (a session).
    pub status: String,
    /// Why it failed, was blocked or was stopped.
    #[serde(default)]
    pub reason: Option<String>,
    /// When it ended (RFC 3339, UTC).
    pub ended_at: String,
    /// The ids of its tool receipts, in log order.
    pub tool_receipts: Vec<String>,
    /// How many receipts the log holds.
    pub receipt_count: u64,
    /// `seq` of the log's last chained receipt (0: none).
    pub chain_seq: u64,
    /// Chain value of that receipt (the chain's genesis value when there is none).
    pub chain_head: String,
    /// Sum of the calls' latencies.
    pub total_latency_ms: u64,
    /// Every file written and command run, in call order.
    pub side_effects: Vec<SideEffect>,
    /// The loop's last validation, when it ran one.
    pub validation: Option<SessionValidation>,
    /// Calls, errors and schema refusals per tool.
    pub tools: BTreeMap<String, ToolCounts>,
    /// The tools the session could call, in order: `replay verify` replays with the same
    /// set (a call of a tool outside it is answered with the list of those in it).
    #[serde(default)]
    pub tool_set: Option<Vec<String>>,
    /// HMAC-SHA256 (chain key) of the canonical JSON of everything above.
    #[serde(default)]
    pub mac: Option<String>,
}

/// What a session is and how it ended, for [`SessionReceipt::from_tally`].
#[derive(Debug, Clone)]
pub struct SessionEnd {
    /// See [`SessionReceipt::session_id`].
    pub session_id: String,
    /// See [`SessionReceipt::exec_id`].
    pub exec_id: String,
    /// See [`SessionReceipt::status`].
    pub status: String,
    /// See [`SessionReceipt::reason`].
    pub reason: Option<String>,
    /// See [`SessionReceipt::validation`].
    pub validation: Option<SessionValidation>,
    /// See [`SessionReceipt::tool_set`].
    pub tool_set: Option<Vec<String>>,
}

impl SessionReceipt {
    /// The session receipt of a session that ended as `end` says, after writing what
    /// `tally` counted.
    pub fn from_tally(end: SessionEnd, tally: &LogTally) -> Self {
        SessionReceipt {
            version: SESSION_RECEIPT_VERSION,
            session_id: end.session_id,
            exec_id: end.exec_id,
            status: end.status,
            reason: end.reason,
            ended_at: td_base::time::timestamp_now(),
            tool_receipts: tally.ids.clone(),
            receipt_count: tally.receipts,
            chain_seq: tally.seq,
            chain_head: tally.head.clone(),
            total_latency_ms: tally.total_latency_ms,
            side_effects: tally.side_effects.clone(),
            validation: end.validation,
            tools: tally.tools.clone(),
            tool_set: end.tool_set,
            mac: None,
        }
    }

    /// Seals the receipt with `key` and writes it to `path` atomically (temporary file,
    /// fsync, rename, fsync of the directory). Secrets are redacted before the seal, so the
    /// seal covers what is on disk.
    pub fn write(&self, path: &Path, key: &ChainKey) -> Result<(), SessionReceiptError> {
        let mut value = serde_json::to_value(self).map_err(SessionReceiptError::Serialize)?;
        td_base::secrets::redact_value(&mut value);
        let object = value
            .as_object_mut()
            .ok_or(SessionReceiptError::NotAnObject)?;
        object.remove("mac");
        let mac = key.seal_session(&canonical_json(&value));
        if let Some(object) = value.as_object_mut() {
            object.insert("mac".into(), Value::String(mac));
        }
        let mut text =
            serde_json::to_string_pretty(&value).map_err(SessionReceiptError::Serialize)?;
        text.push('\n');
        replace_file(path, text.as_bytes()).map_err(|source| SessionReceiptError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// A session receipt as read back.
#[derive(Debug, Clone)]
pub struct SessionRead {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its content.
    pub receipt: SessionReceipt,
    /// Whether its `mac` verifies (`None`: no key to check it with).
    pub authentic: Option<bool>,
}

/// Reads the session receipt at `path` and checks its seal with `key`.
pub fn read_session(
    path: &Path,
    key: Option<&ChainKey>,
) -> Result<SessionRead, SessionReceiptError> {
    let unreadable = |source| SessionReceiptError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let malformed = |source| SessionReceiptError::Malformed {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_SESSION_RECEIPT_BYTES.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_SESSION_RECEIPT_BYTES {
        return Err(SessionReceiptError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let mut value: Value = serde_json::from_slice(&bytes).map_err(malformed)?;
    let receipt: SessionReceipt = serde_json::from_value(value.clone()).map_err(malformed)?;
    let authentic = key.map(|key| {
        let mac = receipt.mac.clone().unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            object.remove("mac");
        }
        key.verifies_session(&canonical_json(&value), &mac)
    });
    Ok(SessionRead {
        path: path.to_path_buf(),
        receipt,
        authentic,
    })
}

/// Where `tool exec` / `mcp` write the session receipt of the log `log`: `LOG.RECEIPT.json`.
pub fn session_path_for_log(log: &Path) -> PathBuf {
    let mut name = log.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(SESSION_RECEIPT_FILE);
    log.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end() -> SessionEnd {
        SessionEnd {
            session_id: "r/a".into(),
            exec_id: "a".into(),
            status: "completed".into(),
            reason: None,
            validation: Some(SessionValidation {
                exit_code: Some(0),
                passed: true,
            }),
            tool_set: Some(vec!["read_file".into()]),
        }
    }

    #[test]
    fn a_written_session_receipt_reads_back_sealed_and_an_edit_breaks_the_seal() {
        let dir = tempfile::tempdir().unwrap();
        let key = ChainKey::from_bytes([3; 32], dir.path().join("k"));
        let tally = LogTally {
            receipts: 2,
            seq: 2,
            ids: vec!["x".into(), "y".into()],
            ..LogTally::default()
        };
        let path = dir.path().join(SESSION_RECEIPT_FILE);
        SessionReceipt::from_tally(end(), &tally)
            .write(&path, &key)
            .unwrap();
        let read = read_session(&path, Some(&key)).unwrap();
        assert_eq!(read.authentic, Some(true));
        assert_eq!(read.receipt.chain_seq, 2);
        assert_eq!(read.receipt.tool_receipts, ["x", "y"]);
        assert_eq!(read_session(&path, None).unwrap().authentic, None);

        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"chain_seq\": 2", "\"chain_seq\": 1")).unwrap();
        assert_eq!(
            read_session(&path, Some(&key)).unwrap().authentic,
            Some(false)
        );
        let other = ChainKey::from_bytes([4; 32], dir.path().join("k2"));
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            read_session(&path, Some(&other)).unwrap().authentic,
            Some(false)
        );
        std::fs::write(&path, "{").unwrap();
        let err = read_session(&path, Some(&key)).unwrap_err();
        assert!(
            matches!(err, SessionReceiptError::Malformed { .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("is not a session receipt: "),
            "{err}"
        );
        let err = read_session(&dir.path().join("missing"), Some(&key)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read the session receipt "),
            "{err}"
        );
        let err = SessionReceipt::from_tally(end(), &tally)
            .write(&dir.path().join("no-such-dir/RECEIPT.json"), &key)
            .unwrap_err();
        assert!(matches!(err, SessionReceiptError::Write { .. }), "{err}");
        assert!(err.to_string().starts_with("cannot write "), "{err}");
    }

    #[test]
    fn exec_session_receipts_sit_beside_their_log() {
        assert_eq!(
            session_path_for_log(Path::new("/l/receipts.jsonl")),
            Path::new("/l/receipts.jsonl.RECEIPT.json")
        );
    }
}
