//! The Watcher actor: ONE `notify` watcher over every loop's worktree, turning file-system
//! events into `LoopMsg::FileChanged` for each loop whose worktree holds the path and that
//! has read the file (holds a read stamp for it).
//!
//! Why it is shaped this way:
//! - One OS watcher for the whole daemon. Linux allows 128 inotify instances per user by
//!   default; an instance per worktree would fail long before thousands of loops.
//! - Only the directories that lead to a file some loop holds a stamp for are watched, each
//!   by itself (not recursively): the worktree root and every directory from there down to
//!   the file. Watching whole trees made a real repository's build output (`target/`,
//!   `node_modules/`) cost a walk of the tree per worktree, an inotify watch per directory
//!   against `max_user_watches`, and an event for every file a build opens or writes. The
//!   loop's context tells the watcher about each new stamp (`ToolContext::observe_stamps`);
//!   a directory is shared by the loops that need it and unwatched when the last one leaves.
//!   Nested worktrees need nothing special: every directory is watched once, by itself.
//! - A stamp is recorded before its directories can be watched (the read comes first), so a
//!   change in between would go unseen: whenever tracking a stamp puts a new watch on a
//!   directory (or cannot), the loop is told about that file once and compares content; so
//!   are the files a loop read before it was registered. Every directory on the
//!   way is recorded as needed even when one above it does not exist yet (a write stamps
//!   its file before creating its directories).
//! - A watched directory that is removed or renamed away loses its watch (files read under
//!   it are reported, as for any change to a whole subtree); when a directory appears again
//!   where one is needed, it is watched again and its loops are told about their files
//!   under it. A directory's own "moved itself" or "deleted" report can arrive after a
//!   directory of that name is back, so it never leaves an existing directory unwatched;
//!   and a moved root keeps its watch (nothing watches its parent to see it come back).
//!   After a kernel queue overflow every needed directory is watched again and every loop
//!   is told about every file it holds a stamp for.
//! - Only stamped paths are forwarded, so build output and other churn never reach a loop.
//!   Anything under a `.git` directory of the worktree is neither tracked nor reported.
//! - The watcher never reads files: the loop compares content when it handles
//!   `FileChanged` (`ToolContext::note_outside_change`), so a touch that changes nothing is
//!   not a change. Duplicate notices (one write can raise several events) are therefore cheap.
//! - A worktree root that cannot be watched (e.g. the inotify watch limit) is answered on
//!   the optional reply port of `Watch`, so the caller can tell its user; the loop is then
//!   not registered. A directory below it that cannot be watched later is logged (the
//!   watch-limit warning once) and its loop is told to check the file.
//! - Paths: roots come from `ToolContext::root()`, which is canonical, and are watched as
//!   such, so `notify` reports canonical paths — the same form `ToolContext::resolve` gives
//!   the stamps. Symlinks inside worktrees are not followed (their targets are either outside
//!   the sandbox or already watched under their real path).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::event::{ModifyKind, RemoveKind, RenameMode};
use notify::{Config, Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::messages::LoopMsg;
use td_base::sync::lock;
use td_toolkit::context::ToolContext;

/// Messages the watcher handles.
pub enum WatcherMsg {
    /// Start telling `target` about changes to files `ctx` has read under `ctx.root()`.
    ///
    /// Registering a name again replaces the earlier registration. When `reply` is given it
    /// receives `Ok(())` once the worktree root is watched and so are the directories of the
    /// files `ctx` holds stamps for, or a message saying why watching failed; in that case
    /// the loop is not registered. From then on the context tells the watcher about every
    /// new stamp (see `Track`).
    Watch {
        /// The loop's name (its exec id); the key for `Unwatch`.
        loop_name: String,
        /// The loop's context: its root and its read stamps.
        ctx: Arc<ToolContext>,
        /// Where `LoopMsg::FileChanged` goes.
        target: ActorRef<LoopMsg>,
        /// Optional answer: whether watching the worktree worked.
        reply: Option<RpcReplyPort<Result<(), WatchError>>>,
    },
    /// Stop telling that loop. Unknown names are ignored.
    Unwatch {
        /// The name given to `Watch`.
        loop_name: String,
    },
    /// The loop started holding a stamp for `path`: watch the directories leading to it.
    /// Sent by the observer `Watch` puts on the loop's context; unknown names are ignored.
    Track {
        /// The name given to `Watch`.
        loop_name: String,
        /// The stamped file (canonical, as the context holds it).
        path: PathBuf,
    },
    /// The worktree roots of the registered loops, sorted (for diagnostics and tests).
    WatchedRoots(RpcReplyPort<Vec<PathBuf>>),
    /// The directories that hold an OS watch now, sorted (for diagnostics and tests).
    WatchedDirs(RpcReplyPort<Vec<PathBuf>>),
    /// Internal: an event from the notify callback.
    Fs(notify::Result<Event>),
}

// Local only: never sent to another node (ractor's `cluster` feature needs the impl said).
impl ractor::Message for WatcherMsg {}

/// The watcher actor (spawn it with `()` as arguments).
pub struct Watcher;

/// What the watcher knows: the OS watcher, the registered loops and the directories they need.
pub struct WatcherState {
    /// Shared with blocking tasks: `notify` calls wait for its event thread, which must not
    /// stall an async worker thread.
    os: Arc<Mutex<RecommendedWatcher>>,
    loops: HashMap<String, Registration>,
    /// Loops per worktree root (several loops may share one worktree).
    roots: HashMap<PathBuf, BTreeSet<String>>,
    /// Directories some loop needs watched. Ordered, so that a directory comes right before
    /// everything below it.
    dirs: BTreeMap<PathBuf, Dir>,
    /// The watch-limit warning is given once; a loop reading in many directories would
    /// repeat it.
    limit_warned: bool,
}

/// A directory some loops need watched.
#[derive(Default)]
struct Dir {
    /// The loops that need it: it is their root, or it leads to a file they hold a stamp for.
    loops: BTreeSet<String>,
    /// Whether it holds an OS watch now (it may be gone, and come back).
    armed: bool,
}

struct Registration {
    root: PathBuf,
    ctx: Arc<ToolContext>,
    target: ActorRef<LoopMsg>,
    /// The directories this loop needs, released when it leaves.
    dirs: BTreeSet<PathBuf>,
}

impl Actor for Watcher {
    type Msg = WatcherMsg;
    type State = WatcherState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<WatcherMsg>,
        _args: (),
    ) -> Result<WatcherState, ActorProcessingErr> {
        // The callback runs on notify's own thread; a cast only enqueues. After the actor
        // stops the cast fails, which is fine: nobody is listening any more.
        let handler = move |res: notify::Result<Event>| {
            let _ = myself.cast(WatcherMsg::Fs(res));
        };
        let os = RecommendedWatcher::new(handler, Config::default().with_follow_symlinks(false))
            .map_err(|e| {
                format!(
                    "starting the file watcher failed: {e}. On Linux the number of inotify \
                     instances per user is limited by /proc/sys/fs/inotify/max_user_instances; \
                     raise it or stop other programs that watch files."
                )
            })?;
        Ok(WatcherState {
            os: Arc::new(Mutex::new(os)),
            loops: HashMap::new(),
            roots: HashMap::new(),
            dirs: BTreeMap::new(),
            limit_warned: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<WatcherMsg>,
        message: WatcherMsg,
        state: &mut WatcherState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WatcherMsg::Watch {
                loop_name,
                ctx,
                target,
                reply,
            } => {
                let outcome = state.register(&myself, loop_name, ctx, target).await;
                if let Err(message) = &outcome {
                    tracing::warn!("{message}");
                }
                if let Some(reply) = reply {
                    // The caller may have given up waiting; nothing to do then.
                    let _ = reply.send(outcome);
                }
            }
            WatcherMsg::Unwatch { loop_name } => state.unregister(&loop_name).await,
            WatcherMsg::Track { loop_name, path } => state.track(&loop_name, &path).await,
            WatcherMsg::WatchedRoots(reply) => {
                let mut roots: Vec<PathBuf> = state.roots.keys().cloned().collect();
                roots.sort();
                let _ = reply.send(roots);
            }
            WatcherMsg::WatchedDirs(reply) => {
                let armed = state.dirs.iter().filter(|(_, d)| d.armed);
                let _ = reply.send(armed.map(|(p, _)| p.clone()).collect());
            }
            WatcherMsg::Fs(Ok(event)) => state.on_event(&event).await,
            WatcherMsg::Fs(Err(err)) => state.on_error(&err),
        }
        Ok(())
    }
}

impl WatcherState {
    async fn register(
        &mut self,
        myself: &ActorRef<WatcherMsg>,
        loop_name: String,
        ctx: Arc<ToolContext>,
        target: ActorRef<LoopMsg>,
    ) -> Result<(), WatchError> {
        let root = ctx.root().to_path_buf();
        match self.loops.get_mut(&loop_name) {
            Some(existing) if existing.root == root => {
                if !Arc::ptr_eq(&existing.ctx, &ctx) {
                    existing.ctx.observe_stamps(None);
                }
                existing.ctx = Arc::clone(&ctx);
                existing.target = target;
            }
            _ => {
                self.unregister(&loop_name).await;
                self.need(&loop_name, &root);
                if let Err(err) = self.arm(&root).await {
                    self.release(&loop_name, &root).await;
                    return Err(watch_failure(&root, &err));
                }
                self.roots
                    .entry(root.clone())
                    .or_default()
                    .insert(loop_name.clone());
                let dirs = BTreeSet::from([root.clone()]);
                let reg = Registration {
                    root,
                    ctx: Arc::clone(&ctx),
                    target,
                    dirs,
                };
                self.loops.insert(loop_name.clone(), reg);
            }
        }
        // The observer first, then the stamps already held: a stamp recorded in between is
        // tracked twice, which is harmless, rather than not at all.
        let me = myself.clone();
        let name = loop_name.clone();
        ctx.observe_stamps(Some(Arc::new(move |path: &Path| {
            let _ = me.cast(WatcherMsg::Track {
                loop_name: name.clone(),
                path: path.to_path_buf(),
            });
        })));
        for path in ctx.stamped_paths() {
            self.track(&loop_name, &path).await;
        }
        // Changes to files the loop read before it was registered reached nobody (even with
        // its root watched for another loop): it checks them once.
        let name = BTreeSet::from([loop_name.clone()]);
        let notices = self.stamped_under(ctx.root(), &name);
        self.send(notices).await;
        Ok(())
    }

    async fn unregister(&mut self, loop_name: &str) {
        let Some(reg) = self.loops.remove(loop_name) else {
            return;
        };
        reg.ctx.observe_stamps(None);
        if let Some(names) = self.roots.get_mut(&reg.root) {
            names.remove(loop_name);
            if names.is_empty() {
                self.roots.remove(&reg.root);
            }
        }
        for dir in &reg.dirs {
            self.release(loop_name, dir).await;
        }
    }

    /// Records that `loop_name` needs `dir` watched (the OS watch is `arm`'s job).
    fn need(&mut self, loop_name: &str, dir: &Path) {
        let entry = self.dirs.entry(dir.to_path_buf()).or_default();
        entry.loops.insert(loop_name.to_string());
        if let Some(reg) = self.loops.get_mut(loop_name) {
            reg.dirs.insert(dir.to_path_buf());
        }
    }

    /// `loop_name` no longer needs `dir`; the last loop to let go removes its OS watch.
    async fn release(&mut self, loop_name: &str, dir: &Path) {
        let Some(entry) = self.dirs.get_mut(dir) else {
            return;
        };
        entry.loops.remove(loop_name);
        if entry.loops.is_empty() {
            let armed = entry.armed;
            self.dirs.remove(dir);
            if armed {
                self.os_unwatch(dir).await;
            }
        }
    }

    /// Puts an OS watch on a needed directory unless it has one; whether it is new.
    async fn arm(&mut self, dir: &Path) -> notify::Result<bool> {
        if self.dirs.get(dir).is_some_and(|d| d.armed) {
            return Ok(false);
        }
        self.os_watch(dir).await?;
        if let Some(entry) = self.dirs.get_mut(dir) {
            entry.armed = true;
        }
        Ok(true)
    }

    /// Watches the directories from the loop's root down to `path`, which the loop now
    /// holds a stamp for; tells the loop to check the file when a watch had to be added (a
    /// change before it would have gone unseen) or could not be.
    async fn track(&mut self, loop_name: &str, path: &Path) {
        let Some(root) = self.loops.get(loop_name).map(|r| r.root.clone()) else {
            return;
        };
        if !path.starts_with(&root) || path == root || has_git_component(&root, path) {
            return;
        }
        let mut chain: Vec<&Path> = path
            .ancestors()
            .skip(1)
            .take_while(|a| a.starts_with(&root))
            .collect();
        chain.reverse();
        // Every level is needed, also below one that cannot be watched yet (a write stamps
        // its file before creating its directories): when that one appears, `appeared` arms
        // what is needed below it.
        for dir in &chain {
            self.need(loop_name, dir);
        }
        let mut check = false;
        for dir in chain {
            match self.arm(dir).await {
                Ok(added) => check |= added,
                Err(err) => {
                    self.arm_failed(dir, &err);
                    check = true;
                    break;
                }
            }
        }
        if check {
            let paths = BTreeSet::from([path.to_path_buf()]);
            self.send(BTreeMap::from([(loop_name.to_string(), paths)]))
                .await;
        }
    }

    fn arm_failed(&mut self, dir: &Path, err: &notify::Error) {
        match err.kind {
            notify::ErrorKind::MaxFilesWatch => self.warn_limit(),
            notify::ErrorKind::PathNotFound => {
                // Gone already; watched again if it comes back (see `appeared`).
                tracing::debug!("not watching '{}': it does not exist", dir.display());
            }
            _ => tracing::warn!("file watcher: watching '{}' failed: {err}", dir.display()),
        }
    }

    /// `path` was removed or renamed away: the needed directories at or below it lost their
    /// watches (or, renamed, would report under a wrong name).
    async fn lost(&mut self, path: &Path) {
        let armed: Vec<PathBuf> = self
            .dirs
            .range(path.to_path_buf()..)
            .take_while(|(d, _)| d.starts_with(path))
            .filter(|(_, d)| d.armed)
            .map(|(p, _)| p.clone())
            .collect();
        for dir in armed {
            if let Some(entry) = self.dirs.get_mut(&dir) {
                entry.armed = false;
            }
            self.os_unwatch(&dir).await;
        }
    }

    /// `path` was created or renamed into place: needed directories at or below it are
    /// watched again, and the loops that need them told to check their files under `path`.
    async fn appeared(&mut self, path: &Path) {
        let missing: Vec<PathBuf> = self
            .dirs
            .range(path.to_path_buf()..)
            .take_while(|(d, _)| d.starts_with(path))
            .filter(|(_, d)| !d.armed)
            .map(|(p, _)| p.clone())
            .collect();
        let mut concerned = BTreeSet::new();
        for dir in missing {
            // Parents come first: a directory below one that failed fails the same way.
            match self.arm(&dir).await {
                Ok(_) => {}
                Err(err) => self.arm_failed(&dir, &err),
            }
            if let Some(entry) = self.dirs.get(&dir) {
                concerned.extend(entry.loops.iter().cloned());
            }
        }
        let notices = self.stamped_under(path, &concerned);
        self.send(notices).await;
    }

    /// The stamped paths at or below `path` of each loop in `names`.
    fn stamped_under(
        &self,
        path: &Path,
        names: &BTreeSet<String>,
    ) -> BTreeMap<String, BTreeSet<PathBuf>> {
        names
            .iter()
            .filter_map(|name| {
                let reg = self.loops.get(name)?;
                let paths: BTreeSet<PathBuf> = reg
                    .ctx
                    .stamped_paths()
                    .into_iter()
                    .filter(|s| s.starts_with(path) && !has_git_component(&reg.root, s))
                    .collect();
                (!paths.is_empty()).then(|| (name.clone(), paths))
            })
            .collect()
    }

    async fn on_event(&mut self, event: &Event) {
        if event.need_rescan() {
            // The kernel queue overflowed: events were lost, directories may have come and
            // gone, and any read file may have changed. Watch everything needed again; the
            // loops compare content, so telling them about all is only work.
            self.rearm_all().await;
            self.tell_all_stamped().await;
            return;
        }
        // Which paths took a needed directory away or brought one back; and whether files
        // read under a path went along with it without an event of their own.
        let (gone, came, whole_subtree): (&[PathBuf], &[PathBuf], bool) = match event.kind {
            EventKind::Access(_) | EventKind::Other => return,
            EventKind::Remove(RemoveKind::File) => (&[], &[], false),
            EventKind::Remove(_) => (&event.paths, &[], true),
            EventKind::Create(_) => (&[], &event.paths, false),
            // A watched directory's own "moved itself" (no cookie, and it may come late:
            // after the directory is back). Its watch follows it; one below the root loses
            // it through its parent's report, which has a cookie.
            EventKind::Modify(ModifyKind::Name(RenameMode::From)) if event.tracker().is_none() => {
                (&[], &[], true)
            }
            EventKind::Modify(ModifyKind::Name(RenameMode::From)) => (&event.paths, &[], true),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) => (&[], &event.paths, true),
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
                let split = event.paths.len().min(1);
                (&event.paths[..split], &event.paths[split..], true)
            }
            EventKind::Modify(ModifyKind::Name(_)) => (&event.paths, &event.paths, true),
            EventKind::Any | EventKind::Modify(_) => (&[], &[], false),
        };
        for path in gone {
            self.lost(path).await;
            // A late report (a removed directory's own, read after a new one took its name)
            // must not leave a directory that is there unwatched.
            if path.is_dir() {
                self.appeared(path).await;
            }
        }
        for path in came {
            self.appeared(path).await;
        }
        let mut notices: BTreeMap<String, BTreeSet<PathBuf>> = BTreeMap::new();
        for path in &event.paths {
            // Walking the path's ancestors finds exactly the roots that hold it by whole
            // components (`/w/tree-evil` never finds `/w/tree`), whatever the number of loops.
            for root in path.ancestors() {
                let Some(names) = self.roots.get(root) else {
                    continue;
                };
                if has_git_component(root, path) {
                    continue;
                }
                for name in names {
                    let Some(reg) = self.loops.get(name) else {
                        continue;
                    };
                    let mut hits = Vec::new();
                    if reg.ctx.stamp(path).is_some() {
                        hits.push(path.clone());
                    }
                    if whole_subtree {
                        hits.extend(reg.ctx.stamped_paths().into_iter().filter(|s| {
                            s != path && s.starts_with(path) && !has_git_component(root, s)
                        }));
                    }
                    if !hits.is_empty() {
                        notices.entry(name.clone()).or_default().extend(hits);
                    }
                }
            }
        }
        self.send(notices).await;
    }

    /// Watches every needed directory again (after lost events), noting which exist.
    async fn rearm_all(&mut self) {
        let dirs: Vec<PathBuf> = self.dirs.keys().cloned().collect();
        for dir in dirs {
            // Away first: a directory replaced while events were lost would otherwise keep
            // the old one's watch beside the new.
            if self.dirs.get(&dir).is_some_and(|d| d.armed) {
                self.os_unwatch(&dir).await;
            }
            let result = self.os_watch(&dir).await;
            if let Err(err) = &result {
                self.arm_failed(&dir, err);
            }
            if let Some(entry) = self.dirs.get_mut(&dir) {
                entry.armed = result.is_ok();
            }
        }
    }

    async fn tell_all_stamped(&mut self) {
        let notices = self
            .loops
            .iter()
            .map(|(name, reg)| {
                let paths = reg
                    .ctx
                    .stamped_paths()
                    .into_iter()
                    .filter(|p| p.starts_with(&reg.root) && !has_git_component(&reg.root, p))
                    .collect();
                (name.clone(), paths)
            })
            .collect();
        self.send(notices).await;
    }

    /// Sends the notices; a loop whose actor is gone is unregistered.
    async fn send(&mut self, notices: BTreeMap<String, BTreeSet<PathBuf>>) {
        let mut gone = Vec::new();
        for (name, paths) in notices {
            let Some(reg) = self.loops.get(&name) else {
                continue;
            };
            for path in paths {
                if reg.target.cast(LoopMsg::FileChanged(path)).is_err() {
                    gone.push(name);
                    break;
                }
            }
        }
        for name in gone {
            tracing::debug!("loop '{name}' stopped without leaving the watcher; forgetting it");
            self.unregister(&name).await;
        }
    }

    fn on_error(&mut self, err: &notify::Error) {
        if matches!(err.kind, notify::ErrorKind::MaxFilesWatch) {
            self.warn_limit();
        } else {
            tracing::warn!("file watcher error: {err}");
        }
    }

    fn warn_limit(&mut self) {
        if !self.limit_warned {
            self.limit_warned = true;
            tracing::warn!(
                "file watcher: the inotify watch limit is reached, so some directories with \
                 files that loops have read are not watched and loops may miss outside \
                 changes there. Raise /proc/sys/fs/inotify/max_user_watches (e.g. \
                 `echo 524288 | sudo tee /proc/sys/fs/inotify/max_user_watches`)."
            );
        }
    }

    /// Watches `dir` by itself (not what is below it).
    async fn os_watch(&self, dir: &Path) -> notify::Result<()> {
        let dir_owned = dir.to_path_buf();
        self.with_os(move |w| {
            // A file that took a directory's name would be watched as a file otherwise.
            if !dir_owned.is_dir() {
                return Err(notify::Error::path_not_found().add_path(dir_owned));
            }
            w.watch(&dir_owned, RecursiveMode::NonRecursive)
        })
        .await
    }

    async fn os_unwatch(&self, dir: &Path) {
        let dir_owned = dir.to_path_buf();
        if let Err(e) = self.with_os(move |w| w.unwatch(&dir_owned)).await {
            // Typically the directory was deleted and notify already dropped its watch.
            tracing::debug!("unwatching '{}': {e}", dir.display());
        }
    }

    async fn with_os<F>(&self, f: F) -> notify::Result<()>
    where
        F: FnOnce(&mut RecommendedWatcher) -> notify::Result<()> + Send + 'static,
    {
        let os = Arc::clone(&self.os);
        tokio::task::spawn_blocking(move || f(&mut lock(&os)))
            .await
            .unwrap_or_else(|e| Err(notify::Error::generic(&format!("watcher task failed: {e}"))))
    }
}

