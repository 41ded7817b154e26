//! A call's receipt as the call leaves it: complete but for the parts that cost the most to
//! make — its id, the date of its `time` and the hashes of its input and (a small) output —,
//! which are made the first time it is read.
//!
//! A receipt is read when a receipt log writes it, which is right after the call for every
//! caller that keeps a log (a loop of a run, `tool exec`, MCP), and by callers that look at
//! it (the engine reads a validation's side effects, replay compares output hashes). A
//! caller that keeps no log and reads nothing of it (the merge queue's checks, the query
//! bench) does not pay for an id, a date and hashes that nobody would see: they were half of
//! a `query_loop` call's own cost (bench query).
//!
//! Made when read, the receipt is the one the call would have had made at its end: the input
//! and output were redacted when the call ended and the hashes cover that text; `time` is
//! when the call started (`td_base::time::wall_time_of` its monotonic start); the id is a
//! UUID v7 of that date and a process-wide counter ([`super::receipt_id`]), so ids still
//! sort in the order receipts are made. An output larger than [`LAZY_OUTPUT_HASH_MAX`] is
//! hashed when the call ends: to hash it later the receipt keeps a copy, which for a small
//! output costs a fraction of the hash, and for a large one would hold its memory.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use serde_json::Value;

use td_base::sync::lock;

use super::receipt_id::receipt_id;
use super::{Receipt, ShortText, SideEffect, hash_output, hash_value};

/// Largest output (bytes) whose hash is left to when the receipt is made.
pub const LAZY_OUTPUT_HASH_MAX: usize = 4 * 1024;

/// A call's receipt, read as a [`Receipt`] (`Deref`): made in full the first time it is read
/// (see the [module](self) docs).
///
/// Boxed: an outcome is moved through every layer of the call path (registry, lane, call
/// path, caller), and a receipt inline made each move a copy of several hundred bytes.
pub struct CallReceipt(Box<Cell>);

/// The receipt once made, and what makes it (taken when it is made).
struct Cell {
    made: OnceLock<Receipt>,
    draft: Mutex<Option<CallDraft>>,
}

/// What a call leaves for its receipt: the [`Receipt`]'s fields as the call ended, but for
/// the id, the date and the hashes, which are made from these.
pub(crate) struct CallDraft {
    /// The model's id for the call.
    pub call_id: Option<String>,
    /// The calling loop, shared with its context until the receipt is made.
    pub exec_id: Arc<str>,
    /// The tool's name (its own, not a copy, for a tool of the set).
    pub tool: Cow<'static, str>,
    /// The input, redacted (shared with the caller's copy when it held no secret).
    pub input: Arc<Value>,
    /// The full output, redacted: see [`DraftOutput::of`].
    pub output: DraftOutput,
    /// As [`Receipt::is_error`].
    pub is_error: bool,
    /// As [`Receipt::error_kind`].
    pub error_kind: Option<String>,
    /// As [`Receipt::output_bytes`].
    pub output_bytes: usize,
    /// As [`Receipt::output_capped`].
    pub output_capped: bool,
    /// As [`Receipt::latency_ms`].
    pub latency_ms: u64,
    /// As [`Receipt::latency_us`].
    pub latency_us: u64,
    /// As [`Receipt::side_effects`].
    pub side_effects: Vec<SideEffect>,
    /// As [`Receipt::commit`].
    pub commit: Option<String>,
    /// As [`Receipt::schema_valid`].
    pub schema_valid: Option<bool>,
    /// When the call started.
    pub started: Instant,
}

/// A call's full output, for its receipt's `output_hash`.
pub(crate) enum DraftOutput {
    /// A small output, kept to be hashed when the receipt is made.
    Kept(String),
    /// The hash of a large output, made when the call ended.
    Hashed(ShortText),
}

impl DraftOutput {
    /// The full (redacted, uncapped) `output` of a call that `is_error` or not: kept when it
    /// is small, else hashed now.
    pub(crate) fn of(output: &str, is_error: bool) -> Self {
        if output.len() <= LAZY_OUTPUT_HASH_MAX {
            Self::Kept(output.to_string())
        } else {
            Self::Hashed(hash_output(output, is_error))
        }
    }
}

impl CallReceipt {
    /// The receipt `draft` makes when it is first read.
    pub(crate) fn new(draft: CallDraft) -> Self {
        Self(Box::new(Cell {
            made: OnceLock::new(),
            draft: Mutex::new(Some(draft)),
        }))
    }

    /// Whether it was made already (read, or written to a log).
    pub fn is_made(&self) -> bool {
        self.0.made.get().is_some()
    }

    /// The receipt, made if it was not yet.
    pub fn into_receipt(self) -> Receipt {
        let Cell { made, draft } = *self.0;
        match made.into_inner() {
            Some(receipt) => receipt,
            None => make(draft.into_inner().unwrap_or_else(|e| e.into_inner())),
        }
    }
}

