//! The `.gitignore`/`.ignore` rules of one directory walk, read safely: the one place where
//! the walking tools (`glob`, `grep`, `symbols`, `list_directory`) read ignore files.
//!
//! The `ignore` crate's walker would read them itself, by name: following symlinks (a
//! `.gitignore` linked to a file outside or hidden from loops becomes a guess oracle: which
//! names it hides tells what the file says), with a blocking open (a FIFO hangs the walk and
//! leaves its thread blocked forever), with no size limit (a link to `/dev/zero` or a 64 GiB
//! sparse file takes gigabytes), and following a `.git` file's `gitdir:` to wherever it
//! points. So every ignore-file option of the walker is off (`walk::builder`) and the rules
//! are applied here in its `filter_entry`, from files opened through the worktree's handle
//! (`WorktreeFs::open_file`: beneath the root, no symlink, regular files only, non-blocking,
//! hidden files and hard links to outside refused) and read up to [`MAX_IGNORE_FILE_BYTES`].
//! A file refused or too large is skipped, and the tool's answer says so once, naming it.
//!
//! What counts, the same for every tool and on every machine (receipts are replayed
//! elsewhere): `.ignore` and `.gitignore` in every directory from the worktree root down,
//! inside git repositories or not, and `.git/info/exclude` when the root's `.git` is a
//! directory. Nothing above the root, no global excludes, and never a `.git` file's target.
//!
//! Precedence: for an entry, the directories from its own up to the root are asked in turn,
//! deepest first, and the first rule that matches decides (ignore, or re-include with `!`);
//! within one directory `.ignore` is asked before `.gitignore` (as ripgrep ranks them), and
//! the root's `.git/info/exclude` last of all. A directory that is ignored is not entered,
//! so, as in git, a file inside it cannot be re-included.
//!
//! Each directory's rules are read once per tool call and shared by the walker's threads.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use td_base::sync::lock;
use td_toolkit::error::display_path;
use td_toolkit::worktree_fs::{OpenError, WorktreeFs};

/// The largest ignore file read; a larger one is skipped (and named in the answer). Real
/// ones are a few KB; the cap bounds what a planted one can cost.
pub const MAX_IGNORE_FILE_BYTES: u64 = 1024 * 1024;

/// Ignore files named in a note at most; the rest are counted.
const MAX_NAMED: usize = 10;

/// The ignore rules of one tool call's walk(s) under one worktree.
pub struct WalkIgnores {
    /// Tells this call's rules from another's in a thread's [`LAST_LEVEL`].
    id: u64,
    files: Arc<WorktreeFs>,
    /// Each directory's rules, by its path, as read on first need.
    levels: RwLock<HashMap<PathBuf, Arc<Level>>>,
    /// Ignore files that were there but not applied: (shown path, why).
    skipped: Mutex<Vec<(String, String)>>,
}

impl std::fmt::Debug for WalkIgnores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalkIgnores")
            .field("root", &self.files.root())
            .finish_non_exhaustive()
    }
}

/// One directory's rules with the chain of its ancestors' above it.
struct Level {
    /// Matchers of this directory that hold rules, in the order they are asked.
    rules: Vec<Gitignore>,
    /// The nearest ancestor level that holds rules (levels without any are left out).
    up: Option<Arc<Level>>,
}

impl Level {
    const EMPTY: Level = Level {
        rules: Vec::new(),
        up: None,
    };
}

/// Source of [`WalkIgnores`] ids.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The level a thread used last, for which call's rules and which directory.
struct LastLevel {
    walk: u64,
    dir: PathBuf,
    level: Arc<Level>,
}

thread_local! {
    static LAST_LEVEL: std::cell::RefCell<Option<LastLevel>> =
        const { std::cell::RefCell::new(None) };
}

/// The ignore files of each directory, in the order they are asked.
const NAMES: [&str; 2] = [".ignore", ".gitignore"];

/// The root's exclude file, read when the root's `.git` is a directory (opened beneath the
/// root, so a `.git` file or symlink is never followed).
const EXCLUDE: &str = ".git/info/exclude";

