//! The directory walk shared by `glob`, `grep`, `symbols` and `list_directory`:
//! gitignore-aware (also outside git repositories), never following symlinks, never entering
//! `.git`, parallel, and cancellable; plus the blocking-task wrapper those tools run their
//! walk in.
//!
//! Symlinks are not followed (`follow_links(false)`, the walker's default) and symlink
//! entries are never handed to a tool as files: a link inside the worktree may point outside
//! it, and the walk must not leak what lies there.
//!
//! The walker reads no file but directories: every ignore-file option of the `ignore` crate
//! is off, and the rules are applied in its `filter_entry` from ignore files read safely
//! through the worktree's handle ([`WalkIgnores`], which says what counts and in which
//! order). Ignore files above the worktree and the user's global git excludes are not read,
//! so the same call finds the same files on every machine (receipts are replayed elsewhere),
//! and a `*` in a home directory's `.gitignore` cannot hide a whole worktree.

use std::cmp::Ordering as Order;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::{FileType, Mode, OFlags};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use ignore::{DirEntry, ParallelVisitor, ParallelVisitorBuilder, WalkBuilder, WalkState};

pub use crate::search::walk_ignores::WalkIgnores;
use td_base::sync::lock;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::worktree_fs::{WorktreeFs, beneath, swapped};

/// A walker over `base` (inside the worktree of `ignores`) with the filters every walking
/// tool shares.
///
/// Hidden entries are skipped unless `include_hidden`; the worktree's `.gitignore` and
/// `.ignore` files apply as [`WalkIgnores`] reads them, even outside a git repository; `.git`
/// itself is never entered. `keep` may prune more entries (directories it rejects are not
/// descended into). Tools add `ignores.note()` to their answer after the walk.
pub fn builder<F>(
    ignores: &Arc<WalkIgnores>,
    base: &Path,
    include_hidden: bool,
    keep: F,
) -> WalkBuilder
where
    F: Fn(&DirEntry) -> bool + Send + Sync + 'static,
{
    let ignores = Arc::clone(ignores);
    let mut b = WalkBuilder::new(base);
    // The walker must open no ignore file by name (see the module docs): not `.ignore`,
    // `.gitignore`, `.git/info/exclude` (nor a `.git` file's target), the parents' or the
    // global ones. With these off and `require_git(false)` it does not even look at `.git`.
    b.hidden(!include_hidden)
        .parents(false)
        .ignore(false)
        .git_ignore(false)
        .git_global(false)
        .git_exclude(false)
        .require_git(false)
        .follow_links(false)
        .threads(0)
        .filter_entry(move |e| {
            if e.file_name() == OsStr::new(".git") {
                return false;
            }
            let is_dir = e.file_type().is_some_and(|t| t.is_dir());
            // The base itself was named by the model, so it is searched even if ignored (the
            // walker never filters it; its ancestors' rules still apply below it).
            (e.depth() == 0 || !ignores.excludes(e.path(), is_dir)) && keep(e)
        });
    b
}

/// The order the search tools print paths in: `Path`'s own order (component by component),
/// computed on the bytes. `Path::cmp` parses components on every comparison, which made
/// sorting 50,000 walked paths cost more than walking them.
///
/// For paths without empty, `.` or `..` components (what a walk yields: a canonical base joined
/// with entry names), comparing components is comparing the bytes with `/` ranked below
/// every other byte: at the first differing byte, either both are inside the same component,
/// or one path's component ends there and so sorts first, as a shorter path does.
pub fn path_order(a: &Path, b: &Path) -> Order {
    let (x, y) = (a.as_os_str().as_bytes(), b.as_os_str().as_bytes());
    let i = first_difference(x, y);
    match (x.get(i), y.get(i)) {
        (Some(&p), Some(&q)) => {
            let rank = |c: u8| if c == b'/' { 0 } else { u16::from(c) + 1 };
            rank(p).cmp(&rank(q))
        }
        _ => x.len().cmp(&y.len()),
    }
}

