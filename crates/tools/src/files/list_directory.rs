//! `list_directory`: the entries of a directory, or an indented tree of it, sorted by name,
//! with sizes and language guesses, skipping what `.gitignore`/`.ignore` files exclude
//! (also outside git repositories) and never showing `.git`.
//!
//! The walk and its ignore rules are those of the other walking tools (`walk::builder`,
//! `WalkIgnores`): ignore files from the worktree root down, read safely through the
//! worktree's handle; nothing above the worktree, no global excludes, so the same call lists
//! the same entries on every machine.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use rustix::fs::FileType;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::files::access::{io_error, not_found};
use crate::files::size::human_size;
use crate::search::walk::{self, WalkIgnores};
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult, display_path};
use td_toolkit::tool::{Tool, ToolOutput};
use td_toolkit::worktree_fs::{WorktreeFs, beneath, swapped};

const NAME: &str = "list_directory";

/// Entries shown at most; the rest are counted.
const MAX_ENTRIES: usize = 1000;

/// Entries counted past the cap before giving up counting (a huge tree must not eat the
/// call's time budget only to say how much it did not show).
const MAX_COUNTED: usize = 100_000;

const DEFAULT_DEPTH: u64 = 3;
const MAX_DEPTH: u64 = 20;

/// The `list_directory` tool.
pub struct ListDirectory;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default = "args::root")]
    path: String,
    #[serde(default)]
    recursive: bool,
    max_depth: Option<u64>,
    #[serde(default)]
    include_hidden: bool,
}

/// Everything the blocking walk needs, owned.
#[derive(Debug)]
struct Listing {
    dir: PathBuf,
    shown: String,
    recursive: bool,
    depth: usize,
    include_hidden: bool,
    depth_ignored: bool,
    ignores: Arc<WalkIgnores>,
}

#[async_trait]
impl Tool for ListDirectory {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "List a directory: its entries, or with recursive=true an indented tree down to max_depth levels. Directories end with '/', files show their size and a language guess, symlinks their target (not followed). Sorted by name; entries excluded by .gitignore/.ignore files are left out, and so are hidden ones unless include_hidden is true. At most 1000 entries are shown."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": super::path_schema("Directory to list, relative to the worktree root (default \".\", the root)."),
                "recursive": {
                    "type": "boolean",
                    "description": "List subdirectories too, as an indented tree (default false)."
                },
                "max_depth": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_DEPTH,
                    "description": "How many levels a recursive listing goes down; 1 is the directory's own entries (default 3). Only used when recursive is true."
                },
                "include_hidden": {
                    "type": "boolean",
                    "description": "Also list entries whose name starts with '.' (default false). .git is never listed."
                }
            },
            "additionalProperties": false
        })
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let args: ListArgs = args::parse(NAME, input)?;
        let dir = ctx.resolve(&args.path)?;
        let shown = ctx.display(&dir);
        // Looked at beneath the root's handle: a symlink swapped in since resolution is
        // refused, and what it points at is not told.
        match walk::kind_beneath(ctx.files(), &dir) {
            Ok(FileType::Directory) => {}
            Ok(_) => {
                return Err(ToolError::failed(
                    format!("listing '{shown}'"),
                    "it is a file, not a directory",
                    "Use read_file to read it.",
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(not_found(
                    ctx.files(),
                    &dir,
                    &shown,
                    "List its parent directory, or use glob to find it.",
                ));
            }
            Err(e) if beneath::is_escape(&e) => return Err(swapped(&shown)),
            Err(e) => return Err(io_error(ctx.files(), "listing", &dir, &shown, &e)),
        }
        let depth = if args.recursive {
            args.max_depth.unwrap_or(DEFAULT_DEPTH).clamp(1, MAX_DEPTH) as usize
        } else {
            1
        };
        let listing = Listing {
            dir,
            shown: shown.clone(),
            recursive: args.recursive,
            depth,
            include_hidden: args.include_hidden,
            depth_ignored: !args.recursive && args.max_depth.is_some(),
            ignores: WalkIgnores::new(Arc::clone(ctx.files())),
        };
        let text = tokio::task::spawn_blocking(move || walk(listing))
            .await
            .map_err(|e| {
                ToolError::failed(format!("listing '{shown}'"), e, "Try the call again.")
            })?;
        Ok(ToolOutput::text(text))
    }
}

