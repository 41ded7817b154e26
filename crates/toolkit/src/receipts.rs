//! Receipts: one JSON line per tool call — who called what with which input, the hash of
//! the full output, latency, side effects, time and worktree commit — appended to a log that
//! `taskdaemon replay verify` can read back and re-run.
//!
//! A log opened with a chain key ([`ReceiptLog::open_chained`]) numbers its receipts and
//! links each to the one before it ([`chain`]), keeps a tally of what it wrote (for the
//! session receipt, [`session`], and the per-tool counts of `summary.json`), and [`check`]
//! finds every receipt of such a log that was edited, inserted, dropped or moved.

pub mod chain;
pub mod check;
mod lazy;
mod receipt_id;
pub mod session;
mod short_text;

pub use lazy::CallReceipt;
pub(crate) use lazy::{CallDraft, DraftOutput};
pub use short_text::ShortText;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use td_base::jsonl::{self, JsonlRead};
use td_base::sync::lock;

/// Something a call did beyond returning text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SideEffect {
    /// A file was written; `hash` is the SHA-256 of its new content.
    FileWritten {
        /// Worktree-relative path.
        path: String,
        /// SHA-256 of the bytes written.
        hash: String,
    },
    /// A command ran.
    CommandRun {
        /// The command line.
        command: String,
        /// Its exit code (`None` when killed by a signal or a timeout).
        exit_code: Option<i32>,
        /// Whether the timeout killed it.
        timed_out: bool,
    },
}

/// The record of one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    /// Unique id (UUID v7, so ids sort by time).
    pub id: ShortText,
    /// The model's id for the call, when it gave one.
    pub call_id: Option<String>,
    /// The loop (exec id) that made the call (shared with its context, not copied per call).
    pub exec_id: Arc<str>,
    /// Tool name (a built-in tool's without a copy).
    pub tool: Cow<'static, str>,
    /// The full input, so the call can be replayed (shared with the call's caller, whose
    /// conversation holds the same input).
    pub input: Arc<Value>,
    /// `sha256:` of the canonical JSON of `input`.
    pub input_hash: ShortText,
    /// `sha256:` of the full output (content and error flag), before any cap.
    pub output_hash: ShortText,
    /// Whether the model saw an error.
    pub is_error: bool,
    /// Error kind when the call failed before producing output.
    pub error_kind: Option<String>,
    /// Size of the full output in bytes.
    pub output_bytes: usize,
    /// Whether the model saw a capped version.
    pub output_capped: bool,
    /// Wall time of the call.
    pub latency_ms: u64,
    /// Wall time of the call in microseconds (`latency_ms` reads 0 for the many calls that
    /// take less than a millisecond); `None` in receipts written before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<u64>,
    /// Files written and commands run.
    pub side_effects: Vec<SideEffect>,
    /// When the call started (RFC 3339, UTC).
    pub time: ShortText,
    /// HEAD of the worktree when the call ran, if it is a git checkout.
    pub commit: Option<String>,
    /// Whether the input passed the tool's JSON Schema (the dsrs ToolParamsSchemaMetric:
    /// `false` also for a tool the set does not have); `None` when unknown (a call whose
    /// worker died, or a receipt from before this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_valid: Option<bool>,
    /// Position in a chained log (1, 2, ...), set by [`ReceiptLog::append`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// The chain value ([`chain`]), set by [`ReceiptLog::append`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
}

/// How one tool was called in a session: what `summary.json` and `RECEIPT.json` count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolCounts {
    /// Calls.
    pub calls: u64,
    /// Calls whose result was an error.
    pub errors: u64,
    /// Calls whose input the tool's schema refused (the tool never ran), and calls of a tool
    /// the loop does not have.
    pub schema_refused: u64,
}

/// The key calls of tools a set does not have are counted under: one entry, whatever names
/// a model makes up, so the counts stay small.
pub const UNKNOWN_TOOL_KEY: &str = "(unknown tool)";

impl ToolCounts {
    /// Counts `receipt` in.
    pub fn add(&mut self, receipt: &Receipt) {
        self.calls = self.calls.saturating_add(1);
        if receipt.is_error {
            self.errors = self.errors.saturating_add(1);
        }
        if receipt.schema_valid == Some(false) {
            self.schema_refused = self.schema_refused.saturating_add(1);
        }
    }

