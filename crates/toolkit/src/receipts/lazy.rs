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
//! when the call started, the wall clock now less the monotonic time since the start (the
//! same reading unless the wall clock was set in between); the id is a UUID v7 drawn when
//! the receipt is made, so ids still sort in the order receipts are written. The output is hashed when the call ends when it is larger than
//! [`LAZY_OUTPUT_HASH_MAX`]: to hash it later the receipt keeps a copy of it, which for a
//! small output costs a fraction of the hash, and for a large one would hold its memory.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use serde_json::Value;

use td_base::sync::lock;

use super::{Receipt, hash_output, hash_value};

/// Largest output (bytes) whose hash is left to when the receipt is made.
pub const LAZY_OUTPUT_HASH_MAX: usize = 4 * 1024;

/// A call's receipt, read as a [`Receipt`] (`Deref`): made in full the first time it is read
/// (see the [module](self) docs).
///
/// Boxed: an outcome is moved through every layer of the call path (registry, lane, call
/// path, caller), and a receipt inline made each move a copy of several hundred bytes.
pub struct CallReceipt(Box<Cell>);

/// The receipt once made, and what makes it.
struct Cell {
    made: OnceLock<Receipt>,
    draft: Mutex<Draft>,
}

/// A receipt with its id, date and hashes still to make.
struct Draft {
    /// Every field but `id`, `time`, `input_hash`, `exec_id`, `tool` and (when `output` is
    /// kept) `output_hash`, which are empty.
    receipt: Receipt,
    /// The calling loop, shared with its context until the receipt is made.
    exec_id: Arc<str>,
    /// The tool's name (its own, for a tool of the set).
    tool: Cow<'static, str>,
    /// When the call started.
    started: Instant,
    /// The full output, when it is hashed with the receipt.
    output: Option<String>,
}

/// Who made a call, for its receipt: the loop and the tool's name.
pub(crate) struct Caller {
    /// The loop (its context's shared exec id).
    pub exec_id: Arc<str>,
    /// The tool, as named by its set when it is one (no copy), else as called.
    pub tool: Cow<'static, str>,
}

impl CallReceipt {
    /// The receipt of `caller`'s call that started at `started` and whose full (redacted,
    /// uncapped) output is `output`, from one whose `id`, `time`, `exec_id`, `tool`,
    /// `input_hash` and `output_hash` are left to make (whatever they hold is replaced). A
    /// small output is copied to be hashed when the receipt is made, a larger one is hashed
    /// now.
    pub(crate) fn new(
        mut receipt: Receipt,
        caller: Caller,
        started: Instant,
        output: &str,
    ) -> Self {
        let output = if output.len() <= LAZY_OUTPUT_HASH_MAX {
            Some(output.to_string())
        } else {
            receipt.output_hash = hash_output(output, receipt.is_error);
            None
        };
        Self(Box::new(Cell {
            made: OnceLock::new(),
            draft: Mutex::new(Draft {
                receipt,
                exec_id: caller.exec_id,
                tool: caller.tool,
                started,
                output,
            }),
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
            None => make(&mut draft.into_inner().unwrap_or_else(|e| e.into_inner())),
        }
    }
}

/// Makes the receipt of `draft`: its parts are computed first, so that nothing is taken out
/// of the draft unless the receipt can be completed.
fn make(draft: &mut Draft) -> Receipt {
    let id = uuid::Uuid::now_v7().to_string();
    let time = td_base::time::timestamp_at(wall_time_of(draft.started));
    let input_hash = hash_value(&draft.receipt.input);
    let output_hash = draft
        .output
        .as_deref()
        .map(|output| hash_output(output, draft.receipt.is_error));
    let mut receipt = std::mem::replace(&mut draft.receipt, empty());
    receipt.id = id;
    receipt.time = time;
    receipt.input_hash = input_hash;
    receipt.exec_id = draft.exec_id.to_string();
    receipt.tool = std::mem::take(&mut draft.tool).into_owned();
    if let Some(hash) = output_hash {
        receipt.output_hash = hash;
    }
    receipt
}

/// When `started` was on the wall clock: now, less the time since.
fn wall_time_of(started: Instant) -> SystemTime {
    let now = SystemTime::now();
    now.checked_sub(started.elapsed()).unwrap_or(now)
}

impl std::ops::Deref for CallReceipt {
    type Target = Receipt;

    fn deref(&self) -> &Receipt {
        self.0.made.get_or_init(|| make(&mut lock(&self.0.draft)))
    }
}

impl Clone for CallReceipt {
    fn clone(&self) -> Self {
        let made = OnceLock::new();
        let _ = made.set((**self).clone());
        Self(Box::new(Cell {
            made,
            draft: Mutex::new(Draft {
                receipt: empty(),
                exec_id: Arc::from(""),
                tool: Cow::Borrowed(""),
                started: Instant::now(),
                output: None,
            }),
        }))
    }
}

impl std::fmt::Debug for CallReceipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// What a made receipt leaves in its draft: nothing (no field allocates).
fn empty() -> Receipt {
    Receipt {
        id: String::new(),
        call_id: None,
        exec_id: String::new(),
        tool: String::new(),
        input: Value::Null,
        input_hash: String::new(),
        output_hash: String::new(),
        is_error: false,
        error_kind: None,
        output_bytes: 0,
        output_capped: false,
        latency_ms: 0,
        side_effects: Vec::new(),
        time: String::new(),
        commit: None,
        schema_valid: None,
        seq: None,
        chain: None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::receipts::test_receipt;

    /// `test_receipt(n)` as a call leaves it, with its output `""`: the parts still to make
    /// hold junk.
    fn draft(n: usize) -> Receipt {
        Receipt {
            id: "x".into(),
            time: "y".into(),
            input_hash: "z".into(),
            output_hash: "w".into(),
            exec_id: "v".into(),
            tool: "u".into(),
            ..test_receipt(n)
        }
    }

    /// `test_receipt`'s caller: loop `e`, tool `run_command`.
    fn caller() -> Caller {
        Caller {
            exec_id: Arc::from("e"),
            tool: Cow::Borrowed("run_command"),
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
        let started = Instant::now().checked_sub(ago).unwrap();
        let receipt = CallReceipt::new(draft(7), caller(), started, "");
        assert!(!receipt.is_made());
        let earliest = date_ago(ago);
        assert_eq!(receipt.input, json!({"command": "echo 7"}), "read through");
        let latest = date_ago(ago);
        assert!(receipt.is_made());
        // When the call started, though it is written later.
        assert!(
            earliest <= receipt.time && receipt.time <= latest,
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
        let earliest = date_ago(ago);
        let unread = CallReceipt::new(draft(7), caller(), started, "").into_receipt();
        assert_eq!(unread.input_hash, expected.input_hash);
        assert_eq!(unread.output_hash, expected.output_hash);
        assert!(earliest <= unread.time && unread.time <= date_ago(ago));
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
            let receipt = CallReceipt::new(
                Receipt {
                    is_error,
                    ..draft(1)
                },
                caller(),
                Instant::now(),
                &output,
            );
            assert_eq!(receipt.output_hash, hash_output(&output, is_error), "{len}");
        }
    }

    #[test]
    fn ids_follow_the_order_receipts_are_made_in() {
        let make = || CallReceipt::new(draft(1), caller(), Instant::now(), "");
        let (a, b) = (make(), make());
        // `b` is read (written) first: its id sorts first.
        let (b_id, a_id) = (b.id.clone(), a.id.clone());
        assert!(b_id < a_id, "{b_id} then {a_id}");
    }
}
