//! Checking a receipt log before anything in it is trusted: every receipt's input against its
//! `input_hash`, every chain link with the key, the order of the chain, and the end of the
//! chain against the session receipt. Each receipt that was edited, inserted, repeated,
//! moved or dropped is named (by position, `seq` and id), and every receipt gets a verdict:
//! trusted, or why not. `replay verify` runs only trusted receipts.
//!
//! How the kinds of tampering show (see [`super::chain`] for the links):
//! - an edited receipt no longer matches its chain value: *edited*;
//! - an inserted line has no valid chain value: *edited* (or *repeated*, when it is a copy of
//!   a real receipt);
//! - a dropped receipt leaves a gap in `seq`: *dropped*; the receipt after the gap cannot be
//!   authenticated (its link was made with the dropped receipt's chain value), so it is
//!   *unverifiable* and not trusted either;
//! - reordered receipts verify one by one but are out of `seq` order: the fewest receipts that
//!   explain the order (those off the longest increasing run) are *out of order*;
//! - receipts dropped from the end leave no gap: the session receipt's `chain_seq` and
//!   `chain_head` catch them.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use serde::Serialize;
use serde_json::Value;
use td_base::jsonl::{self, BadLine, ReadError};

use super::chain::{ChainKey, GENESIS};
use super::session::SessionRead;
use super::{Receipt, canonical_json, hash_value};

/// One receipt of a log as read for checking: the line's JSON as it is (the chain covers
/// every field, also unknown ones) and the receipt parsed from it.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// 1-based position among the log's receipts.
    pub index: usize,
    /// 1-based line number in the file.
    pub line: usize,
    /// The line's JSON.
    pub value: Value,
    /// The receipt it holds.
    pub receipt: Receipt,
}

/// A log read for checking.
#[derive(Debug, Default)]
pub struct LogRead {
    /// Receipts in file order.
    pub entries: Vec<LogEntry>,
    /// Lines that are not receipts: (1-based line number, why).
    pub bad_lines: Vec<(usize, String)>,
}

/// Reads every line of the log at `path`, one at a time (memory is bounded by the longest
/// line plus the receipts kept), with the one tolerant JSONL reader.
pub fn read_entries(path: &Path) -> Result<LogRead, ReadError> {
    let mut out = LogRead::default();
    jsonl::for_each::<Value>(path, |number, parsed| {
        // Parsed from the same value the chain is checked on, so both agree.
        let parsed = parsed.map_err(|e| e.to_string()).and_then(|value| {
            serde_json::from_value::<Receipt>(value.clone())
                .map(|receipt| (value, receipt))
                .map_err(|e| BadLine::Invalid(e).to_string())
        });
        match parsed {
            Ok((value, receipt)) => {
                let index = out.entries.len() + 1;
                out.entries.push(LogEntry {
                    index,
                    line: number,
                    value,
                    receipt,
                });
            }
            Err(e) => out.bad_lines.push((number, e)),
        }
    })?;
    Ok(out)
}

/// What the chain check concluded about the whole log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainState {
    /// Every receipt is chained, every link verifies, nothing is missing or out of order.
    Verified,
    /// Something was found (see the findings).
    Broken,
    /// The log has no chain (written before chains existed, or without a key): its integrity
    /// cannot be checked.
    Unchained,
    /// The log is chained but no key was found to check it with.
    NoKey,
}

impl ChainState {
    /// The word used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ChainState::Verified => "verified",
            ChainState::Broken => "BROKEN",
            ChainState::Unchained => "UNCHAINED",
            ChainState::NoKey => "NOT CHECKED",
        }
    }
}

/// Which receipt a finding is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Place {
    /// 1-based position among the log's receipts.
    pub index: usize,
    /// Its `seq`, when it has one.
    pub seq: Option<u64>,
    /// Its id.
    pub id: String,
    /// Its tool.
    pub tool: String,
}

