//! `read_file`: a text file shown with line numbers (like `cat -n`), a window of lines at a
//! time, within the catalog's output cap. Every successful text read records a stamp of the
//! whole file, which `edit_file` requires.
//!
//! Memory stays bounded whatever the file's size: the file is read once, a chunk at a time.
//! Every chunk feeds the incremental stamp hash (XXH3-128: the stamp covers the whole file),
//! the line count and a UTF-8 check; only the lines of the requested window are kept, each cut to
//! `MAX_LINE_CHARS` characters as it arrives, and nothing more is kept once the output cap
//! is reached. A 1 GB file costs one chunk plus about the cap.
//!
//! A file with invalid UTF-8 anywhere, even far past the window, counts as binary (the note
//! gives the offset of the first bad byte) and is not stamped: the whole file is read for
//! the stamp anyway, the same file must not be text for one window and binary for another,
//! and `edit_file` only edits UTF-8 text, so a stamp would only lead to a failed edit. The
//! read stops early at the first bad byte, or at a NUL in the first 8 KiB.
//!
//! Paging through a large file must not cost a full pass per page: a full pass over a text
//! file of at least `INDEX_MIN_BYTES` also keeps a [`ReadIndex`] in the loop's context: the
//! file's identity (device, inode, size, mtime, ctime), its stamp, its line count and a
//! checkpoint (byte offset, lines before it) every so many chunks. A later read of the same
//! path whose identity is unchanged, and whose stamp the loop still holds, reads only from
//! the checkpoint before its window to the window's end. Any change to the file changes its
//! ctime (the kernel sets it; no user call can), and an index is only kept when the file's
//! ctime was already `SETTLE` old when the pass began, so a write in the same clock tick as
//! the pass cannot hide behind an unchanged timestamp (git's "racy clean" rule).

use std::fmt::Write as _;
use std::io::Read as _;
use std::io::{Seek as _, SeekFrom};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::files::access::open_for_reading;
use crate::files::lines::{MAX_LINE_CHARS, count_newlines, line_start, write_numbered};
use crate::files::size::human_size;
use crate::search::walk;
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::read_index::{FileIdentity, ReadIndex};
use td_toolkit::stamp::Stamp;
use td_toolkit::stamp::StampHasher;
use td_toolkit::tool::{Tool, ToolOutput};
use td_toolkit::worktree_fs::OpenedFile;

const NAME: &str = "read_file";

/// Lines shown when the call gives no `limit`.
const DEFAULT_LIMIT: u64 = 2000;

/// How much of the file's start is searched for a NUL byte (as git and grep do).
const BINARY_SNIFF_BYTES: usize = 8 * 1024;

/// Room kept free under the output cap for the closing note.
const FOOTER_RESERVE: usize = 300;

/// Bytes read per step: memory use is bounded by this plus the output cap, whatever the
/// size of the file.
const READ_CHUNK: usize = 32 * 1024;

/// Room before each chunk for the cut start of a UTF-8 sequence (at most 3 bytes).
const UTF8_CARRY_ROOM: usize = 4;

/// Files smaller than this are hashed again on every read (under a millisecond); larger
/// ones get a [`ReadIndex`].
const INDEX_MIN_BYTES: u64 = 1 << 20;

/// Most checkpoints an index keeps (16 bytes each), whatever the size of the file.
const MAX_CHECKPOINTS: u64 = 1024;

/// How old a file's ctime must be when a full pass begins for the pass to leave an index:
/// timestamps come from a coarse clock, so a write just after the pass began could carry
/// the same ctime as one just before it.
const SETTLE: Duration = Duration::from_millis(100);

/// How one read goes about the file (tests use tiny chunks and no thresholds).
#[derive(Debug, Clone, Copy)]
struct Reading {
    /// Bytes read per step.
    chunk: usize,
    /// Smallest file that gets an index.
    index_min: u64,
    /// See [`SETTLE`]; `None` keeps every index (tests that build one on a fresh file).
    settle: Option<Duration>,
}

const READING: Reading = Reading {
    chunk: READ_CHUNK,
    index_min: INDEX_MIN_BYTES,
    settle: Some(SETTLE),
};

/// The `read_file` tool.
pub struct ReadFile;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    #[serde(default = "default_offset")]
    offset: u64,
    #[serde(default = "default_limit")]
    limit: u64,
}

fn default_offset() -> u64 {
    1
}

fn default_limit() -> u64 {
    DEFAULT_LIMIT
}

/// What a read produced, before the stamp is recorded.
#[derive(Debug)]
enum Shown {
    /// Text the model saw (possibly a window of it) and the stamp of the whole file, which
    /// must be recorded; and, after a full pass over a large file, its index.
    Text {
        content: String,
        stamp: Stamp,
        index: Option<ReadIndex>,
    },
    /// A binary file: only described, so no stamp (edit_file cannot work on it anyway).
    Binary(String),
}

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Read a text file with line numbers, formatted like `cat -n` (right-aligned line number, a tab, the line). Shows up to `limit` lines starting at line `offset`; lines longer than 2000 characters are cut with a marker. When more lines remain, the output ends with the total line count and the offset to pass next. Binary files are described, not shown. edit_file only works on files you have read (or written) and that did not change since."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": super::path_schema(super::FILE_PATH),
                "offset": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "1-based number of the first line to show (default 1)."
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Maximum number of lines to show (default 2000)."
                }
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let args: ReadArgs = args::parse(NAME, input)?;
        let real = ctx.resolve(&args.path)?;
        let shown = ctx.display(&real);
        let req = Request {
            offset: to_usize(args.offset).max(1),
            limit: to_usize(args.limit).max(1),
            cap: ctx.spec(NAME).max_output_bytes,
        };
        let known = ctx.read_index(&real);
        let result = {
            let real = real.clone();
            let files = Arc::clone(ctx.files());
            walk::run_blocking(NAME, move |cancel| {
                let opened = open_for_reading(&files, &real, &shown)?;
                load(opened, &shown, req, cancel, known.as_deref())
            })
            .await?
        };
        match result {
            Shown::Text {
                content,
                stamp,
                index,
            } => {
                ctx.record_stamp_hash(&real, stamp);
                if let Some(index) = index {
                    ctx.keep_read_index(&real, Arc::new(index));
                }
                Ok(ToolOutput::text(content))
            }
            Shown::Binary(content) => Ok(ToolOutput::text(content)),
        }
    }
}

