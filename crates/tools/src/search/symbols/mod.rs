//! `symbols`: a regex-based outline (functions, types, constants...) of a file or of every
//! source file of a recognised language under a directory.
//!
//! Each language has a small grammar: line regexes (compiled once, plus a `RegexSet` that
//! rejects most lines in one pass) and a scope stack driven by indentation. Indentation
//! stands in for nesting, which holds for formatted code: a function indented under a
//! `class`/`impl`/`trait` is a method, one under another function stays a function. It is
//! an outline for finding code, not a parser; odd formatting can mislabel a symbol.
//!
//! This file is the tool (its input, the walk, the listing); `grammars` holds the line regexes
//! of each language and `outline` the scope stack that applies them to a file's text.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use ignore::{DirEntry, WalkState};
use regex::Regex;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::files::access::open_for_reading;
use crate::search::walk;
use grammars::{Grammar, grammar_for_path};
use outline::{Filter, Symbol, outline};
use td_base::text::count;
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult, display_path};
use td_toolkit::tool::{Tool, ToolOutput};
use td_toolkit::worktree_fs::OpenedFile;

mod grammars;
mod outline;

pub use grammars::LANGUAGES;

const TOOL: &str = "symbols";
const DEFAULT_MAX: u64 = 500;
const MAX_MAX: u64 = 5000;
/// Larger files are almost always generated or vendored; outlining them costs more than it
/// tells.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Every kind a symbol can have, as accepted by the `kind` filter.
pub const KINDS: &[&str] = &[
    "function",
    "method",
    "struct",
    "class",
    "enum",
    "trait",
    "interface",
    "type",
    "const",
    "module",
    "macro",
    "impl",
];

/// The `symbols` tool.
pub struct Symbols;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SymbolsArgs {
    #[serde(default = "args::root")]
    path: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default = "default_max")]
    max_results: u64,
}

fn default_max() -> u64 {
    DEFAULT_MAX
}

/// What reading one file gave.
enum FileOutcome {
    Symbols(Vec<Symbol>),
    TooLarge,
    Binary,
}

fn outline_file(opened: OpenedFile, g: &Grammar, filter: &Filter) -> std::io::Result<FileOutcome> {
    if opened.len > MAX_FILE_BYTES {
        return Ok(FileOutcome::TooLarge);
    }
    let mut bytes = Vec::new();
    // The limit holds even if the file grows after `fstat`.
    opened
        .file
        .take(MAX_FILE_BYTES.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Ok(FileOutcome::TooLarge);
    }
    if bytes[..bytes.len().min(8192)].contains(&0) {
        return Ok(FileOutcome::Binary);
    }
    let text = String::from_utf8_lossy(&bytes);
    Ok(FileOutcome::Symbols(outline(&text, g, filter)))
}