impl Place {
    fn of(entry: &LogEntry) -> Self {
        Place {
            index: entry.index,
            seq: entry.receipt.seq,
            id: entry.receipt.id.to_string(),
            tool: entry.receipt.tool.to_string(),
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{} {} (", self.index, self.tool)?;
        if let Some(seq) = self.seq {
            write!(f, "seq {seq}, ")?;
        }
        write!(f, "id {})", self.id)
    }
}

/// Something wrong with the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum Finding {
    /// The recorded input does not hash to the recorded `input_hash`.
    InputHash {
        /// The receipt.
        at: Place,
    },
    /// The receipt does not match its chain value: edited, or not written by taskdaemon.
    Edited {
        /// The receipt.
        at: Place,
    },
    /// The receipt has no `seq`/`chain` although the log is chained.
    Unchained {
        /// The receipt.
        at: Place,
    },
    /// The receipt before this one in the chain is missing, so this one cannot be
    /// authenticated.
    Unverifiable {
        /// The receipt.
        at: Place,
    },
    /// A second copy of a receipt.
    Repeated {
        /// The copy.
        at: Place,
        /// Position of the first copy.
        first: usize,
    },
    /// A genuine receipt in the wrong place.
    OutOfOrder {
        /// The receipt.
        at: Place,
        /// Where it stands relative to its neighbours.
        detail: String,
    },
    /// Receipts missing from the chain.
    Dropped {
        /// First missing `seq`.
        first_seq: u64,
        /// Last missing `seq`.
        last_seq: u64,
        /// Their ids, when the session receipt lists them.
        ids: Vec<String>,
        /// Where they are missing.
        place: String,
    },
    /// The session receipt's seal does not verify: it was edited, or belongs to another chain.
    SessionNotAuthentic {
        /// Its path.
        path: String,
    },
    /// The log's receipt at the session's `chain_seq` is not the one the session ended with.
    SessionHeadDiffers {
        /// The session's `chain_seq`.
        seq: u64,
    },
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::InputHash { at } => write!(
                f,
                "TAMPERED {at}: its input does not hash to its input_hash (the input was edited)"
            ),
            Finding::Edited { at } => write!(
                f,
                "TAMPERED {at}: it does not match its chain value (edited, or inserted by someone without the key)"
            ),
            Finding::Unchained { at } => {
                write!(f, "UNCHAINED {at}: it has no seq/chain in a chained log")
            }
            Finding::Unverifiable { at } => write!(
                f,
                "UNVERIFIABLE {at}: the receipt before it in the chain is missing, so it cannot be authenticated"
            ),
            Finding::Repeated { at, first } => {
                write!(f, "REPEATED {at}: a second copy of #{first}")
            }
            Finding::OutOfOrder { at, detail } => write!(f, "OUT OF ORDER {at}: {detail}"),
            Finding::Dropped {
                first_seq,
                last_seq,
                ids,
                place,
            } => {
                if first_seq == last_seq {
                    write!(f, "DROPPED seq {first_seq}")?;
                } else {
                    write!(f, "DROPPED seq {first_seq}..{last_seq}")?;
                }
                if !ids.is_empty() {
                    write!(f, " ({})", ids.join(", "))?;
                }
                write!(f, ": missing {place}")
            }
            Finding::SessionNotAuthentic { path } => write!(
                f,
                "TAMPERED session receipt {path}: its seal does not verify (edited, or from another chain)"
            ),
            Finding::SessionHeadDiffers { seq } => write!(
                f,
                "TAMPERED chain head: the session ended at seq {seq} with another receipt than the log holds there"
            ),
        }
    }
}

/// What checking a log found.
#[derive(Debug, Clone, Serialize)]
pub struct LogCheck {
    /// The verdict on the whole log.
    pub state: ChainState,
    /// Receipts checked.
    pub receipts: usize,
    /// `seq` and chain value of the last receipt of the chain that verified in order.
    pub head: Option<(u64, String)>,
    /// Everything wrong, in log order (session findings last).
    pub findings: Vec<Finding>,
    /// Things to know that are not tampering (receipts the session receipt does not cover).
    pub notes: Vec<String>,
    /// Per receipt (log order): `None` when trusted, else why not.
    #[serde(skip)]
    pub distrust: Vec<Option<String>>,
    /// Per receipt (log order): whether its input does not hash to its `input_hash` (such a
    /// receipt is never run, not even with `--unverified`).
    #[serde(skip)]
    pub input_tampered: Vec<bool>,
}

