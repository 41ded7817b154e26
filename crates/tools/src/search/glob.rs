//! `glob`: lists the files under a directory whose path (relative to that directory)
//! matches a glob pattern, gitignore-aware, as sorted worktree-relative paths.
//!
//! Speed: the walk only enters the directories named by the pattern's literal leading
//! components (`src/tools/*.rs` never reads `tests/`), and a pattern without `**` bounds
//! the walk's depth. Pruning uses the walker's own filter, so ignore rules of the skipped
//! levels still apply exactly as for a full walk.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use globset::Candidate;
use ignore::{DirEntry, WalkState};
use rustix::fs::FileType;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::search::walk;
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult, display_path};
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "glob";
const DEFAULT_MAX: usize = 1000;
const MAX_MAX: usize = 10_000;

/// The `glob` tool.
pub struct Glob;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
    #[serde(default = "args::root")]
    path: String,
    #[serde(default = "default_max")]
    max_results: u64,
    #[serde(default)]
    include_hidden: bool,
}

fn default_max() -> u64 {
    DEFAULT_MAX as u64
}

/// A pattern taken apart for the walk.
#[derive(Debug, PartialEq)]
struct GlobPlan {
    /// The pattern as matched (leading `./` and empty components removed).
    pattern: String,
    /// Leading directory components free of glob syntax: the only route the walk takes.
    prefix: Vec<OsString>,
    /// Deepest level a match can lie at, when the pattern has no `**`.
    max_depth: Option<usize>,
    /// Whether a component names a hidden entry explicitly (`.github/**`, `**/.env`).
    names_hidden: bool,
}

fn has_glob_syntax(component: &str) -> bool {
    component.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

fn plan(pattern: &str) -> ToolResult<GlobPlan> {
    if pattern.starts_with('/') {
        return Err(ToolError::invalid(
            TOOL,
            "/pattern",
            "the pattern must be relative to `path` (it starts with '/'); put the directory in `path` and keep only the file part in `pattern`, e.g. path \"src\", pattern \"**/*.rs\"",
        ));
    }
    let parts: Vec<&str> = pattern
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(ToolError::invalid(
            TOOL,
            "/pattern",
            "the pattern cannot contain '..'; set `path` to the directory to search instead",
        ));
    }
    if parts.is_empty() {
        return Err(ToolError::invalid(
            TOOL,
            "/pattern",
            "the pattern names no file; use e.g. \"**/*\" for every file",
        ));
    }
    let last = parts.len() - 1;
    let prefix = parts[..last]
        .iter()
        .take_while(|c| !has_glob_syntax(c))
        .map(OsString::from)
        .collect();
    Ok(GlobPlan {
        pattern: parts.join("/"),
        prefix,
        max_depth: (!parts.iter().any(|c| c.contains("**"))).then_some(parts.len()),
        names_hidden: parts.iter().any(|c| c.starts_with('.')),
    })
}

