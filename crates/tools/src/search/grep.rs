//! `grep`: in-process regex search over a file or a gitignore-aware directory walk
//! (grep-regex + grep-searcher, no `rg` binary), printed in ripgrep's `path:line:text` style.
//!
//! Determinism under a cap: the output must be the first `max_results` matching lines in
//! path order every time, and a capped search should stop as soon as it has them. A
//! directory is searched in two phases:
//!
//! 1. In order: a walk in path order (each directory's entries sorted) numbers the first
//!    `ORDERED_FILES` files, and several threads take them in turn. Once the files
//!    numbered below some `n`, all searched, hold more than `max_results` matching lines,
//!    nothing from `n` on can be shown and the search ends: a common pattern reads only the
//!    first files in path order, plus at most one file per thread.
//! 2. In parallel, when the first phase neither filled the cap nor ran out of files: the
//!    walker's parallel walk goes over the rest (one ordered walker cannot keep up with
//!    several searching threads on a full scan), skipping everything up to the last file
//!    the first phase took. It keeps a *frontier*: once the files found so far hold more
//!    than `max_results` matches, the last file still needed becomes a threshold, and any
//!    file or directory that sorts after it (component-wise, the output order) is
//!    skipped. The threshold only moves earlier, so nothing skipped could have been shown.
//!
//! Either way the output is exactly what a sequential search would print.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use globset::{Candidate, GlobSet};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use ignore::{DirEntry, Walk, WalkState};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::files::access::open_for_reading;
use crate::search::walk;
use crate::search::walk::WalkIgnores;
use td_base::sync::lock;
use td_base::text::{count, floor_char_boundary};
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult, display_path};
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "grep";
const DEFAULT_MAX: u64 = 200;
const MAX_MAX: u64 = 5000;
const MAX_CONTEXT: u64 = 20;
/// Longest line text shown; minified files would otherwise flood the output.
const MAX_LINE_BYTES: usize = 500;

/// The `grep` tool.
pub struct Grep;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    #[serde(default = "args::root")]
    path: String,
    #[serde(default)]
    file_pattern: Option<String>,
    #[serde(default)]
    context: u64,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default = "default_max")]
    max_results: u64,
    #[serde(default)]
    include_hidden: bool,
}

fn default_max() -> u64 {
    DEFAULT_MAX
}

/// One line of output for a file, or a gap between context groups.
#[derive(Debug)]
enum Item {
    Line {
        number: u64,
        is_match: bool,
        text: String,
    },
    Break,
}

/// What one file contributed.
#[derive(Debug)]
struct FileHits {
    path: PathBuf,
    items: Vec<Item>,
    matches: usize,
}

/// Collects one file's matching and context lines.
#[derive(Default)]
struct FileSink {
    items: Vec<Item>,
    matches: usize,
    binary: bool,
}

/// The text of a line without its terminator, cut to `MAX_LINE_BYTES` on a char boundary.
fn line_text(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    if bytes.len() <= MAX_LINE_BYTES {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    // Decode a little more than we keep so a char cut by the slice is dropped, not mangled.
    let text = String::from_utf8_lossy(&bytes[..MAX_LINE_BYTES + 4]);
    let end = floor_char_boundary(&text, MAX_LINE_BYTES);
    format!(
        "{} [... line cut, {} bytes in all]",
        &text[..end],
        bytes.len()
    )
}

impl Sink for FileSink {
    type Error = std::io::Error;

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        let first = mat.line_number().unwrap_or(0);
        for (number, line) in (first..).zip(mat.lines()) {
            self.items.push(Item::Line {
                number,
                is_match: true,
                text: line_text(line),
            });
            self.matches += 1;
        }
        Ok(true)
    }

    fn context(&mut self, _: &Searcher, ctx: &SinkContext<'_>) -> Result<bool, Self::Error> {
        self.items.push(Item::Line {
            number: ctx.line_number().unwrap_or(0),
            is_match: false,
            text: line_text(ctx.bytes()),
        });
        Ok(true)
    }

    fn context_break(&mut self, _: &Searcher) -> Result<bool, Self::Error> {
        self.items.push(Item::Break);
        Ok(true)
    }

    fn binary_data(&mut self, _: &Searcher, _: u64) -> Result<bool, Self::Error> {
        self.binary = true;
        Ok(true)
    }
}

/// Restricts a directory search to files whose name (pattern without '/') or path (relative
/// to the search directory or to the worktree root) matches a glob.
struct FileFilter {
    set: GlobSet,
    by_name: bool,
}

impl FileFilter {
    fn new(pattern: &str) -> ToolResult<Self> {
        let cleaned = pattern.trim_start_matches("./").trim_start_matches('/');
        Ok(Self {
            set: walk::glob_set(TOOL, "/file_pattern", cleaned)?,
            by_name: !cleaned.contains('/'),
        })
    }

    fn matches(&self, path: &Path, base: &Path, root: &Path) -> bool {
        if self.by_name {
            return path
                .file_name()
                .is_some_and(|n| self.set.is_match_candidate(&Candidate::new(n)));
        }
        let under = |dir: &Path| {
            path.strip_prefix(dir)
                .is_ok_and(|rel| self.set.is_match_candidate(&Candidate::new(rel)))
        };
        under(base) || (base != root && under(root))
    }
}