/// Checks `entries` (a log in file order) with `key` and, when given, the session receipt.
pub fn check(
    entries: &[LogEntry],
    key: Option<&ChainKey>,
    session: Option<&SessionRead>,
) -> LogCheck {
    let mut out = LogCheck {
        state: ChainState::Verified,
        receipts: entries.len(),
        head: None,
        findings: Vec::new(),
        notes: Vec::new(),
        distrust: vec![None; entries.len()],
        input_tampered: vec![false; entries.len()],
    };
    // Inputs first: a receipt whose input is not what was hashed is never run.
    for (i, entry) in entries.iter().enumerate() {
        let input = entry.value.get("input").cloned().unwrap_or(Value::Null);
        if hash_value(&input) != entry.receipt.input_hash {
            out.findings.push(Finding::InputHash {
                at: Place::of(entry),
            });
            out.distrust[i] = Some("its input does not hash to its input_hash".into());
            out.input_tampered[i] = true;
        }
    }
    let chained = |e: &LogEntry| e.receipt.seq.is_some() && e.receipt.chain.is_some();
    let any_chained = entries.iter().any(chained);
    let Some(key) = key else {
        out.state = if any_chained {
            ChainState::NoKey
        } else {
            ChainState::Unchained
        };
        let why = if any_chained {
            "its chain cannot be checked without the key"
        } else {
            "the log has no chain, so nothing shows it is unchanged"
        };
        distrust_rest(&mut out.distrust, why);
        return out;
    };
    if !entries.is_empty() && !any_chained {
        out.state = ChainState::Unchained;
        distrust_rest(
            &mut out.distrust,
            "the log has no chain, so nothing shows it is unchanged",
        );
        return out;
    }
    let authentic = authenticate(entries, key, &mut out);
    order(entries, &authentic, &mut out);
    // Only a sealed session receipt may say where the chain ends.
    let sealed = session.filter(|s| s.authentic == Some(true));
    if let Some(session) = session
        && sealed.is_none()
    {
        out.findings.push(Finding::SessionNotAuthentic {
            path: session.path.display().to_string(),
        });
    }
    gaps(entries, &authentic, sealed, &mut out);
    if let Some(session) = sealed {
        check_session_end(entries, &authentic, session, &mut out);
    }
    if out.findings.is_empty() {
        out.head = head(entries, &authentic);
    } else {
        out.state = ChainState::Broken;
    }
    out
}

fn distrust_rest(distrust: &mut [Option<String>], why: &str) {
    for d in distrust.iter_mut().filter(|d| d.is_none()) {
        *d = Some(why.to_string());
    }
}

/// The canonical JSON a receipt's chain value covers: the line without `chain`.
fn linked_content(value: &Value) -> String {
    let mut value = value.clone();
    if let Some(object) = value.as_object_mut() {
        object.remove("chain");
    }
    canonical_json(&value)
}

/// Which entries are genuine: their chain value is the link of their content after the
/// chain value of a receipt with the previous `seq` (the genesis value for seq 1). Names
/// every entry that is not.
fn authenticate(entries: &[LogEntry], key: &ChainKey, out: &mut LogCheck) -> Vec<bool> {
    let mut by_seq: HashMap<u64, Vec<&str>> = HashMap::new();
    for e in entries {
        if let (Some(seq), Some(chain)) = (e.receipt.seq, e.receipt.chain.as_deref()) {
            by_seq.entry(seq).or_default().push(chain);
        }
    }
    let mut authentic = vec![false; entries.len()];
    for (i, e) in entries.iter().enumerate() {
        let (Some(seq), Some(chain)) = (e.receipt.seq, e.receipt.chain.as_deref()) else {
            out.findings.push(Finding::Unchained { at: Place::of(e) });
            out.distrust[i].get_or_insert_with(|| "it is not chained".into());
            continue;
        };
        let content = linked_content(&e.value);
        let previous: Vec<&str> = match seq {
            0 => Vec::new(),
            1 => vec![GENESIS],
            n => by_seq.get(&(n - 1)).cloned().unwrap_or_default(),
        };
        if previous.is_empty() && seq != 0 {
            out.findings
                .push(Finding::Unverifiable { at: Place::of(e) });
            out.distrust[i].get_or_insert_with(|| {
                "the receipt before it in the chain is missing, so it cannot be authenticated"
                    .into()
            });
            continue;
        }
        if previous.iter().any(|p| key.verifies(p, &content, chain)) {
            authentic[i] = true;
        } else {
            out.findings.push(Finding::Edited { at: Place::of(e) });
            out.distrust[i].get_or_insert_with(|| "it does not match its chain value".into());
        }
    }
    authentic
}