    /// The tool name `receipt` is counted under.
    pub fn key(receipt: &Receipt) -> &str {
        if receipt.error_kind.as_deref() == Some("unknown_tool") {
            UNKNOWN_TOOL_KEY
        } else {
            &receipt.tool
        }
    }
}

/// What a log holds, kept up to date as receipts are appended: the chain's head and every
/// receipt by id, for the session receipt, and per-tool counts.
#[derive(Debug, Clone, PartialEq)]
pub struct LogTally {
    /// Receipts in the log.
    pub receipts: u64,
    /// `seq` of the last chained receipt (0: none yet).
    pub seq: u64,
    /// Chain value of the last chained receipt ([`chain::GENESIS`] when none).
    pub head: String,
    /// Receipt ids in log order.
    pub ids: Vec<String>,
    /// Sum of the receipts' latencies.
    pub total_latency_ms: u64,
    /// Every side effect, in log order.
    pub side_effects: Vec<SideEffect>,
    /// Per tool ([`ToolCounts::key`]).
    pub tools: BTreeMap<String, ToolCounts>,
}

impl Default for LogTally {
    fn default() -> Self {
        LogTally {
            receipts: 0,
            seq: 0,
            head: chain::GENESIS.to_string(),
            ids: Vec::new(),
            total_latency_ms: 0,
            side_effects: Vec::new(),
            tools: BTreeMap::new(),
        }
    }
}

impl LogTally {
    fn add(&mut self, receipt: &Receipt) {
        self.receipts = self.receipts.saturating_add(1);
        self.ids.push(receipt.id.to_string());
        self.total_latency_ms = self.total_latency_ms.saturating_add(receipt.latency_ms);
        self.side_effects
            .extend(receipt.side_effects.iter().cloned());
        self.tools
            .entry(ToolCounts::key(receipt).to_string())
            .or_default()
            .add(receipt);
        if let (Some(seq), Some(chain)) = (receipt.seq, &receipt.chain) {
            self.seq = seq;
            self.head = chain.clone();
        }
    }
}

/// Serializes `value` with object keys sorted at every level, so equal values hash equally
/// whatever order their keys arrived in.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail, and every `Value` serializes.
    let _ = write_sorted(value, &mut out);
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Writes the canonical JSON of `v` to `out`, streaming: hashing a receipt's input and
/// output this way costs no copy of either (an output may be a megabyte of build log).
fn write_sorted<W: std::io::Write>(v: &Value, out: &mut W) -> std::io::Result<()> {
    // serde_json may preserve insertion order (feature unification), so the keys are
    // written in sorted order here rather than trusting the map type. Strings and scalars
    // are written by serde_json, exactly as `Value::to_string` writes them.
    match v {
        Value::Object(m) => {
            out.write_all(b"{")?;
            // Without `preserve_order` the map is sorted already: no list of keys to make.
            if m.keys().is_sorted() {
                for (i, (k, item)) in m.iter().enumerate() {
                    write_member(i, k, item, out)?;
                }
            } else {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                for (i, k) in keys.iter().enumerate() {
                    write_member(i, k, &m[k.as_str()], out)?;
                }
            }
            out.write_all(b"}")
        }
        Value::Array(a) => {
            out.write_all(b"[")?;
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_sorted(x, out)?;
            }
            out.write_all(b"]")
        }
        Value::String(s) => write_str(s, out),
        other => Ok(serde_json::to_writer(&mut *out, other)?),
    }
}

/// The `i`th member `"key":value` of an object, in canonical JSON.
fn write_member<W: std::io::Write>(
    i: usize,
    key: &str,
    item: &Value,
    out: &mut W,
) -> std::io::Result<()> {
    if i > 0 {
        out.write_all(b",")?;
    }
    write_str(key, out)?;
    out.write_all(b":")?;
    write_sorted(item, out)
}

/// Writes `s` as a JSON string, byte for byte as serde_json writes it: `"` and `\` escaped
/// with a backslash, the control characters below U+0020 as `\b`, `\t`, `\n`, `\f`, `\r` or
/// `\u00xx` (lowercase hex), everything else as it is. Runs without escapes are written in
/// one piece (keys and most values are one run).
fn write_str<W: std::io::Write>(s: &str, out: &mut W) -> std::io::Result<()> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.write_all(b"\"")?;
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape = ESCAPE[usize::from(b)];
        if escape == 0 {
            continue;
        }
        out.write_all(&bytes[start..i])?;
        if escape == b'u' {
            let hex = [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]];
            out.write_all(&[b'\\', b'u', b'0', b'0', hex[0], hex[1]])?;
        } else {
            out.write_all(&[b'\\', escape])?;
        }
        start = i + 1;
    }
    out.write_all(&bytes[start..])?;
    out.write_all(b"\"")
}