/// Numbers in JSON may exceed `usize` on small targets; saturate instead of failing.
fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// What the model asked to see, and the output cap it must fit in.
#[derive(Debug, Clone, Copy)]
struct Request {
    /// 1-based number of the first line shown.
    offset: usize,
    /// Most lines shown.
    limit: usize,
    /// The tool's output cap in bytes.
    cap: usize,
}

/// Reads the file in one streaming pass (see the module docs) and renders the window; or,
/// when `known` still describes the file, only the part of it the window needs.
fn load(
    opened: OpenedFile,
    shown: &str,
    req: Request,
    cancel: &AtomicBool,
    known: Option<&ReadIndex>,
) -> ToolResult<Shown> {
    load_opened(opened, shown, req, cancel, READING, known)
}

/// `load` reading as `how` says (tests use tiny chunks to cut lines, characters and CRLF
/// pairs at every possible place).
fn load_opened(
    opened: OpenedFile,
    shown: &str,
    req: Request,
    cancel: &AtomicBool,
    how: Reading,
    known: Option<&ReadIndex>,
) -> ToolResult<Shown> {
    let mut file = opened.file;
    let io = |e: std::io::Error| {
        ToolError::failed(format!("reading '{shown}'"), e, "Try the call again.")
    };
    let meta = file.metadata().map_err(io)?;
    let identity = FileIdentity::of(&meta);
    let began = SystemTime::now();
    if let Some(index) = known.filter(|k| k.identity == identity) {
        if let Some(shown) = load_window(&mut file, shown, req, cancel, how.chunk, index)? {
            return Ok(shown);
        }
        file.seek(SeekFrom::Start(0)).map_err(io)?;
    }
    let mut scan = Scan::new(req, meta.len());
    let indexing = meta.len() >= how.index_min;
    let chunk = how.chunk.max(1);
    let every = meta
        .len()
        .div_ceil(MAX_CHECKPOINTS.saturating_mul(chunk as u64))
        .max(1);
    let mut checkpoints = Vec::new();
    let mut chunks_read = 0u64;
    // The first `carried` bytes of `buf` are the start of a UTF-8 sequence that the previous
    // chunk cut; they are validated again with the bytes that complete them.
    let mut buf = vec![0u8; UTF8_CARRY_ROOM + chunk];
    let mut carried = 0usize;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(ToolError::failed(
                format!("reading '{shown}'"),
                "the call was abandoned",
                "Read a smaller file or try again.",
            ));
        }
        let n = fill(&mut file, &mut buf[carried..carried + chunk]).map_err(io)?;
        let len = carried + n;
        let sniffed = usize::try_from(scan.bytes).unwrap_or(usize::MAX);
        let sniff = BINARY_SNIFF_BYTES.saturating_sub(sniffed).min(n);
        if buf[carried..carried + sniff].contains(&0) {
            return Ok(binary(shown, meta.len(), "it contains NUL bytes"));
        }
        // The fast check first: almost every chunk of a text file is valid as it stands, and
        // the standard library's check (which locates the problem) is twice as slow.
        let valid = simdutf8::basic::from_utf8(&buf[..len]).map(|_| ());
        let next_carry = match valid.or_else(|_| std::str::from_utf8(&buf[..len]).map(|_| ())) {
            Ok(()) => 0,
            // The chunk ended inside a sequence; the next chunk may complete it.
            Err(e) if e.error_len().is_none() && n > 0 => len - e.valid_up_to(),
            Err(e) => {
                let at = scan.bytes - carried as u64 + e.valid_up_to() as u64;
                let why = format!("it is not valid UTF-8 (first bad byte at offset {at})");
                return Ok(binary(shown, meta.len(), &why));
            }
        };
        if n == 0 {
            break;
        }
        if indexing && chunks_read.is_multiple_of(every) {
            checkpoints.push((scan.bytes, scan.newlines));
        }
        chunks_read += 1;
        scan.feed(&buf[carried..len]);
        buf.copy_within(len - next_carry..len, 0);
        carried = next_carry;
    }
    let (newlines, last) = (scan.newlines, scan.last);
    let mut shown = scan.finish(shown)?;
    if let Shown::Text { stamp, index, .. } = &mut shown {
        // Kept only if the file settled before the pass and did not change during it.
        let unchanged = file
            .metadata()
            .is_ok_and(|m| FileIdentity::of(&m) == identity);
        let settled = how
            .settle
            .is_none_or(|settle| identity.settled_before(began, settle));
        if indexing && unchanged && settled {
            *index = Some(ReadIndex {
                identity,
                stamp: *stamp,
                newlines,
                last,
                checkpoints,
            });
        }
    }
    Ok(shown)
}