/// Checks the order of the genuine entries: repeats, moves and gaps.
fn order(entries: &[LogEntry], authentic: &[bool], out: &mut LogCheck) {
    let mut first_of: HashMap<u64, usize> = HashMap::new();
    let mut candidates: Vec<usize> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if !authentic[i] {
            continue;
        }
        let Some(seq) = e.receipt.seq else { continue };
        if let Some(&first) = first_of.get(&seq) {
            out.findings.push(Finding::Repeated {
                at: Place::of(e),
                first: entries[first].index,
            });
            out.distrust[i].get_or_insert_with(|| "it is a second copy of a receipt".into());
        } else {
            first_of.insert(seq, i);
            candidates.push(i);
        }
    }
    let seqs: Vec<u64> = candidates
        .iter()
        .filter_map(|&i| entries[i].receipt.seq)
        .collect();
    let keep = longest_increasing(&seqs);
    for (k, &i) in candidates.iter().enumerate() {
        if keep[k] {
            continue;
        }
        let seq = seqs[k];
        let before_max = seqs[..k].iter().copied().max();
        let detail = match before_max {
            Some(max) if max > seq => {
                format!("it comes after seq {max}, which it should precede")
            }
            _ => match seqs[k + 1..].iter().position(|&s| s < seq) {
                Some(p) => format!(
                    "it comes before seq {} (#{}), which it should follow",
                    seqs[k + 1 + p],
                    entries[candidates[k + 1 + p]].index
                ),
                None => "it is not where its seq puts it".to_string(),
            },
        };
        out.findings.push(Finding::OutOfOrder {
            at: Place::of(&entries[i]),
            detail,
        });
        out.distrust[i].get_or_insert_with(|| "it is out of order".into());
    }
}

/// The last genuine receipt's `seq` and chain value.
fn head(entries: &[LogEntry], authentic: &[bool]) -> Option<(u64, String)> {
    entries
        .iter()
        .zip(authentic)
        .filter(|(_, ok)| **ok)
        .filter_map(|(e, _)| Some((e.receipt.seq?, e.receipt.chain.clone()?)))
        .max_by_key(|(seq, _)| *seq)
}

/// Names the seqs missing from the chain: between 1 and its end (the highest genuine seq, or
/// the sealed session's `chain_seq` when higher), a seq is missing when no line holds it. A
/// line that is not genuine still fills its seq (it is named as edited, not also as dropped),
/// unless its seq lies past the end, where no receipt was ever written.
fn gaps(
    entries: &[LogEntry],
    authentic: &[bool],
    session: Option<&SessionRead>,
    out: &mut LogCheck,
) {
    let genuine_end = entries
        .iter()
        .zip(authentic)
        .filter(|(_, ok)| **ok)
        .filter_map(|(e, _)| e.receipt.seq)
        .max()
        .unwrap_or(0);
    let end = genuine_end.max(session.map_or(0, |s| s.receipt.chain_seq));
    let present: BTreeSet<u64> = entries
        .iter()
        .filter_map(|e| e.receipt.seq)
        .filter(|&seq| seq >= 1 && seq <= end)
        .collect();
    // The session's ids line up with seqs when every receipt of the log is chained.
    let ids = session
        .map(|s| &s.receipt)
        .filter(|r| r.receipt_count == r.chain_seq)
        .map(|r| &r.tool_receipts[..]);
    let lines = lines_by_seq(entries);
    let mut expected = 1u64;
    for seq in present.iter().copied().chain(end.checked_add(1)) {
        if seq > expected {
            out.findings
                .push(dropped(entries, &lines, expected, seq - 1, ids));
        }
        expected = seq.saturating_add(1);
    }
}

/// Where each seq first appears in the log (on any line, genuine or not).
fn lines_by_seq(entries: &[LogEntry]) -> HashMap<u64, usize> {
    let mut lines = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        if let Some(seq) = e.receipt.seq {
            lines.entry(seq).or_insert(i);
        }
    }
    lines
}

