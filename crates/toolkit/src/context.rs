//! `ToolContext`: everything a tool call may know about the loop it runs for — the canonical
//! worktree root, the sandbox, read stamps, the loop's configured commands, the catalog
//! limits, the network destinations web tools may reach, and (inside a run) the port to the
//! coordinator.
//!
//! One context per loop (or per `tool exec` / MCP session). It is shared by reference between
//! concurrent read-only calls, so its mutable parts sit behind short-lived locks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::catalog::{Catalog, ToolSpec};
use crate::coordination::Coordination;
use crate::error::{ToolError, display_path};
use crate::read_index::ReadIndex;
use crate::sandbox::resolve_in;
use crate::stamp::Stamp;
use crate::web_access::WebAccess;
use crate::worktree_fs::WorktreeFs;
use crate::worktree_fs::replace::stamp_of_open;
use td_base::sync::lock;
use td_confine::SandboxSettings;

/// The commands a loop type configures for the `build`, `test` and `validate` tools.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopCommands {
    /// Shell command of the `build` tool.
    pub build: Option<String>,
    /// Shell command of the `test` tool.
    pub test: Option<String>,
    /// Shell command of the `validate` tool (and of the loop's validation step).
    pub validate: Option<String>,
}

/// How a stamp check for an edit came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StampCheck {
    /// The file is what the loop last saw.
    Current,
    /// The loop never read (or wrote) this file, or its stamp was dropped.
    NeverRead,
    /// The file changed since.
    Stale,
}

/// The per-loop execution context of every tool call.
pub struct ToolContext {
    root: PathBuf,
    exec_id: String,
    /// The root's handle: every file tool opens, lists and writes through it.
    files: Arc<WorktreeFs>,
    catalog: Arc<Catalog>,
    commands: LoopCommands,
    /// What `web_fetch` may reach besides the public internet (`web:` in the config).
    web_access: WebAccess,
    stamps: Mutex<HashMap<PathBuf, Stamp>>,
    /// Paths whose stamp an outside change dropped: an edit is refused as stale, not as
    /// "never read", so the model learns what happened.
    dropped: Mutex<std::collections::HashSet<PathBuf>>,
    /// Paths the loop is writing right now: a change event for them is the loop's own.
    writing: Mutex<std::collections::HashSet<PathBuf>>,
    changed_since_read: Mutex<Vec<PathBuf>>,
    completion: Mutex<Option<String>>,
    coordination: Option<Arc<dyn Coordination>>,
    commit_cache: Mutex<Option<Option<String>>>,
    /// Indexes of large files read in full (see `tools::read_file`), so that reading
    /// another window of an unchanged file reads only that window.
    read_indexes: Mutex<HashMap<PathBuf, Arc<ReadIndex>>>,
    /// Told about every path the context starts holding a stamp for (see `observe_stamps`).
    stamp_observer: Mutex<Option<StampObserver>>,
    /// How commands are confined (`sandbox:` of the config).
    sandbox_settings: Arc<SandboxSettings>,
    /// The loop's private temp dir for commands (`TMPDIR`), made at the first command and
    /// removed with the context.
    temp_dir: Mutex<Option<tempfile::TempDir>>,
}

/// Called with the path of each new stamp: one for a path the context held no stamp for.
pub type StampObserver = Arc<dyn Fn(&Path) + Send + Sync>;

impl std::fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("root", &self.root)
            .field("exec_id", &self.exec_id)
            .finish_non_exhaustive()
    }
}

impl ToolContext {
    /// A context for `worktree` (which must exist), sandbox on, default catalog.
    pub fn new(worktree: &Path, exec_id: impl Into<String>) -> Result<Self, ToolError> {
        let root = worktree.canonicalize().map_err(|e| {
            ToolError::failed(
                format!("opening worktree '{}'", worktree.display()),
                e,
                "Pass an existing directory as the worktree.",
            )
        })?;
        if !root.is_dir() {
            return Err(ToolError::Unavailable {
                message: format!("worktree '{}' is not a directory", worktree.display()),
            });
        }
        let files = WorktreeFs::new(&root).map_err(|e| {
            ToolError::failed(
                format!("opening worktree '{}'", worktree.display()),
                e,
                "Pass an existing directory as the worktree.",
            )
        })?;
        Ok(Self {
            root,
            exec_id: exec_id.into(),
            files: Arc::new(files),
            catalog: Arc::new(Catalog::default()),
            commands: LoopCommands::default(),
            web_access: WebAccess::default(),
            stamps: Mutex::new(HashMap::new()),
            dropped: Mutex::new(std::collections::HashSet::new()),
            writing: Mutex::new(std::collections::HashSet::new()),
            changed_since_read: Mutex::new(Vec::new()),
            completion: Mutex::new(None),
            coordination: None,
            commit_cache: Mutex::new(None),
            stamp_observer: Mutex::new(None),
            read_indexes: Mutex::new(HashMap::new()),
            sandbox_settings: Arc::new(SandboxSettings::default()),
            temp_dir: Mutex::new(None),
        })
    }