/// How far an ordered search has got (see the module docs).
struct SearchProgress {
    cap: usize,
    state: Mutex<SearchProgressState>,
    /// Set once `limit` is known: threads then stop taking files.
    enough: AtomicBool,
}

#[derive(Default)]
struct SearchProgressState {
    /// Every file numbered below this one has been searched.
    done_below: usize,
    /// Matching lines in those files.
    matches: usize,
    /// Files searched ahead of `done_below`: number -> matching lines.
    ahead: BTreeMap<usize, usize>,
    /// The first files that hold more than `cap` matching lines: files numbered from
    /// here on cannot be shown.
    limit: Option<usize>,
}

impl SearchProgress {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            state: Mutex::new(SearchProgressState::default()),
            enough: AtomicBool::new(false),
        }
    }

    fn enough(&self) -> bool {
        self.enough.load(Ordering::Acquire)
    }

    /// Notes that file `number` holds `matches` matching lines.
    fn searched(&self, number: usize, matches: usize) {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        if st.limit.is_some() {
            return;
        }
        st.ahead.insert(number, matches);
        while let Some(n) = st.ahead.remove(&st.done_below) {
            st.matches += n;
            st.done_below += 1;
            if st.matches > self.cap {
                st.limit = Some(st.done_below);
                self.enough.store(true, Ordering::Release);
                return;
            }
        }
    }

    /// Files numbered from here on are not needed (`usize::MAX` when all are).
    fn limit(&self) -> usize {
        lock(&self.state).limit.unwrap_or(usize::MAX)
    }
}

/// The ordered walk of the first phase, handing out files in path order with their
/// numbers, up to a budget.
struct Files<'a> {
    walk: Walk,
    next_number: usize,
    budget: usize,
    /// The walk ended before the budget did.
    exhausted: bool,
    /// The file numbered `budget - 1`, once handed out.
    last: Option<PathBuf>,
    filter: Option<&'a FileFilter>,
    base: &'a Path,
    root: &'a Path,
}

impl Files<'_> {
    /// The next file to search and its number. Unreadable directories are skipped, as `rg`
    /// does.
    fn next(&mut self) -> Option<(usize, PathBuf)> {
        if self.next_number >= self.budget {
            return None;
        }
        loop {
            let Some(entry) = self.walk.next() else {
                self.exhausted = true;
                return None;
            };
            let Ok(e) = entry else {
                continue;
            };
            if !walk::is_file(&e) {
                continue;
            }
            if self
                .filter
                .is_some_and(|f| !f.matches(e.path(), self.base, self.root))
            {
                continue;
            }
            let number = self.next_number;
            self.next_number += 1;
            let path = e.into_path();
            if self.next_number == self.budget {
                self.last = Some(path.clone());
            }
            return Some((number, path));
        }
    }
}

/// The running frontier of the parallel phase (see the module docs).
struct Frontier {
    cap: usize,
    counts: Mutex<(BTreeMap<PathBuf, usize>, usize)>,
    threshold: RwLock<Option<PathBuf>>,
    has_threshold: AtomicBool,
}

impl Frontier {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            counts: Mutex::new((BTreeMap::new(), 0)),
            threshold: RwLock::new(None),
            has_threshold: AtomicBool::new(false),
        }
    }

    /// Whether `path` sorts after every file the output can still need.
    fn beyond(&self, path: &Path) -> bool {
        if !self.has_threshold.load(Ordering::Acquire) {
            return false;
        }
        let t = self.threshold.read().unwrap_or_else(|p| p.into_inner());
        t.as_deref().is_some_and(|t| path > t)
    }

    /// Notes that `path` holds `n` matching lines and moves the threshold if it can.
    fn record(&self, path: &Path, n: usize) {
        let mut guard = lock(&self.counts);
        let (counts, total) = &mut *guard;
        counts.insert(path.to_path_buf(), n);
        *total += n;
        // Drop trailing files whose matches are no longer needed to exceed the cap.
        while *total > self.cap {
            let Some((_, &last)) = counts.last_key_value() else {
                break;
            };
            if *total - last > self.cap {
                counts.pop_last();
                *total -= last;
            } else {
                break;
            }
        }
        if *total > self.cap
            && let Some((last, _)) = counts.last_key_value()
        {
            let mut t = self.threshold.write().unwrap_or_else(|p| p.into_inner());
            *t = Some(last.clone());
            self.has_threshold.store(true, Ordering::Release);
        }
    }
}

fn searcher(context: usize, per_file_cap: usize) -> Searcher {
    SearcherBuilder::new()
        .line_number(true)
        .before_context(context)
        .after_context(context)
        .binary_detection(BinaryDetection::quit(b'\0'))
        .max_matches(Some(per_file_cap as u64))
        // A file that is one huge line would otherwise be held whole; past this the file
        // counts as unreadable.
        .heap_limit(Some(MAX_HELD_LINE_BYTES))
        .build()
}

/// Longest line grep holds in memory (with its context).
const MAX_HELD_LINE_BYTES: usize = 16 * 1024 * 1024;