/// A finding for seqs `first..=last` missing, placed by the receipts around them.
fn dropped(
    entries: &[LogEntry],
    first_of: &HashMap<u64, usize>,
    first: u64,
    last: u64,
    ids: Option<&[String]>,
) -> Finding {
    let at = |seq: u64| first_of.get(&seq).map(|&i| entries[i].index);
    let before = first.checked_sub(1).and_then(at);
    let after = last.checked_add(1).and_then(at);
    let place = match (before, after) {
        (Some(b), Some(a)) => format!(
            "between #{b} (seq {}) and #{a} (seq {})",
            first - 1,
            last.saturating_add(1)
        ),
        (None, Some(a)) if first == 1 => format!("at the start of the log, before #{a}"),
        (Some(b), None) => format!("at the end of the log, after #{b} (seq {})", first - 1),
        _ => "from the log".to_string(),
    };
    let ids = ids
        .map(|ids| {
            let from = usize::try_from(first.saturating_sub(1)).unwrap_or(usize::MAX);
            let to = usize::try_from(last).unwrap_or(usize::MAX);
            ids.get(from..to.min(ids.len()))
                .map(<[String]>::to_vec)
                .unwrap_or_default()
        })
        .unwrap_or_default();
    Finding::Dropped {
        first_seq: first,
        last_seq: last,
        ids,
        place,
    }
}

/// Marks the members of one longest strictly increasing subsequence of `seqs` (patience
/// sorting, O(n log n)): the receipts that are in order; the others were moved.
fn longest_increasing(seqs: &[u64]) -> Vec<bool> {
    // tails[l]: index of the smallest last element of an increasing run of length l + 1.
    let mut tails: Vec<usize> = Vec::new();
    let mut parent: Vec<Option<usize>> = vec![None; seqs.len()];
    for (i, &s) in seqs.iter().enumerate() {
        let pos = tails.partition_point(|&t| seqs[t] < s);
        parent[i] = pos.checked_sub(1).map(|p| tails[p]);
        if pos == tails.len() {
            tails.push(i);
        } else {
            tails[pos] = i;
        }
    }
    let mut keep = vec![false; seqs.len()];
    let mut at = tails.last().copied();
    while let Some(i) = at {
        keep[i] = true;
        at = parent[i];
    }
    keep
}