#[async_trait]
impl Tool for Glob {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Find files by glob pattern, matched against the path relative to `path`. `*` stays within one directory, `**` spans any depth, `{a,b}` and `[abc]` work: `**/*.rs`, `src/*.toml`, `tests/**/test_*.py`. Skips files ignored by .gitignore/.ignore and the .git directory; hidden files only with include_hidden (or when the pattern names them, like `.github/**`). Returns sorted worktree-relative paths usable with read_file."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "pattern": {
                    "type": "string",
                    "minLength": 1,
                    "description": "Glob matched against each file's path relative to `path`, e.g. \"**/*.rs\" (any depth) or \"src/*.toml\" (one level). Required."
                },
                "path": {
                    "type": "string",
                    "description": "Directory to search from, relative to the worktree root. Default \".\" (the root)."
                },
                "max_results": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_MAX,
                    "description": "Most paths to list (the first ones in sorted order). Default 1000, at most 10000."
                },
                "include_hidden": {
                    "type": "boolean",
                    "description": "Also list hidden files and enter hidden directories (names starting with '.'; .git is never entered). Default false."
                }
            },
            "required": ["pattern"]
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let a: GlobArgs = args::parse(TOOL, input)?;
        let plan = plan(&a.pattern)?;
        let matcher = walk::glob_set(TOOL, "/pattern", &plan.pattern)?;
        let target = walk::target(ctx, TOOL, &a.path)?;
        if !target.is_dir {
            return Err(ToolError::invalid(
                TOOL,
                "/path",
                format!(
                    "'{}' is a file; `path` must be a directory (use read_file to read a file)",
                    target.shown
                ),
            ));
        }
        let max = usize::try_from(a.max_results)
            .unwrap_or(MAX_MAX)
            .clamp(1, MAX_MAX);
        let hidden = a.include_hidden || plan.names_hidden;
        let base = target.path.clone();
        let root = ctx.root().to_path_buf();
        let ignores = walk::WalkIgnores::new(Arc::clone(ctx.files()));
        let walk_ignores = Arc::clone(&ignores);
        let prefix = plan.prefix.clone();
        let max_depth = plan.max_depth;

        let mut found = walk::run_blocking(TOOL, move |cancel| {
            let mut walker = walk::builder(&walk_ignores, &base, hidden, move |e: &DirEntry| {
                // Entries above the end of the literal prefix must lie on its route.
                let d = e.depth();
                d == 0 || d > prefix.len() || e.file_name() == prefix[d - 1].as_os_str()
            });
            walker.max_depth(max_depth);
            let found: Vec<PathBuf> = walk::collect(&walker, cancel, || {
                let base = &base;
                let matcher = &matcher;
                move |e: DirEntry, out: &mut Vec<PathBuf>| {
                    if walk::is_file(&e)
                        && let Some(rel) = walk::relative(e.path(), base)
                        && matcher.is_match_candidate(&Candidate::new(rel))
                    {
                        out.push(e.into_path());
                    }
                    WalkState::Continue
                }
            });
            Ok(found)
        })
        .await?;

        if found.is_empty() {
            let mut msg = format!(
                "No files match '{}' under '{}'. {}. `*` does not cross '/': use \"**/\" to match at any depth.",
                a.pattern,
                target.shown,
                walk::skipped_note("", hidden)
            );
            // A literal pattern naming a directory is a common slip: glob lists files only.
            // Looked at beneath the root without following a symlink: through one, whether
            // a directory exists outside would be told.
            let named = target.path.join(&plan.pattern);
            if !has_glob_syntax(&plan.pattern)
                && ctx
                    .files()
                    .inspect(&named)
                    .is_some_and(|i| i.kind == FileType::Directory)
            {
                let _ = write!(
                    msg,
                    " '{}' is a directory and glob lists files: try \"{}/**\".",
                    plan.pattern, plan.pattern
                );
            }
            if let Some(note) = ignores.note() {
                msg.push('\n');
                msg.push_str(&note);
            }
            return Ok(ToolOutput::text(msg));
        }
        let total = found.len();
        // Only the first `max` paths are shown: select them, then sort just those.
        if total > max {
            found.select_nth_unstable_by(max - 1, |a, b| walk::path_order(a, b));
            found.truncate(max);
        }
        found.sort_unstable_by(|a, b| walk::path_order(a, b));
        // Only what is a file beneath the root now is shown: the walk reads directories by
        // path, and one swapped for a symlink mid-walk would list names from outside.
        let files = ctx.files();
        found.retain(|p| {
            files
                .inspect(p)
                .is_some_and(|i| i.kind == FileType::RegularFile)
        });
        let mut out = String::with_capacity(total.min(max) * 32);
        for p in &found {
            out.push_str(&display_path(&root, p));
            out.push('\n');
        }
        if total > max {
            out.push_str(&format!(
                "[{} more matches not shown; narrow the pattern or the path]\n",
                total - max
            ));
        }
        if let Some(note) = ignores.note() {
            out.push_str(&note);
            out.push('\n');
        }
        Ok(ToolOutput::text(out))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::test_support::{
        assert_escapes_refused, assert_schema_refuses, call, link_outside, run, tree,
    };

    fn files() -> Vec<(&'static str, &'static str)> {
        vec![
            ("Cargo.toml", ""),
            ("main.rs", ""),
            ("src/lib.rs", ""),
            ("src/a/deep.rs", ""),
            ("src/a/b/deeper.rs", ""),
            ("src/notes.txt", ""),
            ("src/x.toml", ""),
            ("tests/t.rs", ""),
        ]
    }

    async fn glob(wt: &std::path::Path, input: Value) -> String {
        run(&Glob, wt, input).await.unwrap()
    }

    #[tokio::test]
    async fn double_star_lists_every_depth_sorted_and_worktree_relative() {
        let (_d, wt) = tree(&files());
        let out = glob(&wt, json!({"pattern": "**/*.rs"})).await;
        assert_eq!(
            out,
            "main.rs\nsrc/a/b/deeper.rs\nsrc/a/deep.rs\nsrc/lib.rs\ntests/t.rs\n"
        );
    }

    #[tokio::test]
    async fn single_star_does_not_cross_directories() {
        let (_d, wt) = tree(&files());
        assert_eq!(glob(&wt, json!({"pattern": "*.rs"})).await, "main.rs\n");
        assert_eq!(
            glob(&wt, json!({"pattern": "src/*.rs"})).await,
            "src/lib.rs\n"
        );
        assert_eq!(
            glob(&wt, json!({"pattern": "*/*.rs"})).await,
            "src/lib.rs\ntests/t.rs\n"
        );
        assert_eq!(
            glob(&wt, json!({"pattern": "src/**/*.rs"})).await,
            "src/a/b/deeper.rs\nsrc/a/deep.rs\nsrc/lib.rs\n"
        );
        assert_eq!(
            glob(&wt, json!({"pattern": "./{src,tests}/*.{rs,toml}"})).await,
            "src/lib.rs\nsrc/x.toml\ntests/t.rs\n"
        );
        assert_eq!(
            glob(&wt, json!({"pattern": "src/a/b/deeper.rs"})).await,
            "src/a/b/deeper.rs\n"
        );
    }

    #[test]
    fn plan_takes_the_literal_prefix_and_bounds_depth() {
        let p = plan("./src//tools/*.rs").unwrap();
        assert_eq!(p.pattern, "src/tools/*.rs");
        assert_eq!(
            p.prefix,
            vec![OsString::from("src"), OsString::from("tools")]
        );
        assert_eq!(p.max_depth, Some(3));
        assert!(!p.names_hidden);
        let p = plan("a/*/b/**/*.rs").unwrap();
        assert_eq!(p.prefix, vec![OsString::from("a")]);
        assert_eq!(p.max_depth, None);
        assert!(plan(".github/*.yml").unwrap().names_hidden);
        assert_eq!(plan("Cargo.toml").unwrap().prefix, Vec::<OsString>::new());
    }

    #[tokio::test]
    async fn path_sets_the_base_but_output_stays_worktree_relative() {
        let (_d, wt) = tree(&files());
        assert_eq!(
            glob(&wt, json!({"pattern": "*.rs", "path": "src/a"})).await,
            "src/a/deep.rs\n"
        );
        assert_eq!(
            glob(&wt, json!({"pattern": "**/*.rs", "path": "src/a/"})).await,
            "src/a/b/deeper.rs\nsrc/a/deep.rs\n"
        );
    }

    #[tokio::test]
    async fn max_results_caps_with_a_note() {
        let (_d, wt) = tree(&files());
        let out = glob(&wt, json!({"pattern": "**/*.rs", "max_results": 2})).await;
        assert_eq!(
            out,
            "main.rs\nsrc/a/b/deeper.rs\n[3 more matches not shown; narrow the pattern or the path]\n"
        );
    }

    #[tokio::test]
    async fn a_capped_listing_is_the_start_of_the_full_sorted_one() {
        // Names where byte order and path order disagree ('-' and '.' sort below '/').
        let names: Vec<String> = (0..60)
            .map(|i| match i % 4 {
                0 => format!("d{}/x{i}.rs", i % 7),
                1 => format!("d{}.rs", i % 9),
                2 => format!("d{}-{i}/y.rs", i % 5),
                _ => format!("d{}/sub/z{i}.rs", i % 3),
            })
            .collect();
        let entries: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "")).collect();
        let (_d, wt) = tree(&entries);
        let full = glob(&wt, json!({"pattern": "**/*.rs", "max_results": 10_000})).await;
        let all: Vec<&str> = full.lines().collect();
        let mut expected: Vec<std::path::PathBuf> = all.iter().map(Into::into).collect();
        expected.sort();
        assert_eq!(
            all,
            expected
                .iter()
                .map(|p| p.to_str().unwrap())
                .collect::<Vec<_>>()
        );
        for max in [1, 7, 30] {
            let out = glob(&wt, json!({"pattern": "**/*.rs", "max_results": max})).await;
            let mut want = all[..max].join("\n");
            want.push_str(&format!(
                "\n[{} more matches not shown; narrow the pattern or the path]\n",
                all.len() - max
            ));
            assert_eq!(out, want, "max {max}");
        }
    }

    #[tokio::test]
    async fn gitignore_and_ignore_files_apply_outside_git() {
        let (_d, wt) = tree(&[
            (".gitignore", "target/\n*.log\n"),
            ("src/.ignore", "gen.rs\n"),
            ("src/lib.rs", ""),
            ("src/gen.rs", ""),
            ("target/debug/x.rs", ""),
            ("a.log", ""),
        ]);
        assert!(!wt.join(".git").exists());
        assert_eq!(glob(&wt, json!({"pattern": "**/*"})).await, "src/lib.rs\n");
        // The literal-prefix shortcut must not bypass the rule that ignores target/.
        let out = glob(&wt, json!({"pattern": "target/**/*.rs"})).await;
        assert!(out.starts_with("No files match"), "{out}");
    }

    #[tokio::test]
    async fn hidden_files_need_the_flag_and_git_is_never_listed() {
        let (_d, wt) = tree(&[
            (".git/config", ""),
            (".git/hooks/x.rs", ""),
            (".env", ""),
            (".cfg/a.rs", ""),
            ("b.rs", ""),
        ]);
        assert_eq!(glob(&wt, json!({"pattern": "**/*"})).await, "b.rs\n");
        assert_eq!(
            glob(&wt, json!({"pattern": "**/*", "include_hidden": true})).await,
            ".cfg/a.rs\n.env\nb.rs\n"
        );
        // Naming a hidden component explicitly is enough.
        assert_eq!(
            glob(&wt, json!({"pattern": ".cfg/*.rs"})).await,
            ".cfg/a.rs\n"
        );
        assert_eq!(glob(&wt, json!({"pattern": "**/.env"})).await, ".env\n");
        let out = glob(&wt, json!({"pattern": ".git/**"})).await;
        assert!(out.starts_with("No files match"), "{out}");
    }

    #[tokio::test]
    async fn no_match_is_plain_text_not_an_error() {
        let (_d, wt) = tree(&files());
        let (is_error, out) = call(Arc::new(Glob), &wt, json!({"pattern": "**/*.py"})).await;
        assert!(!is_error);
        assert!(
            out.starts_with("No files match '**/*.py' under '.'"),
            "{out}"
        );
        assert!(out.contains("include_hidden"), "{out}");
        let (_, out) = call(Arc::new(Glob), &wt, json!({"pattern": "src/a"})).await;
        assert!(out.contains("try \"src/a/**\""), "{out}");
    }

    #[tokio::test]
    async fn invalid_patterns_are_invalid_arguments() {
        let (_d, wt) = tree(&files());
        for (pattern, needle) in [
            ("src/[a", "unclosed character class"),
            ("/etc/*", "relative to `path`"),
            ("../*", "'..'"),
            ("./", "names no file"),
        ] {
            let err = run(&Glob, &wt, json!({"pattern": pattern}))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), "invalid_arguments", "{pattern}");
            assert!(err.to_string().contains(needle), "{pattern}: {err}");
        }
    }

    #[tokio::test]
    async fn schema_limits_are_enforced() {
        let (_d, wt) = tree(&files());
        let bad = [
            json!({"pattern": "*", "max_results": 0}),
            json!({"pattern": "*", "max_results": 10001}),
            json!({"pattern": ""}),
            json!({"pattern": "*", "bogus": 1}),
            json!({}),
        ];
        assert_schema_refuses(Arc::new(Glob), &wt, &bad).await;
    }

    #[tokio::test]
    async fn path_must_be_an_existing_directory() {
        let (_d, wt) = tree(&files());
        let err = run(&Glob, &wt, json!({"pattern": "*", "path": "main.rs"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        let err = run(&Glob, &wt, json!({"pattern": "*", "path": "nope"}))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "not_found");
    }

    #[tokio::test]
    async fn escapes_are_refused() {
        let (_d, wt) = tree(&files());
        assert_escapes_refused(&Glob, &wt, json!({"pattern": "**/*"})).await;
    }

    #[tokio::test]
    async fn symlinks_inside_the_tree_do_not_leak_outside_files() {
        let (_d, wt) = tree(&files());
        link_outside(&wt);
        for include_hidden in [false, true] {
            let out = glob(
                &wt,
                json!({"pattern": "**/*", "include_hidden": include_hidden}),
            )
            .await;
            assert!(!out.contains("secret") && !out.contains("out_"), "{out}");
        }
        let out = glob(&wt, json!({"pattern": "out_dir/*"})).await;
        assert!(out.starts_with("No files match"), "{out}");
    }

    #[tokio::test]
    async fn output_is_deterministic_and_sorted() {
        let mut many = Vec::new();
        for i in (0..300).rev() {
            many.push((format!("d{}/f{i}.rs", i % 7), String::new()));
        }
        let (_d, wt) = tree(&many);
        let first = glob(&wt, json!({"pattern": "**/*.rs"})).await;
        for _ in 0..3 {
            assert_eq!(glob(&wt, json!({"pattern": "**/*.rs"})).await, first);
        }
        let lines: Vec<&str> = first.lines().collect();
        assert_eq!(lines.len(), 300);
        let mut sorted = lines.clone();
        sorted.sort();
        assert_eq!(lines, sorted);
    }

    #[test]
    fn declares_read_only_and_a_closed_schema() {
        assert!(Glob.read_only());
        let s = Glob.input_schema();
        assert_eq!(s["additionalProperties"], json!(false));
        for (_, p) in s["properties"].as_object().unwrap() {
            assert!(
                p["description"].as_str().unwrap().contains("efault")
                    || p["description"].as_str().unwrap().contains("Required")
            );
        }
    }
}