/// For each byte, what follows the backslash of its escape in a JSON string as serde_json
/// writes it (`u` for `\u00xx`), or 0 when it is written as it is.
const ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// A SHA-256 that canonical JSON is written into. Canonical writing makes many small
/// writes (a brace, a quote, a key, a colon...), and each `Sha256::update` costs a few
/// nanoseconds of its own whatever its length: a receipt's input hash was half overhead. The
/// writes are gathered here and given to the hash a buffer at a time.
struct HashWriter {
    hash: Sha256,
    buffer: [u8; HASH_BUFFER],
    filled: usize,
}

/// Bytes [`HashWriter`] gathers before it updates the hash (two SHA-256 blocks: a
/// receipt's input is usually shorter).
const HASH_BUFFER: usize = 128;

impl HashWriter {
    fn new() -> Self {
        Self {
            hash: Sha256::new(),
            buffer: [0; HASH_BUFFER],
            filled: 0,
        }
    }

    /// Adds `bytes` to what is hashed.
    fn add(&mut self, bytes: &[u8]) {
        let end = self.filled + bytes.len();
        if let Some(room) = self.buffer.get_mut(self.filled..end) {
            room.copy_from_slice(bytes);
            self.filled = end;
            return;
        }
        self.drain();
        if bytes.len() >= HASH_BUFFER {
            self.hash.update(bytes);
        } else {
            self.buffer[..bytes.len()].copy_from_slice(bytes);
            self.filled = bytes.len();
        }
    }

    /// Gives the gathered bytes to the hash.
    fn drain(&mut self) {
        self.hash.update(&self.buffer[..self.filled]);
        self.filled = 0;
    }

    /// `sha256:<lowercase hex>` of what was written. By reference: the writer is a few
    /// hundred bytes, and moving it into a by-value `finish` was a tenth of a short hash.
    fn finish(&mut self) -> ShortText {
        self.drain();
        let mut text = *b"sha256:0000000000000000000000000000000000000000000000000000000000000000";
        let digest = self.hash.finalize_reset();
        for (pair, byte) in text[7..].chunks_exact_mut(2).zip(digest.iter()) {
            pair.copy_from_slice(&HEX_PAIRS[usize::from(*byte)]);
        }
        // ASCII throughout, so never the empty fallback.
        ShortText::from(std::str::from_utf8(&text).unwrap_or_default())
    }
}

/// The two lowercase hex digits of each byte: a hash's 32 bytes are written with one table
/// read each (the `hex` crate's loop was a tenth of making a receipt, bench query).
const HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [DIGITS[byte >> 4], DIGITS[byte & 0x0F]];
        byte += 1;
    }
    pairs
};

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.add(bytes);
        Ok(bytes.len())
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.add(bytes);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `sha256:<hex>` of the canonical JSON of `value`.
pub fn hash_value(value: &Value) -> ShortText {
    let mut hasher = HashWriter::new();
    // Writing to a hasher cannot fail, and every `Value` serializes.
    let _ = write_sorted(value, &mut hasher);
    hasher.finish()
}

/// `sha256:<hex>` of a call's full output: of the canonical JSON of
/// `{"content": content, "is_error": is_error}`, written straight into the hash.
pub fn hash_output(content: &str, is_error: bool) -> ShortText {
    let mut hasher = HashWriter::new();
    hasher.add(b"{\"content\":");
    // Writing to a hasher cannot fail.
    let _ = write_str(content, &mut hasher);
    hasher.add(if is_error {
        &b",\"is_error\":true}"[..]
    } else {
        &b",\"is_error\":false}"[..]
    });
    hasher.finish()
}

/// Ends the log's last line when a crash left it torn (no newline at the end), so that the
/// next receipt starts a line of its own: glued to the torn one it would not read either.
/// The torn line is kept as it is (readers report it); the newline is synced with it.
fn end_a_torn_line(file: &mut std::fs::File) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::FileExt as _;
    let len = file.metadata()?.len();
    let Some(last) = len.checked_sub(1) else {
        return Ok(());
    };
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, last)?;
    if byte[0] != b'\n' {
        file.write_all(b"\n")?;
        file.sync_data()?;
    }
    Ok(())
}