    /// Confines commands as `settings` say (paths already absolute); the file tools hide
    /// what commands cannot see (`sandbox.hide`) and refuse writes to protected paths.
    pub fn with_sandbox_settings(mut self, settings: Arc<SandboxSettings>) -> Self {
        let hidden: Vec<PathBuf> = settings
            .hide
            .iter()
            .chain(&settings.secret_files)
            .cloned()
            .collect();
        self.files.set_hidden(&hidden);
        self.sandbox_settings = settings;
        self
    }

    /// How commands are confined.
    pub fn sandbox_settings(&self) -> &SandboxSettings {
        &self.sandbox_settings
    }

    /// The loop's private temp dir for commands, made on first use (mode 0700, outside the
    /// worktree so that nothing in it is committed).
    pub fn command_temp_dir(&self) -> std::io::Result<PathBuf> {
        let mut slot = lock(&self.temp_dir);
        if let Some(dir) = slot.as_ref() {
            return Ok(dir.path().to_path_buf());
        }
        let name: String = self
            .exec_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
            .take(40)
            .collect();
        let dir = tempfile::Builder::new()
            .prefix(&format!("taskdaemon-{name}-"))
            .tempdir()?;
        let path = dir.path().canonicalize()?;
        *slot = Some(dir);
        Ok(path)
    }

    /// Uses `catalog` for per-tool limits.
    pub fn with_catalog(mut self, catalog: Arc<Catalog>) -> Self {
        self.catalog = catalog;
        self
    }

    /// Sets the commands of `build`, `test` and `validate`.
    pub fn with_commands(mut self, commands: LoopCommands) -> Self {
        self.commands = commands;
        self
    }

    /// Lets `web_fetch` reach what `access` allows besides the public internet (the
    /// default, [`WebAccess::PublicOnly`], refuses loopback, private and link-local
    /// addresses).
    pub fn with_web_access(mut self, access: WebAccess) -> Self {
        self.web_access = access;
        self
    }

    /// Connects the coordination tools to a coordinator.
    pub fn with_coordination(mut self, port: Arc<dyn Coordination>) -> Self {
        self.coordination = Some(port);
        self
    }

    /// Resolves `input` for a write: as [`ToolContext::resolve`], and refused where the loop
    /// must not write whatever the path looks like (it is judged after symlinks are
    /// resolved): git metadata (a `.git` component anywhere: a rewritten `.git` file or
    /// config would steer the git the daemon runs for the loop, unconfined) and the daemon's
    /// own directory at the root (`.taskdaemon`: run records, other loops' worktrees), and
    /// the daemon's records wherever they lie (`SandboxSettings::protected`).
    /// Commands are held to the same rule by read-only mounts (`td_confine`).
    pub fn resolve_for_write(&self, input: &str) -> Result<PathBuf, ToolError> {
        let real = self.resolve(input)?;
        // A protected directory that holds the loop's own root (its worktree under the run
        // directory) is the loop's to write in; anything else in it is not.
        if self
            .sandbox_settings
            .protected
            .iter()
            .any(|p| real.starts_with(p) && !self.root.starts_with(p))
        {
            return Err(ToolError::ProtectedPath {
                path: input.to_string(),
                reason: "it is part of the run's record (transcripts, receipts, events), which no loop may change; write your files elsewhere in the worktree.".to_string(),
            });
        }
        if let Ok(inside) = real.strip_prefix(&self.root) {
            let mut parts = inside.components().map(|c| c.as_os_str());
            let first = parts.clone().next();
            let git = parts.any(|c| c.to_str().is_some_and(|c| c.eq_ignore_ascii_case(".git")));
            let daemon = first.is_some_and(|c| c == ".taskdaemon");
            if git || daemon {
                return Err(ToolError::ProtectedPath {
                    path: input.to_string(),
                    reason: if git {
                        "git metadata is not the loop's to change; taskdaemon commits the loop's work on its branch when the loop ends, so write your files and leave git to it.".to_string()
                    } else {
                        ".taskdaemon holds the run's records and artifacts; write artifacts with create_plan, create_spec or create_phase.".to_string()
                    },
                });
            }
        }
        Ok(real)
    }