/// Index of the first byte where `x` and `y` differ, or the shorter length. Eight bytes at a
/// time: walked paths share long prefixes (the worktree root, then their directories).
fn first_difference(x: &[u8], y: &[u8]) -> usize {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let mut i = 0;
    for (cx, cy) in x.chunks_exact(8).zip(y.chunks_exact(8)) {
        let (Ok(wx), Ok(wy)) = (<[u8; 8]>::try_from(cx), <[u8; 8]>::try_from(cy)) else {
            break;
        };
        let diff = u64::from_le_bytes(wx) ^ u64::from_le_bytes(wy);
        if diff != 0 {
            // Little-endian: the lowest set bit lies in the first differing byte.
            return i + (diff.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + x[i..]
        .iter()
        .zip(&y[i..])
        .position(|(p, q)| p != q)
        .unwrap_or(n - i)
}

/// `path` relative to `base`, for a `path` that a walk from `base` yielded (so it is `base`
/// itself or `base` joined with entry names); `None` otherwise. The same as
/// `Path::strip_prefix` for such paths, on bytes instead of parsed components, as it runs
/// for every walked entry.
pub fn relative<'p>(path: &'p Path, base: &Path) -> Option<&'p Path> {
    let (p, b) = (path.as_os_str().as_bytes(), base.as_os_str().as_bytes());
    let rest = p.strip_prefix(b)?;
    let rest = match rest {
        _ if b.ends_with(b"/") => rest,
        [] => rest,
        [b'/', tail @ ..] => tail,
        _ => return None,
    };
    Some(Path::new(OsStr::from_bytes(rest)))
}

/// Whether `entry` is a regular file (never a symlink, whatever it points at).
pub fn is_file(entry: &DirEntry) -> bool {
    entry.file_type().is_some_and(|t| t.is_file())
}

/// Walks in parallel and returns everything the per-thread visitors pushed, in no order
/// (callers sort). `make_visitor` is called once per walker thread, so per-thread state
/// (a searcher, buffers) lives in the closure it returns. Unreadable entries are skipped;
/// the walk stops early once `cancel` is set.
pub fn collect<T, V, M>(walk: &WalkBuilder, cancel: &AtomicBool, make_visitor: M) -> Vec<T>
where
    T: Send,
    V: FnMut(DirEntry, &mut Vec<T>) -> WalkState + Send,
    M: Fn() -> V,
{
    let out = Mutex::new(Vec::new());
    let mut builder = Collector {
        make_visitor,
        out: &out,
        cancel,
    };
    walk.build_parallel().visit(&mut builder);
    out.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// Builds one visitor per walker thread; each hands its results over when the thread ends.
struct Collector<'s, T, M> {
    make_visitor: M,
    out: &'s Mutex<Vec<T>>,
    cancel: &'s AtomicBool,
}

struct ThreadVisitor<'s, T: Send, V> {
    visit: V,
    local: Vec<T>,
    out: &'s Mutex<Vec<T>>,
    cancel: &'s AtomicBool,
}

impl<'s, T, V, M> ParallelVisitorBuilder<'s> for Collector<'s, T, M>
where
    T: Send + 's,
    V: FnMut(DirEntry, &mut Vec<T>) -> WalkState + Send + 's,
    M: Fn() -> V,
{
    fn build(&mut self) -> Box<dyn ParallelVisitor + 's> {
        Box::new(ThreadVisitor {
            visit: (self.make_visitor)(),
            local: Vec::new(),
            out: self.out,
            cancel: self.cancel,
        })
    }
}

impl<T: Send, V> ParallelVisitor for ThreadVisitor<'_, T, V>
where
    V: FnMut(DirEntry, &mut Vec<T>) -> WalkState + Send,
{
    fn visit(&mut self, entry: Result<DirEntry, ignore::Error>) -> WalkState {
        if self.cancel.load(Ordering::Relaxed) {
            return WalkState::Quit;
        }
        match entry {
            Ok(entry) => (self.visit)(entry, &mut self.local),
            // Unreadable directories and vanished files are skipped, as `rg` does.
            Err(_) => WalkState::Continue,
        }
    }
}