/// Called with every receipt a log wrote (with its `seq` and `chain`) and its line as
/// written (redacted, without the newline): a host streams that text to the head as it is.
pub type AppendObserver = Box<dyn Fn(&Receipt, &str) + Send + Sync>;

/// An append-only JSONL receipt log. Each receipt is written and flushed as one line.
pub struct ReceiptLog {
    path: PathBuf,
    key: Option<Arc<chain::ChainKey>>,
    state: Mutex<LogState>,
    observer: OnceLock<AppendObserver>,
    tool_set: OnceLock<Vec<String>>,
    /// Writes synced to the disk (one per [`ReceiptLog::append_all`]): what the tests
    /// count to hold a batch to one sync.
    syncs: AtomicU64,
    /// Whether appends are synced ([`ReceiptLog::unsynced`]: not).
    sync: bool,
}

struct LogState {
    file: std::fs::File,
    tally: LogTally,
}

impl ReceiptLog {
    /// Opens (creating if needed) the log at `path` for appending, without a chain: its
    /// receipts can be checked against their input hashes only. Fronts use
    /// [`ReceiptLog::open_chained`].
    pub fn open(path: &Path) -> std::io::Result<Self> {
        Self::open_with(path, None, LogTally::default())
    }

    /// Opens (creating if needed) the log at `path` for appending chained receipts under
    /// `key`. The chain goes on from the last chained receipt already in the log (a resumed
    /// run, a second `tool exec` session), and the tally starts from what the log holds.
    pub fn open_chained(path: &Path, key: Arc<chain::ChainKey>) -> std::io::Result<Self> {
        let tally = tally_of(path)?;
        Self::open_with(path, Some(key), tally)
    }