/// Compares the end of the chain with a sealed session receipt: the receipt at its
/// `chain_seq` must be the one it ended with; receipts after it are noted.
fn check_session_end(
    entries: &[LogEntry],
    authentic: &[bool],
    session: &SessionRead,
    out: &mut LogCheck,
) {
    let receipt = &session.receipt;
    let end = receipt.chain_seq;
    let at_end = entries
        .iter()
        .zip(authentic)
        .find(|(e, ok)| **ok && e.receipt.seq == Some(end))
        .and_then(|(e, _)| e.receipt.chain.as_deref());
    match at_end {
        Some(chain) if chain != receipt.chain_head => {
            out.findings.push(Finding::SessionHeadDiffers { seq: end });
        }
        None if end == 0 && receipt.chain_head != GENESIS => {
            out.findings.push(Finding::SessionHeadDiffers { seq: 0 });
        }
        _ => {}
    }
    let later = entries
        .iter()
        .zip(authentic)
        .filter(|(e, ok)| **ok && e.receipt.seq.is_some_and(|s| s > end))
        .filter_map(|(e, _)| e.receipt.seq)
        .max();
    if let Some(last) = later {
        out.notes.push(format!(
            "receipts seq {}..{last} were written after the session receipt {} (a later session, or one still running): its end check covers seq 1..{end} only",
            end.saturating_add(1),
            session.path.display()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receipts::session::{SessionEnd, SessionRead, SessionReceipt, read_session};
    use crate::receipts::{ReceiptLog, test_receipt};
    use serde_json::json;
    use std::sync::Arc;

    /// Ends the session of the chained log `log` left in `dir`: writes its session receipt
    /// to `dir/RECEIPT.json` and reads it back.
    fn seal(dir: &std::path::Path, key: &Arc<ChainKey>) -> (std::path::PathBuf, SessionRead) {
        let log = ReceiptLog::open_chained(&dir.join("r.jsonl"), key.clone()).unwrap();
        let end = SessionEnd {
            session_id: "s".into(),
            exec_id: "e".into(),
            status: "ended".into(),
            reason: None,
            validation: None,
            tool_set: None,
        };
        let path = dir.join("RECEIPT.json");
        SessionReceipt::from_tally(end, &log.tally())
            .write(&path, key)
            .unwrap();
        let session = read_session(&path, Some(key)).unwrap();
        (path, session)
    }

    /// A chained log of `n` receipts, its lines, and the key.
    fn log(n: usize) -> (tempfile::TempDir, Vec<String>, Arc<ChainKey>) {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(ChainKey::from_bytes([9; 32], dir.path().join("k")));
        let path = dir.path().join("r.jsonl");
        let log = ReceiptLog::open_chained(&path, key.clone()).unwrap();
        for i in 1..=n {
            log.append(&test_receipt(i)).unwrap();
        }
        let lines = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        (dir, lines, key)
    }

    fn entries(lines: &[String]) -> Vec<LogEntry> {
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let value: Value = serde_json::from_str(l).unwrap();
                LogEntry {
                    index: i + 1,
                    line: i + 1,
                    receipt: serde_json::from_value(value.clone()).unwrap(),
                    value,
                }
            })
            .collect()
    }

    fn run(lines: &[String], key: &ChainKey) -> (LogCheck, Vec<String>) {
        let check = check(&entries(lines), Some(key), None);
        let text = check.findings.iter().map(|f| f.to_string()).collect();
        (check, text)
    }

    #[test]
    fn an_intact_log_verifies_with_its_head() {
        let (_d, lines, key) = log(4);
        let (check, text) = run(&lines, &key);
        assert_eq!(check.state, ChainState::Verified, "{text:?}");
        assert_eq!(check.head.as_ref().map(|h| h.0), Some(4));
        assert!(check.distrust.iter().all(Option::is_none));
    }

    #[test]
    fn an_edited_receipt_is_named_alone_and_distrusted() {
        let (_d, mut lines, key) = log(4);
        lines[1] = lines[1].replace("echo 2", "echo pwned");
        // Also with the input hash made to match, the chain still names it.
        let mut v: Value = serde_json::from_str(&lines[1]).unwrap();
        v["input_hash"] = json!(hash_value(&v["input"]));
        lines[1] = v.to_string();
        let (check, text) = run(&lines, &key);
        assert_eq!(check.state, ChainState::Broken);
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(
            text[0].starts_with("TAMPERED #2 run_command (seq 2, id id-2)"),
            "{text:?}"
        );
        assert!(check.distrust[1].is_some());
        assert!(check.distrust[0].is_none() && check.distrust[2].is_none());
    }

    #[test]
    fn a_dropped_receipt_is_named_and_the_one_after_it_is_not_trusted() {
        let (_d, mut lines, key) = log(4);
        lines.remove(1);
        let (check, text) = run(&lines, &key);
        assert_eq!(check.state, ChainState::Broken);
        assert!(
            text.iter()
                .any(|t| t.starts_with("DROPPED seq 2: missing between #1 (seq 1) and #2 (seq 3)")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.starts_with("UNVERIFIABLE #2 run_command (seq 3,")),
            "{text:?}"
        );
        assert!(check.distrust[1].is_some());
        assert!(
            check.distrust[2].is_none(),
            "seq 4 links to seq 3 as written"
        );
    }

    #[test]
    fn swapped_and_moved_receipts_are_named() {
        let (_d, lines, key) = log(5);
        let mut swapped = lines.clone();
        swapped.swap(1, 2);
        let (check, text) = run(&swapped, &key);
        assert_eq!(check.state, ChainState::Broken);
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(text[0].starts_with("OUT OF ORDER #"), "{text:?}");
        // One message names both receipts of the swap.
        assert!(
            text[0].contains("seq 2") && text[0].contains("seq 3"),
            "{text:?}"
        );

        let mut moved = lines.clone();
        let second = moved.remove(1);
        moved.push(second);
        let (_, text) = run(&moved, &key);
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(
            text[0].starts_with("OUT OF ORDER #5 run_command (seq 2,"),
            "{text:?}"
        );
    }

    #[test]
    fn inserted_lines_and_copies_are_named() {
        let (_d, lines, key) = log(3);
        let mut forged = lines.clone();
        let mut fake: Value = serde_json::from_str(&lines[1]).unwrap();
        fake["id"] = json!("fake");
        fake["seq"] = json!(2);
        forged.insert(2, fake.to_string());
        let (_, text) = run(&forged, &key);
        assert!(
            text.iter()
                .any(|t| t.contains("TAMPERED #3 run_command (seq 2, id fake)")),
            "{text:?}"
        );
        assert_eq!(text.len(), 1, "{text:?}");

        let mut copied = lines.clone();
        copied.push(lines[0].clone());
        let (check, text) = run(&copied, &key);
        assert!(
            text.iter()
                .any(|t| t.starts_with("REPEATED #4 run_command (seq 1,")),
            "{text:?}"
        );
        assert!(check.distrust[3].is_some() && check.distrust[0].is_none());
    }

    #[test]
    fn without_a_key_or_a_chain_nothing_is_trusted() {
        let (_d, lines, _key) = log(2);
        let check = check(&entries(&lines), None, None);
        assert_eq!(check.state, ChainState::NoKey);
        assert!(check.distrust.iter().all(Option::is_some));
        let plain: Vec<String> = lines
            .iter()
            .map(|l| {
                let mut v: Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().remove("seq");
                v.as_object_mut().unwrap().remove("chain");
                v.to_string()
            })
            .collect();
        let other = ChainKey::from_bytes([1; 32], "k".into());
        let check = super::check(&entries(&plain), Some(&other), None);
        assert_eq!(check.state, ChainState::Unchained);
        assert!(check.distrust.iter().all(Option::is_some));
        // A key from another chain authenticates nothing.
        let (check, _) = run(&lines, &other);
        assert_eq!(check.state, ChainState::Broken);
        assert!(check.distrust.iter().all(Option::is_some));
    }

    #[test]
    fn the_session_receipt_catches_receipts_dropped_from_the_end() {
        let (d, lines, key) = log(4);
        let (path, session) = seal(d.path(), &key);
        let whole = check(&entries(&lines), Some(&key), Some(&session));
        assert_eq!(whole.state, ChainState::Verified, "{:?}", whole.findings);
        let cut = check(&entries(&lines[..2]), Some(&key), Some(&session));
        assert_eq!(cut.state, ChainState::Broken);
        let text: Vec<String> = cut.findings.iter().map(|f| f.to_string()).collect();
        assert_eq!(
            text,
            ["DROPPED seq 3..4 (id-3, id-4): missing at the end of the log, after #2 (seq 2)"]
        );
        // A session receipt edited to match the shorter log no longer verifies.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"chain_seq\": 4", "\"chain_seq\": 2")).unwrap();
        let edited = read_session(&path, Some(&key)).unwrap();
        let cut = check(&entries(&lines[..2]), Some(&key), Some(&edited));
        assert!(matches!(
            cut.findings[..],
            [Finding::SessionNotAuthentic { .. }]
        ));
    }

    #[test]
    fn a_forged_line_past_the_end_or_an_edited_last_receipt_makes_no_gap() {
        let (d, lines, key) = log(3);
        let mut far: Value = serde_json::from_str(&lines[1]).unwrap();
        far["seq"] = json!(u64::MAX);
        far["id"] = json!("far");
        let mut forged = lines.clone();
        forged.push(far.to_string());
        let (_, text) = run(&forged, &key);
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(text[0].starts_with("UNVERIFIABLE #4"), "{text:?}");

        let (_, session) = seal(d.path(), &key);
        let mut edited = lines.clone();
        edited[2] = edited[2].replace("echo 3", "echo 4");
        let check = check(&entries(&edited), Some(&key), Some(&session));
        let text: Vec<String> = check.findings.iter().map(|f| f.to_string()).collect();
        // Named for its input and its chain; not also as dropped from the end.
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(
            text.iter().all(|t| t.starts_with("TAMPERED #3")),
            "{text:?}"
        );
    }

    #[test]
    fn longest_increasing_keeps_the_most_receipts_in_place() {
        assert_eq!(
            longest_increasing(&[1, 3, 4, 5, 2, 6]),
            [true, true, true, true, false, true]
        );
        assert_eq!(longest_increasing(&[]), Vec::<bool>::new());
        assert_eq!(
            longest_increasing(&[2, 1]).iter().filter(|k| **k).count(),
            1
        );
    }
}