/// Walks and renders the listing.
fn walk(listing: Listing) -> String {
    let Listing {
        dir,
        shown,
        recursive,
        depth,
        include_hidden,
        depth_ignored,
        ignores,
    } = listing;
    let worktree = Arc::clone(ignores.files());
    let mut builder = walk::builder(&ignores, &dir, include_hidden, |_| true);
    builder
        .max_depth(Some(depth))
        .sort_by_file_name(|a, b| a.cmp(b));

    let mut body = String::new();
    let (mut dirs, mut files, mut links) = (0usize, 0usize, 0usize);
    let mut seen = 0usize;
    let mut errors = 0usize;
    let mut first_error: Option<String> = None;
    for item in builder.build() {
        let entry = match item {
            Ok(entry) => entry,
            Err(e) => {
                errors += 1;
                if first_error.is_none() {
                    first_error = walk_error(&e, &worktree);
                }
                continue;
            }
        };
        if entry.depth() == 0 {
            continue;
        }
        seen += 1;
        // What is shown comes from the entry as it is beneath the root now: the walk reads
        // directories by path, and one swapped for a symlink would show what lies outside.
        let Some(seen_now) = worktree.inspect(entry.path()) else {
            continue;
        };
        let is_link = seen_now.kind == FileType::Symlink;
        let is_dir = seen_now.kind == FileType::Directory;
        match (is_link, is_dir) {
            (true, _) => links += 1,
            (false, true) => dirs += 1,
            (false, false) => files += 1,
        }
        if seen > MAX_ENTRIES {
            if seen >= MAX_ENTRIES + MAX_COUNTED {
                break;
            }
            continue;
        }
        if recursive {
            body.push_str(&"  ".repeat(entry.depth() - 1));
        }
        let name = td_base::shown_path::show(entry.file_name());
        if is_link {
            let target = seen_now
                .link_target
                .as_deref()
                .map(|t| td_base::shown_path::show(t).into_owned())
                .unwrap_or_else(|| "?".to_string());
            let _ = writeln!(body, "{name} -> {target}");
        } else if is_dir {
            let unexpanded = recursive
                && entry.depth() == depth
                && worktree.open_dir(entry.path()).is_ok_and(|fd| {
                    rustix::fs::Dir::read_from(&fd).is_ok_and(|d| {
                        d.filter_map(Result::ok)
                            .any(|e| !matches!(e.file_name().to_bytes(), b"." | b".."))
                    })
                });
            if unexpanded {
                let _ = writeln!(body, "{name}/  [not expanded: max_depth {depth} reached]");
            } else {
                let _ = writeln!(body, "{name}/");
            }
        } else {
            let size = seen_now.len;
            match crate::search::lang::guess(entry.path()) {
                Some(lang) => {
                    let _ = writeln!(body, "{name}  ({}, {lang})", human_size(size));
                }
                None => {
                    let _ = writeln!(body, "{name}  ({})", human_size(size));
                }
            }
        }
    }

    let mut out = if recursive {
        format!("Directory '{shown}' (recursive, max_depth {depth}):\n")
    } else {
        format!("Directory '{shown}':\n")
    };
    if seen == 0 {
        out.push_str("(empty: no entries, apart from any hidden or ignored ones not listed)\n");
    }
    out.push_str(&body);
    let mut summary = format!(
        "{dirs} director{}, {files} file{}",
        if dirs == 1 { "y" } else { "ies" },
        if files == 1 { "" } else { "s" }
    );
    if links > 0 {
        let _ = write!(
            summary,
            ", {links} symlink{}",
            if links == 1 { "" } else { "s" }
        );
    }
    if seen > 0 {
        let _ = writeln!(out, "[{summary}]");
    }
    if seen > MAX_ENTRIES {
        let more = seen - MAX_ENTRIES;
        let at_least = if seen >= MAX_ENTRIES + MAX_COUNTED {
            "at least "
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "[Showing the first {MAX_ENTRIES} entries; {at_least}{more} more not shown. Narrow it: list a subdirectory, use a smaller max_depth, or use glob with a pattern.]"
        );
    }
    if errors > 0 {
        let first = first_error
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "[{errors} entr{} could not be read{first}.]",
            if errors == 1 { "y" } else { "ies" },
        );
    }
    if let Some(note) = ignores.note() {
        out.push_str(&note);
        out.push('\n');
    }
    if depth_ignored {
        out.push_str("[max_depth only applies with recursive=true; this lists the directory's own entries. Pass recursive=true to go deeper.]\n");
    }
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