impl WalkIgnores {
    /// The rules of walks beneath `files`' root, read on first need.
    pub fn new(files: Arc<WorktreeFs>) -> Arc<Self> {
        Arc::new(Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            files,
            levels: RwLock::new(HashMap::new()),
            skipped: Mutex::new(Vec::new()),
        })
    }

    /// The worktree's handle the rules are read through.
    pub fn files(&self) -> &Arc<WorktreeFs> {
        &self.files
    }

    /// Whether the rules exclude `path` (a directory when `is_dir`), a path a walk yielded
    /// beneath the root: its directory's rules and its ancestors', deepest first.
    pub fn excludes(&self, path: &Path, is_dir: bool) -> bool {
        let Some(dir) = path.parent() else {
            return false;
        };
        // A walker thread filters a directory's entries one after another: the level of the
        // last directory, kept by the thread, serves them without touching the shared map
        // (its lock and the level's count would bounce between the threads on every entry).
        LAST_LEVEL.with_borrow_mut(|last| match last {
            Some(memo) if memo.walk == self.id && memo.dir.as_os_str() == dir.as_os_str() => {
                matched(&memo.level, path, is_dir)
            }
            _ => {
                let memo = last.insert(LastLevel {
                    walk: self.id,
                    dir: dir.to_path_buf(),
                    level: self.level(dir),
                });
                matched(&memo.level, path, is_dir)
            }
        })
    }

    /// A note for the tool's answer naming the ignore files that were not applied, once
    /// each, escaped; `None` when every ignore file met was read.
    pub fn note(&self) -> Option<String> {
        let mut skipped = lock(&self.skipped).clone();
        if skipped.is_empty() {
            return None;
        }
        skipped.sort();
        skipped.dedup_by(|a, b| a.0 == b.0);
        let named: Vec<String> = skipped
            .iter()
            .take(MAX_NAMED)
            .map(|(shown, why)| format!("'{shown}' ({why})"))
            .collect();
        let more = skipped.len().saturating_sub(MAX_NAMED);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        Some(format!(
            "[Ignore files skipped, their rules not applied: {}{more}. Only regular files inside the worktree of at most {} MiB are read as ignore files.]",
            named.join(", "),
            MAX_IGNORE_FILE_BYTES / (1024 * 1024)
        ))
    }

    /// The rules of `dir` and its ancestors, read the first time a walk needs them.
    fn level(&self, dir: &Path) -> Arc<Level> {
        if let Some(level) = self
            .levels
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(dir)
        {
            return Arc::clone(level);
        }
        let Ok(rel) = self.files.relative(dir) else {
            // Not beneath the root: no rules (nothing above the root counts).
            return Arc::new(Level::EMPTY);
        };
        let at_root = rel.as_os_str().is_empty();
        let up = match dir.parent() {
            Some(parent) if !at_root => {
                let parent = self.level(parent);
                if parent.rules.is_empty() {
                    parent.up.clone()
                } else {
                    Some(parent)
                }
            }
            _ => None,
        };
        let mut skipped = Vec::new();
        let mut rules = Vec::new();
        let mut files: Vec<(PathBuf, &Path)> =
            NAMES.iter().map(|name| (dir.join(name), dir)).collect();
        if at_root {
            files.push((dir.join(EXCLUDE), dir));
        }
        for (file, rules_root) in files {
            match self.read(&file, rules_root) {
                Ok(Some(gi)) if !gi.is_empty() => rules.push(gi),
                Ok(_) => {}
                // A directory swapped for a symlink mid-walk: its files were not read, and
                // names met through it are not shown (they may lie outside).
                Err(_) if !self.is_directory_beneath(dir) => {}
                Err(why) => skipped.push((display_path(self.files.root(), &file), why.to_string())),
            }
        }
        let level = Arc::new(Level { rules, up });
        let mut levels = self
            .levels
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Another thread may have read the same directory meanwhile: keep one, note once.
        Arc::clone(levels.entry(dir.to_path_buf()).or_insert_with(|| {
            lock(&self.skipped).append(&mut skipped);
            level
        }))
    }

    /// Whether `dir` is, now, a directory beneath the root reached without a symlink.
    fn is_directory_beneath(&self, dir: &Path) -> bool {
        self.files
            .inspect(dir)
            .is_some_and(|i| i.kind == rustix::fs::FileType::Directory)
    }

    /// The rules in the ignore file at `file`, whose patterns are relative to `rules_root`:
    /// `Ok(None)` when there is no such file, `Err(why)` when it is there but not read.
    fn read(&self, file: &Path, rules_root: &Path) -> Result<Option<Gitignore>, Skipped> {
        let opened = match self.files.open_file(file) {
            Ok(opened) => opened,
            Err(OpenError::Io(e))
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(Skipped::from(e)),
        };
        if opened.len > MAX_IGNORE_FILE_BYTES {
            return Err(Skipped::TooLarge);
        }
        let mut text = Vec::new();
        // Bounded even if the file grows after the size was seen.
        (&opened.file)
            .take(MAX_IGNORE_FILE_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(Skipped::Unreadable)?;
        if text.len() as u64 > MAX_IGNORE_FILE_BYTES {
            return Err(Skipped::TooLarge);
        }
        parse(file, rules_root, &text).map(Some)
    }
}