    /// The canonical worktree root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The loop's exec id (its name in the run).
    pub fn exec_id(&self) -> &str {
        &self.exec_id
    }

    /// File access beneath the worktree root (see `crate::worktree_fs`).
    pub fn files(&self) -> &Arc<WorktreeFs> {
        &self.files
    }

    /// The catalog in force.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Limits of `tool` from the catalog.
    pub fn spec(&self, tool: &str) -> ToolSpec {
        self.catalog.spec(tool)
    }

    /// The loop's configured commands.
    pub fn commands(&self) -> &LoopCommands {
        &self.commands
    }

    /// What `web_fetch` may reach besides the public internet.
    pub fn web_access(&self) -> &WebAccess {
        &self.web_access
    }

    /// Resolves a model-given path to the real path it designates, refusing escapes.
    ///
    /// The result is a name only: tools use it through [`ToolContext::files`], which opens
    /// it beneath the root and refuses a symlink swapped in since.
    pub fn resolve(&self, input: &str) -> Result<PathBuf, ToolError> {
        resolve_in(&self.root, input)
    }

    /// `path` relative to the worktree root when inside it, for messages and output.
    pub fn display(&self, path: &Path) -> String {
        display_path(&self.root, path)
    }

    /// Records that the loop saw (or wrote) exactly `content` at `path`.
    pub fn record_stamp(&self, path: &Path, content: &[u8]) {
        self.record_stamp_hash(path, Stamp::of(content));
    }

    /// Records a stamp computed elsewhere (e.g. hashed while streaming a file too large to
    /// hold in memory); the same as `record_stamp` with the bytes it was computed from.
    pub fn record_stamp_hash(&self, path: &Path, stamp: Stamp) {
        lock(&self.dropped).remove(path);
        let new = lock(&self.stamps)
            .insert(path.to_path_buf(), stamp)
            .is_none();
        if new {
            // Cloned out of the lock: the observer may take its time (it only enqueues now).
            let observer = lock(&self.stamp_observer).clone();
            if let Some(observer) = observer {
                observer(path);
            }
        }
    }

    /// Sets (or with `None` removes) the observer told the path of every new stamp: the file
    /// watcher watches the directories leading to the files a loop has read or written, and
    /// only those. A stamp replaced by another for the same path is not new; one recorded
    /// after the old one was dropped is.
    pub fn observe_stamps(&self, observer: Option<StampObserver>) {
        *lock(&self.stamp_observer) = observer;
    }

    /// Records the loop's own coming write of `content` at `path` before it happens and
    /// returns the stamp it replaced: the watcher may report the write before the tool
    /// returns, and the loop must then recognise those bytes as its own. Give the returned
    /// value to [`ToolContext::undo_write_stamp`] if the write fails.
    ///
    /// Until [`ToolContext::finish_own_write`] (or `undo_write_stamp`), change notices for the
    /// path are the loop's own and are ignored: a notice read while the bytes are half
    /// written must not look like somebody else's change.
    pub fn stamp_own_write(&self, path: &Path, content: &[u8]) -> Option<Stamp> {
        let previous = self.stamp(path);
        lock(&self.writing).insert(path.to_path_buf());
        self.record_stamp_hash(path, Stamp::of(content));
        previous
    }

    /// The loop's own write of `path` is complete.
    pub fn finish_own_write(&self, path: &Path) {
        lock(&self.writing).remove(path);
    }

    /// Puts back the stamp that [`ToolContext::stamp_own_write`] replaced (the write failed).
    pub fn undo_write_stamp(&self, path: &Path, previous: Option<Stamp>) {
        {
            let mut stamps = lock(&self.stamps);
            match previous {
                Some(stamp) => stamps.insert(path.to_path_buf(), stamp),
                None => stamps.remove(path),
            };
        }
        self.finish_own_write(path);
    }

    /// The stamp held for `path`, if any.
    pub fn stamp(&self, path: &Path) -> Option<Stamp> {
        lock(&self.stamps).get(path).cloned()
    }