/// Shows the window of a file that `index` describes, reading from the checkpoint before
/// the window to the window's end. `None` when the file turns out not to match the index
/// (it changed without its identity changing): the caller then makes a full pass.
fn load_window(
    file: &mut std::fs::File,
    shown: &str,
    req: Request,
    cancel: &AtomicBool,
    chunk: usize,
    index: &ReadIndex,
) -> ToolResult<Option<Shown>> {
    let io = |e: std::io::Error| ToolError::failed(format!("reading '{shown}'"), e, "Try again.");
    let (start, newlines_before) = index.start_for(req.offset - 1);
    file.seek(SeekFrom::Start(start)).map_err(io)?;
    let mut scan = Scan::new(req, index.identity.len - start);
    scan.stamp = StampSource::Known(index.stamp);
    scan.bytes = start;
    scan.newlines = newlines_before;
    let mut buf = vec![0u8; chunk.max(1)];
    while scan.collecting() {
        if cancel.load(Ordering::Relaxed) {
            return Err(ToolError::failed(
                format!("reading '{shown}'"),
                "the call was abandoned",
                "Read a smaller file or try again.",
            ));
        }
        let n = fill(file, &mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        scan.feed(&buf[..n]);
    }
    let at_end = scan.bytes == index.identity.len;
    if scan.bytes > index.identity.len || (at_end && scan.newlines != index.newlines) {
        return Ok(None);
    }
    scan.bytes = index.identity.len;
    scan.newlines = index.newlines;
    scan.last = index.last;
    scan.finish(shown).map(Some)
}

/// Reads until `buf` is full or the file ends; returns how many bytes were read.
fn fill(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn binary(shown: &str, size: u64, why: &str) -> Shown {
    Shown::Binary(binary_note(shown, size, why))
}

/// Where a scan's stamp comes from.
enum StampSource {
    /// A full pass hashes every byte.
    Hashing(StampHasher),
    /// A window read through a [`ReadIndex`] takes the index's.
    Known(Stamp),
}

/// What one pass over the file has learned so far.
struct Scan {
    req: Request,
    /// Bytes of numbered lines that fit under the cap with room left for the closing note.
    budget: usize,
    stamp: StampSource,
    /// Bytes seen.
    bytes: u64,
    /// `\n` bytes seen: the 0-based number of the line the next byte belongs to.
    newlines: usize,
    /// The last byte seen.
    last: Option<u8>,
    /// The numbered lines of the window so far.
    out: String,
    shown_lines: usize,
    hit_cap: bool,
    saw_crlf: bool,
    /// The window line being read.
    line: LineHead,
    /// Scratch space for rendering one line.
    rendered: String,
}

impl Scan {
    /// A scan of a file of about `size` bytes (it may change while being read).
    fn new(req: Request, size: u64) -> Self {
        let budget = req.cap.saturating_sub(FOOTER_RESERVE);
        // Reserved once: growing by doubling would briefly hold two copies of the window.
        // A numbered line is at most 8 times its bytes (an empty line becomes 8 bytes), and
        // one line may go over the budget.
        let longest_line = 16 + 4 * MAX_LINE_CHARS + 64;
        let expected = usize::try_from(size.saturating_mul(8)).unwrap_or(usize::MAX);
        Self {
            req,
            budget,
            stamp: StampSource::Hashing(StampHasher::default()),
            bytes: 0,
            newlines: 0,
            last: None,
            out: String::with_capacity(expected.min(budget + longest_line).saturating_add(64)),
            shown_lines: 0,
            hit_cap: false,
            saw_crlf: false,
            line: LineHead::default(),
            rendered: String::new(),
        }
    }

    /// Whether lines of the window may still be shown.
    fn collecting(&self) -> bool {
        !self.hit_cap && self.shown_lines < self.req.limit
    }

    /// Takes in the next bytes of the file.
    fn feed(&mut self, chunk: &[u8]) {
        if let StampSource::Hashing(hasher) = &mut self.stamp {
            hasher.update(chunk);
        }
        self.bytes += chunk.len() as u64;
        if let Some(&b) = chunk.last() {
            self.last = Some(b);
        }
        let first = self.req.offset - 1;
        let mut rest = chunk;
        while !rest.is_empty() {
            if !self.collecting() {
                self.newlines += count_newlines(rest);
                return;
            }
            if self.newlines < first {
                // Before the window: skip whole lines without looking at them.
                let needed = first - self.newlines;
                let here = count_newlines(rest);
                if here < needed {
                    self.newlines += here;
                    return;
                }
                rest = &rest[line_start(rest, needed)..];
                self.newlines = first;
                continue;
            }
            match rest.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.line.push(&rest[..i]);
                    self.end_line(true);
                    self.newlines += 1;
                    rest = &rest[i + 1..];
                }
                None => {
                    self.line.push(rest);
                    return;
                }
            }
        }
    }

    /// Numbers the line just read and adds it, unless it would break the output cap.
    fn end_line(&mut self, newline: bool) {
        self.saw_crlf |= self.line.end(newline);
        self.rendered.clear();
        write_numbered(
            &mut self.rendered,
            self.req.offset + self.shown_lines,
            &String::from_utf8_lossy(&self.line.head),
            self.line.more,
        );
        self.line = LineHead::default();
        // At least one line always goes out, or a tiny cap would make the model loop on
        // the same offset forever; the registry's own cap still bounds what it sees.
        if self.shown_lines > 0 && self.out.len() + self.rendered.len() > self.budget {
            self.hit_cap = true;
            return;
        }
        self.out.push_str(&self.rendered);
        self.shown_lines += 1;
    }

    /// The answer once the whole file has been read.
    fn finish(mut self, shown: &str) -> ToolResult<Shown> {
        let offset = self.req.offset;
        let unterminated = self.last.is_some_and(|b| b != b'\n');
        if unterminated && self.collecting() && self.newlines + 1 >= offset {
            self.end_line(false);
        }
        let stamp = match &self.stamp {
            StampSource::Hashing(hasher) => hasher.finish(),
            StampSource::Known(known) => *known,
        };
        if self.bytes == 0 {
            let content =
                format!("'{shown}' is empty (0 bytes). Use write_file to give it content.");
            return Ok(Shown::Text {
                content,
                stamp,
                index: None,
            });
        }
        let total = self.newlines + usize::from(unterminated);
        if offset > total {
            return Err(ToolError::invalid(
                NAME,
                "/offset",
                format!(
                    "offset {offset} is past the end of '{shown}', which has {total} line{}. Pass an offset from 1 to {total}.",
                    plural(total)
                ),
            ));
        }
        let mut out = self.out;
        let last = offset + self.shown_lines - 1;
        if self.hit_cap {
            let _ = writeln!(
                out,
                "[Output limit of {} bytes reached: showing lines {offset}-{last} of {total}. Call read_file with offset={} to continue.]",
                self.req.cap,
                last + 1
            );
        } else if last < total {
            let _ = writeln!(
                out,
                "[Showing lines {offset}-{last} of {total}. Call read_file with offset={} to read more.]",
                last + 1
            );
        }
        if self.saw_crlf {
            out.push_str(
                "[This file uses CRLF (\\r\\n) line endings; the \\r is not shown. edit_file matches \\n in old_string against \\r\\n.]\n",
            );
        }
        // The last line's newline is noise for the model; keep output free of a trailing blank.
        if out.ends_with('\n') {
            out.pop();
        }
        Ok(Shown::Text {
            content: out,
            stamp,
            index: None,
        })
    }
}