impl<T: Send, V> Drop for ThreadVisitor<'_, T, V> {
    fn drop(&mut self) {
        let mut out = lock(self.out);
        out.append(&mut self.local);
    }
}

/// Sets its flag when dropped: the registry drops a timed-out call's future, and the
/// blocking walk behind it must then stop instead of running on unobserved.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs the CPU- and disk-bound `work` on the blocking pool so it does not stall the async
/// workers, passing it a flag that turns true if the call is abandoned (timeout).
pub async fn run_blocking<T, F>(tool: &str, work: F) -> ToolResult<T>
where
    T: Send + 'static,
    F: FnOnce(&AtomicBool) -> ToolResult<T> + Send + 'static,
{
    let flag = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(flag.clone());
    let joined = tokio::task::spawn_blocking(move || work(&flag)).await;
    drop(guard);
    match joined {
        Ok(result) => result,
        Err(e) => Err(ToolError::failed(
            format!("tool {tool}"),
            if e.is_panic() {
                "it panicked".to_string()
            } else {
                e.to_string()
            },
            "This is a bug in the tool; try other arguments or a different approach.",
        )),
    }
}

/// A single glob as a matcher, `*` not crossing `/` (as in a shell and in .gitignore). A
/// pattern that does not compile is an invalid argument at `pointer`.
pub fn glob_set(tool: &str, pointer: &str, pattern: &str) -> ToolResult<GlobSet> {
    let invalid = |e: globset::Error| ToolError::invalid(tool, pointer, e.to_string());
    let glob = GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(invalid)?;
    GlobSetBuilder::new().add(glob).build().map_err(invalid)
}

/// The part of a "nothing found" message that says what a walk skips, so the model knows
/// when to widen the search: `Files ignored by .gitignore/.ignore{also} are skipped`, plus
/// the hidden-files flag when it was off.
pub fn skipped_note(also: &str, include_hidden: bool) -> String {
    let mut note = format!("Files ignored by .gitignore/.ignore{also} are skipped");
    if !include_hidden {
        note.push_str(", and so are hidden files (pass include_hidden: true)");
    }
    note
}

/// A search base given by the model: the real path (inside the worktree) and what it is.
pub struct Target {
    /// Canonical path inside the worktree.
    pub path: PathBuf,
    /// Worktree-relative form for messages.
    pub shown: String,
    /// Whether it is a directory (else a file).
    pub is_dir: bool,
}

/// Resolves `input` through the sandbox and checks that it exists and is not inside `.git`.
pub fn target(ctx: &ToolContext, tool: &str, input: &str) -> ToolResult<Target> {
    let path = ctx.resolve(input)?;
    let shown = ctx.display(&path);
    // Looked at beneath the root's handle: what a symlink swapped in since resolution points
    // at is not told, not even whether it is a directory.
    let kind = kind_beneath(ctx.files(), &path).map_err(|e| {
        if beneath::is_escape(&e) {
            swapped(&shown)
        } else {
            ToolError::from_io("searching", &shown, &e)
        }
    })?;
    let inside_git = path
        .strip_prefix(ctx.root())
        .is_ok_and(|rel| rel.components().any(|c| c.as_os_str() == ".git"));
    if inside_git {
        return Err(ToolError::invalid(
            tool,
            "/path",
            format!(
                "'{shown}' is inside .git, which {tool} never searches; use run_command with git to inspect repository internals"
            ),
        ));
    }
    Ok(Target {
        path,
        shown,
        is_dir: kind == FileType::Directory,
    })
}

