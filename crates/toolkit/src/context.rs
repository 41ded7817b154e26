//! `ToolContext`: everything a tool call may know about the loop it runs for — the canonical
//! worktree root, the sandbox, the loop's read tracking (`crate::read_tracking`), the loop's
//! configured commands, the catalog limits, the network destinations web tools may reach,
//! and (inside a run) the port to the coordinator.
//!
//! One context per loop (or per `tool exec` / MCP session). It is shared by reference between
//! concurrent read-only calls, so its mutable parts sit behind short-lived locks.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::catalog::{Catalog, ToolSpec};
use crate::coordination::Coordination;
use crate::error::{ToolError, display_path};
use crate::read_index::ReadIndex;
use crate::read_tracking::ReadTracking;
pub use crate::read_tracking::{StampCheck, StampObserver};
use crate::sandbox::resolve_in;
use crate::stamp::Stamp;
use crate::web_access::WebAccess;
use crate::worktree_fs::WorktreeFs;
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

/// How a loop's `build`, `test` and `validate` commands reach its compiler cache server
/// (`compiler-cache:`; the server is started by the run, see `td_confine::service`): they
/// join the server's private network namespace, which reaches nothing else, and get the
/// variables that make the build use it.
#[derive(Debug, Clone)]
pub struct CompilerCacheAccess {
    /// The server's namespaces.
    pub namespaces: Arc<td_confine::service::Namespaces>,
    /// Variables set for the commands (`RUSTC_WRAPPER`, ...).
    pub env: Vec<(String, String)>,
}