/// The shown part of one line read in pieces: its first `MAX_LINE_CHARS` characters and
/// how many more there are, never the whole line (a minified file may be one huge line).
#[derive(Debug, Default)]
struct LineHead {
    head: Vec<u8>,
    head_chars: usize,
    /// A character past the limit was seen: nothing more is kept.
    full: bool,
    more: usize,
    /// The last byte so far was `\r`: dropped if `\n` follows (CRLF), else part of the line.
    pending_cr: bool,
}

impl LineHead {
    /// Adds the next bytes of the line (never a `\n`).
    fn push(&mut self, piece: &[u8]) {
        if piece.is_empty() {
            return;
        }
        if std::mem::take(&mut self.pending_cr) {
            self.add(b"\r");
        }
        match piece.split_last() {
            Some((b'\r', body)) => {
                self.add(body);
                self.pending_cr = true;
            }
            _ => self.add(piece),
        }
    }

    fn add(&mut self, bytes: &[u8]) {
        let mut cut = 0;
        if !self.full {
            // Keep bytes up to the first character past the limit; the rest of the last
            // kept character may only arrive with the next piece.
            cut = bytes.len();
            for (i, &b) in bytes.iter().enumerate() {
                if is_char_start(b) {
                    if self.head_chars == MAX_LINE_CHARS {
                        cut = i;
                        self.full = true;
                        break;
                    }
                    self.head_chars += 1;
                }
            }
            self.head.extend_from_slice(&bytes[..cut]);
        }
        self.more += bytes[cut..].iter().filter(|&&b| is_char_start(b)).count();
    }

    /// Ends the line (`newline`: with a `\n`); returns whether it ended in `\r\n`.
    fn end(&mut self, newline: bool) -> bool {
        let cr = std::mem::take(&mut self.pending_cr);
        if cr && !newline {
            self.add(b"\r");
        }
        cr && newline
    }
}

/// Whether `b` starts a UTF-8 character (is not a continuation byte `0b10xx_xxxx`).
fn is_char_start(b: u8) -> bool {
    b & 0b1100_0000 != 0b1000_0000
}