/// Whether `level`'s rules or its ancestors' exclude `path` (the deepest that matches decides).
fn matched(level: &Arc<Level>, path: &Path, is_dir: bool) -> bool {
    let mut at = Some(level);
    while let Some(l) = at {
        for gi in &l.rules {
            match gi.matched(path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        at = l.up.as_ref();
    }
    false
}

/// Why an ignore file that is there was not applied; the message completes "skipped:".
#[derive(Debug, thiserror::Error)]
enum Skipped {
    #[error("it could not be opened: {0}")]
    Unopenable(std::io::Error),
    #[error("a symlink, which is never followed")]
    Symlink,
    #[error("a directory")]
    Directory,
    #[error("not a regular file: a FIFO, socket or device")]
    NotRegular,
    #[error("hidden from loops")]
    Hidden,
    #[error("a hard link to a file outside the worktree")]
    LinkedOutside,
    #[error("its hard links were changing")]
    LinksChanging,
    #[error("larger than {MAX_IGNORE_FILE_BYTES} bytes")]
    TooLarge,
    #[error("it could not be read: {0}")]
    Unreadable(std::io::Error),
    #[error("its patterns could not be compiled: {0}")]
    Patterns(ignore::Error),
}

impl From<OpenError> for Skipped {
    fn from(err: OpenError) -> Self {
        match err {
            OpenError::Io(e) => Skipped::Unopenable(e),
            OpenError::Swapped => Skipped::Symlink,
            OpenError::Directory => Skipped::Directory,
            OpenError::NotRegular => Skipped::NotRegular,
            OpenError::Hidden => Skipped::Hidden,
            OpenError::LinkedOutside { .. } => Skipped::LinkedOutside,
            OpenError::LinksChanging => Skipped::LinksChanging,
        }
    }
}

/// The rules of an ignore file's `text`, as the `ignore` crate reads a gitignore file: one
/// pattern a line (`\n` or `\r\n`), a leading byte-order mark dropped. A line that is not
/// UTF-8 or not a valid glob is left out; the others still count.
fn parse(file: &Path, rules_root: &Path, text: &[u8]) -> Result<Gitignore, Skipped> {
    let mut builder = GitignoreBuilder::new(rules_root);
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let line = if i == 0 {
            line.trim_start_matches('\u{feff}')
        } else {
            line
        };
        let _ = builder.add_line(Some(file.to_path_buf()), line);
    }
    builder.build().map_err(Skipped::Patterns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn setup(files: &[(&str, &str)]) -> (tempfile::TempDir, Arc<WalkIgnores>) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        for (rel, content) in files {
            let path = root.join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        }
        let files = Arc::new(WorktreeFs::new(&root).unwrap());
        (d, WalkIgnores::new(files))
    }

    fn excluded(ig: &WalkIgnores, rel: &str) -> bool {
        let is_dir = rel.ends_with('/');
        let path = ig.files().root().join(rel.trim_end_matches('/'));
        ig.excludes(&path, is_dir)
    }

    #[test]
    fn deeper_directories_decide_and_ignore_ranks_above_gitignore() {
        let (_d, ig) = setup(&[
            (".gitignore", "*.log\nbuild/\n!keep.log\n"),
            (".ignore", "*.tmp\n"),
            ("a/.gitignore", "!*.log\n*.rs\n"),
            ("a/.ignore", "!main.rs\n"),
            ("a/b/.gitignore", "*.tmp2\n"),
        ]);
        assert!(excluded(&ig, "x.log"));
        assert!(!excluded(&ig, "keep.log"));
        assert!(excluded(&ig, "build/"));
        assert!(!excluded(&ig, "build"), "a directory-only rule");
        assert!(excluded(&ig, "x.tmp") && excluded(&ig, "a/b/x.tmp"));
        // a/.gitignore re-includes what the root's excludes, below a/ only.
        assert!(!excluded(&ig, "a/x.log") && !excluded(&ig, "a/b/x.log"));
        assert!(excluded(&ig, "a/lib.rs") && excluded(&ig, "a/b/lib.rs"));
        // .ignore before .gitignore in the same directory.
        assert!(!excluded(&ig, "a/main.rs"));
        assert!(excluded(&ig, "a/b/x.tmp2") && !excluded(&ig, "x.tmp2"));
        assert!(!excluded(&ig, "src/main.c"));
        assert!(ig.note().is_none());
    }

    #[test]
    fn the_root_git_directory_excludes_and_rank_below_gitignore() {
        let (_d, ig) = setup(&[
            (".git/info/exclude", "*.local\n*.keep\n"),
            (".gitignore", "!*.keep\n"),
            ("sub/.git", "gitdir: /nonexistent\n"),
            ("sub/.gitignore", ""),
        ]);
        assert!(excluded(&ig, "a.local") && excluded(&ig, "sub/deep/a.local"));
        assert!(!excluded(&ig, "a.keep"));
        assert!(ig.note().is_none());
    }

    #[test]
    fn crlf_bom_comments_and_bad_lines_read_as_the_crate_reads_them() {
        let mut text = b"\xEF\xBB\xBFfirst.txt\r\n# comment.txt\r\n".to_vec();
        text.extend_from_slice(b"bad\xFF.txt\n[z-a]\nlast.txt");
        let (_d, ig) = setup(&[]);
        fs::write(ig.files().root().join(".gitignore"), &text).unwrap();
        assert!(excluded(&ig, "first.txt") && excluded(&ig, "last.txt"));
        assert!(!excluded(&ig, "# comment.txt"));
    }

    #[test]
    fn unreadable_ignore_files_are_skipped_and_named_once_escaped() {
        let (d, ig) = setup(&[("ok/.gitignore", "*.o\n"), ("big/x", "")]);
        let root = ig.files().root().to_path_buf();
        let outside = d.path().join("outside-rules");
        fs::write(&outside, "*\n").unwrap();
        fs::create_dir_all(root.join("l")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("l/.gitignore")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("l/.ignore"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let big = fs::File::create(root.join("big/.ignore")).unwrap();
        big.set_len(MAX_IGNORE_FILE_BYTES + 1).unwrap();
        fs::create_dir_all(root.join("n\nl/.gitignore")).unwrap();
        for _ in 0..2 {
            assert!(!excluded(&ig, "l/a.txt") && !excluded(&ig, "big/x"));
            assert!(!excluded(&ig, "n\nl/a") && excluded(&ig, "ok/a.o"));
        }
        let note = ig.note().unwrap();
        assert_eq!(
            note.matches("'l/.gitignore' (a symlink").count(),
            1,
            "{note}"
        );
        assert!(note.contains("'l/.ignore' (not a regular file"), "{note}");
        assert!(
            note.contains("'big/.ignore' (larger than 1048576 bytes)"),
            "{note}"
        );
        assert!(
            note.contains(r#"'"n\nl"/.gitignore' (a directory)"#),
            "{note}"
        );
        assert!(!note.contains("ok/"), "{note}");
    }

    #[test]
    fn nothing_above_the_root_counts() {
        let (d, _) = setup(&[]);
        fs::write(d.path().join(".gitignore"), "*\n").unwrap();
        let wt = d.path().canonicalize().unwrap().join("wt");
        fs::create_dir_all(&wt).unwrap();
        let ig = WalkIgnores::new(Arc::new(WorktreeFs::new(&wt).unwrap()));
        assert!(!excluded(&ig, "a.rs"));
        assert!(!ig.excludes(&d.path().join("b.rs"), false));
    }
}