/// Whether `path` lies in a `.git` directory (or is one) below `root`.
fn has_git_component(root: &Path, path: &Path) -> bool {
    path.strip_prefix(root)
        .map(|rel| rel.components().any(|c| c.as_os_str() == ".git"))
        .unwrap_or(false)
}

/// The message for a root that could not be watched: what happened and what to do.
/// Why a loop's worktree could not be watched; until it is, the loop is not told when
/// something else changes files it has read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The kernel's inotify watch limit is reached.
    #[error(
        "watching worktree '{}' for outside changes failed: the inotify watch limit is \
         reached. Raise /proc/sys/fs/inotify/max_user_watches (e.g. \
         `echo 524288 | sudo tee /proc/sys/fs/inotify/max_user_watches`) or run fewer \
         loops at once; until this is fixed the loop is not told when something else \
         changes files it has read.",
        .root.display()
    )]
    WatchLimit {
        /// The worktree.
        root: PathBuf,
    },
    /// Any other failure of the OS watch.
    #[error(
        "watching worktree '{}' for outside changes failed: {reason}; until this is fixed \
         the loop is not told when something else changes files it has read.",
        .root.display()
    )]
    Failed {
        /// The worktree.
        root: PathBuf,
        /// What notify said.
        reason: String,
    },
}