/// What a walk error is shown as: the entry it names, escaped and relative to the root, only
/// while that entry is beneath the root now (a directory swapped for a symlink mid-walk
/// hands the walker names from outside), and the system's reason without any path in it
/// (the walker's own messages repeat the absolute path). `None` when it names an entry that
/// is not beneath the root: the error is still counted.
fn walk_error(err: &ignore::Error, files: &WorktreeFs) -> Option<String> {
    let reason = err
        .io_error()
        .map_or_else(|| "it could not be read".to_string(), system_reason);
    match error_path(err) {
        Some(path) => files
            .inspect(path)
            .map(|_| format!("'{}': {reason}", display_path(files.root(), path))),
        None => Some(reason),
    }
}

/// The system's reason for `io` ("No such file or directory (os error 2)"), from the first
/// error in its chain that carries an OS error code; else its kind. Never its message: the
/// walker wraps errors in one that names the path.
fn system_reason(io: &std::io::Error) -> String {
    if let Some(code) = io.raw_os_error() {
        return std::io::Error::from_raw_os_error(code).to_string();
    }
    // The error `io` wraps, then what that one was caused by, and so on.
    let mut at: Option<&(dyn std::error::Error + 'static)> = match io.get_ref() {
        Some(inner) => Some(inner),
        None => None,
    };
    while let Some(e) = at {
        if let Some(code) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
        {
            return std::io::Error::from_raw_os_error(code).to_string();
        }
        at = e.source();
    }
    io.kind().to_string()
}