/// The kind of the entry at `real` (inside the worktree), reached beneath the root without
/// following a symlink on the way or at the end.
pub fn kind_beneath(files: &WorktreeFs, real: &Path) -> std::io::Result<FileType> {
    let rel = files
        .relative(real)
        .map_err(|_| std::io::Error::from(rustix::io::Errno::XDEV))?;
    let fd = beneath::open(files.root_fd(), rel, OFlags::PATH, Mode::empty())?;
    let stat = rustix::fs::fstat(&fd)?;
    Ok(FileType::from_raw_mode(stat.st_mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn ignores(dir: &Path) -> Arc<WalkIgnores> {
        WalkIgnores::new(Arc::new(WorktreeFs::new(dir).unwrap()))
    }

    fn names(dir: &Path, include_hidden: bool) -> Vec<String> {
        let b = builder(&ignores(dir), dir, include_hidden, |_| true);
        let cancel = AtomicBool::new(false);
        let root = dir.to_path_buf();
        let mut v: Vec<String> = collect(&b, &cancel, || {
            let root = root.clone();
            move |e: DirEntry, out: &mut Vec<String>| {
                if is_file(&e) {
                    out.push(e.path().strip_prefix(&root).unwrap().display().to_string());
                }
                WalkState::Continue
            }
        });
        v.sort();
        v
    }

    #[test]
    fn honours_ignore_files_outside_git_and_skips_dot_git() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fs::create_dir_all(p.join(".git")).unwrap();
        fs::create_dir_all(p.join("sub")).unwrap();
        fs::write(p.join(".git/config"), "x").unwrap();
        fs::write(p.join(".gitignore"), "ignored.txt\n").unwrap();
        fs::write(p.join(".ignore"), "also.txt\n").unwrap();
        fs::write(p.join("ignored.txt"), "x").unwrap();
        fs::write(p.join("also.txt"), "x").unwrap();
        fs::write(p.join("sub/kept.txt"), "x").unwrap();
        fs::write(p.join(".hidden"), "x").unwrap();
        assert_eq!(names(p, false), vec!["sub/kept.txt"]);
        assert_eq!(
            names(p, true),
            vec![".gitignore", ".hidden", ".ignore", "sub/kept.txt"]
        );
    }

    #[tokio::test]
    async fn ignore_files_count_from_the_worktree_root_down_and_nowhere_above() {
        use crate::search::{glob::Glob, grep::Grep, symbols::Symbols};
        use crate::test_support::{run, tree, write};
        use serde_json::json;
        let (d, wt) = tree(&[
            (".gitignore", "gen.rs\n"),
            ("src/.ignore", "old/\n"),
            ("src/lib.rs", "fn kept() {}\n"),
            ("src/gen.rs", "fn generated() {}\n"),
            ("src/deep/old/x.rs", "fn stale() {}\n"),
        ]);
        // Above the worktree: a home directory that ignores everything must not matter.
        write(d.path(), ".gitignore", "*\n");
        write(d.path(), ".ignore", "*.rs\n");
        for path in [".", "src", "src/deep"] {
            let found = run(&Glob, &wt, json!({"pattern": "**/*.rs", "path": path}))
                .await
                .unwrap();
            let hits = run(&Grep, &wt, json!({"pattern": "fn ", "path": path}))
                .await
                .unwrap();
            let outline = run(&Symbols, &wt, json!({"path": path})).await.unwrap();
            for out in [&found, &hits, &outline] {
                // The root's .gitignore and src/.ignore apply below them, whatever the base.
                assert!(
                    !out.contains("gen.rs") && !out.contains("old/"),
                    "{path}: {out}"
                );
            }
            if path != "src/deep" {
                assert!(found.contains("src/lib.rs"), "{path}: {found}");
                assert!(hits.contains("src/lib.rs:1:fn kept() {}"), "{path}: {hits}");
                assert!(
                    outline.contains("src/lib.rs:1: function kept"),
                    "{path}: {outline}"
                );
            }
        }
        // A directory named as the base is searched even when ignored, as with rg.
        let hits = run(
            &Grep,
            &wt,
            json!({"pattern": "fn ", "path": "src/deep/old"}),
        )
        .await
        .unwrap();
        assert_eq!(hits, "src/deep/old/x.rs:1:fn stale() {}\n");
    }

    #[tokio::test]
    async fn abandoned_call_cancels_its_blocking_work() {
        let saw_cancel = Arc::new(AtomicBool::new(false));
        let saw = saw_cancel.clone();
        let work = run_blocking("t", move |cancel| {
            let start = std::time::Instant::now();
            while !cancel.load(Ordering::Relaxed) {
                if start.elapsed() > std::time::Duration::from_secs(10) {
                    return Ok(());
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            saw.store(true, Ordering::Relaxed);
            Ok(())
        });
        let timed_out = tokio::time::timeout(std::time::Duration::from_millis(50), work).await;
        assert!(timed_out.is_err());
        for _ in 0..400 {
            if saw_cancel.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("the blocking work never saw the cancel flag");
    }

    #[tokio::test]
    async fn panicking_work_becomes_a_failed_error() {
        let err = run_blocking::<(), _>("t", |_| panic!("boom"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "failed");
        assert!(err.to_string().contains("panicked"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn path_order_is_the_order_of_path(
            a in proptest::collection::vec("[a.A0/_~\\-é]{1,4}", 1..5),
            b in proptest::collection::vec("[a.A0/_~\\-é]{1,4}", 1..5),
        ) {
            // Components as a walk yields them: no empty, `.` or `..` ones.
            let clean = |parts: &[String]| -> PathBuf {
                let mut p = PathBuf::from("/base");
                for part in parts {
                    for c in part.split('/').filter(|c| !["", ".", ".."].contains(c)) {
                        p.push(c);
                    }
                }
                p
            };
            let (a, b) = (clean(&a), clean(&b));
            proptest::prop_assert_eq!(path_order(&a, &b), a.cmp(&b), "{:?} {:?}", a, b);
        }
    }

    #[test]
    fn relative_strips_the_base_like_strip_prefix() {
        for (path, base) in [
            ("/w/src/a.rs", "/w"),
            ("/w", "/w"),
            ("/w/src/a.rs", "/w/src"),
            ("/a.rs", "/"),
            ("/wx/a.rs", "/w"),
            ("/v/a.rs", "/w"),
        ] {
            let (path, base) = (Path::new(path), Path::new(base));
            assert_eq!(
                relative(path, base),
                path.strip_prefix(base).ok(),
                "{path:?}"
            );
        }
    }

    #[test]
    fn first_difference_finds_the_first_differing_byte_at_any_offset() {
        let x: Vec<u8> = (0..40).collect();
        for at in 0..40 {
            let mut y = x.clone();
            y[at] = 200;
            assert_eq!(first_difference(&x, &y), at);
            assert_eq!(first_difference(&x[..at], &y), at);
        }
        assert_eq!(first_difference(&x, &x), 40);
    }

    #[test]
    fn path_order_ranks_a_directory_before_its_longer_siblings() {
        let mut v = vec![
            PathBuf::from("/r/a.b"),
            PathBuf::from("/r/a/z"),
            PathBuf::from("/r/a"),
            PathBuf::from("/r/a-b/c"),
            PathBuf::from("/r/B"),
        ];
        v.sort_by(|a, b| path_order(a, b));
        let mut expected = v.clone();
        expected.sort();
        assert_eq!(v, expected);
        assert_eq!(v[0], PathBuf::from("/r/B"));
        assert_eq!(&v[1..3], &[PathBuf::from("/r/a"), PathBuf::from("/r/a/z")]);
    }

    #[test]
    fn cancelled_walk_yields_nothing() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("a"), "x").unwrap();
        let cancel = AtomicBool::new(true);
        let v: Vec<()> = collect(
            &builder(&ignores(d.path()), d.path(), false, |_| true),
            &cancel,
            || {
                |_e: DirEntry, out: &mut Vec<()>| {
                    out.push(());
                    WalkState::Continue
                }
            },
        );
        assert!(v.is_empty());
    }
}