fn watch_failure(root: &Path, err: &notify::Error) -> WatchError {
    let root = root.to_path_buf();
    match err.kind {
        notify::ErrorKind::MaxFilesWatch => WatchError::WatchLimit { root },
        _ => WatchError::Failed {
            root,
            reason: err.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use notify::event::{AccessKind, DataChange, Flag};
    use tokio::sync::mpsc;

    use super::*;

    /// A stand-in loop that forwards the paths it is told about.
    struct Probe;

    impl Actor for Probe {
        type Msg = LoopMsg;
        type State = mpsc::UnboundedSender<PathBuf>;
        type Arguments = mpsc::UnboundedSender<PathBuf>;

        async fn pre_start(
            &self,
            _myself: ActorRef<LoopMsg>,
            tx: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(tx)
        }

        async fn handle(
            &self,
            _myself: ActorRef<LoopMsg>,
            message: LoopMsg,
            tx: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if let LoopMsg::FileChanged(path) = message {
                let _ = tx.send(path);
            }
            Ok(())
        }
    }

    /// How long a notice may take to arrive: generous, because machines under load are slow.
    const ARRIVAL: Duration = Duration::from_secs(5);
    /// How long "nothing else" is checked after a positive control has arrived.
    const QUIET: Duration = Duration::from_millis(200);

    async fn watcher() -> ActorRef<WatcherMsg> {
        Actor::spawn(None, Watcher, ()).await.unwrap().0
    }

    async fn probe() -> (ActorRef<LoopMsg>, mpsc::UnboundedReceiver<PathBuf>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Actor::spawn(None, Probe, tx).await.unwrap().0, rx)
    }

    fn context(dir: &Path, name: &str) -> Arc<ToolContext> {
        Arc::new(ToolContext::new(dir, name).unwrap())
    }

    async fn watch(
        w: &ActorRef<WatcherMsg>,
        name: &str,
        ctx: &Arc<ToolContext>,
        target: &ActorRef<LoopMsg>,
    ) -> Result<(), WatchError> {
        ractor::call!(w, |reply| WatcherMsg::Watch {
            loop_name: name.to_string(),
            ctx: Arc::clone(ctx),
            target: target.clone(),
            reply: Some(reply),
        })
        .unwrap()
    }

    async fn roots(w: &ActorRef<WatcherMsg>) -> Vec<PathBuf> {
        ractor::call!(w, WatcherMsg::WatchedRoots).unwrap()
    }

    /// The directories with an OS watch; also a barrier (every message sent before is handled).
    async fn dirs(w: &ActorRef<WatcherMsg>) -> Vec<PathBuf> {
        ractor::call!(w, WatcherMsg::WatchedDirs).unwrap()
    }

    /// Waits until `dir` holds a watch again (it comes back on an event, not on a message).
    async fn until_watched(w: &ActorRef<WatcherMsg>, dir: &Path) {
        let deadline = tokio::time::Instant::now() + ARRIVAL;
        while !dirs(w).await.iter().any(|d| d == dir) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{dir:?} not watched again"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Takes whatever notices are queued or arrive within the quiet period.
    async fn drain(rx: &mut mpsc::UnboundedReceiver<PathBuf>) {
        while tokio::time::timeout(QUIET, rx.recv()).await.is_ok() {}
    }

    /// Writes `content` to `rel` and records that the loop read it; returns the real path.
    fn read_file(ctx: &ToolContext, rel: &str, content: &str) -> PathBuf {
        let path = ctx.resolve(rel).unwrap();
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, content).unwrap();
        ctx.record_stamp(&path, content.as_bytes());
        path
    }

    async fn next(rx: &mut mpsc::UnboundedReceiver<PathBuf>) -> PathBuf {
        tokio::time::timeout(ARRIVAL, rx.recv())
            .await
            .expect("no FileChanged within 5 s")
            .expect("probe gone")
    }

    /// Waits for the positive control `expected`; everything before it and anything but
    /// repeats of it during a quiet period afterwards fails the test. Events reach the
    /// watcher in order, so what was caused earlier than the control arrives before it.
    async fn only(rx: &mut mpsc::UnboundedReceiver<PathBuf>, expected: &Path) {
        assert_eq!(next(rx).await, expected);
        quiet_except(rx, Some(expected)).await;
    }

    async fn quiet_except(rx: &mut mpsc::UnboundedReceiver<PathBuf>, allowed: Option<&Path>) {
        let deadline = tokio::time::Instant::now() + QUIET;
        while let Ok(got) = tokio::time::timeout_at(deadline, rx.recv()).await {
            let got = got.expect("probe gone");
            assert_eq!(Some(got.as_path()), allowed, "unexpected FileChanged");
        }
    }

    /// Collects distinct paths until `want` are all seen.
    async fn collect(rx: &mut mpsc::UnboundedReceiver<PathBuf>, want: &[&Path]) {
        let mut seen = BTreeSet::new();
        while !want.iter().all(|p| seen.contains(*p)) {
            seen.insert(next(rx).await);
        }
    }

    #[tokio::test]
    async fn an_outside_write_to_a_read_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let file = read_file(&ctx, "src/a.txt", "one");
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        assert_eq!(roots(&w).await, vec![ctx.root().to_path_buf()]);

        std::fs::write(dir.path().join("src/a.txt"), "two").unwrap();
        only(&mut rx, &file).await;
    }

    #[tokio::test]
    async fn unread_files_and_git_internals_are_not_reported() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let control = read_file(&ctx, "a.txt", "one");
        // Even a stamped file inside .git is never reported.
        let head = read_file(&ctx, ".git/HEAD", "ref: refs/heads/main\n");
        std::fs::create_dir_all(dir.path().join("sub/.git")).unwrap();
        let nested = read_file(&ctx, "sub/.git/config", "x");
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();

        std::fs::write(dir.path().join("unread.txt"), "new").unwrap();
        std::fs::write(&head, "ref: refs/heads/other\n").unwrap();
        std::fs::write(&nested, "y").unwrap();
        std::fs::create_dir_all(dir.path().join(".git/objects/ab")).unwrap();
        std::fs::write(dir.path().join(".git/objects/ab/cd"), "blob").unwrap();
        std::fs::write(&control, "two").unwrap();
        only(&mut rx, &control).await;
    }

    #[tokio::test]
    async fn loops_sharing_a_worktree_are_each_told_about_what_they_read() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cb) = (context(dir.path(), "a"), context(dir.path(), "b"));
        let shared = read_file(&ca, "shared.txt", "one");
        cb.record_stamp(&shared, b"one");
        let only_a = read_file(&ca, "only_a.txt", "one");
        let w = watcher().await;
        let (pa, mut ra) = probe().await;
        let (pb, mut rb) = probe().await;
        watch(&w, "a", &ca, &pa).await.unwrap();
        watch(&w, "b", &cb, &pb).await.unwrap();
        assert_eq!(roots(&w).await.len(), 1, "one watch for a shared worktree");

        std::fs::write(&only_a, "two").unwrap();
        std::fs::write(&shared, "two").unwrap();
        collect(&mut ra, &[&only_a, &shared]).await;
        // b never read only_a.txt: its first notice is the shared file.
        only(&mut rb, &shared).await;
    }

    #[tokio::test]
    async fn a_sibling_named_like_the_root_plus_a_suffix_is_outside_it() {
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(base.path().join("tree")).unwrap();
        std::fs::create_dir_all(base.path().join("tree-evil")).unwrap();
        let tree = context(&base.path().join("tree"), "tree");
        let evil = context(&base.path().join("tree-evil"), "evil");
        let target = read_file(&evil, "f.txt", "one");
        // Pretend the tree loop read it too (as a loop without sandbox could).
        tree.record_stamp(&target, b"one");
        let w = watcher().await;
        let (pt, mut rt) = probe().await;
        let (pe, mut re) = probe().await;
        watch(&w, "tree", &tree, &pt).await.unwrap();
        watch(&w, "evil", &evil, &pe).await.unwrap();

        std::fs::write(&target, "two").unwrap();
        only(&mut re, &target).await;
        quiet_except(&mut rt, None).await;
    }

    #[tokio::test]
    async fn unwatch_stops_notices_and_the_last_loop_releases_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cb) = (context(dir.path(), "a"), context(dir.path(), "b"));
        let file = read_file(&ca, "f.txt", "one");
        cb.record_stamp(&file, b"one");
        let w = watcher().await;
        let (pa, mut ra) = probe().await;
        let (pb, mut rb) = probe().await;
        watch(&w, "a", &ca, &pa).await.unwrap();
        watch(&w, "b", &cb, &pb).await.unwrap();
        // a registered first: its file, read before, is checked once.
        only(&mut ra, &file).await;

        w.cast(WatcherMsg::Unwatch {
            loop_name: "a".into(),
        })
        .unwrap();
        assert_eq!(
            roots(&w).await,
            vec![ca.root().to_path_buf()],
            "still watched for b"
        );
        std::fs::write(&file, "two").unwrap();
        only(&mut rb, &file).await;
        quiet_except(&mut ra, None).await;

        w.cast(WatcherMsg::Unwatch {
            loop_name: "b".into(),
        })
        .unwrap();
        assert!(roots(&w).await.is_empty());
        // Unknown names are harmless.
        w.cast(WatcherMsg::Unwatch {
            loop_name: "nobody".into(),
        })
        .unwrap();
        assert!(roots(&w).await.is_empty());
    }

    #[tokio::test]
    async fn renames_report_both_sides_and_files_under_a_moved_directory() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let from = read_file(&ctx, "from.txt", "one");
        let to = read_file(&ctx, "to.txt", "two");
        let inside = read_file(&ctx, "pkg/mod.txt", "three");
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();

        std::fs::rename(&from, &to).unwrap();
        collect(&mut rx, &[&from, &to]).await;
        std::fs::rename(dir.path().join("pkg"), dir.path().join("pkg2")).unwrap();
        collect(&mut rx, &[&inside]).await;
    }

    #[tokio::test]
    async fn a_root_reached_through_a_symlinked_parent_reports_canonical_paths() {
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(base.path().join("real/wt")).unwrap();
        std::os::unix::fs::symlink(base.path().join("real"), base.path().join("link")).unwrap();
        let ctx = context(&base.path().join("link/wt"), "a");
        let file = read_file(&ctx, "f.txt", "one");
        assert!(file.starts_with(base.path().canonicalize().unwrap().join("real")));
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();

        std::fs::write(base.path().join("link/wt/f.txt"), "two").unwrap();
        only(&mut rx, &file).await;
    }

    #[tokio::test]
    async fn nested_worktrees_stay_watched_whichever_comes_or_goes_first() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("inner")).unwrap();
        let outer = context(dir.path(), "outer");
        let inner = context(&dir.path().join("inner"), "inner");
        let file = read_file(&inner, "f.txt", "1");
        let w = watcher().await;
        let (po, _ro) = probe().await;
        let (pi, mut ri) = probe().await;
        let unwatch = |name: &str| {
            w.cast(WatcherMsg::Unwatch {
                loop_name: name.to_string(),
            })
            .unwrap()
        };
        let (outer_root, inner_root) = (outer.root().to_path_buf(), inner.root().to_path_buf());

        // Outer first.
        watch(&w, "outer", &outer, &po).await.unwrap();
        watch(&w, "inner", &inner, &pi).await.unwrap();
        assert_eq!(
            roots(&w).await,
            vec![outer_root.clone(), inner_root.clone()]
        );
        std::fs::write(&file, "2").unwrap();
        only(&mut ri, &file).await;
        // The outer loop leaves: the inner root keeps its watch.
        unwatch("outer");
        assert_eq!(dirs(&w).await, vec![inner_root.clone()]);
        std::fs::write(&file, "3").unwrap();
        only(&mut ri, &file).await;

        // Outer after inner, and the outer loop reads the inner loop's file too: the
        // directory is watched once, for both.
        watch(&w, "outer", &outer, &po).await.unwrap();
        outer.record_stamp(&file, b"3");
        assert_eq!(dirs(&w).await, vec![outer_root.clone(), inner_root.clone()]);
        std::fs::write(&file, "4").unwrap();
        only(&mut ri, &file).await;
        unwatch("outer");
        assert_eq!(dirs(&w).await, vec![inner_root.clone()]);
        std::fs::write(&file, "5").unwrap();
        only(&mut ri, &file).await;
    }

    #[tokio::test]
    async fn only_the_directories_leading_to_read_files_are_watched() {
        let dir = tempfile::tempdir().unwrap();
        // Build output: many directories nobody reads from.
        for i in 0..50 {
            std::fs::create_dir_all(dir.path().join(format!("target/debug/deps{i}"))).unwrap();
        }
        let ctx = context(dir.path(), "a");
        let root = ctx.root().to_path_buf();
        let src = read_file(&ctx, "src/lib.rs", "one");
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        assert_eq!(dirs(&w).await, vec![root.clone(), root.join("src")]);

        // A file read later, deeper down, brings the directories leading to it.
        let deep = read_file(&ctx, "a/b/c.txt", "one");
        assert_eq!(
            dirs(&w).await,
            vec![
                root.clone(),
                root.join("a"),
                root.join("a/b"),
                root.join("src")
            ]
        );
        drain(&mut rx).await;
        std::fs::write(root.join("target/debug/deps7/out.o"), "x").unwrap();
        std::fs::write(&deep, "two").unwrap();
        only(&mut rx, &deep).await;
        std::fs::write(&src, "two").unwrap();
        only(&mut rx, &src).await;

        w.cast(WatcherMsg::Unwatch {
            loop_name: "a".into(),
        })
        .unwrap();
        assert!(dirs(&w).await.is_empty(), "every directory released");
    }

    #[tokio::test]
    async fn a_file_read_in_a_directory_not_yet_watched_is_checked_once() {
        // The read records the stamp before the watcher can watch the directory: a change in
        // between would be missed, so the loop is told to check the file.
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        std::fs::create_dir_all(dir.path().join("new/dir")).unwrap();
        std::fs::write(dir.path().join("new/dir/g.txt"), "one").unwrap();
        let first = read_file(&ctx, "new/dir/f.txt", "one");
        only(&mut rx, &first).await;
        // Another file in a directory already watched: nothing to check.
        let second = ctx.resolve("new/dir/g.txt").unwrap();
        ctx.record_stamp(&second, b"one");
        dirs(&w).await;
        quiet_except(&mut rx, None).await;
        std::fs::write(&second, "two").unwrap();
        only(&mut rx, &second).await;
    }

    #[tokio::test]
    async fn a_directory_removed_or_renamed_is_watched_again_when_it_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let file = read_file(&ctx, "pkg/sub/mod.txt", "one");
        let (pkg, sub) = (ctx.root().join("pkg"), ctx.root().join("pkg/sub"));
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        drain(&mut rx).await;

        std::fs::remove_dir_all(&pkg).unwrap();
        assert_eq!(next(&mut rx).await, file);
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(&file, "two").unwrap();
        until_watched(&w, &sub).await;
        drain(&mut rx).await;
        // The watches are real again: a later change is reported.
        std::fs::write(&file, "three").unwrap();
        only(&mut rx, &file).await;

        std::fs::rename(&pkg, dir.path().join("away")).unwrap();
        assert_eq!(next(&mut rx).await, file);
        drain(&mut rx).await;
        assert!(
            !dirs(&w).await.contains(&pkg),
            "a renamed directory keeps no watch"
        );
        // Coming back tells the loop to check its files there, and watches them again.
        std::fs::rename(dir.path().join("away"), &pkg).unwrap();
        assert_eq!(next(&mut rx).await, file);
        until_watched(&w, &sub).await;
        drain(&mut rx).await;
        std::fs::write(&file, "four").unwrap();
        only(&mut rx, &file).await;
    }

    #[tokio::test]
    async fn a_file_stamped_before_its_directories_exist_is_watched_at_every_level() {
        // write_file stamps its own write before it creates the missing directories.
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        let file = ctx.resolve("a/b/f.txt").unwrap();
        ctx.record_stamp(&file, b"one");
        dirs(&w).await;
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "one").unwrap();
        until_watched(&w, &ctx.root().join("a/b")).await;
        drain(&mut rx).await;
        std::fs::write(&file, "two").unwrap();
        only(&mut rx, &file).await;
    }

    #[tokio::test]
    async fn late_reports_do_not_unwatch_a_directory_that_is_there() {
        // `mv pkg away; mv away pkg` read in one batch ends with pkg's own "moved itself"
        // (no cookie); a removed directory's own report can likewise follow the creation of
        // a new one with its name.
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let file = read_file(&ctx, "pkg/mod.txt", "one");
        let pkg = ctx.root().join("pkg");
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        let late = [
            Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::From))),
            Event::new(EventKind::Remove(RemoveKind::Folder)),
        ];
        for event in late {
            w.cast(WatcherMsg::Fs(Ok(event.add_path(pkg.clone()))))
                .unwrap();
            assert!(dirs(&w).await.contains(&pkg), "pkg is there but unwatched");
            drain(&mut rx).await;
            std::fs::write(&file, "two").unwrap();
            only(&mut rx, &file).await;
        }
    }

    #[tokio::test]
    async fn a_root_renamed_away_and_back_is_still_watched() {
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir(base.path().join("wt")).unwrap();
        let ctx = context(&base.path().join("wt"), "a");
        let file = read_file(&ctx, "f.txt", "one");
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        drain(&mut rx).await;
        std::fs::rename(base.path().join("wt"), base.path().join("wt2")).unwrap();
        assert_eq!(next(&mut rx).await, file);
        std::fs::rename(base.path().join("wt2"), base.path().join("wt")).unwrap();
        drain(&mut rx).await;
        std::fs::write(&file, "two").unwrap();
        only(&mut rx, &file).await;
    }

    #[tokio::test]
    async fn a_stamp_reported_after_its_loop_left_adds_no_watch() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let w = watcher().await;
        let (p, _rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        w.cast(WatcherMsg::Unwatch {
            loop_name: "a".into(),
        })
        .unwrap();
        let path = read_file(&ctx, "x/y/f.txt", "1");
        w.cast(WatcherMsg::Track {
            loop_name: "a".into(),
            path,
        })
        .unwrap();
        assert!(dirs(&w).await.is_empty());
    }

    #[tokio::test]
    async fn files_read_before_registering_are_checked_even_in_a_watched_worktree() {
        // The root is watched for a, but b was not registered yet when it read the file: a
        // change then would have reached nobody.
        let dir = tempfile::tempdir().unwrap();
        let (ca, cb) = (context(dir.path(), "a"), context(dir.path(), "b"));
        let w = watcher().await;
        let (pa, _ra) = probe().await;
        let (pb, mut rb) = probe().await;
        std::fs::write(dir.path().join("f.txt"), "one").unwrap();
        watch(&w, "a", &ca, &pa).await.unwrap();
        let file = cb.resolve("f.txt").unwrap();
        cb.record_stamp(&file, b"one");
        watch(&w, "b", &cb, &pb).await.unwrap();
        only(&mut rb, &file).await;
    }

    #[tokio::test]
    async fn a_worktree_that_cannot_be_watched_is_reported_and_not_registered() {
        let base = tempfile::tempdir().unwrap();
        let gone = base.path().join("gone");
        std::fs::create_dir(&gone).unwrap();
        let ctx = context(&gone, "a");
        std::fs::remove_dir(&gone).unwrap();
        let w = watcher().await;
        let (p, _rx) = probe().await;

        let err = watch(&w, "a", &ctx, &p).await.unwrap_err();
        assert!(matches!(err, WatchError::Failed { .. }), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("watching worktree"), "{err}");
        assert!(err.contains("not told"), "{err}");
        assert!(roots(&w).await.is_empty());
    }

    #[test]
    fn the_watch_limit_message_says_how_to_raise_it() {
        let err = notify::Error::new(notify::ErrorKind::MaxFilesWatch);
        let msg = watch_failure(Path::new("/w/tree"), &err).to_string();
        assert!(
            msg.contains("/proc/sys/fs/inotify/max_user_watches"),
            "{msg}"
        );
        assert!(msg.contains("'/w/tree'"), "{msg}");
    }

    #[tokio::test]
    async fn a_loop_that_stopped_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let file = read_file(&ctx, "f.txt", "one");
        let w = watcher().await;
        let (p, _rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        p.stop_and_wait(None, None).await.unwrap();

        std::fs::write(&file, "two").unwrap();
        let deadline = tokio::time::Instant::now() + ARRIVAL;
        while !roots(&w).await.is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "dead loop kept");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn access_events_are_ignored_and_a_rescan_reports_every_read_file() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path(), "a");
        let a = read_file(&ctx, "a.txt", "1");
        let b = read_file(&ctx, "b.txt", "1");
        let w = watcher().await;
        let (p, mut rx) = probe().await;
        watch(&w, "a", &ctx, &p).await.unwrap();
        // Files read before the worktree was watched are checked once at registration.
        collect(&mut rx, &[&a, &b]).await;
        drain(&mut rx).await;

        let access = Event::new(EventKind::Access(AccessKind::Any)).add_path(a.clone());
        w.cast(WatcherMsg::Fs(Ok(access))).unwrap();
        let modify =
            Event::new(EventKind::Modify(ModifyKind::Data(DataChange::Any))).add_path(b.clone());
        w.cast(WatcherMsg::Fs(Ok(modify))).unwrap();
        only(&mut rx, &b).await;

        let rescan = Event::new(EventKind::Other).set_flag(Flag::Rescan);
        w.cast(WatcherMsg::Fs(Ok(rescan))).unwrap();
        collect(&mut rx, &[&a, &b]).await;
        // Errors are logged, never fatal.
        w.cast(WatcherMsg::Fs(Err(notify::Error::new(
            notify::ErrorKind::MaxFilesWatch,
        ))))
        .unwrap();
        assert_eq!(roots(&w).await, vec![ctx.root().to_path_buf()]);
    }
}