    fn open_with(
        path: &Path,
        key: Option<Arc<chain::ChainKey>>,
        tally: LogTally,
    ) -> std::io::Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)?;
        end_a_torn_line(&mut file)?;
        Ok(Self {
            path: path.to_path_buf(),
            key,
            state: Mutex::new(LogState { file, tally }),
            observer: OnceLock::new(),
            tool_set: OnceLock::new(),
            syncs: AtomicU64::new(0),
            sync: true,
        })
    }

    /// This log, its appends not synced: for a log that is only a local copy of receipts
    /// whose record is kept elsewhere and made durable there (a worker host's loop: its
    /// receipts stream to the head, which syncs them before it answers their batch, and the
    /// host's file is removed when the loop starts there again). Each append is still one
    /// write, cut back when it fails.
    pub fn unsynced(mut self) -> Self {
        self.sync = false;
        self
    }

    /// Where the log lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The chain key, when the log is chained.
    pub fn key(&self) -> Option<&Arc<chain::ChainKey>> {
        self.key.as_ref()
    }

    /// What the log holds so far.
    pub fn tally(&self) -> LogTally {
        lock(&self.state).tally.clone()
    }

    /// Says which tools the session writing this log can call (once set, it stays), for its
    /// session receipt.
    pub fn set_tool_set(&self, names: &[String]) {
        let _ = self.tool_set.set(names.to_vec());
    }

    /// The tools of the session writing this log, when said.
    pub fn tool_set(&self) -> Option<Vec<String>> {
        self.tool_set.get().cloned()
    }

    /// Calls `observer` with every receipt written from now on (once set, it stays).
    pub fn observe(&self, observer: AppendObserver) {
        let _ = self.observer.set(observer);
    }

    /// Appends one receipt as a single line, with every known secret redacted (receipts from
    /// `ToolSet::call` are redacted already; this is the last line of defence). In a chained
    /// log the receipt gets the next `seq` and its `chain` value, computed over exactly what
    /// is written; the chain moves on only when the line was written. The line is on the disk
    /// (`fdatasync`) when this returns `Ok`: a receipt records a side effect that already
    /// happened and cannot be derived again. When it fails (a full disk), nothing of the line
    /// is left in the log, and the caller must not treat the call as recorded.
    pub fn append(&self, receipt: &Receipt) -> std::io::Result<()> {
        self.append_all(std::slice::from_ref(receipt))
    }

    /// Appends `receipts` in order, as [`ReceiptLog::append`] appends one, with a single
    /// write and a single `fdatasync` for all of them: each is chained to the one before it,
    /// and all are on the disk when this returns `Ok` (a head taking a host's batch of
    /// receipts syncs once per batch, not once per receipt). All or none: when the write or
    /// the sync fails, nothing of the batch is left in the log and the chain stays where it
    /// was. A crash during the write leaves whole lines of the batch followed by at most one
    /// torn line: the chain of what is left verifies (readers report the torn line), and the
    /// next open goes on from its last whole receipt.
    pub fn append_all(&self, receipts: &[Receipt]) -> std::io::Result<()> {
        if receipts.is_empty() {
            return Ok(());
        }
        // A chained receipt's link is over its redacted tree (made under the lock, in
        // order); an unchained one is its line, written once (`to_redacted_line`).
        let mut values = Vec::with_capacity(receipts.len());
        for receipt in receipts {
            values.push(match &self.key {
                Some(key) => {
                    let mut tree = serde_json::to_value(receipt).map_err(std::io::Error::other)?;
                    td_base::secrets::redact_value(&mut tree);
                    Unwritten::Chained { tree, key }
                }
                None => Unwritten::Line(
                    td_base::secrets::to_redacted_line(receipt).map_err(std::io::Error::other)?,
                ),
            });
        }
        let written = {
            let mut state = lock(&self.state);
            // The chain goes on through the batch in memory; the log's tally moves only once
            // the whole batch is on the disk.
            let (mut seq, mut head) = (state.tally.seq, state.tally.head.clone());
            let mut bytes = Vec::new();
            let mut written = Vec::with_capacity(receipts.len());
            for (receipt, value) in receipts.iter().zip(values) {
                let (line, link) = match value {
                    Unwritten::Chained { mut tree, key } => {
                        seq = seq.checked_add(1).ok_or_else(|| {
                            std::io::Error::other(
                                "the receipt log's sequence number is at its maximum; start a new log",
                            )
                        })?;
                        let (line, link) = chained_line(&mut tree, key, &head, seq)?;
                        head.clone_from(&link);
                        (line, Some(link))
                    }
                    Unwritten::Line(line) => (line, None),
                };
                bytes.extend_from_slice(line.as_bytes());
                bytes.push(b'\n');
                let mut receipt = receipt.clone();
                receipt.seq = link.is_some().then_some(seq);
                receipt.chain = link;
                written.push((receipt, line));
            }
            td_base::record_io::append(&mut state.file, &bytes, self.sync)?;
            if self.sync {
                self.syncs.fetch_add(1, Ordering::Relaxed);
            }
            for (receipt, _) in &written {
                state.tally.add(receipt);
            }
            written
        };
        if let Some(observer) = self.observer.get() {
            for (receipt, line) in &written {
                observer(receipt, line);
            }
        }
        Ok(())
    }
}

/// A receipt of a batch on its way to the log: a redacted tree to chain under `key`, or the
/// line of an unchained log.
enum Unwritten<'k> {
    Chained {
        tree: Value,
        key: &'k chain::ChainKey,
    },
    Line(String),
}

/// The line of a chained receipt: `value` with `seq` and its `chain` value (over the
/// canonical JSON of everything else), as written. If the last redaction pass still finds a
/// secret, the chain is computed again over the redacted value, so it covers what is on disk.
fn chained_line(
    value: &mut Value,
    key: &chain::ChainKey,
    previous: &str,
    seq: u64,
) -> std::io::Result<(String, String)> {
    let link = |value: &mut Value| -> std::io::Result<(String, String)> {
        let object = value
            .as_object_mut()
            .ok_or_else(|| std::io::Error::other("a receipt is not a JSON object"))?;
        object.remove("chain");
        object.insert("seq".into(), Value::from(seq));
        let link = key.link(previous, &canonical_json(value));
        if let Some(object) = value.as_object_mut() {
            object.insert("chain".into(), Value::String(link.clone()));
        }
        let line = serde_json::to_string(value).map_err(std::io::Error::other)?;
        Ok((line, link))
    };
    let (line, chained) = link(value)?;
    if let std::borrow::Cow::Owned(redacted) = td_base::secrets::redact_json(&line)
        && let Ok(mut again) = serde_json::from_str::<Value>(&redacted)
    {
        return link(&mut again);
    }
    Ok((line, chained))
}