fn binary_note(shown: &str, size: u64, why: &str) -> String {
    let size = if size < 1024 {
        human_size(size)
    } else {
        format!("{}, {size} bytes", human_size(size))
    };
    format!(
        "'{shown}' is a binary file ({size}; {why}), not shown. If you need to inspect it, use run_command with `file` or `xxd | head`."
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::lines::{count_lines, number_line, split_line};
    use td_toolkit::worktree_fs::WorktreeFs;

    /// `load_opened` of the file at `path` (opened beneath its own directory).
    fn load_with(
        path: &Path,
        shown: &str,
        req: Request,
        cancel: &AtomicBool,
        how: Reading,
        known: Option<&ReadIndex>,
    ) -> ToolResult<Shown> {
        let dir = path.parent().unwrap().canonicalize().unwrap();
        let files = WorktreeFs::new(&dir).unwrap();
        let real = dir.join(path.file_name().unwrap());
        let opened = open_for_reading(&files, &real, shown)?;
        load_opened(opened, shown, req, cancel, how, known)
    }
    use crate::test_support::{put, schema_bounds, with_limits, worktree as setup};
    use proptest::prelude::*;
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};
    use td_toolkit::catalog::ToolSpecOverride;
    use td_toolkit::context::StampCheck;

    async fn read(ctx: &ToolContext, input: Value) -> ToolResult<ToolOutput> {
        ReadFile.execute(input, ctx).await
    }

    async fn text(ctx: &ToolContext, input: Value) -> String {
        let out = read(ctx, input).await.unwrap();
        assert!(!out.is_error);
        assert!(out.effects.is_empty(), "reading has no side effects");
        out.content
    }

    fn numbered(range: std::ops::RangeInclusive<usize>) -> String {
        range
            .map(|n| format!("{n:>6}\tline {n}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn lines_file(ctx: &ToolContext, rel: &str, n: usize) -> PathBuf {
        let body: String = (1..=n).map(|i| format!("line {i}\n")).collect();
        put(ctx, rel, body.as_bytes())
    }

    #[tokio::test]
    async fn shows_numbered_lines_and_records_the_stamp() {
        let (_d, ctx) = setup();
        let p = put(&ctx, "src/a.txt", b"first\n\tsecond\n");
        let out = text(&ctx, json!({"path": "src/a.txt"})).await;
        assert_eq!(out, "     1\tfirst\n     2\t\tsecond");
        assert_eq!(ctx.stamp(&p), Some(Stamp::of(b"first\n\tsecond\n")));
        assert!(ReadFile.read_only());
    }

    #[tokio::test]
    async fn a_last_line_without_newline_counts() {
        let (_d, ctx) = setup();
        put(&ctx, "a.txt", b"one\ntwo");
        assert_eq!(
            text(&ctx, json!({"path": "a.txt", "offset": 2})).await,
            "     2\ttwo"
        );
    }

    #[tokio::test]
    async fn offset_and_limit_choose_the_window_and_say_how_to_continue() {
        let (_d, ctx) = setup();
        lines_file(&ctx, "f.txt", 10);
        let out = text(&ctx, json!({"path": "f.txt", "offset": 3, "limit": 2})).await;
        assert_eq!(
            out,
            format!(
                "{}\n[Showing lines 3-4 of 10. Call read_file with offset=5 to read more.]",
                numbered(3..=4)
            )
        );
        // Reading to the end needs no note.
        let out = text(&ctx, json!({"path": "f.txt", "offset": 9})).await;
        assert_eq!(out, numbered(9..=10));
    }

    #[tokio::test]
    async fn default_limit_is_2000_lines() {
        let (_d, ctx) = setup();
        lines_file(&ctx, "big.txt", 2500);
        let out = text(&ctx, json!({"path": "big.txt"})).await;
        assert!(out.contains("  2000\tline 2000\n"));
        assert!(!out.contains("line 2001"));
        assert!(out.ends_with(
            "[Showing lines 1-2000 of 2500. Call read_file with offset=2001 to read more.]"
        ));
    }

    #[tokio::test]
    async fn a_partial_read_stamps_the_whole_file() {
        let (_d, ctx) = setup();
        let p = lines_file(&ctx, "f.txt", 50);
        text(&ctx, json!({"path": "f.txt", "offset": 10, "limit": 1})).await;
        let whole = std::fs::read(&p).unwrap();
        assert_eq!(ctx.check_stamp(&p, &whole), StampCheck::Current);
    }

    #[tokio::test]
    async fn offset_past_the_end_is_a_clear_error() {
        let (_d, ctx) = setup();
        let p = lines_file(&ctx, "f.txt", 3);
        let err = read(&ctx, json!({"path": "f.txt", "offset": 4}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        let msg = err.to_string();
        assert!(msg.contains("at /offset"), "{msg}");
        assert!(msg.contains("has 3 lines"), "{msg}");
        assert!(msg.contains("from 1 to 3"), "{msg}");
        assert_eq!(ctx.stamp(&p), None, "nothing was shown, nothing stamped");
    }

    #[tokio::test]
    async fn long_lines_are_cut_on_a_char_boundary() {
        let (_d, ctx) = setup();
        let line = "é".repeat(2500);
        put(&ctx, "wide.txt", format!("{line}\nshort\n").as_bytes());
        let out = text(&ctx, json!({"path": "wide.txt"})).await;
        let first = out.lines().next().unwrap();
        assert_eq!(
            first,
            format!(
                "     1\t{} [... line cut: 500 more characters]",
                "é".repeat(2000)
            )
        );
        assert!(out.ends_with("     2\tshort"));
    }

    #[tokio::test]
    async fn a_line_of_exactly_2000_chars_is_whole() {
        let (_d, ctx) = setup();
        let line = "x".repeat(2000);
        put(&ctx, "w.txt", line.as_bytes());
        let out = text(&ctx, json!({"path": "w.txt"})).await;
        assert_eq!(out, format!("     1\t{line}"));
    }

    fn capped(dir: &Path, cap: usize) -> ToolContext {
        let limits = ToolSpecOverride {
            max_output_bytes: Some(cap),
            ..Default::default()
        };
        with_limits(dir, NAME, limits)
    }

    #[tokio::test]
    async fn the_output_cap_stops_before_exceeding_and_says_where_to_continue() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = capped(dir.path(), 1000);
        lines_file(&ctx, "f.txt", 200);
        let out = text(&ctx, json!({"path": "f.txt"})).await;
        assert!(out.len() <= 1000, "{} bytes", out.len());
        let last_line = out.lines().rev().nth(1).unwrap();
        let last: usize = last_line
            .split('\t')
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(last > 10 && last < 200, "{last}");
        let note = out.lines().last().unwrap();
        assert_eq!(
            note,
            format!(
                "[Output limit of 1000 bytes reached: showing lines 1-{last} of 200. Call read_file with offset={} to continue.]",
                last + 1
            )
        );
        // The suggested offset picks up right after.
        let next = text(&ctx, json!({"path": "f.txt", "offset": last + 1})).await;
        assert!(next.starts_with(&format!("{:>6}\tline {}\n", last + 1, last + 1)));
    }

    #[tokio::test]
    async fn a_tiny_cap_still_shows_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = capped(dir.path(), 10);
        lines_file(&ctx, "f.txt", 5);
        let out = text(&ctx, json!({"path": "f.txt"})).await;
        assert!(out.starts_with("     1\tline 1\n[Output limit"), "{out}");
        assert!(out.contains("offset=2"));
    }

    #[tokio::test]
    async fn binary_files_are_described_not_dumped_and_not_stamped() {
        let (_d, ctx) = setup();
        let mut nul = b"text".to_vec();
        nul.push(0);
        nul.extend_from_slice(b"SECRET");
        let p = put(&ctx, "a.bin", &nul);
        let out = text(&ctx, json!({"path": "a.bin"})).await;
        assert!(out.contains("'a.bin' is a binary file (11 B"), "{out}");
        assert!(out.contains("NUL"));
        assert!(!out.contains("SECRET"));
        assert_eq!(ctx.stamp(&p), None);

        let mut latin1 = vec![b'a'; 2000];
        latin1.push(0xE9);
        latin1.extend_from_slice(b"HIDDEN");
        put(&ctx, "l1.txt", &latin1);
        let out = text(&ctx, json!({"path": "l1.txt"})).await;
        assert!(out.contains("2.0 KB, 2007 bytes"), "{out}");
        assert!(
            out.contains("not valid UTF-8 (first bad byte at offset 2000)"),
            "{out}"
        );
        assert!(!out.contains("HIDDEN"));
    }

    #[tokio::test]
    async fn a_nul_after_the_first_8_kib_of_valid_utf8_is_still_text() {
        let (_d, ctx) = setup();
        let mut bytes = vec![b'a'; 9000];
        bytes.push(b'\n');
        bytes.push(0);
        put(&ctx, "late.txt", &bytes);
        let out = text(&ctx, json!({"path": "late.txt"})).await;
        assert!(out.starts_with("     1\taaa"), "{out}");
    }

    #[tokio::test]
    async fn an_empty_file_says_so_and_is_stamped() {
        let (_d, ctx) = setup();
        let p = put(&ctx, "e.txt", b"");
        let out = text(&ctx, json!({"path": "e.txt", "offset": 5})).await;
        assert!(out.contains("'e.txt' is empty"), "{out}");
        assert_eq!(ctx.check_stamp(&p, b""), StampCheck::Current);
    }

    #[tokio::test]
    async fn crlf_is_hidden_and_noted() {
        let (_d, ctx) = setup();
        put(&ctx, "w.txt", b"a\r\nb\r\n");
        let out = text(&ctx, json!({"path": "w.txt"})).await;
        assert!(
            out.starts_with("     1\ta\n     2\tb\n[This file uses CRLF"),
            "{out:?}"
        );
        assert!(!out.contains('\r'));
    }

    #[tokio::test]
    async fn a_directory_points_to_list_directory() {
        let (_d, ctx) = setup();
        std::fs::create_dir(ctx.root().join("src")).unwrap();
        let err = read(&ctx, json!({"path": "src"})).await.unwrap_err();
        assert_eq!(err.kind(), "failed");
        assert!(err.to_string().contains("directory"));
        assert!(err.to_string().contains("list_directory"));
    }

    #[tokio::test]
    async fn a_fifo_is_refused_without_blocking() {
        let (_d, ctx) = setup();
        let p = ctx.root().join("pipe");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path and a plain mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read(&ctx, json!({"path": "pipe"})).await.unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[tokio::test]
    async fn missing_files_suggest_a_close_name() {
        let (_d, ctx) = setup();
        put(&ctx, "src/main.rs", b"fn main() {}\n");
        let err = read(&ctx, json!({"path": "src/mian.rs"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "not_found");
        assert!(
            err.to_string().contains("Did you mean 'src/main.rs'?"),
            "{err}"
        );
        let err = read(&ctx, json!({"path": "nodir/x.rs"})).await.unwrap_err();
        assert_eq!(err.kind(), "not_found");
        assert!(
            err.to_string().contains("'nodir' does not exist either"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn paths_outside_the_worktree_are_refused() {
        let (_d, ctx) = setup();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
        symlink(outside.path().join("secret.txt"), ctx.root().join("link")).unwrap();
        symlink(outside.path(), ctx.root().join("dirlink")).unwrap();
        for path in ["../x", "/etc/passwd", "link", "dirlink/secret.txt"] {
            let err = read(&ctx, json!({"path": path})).await.unwrap_err();
            assert_eq!(err.kind(), "sandbox_violation", "{path}");
            assert!(!err.to_string().contains("secret\n"));
        }
    }

    #[tokio::test]
    async fn a_symlink_inside_is_followed_and_stamped_at_its_target() {
        let (_d, ctx) = setup();
        let target = put(&ctx, "real.txt", b"x\n");
        symlink("real.txt", ctx.root().join("alias.txt")).unwrap();
        assert_eq!(text(&ctx, json!({"path": "alias.txt"})).await, "     1\tx");
        assert!(ctx.stamp(&target).is_some());
    }

    #[tokio::test]
    async fn the_schema_refuses_bad_numbers_and_unknown_fields() {
        let (_d, ctx) = setup();
        lines_file(&ctx, "f.txt", 3);
        let refused = [
            json!({"path": "f.txt", "offset": 0}),
            json!({"path": "f.txt", "limit": 0}),
            json!({"path": "f.txt", "lines": 3}),
            json!({}),
        ];
        let largest = json!({"path": "f.txt", "offset": u64::MAX, "limit": u64::MAX});
        let out = schema_bounds(&ctx, NAME, &refused, largest).await;
        assert!(out.is_error);
        assert!(out.content.contains("past the end"), "{}", out.content);
    }

    /// The window as the whole-file renderer computed it before reads streamed (`None` for
    /// an offset past the end): what the streaming reader must reproduce byte for byte.
    fn reference(text: &str, offset: usize, limit: usize, cap: usize) -> Option<String> {
        let bytes = text.as_bytes();
        if text.is_empty() {
            return Some("'f.txt' is empty (0 bytes). Use write_file to give it content.".into());
        }
        let total = count_lines(bytes);
        if offset > total {
            return None;
        }
        let start = line_start(bytes, offset - 1);
        let budget = cap.saturating_sub(FOOTER_RESERVE);
        let (mut out, mut line_buf) = (String::new(), String::new());
        let (mut shown, mut hit_cap, mut crlf) = (0usize, false, false);
        for raw in text[start..].split_inclusive('\n').take(limit) {
            let (line, cr) = split_line(raw);
            crlf |= cr;
            line_buf.clear();
            number_line(&mut line_buf, offset + shown, line);
            if shown > 0 && out.len() + line_buf.len() > budget {
                hit_cap = true;
                break;
            }
            out.push_str(&line_buf);
            shown += 1;
        }
        let last = offset + shown - 1;
        if hit_cap {
            out.push_str(&format!("[Output limit of {cap} bytes reached: showing lines {offset}-{last} of {total}. Call read_file with offset={} to continue.]\n", last + 1));
        } else if last < total {
            out.push_str(&format!("[Showing lines {offset}-{last} of {total}. Call read_file with offset={} to read more.]\n", last + 1));
        }
        if crlf {
            out.push_str("[This file uses CRLF (\\r\\n) line endings; the \\r is not shown. edit_file matches \\n in old_string against \\r\\n.]\n");
        }
        if out.ends_with('\n') {
            out.pop();
        }
        Some(out)
    }

    /// Streams `bytes` (written as `f.txt`) `chunk` bytes at a time.
    fn stream(
        bytes: &[u8],
        chunk: usize,
        offset: usize,
        limit: usize,
        cap: usize,
    ) -> ToolResult<Shown> {
        let (_d, ctx) = setup();
        let p = put(&ctx, "f.txt", bytes);
        let req = Request { offset, limit, cap };
        let how = Reading {
            chunk,
            index_min: u64::MAX,
            settle: None,
        };
        load_with(&p, "f.txt", req, &AtomicBool::new(false), how, None)
    }

    /// A full pass over `path` that keeps an index whatever the file's size and age.
    fn indexed(path: &Path, chunk: usize) -> ReadIndex {
        let how = Reading {
            chunk,
            index_min: 0,
            settle: None,
        };
        let req = Request {
            offset: 1,
            limit: 1,
            cap: 100_000,
        };
        match load_with(path, "f.txt", req, &AtomicBool::new(false), how, None) {
            Ok(Shown::Text {
                index: Some(index), ..
            }) => index,
            other => panic!("no index: {other:?}"),
        }
    }

    /// A read of `path` through `index`.
    fn through_index(
        path: &Path,
        index: &ReadIndex,
        chunk: usize,
        req: Request,
    ) -> ToolResult<Shown> {
        let how = Reading {
            chunk,
            index_min: u64::MAX,
            settle: None,
        };
        load_with(
            path,
            "f.txt",
            req,
            &AtomicBool::new(false),
            how,
            Some(index),
        )
    }

    /// Asserts that streaming `text` in chunks of every size in `chunks` shows what the
    /// whole-file renderer shows, with the stamp of the whole file.
    fn assert_matches_reference(
        text: &str,
        chunks: &[usize],
        offset: usize,
        limit: usize,
        cap: usize,
    ) {
        let expected = reference(text, offset, limit, cap);
        for &chunk in chunks {
            match (
                stream(text.as_bytes(), chunk, offset, limit, cap),
                &expected,
            ) {
                (Ok(Shown::Text { content, stamp, .. }), Some(want)) => {
                    assert_eq!(
                        &content, want,
                        "chunk {chunk}, offset {offset}, limit {limit}, cap {cap}"
                    );
                    assert_eq!(stamp, Stamp::of(text.as_bytes()));
                }
                (Err(e), None) => assert_eq!(e.kind(), "invalid_arguments"),
                (got, want) => panic!("chunk {chunk}: got {got:?}, want {want:?}"),
            }
            // The same window read through an index (with a checkpoint every chunk) shows
            // the same, with the same stamp, unless the file is binary (never indexed).
            let (_d, ctx) = setup();
            let p = put(&ctx, "f.txt", text.as_bytes());
            if text.is_empty() {
                continue;
            }
            let index = indexed(&p, chunk);
            let req = Request { offset, limit, cap };
            match (through_index(&p, &index, chunk, req), &expected) {
                (Ok(Shown::Text { content, stamp, .. }), Some(want)) => {
                    assert_eq!(
                        &content, want,
                        "through the index: chunk {chunk}, offset {offset}, limit {limit}, cap {cap}"
                    );
                    assert_eq!(stamp, Stamp::of(text.as_bytes()));
                }
                (Err(e), None) => assert_eq!(e.kind(), "invalid_arguments"),
                (got, want) => {
                    panic!("through the index, chunk {chunk}: got {got:?}, want {want:?}")
                }
            }
        }
    }

    #[test]
    fn an_index_keeps_at_most_max_checkpoints_and_starts_windows_before_them() {
        let (_d, ctx) = setup();
        let text: String = (0..5000).map(|i| format!("{i}\n")).collect();
        let p = put(&ctx, "f.txt", text.as_bytes());
        let index = indexed(&p, 1);
        assert!(index.checkpoints.len() as u64 <= MAX_CHECKPOINTS);
        assert_eq!(index.checkpoints[0], (0, 0));
        assert_eq!(index.newlines, 5000);
        for first in [0, 1, 2, 2500, 4999, 6000] {
            let (offset, before) = index.start_for(first);
            assert!(offset == 0 || before < first, "{first}: {offset} {before}");
        }
        let req = Request {
            offset: 4901,
            limit: 3,
            cap: 100_000,
        };
        match through_index(&p, &index, 4096, req) {
            Ok(Shown::Text { content, .. }) => assert!(
                content.starts_with("  4901\t4900\n  4902\t4901\n  4903\t4902\n"),
                "{content}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_file_rewritten_in_place_is_read_in_full_again_not_through_its_old_index() {
        let (_d, ctx) = setup();
        let p = put(&ctx, "f.txt", b"one\ntwo\nsix\n");
        let index = indexed(&p, 4);
        let old = index.identity;
        // Same size, same inode: only the timestamps tell the versions apart, so wait for the
        // clock to move on (coarse timestamps tick every few milliseconds).
        for _ in 0..200 {
            std::fs::write(&p, b"one\ntwo\nten\n").unwrap();
            if FileIdentity::of(&std::fs::metadata(&p).unwrap()) != old {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let req = Request {
            offset: 3,
            limit: 1,
            cap: 100_000,
        };
        match through_index(&p, &index, 4, req) {
            Ok(Shown::Text { content, stamp, .. }) => {
                assert_eq!(content, "     3\tten");
                assert_eq!(stamp, Stamp::of(b"one\ntwo\nten\n"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_file_changed_just_before_the_pass_gets_no_index() {
        let (_d, ctx) = setup();
        let p = put(&ctx, "f.txt", b"fresh\n");
        let req = Request {
            offset: 1,
            limit: 1,
            cap: 100_000,
        };
        let how = |settle| Reading {
            chunk: 4,
            index_min: 0,
            settle,
        };
        let index_of = |settle| match load_with(
            &p,
            "f.txt",
            req,
            &AtomicBool::new(false),
            how(settle),
            None,
        ) {
            Ok(Shown::Text { index, .. }) => index,
            other => panic!("{other:?}"),
        };
        assert!(index_of(Some(Duration::from_secs(3600))).is_none());
        assert!(index_of(None).is_some());
        // Small files are never indexed by the tool's own settings.
        let small = load_with(&p, "f.txt", req, &AtomicBool::new(false), READING, None);
        assert!(
            matches!(small, Ok(Shown::Text { index: None, .. })),
            "{small:?}"
        );
    }

    proptest! {
        #[test]
        fn streaming_in_any_chunks_matches_the_whole_file_renderer(
            text in "[ab\r\n é€😀]{0,60}",
            chunk in 1usize..9,
            offset in 1usize..10,
            limit in 1usize..10,
            cap in prop_oneof![Just(100_000usize), 300usize..420],
        ) {
            assert_matches_reference(&text, &[chunk], offset, limit, cap);
        }
    }

    #[test]
    fn long_lines_and_crlf_are_cut_the_same_across_chunk_boundaries() {
        let text = format!("{}\r\nshort\r\n{}€\r", "é".repeat(2500), "x".repeat(1999));
        for offset in 1..=3 {
            assert_matches_reference(&text, &[1, 2, 3, 7, 4096, READ_CHUNK], offset, 5, 100_000);
        }
    }

    #[test]
    fn invalid_utf8_anywhere_is_binary_with_the_offset_of_the_first_bad_byte() {
        // A bad byte far past the window still makes the file binary (see the module docs).
        let mut bytes = "é".repeat(50_001).into_bytes();
        bytes.push(0xFF);
        bytes.extend_from_slice(b"\nmore text\n");
        for chunk in [1, 2, 3, 5, READ_CHUNK] {
            match stream(&bytes, chunk, 1, 1, 100_000) {
                Ok(Shown::Binary(note)) => assert!(
                    note.contains("not valid UTF-8 (first bad byte at offset 100002)"),
                    "{note}"
                ),
                other => panic!("chunk {chunk}: {other:?}"),
            }
        }
        // A file that ends inside a character is cut text, not text.
        for chunk in [1, 2, 4, READ_CHUNK] {
            match stream(b"abc\xC3", chunk, 1, 1, 100_000) {
                Ok(Shown::Binary(note)) => assert!(note.contains("at offset 3"), "{note}"),
                other => panic!("chunk {chunk}: {other:?}"),
            }
        }
    }

    #[test]
    fn nul_bytes_count_only_in_the_first_8_kib_whatever_the_chunk_size() {
        let mut early = vec![b'a'; 8191];
        early.push(0);
        let mut late = vec![b'a'; 8192];
        late.push(0);
        for chunk in [1, 1000, READ_CHUNK] {
            assert!(matches!(
                stream(&early, chunk, 1, 1, 100_000),
                Ok(Shown::Binary(_))
            ));
            assert!(matches!(
                stream(&late, chunk, 1, 1, 100_000),
                Ok(Shown::Text { .. })
            ));
        }
    }

    #[tokio::test]
    async fn paging_a_large_settled_file_goes_through_its_index_until_the_loop_writes_it() {
        let (_d, ctx) = setup();
        let p = lines_file(&ctx, "big.log", 120_000);
        assert!(std::fs::metadata(&p).unwrap().len() >= INDEX_MIN_BYTES);
        std::thread::sleep(SETTLE + Duration::from_millis(50));
        let page = |offset: usize| {
            let ctx = &ctx;
            async move {
                text(
                    ctx,
                    json!({"path": "big.log", "offset": offset, "limit": 3}),
                )
                .await
            }
        };
        assert!(page(1).await.starts_with(&numbered(1..=3)));
        let index = ctx
            .read_index(&p)
            .expect("an index after a full read of a settled file");
        assert_eq!(index.stamp(), &Stamp::of(&std::fs::read(&p).unwrap()));
        for offset in [119_998, 60_000, 2] {
            let shown = page(offset).await;
            assert!(shown.starts_with(&numbered(offset..=offset + 2)), "{shown}");
            assert_eq!(shown.contains("of 120000"), offset < 119_998, "{shown}");
        }
        // The loop's own edit replaces the stamp: the old index no longer applies.
        let edited = crate::all_tools()
            .call(
                &ctx,
                None,
                "edit_file",
                json!({"path": "big.log", "old_string": "line 60001\n", "new_string": "changed\n"}),
            )
            .await;
        assert!(!edited.is_error, "{}", edited.content);
        assert!(ctx.read_index(&p).is_none());
        let shown = page(60_000).await;
        assert!(
            shown.starts_with(" 60000\tline 60000\n 60001\tchanged\n"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn the_last_100_lines_of_a_10_mb_file_within_the_catalog_timeout() {
        let (_d, ctx) = setup();
        let p = lines_file(&ctx, "big.log", 1_000_000);
        assert!(std::fs::metadata(&p).unwrap().len() > 9_000_000);
        let out = crate::all_tools()
            .call(
                &ctx,
                None,
                NAME,
                json!({"path": "big.log", "offset": 999_901}),
            )
            .await;
        assert!(!out.is_error, "{}", out.content);
        assert_eq!(out.content, numbered(999_901..=1_000_000));
        let whole = std::fs::read(&p).unwrap();
        assert_eq!(ctx.check_stamp(&p, &whole), StampCheck::Current);
    }
}