/// Makes the receipt of `draft` (`None` only for a cell whose receipt was made already,
/// which is never made again: an empty receipt, so that nothing here can panic).
fn make(draft: Option<CallDraft>) -> Receipt {
    let Some(d) = draft else {
        return empty();
    };
    let output_hash = match d.output {
        DraftOutput::Kept(output) => hash_output(&output, d.is_error),
        DraftOutput::Hashed(hash) => hash,
    };
    // One date for the id and `time`: when the call started, from the thread's pairing of
    // the two clocks (no clock read, in the common case).
    let started = td_base::time::wall_time_of(d.started);
    Receipt {
        id: receipt_id(started),
        call_id: d.call_id,
        exec_id: d.exec_id,
        tool: d.tool,
        input_hash: hash_value(&d.input),
        input: d.input,
        output_hash,
        is_error: d.is_error,
        error_kind: d.error_kind,
        output_bytes: d.output_bytes,
        output_capped: d.output_capped,
        latency_ms: d.latency_ms,
        latency_us: Some(d.latency_us),
        side_effects: d.side_effects,
        time: td_base::time::with_timestamp_at(started, |text: &str| ShortText::from(text)),
        commit: d.commit,
        schema_valid: d.schema_valid,
        seq: None,
        chain: None,
    }
}

impl std::ops::Deref for CallReceipt {
    type Target = Receipt;

    fn deref(&self) -> &Receipt {
        self.0.made.get_or_init(|| make(lock(&self.0.draft).take()))
    }
}

impl Clone for CallReceipt {
    fn clone(&self) -> Self {
        let made = OnceLock::new();
        let _ = made.set((**self).clone());
        Self(Box::new(Cell {
            made,
            draft: Mutex::new(None),
        }))
    }
}

impl std::fmt::Debug for CallReceipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// The receipt of no call (see [`make`]).
fn empty() -> Receipt {
    Receipt {
        id: ShortText::default(),
        call_id: None,
        exec_id: Arc::from(""),
        tool: Cow::Borrowed(""),
        input: Arc::new(Value::Null),
        input_hash: ShortText::default(),
        output_hash: ShortText::default(),
        is_error: false,
        error_kind: None,
        output_bytes: 0,
        output_capped: false,
        latency_ms: 0,
        latency_us: None,
        side_effects: Vec::new(),
        time: ShortText::default(),
        commit: None,
        schema_valid: None,
        seq: None,
        chain: None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use serde_json::json;

    use super::*;
    use crate::receipts::test_receipt;

    /// What the call of `test_receipt(n)` leaves, started at `started`, with `output`.
    fn draft(n: usize, started: Instant, output: &str, is_error: bool) -> CallDraft {
        let r = test_receipt(n);
        CallDraft {
            call_id: r.call_id,
            exec_id: r.exec_id,
            tool: Cow::Borrowed("run_command"),
            input: r.input,
            output: DraftOutput::of(output, is_error),
            is_error,
            error_kind: r.error_kind,
            output_bytes: r.output_bytes,
            output_capped: r.output_capped,
            latency_ms: r.latency_ms,
            latency_us: r.latency_us.unwrap_or_default(),
            side_effects: r.side_effects,
            commit: r.commit,
            schema_valid: r.schema_valid,
            started,
        }
    }

    /// The date of the time `ago` before now.
    fn date_ago(ago: Duration) -> String {
        td_base::time::timestamp_at(SystemTime::now() - ago)
    }

    #[test]
    fn made_once_when_first_read_with_the_start_time_and_the_hashes() {
        let complete = test_receipt(7);
        let ago = Duration::from_secs(5);
        // Read before the start: the start's date is not before it.
        let earliest = date_ago(ago);
        let started = Instant::now().checked_sub(ago).unwrap();
        let receipt = CallReceipt::new(draft(7, started, "", false));
        assert!(!receipt.is_made());
        assert_eq!(*receipt.input, json!({"command": "echo 7"}), "read through");
        let latest = date_ago(ago);
        assert!(receipt.is_made());
        // When the call started, though it is written later.
        assert!(
            earliest.as_str() <= receipt.time.as_str() && receipt.time.as_str() <= latest.as_str(),
            "{earliest} <= {} <= {latest}",
            receipt.time
        );
        let id = uuid::Uuid::parse_str(&receipt.id).unwrap();
        assert_eq!(id.get_version_num(), 7);
        // Every other field as the call left it, the hashes as if made at its end.
        let expected = Receipt {
            id: receipt.id.clone(),
            time: receipt.time.clone(),
            ..complete
        };
        assert_eq!(*receipt, expected);
        // Read again (or cloned): the same receipt, not a second one.
        assert_eq!(*receipt, expected);
        assert_eq!(*receipt.clone(), expected);
        assert_eq!(receipt.into_receipt(), expected);
        let unread = CallReceipt::new(draft(7, started, "", false)).into_receipt();
        assert_eq!(unread.input_hash, expected.input_hash);
        assert_eq!(unread.output_hash, expected.output_hash);
        assert!(
            earliest.as_str() <= unread.time.as_str()
                && unread.time.as_str() <= date_ago(ago).as_str()
        );
    }

    #[test]
    fn outputs_large_and_small_are_hashed_alike() {
        for (len, is_error) in [
            (0, false),
            (LAZY_OUTPUT_HASH_MAX, true),
            (LAZY_OUTPUT_HASH_MAX + 1, false),
        ] {
            let output = "é\n".repeat(len / 3) + &"x".repeat(len % 3);
            assert_eq!(output.len(), len);
            let receipt = CallReceipt::new(draft(1, Instant::now(), &output, is_error));
            assert_eq!(receipt.output_hash, hash_output(&output, is_error), "{len}");
        }
    }

    #[test]
    fn ids_follow_the_order_receipts_are_made_in() {
        let make = || CallReceipt::new(draft(1, Instant::now(), "", false));
        let (a, b) = (make(), make());
        // `b` is read (written) first: its id sorts first.
        let (b_id, a_id) = (b.id.clone(), a.id.clone());
        assert!(b_id < a_id, "{b_id} then {a_id}");
    }
}