    /// The index kept for `path` by an earlier full read, if the loop still holds the stamp
    /// that read recorded (an own write, a new read or an outside change replaces or drops
    /// the stamp, and so retires the index). `read_file` also checks the file's identity.
    pub fn read_index(&self, path: &Path) -> Option<Arc<ReadIndex>> {
        let index = lock(&self.read_indexes).get(path).cloned()?;
        let held = lock(&self.stamps).get(path) == Some(index.stamp());
        held.then_some(index)
    }

    /// Keeps the index of a large file just read in full. A loop reads few large files; past
    /// `MAX_READ_INDEXES` the kept ones are dropped and collecting starts over (an index is
    /// only a shortcut: without it a read makes a full pass).
    pub fn keep_read_index(&self, path: &Path, index: Arc<ReadIndex>) {
        const MAX_READ_INDEXES: usize = 16;
        let mut indexes = lock(&self.read_indexes);
        if indexes.len() >= MAX_READ_INDEXES && !indexes.contains_key(path) {
            indexes.clear();
        }
        indexes.insert(path.to_path_buf(), index);
    }

    /// Whether `path` currently holds what the loop last saw.
    pub fn check_stamp(&self, path: &Path, current_content: &[u8]) -> StampCheck {
        match self.stamp(path) {
            None if lock(&self.dropped).contains(path) => StampCheck::Stale,
            None => StampCheck::NeverRead,
            Some(s) if s == Stamp::of(current_content) => StampCheck::Current,
            Some(_) => StampCheck::Stale,
        }
    }

    /// What a stamp check of `path` says before the file is read: `Some(NeverRead)` or
    /// `Some(Stale)` when the loop holds no stamp for it (an edit is refused without reading
    /// a byte), `None` when the content must be compared.
    pub fn check_without_content(&self, path: &Path) -> Option<StampCheck> {
        if lock(&self.stamps).contains_key(path) {
            None
        } else if lock(&self.dropped).contains(path) {
            Some(StampCheck::Stale)
        } else {
            Some(StampCheck::NeverRead)
        }
    }

    /// Paths this loop holds a stamp for (what a file watcher needs to care about).
    pub fn stamped_paths(&self) -> Vec<PathBuf> {
        lock(&self.stamps).keys().cloned().collect()
    }

    /// Called when something outside the loop may have changed `path`: drops the stamp if
    /// the content on disk really differs (a touch that changes nothing is not a change) and
    /// remembers the path for the next model turn. Returns whether the stamp was dropped.
    pub fn note_outside_change(&self, path: &Path) -> bool {
        if lock(&self.writing).contains(path) {
            return false;
        }
        let Some(stamp) = self.stamp(path) else {
            return false;
        };
        // Opened beneath the root and non-blocking: a FIFO or symlink swapped in cannot
        // hang or mislead the check (either counts as a change).
        let now = self
            .files
            .open_named_file(path)
            .ok()
            .and_then(|f| stamp_of_open(&f.file).ok());
        if now == Some(stamp) {
            return false;
        }
        {
            let mut stamps = lock(&self.stamps);
            // A read or write of the new content may have replaced the stamp meanwhile.
            if stamps.get(path) != Some(&stamp) {
                return false;
            }
            stamps.remove(path);
        }
        lock(&self.dropped).insert(path.to_path_buf());
        let mut changed = lock(&self.changed_since_read);
        if !changed.iter().any(|p| p == path) {
            changed.push(path.to_path_buf());
        }
        true
    }

    /// Paths whose stamp was dropped since the last call (each reported once).
    pub fn take_changed_since_read(&self) -> Vec<PathBuf> {
        std::mem::take(&mut *lock(&self.changed_since_read))
    }

    /// Records a `complete_task` summary for the engine.
    pub fn mark_completed(&self, summary: &str) {
        *lock(&self.completion) = Some(summary.to_string());
    }

    /// Takes the pending `complete_task` summary, if the model called it.
    pub fn take_completion(&self) -> Option<String> {
        lock(&self.completion).take()
    }

    /// The coordinator port, or a clear error outside a run.
    pub fn coordination(&self) -> Result<&Arc<dyn Coordination>, ToolError> {
        self.coordination.as_ref().ok_or_else(|| ToolError::Unavailable {
            message: "coordination is not available: this tool only works for a loop inside a `taskdaemon run`, where other loops exist. Continue without it.".to_string(),
        })
    }

    /// Forgets the cached worktree commit (call after anything that may commit).
    pub fn invalidate_commit(&self) {
        *lock(&self.commit_cache) = None;
    }