/// The error of a search of one named file that failed while reading.
fn searched_error(shown: &str, err: &std::io::Error) -> ToolError {
    if err.kind() == std::io::ErrorKind::OutOfMemory || err.to_string().contains("allocation limit")
    {
        return ToolError::failed(
            format!("searching '{shown}'"),
            format!(
                "it has a line longer than {} MiB",
                MAX_HELD_LINE_BYTES / (1024 * 1024)
            ),
            "Search a file with shorter lines, or look at a part of it with read_file (long lines are cut).",
        );
    }
    ToolError::from_io("searching", shown, err)
}

/// Renders files in path order up to `cap` matching lines; returns the text and whether
/// matches were left out.
fn render(mut files: Vec<FileHits>, root: &Path, cap: usize, context: usize) -> (String, bool) {
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    let mut out = String::new();
    let mut shown = 0usize;
    let mut capped = false;
    for f in &files {
        if shown >= cap {
            capped = true;
            break;
        }
        let path = display_path(root, &f.path);
        if context > 0 && !out.is_empty() {
            out.push_str("--\n");
        }
        let mut shown_here = 0usize;
        // Once the cap is reached, only the last match's after-context may still follow.
        let mut after_left: Option<usize> = None;
        for item in &f.items {
            match item {
                Item::Break => {
                    if after_left.is_some() {
                        break;
                    }
                    out.push_str("--\n");
                }
                Item::Line {
                    number,
                    is_match: true,
                    text,
                } => {
                    if shown >= cap {
                        break;
                    }
                    shown += 1;
                    shown_here += 1;
                    if shown == cap {
                        after_left = Some(context);
                    }
                    let _ = writeln!(out, "{path}:{number}:{text}");
                }
                Item::Line {
                    number,
                    is_match: false,
                    text,
                } => {
                    if let Some(left) = after_left.as_mut() {
                        if *left == 0 {
                            break;
                        }
                        *left -= 1;
                    }
                    let _ = writeln!(out, "{path}-{number}-{text}");
                }
            }
        }
        if f.matches > shown_here {
            capped = true;
            break;
        }
    }
    (out, capped)
}

#[async_trait]
impl Tool for Grep {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Search file contents with a regular expression (Rust regex syntax, like ripgrep). Prints `path:line:text` for matching lines, `path-line-text` for context lines and `--` between groups, files in path order. Searches a file, or a directory recursively skipping .gitignore/.ignore'd, hidden and binary files. Narrow with `path` and `file_pattern` (e.g. \"*.rs\")."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "pattern": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Regular expression (Rust regex syntax; escape literal `(`, `.`, `{` etc.). A match never spans lines. Required."
                },
                "path": {
                    "type": "string",
                    "description": "File or directory to search, relative to the worktree root. Default \".\" (the whole worktree)."
                },
                "file_pattern": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Only search files matching this glob: without '/' it matches the file name at any depth (\"*.rs\"), with '/' the path relative to `path` or to the worktree root (\"src/**/*.ts\"). Ignored when `path` is a file. Default: every file."
                },
                "context": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_CONTEXT,
                    "description": "Lines of context shown before and after each match. Default 0, at most 20."
                },
                "case_insensitive": {
                    "type": "boolean",
                    "description": "Match letters regardless of case. Default false."
                },
                "max_results": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_MAX,
                    "description": "Most matching lines to show (the first ones in path order). Default 200, at most 5000."
                },
                "include_hidden": {
                    "type": "boolean",
                    "description": "Also search hidden files and directories (names starting with '.'; .git is never searched). Default false."
                }
            },
            "required": ["pattern"]
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let a: GrepArgs = args::parse(TOOL, input)?;
        let matcher = RegexMatcherBuilder::new()
            .case_insensitive(a.case_insensitive)
            .line_terminator(Some(b'\n'))
            .build(&a.pattern)
            .map_err(|e| ToolError::invalid(TOOL, "/pattern", e.to_string()))?;
        let filter = a.file_pattern.as_deref().map(FileFilter::new).transpose()?;
        let target = walk::target(ctx, TOOL, &a.path)?;
        let cap = a.max_results.clamp(1, MAX_MAX) as usize;
        let context = a.context.min(MAX_CONTEXT) as usize;
        let root = ctx.root().to_path_buf();
        let include_hidden = a.include_hidden;
        let base = target.path.clone();
        let is_dir = target.is_dir;
        let walk_root = root.clone();
        let worktree = Arc::clone(ctx.files());
        let ignores = walk::WalkIgnores::new(Arc::clone(&worktree));
        let walk_ignores = Arc::clone(&ignores);

        let (files, unreadable, binary) = walk::run_blocking(TOOL, move |cancel| {
            let root = walk_root;
            if !is_dir {
                let shown = display_path(&root, &base);
                let opened = open_for_reading(&worktree, &base, &shown)?;
                let mut sink = FileSink::default();
                searcher(context, cap + 1)
                    .search_file(&matcher, &opened.file, &mut sink)
                    .map_err(|e| searched_error(&shown, &e))?;
                let binary = sink.binary && sink.matches == 0;
                let hits = (sink.matches > 0).then_some(FileHits {
                    path: base,
                    items: sink.items,
                    matches: sink.matches,
                });
                return Ok((hits.into_iter().collect(), 0, binary));
            }
            let (files, unreadable) = search_dir(
                &walk_ignores,
                &base,
                &matcher,
                filter.as_ref(),
                include_hidden,
                context,
                cap,
                cancel,
                ORDERED_FILES,
            );
            Ok((files, unreadable, false))
        })
        .await?;

        if files.is_empty() {
            let mut msg = format!("No matches for '{}' in '{}'", a.pattern, target.shown);
            if binary {
                msg.push_str(" (it is a binary file; its content is not searched)");
            } else if is_dir {
                if let Some(fp) = &a.file_pattern {
                    let _ = write!(msg, " among files matching '{fp}'");
                }
                let _ = write!(
                    msg,
                    ". {}",
                    walk::skipped_note(" and binary files", include_hidden)
                );
            }
            if !a.case_insensitive {
                msg.push_str(". The search is case-sensitive (pass case_insensitive: true)");
            }
            msg.push('.');
            if unreadable > 0 {
                let _ = write!(
                    msg,
                    " {} could not be read.",
                    count(unreadable as u64, "file")
                );
            }
            if let Some(note) = ignores.note() {
                msg.push('\n');
                msg.push_str(&note);
            }
            return Ok(ToolOutput::text(msg));
        }
        let (mut out, capped) = render(files, &root, cap, context);
        if capped {
            let _ = writeln!(
                out,
                "[showing the first {cap} matching lines in path order; more matches exist. Narrow `path` or `file_pattern`, or make the pattern more specific]"
            );
        }
        if unreadable > 0 {
            let _ = writeln!(
                out,
                "[skipped {}: could not be read]",
                count(unreadable as u64, "file")
            );
        }
        if let Some(note) = ignores.note() {
            out.push_str(&note);
            out.push('\n');
        }
        Ok(ToolOutput::text(out))
    }
}

