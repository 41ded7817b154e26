//! `edit_file`: exact string replacement in a text file, one edit or several applied in order
//! and all-or-nothing. Refuses files the loop has not read (or written) and files that
//! changed since, so the model never edits text it has not seen.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::files::access::{io_error, not_found, replace_error};
use crate::files::lines::{count_lines, count_newlines, line_start, number_line, split_line};
use crate::files::size::human_size;
use crate::search::walk;
use td_base::hash::sha256_hex;
use td_toolkit::args;
use td_toolkit::context::{StampCheck, ToolContext};
use td_toolkit::error::{ArgumentProblem, ToolError, ToolResult};
use td_toolkit::receipts::SideEffect;
use td_toolkit::stamp::Stamp;
use td_toolkit::tool::{Tool, ToolOutput};
use td_toolkit::worktree_fs::replace::Expect;
use td_toolkit::worktree_fs::{OpenedFile, WorktreeFs};

const NAME: &str = "edit_file";

/// Lines listed for an ambiguous `old_string`.
const MAX_LISTED_MATCHES: usize = 10;

/// Changed line ranges listed in the answer.
const MAX_LISTED_RANGES: usize = 20;

/// Context lines shown before and after the first change.
const SNIPPET_CONTEXT: usize = 3;

/// Largest file edit_file changes: it holds the file, and the edited copy, in memory.
const MAX_EDIT_BYTES: u64 = 64 * 1024 * 1024;

/// Upper bound of lines in the snippet, whatever the size of the change.
const SNIPPET_MAX_LINES: usize = 16;

