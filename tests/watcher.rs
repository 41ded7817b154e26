//! Kernel-level checks of the Watcher actor on Linux: one inotify instance however many
//! worktrees, an inotify watch only for the directories that lead to files loops have read,
//! and every watch released when the last loop that needs it leaves.
//!
//! These count the process's inotify file descriptors and watches in /proc, so they live in
//! their own test binary (no other test creates watchers here) and run one at a time.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use td_runtime::messages::LoopMsg;
use td_runtime::watcher::{Watcher, WatcherMsg};
use td_toolkit::context::ToolContext;
use tokio::sync::mpsc;

/// The counts below are per process: the tests must not overlap.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// The process's inotify file descriptors.
fn inotify_fds() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|t| t == Path::new("anon_inode:inotify"))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Inotify watches held by the whole process (one `inotify wd:` line each in fdinfo).
fn inotify_watches() -> usize {
    inotify_fds()
        .iter()
        .filter_map(|fd| std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok())
        .map(|info| {
            info.lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count()
        })
        .sum()
}

async fn watch(
    w: &ActorRef<WatcherMsg>,
    name: &str,
    ctx: &Arc<ToolContext>,
    t: &ActorRef<LoopMsg>,
) {
    ractor::call!(w, |reply| WatcherMsg::Watch {
        loop_name: name.to_string(),
        ctx: Arc::clone(ctx),
        target: t.clone(),
        reply: Some(reply),
    })
    .unwrap()
    .unwrap();
}

fn unwatch(w: &ActorRef<WatcherMsg>, name: &str) {
    w.cast(WatcherMsg::Unwatch {
        loop_name: name.to_string(),
    })
    .unwrap();
}

/// Also a barrier: the watcher has handled every message sent before.
async fn roots(w: &ActorRef<WatcherMsg>) -> Vec<PathBuf> {
    ractor::call!(w, WatcherMsg::WatchedRoots).unwrap()
}

#[tokio::test]
async fn a_hundred_worktrees_share_one_inotify_instance() {
    let _serial = SERIAL.lock().await;
    let base = tempfile::tempdir().unwrap();
    let contexts: Vec<Arc<ToolContext>> = (0..100)
        .map(|i| {
            let dir = base.path().join(format!("wt{i:03}"));
            std::fs::create_dir_all(dir.join("src")).unwrap();
            Arc::new(ToolContext::new(&dir, format!("loop{i}")).unwrap())
        })
        .collect();
    let (fds_before, watches_before) = (inotify_fds().len(), inotify_watches());

    let (w, _) = Actor::spawn(None, Watcher, ()).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (probe, _) = Actor::spawn(None, Probe, tx).await.unwrap();
    for (i, ctx) in contexts.iter().enumerate() {
        watch(&w, &format!("loop{i}"), ctx, &probe).await;
    }
    assert_eq!(roots(&w).await.len(), 100);
    assert!(
        inotify_fds().len() <= fds_before + 1,
        "more than one inotify instance for 100 worktrees"
    );
    // One watch per worktree (its root: nothing has been read in src yet), all on that one
    // instance.
    assert_eq!(inotify_watches(), watches_before + 100);

    // The shared instance serves every worktree.
    let file = contexts[57].resolve("src/lib.rs").unwrap();
    std::fs::write(&file, "one").unwrap();
    contexts[57].record_stamp(&file, b"one");
    std::fs::write(&file, "two").unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(got.unwrap().unwrap(), file);
    assert_eq!(
        inotify_watches(),
        watches_before + 101,
        "and src of the one read"
    );

    for i in 0..100 {
        unwatch(&w, &format!("loop{i}"));
    }
    assert!(roots(&w).await.is_empty());
    assert_eq!(inotify_watches(), watches_before, "watches left behind");

    // notify closes the instance on its own thread shortly after the watcher is dropped.
    w.stop_and_wait(None, None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while inotify_fds().len() > fds_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "instance not closed on stop"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_shared_worktree_keeps_its_watches_until_its_last_loop_leaves() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
    for i in 0..20 {
        std::fs::create_dir_all(dir.path().join(format!("target/debug/d{i}"))).unwrap();
    }
    std::fs::write(dir.path().join("a/b/f.txt"), "one").unwrap();
    let first = Arc::new(ToolContext::new(dir.path(), "first").unwrap());
    let second = Arc::new(ToolContext::new(dir.path(), "second").unwrap());
    let file = first.resolve("a/b/f.txt").unwrap();
    let (w, _) = Actor::spawn(None, Watcher, ()).await.unwrap();
    let (tx, _rx) = mpsc::unbounded_channel();
    let (probe, _) = Actor::spawn(None, Probe, tx).await.unwrap();
    let baseline = inotify_watches();

    watch(&w, "first", &first, &probe).await;
    assert_eq!(
        inotify_watches(),
        baseline + 1,
        "the root alone, not target/"
    );
    first.record_stamp(&file, b"one");
    roots(&w).await;
    let with_one = inotify_watches();
    assert_eq!(with_one, baseline + 3, "root, a and a/b");
    watch(&w, "second", &second, &probe).await;
    second.record_stamp(&file, b"one");
    roots(&w).await;
    assert_eq!(
        inotify_watches(),
        with_one,
        "each directory is watched once"
    );

    unwatch(&w, "first");
    roots(&w).await;
    assert_eq!(
        inotify_watches(),
        with_one,
        "still watched for the second loop"
    );
    unwatch(&w, "second");
    roots(&w).await;
    assert_eq!(inotify_watches(), baseline, "released with the last loop");
    w.stop_and_wait(None, None).await.unwrap();
}