/// Most threads the ordered phase uses (as `rg` and the parallel walker).
const MAX_THREADS: usize = 12;

/// Files the ordered phase takes before the parallel one goes on (see the module docs):
/// enough for a common pattern to fill the default cap, few enough that a full scan of
/// 50,000 files spends only 2% of its files in the slower ordered walk.
const ORDERED_FILES: usize = 1024;

/// Searches the eligible files under `base`, the first `ordered_files` in the ordered phase
/// (see the module docs); returns the files with matches and how many files could not be
/// read.
#[allow(clippy::too_many_arguments)]
fn search_dir(
    ignores: &Arc<WalkIgnores>,
    base: &Path,
    matcher: &RegexMatcher,
    filter: Option<&FileFilter>,
    include_hidden: bool,
    context: usize,
    cap: usize,
    cancel: &AtomicBool,
    ordered_files: usize,
) -> (Vec<FileHits>, usize) {
    let worktree = ignores.files();
    let root = worktree.root();
    let search = |path: &Path, searcher: &mut Searcher| {
        let mut sink = FileSink::default();
        // Opened beneath the root, non-blocking and checked: a path the walk saw may have
        // been swapped for a symlink, a FIFO or a hard link to outside since.
        let readable = worktree.open_file(path).is_ok_and(|opened| {
            searcher
                .search_file(matcher, &opened.file, &mut sink)
                .is_ok()
        });
        (sink, readable)
    };
    let first = search_ordered(
        ignores,
        base,
        filter,
        include_hidden,
        (context, cap),
        cancel,
        ordered_files.max(1),
        &search,
    );
    let Some(last) = first.last else {
        return (first.hits, first.unreadable);
    };
    let frontier = Frontier::new(cap);
    for f in &first.hits {
        frontier.record(&f.path, f.matches);
    }
    let unreadable = AtomicUsize::new(first.unreadable);
    let walker = walk::builder(ignores, base, include_hidden, |_| true);
    let mut files = walk::collect(&walker, cancel, || {
        let mut searcher = searcher(context, cap + 1);
        let frontier = &frontier;
        let unreadable = &unreadable;
        let last = &last;
        move |e: DirEntry, out: &mut Vec<FileHits>| {
            if frontier.beyond(e.path()) {
                return WalkState::Skip;
            }
            if walk::path_order(e.path(), last).is_le() {
                // The ordered phase searched every file up to `last`: of what sorts before
                // it, only the directories that lead to it can hold files still to search.
                let leads_to_last = !walk::is_file(&e) && walk::relative(last, e.path()).is_some();
                return if leads_to_last {
                    WalkState::Continue
                } else {
                    WalkState::Skip
                };
            }
            if !walk::is_file(&e) {
                return WalkState::Continue;
            }
            if filter.is_some_and(|f| !f.matches(e.path(), base, root)) {
                return WalkState::Continue;
            }
            let (sink, readable) = search(e.path(), &mut searcher);
            if !readable {
                unreadable.fetch_add(1, Ordering::Relaxed);
            }
            if sink.matches > 0 {
                frontier.record(e.path(), sink.matches);
                out.push(FileHits {
                    path: e.into_path(),
                    items: sink.items,
                    matches: sink.matches,
                });
            }
            WalkState::Continue
        }
    });
    files.extend(first.hits);
    (files, unreadable.into_inner())
}