/// The per-loop execution context of every tool call.
pub struct ToolContext {
    root: PathBuf,
    /// Shared: every receipt of the loop's calls holds it until it is made.
    exec_id: Arc<str>,
    /// The root's handle: every file tool opens, lists and writes through it.
    files: Arc<WorktreeFs>,
    catalog: Arc<Catalog>,
    commands: LoopCommands,
    /// What `web_fetch` may reach besides the public internet (`web:` in the config).
    web_access: WebAccess,
    /// What the loop has read and written, and what changed under it since.
    reads: ReadTracking,
    completion: Mutex<Option<String>>,
    coordination: Option<Arc<dyn Coordination>>,
    commit_cache: Mutex<Option<Option<String>>>,
    /// How commands are confined (`sandbox:` of the config).
    sandbox_settings: Arc<SandboxSettings>,
    /// The loop's private temp dir for commands (`TMPDIR`), made at the first command and
    /// removed with the context.
    temp_dir: Mutex<Option<tempfile::TempDir>>,
    /// The loop's compiler cache server, when the run has one.
    compiler_cache: Option<CompilerCacheAccess>,
}

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
        let files = Arc::new(files);
        Ok(Self {
            root,
            exec_id: Arc::from(exec_id.into()),
            reads: ReadTracking::new(Arc::clone(&files)),
            files,
            catalog: Arc::new(Catalog::default()),
            commands: LoopCommands::default(),
            web_access: WebAccess::default(),
            completion: Mutex::new(None),
            coordination: None,
            commit_cache: Mutex::new(None),
            sandbox_settings: Arc::new(SandboxSettings::default()),
            temp_dir: Mutex::new(None),
            compiler_cache: None,
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

    /// Builds through the loop's compiler cache server (see [`CompilerCacheAccess`]).
    pub fn with_compiler_cache(mut self, access: CompilerCacheAccess) -> Self {
        self.compiler_cache = Some(access);
        self
    }

    /// The loop's compiler cache server, when it has one.
    pub fn compiler_cache(&self) -> Option<&CompilerCacheAccess> {
        self.compiler_cache.as_ref()
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
                        ".taskdaemon holds the run's records; write your files elsewhere in the worktree (plans, specs and phases go to taskdaemon-artifacts/ through create_plan, create_spec or create_phase).".to_string()
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

    /// The loop's exec id, shared.
    pub fn shared_exec_id(&self) -> &Arc<str> {
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

    /// The loop's read tracking: stamps, own writes, outside changes, read indexes.
    pub fn reads(&self) -> &ReadTracking {
        &self.reads
    }

    // Shorthands for the read tracking, which most tools and the watcher use through the
    // context: see the `ReadTracking` method of the same name.

    /// See [`ReadTracking::record_stamp`].
    pub fn record_stamp(&self, path: &Path, content: &[u8]) {
        self.reads.record_stamp(path, content);
    }

    /// See [`ReadTracking::record_stamp_hash`].
    pub fn record_stamp_hash(&self, path: &Path, stamp: Stamp) {
        self.reads.record_stamp_hash(path, stamp);
    }

    /// See [`ReadTracking::observe_stamps`].
    pub fn observe_stamps(&self, observer: Option<StampObserver>) {
        self.reads.observe_stamps(observer);
    }

    /// See [`ReadTracking::stamp_own_write`].
    pub fn stamp_own_write(&self, path: &Path, content: &[u8]) -> Option<Stamp> {
        self.reads.stamp_own_write(path, content)
    }

    /// See [`ReadTracking::finish_own_write`].
    pub fn finish_own_write(&self, path: &Path) {
        self.reads.finish_own_write(path);
    }

    /// See [`ReadTracking::undo_write_stamp`].
    pub fn undo_write_stamp(&self, path: &Path, previous: Option<Stamp>) {
        self.reads.undo_write_stamp(path, previous);
    }

    /// See [`ReadTracking::stamp`].
    pub fn stamp(&self, path: &Path) -> Option<Stamp> {
        self.reads.stamp(path)
    }

    /// See [`ReadTracking::read_index`].
    pub fn read_index(&self, path: &Path) -> Option<Arc<ReadIndex>> {
        self.reads.read_index(path)
    }

    /// See [`ReadTracking::keep_read_index`].
    pub fn keep_read_index(&self, path: &Path, index: Arc<ReadIndex>) {
        self.reads.keep_read_index(path, index);
    }

    /// See [`ReadTracking::check_stamp`].
    pub fn check_stamp(&self, path: &Path, current_content: &[u8]) -> StampCheck {
        self.reads.check_stamp(path, current_content)
    }

    /// See [`ReadTracking::check_without_content`].
    pub fn check_without_content(&self, path: &Path) -> Option<StampCheck> {
        self.reads.check_without_content(path)
    }

    /// See [`ReadTracking::stamped_paths`].
    pub fn stamped_paths(&self) -> Vec<PathBuf> {
        self.reads.stamped_paths()
    }

    /// See [`ReadTracking::note_outside_change`].
    pub fn note_outside_change(&self, path: &Path) -> bool {
        self.reads.note_outside_change(path)
    }

    /// See [`ReadTracking::take_changed_since_read`].
    pub fn take_changed_since_read(&self) -> Vec<PathBuf> {
        self.reads.take_changed_since_read()
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

    /// The worktree's HEAD commit, cached until `invalidate_commit`; `None` outside git or
    /// before the first commit. Read from the repository's files; where they cannot answer,
    /// the daemon's own git is asked, off the async workers (see `td_git::head`).
    pub fn worktree_commit(&self) -> Option<String> {
        let mut cache = lock(&self.commit_cache);
        if let Some(c) = cache.as_ref() {
            return c.clone();
        }
        let commit = td_git::head::head_commit(&self.root);
        *cache = Some(commit.clone());
        commit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_tracks_reads_through_its_own_worktree() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let p = ctx.resolve("a.txt").unwrap();
        std::fs::write(&p, "one").unwrap();
        ctx.record_stamp(&p, b"one");
        assert_eq!(ctx.reads().stamp(&p), Some(Stamp::of(b"one")));
        std::fs::write(&p, "two").unwrap();
        assert!(ctx.note_outside_change(&p));
        assert_eq!(ctx.check_stamp(&p, b"two"), StampCheck::Stale);
        assert_eq!(ctx.take_changed_since_read(), vec![p]);
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