/// The `edit_file` tool.
pub struct EditFile;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_string: Option<String>,
    new_string: Option<String>,
    replace_all: Option<bool>,
    edits: Option<Vec<EditSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EditSpec {
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

/// One edit with the JSON pointer of its place in the input, for error messages.
#[derive(Debug)]
struct Edit {
    old: String,
    new: String,
    replace_all: bool,
    /// `""` for the single form, `/edits/<i>` for the list form.
    pointer: String,
    /// How messages name it: `old_string` or `edits[<i>]`.
    label: String,
}

/// What applying one edit did.
#[derive(Debug)]
struct Applied {
    replacements: usize,
    /// Whether `\n` in the strings had to become `\r\n` to match.
    crlf_adapted: bool,
}

#[async_trait]
impl Tool for EditFile {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Replace exact text in a file you have read (or written) this loop, and that has not changed since. Give old_string and new_string for one edit, or `edits` (a list of {old_string, new_string, replace_all}) for several edits applied in order: if any fails, nothing is written. old_string must match the file exactly (whitespace included, without read_file's line-number prefixes) and match one place only, unless replace_all is true. To create a file or replace all of it, use write_file."
    }

    fn input_schema(&self) -> Value {
        // "Exactly one of the two forms" is checked in code: several model APIs refuse
        // oneOf/anyOf at the top level of a tool's input schema.
        json!({
            "type": "object",
            "properties": {
                "path": super::path_schema(super::FILE_PATH),
                "old_string": {
                    "type": "string",
                    "description": "Exact text to replace (single-edit form, with new_string; no default). Must not be empty."
                },
                "new_string": {
                    "type": "string",
                    "description": "Text to put in its place (single-edit form, with old_string; no default). Must differ from old_string."
                },
                "replace_all": {
                    "type": "boolean",
                    "description": "Single-edit form: replace every occurrence of old_string instead of requiring exactly one (default false)."
                },
                "edits": {
                    "type": "array",
                    "minItems": 1,
                    "description": "Several edits applied in order to the file's content, all or nothing (instead of old_string/new_string; no default).",
                    "items": {
                        "type": "object",
                        "properties": {
                            "old_string": {
                                "type": "string",
                                "description": "Exact text to replace, as the file reads after the earlier edits (required)."
                            },
                            "new_string": {
                                "type": "string",
                                "description": "Text to put in its place (required)."
                            },
                            "replace_all": {
                                "type": "boolean",
                                "description": "Replace every occurrence instead of requiring exactly one (default false)."
                            }
                        },
                        "required": ["old_string", "new_string"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let args: EditArgs = args::parse(NAME, input)?;
        let edits = edits_of(
            args.old_string,
            args.new_string,
            args.replace_all,
            args.edits,
        )?;
        let real = ctx.resolve_for_write(&args.path)?;
        let shown = ctx.display(&real);

        let read = {
            let files = Arc::clone(ctx.files());
            let real = real.clone();
            let shown_here = shown.clone();
            let precheck = ctx.check_without_content(&real);
            tokio::task::spawn_blocking(move || read_for_edit(&files, &real, &shown_here, precheck))
                .await
                .map_err(|e| {
                    ToolError::failed(format!("reading '{shown}'"), e, "Try the call again.")
                })??
        };
        let (opened, bytes) = read;
        let seen = Stamp::of(&bytes);
        match ctx.check_stamp(&real, &bytes) {
            StampCheck::Current => {}
            StampCheck::NeverRead => return Err(ToolError::EditWithoutRead { path: shown }),
            StampCheck::Stale => return Err(ToolError::StaleRead { path: shown }),
        }
        let original = String::from_utf8(bytes).map_err(|_| {
            ToolError::failed(
                format!("editing '{shown}'"),
                "it is not UTF-8 text",
                "edit_file only changes text files; use write_file to replace the whole file.",
            )
        })?;

        // The edits run on the blocking pool: a file of tens of MiB with many replacements
        // takes a while, and a call that timed out stops between edits (and never writes:
        // the write below is only reached by a call still waited for).
        let (content, applied, ranges, edits) = {
            let shown = shown.clone();
            walk::run_blocking(NAME, move |cancel| {
                apply_all(original, edits, &shown, cancel)
            })
            .await?
        };

        let previous = ctx.stamp_own_write(&real, content.as_bytes());
        let job = {
            let real = real.clone();
            let shown = shown.clone();
            let files = Arc::clone(ctx.files());
            tokio::task::spawn_blocking(move || {
                let how = Expect::Unchanged {
                    old: &opened.file,
                    since: opened.state,
                    stamp: seen,
                };
                files
                    .replace(&real, content.as_bytes(), how)
                    .map(|done| (content, done))
                    .map_err(|e| replace_error(&files, e, "writing", &real, &shown))
            })
        };
        let written = job
            .await
            .map_err(|e| {
                ToolError::failed(
                    format!("writing '{shown}'"),
                    e,
                    "Read the file again and retry.",
                )
            })
            .and_then(|r| r);
        let (content, done) = match written {
            Ok(c) => c,
            Err(e) => {
                ctx.undo_write_stamp(&real, previous);
                return Err(e);
            }
        };
        ctx.finish_own_write(&real);

        let mut text = report(&shown, &content, &edits, &applied, &ranges);
        if done.late_write {
            let _ = write!(
                text,
                "\nWarning: another process wrote to '{shown}' while it was being replaced; what it wrote went to the old version and is not in the file. Read the file again and check that nothing is missing."
            );
        }
        if done.unchecked {
            let _ = write!(
                text,
                "\nWarning: another process moved the old version of '{shown}' away while it was being replaced, so it could not be checked against what you read. Read the file again and check the result."
            );
        }
        Ok(ToolOutput::text(text).with_effect(SideEffect::FileWritten {
            path: shown,
            hash: sha256_hex(content.as_bytes()),
        }))
    }
}

/// Opens the file to edit beneath the root and reads it, unless the loop's stamps already
/// say the edit is refused (`precheck`): then not a byte is read. Files above
/// [`MAX_EDIT_BYTES`] are refused before reading.
fn read_for_edit(
    files: &WorktreeFs,
    real: &Path,
    shown: &str,
    precheck: Option<StampCheck>,
) -> ToolResult<(OpenedFile, Vec<u8>)> {
    let mut opened = files.open_named_file(real).map_err(|refusal| {
        refusal.into_tool_error(
            "editing",
            shown,
            "Give the path of a file; use list_directory to see what is inside.",
            |e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    not_found(files, real, shown, "To create a new file, use write_file.")
                }
                _ => io_error(files, "editing", real, shown, &e),
            },
        )
    })?;
    match precheck {
        Some(StampCheck::NeverRead) => {
            return Err(ToolError::EditWithoutRead {
                path: shown.to_string(),
            });
        }
        Some(StampCheck::Stale) => {
            return Err(ToolError::StaleRead {
                path: shown.to_string(),
            });
        }
        _ => {}
    }
    if opened.len > MAX_EDIT_BYTES {
        return Err(ToolError::failed(
            format!("editing '{shown}'"),
            format!(
                "it is {} and edit_file holds a file in memory, up to {}",
                human_size(opened.len),
                human_size(MAX_EDIT_BYTES)
            ),
            "Change a file this large with run_command (e.g. sed), or replace it whole with write_file.",
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(opened.len).unwrap_or(0));
    // Read to the end of what is there: the size may have changed since `fstat`, and the
    // stamp check must see every byte. The limit keeps a file that grows meanwhile bounded.
    std::io::Read::by_ref(&mut opened.file)
        .take(MAX_EDIT_BYTES.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(files, "reading", real, shown, &e))?;
    if bytes.len() as u64 > MAX_EDIT_BYTES {
        return Err(ToolError::StaleRead {
            path: shown.to_string(),
        });
    }
    Ok((opened, bytes))
}

/// What applying a call's edits gives: the new content, what each edit did, the changed
/// byte ranges, and the edits (handed back for the report).
type AppliedEdits = (String, Vec<Applied>, Vec<(usize, usize)>, Vec<Edit>);

/// Applies `edits` to `original` in order, all or nothing; stops early when `cancel` says the
/// call was given up.
fn apply_all(
    original: String,
    edits: Vec<Edit>,
    shown: &str,
    cancel: &std::sync::atomic::AtomicBool,
) -> ToolResult<AppliedEdits> {
    let several = edits.len() > 1;
    let mut content = original;
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut applied = Vec::with_capacity(edits.len());
    for edit in &edits {
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ToolError::failed(
                format!("editing '{shown}'"),
                "the call was given up",
                "Nothing was written; try fewer or smaller edits.",
            ));
        }
        let (next, done) = apply(&content, edit, shown, several, &mut ranges)?;
        content = next;
        applied.push(done);
    }
    Ok((content, applied, ranges, edits))
}

/// Turns the two input forms into a list of edits, reporting every misuse at once.
fn edits_of(
    old: Option<String>,
    new: Option<String>,
    replace_all: Option<bool>,
    list: Option<Vec<EditSpec>>,
) -> ToolResult<Vec<Edit>> {
    let mut problems = Vec::new();
    let mut problem = |pointer: &str, message: &str| {
        problems.push(ArgumentProblem {
            pointer: pointer.to_string(),
            message: message.to_string(),
        })
    };
    let edits: Vec<Edit> = match list {
        Some(list) => {
            let both = "give either old_string/new_string (one edit) or edits (several), not both; move this edit into edits";
            if old.is_some() {
                problem("/old_string", both);
            }
            if new.is_some() {
                problem("/new_string", both);
            }
            if replace_all.is_some() {
                problem(
                    "/replace_all",
                    "with edits, put replace_all inside each edit that needs it",
                );
            }
            if list.is_empty() {
                problem("/edits", "must hold at least one edit");
            }
            list.into_iter()
                .enumerate()
                .map(|(i, e)| Edit {
                    old: e.old_string,
                    new: e.new_string,
                    replace_all: e.replace_all,
                    pointer: format!("/edits/{i}"),
                    label: format!("edits[{i}]"),
                })
                .collect()
        }
        None => match (old, new) {
            (Some(old), Some(new)) => vec![Edit {
                old,
                new,
                replace_all: replace_all.unwrap_or(false),
                pointer: String::new(),
                label: "old_string".to_string(),
            }],
            (None, None) => {
                problem(
                    "",
                    "give old_string and new_string for one edit, or edits for several",
                );
                Vec::new()
            }
            (Some(_), None) => {
                problem("/new_string", "is required with old_string");
                Vec::new()
            }
            (None, Some(_)) => {
                problem("/old_string", "is required with new_string");
                Vec::new()
            }
        },
    };
    for edit in &edits {
        if edit.old.is_empty() {
            problem(
                &format!("{}/old_string", edit.pointer),
                "is empty; edit_file replaces existing text. To write a whole file, use write_file",
            );
        } else if edit.old == edit.new {
            problem(
                &format!("{}/new_string", edit.pointer),
                "is identical to old_string, so the edit would change nothing",
            );
        }
    }
    if problems.is_empty() {
        Ok(edits)
    } else {
        Err(ToolError::InvalidArguments {
            tool: NAME.to_string(),
            problems,
        })
    }
}

/// Applies one edit to `content`, keeping `ranges` (changed byte ranges, sorted and
/// disjoint) pointing at the same text in the result.
fn apply(
    content: &str,
    edit: &Edit,
    shown: &str,
    several: bool,
    ranges: &mut Vec<(usize, usize)>,
) -> ToolResult<(String, Applied)> {
    let mut old = std::borrow::Cow::Borrowed(edit.old.as_str());
    let mut new = std::borrow::Cow::Borrowed(edit.new.as_str());
    let field = format!("{}/old_string", edit.pointer);
    let mut matches = match_positions(content, &old, edit, &field)?;
    let mut crlf_adapted = false;
    if matches.is_empty() && content.contains("\r\n") && edit.old.contains('\n') {
        // read_file hides the \r of CRLF files, so the model writes plain \n.
        let crlf_old = to_crlf(&edit.old);
        let found = match_positions(content, &crlf_old, edit, &field)?;
        if !found.is_empty() {
            matches = found;
            old = crlf_old.into();
            new = to_crlf(&edit.new).into();
            crlf_adapted = true;
        }
    }
    let unchanged = if several {
        " No edit was applied; the file is unchanged."
    } else {
        ""
    };
    if matches.is_empty() {
        let message = format!(
            "{} was not found in '{shown}'. {}{unchanged}",
            edit.label,
            not_found_hint(content, &edit.old, several)
        );
        return Err(ToolError::invalid(NAME, &field, message));
    }
    if matches.len() > 1 && !edit.replace_all {
        let lines = line_numbers(
            content.as_bytes(),
            &matches[..matches.len().min(MAX_LISTED_MATCHES)],
        );
        let listed: Vec<String> = lines.iter().map(usize::to_string).collect();
        let more = if matches.len() > MAX_LISTED_MATCHES {
            ", ..."
        } else {
            ""
        };
        let message = format!(
            "{} matches {} places in '{shown}' (at lines {}{more}). Add surrounding lines to it so it matches exactly one place, or set replace_all to true to replace all {}.{unchanged}",
            edit.label,
            matches.len(),
            listed.join(", "),
            matches.len()
        );
        return Err(ToolError::invalid(NAME, &field, message));
    }

    let (old_len, new_len) = (old.len(), new.len());
    // The result's size, known before anything is allocated: one replace_all of a short
    // string by a long one could otherwise ask for terabytes.
    let size = matches
        .len()
        .checked_mul(new_len)
        .and_then(|grown| (content.len() - matches.len() * old_len).checked_add(grown))
        .filter(|&size| size as u64 <= MAX_EDIT_BYTES);
    let Some(size) = size else {
        return Err(ToolError::invalid(
            NAME,
            &format!("{}/new_string", edit.pointer),
            format!(
                "{} would make '{shown}' larger than {}, the most edit_file writes.{unchanged} Make a smaller change, or write the file with write_file or a command.",
                edit.label,
                human_size(MAX_EDIT_BYTES)
            ),
        ));
    };
    let mut out = String::with_capacity(size);
    let mut last = 0;
    for &m in &matches {
        out.push_str(&content[last..m]);
        out.push_str(&new);
        last = m + old_len;
    }
    out.push_str(&content[last..]);

    // Only the differing middle of old/new counts as changed, so that a new_string that
    // keeps old_string's surrounding newlines does not report the neighbouring lines.
    let (o, n) = (old.as_bytes(), new.as_bytes());
    let pre = o.iter().zip(n).take_while(|(a, b)| a == b).count();
    let suf = o[pre..]
        .iter()
        .rev()
        .zip(n[pre..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    remap_ranges(ranges, &matches, (old_len, new_len), (pre, new_len - suf));
    Ok((
        out,
        Applied {
            replacements: matches.len(),
            crlf_adapted,
        },
    ))
}

/// Most places one edit replaces (each costs a position and a changed range in memory).
const MAX_REPLACEMENTS: usize = 1_000_000;

/// Byte positions of `old` in `content`, refused past [`MAX_REPLACEMENTS`].
fn match_positions(content: &str, old: &str, edit: &Edit, field: &str) -> ToolResult<Vec<usize>> {
    let mut found = Vec::new();
    for (at, _) in content.match_indices(old) {
        if found.len() == MAX_REPLACEMENTS {
            return Err(ToolError::invalid(
                NAME,
                field,
                format!(
                    "{} matches more than {MAX_REPLACEMENTS} places; make it longer, or change a file like this with a command (e.g. sed).",
                    edit.label
                ),
            ));
        }
        found.push(at);
    }
    Ok(found)
}

/// `s` with every line break written as `\r\n`.
fn to_crlf(s: &str) -> String {
    s.replace("\r\n", "\n").replace('\n', "\r\n")
}

/// Moves the changed ranges of earlier edits to where their text now is after replacing
/// `matches` (positions of `old_len` bytes each) by `new_len` bytes, and adds the changed
/// part (`changed`, a byte range within new_string) of each replacement.
fn remap_ranges(
    ranges: &mut Vec<(usize, usize)>,
    matches: &[usize],
    (old_len, new_len): (usize, usize),
    changed: (usize, usize),
) {
    let delta = new_len as i128 - old_len as i128;
    // Start of the k-th replacement in the new content.
    let placed = |k: usize| -> usize { (matches[k] as i128 + k as i128 * delta) as usize };
    // Where old position `x` lands; a position inside a replaced match snaps to the start
    // (`end == false`) or end (`end == true`) of its replacement.
    let map = |x: usize, end: bool| -> usize {
        let before = matches.partition_point(|&m| m + old_len <= x);
        if before < matches.len() && matches[before] < x {
            let start = placed(before);
            return if end { start + new_len } else { start };
        }
        (x as i128 + before as i128 * delta) as usize
    };
    let mut all: Vec<(usize, usize)> = ranges
        .iter()
        .map(|&(s, e)| (map(s, false), map(e, true)))
        .collect();
    all.extend((0..matches.len()).map(|k| (placed(k) + changed.0, placed(k) + changed.1)));
    all.sort_unstable();
    ranges.clear();
    for (s, e) in all {
        match ranges.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => ranges.push((s, e)),
        }
    }
}

/// 1-based line numbers of sorted byte positions, in one pass.
fn line_numbers(bytes: &[u8], positions: &[usize]) -> Vec<usize> {
    let mut line = 1;
    let mut at = 0;
    positions
        .iter()
        .map(|&p| {
            line += count_newlines(&bytes[at..p]);
            at = p;
            line
        })
        .collect()
}

/// Why an `old_string` may have missed, as advice for the next attempt.
fn not_found_hint(content: &str, old: &str, several: bool) -> String {
    let mut hint = String::new();
    let line_of = |at: usize| line_numbers(content.as_bytes(), &[at])[0];
    let stripped = strip_line_number_prefixes(old);
    let candidate = match &stripped {
        Some(text) => {
            hint.push_str("It seems to include read_file's line-number prefixes (number and tab); leave those out. ");
            match content.find(text.as_str()) {
                Some(at) => {
                    let _ = write!(hint, "Without them it matches at line {}.", line_of(at));
                    return finish_hint(hint, several);
                }
                None => text.as_str(),
            }
        }
        None => old,
    };
    if let Some(at) = loose_find(content, candidate, Loose::Whitespace) {
        let _ = write!(
            hint,
            "Text that differs only in whitespace (indentation, tabs, line breaks, trailing spaces) starts at line {}; copy it exactly from read_file output.",
            line_of(at)
        );
    } else if let Some(at) = loose_find(content, candidate, Loose::Case) {
        let _ = write!(
            hint,
            "Text that differs only in upper/lower case starts at line {}; copy it exactly from read_file output.",
            line_of(at)
        );
    } else {
        hint.push_str(
            "Read the file again with read_file and copy the exact text, including whitespace.",
        );
    }
    finish_hint(hint, several)
}

fn finish_hint(mut hint: String, several: bool) -> String {
    if several {
        hint.push_str(" Edits apply in order, so each old_string must match the text as the earlier edits left it.");
    }
    hint
}

/// `s` without read_file's `   12\t` prefixes, when every line has one.
fn strip_line_number_prefixes(s: &str) -> Option<String> {
    let mut out = Vec::new();
    for line in s.split('\n') {
        let rest = line.trim_start_matches(' ');
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if line.is_empty() && !out.is_empty() {
            // A trailing newline leaves one empty piece.
            out.push("");
            continue;
        }
        let body = rest[digits..].strip_prefix('\t').filter(|_| digits > 0)?;
        out.push(body);
    }
    Some(out.join("\n"))
}

/// A looser way to compare text, for hints only.
#[derive(Debug, Clone, Copy)]
enum Loose {
    /// Every run of whitespace counts as one space.
    Whitespace,
    /// Upper and lower case are the same.
    Case,
}

/// Feeds the loosened form of `s` to `emit`, char by char, with the byte offset in `s` of
/// the char each one comes from.
fn loosen(s: &str, mode: Loose, mut emit: impl FnMut(usize, char)) {
    let mut in_space = false;
    for (i, c) in s.char_indices() {
        match mode {
            Loose::Whitespace if c.is_whitespace() => {
                if !in_space {
                    emit(i, ' ');
                }
                in_space = true;
            }
            Loose::Whitespace => {
                in_space = false;
                emit(i, c);
            }
            Loose::Case => c.to_lowercase().for_each(|l| emit(i, l)),
        }
    }
}

/// Byte offset in `hay` where `needle` matches when both are loosened by `mode`.
fn loose_find(hay: &str, needle: &str, mode: Loose) -> Option<usize> {
    let mut loose_needle = String::new();
    loosen(needle, mode, |_, c| loose_needle.push(c));
    let loose_needle = match mode {
        Loose::Whitespace => loose_needle.trim(),
        Loose::Case => loose_needle.as_str(),
    };
    if loose_needle.is_empty() {
        return None;
    }
    let mut loose_hay = String::with_capacity(hay.len());
    loosen(hay, mode, |_, c| loose_hay.push(c));
    let target = loose_hay.find(loose_needle)?;
    // Map back by replaying the loosening: the source char whose output covers `target`.
    let mut len = 0;
    let mut found = None;
    loosen(hay, mode, |i, c| {
        len += c.len_utf8();
        if found.is_none() && len > target {
            found = Some(i);
        }
    });
    found
}

/// The answer: how many replacements, which lines changed, and the first change in context.
fn report(
    shown: &str,
    content: &str,
    edits: &[Edit],
    applied: &[Applied],
    ranges: &[(usize, usize)],
) -> String {
    let total: usize = applied.iter().map(|a| a.replacements).sum();
    let mut out = format!(
        "Edited '{shown}': {total} replacement{}",
        if total == 1 { "" } else { "s" }
    );
    if edits.len() > 1 {
        let per: Vec<String> = edits
            .iter()
            .zip(applied)
            .map(|(e, a)| format!("{}: {}", e.label, a.replacements))
            .collect();
        let _ = write!(out, " from {} edits ({})", edits.len(), per.join(", "));
    }
    out.push('.');
    let adapted: Vec<&str> = edits
        .iter()
        .zip(applied)
        .filter(|(_, a)| a.crlf_adapted)
        .map(|(e, _)| e.label.as_str())
        .collect();
    if !adapted.is_empty() {
        let _ = write!(
            out,
            " Line breaks of {} were written as \\r\\n to match the file's CRLF line endings.",
            adapted.join(", ")
        );
    }

    let bytes = content.as_bytes();
    let lines = line_ranges(bytes, ranges);
    let listed: Vec<String> = lines
        .iter()
        .take(MAX_LISTED_RANGES)
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    let more = lines.len().saturating_sub(MAX_LISTED_RANGES);
    let _ = write!(
        out,
        " Changed line{} (as the file is now): {}",
        if lines.len() == 1 && lines[0].0 == lines[0].1 {
            ""
        } else {
            "s"
        },
        listed.join(", ")
    );
    if more > 0 {
        let _ = write!(out, " and {more} more ranges");
    }
    out.push('.');

    let Some(&(first, last)) = lines.first() else {
        return out;
    };
    if content.is_empty() {
        out.push_str("\nThe file is now empty.");
        return out;
    }
    let total_lines = count_lines(bytes);
    let from = first.saturating_sub(SNIPPET_CONTEXT).max(1);
    let to = (last + SNIPPET_CONTEXT)
        .min(total_lines)
        .min(from + SNIPPET_MAX_LINES - 1);
    out.push('\n');
    let start = line_start(bytes, from - 1);
    for (i, raw) in content[start..]
        .split_inclusive('\n')
        .take(to + 1 - from)
        .enumerate()
    {
        number_line(&mut out, from + i, split_line(raw).0);
    }
    if to < last {
        out.push_str("[... rest of the change not shown; use read_file to see it]\n");
    }
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

/// 1-based inclusive line ranges of sorted, disjoint byte ranges. An empty range (a
/// deletion) is the line where the text was removed.
fn line_ranges(bytes: &[u8], ranges: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let total = count_lines(bytes).max(1);
    let mut line = 1;
    let mut at = 0;
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for &(s, e) in ranges {
        line += count_newlines(&bytes[at..s]);
        at = s;
        let first = line.min(total);
        let last = if e > s {
            line + count_newlines(&bytes[s..e - 1])
        } else {
            line
        };
        let last = last.min(total);
        match out.last_mut() {
            // Changes on the same or adjacent lines read best as one range.
            Some(prev) if first <= prev.1 + 1 => prev.1 = prev.1.max(last),
            _ => out.push((first, last)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::worktree as setup;
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};
    use td_base::hash::sha256_hex;

    /// Calls another tool by name, as a loop would (the tools never import each other).
    async fn call_tool(ctx: &ToolContext, name: &str, input: Value) {
        let out = crate::all_tools().call(ctx, None, name, input).await;
        assert!(!out.is_error, "{name}: {}", out.content);
    }

    async fn read(ctx: &ToolContext, path: &str) {
        call_tool(ctx, "read_file", json!({"path": path})).await;
    }

    /// Puts a file on disk (as the user would) and reads it (as the model must).
    async fn put_read(ctx: &ToolContext, rel: &str, content: &str) -> PathBuf {
        let p = ctx.root().join(rel);
        std::fs::write(&p, content).unwrap();
        read(ctx, rel).await;
        p
    }

    async fn edit(ctx: &ToolContext, input: Value) -> ToolResult<ToolOutput> {
        EditFile.execute(input, ctx).await
    }

    fn on_disk(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap()
    }

    #[tokio::test]
    async fn one_edit_replaces_reports_and_shows_the_result() {
        let (_d, ctx) = setup();
        let body: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        let p = put_read(&ctx, "f.txt", &body).await;
        let out = edit(
            &ctx,
            json!({"path": "f.txt", "old_string": "line 6\n", "new_string": "six\nsix and a half\n"}),
        )
        .await
        .unwrap();
        let expected = body.replace("line 6\n", "six\nsix and a half\n");
        assert_eq!(on_disk(&p), expected);
        assert_eq!(
            out.content,
            "Edited 'f.txt': 1 replacement. Changed lines (as the file is now): 6-7.\n\
             \x20    3\tline 3\n     4\tline 4\n     5\tline 5\n     6\tsix\n     7\tsix and a half\n\
             \x20    8\tline 7\n     9\tline 8\n    10\tline 9"
        );
        assert_eq!(
            out.effects,
            vec![SideEffect::FileWritten {
                path: "f.txt".into(),
                hash: sha256_hex(expected.as_bytes()),
            }]
        );
        // The edit refreshed the stamp: a second edit needs no new read.
        edit(
            &ctx,
            json!({"path": "f.txt", "old_string": "six\n", "new_string": "6\n"}),
        )
        .await
        .unwrap();
        assert!(on_disk(&p).contains("\n6\nsix and a half\n"));
    }

    #[tokio::test]
    async fn replace_all_changes_every_occurrence() {
        let (_d, ctx) = setup();
        let p = put_read(&ctx, "f.rs", "let a = 1;\nlet b = a;\nfoo(a);\n").await;
        let out = edit(
            &ctx,
            json!({"path": "f.rs", "old_string": "a", "new_string": "alpha", "replace_all": true}),
        )
        .await
        .unwrap();
        assert_eq!(on_disk(&p), "let alpha = 1;\nlet b = alpha;\nfoo(alpha);\n");
        assert!(
            out.content.starts_with(
                "Edited 'f.rs': 3 replacements. Changed lines (as the file is now): 1-3."
            ),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn an_ambiguous_old_string_lists_its_lines_and_writes_nothing() {
        let (_d, ctx) = setup();
        let body = "x\n".repeat(12);
        let p = put_read(&ctx, "f.txt", &body).await;
        let err = edit(
            &ctx,
            json!({"path": "f.txt", "old_string": "x", "new_string": "y"}),
        )
        .await
        .unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(
            msg.contains("at /old_string: old_string matches 12 places"),
            "{msg}"
        );
        assert!(
            msg.contains("(at lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ...)"),
            "{msg}"
        );
        assert!(msg.contains("replace_all"), "{msg}");
        assert_eq!(on_disk(&p), body);
    }

    #[tokio::test]
    async fn several_edits_apply_in_order() {
        let (_d, ctx) = setup();
        let p = put_read(&ctx, "f.txt", "alpha\nbeta\ngamma\ndelta\n").await;
        let out = edit(
            &ctx,
            json!({"path": "f.txt", "edits": [
                {"old_string": "alpha", "new_string": "ALPHA"},
                // Sees the first edit's result.
                {"old_string": "ALPHA\nbeta", "new_string": "AB"},
                {"old_string": "a", "new_string": "4", "replace_all": true}
            ]}),
        )
        .await
        .unwrap();
        assert_eq!(on_disk(&p), "AB\ng4mm4\ndelt4\n");
        assert!(
            out.content.starts_with(
                "Edited 'f.txt': 5 replacements from 3 edits (edits[0]: 1, edits[1]: 1, edits[2]: 3). Changed lines (as the file is now): 1-3."
            ),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn a_failing_edit_in_a_list_writes_nothing() {
        let (_d, ctx) = setup();
        let p = put_read(&ctx, "f.txt", "one\ntwo\n").await;
        let err = edit(
            &ctx,
            json!({"path": "f.txt", "edits": [
                {"old_string": "one", "new_string": "1"},
                {"old_string": "three", "new_string": "3"}
            ]}),
        )
        .await
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("at /edits/1/old_string: edits[1] was not found"),
            "{msg}"
        );
        assert!(
            msg.contains("No edit was applied; the file is unchanged."),
            "{msg}"
        );
        assert!(msg.contains("Edits apply in order"), "{msg}");
        assert_eq!(on_disk(&p), "one\ntwo\n");
        // The stamp still holds: the next, correct call works.
        edit(
            &ctx,
            json!({"path": "f.txt", "old_string": "one", "new_string": "1"}),
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn not_found_hints_at_whitespace_case_and_line_numbers() {
        let (_d, ctx) = setup();
        put_read(
            &ctx,
            "f.rs",
            "fn main() {\n\tlet x = 1;\n    Println!(\"hi\");\n}\n",
        )
        .await;
        let cases = [
            ("let  x = 1;", "differs only in whitespace", "line 2"),
            (
                "println!(\"hi\");",
                "differs only in upper/lower case",
                "line 3",
            ),
            (
                "     2\tlet x = 1;",
                "line-number prefixes",
                "Without them it matches at line 2",
            ),
            ("     2\tlet  x = 1;", "line-number prefixes", "whitespace"),
            ("nothing like it", "Read the file again", ""),
        ];
        for (old, hint, line) in cases {
            let err = edit(
                &ctx,
                json!({"path": "f.rs", "old_string": old, "new_string": "z"}),
            )
            .await
            .unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("old_string was not found in 'f.rs'"), "{msg}");
            assert!(msg.contains(hint), "{old}: {msg}");
            assert!(msg.contains(line), "{old}: {msg}");
        }
    }

    #[tokio::test]
    async fn crlf_files_match_plain_newlines() {
        let (_d, ctx) = setup();
        let p = put_read(&ctx, "w.txt", "a\r\nb\r\nc\r\n").await;
        let out = edit(
            &ctx,
            json!({"path": "w.txt", "old_string": "a\nb\n", "new_string": "x\ny\nz\n"}),
        )
        .await
        .unwrap();
        assert_eq!(on_disk(&p), "x\r\ny\r\nz\r\nc\r\n");
        assert!(out.content.contains("written as \\r\\n"), "{}", out.content);
        assert!(
            out.content
                .contains("Changed lines (as the file is now): 1-3."),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn argument_misuse_is_reported_with_pointers() {
        let (_d, ctx) = setup();
        let p = put_read(&ctx, "f.txt", "text\n").await;
        let cases = [
            (
                json!({"path": "f.txt", "old_string": "", "new_string": "x"}),
                "/old_string",
                "write_file",
            ),
            (
                json!({"path": "f.txt", "old_string": "text", "new_string": "text"}),
                "/new_string",
                "identical",
            ),
            (
                json!({"path": "f.txt"}),
                "at /:",
                "give old_string and new_string",
            ),
            (
                json!({"path": "f.txt", "old_string": "text"}),
                "/new_string",
                "required",
            ),
            (
                json!({"path": "f.txt", "new_string": "text"}),
                "/old_string",
                "required",
            ),
            (
                json!({"path": "f.txt", "old_string": "a", "new_string": "b", "edits": [{"old_string": "t", "new_string": "T"}]}),
                "/old_string",
                "not both",
            ),
            (
                json!({"path": "f.txt", "replace_all": true, "edits": [{"old_string": "t", "new_string": "T"}]}),
                "/replace_all",
                "inside each edit",
            ),
            (
                json!({"path": "f.txt", "edits": []}),
                "/edits",
                "at least one",
            ),
            (
                json!({"path": "f.txt", "edits": [{"old_string": "t", "new_string": "T"}, {"old_string": "", "new_string": "T"}]}),
                "/edits/1/old_string",
                "is empty",
            ),
        ];
        for (input, pointer, words) in cases {
            let err = edit(&ctx, input.clone()).await.unwrap_err();
            assert_eq!(err.kind(), "invalid_arguments", "{input}");
            let msg = err.to_string();
            assert!(msg.contains(pointer), "{input}: {msg}");
            assert!(msg.contains(words), "{input}: {msg}");
        }
        assert_eq!(on_disk(&p), "text\n");
    }

    #[tokio::test]
    async fn the_schema_checks_types_and_the_list_shape() {
        let (_d, ctx) = setup();
        put_read(&ctx, "f.txt", "text\n").await;
        let set = crate::all_tools();
        for input in [
            json!({"path": "f.txt", "edits": []}),
            json!({"path": "f.txt", "edits": [{"old_string": "t"}]}),
            json!({"path": "f.txt", "edits": [{"old_string": "t", "new_string": "T", "x": 1}]}),
            json!({"path": "f.txt", "old_string": "t", "new_string": "T", "replace_all": "yes"}),
        ] {
            let out = set.call(&ctx, None, NAME, input.clone()).await;
            assert!(out.is_error, "{input}");
            assert_eq!(
                out.receipt.error_kind.as_deref(),
                Some("invalid_arguments"),
                "{input}"
            );
        }
    }

    #[tokio::test]
    async fn an_edit_without_a_read_is_refused() {
        let (_d, ctx) = setup();
        std::fs::write(ctx.root().join("f.txt"), "one\n").unwrap();
        let err = edit(
            &ctx,
            json!({"path": "f.txt", "old_string": "one", "new_string": "1"}),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), "edit_without_read");
        assert!(err.to_string().contains("'f.txt'"));
        assert_eq!(on_disk(&ctx.root().join("f.txt")), "one\n");
    }

    #[tokio::test]
    async fn an_outside_change_makes_the_read_stale_until_read_again() {
        let (_d, ctx) = setup();
        let p = put_read(&ctx, "f.txt", "one\n").await;
        std::fs::write(&p, "one\ntwo\n").unwrap();
        let input = json!({"path": "f.txt", "old_string": "one", "new_string": "1"});
        let err = edit(&ctx, input.clone()).await.unwrap_err();
        assert_eq!(err.kind(), "stale_read");
        assert_eq!(on_disk(&p), "one\ntwo\n");
        read(&ctx, "f.txt").await;
        edit(&ctx, input).await.unwrap();
        assert_eq!(on_disk(&p), "1\ntwo\n");
    }

    #[tokio::test]
    async fn a_touch_with_identical_bytes_is_not_a_change() {
        let (_d, ctx) = setup();
        let p = put_read(&ctx, "f.txt", "one\n").await;
        std::fs::write(&p, "one\n").unwrap();
        edit(
            &ctx,
            json!({"path": "f.txt", "old_string": "one", "new_string": "1"}),
        )
        .await
        .unwrap();
        assert_eq!(on_disk(&p), "1\n");
    }

    #[tokio::test]
    async fn a_file_written_by_the_loop_can_be_edited_without_a_read() {
        let (_d, ctx) = setup();
        call_tool(
            &ctx,
            "write_file",
            json!({"path": "n.txt", "content": "draft\n"}),
        )
        .await;
        edit(
            &ctx,
            json!({"path": "n.txt", "old_string": "draft", "new_string": "final"}),
        )
        .await
        .unwrap();
        assert_eq!(on_disk(&ctx.root().join("n.txt")), "final\n");
    }

    #[tokio::test]
    async fn non_text_missing_and_directory_targets_are_refused() {
        let (_d, ctx) = setup();
        let p = ctx.root().join("b.bin");
        std::fs::write(&p, [0xffu8, 0xfe, b'a']).unwrap();
        ctx.record_stamp(&p, &[0xff, 0xfe, b'a']);
        let err = edit(
            &ctx,
            json!({"path": "b.bin", "old_string": "a", "new_string": "b"}),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("not UTF-8 text"), "{err}");

        let err = edit(
            &ctx,
            json!({"path": "nope.txt", "old_string": "a", "new_string": "b"}),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), "not_found");
        assert!(err.to_string().contains("use write_file"), "{err}");

        std::fs::create_dir(ctx.root().join("d")).unwrap();
        let err = edit(
            &ctx,
            json!({"path": "d", "old_string": "a", "new_string": "b"}),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("it is a directory"), "{err}");
    }

    #[tokio::test]
    async fn escapes_are_refused() {
        let (_d, ctx) = setup();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("t.txt");
        std::fs::write(&target, "keep\n").unwrap();
        symlink(&target, ctx.root().join("link")).unwrap();
        // Even a stamp for the outside file must not open the door.
        ctx.record_stamp(&target, b"keep\n");
        let abs = target.to_str().unwrap().to_string();
        for path in ["../t.txt", "/etc/passwd", abs.as_str(), "link"] {
            let err = edit(
                &ctx,
                json!({"path": path, "old_string": "keep", "new_string": "gone"}),
            )
            .await
            .unwrap_err();
            assert_eq!(err.kind(), "sandbox_violation", "{path}");
        }
        assert_eq!(on_disk(&target), "keep\n");
    }

    #[tokio::test]
    async fn deleting_text_reports_the_line_where_it_was() {
        let (_d, ctx) = setup();
        let p = put_read(&ctx, "f.txt", "a\nb\nc\nd\n").await;
        let out = edit(
            &ctx,
            json!({"path": "f.txt", "old_string": "b\nc\n", "new_string": ""}),
        )
        .await
        .unwrap();
        assert_eq!(on_disk(&p), "a\nd\n");
        assert!(
            out.content
                .contains("Changed line (as the file is now): 2."),
            "{}",
            out.content
        );
        let out = edit(
            &ctx,
            json!({"path": "f.txt", "old_string": "a\nd\n", "new_string": ""}),
        )
        .await
        .unwrap();
        assert!(
            out.content.ends_with("The file is now empty."),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn a_long_change_shows_a_bounded_snippet() {
        let (_d, ctx) = setup();
        put_read(&ctx, "f.txt", "start\nend\n").await;
        let block: String = (1..=40).map(|i| format!("new {i}\n")).collect();
        let out = edit(
            &ctx,
            json!({"path": "f.txt", "old_string": "start\n", "new_string": block}),
        )
        .await
        .unwrap();
        let numbered = out.content.lines().filter(|l| l.contains('\t')).count();
        assert_eq!(numbered, SNIPPET_MAX_LINES);
        assert!(
            out.content
                .contains("Changed lines (as the file is now): 1-40.")
        );
        assert!(
            out.content
                .ends_with("[... rest of the change not shown; use read_file to see it]")
        );
    }

    #[test]
    fn ranges_follow_later_edits() {
        // "aXbXc": replace X by "12" at 1 and 3 -> "a12b12c".
        let mut ranges = Vec::new();
        remap_ranges(&mut ranges, &[1, 3], (1, 2), (0, 2));
        assert_eq!(ranges, vec![(1, 3), (4, 6)]);
        // Then "b" (at 3) becomes "" : the second range shifts left by one.
        remap_ranges(&mut ranges, &[3], (1, 0), (0, 0));
        assert_eq!(ranges, vec![(1, 5)]);
        // An edit that swallows an earlier change covers it.
        let mut ranges = vec![(2, 3)];
        remap_ranges(&mut ranges, &[0], (5, 1), (0, 1));
        assert_eq!(ranges, vec![(0, 1)]);
        let lines = line_ranges(b"a\nb\nc\nd\n", &[(0, 1), (6, 6)]);
        assert_eq!(lines, vec![(1, 1), (4, 4)]);
        let lines = line_ranges(b"a\nb\nc\nd\n", &[(0, 1), (2, 3)]);
        assert_eq!(lines, vec![(1, 2)]);
    }

    #[test]
    fn loose_matching_maps_back_to_the_source() {
        let hay = "x\n  foo   bar\nBAZ";
        assert_eq!(loose_find(hay, "foo bar", Loose::Whitespace), Some(4));
        assert_eq!(loose_find(hay, "baz", Loose::Case), Some(14));
        assert_eq!(loose_find(hay, "   ", Loose::Whitespace), None);
        assert_eq!(loose_find(hay, "qux", Loose::Case), None);
    }
}