/// What the ordered phase found.
struct Ordered {
    /// Files with matches, among those the output may need.
    hits: Vec<FileHits>,
    /// Unreadable files among those the output may need.
    unreadable: usize,
    /// The last file searched, when the parallel phase must go on after it.
    last: Option<PathBuf>,
}

/// The ordered phase: the first `budget` files in path order, searched by several threads
/// (see the module docs).
#[allow(clippy::too_many_arguments)]
fn search_ordered<S>(
    ignores: &Arc<WalkIgnores>,
    base: &Path,
    filter: Option<&FileFilter>,
    include_hidden: bool,
    (context, cap): (usize, usize),
    cancel: &AtomicBool,
    budget: usize,
    search: &S,
) -> Ordered
where
    S: Fn(&Path, &mut Searcher) -> (FileSink, bool) + Sync,
{
    let root = ignores.files().root();
    let mut builder = walk::builder(ignores, base, include_hidden, |_| true);
    // `path_order` on siblings is their names' byte order, without parsing components.
    builder.sort_by_file_path(walk::path_order);
    let files = Mutex::new(Files {
        walk: builder.build(),
        next_number: 0,
        budget,
        exhausted: false,
        last: None,
        filter,
        base,
        root,
    });
    let progress = SearchProgress::new(cap);
    let work = || {
        let mut searcher = searcher(context, cap + 1);
        let mut found: Vec<(usize, FileHits)> = Vec::new();
        let mut unreadable: Vec<usize> = Vec::new();
        while !cancel.load(Ordering::Relaxed) && !progress.enough() {
            let Some((number, path)) = lock(&files).next() else {
                break;
            };
            let (sink, readable) = search(&path, &mut searcher);
            if !readable {
                unreadable.push(number);
            }
            progress.searched(number, sink.matches);
            if sink.matches > 0 {
                let hits = FileHits {
                    path,
                    items: sink.items,
                    matches: sink.matches,
                };
                found.push((number, hits));
            }
        }
        (found, unreadable)
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS);
    let results: Vec<_> = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        // This thread searches too. A helper's panic goes on up: run_blocking turns it into
        // an error, where dropping that helper's files would give wrong output.
        let mut all = vec![work()];
        for h in helpers {
            all.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        all
    });
    let limit = progress.limit();
    let mut ordered = Ordered {
        hits: Vec::new(),
        unreadable: 0,
        last: None,
    };
    for (found, bad) in results {
        let needed = found.into_iter().filter(|(n, _)| *n < limit);
        ordered.hits.extend(needed.map(|(_, f)| f));
        ordered.unreadable += bad.into_iter().filter(|n| *n < limit).count();
    }
    let files = files.into_inner().unwrap_or_else(|p| p.into_inner());
    let finished = progress.enough() || files.exhausted || cancel.load(Ordering::Relaxed);
    if !finished {
        ordered.last = files.last;
    }
    ordered
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::test_support::{
        assert_escapes_refused, assert_schema_refuses, call, link_outside, run, tree, write,
    };

    async fn grep(wt: &Path, input: Value) -> String {
        run(&Grep, wt, input).await.unwrap()
    }

    fn numbered(n: usize) -> String {
        (1..=n).map(|i| format!("line {i}\n")).collect()
    }

    #[tokio::test]
    async fn matches_print_path_line_text_in_path_order() {
        let (_d, wt) = tree(&[
            ("src/b.rs", "fn b() {}\nlet x = 1;\nfn bb() {}\n"),
            ("src/a.rs", "fn a() {}\n"),
            ("README.md", "no functions here\n"),
        ]);
        let out = grep(&wt, json!({"pattern": r"fn \w+"})).await;
        assert_eq!(
            out,
            "src/a.rs:1:fn a() {}\nsrc/b.rs:1:fn b() {}\nsrc/b.rs:3:fn bb() {}\n"
        );
    }

    #[tokio::test]
    async fn context_lines_appear_with_separators_between_groups_and_files() {
        let mut body = numbered(20);
        body = body
            .replace("line 5\n", "line 5 HIT\n")
            .replace("line 15\n", "line 15 HIT\n");
        let (_d, wt) = tree(&[("a.txt", body.as_str()), ("b.txt", "x\nHIT\ny\n")]);
        let out = grep(&wt, json!({"pattern": "HIT", "context": 2})).await;
        assert_eq!(
            out,
            "a.txt-3-line 3\na.txt-4-line 4\na.txt:5:line 5 HIT\na.txt-6-line 6\na.txt-7-line 7\n--\n\
             a.txt-13-line 13\na.txt-14-line 14\na.txt:15:line 15 HIT\na.txt-16-line 16\na.txt-17-line 17\n--\n\
             b.txt-1-x\nb.txt:2:HIT\nb.txt-3-y\n"
        );
        // Without context there are no separators.
        let out = grep(&wt, json!({"pattern": "HIT"})).await;
        assert_eq!(
            out,
            "a.txt:5:line 5 HIT\na.txt:15:line 15 HIT\nb.txt:2:HIT\n"
        );
    }

    #[tokio::test]
    async fn case_insensitive_option() {
        let (_d, wt) = tree(&[("a.txt", "Hello\nhello\nHELLO\nbye\n")]);
        assert_eq!(
            grep(&wt, json!({"pattern": "hello"})).await,
            "a.txt:2:hello\n"
        );
        assert_eq!(
            grep(&wt, json!({"pattern": "hello", "case_insensitive": true})).await,
            "a.txt:1:Hello\na.txt:2:hello\na.txt:3:HELLO\n"
        );
    }

    #[tokio::test]
    async fn file_pattern_filters_by_name_or_path() {
        let (_d, wt) = tree(&[
            ("src/a.rs", "needle\n"),
            ("src/web/b.ts", "needle\n"),
            ("web/c.ts", "needle\n"),
            ("notes.md", "needle\n"),
        ]);
        assert_eq!(
            grep(&wt, json!({"pattern": "needle", "file_pattern": "*.ts"})).await,
            "src/web/b.ts:1:needle\nweb/c.ts:1:needle\n"
        );
        assert_eq!(
            grep(
                &wt,
                json!({"pattern": "needle", "file_pattern": "src/**/*.ts"})
            )
            .await,
            "src/web/b.ts:1:needle\n"
        );
        // Relative to `path` as well as to the worktree root.
        assert_eq!(
            grep(
                &wt,
                json!({"pattern": "needle", "path": "src", "file_pattern": "web/*.ts"})
            )
            .await,
            "src/web/b.ts:1:needle\n"
        );
        let out = grep(&wt, json!({"pattern": "needle", "file_pattern": "*.py"})).await;
        assert!(out.contains("among files matching '*.py'"), "{out}");
        let err = run(&Grep, &wt, json!({"pattern": "x", "file_pattern": "a[b"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(err.to_string().contains("/file_pattern"), "{err}");
    }

    #[tokio::test]
    async fn max_results_shows_the_first_matches_in_path_order_and_says_more_exist() {
        let (_d, wt) = tree(&[
            ("a.txt", "m\nm\n"),
            ("b.txt", "m\nm\nm\n"),
            ("c.txt", "m\n"),
        ]);
        let out = grep(&wt, json!({"pattern": "m", "max_results": 3})).await;
        assert!(
            out.starts_with("a.txt:1:m\na.txt:2:m\nb.txt:1:m\n[showing the first 3 matching lines"),
            "{out}"
        );
        assert!(out.contains("Narrow `path` or `file_pattern`"), "{out}");
        // Exactly at the cap: nothing is hidden, so no note.
        let out = grep(&wt, json!({"pattern": "m", "max_results": 6})).await;
        assert!(!out.contains("showing the first"), "{out}");
        assert_eq!(out.lines().count(), 6);
    }

    #[tokio::test]
    async fn capped_parallel_search_is_deterministic_and_equals_a_sequential_one() {
        let mut files = Vec::new();
        for d in 0..12 {
            for f in 0..25 {
                files.push((
                    format!("d{d:02}/f{f:02}.txt"),
                    "hit\nmiss\nhit\n".to_string(),
                ));
            }
        }
        let (_d, wt) = tree(&files);
        let mut expected = String::new();
        let mut sorted: Vec<&String> = files.iter().map(|(p, _)| p).collect();
        sorted.sort();
        'outer: for p in sorted {
            for line in [1, 3] {
                if expected.lines().count() == 101 {
                    break 'outer;
                }
                expected.push_str(&format!("{p}:{line}:hit\n"));
            }
        }
        let expected: String = expected
            .lines()
            .take(101)
            .map(|l| format!("{l}\n"))
            .collect();
        for _ in 0..5 {
            let out = grep(&wt, json!({"pattern": "hit", "max_results": 101})).await;
            let body: String = out.lines().take(101).map(|l| format!("{l}\n")).collect();
            assert_eq!(body, expected);
            assert!(
                out.lines()
                    .nth(101)
                    .unwrap()
                    .starts_with("[showing the first 101")
            );
        }
    }

    #[test]
    fn render_cuts_mid_file_after_the_last_matchs_context() {
        let line = |number, is_match: bool| Item::Line {
            number,
            is_match,
            text: if is_match { "M".into() } else { "c".into() },
        };
        let files = vec![FileHits {
            path: PathBuf::from("/r/a"),
            items: vec![line(1, true), line(2, false), line(3, true), line(4, false)],
            matches: 2,
        }];
        let (out, capped) = render(files, Path::new("/r"), 1, 1);
        assert_eq!(out, "a:1:M\na-2-c\n");
        assert!(capped);
    }

    #[test]
    fn progress_limit_is_the_first_prefix_over_the_cap_whatever_the_finishing_order() {
        let p = SearchProgress::new(3);
        p.searched(1, 5);
        p.searched(2, 1);
        // File 0 is not done: nothing is known yet.
        assert!(!p.enough());
        assert_eq!(p.limit(), usize::MAX);
        p.searched(0, 2);
        // Files 0 and 1 hold 7 > 3 lines: file 2 and later are not needed.
        assert!(p.enough());
        assert_eq!(p.limit(), 2);
        p.searched(3, 9);
        assert_eq!(p.limit(), 2);
        let p = SearchProgress::new(3);
        for n in 0..4 {
            p.searched(n, 1);
        }
        assert_eq!(p.limit(), 4);
        // Exactly at the cap is not over it.
        let p = SearchProgress::new(3);
        for n in 0..3 {
            p.searched(n, 1);
        }
        assert!(!p.enough());
    }

    #[test]
    fn frontier_threshold_only_moves_earlier() {
        let f = Frontier::new(3);
        f.record(Path::new("/r/m"), 2);
        assert!(!f.beyond(Path::new("/r/z")));
        f.record(Path::new("/r/z"), 2);
        // m(2) + z(2) > 3: z is the last file needed.
        assert!(f.beyond(Path::new("/r/zz")));
        assert!(!f.beyond(Path::new("/r/y")));
        f.record(Path::new("/r/a"), 5);
        assert!(f.beyond(Path::new("/r/b")));
        assert!(f.beyond(Path::new("/r/a/sub")));
        assert!(!f.beyond(Path::new("/r/a")));
    }

    #[test]
    fn both_phases_together_give_the_sequential_answer_wherever_the_handover_falls() {
        // Names where byte order and path order differ ('-' and '.' sort below '/'), files
        // with 0 to 3 matching lines, and an ignored directory the handover must not reopen.
        let mut files: Vec<(String, String)> = vec![(".gitignore".into(), "skip/\n".into())];
        for (i, name) in [
            "a/x.txt",
            "a/y/z.txt",
            "a-b/c.txt",
            "a.b",
            "a0/d.txt",
            "b",
            "c/d/e/f.txt",
            "c/d/e.txt",
            "c/d.txt",
            "skip/hit.txt",
            "z/z/z.txt",
        ]
        .iter()
        .enumerate()
        {
            let body: String = (0..4)
                .map(|l| {
                    if (i + l) % 4 < i % 4 {
                        "hit\n"
                    } else {
                        "miss\n"
                    }
                })
                .collect();
            files.push((name.to_string(), body));
        }
        let (_d, wt) = tree(&files);
        let root = wt.canonicalize().unwrap();
        // The answer of a plain sequential search, from first principles.
        let mut sorted: Vec<&(String, String)> = files
            .iter()
            .filter(|(n, _)| !n.starts_with("skip/") && !n.starts_with('.'))
            .collect();
        sorted.sort_by(|a, b| Path::new(&a.0).cmp(Path::new(&b.0)));
        let all: Vec<String> = sorted
            .iter()
            .flat_map(|(n, body)| {
                body.lines()
                    .enumerate()
                    .filter(|(_, l)| *l == "hit")
                    .map(move |(i, l)| format!("{n}:{}:{l}\n", i + 1))
            })
            .collect();
        assert!(all.len() > 8, "{all:?}");
        let matcher = RegexMatcherBuilder::new().build("hit").unwrap();
        let cancel = AtomicBool::new(false);
        let ignores = WalkIgnores::new(Arc::new(
            td_toolkit::worktree_fs::WorktreeFs::new(&root).unwrap(),
        ));
        for cap in [1, 2, 5, all.len() - 1, all.len(), 100] {
            for budget in [0, 1, 2, 3, 5, 8, 100] {
                let (hits, unreadable) = search_dir(
                    &ignores, &root, &matcher, None, false, 0, cap, &cancel, budget,
                );
                assert_eq!(unreadable, 0);
                let (out, capped) = render(hits, &root, cap, 0);
                let want: String = all.iter().take(cap).cloned().collect();
                assert_eq!(out, want, "cap {cap} budget {budget}");
                assert_eq!(capped, all.len() > cap, "cap {cap} budget {budget}");
            }
        }
    }

    #[tokio::test]
    async fn hidden_files_need_the_flag_and_git_is_never_searched() {
        let (_d, wt) = tree(&[
            (".hidden/a.txt", "needle\n"),
            (".git/config", "needle\n"),
            ("b.txt", "needle\n"),
        ]);
        assert_eq!(
            grep(&wt, json!({"pattern": "needle"})).await,
            "b.txt:1:needle\n"
        );
        assert_eq!(
            grep(&wt, json!({"pattern": "needle", "include_hidden": true})).await,
            ".hidden/a.txt:1:needle\nb.txt:1:needle\n"
        );
        let err = run(&Grep, &wt, json!({"pattern": "needle", "path": ".git"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
    }

    #[tokio::test]
    async fn ignored_files_are_not_searched_outside_git_and_inside() {
        let files = [
            (".gitignore", "ignored.txt\nbuild/\n"),
            ("sub/.ignore", "local.txt\n"),
            ("ignored.txt", "needle\n"),
            ("build/out.txt", "needle\n"),
            ("sub/local.txt", "needle\n"),
            ("sub/kept.txt", "needle\n"),
        ];
        let (_d, wt) = tree(&files);
        assert!(!wt.join(".git").exists());
        assert_eq!(
            grep(&wt, json!({"pattern": "needle"})).await,
            "sub/kept.txt:1:needle\n"
        );
        std::fs::create_dir(wt.join(".git")).unwrap();
        assert_eq!(
            grep(&wt, json!({"pattern": "needle"})).await,
            "sub/kept.txt:1:needle\n"
        );
        // A file named explicitly is searched even if ignored, as with rg.
        assert_eq!(
            grep(&wt, json!({"pattern": "needle", "path": "ignored.txt"})).await,
            "ignored.txt:1:needle\n"
        );
    }

    #[tokio::test]
    async fn binary_files_are_skipped() {
        let (_d, wt) = tree(&[("text.txt", "needle\n")]);
        std::fs::write(wt.join("bin.dat"), b"\0\x01needle\0").unwrap();
        assert_eq!(
            grep(&wt, json!({"pattern": "needle"})).await,
            "text.txt:1:needle\n"
        );
        let out = grep(&wt, json!({"pattern": "needle", "path": "bin.dat"})).await;
        assert!(out.contains("binary file"), "{out}");
    }

    #[tokio::test]
    async fn long_lines_are_cut_on_a_char_boundary() {
        let long = format!("needle {}\n", "é".repeat(1000));
        let (_d, wt) = tree(&[("a.txt", &long)]);
        let out = grep(&wt, json!({"pattern": "needle"})).await;
        assert!(out.len() < 700, "{}", out.len());
        assert!(out.contains("[... line cut, 2007 bytes in all]"), "{out}");
        assert!(!out.contains('\u{FFFD}'), "{out}");
    }

    #[tokio::test]
    async fn no_match_is_plain_text_not_an_error() {
        let (_d, wt) = tree(&[("a.txt", "hay\n")]);
        let (is_error, out) = call(Arc::new(Grep), &wt, json!({"pattern": "needle"})).await;
        assert!(!is_error);
        assert!(out.starts_with("No matches for 'needle' in '.'"), "{out}");
        assert!(out.contains("case_insensitive"), "{out}");
    }

    #[tokio::test]
    async fn invalid_regex_is_invalid_arguments_with_the_regex_error() {
        let (_d, wt) = tree(&[("a.txt", "x\n")]);
        let err = run(&Grep, &wt, json!({"pattern": "fn (\\w+"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(err.to_string().contains("unclosed group"), "{err}");
    }

    #[tokio::test]
    async fn schema_limits_are_enforced() {
        let (_d, wt) = tree(&[("a.txt", "x\n")]);
        let bad = [
            json!({"pattern": "x", "context": 21}),
            json!({"pattern": "x", "max_results": 0}),
            json!({"pattern": "x", "max_results": 5001}),
            json!({"pattern": ""}),
            json!({"pattern": "x", "other": true}),
        ];
        assert_schema_refuses(Arc::new(Grep), &wt, &bad).await;
    }

    #[tokio::test]
    async fn single_file_and_missing_paths() {
        let (_d, wt) = tree(&[("src/a.rs", "one\ntwo\n")]);
        assert_eq!(
            grep(&wt, json!({"pattern": "two", "path": "src/a.rs"})).await,
            "src/a.rs:2:two\n"
        );
        // file_pattern only filters directory walks; a file named in `path` is searched.
        assert_eq!(
            grep(
                &wt,
                json!({"pattern": "two", "path": "src/a.rs", "file_pattern": "*.py"})
            )
            .await,
            "src/a.rs:2:two\n"
        );
        let err = run(&Grep, &wt, json!({"pattern": "x", "path": "nope"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "not_found");
    }

    #[tokio::test]
    async fn escapes_are_refused() {
        let (_d, wt) = tree(&[("a.txt", "x\n")]);
        assert_escapes_refused(&Grep, &wt, json!({"pattern": "x"})).await;
    }

    #[tokio::test]
    async fn symlinks_inside_the_tree_do_not_leak_outside_content() {
        let (_d, wt) = tree(&[("a.txt", "SECRET_OUTSIDE is mentioned here too\n")]);
        link_outside(&wt);
        write(&wt, "inner/x.txt", "nothing\n");
        for include_hidden in [false, true] {
            let out = grep(
                &wt,
                json!({"pattern": "SECRET_OUTSIDE", "include_hidden": include_hidden}),
            )
            .await;
            assert_eq!(out, "a.txt:1:SECRET_OUTSIDE is mentioned here too\n");
        }
    }

    #[tokio::test]
    async fn output_is_deterministic_and_sorted() {
        let mut files = Vec::new();
        for i in 0..200 {
            files.push((format!("d{}/f{i}.txt", i % 9), format!("a\nhit {i}\n")));
        }
        let (_d, wt) = tree(&files);
        let first = grep(&wt, json!({"pattern": "hit", "context": 1})).await;
        for _ in 0..3 {
            assert_eq!(
                grep(&wt, json!({"pattern": "hit", "context": 1})).await,
                first
            );
        }
        let paths: Vec<PathBuf> = first
            .lines()
            .filter(|l| l.contains(":2:"))
            .map(|l| PathBuf::from(l.split(':').next().unwrap()))
            .collect();
        assert_eq!(paths.len(), 200);
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted);
    }

    #[test]
    fn declares_read_only_and_a_closed_schema() {
        assert!(Grep.read_only());
        assert_eq!(Grep.input_schema()["additionalProperties"], json!(false));
    }
}