/// The tally of the receipts already in the log at `path` (none when it does not exist),
/// read a line at a time. Lines that do not parse (a line torn by a crash) are left out:
/// the chain goes on from the last receipt that was written whole.
fn tally_of(path: &Path) -> std::io::Result<LogTally> {
    let mut tally = LogTally::default();
    let read = jsonl::for_each::<Receipt>(path, |_, parsed| {
        if let Ok(receipt) = parsed {
            tally.add(&receipt);
        }
    });
    match read {
        Ok(()) => Ok(tally),
        Err(e) if e.is_not_found() => Ok(LogTally::default()),
        Err(e) => Err(e.error),
    }
}

/// What reading a receipt log found: the receipts in file order, and the lines that could
/// not be parsed (a torn last line after a crash shows up there rather than failing the
/// whole read).
pub type ReceiptRead = JsonlRead<Receipt>;

/// Reads every receipt of a log, tolerating (and reporting) unparsable lines.
pub fn read_log(path: &Path) -> Result<ReceiptRead, jsonl::ReadError> {
    jsonl::read(path)
}

/// The receipts of the log's tests: `run_command` running `echo {n}`, with id `id-{n}`.
#[cfg(test)]
pub(crate) fn test_receipt(n: usize) -> Receipt {
    let input = serde_json::json!({"command": format!("echo {n}")});
    Receipt {
        id: format!("id-{n}").into(),
        call_id: None,
        exec_id: "e".into(),
        tool: "run_command".into(),
        input_hash: hash_value(&input),
        input: Arc::new(input),
        output_hash: hash_output("", false),
        is_error: false,
        error_kind: None,
        output_bytes: 0,
        output_capped: false,
        latency_ms: 1,
        latency_us: Some(1_200),
        side_effects: vec![SideEffect::CommandRun {
            command: format!("echo {n}"),
            exit_code: Some(0),
            timed_out: false,
        }],
        time: "t".into(),
        commit: None,
        schema_valid: Some(true),
        seq: None,
        chain: None,
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    #[test]
    fn the_hash_writer_is_sha256_at_every_length_and_every_way_of_writing() {
        // Lengths around one and two block edges (55/56 bytes decide the padding's blocks)
        // and far past them; written whole, a byte at a time, and in uneven pieces.
        for len in (0..=300).chain([1_000, 4_096, 65_537]) {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let expected = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
            let mut whole = HashWriter::new();
            whole.add(&bytes);
            assert_eq!(whole.finish(), expected.as_str(), "whole, {len} bytes");
            let mut single = HashWriter::new();
            bytes
                .iter()
                .for_each(|b| single.add(std::slice::from_ref(b)));
            assert_eq!(single.finish(), expected.as_str(), "bytewise, {len} bytes");
            let mut pieces = HashWriter::new();
            let mut rest = &bytes[..];
            let mut size = 1;
            while !rest.is_empty() {
                let (piece, after) = rest.split_at(size.min(rest.len()));
                pieces.add(piece);
                rest = after;
                size = size * 3 % 97 + 1;
            }
            assert_eq!(pieces.finish(), expected.as_str(), "pieces, {len} bytes");
        }
    }

    use super::*;
    use serde_json::json;
    use std::io::Write;

    /// The hashes as first defined: SHA-256 of the canonical JSON text, as hex.
    fn hash_of_text(value: &Value) -> String {
        format!(
            "sha256:{}",
            td_base::hash::sha256_hex(canonical_json(value).as_bytes())
        )
    }

    #[test]
    fn streamed_hashes_equal_hashes_of_the_canonical_text() {
        let values = [
            json!({}),
            json!([]),
            json!(null),
            json!({"b": 1, "a": [true, false, null, -0.5, 1e300, 18446744073709551615u64]}),
            json!({"path": "ünï\u{1F600}\"quoted\"\n\t\\ \u{0}\u{1f}\u{7f}", "z": {"y": {"x": []}}}),
            json!({"text": "x".repeat(100_000)}),
        ];
        for v in &values {
            assert_eq!(hash_value(v), hash_of_text(v), "{v}");
        }
        for (content, is_error) in [("", false), ("an error\n\"q\"", true), ("ü\u{0}", false)] {
            assert_eq!(
                hash_output(content, is_error),
                hash_of_text(&json!({"content": content, "is_error": is_error}))
            );
        }
        assert_eq!(
            canonical_json(&json!({"b": {"d": 1, "c": "é"}, "a": [2, "\u{1}"]})),
            r#"{"a":[2,"\u0001"],"b":{"c":"é","d":1}}"#
        );
        // A fixed value, so that a change of the canonical form cannot go unnoticed: every
        // receipt ever written would stop verifying.
        assert_eq!(
            hash_output("", false),
            "sha256:7c979489768bc7bdb4454e6a808865f48b7677e4b3407659c6442ef9377b5fea"
        );
    }

    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let mut strings: Vec<String> = (0u32..0x80)
            .filter_map(char::from_u32)
            .map(|c| format!("a{c}b"))
            .collect();
        strings.extend(
            [
                "",
                "plain text",
                "ünï \u{1F600} \u{7f}",
                "tab\there",
                "\\\"",
            ]
            .map(String::from),
        );
        for s in &strings {
            let mut out = Vec::new();
            write_str(s, &mut out).unwrap();
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(s).unwrap()
            );
        }
    }

    #[test]
    fn canonical_json_ignores_key_order() {
        let a = json!({"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": null}});
        let b = json!({"a": {"x": null, "y": [1, {"c": 3, "d": 2}]}, "b": 1});
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#
        );
        assert_eq!(hash_value(&a), hash_value(&b));
        assert!(hash_value(&a).starts_with("sha256:"));
    }

    #[test]
    fn hashes_are_of_the_canonical_text_whatever_its_size() {
        // Sizes around the gathering buffer's: writes that fit, fill it exactly, straddle
        // it, and are larger than it.
        for len in (0..140).chain([255, 256, 257, 5000]) {
            let text: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            let value = json!({"b": text, "a": [text.clone(), {"z": 1, "y": "\u{1}\""}]});
            let sha = |s: &str| format!("sha256:{}", hex::encode(Sha256::digest(s.as_bytes())));
            assert_eq!(hash_value(&value), sha(&canonical_json(&value)), "{len}");
            for is_error in [false, true] {
                let whole = json!({"content": text, "is_error": is_error});
                assert_eq!(
                    hash_output(&text, is_error),
                    sha(&canonical_json(&whole)),
                    "{len}"
                );
            }
        }
    }

    #[test]
    fn output_hash_covers_the_error_flag() {
        assert_ne!(hash_output("x", true), hash_output("x", false));
    }

    #[test]
    fn log_round_trips_and_tolerates_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/receipts.jsonl");
        let log = ReceiptLog::open(&path).unwrap();
        log.append(&test_receipt(1)).unwrap();
        log.append(&test_receipt(2)).unwrap();
        drop(log);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"id\": \"torn").unwrap();
        let read = read_log(&path).unwrap();
        assert_eq!(read.items.len(), 2);
        assert_eq!(read.items[1].id, "id-2");
        assert_eq!(read.bad_lines.len(), 1);
        assert_eq!(read.bad_lines[0].0, 3);
    }

    /// A chained log at `dir/name` under a fixed key.
    fn chained(dir: &Path, name: &str) -> (ReceiptLog, Arc<chain::ChainKey>) {
        let key = Arc::new(chain::ChainKey::from_bytes([7; 32], dir.join("k")));
        (
            ReceiptLog::open_chained(&dir.join(name), key.clone()).unwrap(),
            key,
        )
    }

    /// The chain state of the log at `path` under `key`, and its unreadable lines.
    fn verify(path: &Path, key: &chain::ChainKey) -> (check::ChainState, usize, usize) {
        let read = check::read_entries(path).unwrap();
        let checked = check::check(&read.entries, Some(key), None);
        (checked.state, read.entries.len(), read.bad_lines.len())
    }

    #[test]
    fn an_observer_is_given_each_line_as_the_log_wrote_it_redacted() {
        td_base::secrets::register("OBSERVED_LINE_KEY", "observed-line-secret-0004");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let log = ReceiptLog::open(&path).unwrap().unsynced();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        log.observe(Box::new(move |_, line| lock(&seen).push(line.to_string())));
        let mut holding = test_receipt(1);
        holding.input = Arc::new(serde_json::json!({"command": "echo observed-line-secret-0004"}));
        log.append_all(&[holding, test_receipt(2)]).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        let observed = lock(&lines).clone();
        assert_eq!(observed.len(), 2);
        assert_eq!(format!("{}\n{}\n", observed[0], observed[1]), written);
        assert!(!written.contains("observed-line-secret"), "{written}");
        assert!(
            written.contains("[REDACTED:OBSERVED_LINE_KEY]"),
            "{written}"
        );
        // Each line reads back as the receipt it is.
        let back: Receipt = serde_json::from_str(&observed[1]).unwrap();
        assert_eq!(back.id, "id-2");
    }

    #[test]
    fn a_batch_is_written_as_its_receipts_one_by_one_with_one_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (one_by_one, key) = chained(dir.path(), "single.jsonl");
        for n in 1..=5 {
            one_by_one.append(&test_receipt(n)).unwrap();
        }
        assert_eq!(one_by_one.syncs.load(Ordering::Relaxed), 5);
        let (batched, _) = chained(dir.path(), "batch.jsonl");
        batched.append(&test_receipt(1)).unwrap();
        let rest: Vec<Receipt> = (2..=5).map(test_receipt).collect();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let observed = seen.clone();
        batched.observe(Box::new(move |r, _| lock(&observed).push(r.seq)));
        batched.append_all(&rest).unwrap();
        // One sync for the first receipt, one for the batch of four.
        assert_eq!(batched.syncs.load(Ordering::Relaxed), 2);
        assert_eq!(*lock(&seen), vec![Some(2), Some(3), Some(4), Some(5)]);
        // The same lines, the same chain, the same tally.
        assert_eq!(
            std::fs::read(dir.path().join("batch.jsonl")).unwrap(),
            std::fs::read(dir.path().join("single.jsonl")).unwrap()
        );
        assert_eq!(batched.tally().seq, 5);
        assert_eq!(batched.tally().head, one_by_one.tally().head);
        assert_eq!(batched.tally().ids, one_by_one.tally().ids);
        let (state, entries, bad) = verify(&dir.path().join("batch.jsonl"), &key);
        assert_eq!((state, entries, bad), (check::ChainState::Verified, 5, 0));
        // An empty batch writes and syncs nothing.
        batched.append_all(&[]).unwrap();
        assert_eq!(batched.syncs.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_unsynced_log_writes_the_same_lines_without_a_sync() {
        let dir = tempfile::tempdir().unwrap();
        let synced = ReceiptLog::open(&dir.path().join("a.jsonl")).unwrap();
        let copy = ReceiptLog::open(&dir.path().join("b.jsonl"))
            .unwrap()
            .unsynced();
        for n in 1..=3 {
            synced.append(&test_receipt(n)).unwrap();
            copy.append(&test_receipt(n)).unwrap();
        }
        assert_eq!(synced.syncs.load(Ordering::Relaxed), 3);
        assert_eq!(copy.syncs.load(Ordering::Relaxed), 0);
        assert_eq!(
            std::fs::read(dir.path().join("a.jsonl")).unwrap(),
            std::fs::read(dir.path().join("b.jsonl")).unwrap()
        );
        assert_eq!(copy.tally().receipts, 3);
    }

    #[test]
    fn a_crash_inside_a_batch_leaves_a_prefix_that_verifies_and_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let (log, key) = chained(dir.path(), "r.jsonl");
        log.append(&test_receipt(1)).unwrap();
        let batch: Vec<Receipt> = (2..=4).map(test_receipt).collect();
        log.append_all(&batch).unwrap();
        drop(log);
        // The crash cut the batch's write in its third line (receipt 3 of 4).
        let text = std::fs::read_to_string(&path).unwrap();
        let cut = text.match_indices('\n').nth(1).unwrap().0 + 20;
        std::fs::write(&path, &text[..cut]).unwrap();
        assert_eq!(
            verify(&path, &key),
            (check::ChainState::Verified, 2, 1),
            "the whole lines verify, the torn one is reported"
        );
        // The next session goes on from the last whole receipt.
        let (log, _) = chained(dir.path(), "r.jsonl");
        let read = check::read_entries(&path).unwrap();
        assert_eq!(log.tally().seq, 2);
        assert_eq!(Some(log.tally().head), read.entries[1].receipt.chain);
        // Its first receipt starts a line of its own: the torn one stays as it was, reported,
        // and is not glued to the new receipt (which would lose it).
        log.append(&test_receipt(5)).unwrap();
        drop(log);
        assert_eq!(
            verify(&path, &key),
            (check::ChainState::Verified, 3, 1),
            "the new receipt verifies after the torn line"
        );
        let read = read_log(&path).unwrap();
        assert_eq!(read.items.last().map(|r| r.id.as_str()), Some("id-5"));
        assert_eq!(read.bad_lines.len(), 1);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains(&text[cut - 20..cut])
        );
    }
}
