//! Receipts: one JSON line per tool call — who called what with which input, the hash of
//! the full output, latency, side effects, time and worktree commit — appended to a log that
//! `taskdaemon replay verify` can read back and re-run.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::{lock, sha256_hex};

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
    pub id: String,
    /// The model's id for the call, when it gave one.
    pub call_id: Option<String>,
    /// The loop (exec id) that made the call.
    pub exec_id: String,
    /// Tool name.
    pub tool: String,
    /// The full input, so the call can be replayed.
    pub input: Value,
    /// `sha256:` of the canonical JSON of `input`.
    pub input_hash: String,
    /// `sha256:` of the full output (content and error flag), before any cap.
    pub output_hash: String,
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
    /// Files written and commands run.
    pub side_effects: Vec<SideEffect>,
    /// When the call started (RFC 3339, UTC).
    pub time: String,
    /// HEAD of the worktree when the call ran, if it is a git checkout.
    pub commit: Option<String>,
}

/// Serializes `value` with object keys sorted at every level, so equal values hash equally
/// whatever order their keys arrived in.
pub fn canonical_json(value: &Value) -> String {
    // serde_json may preserve insertion order (feature unification), so the keys are
    // written in sorted order here rather than trusting the map type.
    let mut out = String::new();
    write_sorted(value, &mut out);
    out
}

fn write_sorted(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                write_sorted(&m[k.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_sorted(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `sha256:<hex>` of the canonical JSON of `value`.
pub fn hash_value(value: &Value) -> String {
    format!("sha256:{}", sha256_hex(canonical_json(value).as_bytes()))
}

/// `sha256:<hex>` of a call's full output.
pub fn hash_output(content: &str, is_error: bool) -> String {
    hash_value(&serde_json::json!({"content": content, "is_error": is_error}))
}

/// An append-only JSONL receipt log. Each receipt is written and flushed as one line.
pub struct ReceiptLog {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl ReceiptLog {
    /// Opens (creating if needed) the log at `path` for appending.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        })
    }

    /// Where the log lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one receipt as a single line, with every known secret redacted (receipts from
    /// `ToolSet::call` are redacted already; this is the last line of defence). The line is
    /// on the disk (`fdatasync`) when this returns `Ok`: a receipt records a side effect that
    /// already happened and cannot be derived again. When it fails (a full disk), nothing of
    /// the line is left in the log, and the caller must not treat the call as recorded.
    pub fn append(&self, receipt: &Receipt) -> std::io::Result<()> {
        let line = serde_json::to_string(receipt).map_err(std::io::Error::other)?;
        let mut line = crate::secrets::redact_json(&line).into_owned();
        line.push('\n');
        let mut f = lock(&self.file);
        crate::record_io::append(&mut f, line.as_bytes(), true)
    }
}

/// What reading a receipt log found.
#[derive(Debug, Default)]
pub struct ReceiptRead {
    /// Receipts in file order.
    pub receipts: Vec<Receipt>,
    /// Lines that could not be parsed: (1-based line number, error). A torn last line after
    /// a crash shows up here rather than failing the whole read.
    pub bad_lines: Vec<(usize, String)>,
}

/// Reads every receipt of a log, tolerating (and reporting) unparsable lines.
pub fn read_log(path: &Path) -> std::io::Result<ReceiptRead> {
    let file = std::fs::File::open(path)?;
    let mut out = ReceiptRead::default();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                out.bad_lines.push((i + 1, e.to_string()));
                continue;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Receipt>(&line) {
            Ok(r) => out.receipts.push(r),
            Err(e) => out.bad_lines.push((i + 1, e.to_string())),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

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
    fn output_hash_covers_the_error_flag() {
        assert_ne!(hash_output("x", true), hash_output("x", false));
    }

    fn receipt(tool: &str) -> Receipt {
        Receipt {
            id: "1".into(),
            call_id: None,
            exec_id: "e".into(),
            tool: tool.into(),
            input: json!({}),
            input_hash: hash_value(&json!({})),
            output_hash: hash_output("", false),
            is_error: false,
            error_kind: None,
            output_bytes: 0,
            output_capped: false,
            latency_ms: 0,
            side_effects: vec![SideEffect::CommandRun {
                command: "true".into(),
                exit_code: Some(0),
                timed_out: false,
            }],
            time: "t".into(),
            commit: None,
        }
    }

    #[test]
    fn log_round_trips_and_tolerates_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/receipts.jsonl");
        let log = ReceiptLog::open(&path).unwrap();
        log.append(&receipt("a")).unwrap();
        log.append(&receipt("b")).unwrap();
        drop(log);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"id\": \"torn").unwrap();
        let read = read_log(&path).unwrap();
        assert_eq!(read.receipts.len(), 2);
        assert_eq!(read.receipts[1].tool, "b");
        assert_eq!(read.bad_lines.len(), 1);
        assert_eq!(read.bad_lines[0].0, 3);
    }
}
