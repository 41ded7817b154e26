//! The Watcher actor: ONE `notify` watcher over every loop's worktree, turning file-system
//! events into `LoopMsg::FileChanged` for each loop whose worktree holds the path and that
//! has read the file (holds a read stamp for it).
//!
//! Why it is shaped this way:
//! - One OS watcher for the whole daemon. Linux allows 128 inotify instances per user by
//!   default; an instance per worktree would fail long before thousands of loops.
//! - Each distinct worktree root is watched once, recursively, reference-counted by the loops
//!   registered on it, and unwatched when its last loop leaves. A root nested inside another
//!   watched root is covered by the outer watch and gets no watch of its own: `notify` keys
//!   watches by path and unwatching a directory drops every watch beneath it, so overlapping
//!   watches would silently cut each other off. When the covering set changes (a root
//!   appears around watched ones, or an outer root leaves), the old watches are removed
//!   before the new ones are added; events in that instant can be missed.
//! - Only stamped paths are forwarded, so build output and other churn never reach a loop.
//!   Anything under a `.git` directory of the worktree is ignored.
//! - The watcher never reads files: the loop compares content when it handles
//!   `FileChanged` (`ToolContext::note_outside_change`), so a touch that changes nothing is
//!   not a change. Duplicate notices (one write can raise several events) are therefore cheap.
//! - A failed watch (e.g. the inotify watch limit) is answered on the optional reply port of
//!   `Watch`, so the caller can tell its user; the loop is then not registered. Failures that
//!   happen later inside `notify` (a new directory beyond the limit) can only be logged.
//! - Paths: roots come from `ToolContext::root()`, which is canonical, and are watched as
//!   such, so `notify` reports canonical paths — the same form `ToolContext::resolve` gives
//!   the stamps. Symlinks inside worktrees are not followed (their targets are either outside
//!   the sandbox or already watched under their real path).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::event::{ModifyKind, RemoveKind};
use notify::{Config, Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::actors::messages::LoopMsg;
use crate::context::{ToolContext, lock};

/// Messages the watcher handles.
pub enum WatcherMsg {
    /// Start telling `target` about changes to files `ctx` has read under `ctx.root()`.
    ///
    /// Registering a name again replaces the earlier registration. When `reply` is given it
    /// receives `Ok(())` once the worktree is watched (changes made after the reply are
    /// seen), or a message saying why watching failed; in that case the loop is not
    /// registered.
    Watch {
        /// The loop's name (its exec id); the key for `Unwatch`.
        loop_name: String,
        /// The loop's context: its root and its read stamps.
        ctx: Arc<ToolContext>,
        /// Where `LoopMsg::FileChanged` goes.
        target: ActorRef<LoopMsg>,
        /// Optional answer: whether watching the worktree worked.
        reply: Option<RpcReplyPort<Result<(), String>>>,
    },
    /// Stop telling that loop. Unknown names are ignored.
    Unwatch {
        /// The name given to `Watch`.
        loop_name: String,
    },
    /// The worktree roots that hold an OS watch now, sorted (for diagnostics and tests).
    WatchedRoots(RpcReplyPort<Vec<PathBuf>>),
    /// Internal: an event from the notify callback.
    Fs(notify::Result<Event>),
}

/// The watcher actor (spawn it with `()` as arguments).
pub struct Watcher;

/// What the watcher knows: the OS watcher, the registered loops and the watched roots.
pub struct WatcherState {
    /// Shared with blocking tasks: `notify` calls wait for its event thread (and walk the
    /// whole tree on a recursive watch), which must not stall an async worker thread.
    os: Arc<Mutex<RecommendedWatcher>>,
    loops: HashMap<String, Registration>,
    /// Loops per worktree root: the reference count of each root.
    roots: HashMap<PathBuf, BTreeSet<String>>,
    /// Roots with an OS watch: the outermost of `roots` (see the module notes).
    watched: BTreeSet<PathBuf>,
    /// The watch-limit warning is given once; a build creating directories would repeat it.
    limit_warned: bool,
}

struct Registration {
    root: PathBuf,
    ctx: Arc<ToolContext>,
    target: ActorRef<LoopMsg>,
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
            watched: BTreeSet::new(),
            limit_warned: false,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<WatcherMsg>,
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
                let outcome = state.register(loop_name, ctx, target).await;
                if let Err(message) = &outcome {
                    tracing::warn!("{message}");
                }
                if let Some(reply) = reply {
                    // The caller may have given up waiting; nothing to do then.
                    let _ = reply.send(outcome);
                }
            }
            WatcherMsg::Unwatch { loop_name } => state.unregister(&loop_name).await,
            WatcherMsg::WatchedRoots(reply) => {
                let _ = reply.send(state.watched.iter().cloned().collect());
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
        loop_name: String,
        ctx: Arc<ToolContext>,
        target: ActorRef<LoopMsg>,
    ) -> Result<(), String> {
        let root = ctx.root().to_path_buf();
        if let Some(existing) = self.loops.get_mut(&loop_name)
            && existing.root == root
        {
            existing.ctx = ctx;
            existing.target = target;
            return Ok(());
        }
        self.unregister(&loop_name).await;

        if !self.is_covered(&root) {
            // Watched roots inside the new one must lose their own watches first: notify
            // would otherwise drop the new root's watches beneath them when they leave.
            let inner: Vec<PathBuf> = self
                .watched
                .iter()
                .filter(|w| w.starts_with(&root))
                .cloned()
                .collect();
            for w in &inner {
                self.watched.remove(w);
                self.os_unwatch(w).await;
            }
            if let Err(err) = self.os_watch(&root).await {
                for w in inner {
                    match self.os_watch(&w).await {
                        Ok(()) => {
                            self.watched.insert(w);
                        }
                        Err(e) => tracing::warn!("{}", watch_failure(&w, &e)),
                    }
                }
                return Err(watch_failure(&root, &err));
            }
            self.watched.insert(root.clone());
        }
        self.roots
            .entry(root.clone())
            .or_default()
            .insert(loop_name.clone());
        self.loops
            .insert(loop_name, Registration { root, ctx, target });
        Ok(())
    }

    async fn unregister(&mut self, loop_name: &str) {
        let Some(reg) = self.loops.remove(loop_name) else {
            return;
        };
        if let Some(names) = self.roots.get_mut(&reg.root) {
            names.remove(loop_name);
            if !names.is_empty() {
                return;
            }
            self.roots.remove(&reg.root);
        }
        if !self.watched.remove(&reg.root) {
            // Covered by an outer root, which stays.
            return;
        }
        self.os_unwatch(&reg.root).await;
        // Roots nested in the one just dropped lost their watches with it; watch the
        // outermost of them again (shallowest first, so deeper ones find themselves covered).
        let mut orphans: Vec<PathBuf> = self
            .roots
            .keys()
            .filter(|r| r.starts_with(&reg.root))
            .cloned()
            .collect();
        orphans.sort_by_key(|r| r.components().count());
        for r in orphans {
            if self.is_covered(&r) {
                continue;
            }
            match self.os_watch(&r).await {
                Ok(()) => {
                    self.watched.insert(r);
                }
                Err(e) => tracing::warn!("{}", watch_failure(&r, &e)),
            }
        }
    }

    /// Whether `root` or a directory above it already has an OS watch.
    fn is_covered(&self, root: &Path) -> bool {
        root.ancestors().any(|a| self.watched.contains(a))
    }

    async fn on_event(&mut self, event: &Event) {
        if event.need_rescan() {
            // The kernel queue overflowed: events were lost, so any read file may have
            // changed. The loops compare content, so telling them about all is only work.
            self.tell_all_stamped().await;
            return;
        }
        // A directory that vanishes (removed, or renamed away) takes the files read under it
        // along without an event of their own.
        let whole_subtree = match event.kind {
            EventKind::Access(_) | EventKind::Other => return,
            EventKind::Remove(RemoveKind::File) => false,
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_)) => true,
            EventKind::Any | EventKind::Create(_) | EventKind::Modify(_) => false,
        };
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
            if !self.limit_warned {
                self.limit_warned = true;
                tracing::warn!(
                    "file watcher: the inotify watch limit is reached, so new directories in \
                     worktrees are not watched and loops may miss outside changes there. \
                     Raise /proc/sys/fs/inotify/max_user_watches (e.g. \
                     `echo 524288 | sudo tee /proc/sys/fs/inotify/max_user_watches`)."
                );
            }
        } else {
            tracing::warn!("file watcher error: {err}");
        }
    }

    async fn os_watch(&self, root: &Path) -> notify::Result<()> {
        let root_owned = root.to_path_buf();
        let result = self
            .with_os(move |w| w.watch(&root_owned, RecursiveMode::Recursive))
            .await;
        if result.is_err() {
            // A recursive watch that failed part-way keeps the directories it had reached.
            let root_owned = root.to_path_buf();
            let _ = self.with_os(move |w| w.unwatch(&root_owned)).await;
        }
        result
    }

    async fn os_unwatch(&self, root: &Path) {
        let root_owned = root.to_path_buf();
        if let Err(e) = self.with_os(move |w| w.unwatch(&root_owned)).await {
            // Typically the worktree was deleted and notify already dropped its watch.
            tracing::debug!("unwatching '{}': {e}", root.display());
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
fn watch_failure(root: &Path, err: &notify::Error) -> String {
    let consequence = "until this is fixed the loop is not told when something else changes \
                       files it has read";
    match err.kind {
        notify::ErrorKind::MaxFilesWatch => format!(
            "watching worktree '{}' for outside changes failed: the inotify watch limit is \
             reached. Raise /proc/sys/fs/inotify/max_user_watches (e.g. \
             `echo 524288 | sudo tee /proc/sys/fs/inotify/max_user_watches`) or run fewer \
             loops at once; {consequence}.",
            root.display()
        ),
        _ => format!(
            "watching worktree '{}' for outside changes failed: {err}; {consequence}.",
            root.display()
        ),
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
    ) -> Result<(), String> {
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

        // Outer first: the inner root is covered and gets no watch of its own.
        watch(&w, "outer", &outer, &po).await.unwrap();
        watch(&w, "inner", &inner, &pi).await.unwrap();
        assert_eq!(roots(&w).await, vec![outer.root().to_path_buf()]);
        std::fs::write(&file, "2").unwrap();
        only(&mut ri, &file).await;
        // The outer loop leaves: the inner root is watched again by itself.
        unwatch("outer");
        assert_eq!(roots(&w).await, vec![inner.root().to_path_buf()]);
        std::fs::write(&file, "3").unwrap();
        only(&mut ri, &file).await;

        // Outer after inner: the inner watch gives way to the outer one...
        watch(&w, "outer", &outer, &po).await.unwrap();
        assert_eq!(roots(&w).await, vec![outer.root().to_path_buf()]);
        std::fs::write(&file, "4").unwrap();
        only(&mut ri, &file).await;
        // ...and comes back when the outer loop leaves again.
        unwatch("outer");
        assert_eq!(roots(&w).await, vec![inner.root().to_path_buf()]);
        std::fs::write(&file, "5").unwrap();
        only(&mut ri, &file).await;
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
        assert!(err.contains("watching worktree"), "{err}");
        assert!(err.contains("not told"), "{err}");
        assert!(roots(&w).await.is_empty());
    }

    #[test]
    fn the_watch_limit_message_says_how_to_raise_it() {
        let err = notify::Error::new(notify::ErrorKind::MaxFilesWatch);
        let msg = watch_failure(Path::new("/w/tree"), &err);
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