#[async_trait]
impl Tool for Symbols {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Outline the symbols (functions, methods, classes, structs, enums, traits, interfaces, types, constants, modules, macros, impls) of a source file, or of every source file under a directory (gitignore-aware). Prints `path:line: kind name | signature` sorted by path and line. Regex-based, for Rust, Python, JavaScript/TypeScript, Go, Java, C#, Kotlin, Swift, Scala, C/C++, Ruby, PHP, Lua, shell and Elixir. Use it to find where things are defined, then read_file at that line."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Source file or directory to outline, relative to the worktree root. Default \".\" (every supported source file in the worktree)."
                },
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Regular expression the symbol name must match (unanchored; use ^...$ for an exact name, (?i) for any case). Default: every name."
                },
                "kind": {
                    "type": "string",
                    "enum": KINDS,
                    "description": "Only symbols of this kind. `function` is a free function, `method` one defined inside a class/impl/trait. Default: every kind."
                },
                "max_results": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_MAX,
                    "description": "Most symbols to list (the first ones by path and line). Default 500, at most 5000."
                }
            }
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let a: SymbolsArgs = args::parse(TOOL, input)?;
        let name_re = a
            .name
            .as_deref()
            .map(Regex::new)
            .transpose()
            .map_err(|e| ToolError::invalid(TOOL, "/name", e.to_string()))?;
        if let Some(k) = a.kind.as_deref()
            && !KINDS.contains(&k)
        {
            return Err(ToolError::invalid(
                TOOL,
                "/kind",
                format!("unknown kind '{k}'; use one of: {}", KINDS.join(", ")),
            ));
        }
        let filter = Filter {
            name: name_re,
            kind: a.kind.clone(),
        };
        let target = walk::target(ctx, TOOL, &a.path)?;
        let max = a.max_results.clamp(1, MAX_MAX) as usize;
        let root = ctx.root().to_path_buf();

        if !target.is_dir {
            let Some(g) = grammar_for_path(&target.path) else {
                return Err(ToolError::Unavailable {
                    message: format!(
                        "symbols cannot outline '{}': its language is not supported (supported: {}). Use read_file or grep on it instead.",
                        target.shown,
                        LANGUAGES.join(", ")
                    ),
                });
            };
            let path = target.path.clone();
            let shown = target.shown.clone();
            let files = Arc::clone(ctx.files());
            let outcome = walk::run_blocking(TOOL, move |_| {
                let opened = open_for_reading(&files, &path, &shown)?;
                outline_file(opened, g, &filter)
                    .map_err(|e| ToolError::from_io("reading", &shown, &e))
            })
            .await?;
            let symbols = match outcome {
                FileOutcome::Symbols(s) => s,
                FileOutcome::TooLarge => {
                    return Err(ToolError::LimitExceeded {
                        what: format!(
                            "'{}' is larger than {} MiB",
                            target.shown,
                            MAX_FILE_BYTES / (1024 * 1024)
                        ),
                        hint: "Use grep with a pattern to find definitions in it.".to_string(),
                    });
                }
                FileOutcome::Binary => {
                    return Ok(ToolOutput::text(format!(
                        "'{}' is a binary file; it has no symbols to outline.",
                        target.shown
                    )));
                }
            };
            let found = symbols
                .into_iter()
                .map(|s| (target.path.clone(), s))
                .collect();
            return Ok(ToolOutput::text(render(
                found,
                &root,
                max,
                &a,
                &target.shown,
                None,
            )));
        }

        let base = target.path.clone();
        let files = Arc::clone(ctx.files());
        let ignores = walk::WalkIgnores::new(Arc::clone(&files));
        let walk_ignores = Arc::clone(&ignores);
        let (found, stats) = walk::run_blocking(TOOL, move |cancel| {
            let scanned = AtomicUsize::new(0);
            let skipped = AtomicUsize::new(0);
            let walker = walk::builder(&walk_ignores, &base, false, |_| true);
            let found: Vec<(PathBuf, Symbol)> = walk::collect(&walker, cancel, || {
                let (filter, scanned, skipped, files) = (&filter, &scanned, &skipped, &files);
                move |e: DirEntry, out: &mut Vec<(PathBuf, Symbol)>| {
                    if !walk::is_file(&e) {
                        return WalkState::Continue;
                    }
                    let Some(g) = grammar_for_path(e.path()) else {
                        return WalkState::Continue;
                    };
                    scanned.fetch_add(1, Ordering::Relaxed);
                    // Opened beneath the root: the walk's path may have been swapped since.
                    let outcome = files
                        .open_file(e.path())
                        .map_err(|_| std::io::Error::other("refused"))
                        .and_then(|opened| outline_file(opened, g, filter));
                    match outcome {
                        Ok(FileOutcome::Symbols(symbols)) => {
                            out.extend(symbols.into_iter().map(|s| (e.path().to_path_buf(), s)));
                        }
                        Ok(FileOutcome::TooLarge) | Err(_) => {
                            skipped.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(FileOutcome::Binary) => {}
                    }
                    WalkState::Continue
                }
            });
            Ok((found, (scanned.into_inner(), skipped.into_inner())))
        })
        .await?;
        let mut text = if stats.0 == 0 {
            format!(
                "No source files of a supported language under '{}' (files ignored by .gitignore/.ignore and hidden files are skipped). Supported: {}.",
                target.shown,
                LANGUAGES.join(", ")
            )
        } else {
            render(found, &root, max, &a, &target.shown, Some(stats.1))
        };
        if let Some(note) = ignores.note() {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&note);
        }
        Ok(ToolOutput::text(text))
    }
}