/// The path a walk error is about, if it names one.
fn error_path(err: &ignore::Error) -> Option<&std::path::Path> {
    match err {
        ignore::Error::WithPath { path, .. } => Some(path),
        ignore::Error::WithDepth { err, .. } | ignore::Error::WithLineNumber { err, .. } => {
            error_path(err)
        }
        ignore::Error::Partial(errs) => errs.first().and_then(error_path),
        ignore::Error::Loop { child, .. } => Some(child),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{put, schema_bounds, worktree as setup};
    use std::os::unix::fs::symlink;

    fn tree(ctx: &ToolContext) {
        put(ctx, "b.rs", &[b'x'; 1300]);
        put(ctx, "a.txt", b"hi");
        put(ctx, "src/main.rs", b"fn main() {}\n");
        put(ctx, "src/deep/er/x.py", b"print()\n");
        put(ctx, "src/deep/er/most/y.go", b"package y\n");
        put(ctx, ".hidden", b"h");
    }

    async fn list(ctx: &ToolContext, input: Value) -> ToolResult<ToolOutput> {
        ListDirectory.execute(input, ctx).await
    }

    async fn text(ctx: &ToolContext, input: Value) -> String {
        let out = list(ctx, input).await.unwrap();
        assert!(!out.is_error && out.effects.is_empty());
        out.content
    }

    #[tokio::test]
    async fn lists_the_directory_itself_sorted_with_sizes_and_languages() {
        let (_d, ctx) = setup();
        tree(&ctx);
        let out = text(&ctx, json!({})).await;
        assert_eq!(
            out,
            "Directory '.':\na.txt  (2 B)\nb.rs  (1.3 KB, rust)\nsrc/\n[1 directory, 2 files]"
        );
        assert!(ListDirectory.read_only());
    }

    #[tokio::test]
    async fn recursive_shows_an_indented_tree_down_to_max_depth() {
        let (_d, ctx) = setup();
        tree(&ctx);
        let out = text(&ctx, json!({"recursive": true})).await;
        assert_eq!(
            out,
            "Directory '.' (recursive, max_depth 3):\n\
             a.txt  (2 B)\n\
             b.rs  (1.3 KB, rust)\n\
             src/\n\
             \x20 deep/\n\
             \x20   er/  [not expanded: max_depth 3 reached]\n\
             \x20 main.rs  (13 B, rust)\n\
             [3 directories, 3 files]"
        );
        let out = text(
            &ctx,
            json!({"path": "src", "recursive": true, "max_depth": 10}),
        )
        .await;
        assert!(
            out.contains("\n    most/\n      y.go  (10 B, go)\n"),
            "{out}"
        );
        assert!(out.contains("\n    x.py  (8 B, python)\n"), "{out}");
        assert!(!out.contains("not expanded"));
        let out = text(&ctx, json!({"recursive": true, "max_depth": 1})).await;
        assert!(
            out.contains("src/  [not expanded: max_depth 1 reached]"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn max_depth_without_recursive_is_ignored_and_says_so() {
        let (_d, ctx) = setup();
        tree(&ctx);
        let out = text(&ctx, json!({"max_depth": 5})).await;
        assert!(!out.contains("main.rs"));
        assert!(out.ends_with("[max_depth only applies with recursive=true; this lists the directory's own entries. Pass recursive=true to go deeper.]"));
    }

    #[tokio::test]
    async fn hidden_entries_only_on_request_and_git_never() {
        let (_d, ctx) = setup();
        tree(&ctx);
        put(&ctx, ".git/HEAD", b"ref: x\n");
        put(&ctx, "src/.git", b"gitdir: elsewhere\n");
        let out = text(&ctx, json!({"recursive": true})).await;
        assert!(!out.contains(".hidden"));
        let out = text(&ctx, json!({"recursive": true, "include_hidden": true})).await;
        assert!(out.contains("\n.hidden  (1 B)\n"), "{out}");
        assert!(!out.contains(".git"), "{out}");
    }

    #[tokio::test]
    async fn gitignore_is_respected_outside_git_and_from_ancestors_in_the_worktree() {
        let outer = tempfile::tempdir().unwrap();
        // An ignore file above the worktree must not hide anything.
        std::fs::write(outer.path().join(".gitignore"), "*.md\n").unwrap();
        let wt = outer.path().join("wt");
        std::fs::create_dir(&wt).unwrap();
        let ctx = ToolContext::new(&wt, "test").unwrap();
        put(&ctx, ".gitignore", b"*.log\ntarget/\n!keep.log\n");
        put(&ctx, "x.log", b"");
        put(&ctx, "keep.log", b"");
        put(&ctx, "README.md", b"");
        put(&ctx, "target/debug/out", b"");
        put(&ctx, "sub/y.log", b"");
        put(&ctx, "sub/z.txt", b"");
        put(&ctx, "sub/.ignore", b"z.txt\n");
        put(&ctx, "sub/inner/w.txt", b"");
        let out = text(&ctx, json!({"recursive": true})).await;
        assert!(!out.contains("x.log") && !out.contains("y.log"), "{out}");
        assert!(!out.contains("target") && !out.contains("z.txt"), "{out}");
        assert!(
            out.contains("keep.log") && out.contains("README.md"),
            "{out}"
        );
        // Listing the subdirectory still applies the root's .gitignore.
        let out = text(&ctx, json!({"path": "sub"})).await;
        assert_eq!(out, "Directory 'sub':\ninner/\n[1 directory, 0 files]");
        // Explicitly listing an ignored directory shows what is in it.
        let out = text(&ctx, json!({"path": "target/debug"})).await;
        assert!(out.contains("\nout  (0 B)"), "{out}");
    }

    #[tokio::test]
    async fn more_than_1000_entries_are_capped_with_a_count() {
        let (_d, ctx) = setup();
        for i in 0..1005 {
            put(&ctx, &format!("f{i:04}.txt"), b"");
        }
        let out = text(&ctx, json!({})).await;
        assert_eq!(out.lines().filter(|l| l.starts_with('f')).count(), 1000);
        assert!(out.contains("f0999.txt") && !out.contains("f1000.txt"));
        assert!(out.contains("[0 directories, 1005 files]"), "{out}");
        assert!(
            out.contains("[Showing the first 1000 entries; 5 more not shown. Narrow it"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn an_empty_directory_says_so() {
        let (_d, ctx) = setup();
        std::fs::create_dir(ctx.root().join("e")).unwrap();
        put(&ctx, "e/.only_hidden", b"");
        let out = text(&ctx, json!({"path": "e"})).await;
        assert!(out.starts_with("Directory 'e':\n(empty"), "{out}");
    }

    #[tokio::test]
    async fn files_missing_paths_and_escapes_are_errors() {
        let (_d, ctx) = setup();
        tree(&ctx);
        let err = list(&ctx, json!({"path": "a.txt"})).await.unwrap_err();
        assert!(err.to_string().contains("Use read_file"), "{err}");
        let err = list(&ctx, json!({"path": "scr"})).await.unwrap_err();
        assert_eq!(err.kind(), "not_found");
        assert!(err.to_string().contains("Did you mean 'src'?"), "{err}");

        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "s").unwrap();
        symlink(outside.path(), ctx.root().join("out")).unwrap();
        for path in ["..", "../x", "/etc", "out", "out/"] {
            let err = list(&ctx, json!({"path": path})).await.unwrap_err();
            assert_eq!(err.kind(), "sandbox_violation", "{path}");
        }
        // A link inside the listing is shown, never followed.
        let out = text(&ctx, json!({"recursive": true})).await;
        assert!(
            out.contains(&format!("\nout -> {}\n", outside.path().display())),
            "{out}"
        );
        assert!(!out.contains("secret.txt"));
        assert!(out.contains("1 symlink"), "{out}");
    }

    #[tokio::test]
    async fn the_schema_bounds_max_depth() {
        let (_d, ctx) = setup();
        let refused = [
            json!({"max_depth": 0}),
            json!({"max_depth": 21}),
            json!({"recursive": "yes"}),
            json!({"depth": 2}),
        ];
        let deepest = json!({"recursive": true, "max_depth": 20});
        let out = schema_bounds(&ctx, NAME, &refused, deepest).await;
        assert!(!out.is_error, "{}", out.content);
    }

    #[test]
    fn walk_errors_name_only_entries_beneath_the_root_escaped() {
        let (_d, ctx) = setup();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(outside.path().join("SECRET_DIR")).unwrap();
        symlink(outside.path(), ctx.root().join("l")).unwrap();
        std::fs::create_dir(ctx.root().join("a\nb")).unwrap();
        let error_at = |rel: &str| ignore::Error::WithDepth {
            depth: 1,
            err: Box::new(ignore::Error::WithPath {
                path: ctx.root().join(rel),
                err: Box::new(ignore::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    std::io::Error::from_raw_os_error(13),
                ))),
            }),
        };
        assert_eq!(
            walk_error(&error_at("a\nb"), ctx.files()).as_deref(),
            Some(r#"'"a\nb"': Permission denied (os error 13)"#)
        );
        assert_eq!(walk_error(&error_at("l/SECRET_DIR"), ctx.files()), None);
        assert_eq!(walk_error(&error_at("gone"), ctx.files()), None);
        let no_path = ignore::Error::Io(std::io::Error::from_raw_os_error(2));
        assert_eq!(
            walk_error(&no_path, ctx.files()).as_deref(),
            Some("No such file or directory (os error 2)")
        );
    }
}