    /// The worktree's HEAD commit, cached until `invalidate_commit`; `None` outside git.
    pub fn worktree_commit(&self) -> Option<String> {
        let mut cache = lock(&self.commit_cache);
        if let Some(c) = cache.as_ref() {
            return c.clone();
        }
        let out = std::process::Command::new("git")
            .args(td_git::daemon_git::NO_HOOKS)
            .args(["rev-parse", "--verify", "-q", "HEAD"])
            .current_dir(&self.root)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok();
        let commit = out
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty());
        *cache = Some(commit.clone());
        commit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outside_change_to_a_large_file_is_told_from_a_touch() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let p = ctx.root().join("big.log");
        // Several of stamp_of_file's chunks, and a last one that is not full.
        let content: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&p, &content).unwrap();
        let opened = ctx.files().open_file(&p).unwrap();
        assert_eq!(stamp_of_open(&opened.file).unwrap(), Stamp::of(&content));
        ctx.record_stamp(&p, &content);
        std::fs::write(&p, &content).unwrap();
        assert!(!ctx.note_outside_change(&p), "same bytes: no change");
        let mut changed = content.clone();
        changed[250_000] = b'!';
        std::fs::write(&p, &changed).unwrap();
        assert!(ctx.note_outside_change(&p));
        assert_eq!(ctx.check_stamp(&p, &changed), StampCheck::Stale);
        // Gone entirely is a change too.
        ctx.record_stamp(&p, &changed);
        std::fs::remove_file(&p).unwrap();
        assert!(ctx.note_outside_change(&p));
    }

    #[test]
    fn stamps_track_content_not_time() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let p = ctx.resolve("a.txt").unwrap();
        std::fs::write(&p, "one").unwrap();
        assert_eq!(ctx.check_stamp(&p, b"one"), StampCheck::NeverRead);
        ctx.record_stamp(&p, b"one");
        assert_eq!(ctx.check_stamp(&p, b"one"), StampCheck::Current);
        assert_eq!(ctx.check_stamp(&p, b"two"), StampCheck::Stale);
        // A touch that leaves the bytes alone is not a change.
        std::fs::write(&p, "one").unwrap();
        assert!(!ctx.note_outside_change(&p));
        std::fs::write(&p, "two").unwrap();
        assert!(ctx.note_outside_change(&p));
        // The stamp is gone, and an edit is told why: the file changed.
        assert_eq!(ctx.stamp(&p), None);
        assert_eq!(ctx.check_stamp(&p, b"two"), StampCheck::Stale);
        ctx.record_stamp(&p, b"two");
        assert_eq!(ctx.check_stamp(&p, b"two"), StampCheck::Current);
        assert_eq!(ctx.take_changed_since_read(), vec![p.clone()]);
        assert!(ctx.take_changed_since_read().is_empty());
    }

    #[test]
    fn the_loops_own_write_in_progress_is_not_an_outside_change() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let p = ctx.resolve("a.txt").unwrap();
        std::fs::write(&p, "old").unwrap();
        ctx.record_stamp(&p, b"old");
        let previous = ctx.stamp_own_write(&p, b"new content");
        // Half written: a notice now must not drop the stamp.
        std::fs::write(&p, "new").unwrap();
        assert!(!ctx.note_outside_change(&p));
        std::fs::write(&p, "new content").unwrap();
        ctx.finish_own_write(&p);
        assert!(!ctx.note_outside_change(&p));
        assert_eq!(ctx.check_stamp(&p, b"new content"), StampCheck::Current);
        // A failed write puts the old stamp back and ends the "own write" window.
        let prev2 = ctx.stamp_own_write(&p, b"never written");
        ctx.undo_write_stamp(&p, prev2);
        assert_eq!(ctx.check_stamp(&p, b"new content"), StampCheck::Current);
        std::fs::write(&p, "someone else").unwrap();
        assert!(ctx.note_outside_change(&p));
        let _ = previous;
    }

    #[test]
    fn missing_worktree_is_an_error() {
        let err = ToolContext::new(Path::new("/definitely/not/here"), "t").unwrap_err();
        assert!(err.to_string().contains("existing directory"));
    }

    #[test]
    fn coordination_outside_a_run_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let err = ctx.coordination().err().unwrap();
        assert!(err.to_string().contains("taskdaemon run"));
    }

    #[test]
    fn completion_is_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        ctx.mark_completed("done");
        assert_eq!(ctx.take_completion().as_deref(), Some("done"));
        assert_eq!(ctx.take_completion(), None);
    }
}