/// Sorted, capped listing (or a plain "none found"), with notes on what was left out.
fn render(
    mut found: Vec<(PathBuf, Symbol)>,
    root: &Path,
    max: usize,
    a: &SymbolsArgs,
    shown: &str,
    skipped: Option<usize>,
) -> String {
    let mut out = String::new();
    if found.is_empty() {
        let _ = write!(out, "No symbols found in '{shown}'");
        if let Some(k) = &a.kind {
            let _ = write!(out, " of kind {k}");
        }
        if let Some(n) = &a.name {
            let _ = write!(out, " with a name matching '{n}'");
        }
        out.push('.');
    } else {
        found.sort_unstable_by(|(pa, sa), (pb, sb)| pa.cmp(pb).then(sa.line.cmp(&sb.line)));
        for (path, s) in found.iter().take(max) {
            let shown = display_path(root, path);
            let _ = writeln!(
                out,
                "{shown}:{}: {} {} | {}",
                s.line, s.kind, s.name, s.signature
            );
        }
        if found.len() > max {
            let _ = writeln!(
                out,
                "[{} more symbols not shown; narrow `path`, or filter with `name` or `kind`]",
                found.len() - max
            );
        }
    }
    if let Some(n) = skipped.filter(|&n| n > 0) {
        let _ = write!(
            out,
            "{}[skipped {}: unreadable or larger than {} MiB]",
            if out.ends_with('\n') { "" } else { "\n" },
            count(n as u64, "file"),
            MAX_FILE_BYTES / (1024 * 1024)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::search::symbols::grammars::tests::RUST_SRC;
    use crate::test_support::{
        assert_escapes_refused, assert_schema_refuses, link_outside, run, tree,
    };

    async fn symbols(wt: &Path, input: Value) -> String {
        run(&Symbols, wt, input).await.unwrap()
    }

    #[tokio::test]
    async fn file_output_has_path_line_kind_name_and_signature() {
        let (_d, wt) = tree(&[("src/lib.rs", RUST_SRC)]);
        let out = symbols(&wt, json!({"path": "src/lib.rs"})).await;
        let first = out.lines().next().unwrap();
        assert_eq!(
            first,
            "src/lib.rs:4: const LIMIT | pub const LIMIT: usize = 3;"
        );
        assert!(
            out.contains("src/lib.rs:28: method new | pub async fn new() -> Self\n"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn name_and_kind_filters() {
        let (_d, wt) = tree(&[("src/lib.rs", RUST_SRC)]);
        let out = symbols(&wt, json!({"path": "src", "kind": "method"})).await;
        let names: Vec<&str> = out.lines().map(|l| l.split(' ').nth(2).unwrap()).collect();
        assert_eq!(names, vec!["area", "fmt", "new"]);
        let out = symbols(&wt, json!({"name": "^(?i)thing$"})).await;
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(
            out.contains("struct Thing") && out.contains("impl Thing"),
            "{out}"
        );
        let out = symbols(&wt, json!({"name": "^nothing_like_this$", "kind": "enum"})).await;
        assert_eq!(
            out,
            "No symbols found in '.' of kind enum with a name matching '^nothing_like_this$'."
        );
    }

    #[tokio::test]
    async fn directory_walk_is_sorted_gitignore_aware_and_language_filtered() {
        let (_d, wt) = tree(&[
            (".gitignore", "gen/\n"),
            ("b.py", "def b():\n    pass\n"),
            ("a/z.go", "package a\nfunc Z() {}\nfunc A() {}\n"),
            ("gen/skip.rs", "fn skipped() {}\n"),
            ("notes.txt", "fn not_code() {}\n"),
            (".hidden/h.rs", "fn hidden() {}\n"),
        ]);
        let out = symbols(&wt, json!({})).await;
        assert_eq!(
            out,
            "a/z.go:2: function Z | func Z() {}\na/z.go:3: function A | func A() {}\nb.py:1: function b | def b():\n"
        );
        let out = symbols(&wt, json!({"path": "gen"})).await;
        assert!(out.contains("skipped"), "explicit path is searched: {out}");
    }

    #[tokio::test]
    async fn max_results_caps_with_a_note() {
        let (_d, wt) = tree(&[("a.rs", "fn a() {}\nfn b() {}\nfn c() {}\n")]);
        let out = symbols(&wt, json!({"max_results": 2})).await;
        assert_eq!(
            out,
            "a.rs:1: function a | fn a() {}\na.rs:2: function b | fn b() {}\n[1 more symbols not shown; narrow `path`, or filter with `name` or `kind`]\n"
        );
    }

    #[tokio::test]
    async fn errors_and_empty_results() {
        let (_d, wt) = tree(&[("notes.txt", "x\n"), ("a.rs", "fn a() {}\n")]);
        let err = run(&Symbols, &wt, json!({"path": "notes.txt"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "unavailable");
        assert!(err.to_string().contains("read_file or grep"), "{err}");
        let err = run(&Symbols, &wt, json!({"name": "(unclosed"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        let err = run(&Symbols, &wt, json!({"kind": "widget"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        let err = run(&Symbols, &wt, json!({"path": "missing.rs"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "not_found");
        let empty = tree(&[("notes.txt", "x\n")]);
        let out = symbols(&empty.1, json!({})).await;
        assert!(
            out.starts_with("No source files of a supported language"),
            "{out}"
        );
        let bad = [
            json!({"kind": "widget"}),
            json!({"max_results": 0}),
            json!({"max_results": 5001}),
            json!({"name": ""}),
            json!({"extra": 1}),
        ];
        assert_schema_refuses(Arc::new(Symbols), &wt, &bad).await;
    }

    #[tokio::test]
    async fn files_over_the_size_limit_are_skipped_with_a_note_or_refused_when_named() {
        let (_d, wt) = tree(&[("a.rs", "fn a() {}\n")]);
        let big = std::fs::File::create(wt.join("big.rs")).unwrap();
        big.set_len(MAX_FILE_BYTES + 1).unwrap();
        assert_eq!(
            symbols(&wt, json!({})).await,
            "a.rs:1: function a | fn a() {}\n[skipped 1 file: unreadable or larger than 4 MiB]"
        );
        let err = run(&Symbols, &wt, json!({"path": "big.rs"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "limit_exceeded");
        assert!(err.to_string().contains("larger than 4 MiB"), "{err}");
        assert!(err.to_string().contains("Use grep"), "{err}");
    }

    #[tokio::test]
    async fn escapes_are_refused() {
        let (_d, wt) = tree(&[("a.rs", "fn a() {}\n")]);
        assert_escapes_refused(&Symbols, &wt, json!({})).await;
    }

    #[tokio::test]
    async fn symlinks_inside_the_tree_do_not_leak_outside_symbols() {
        let (_d, wt) = tree(&[("a.rs", "fn a() {}\n")]);
        link_outside(&wt);
        let out = symbols(&wt, json!({})).await;
        assert_eq!(out, "a.rs:1: function a | fn a() {}\n");
    }

    #[tokio::test]
    async fn output_is_deterministic_and_sorted() {
        let mut files = Vec::new();
        for i in 0..120 {
            files.push((
                format!("m{}/f{i}.rs", i % 5),
                format!("fn f{i}() {{}}\nstruct S{i};\n"),
            ));
        }
        let (_d, wt) = tree(&files);
        let first = symbols(&wt, json!({})).await;
        assert_eq!(symbols(&wt, json!({})).await, first);
        let keys: Vec<(PathBuf, usize)> = first
            .lines()
            .map(|l| {
                let mut it = l.split(':');
                (
                    PathBuf::from(it.next().unwrap()),
                    it.next().unwrap().parse().unwrap(),
                )
            })
            .collect();
        assert_eq!(keys.len(), 240);
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn declares_read_only_and_a_closed_schema() {
        assert!(Symbols.read_only());
        assert_eq!(Symbols.input_schema()["additionalProperties"], json!(false));
    }
}
