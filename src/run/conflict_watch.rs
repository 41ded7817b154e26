//! Early conflict warnings (`conflict-warnings: on`, the default): while loops run, each
//! loop's worktree is compared with the other running loops' after every iteration, and two
//! loops whose work will not merge cleanly are both told, with the other loop's name and the
//! files, before either finishes.
//!
//! How: at each `iteration_ended` event the loop's worktree is snapshotted as a dangling
//! commit (`td_git::merge_tree::snapshot`: a temporary index, nothing of the loop touched)
//! and merged in memory with every other worktree's latest snapshot
//! (`git merge-tree --write-tree`, git 2.38 or newer; with an older git the feature is off
//! and the run says so once). A conflict is news to a pair of loops when it names a file
//! they were not warned about at their last comparison; then each gets a system alert
//! addressed to it alone (`conflict_predicted`, shown at its next model turn whatever its
//! subscriptions) and the run records a `conflict_predicted` event. The same files again
//! warn nobody; a pair whose conflict went away is warned again if it comes back.
//! An iteration whose validation passed ends its loop, so it is not compared; a loop is
//! forgotten as soon as its end is an event.
//!
//! Loops sharing a worktree (`worktree: shared:<group>` members, and `worktree: repo` loops,
//! which all work in the repository's checkout) are not compared with each other: they edit
//! the same files on disk. Loops that ended are no longer compared.
//!
//! Cost: all of it runs in one task of its own, one git command at a time, off the loops'
//! path (no loop waits for it). Changes coalesce: a worktree that changes while it is being
//! compared is compared once more afterwards, however many times it changed; a snapshot
//! equal to the last one compares nothing, and two snapshots of one HEAD that changed
//! different files (no deletion) are clean without running git
//! (`Taken::may_conflict_with`). Figures: `cargo bench --bench conflict_watch`.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use td_git::merge_tree::{self, Prediction, Snapshot, Taken};
use td_protocol::events::{EventKind, EventLog};
use td_runtime::coordinator::Notifier;

/// The event type of the alerts the loops get (and of nothing else).
pub const EVENT_TYPE: &str = "conflict_predicted";

/// How many files a warning names before saying "and N more".
const LISTED_FILES: usize = 20;

/// A conflict two loops were not yet warned about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The two loops, sorted.
    pub loops: [String; 2],
    /// The conflicting paths, sorted, as shown to a model.
    pub files: Vec<String>,
}

/// What the watch knows: the loops compared, each worktree's latest snapshot, and what each
/// pair of loops was last warned about. Its [`Comparer::changed`] is the whole comparison
/// (the task below only feeds it and delivers what it finds).
#[derive(Debug)]
pub struct Comparer {
    repo: PathBuf,
    /// Loop name → its worktree (real path; loops sharing one have the same).
    loops: BTreeMap<String, PathBuf>,
    /// Worktree → its latest snapshot.
    snapshots: BTreeMap<PathBuf, Arc<Taken>>,
    /// Pair of loops (sorted) → the files they were warned about, as of their last
    /// comparison.
    told: BTreeMap<(String, String), BTreeSet<String>>,
}

impl Comparer {
    /// Compares worktrees of the repository at `repo` (where `merge-tree` runs).
    pub fn new(repo: &Path) -> Self {
        Self {
            repo: repo.to_path_buf(),
            loops: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            told: BTreeMap::new(),
        }
    }

    /// Compares loop `name`, working in `dir`, from its next change on.
    pub fn watch(&mut self, name: &str, dir: &Path) {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        self.loops.insert(name.to_string(), dir);
    }

    /// Stops comparing loop `name` (it ended): forgets its pairs, and its worktree's
    /// snapshot when no other loop works there.
    pub fn forget(&mut self, name: &str) {
        let Some(dir) = self.loops.remove(name) else {
            return;
        };
        if !self.loops.values().any(|d| *d == dir) {
            self.snapshots.remove(&dir);
        }
        self.told.retain(|(a, b), _| a != name && b != name);
    }

    /// The worktree of loop `name`, if it is compared.
    pub fn dir_of(&self, name: &str) -> Option<&Path> {
        self.loops.get(name).map(PathBuf::as_path)
    }

    /// Snapshots the worktree `dir` and compares it with every other worktree's latest
    /// snapshot; returns the conflicts that are news to their pair of loops (and remembers
    /// them as told). Stops early, between git commands, once `stop` is set. A worktree
    /// that cannot be snapshotted now (mid-merge, a git error) is skipped until its next
    /// change; why is logged.
    pub async fn changed(&mut self, dir: &Path, stop: &AtomicBool) -> Vec<Found> {
        let here: Vec<String> = self.names_at(dir);
        if here.is_empty() || stop.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let taken = match merge_tree::snapshot(dir).await {
            Ok(Snapshot::Taken(taken)) => taken,
            Ok(Snapshot::Skipped { reason }) => {
                tracing::debug!("conflict warnings: {} skipped: {reason}", dir.display());
                return Vec::new();
            }
            Err(e) => {
                tracing::warn!("conflict warnings: cannot snapshot {}: {e}", dir.display());
                return Vec::new();
            }
        };
        if self
            .snapshots
            .get(dir)
            .is_some_and(|last| last.commit == taken.commit)
        {
            // Nothing changed since it was last compared.
            return Vec::new();
        }
        // A loop that ended while git ran: its worktree is not compared any more.
        if self.names_at(dir).is_empty() {
            return Vec::new();
        }
        let taken = Arc::new(taken);
        self.snapshots.insert(dir.to_path_buf(), taken.clone());
        let others: Vec<(PathBuf, Arc<Taken>)> = self
            .snapshots
            .iter()
            .filter(|(d, _)| d.as_path() != dir)
            .map(|(d, t)| (d.clone(), t.clone()))
            .collect();
        let mut found = Vec::new();
        for (other, theirs) in others {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            // Most pairs changed different files off the same HEAD: no git needed.
            let prediction = if taken.may_conflict_with(&theirs) {
                merge_tree::predict(&self.repo, &taken.commit, &theirs.commit).await
            } else {
                Ok(Prediction::Clean)
            };
            let files: BTreeSet<String> = match prediction {
                Ok(Prediction::Clean) => BTreeSet::new(),
                Ok(Prediction::Conflict { files }) => files.into_iter().collect(),
                Err(e) => {
                    tracing::warn!(
                        "conflict warnings: cannot compare {} with {}: {e}",
                        dir.display(),
                        other.display()
                    );
                    continue;
                }
            };
            // Read again after the await: loops may have ended meanwhile.
            let here = self.names_at(dir);
            for theirs in self.names_at(&other) {
                for mine in &here {
                    if let Some(f) = self.note(mine, &theirs, &files) {
                        found.push(f);
                    }
                }
            }
        }
        found
    }

    /// The loops compared that work in `dir`.
    fn names_at(&self, dir: &Path) -> Vec<String> {
        self.loops
            .iter()
            .filter(|(_, d)| d.as_path() == dir)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Remembers that loops `a` and `b` now conflict in `files` (none: they merge
    /// cleanly); returns the conflict when it names a file they were not warned about.
    fn note(&mut self, a: &str, b: &str, files: &BTreeSet<String>) -> Option<Found> {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        let key = (a.to_string(), b.to_string());
        if files.is_empty() {
            self.told.remove(&key);
            return None;
        }
        let before = self.told.insert(key, files.clone()).unwrap_or_default();
        files.iter().any(|f| !before.contains(f)).then(|| Found {
            loops: [a.to_string(), b.to_string()],
            files: files.iter().cloned().collect(),
        })
    }
}

/// What the task is told.
enum Msg {
    Watch { name: String, dir: PathBuf },
    Forget { name: String },
    Changed { name: String },
}

/// The running watch of a run: its task and the way to feed it. [`ConflictWatch::off`]
/// does nothing.
pub struct ConflictWatch {
    running: Option<Running>,
}

struct Running {
    tx: mpsc::UnboundedSender<Msg>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl ConflictWatch {
    /// A watch that compares nothing (`conflict-warnings: off`).
    pub fn off() -> Self {
        Self { running: None }
    }

    /// Starts watching the loops of the repository at `repo`: every `iteration_ended` in
    /// `events` of a watched loop queues its worktree, and conflicts are sent through
    /// `notifier` (the coordinator) and recorded in `events`. Off, with a warning on stderr, when the git
    /// on PATH is older than 2.38 or cannot be asked its version.
    pub async fn start(repo: &Path, events: &Arc<EventLog>, notifier: Notifier) -> Self {
        let (min_major, min_minor) = merge_tree::MIN_GIT;
        match merge_tree::git_version().await {
            Ok(v) if merge_tree::supports_prediction(v) => {}
            Ok((major, minor)) => {
                eprintln!(
                    "taskdaemon: warning: conflict warnings are off for this run: they need git {min_major}.{min_minor} or newer (`git merge-tree --write-tree`), and this git is {major}.{minor}; upgrade git, or set `conflict-warnings: off` in the config to silence this"
                );
                return Self::off();
            }
            Err(e) => {
                eprintln!("taskdaemon: warning: conflict warnings are off for this run: {e}");
                return Self::off();
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        // Weak: the log keeps its listeners for the whole run, and the task ends when the
        // last strong sender (ours) is dropped by `stop`.
        let weak = tx.downgrade();
        events.subscribe(move |e| {
            let msg = match &e.kind {
                // A passed validation ends the loop: nobody to warn.
                EventKind::IterationEnded {
                    loop_name,
                    validation_passed,
                    ..
                } if *validation_passed != Some(true) => Msg::Changed {
                    name: loop_name.clone(),
                },
                // Forgotten at once, not when the run gets to the loop's end: a loop that
                // ended reads no warning.
                EventKind::LoopCompleted { loop_name, .. }
                | EventKind::LoopFailed { loop_name, .. }
                | EventKind::LoopPaused { loop_name, .. }
                | EventKind::LoopStopped { loop_name } => Msg::Forget {
                    name: loop_name.clone(),
                },
                _ => return,
            };
            if let Some(tx) = weak.upgrade() {
                let _ = tx.send(msg);
            }
        });
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(work(
            Comparer::new(repo),
            rx,
            stop.clone(),
            events.clone(),
            notifier,
        ));
        Self {
            running: Some(Running { tx, stop, task }),
        }
    }

    /// Compares loop `name`, working in `dir`, from its next iteration's end on.
    pub fn watch(&self, name: &str, dir: &Path) {
        if let Some(r) = &self.running {
            let _ = r.tx.send(Msg::Watch {
                name: name.to_string(),
                dir: dir.to_path_buf(),
            });
        }
    }

    /// Stops comparing loop `name` (it ended).
    pub fn forget(&self, name: &str) {
        if let Some(r) = &self.running {
            let _ = r.tx.send(Msg::Forget {
                name: name.to_string(),
            });
        }
    }

    /// Ends the watch: the comparison in progress stops after its current git command (git
    /// is never killed midway) and nothing more is compared; returns once it stopped.
    pub async fn stop(self) {
        if let Some(r) = self.running {
            r.stop.store(true, Ordering::Relaxed);
            drop(r.tx);
            if let Err(e) = r.task.await {
                tracing::warn!("conflict warnings: the watch ended abnormally: {e}");
            }
        }
    }
}

/// The watch's task: takes what it is told, compares one changed worktree at a time (in the
/// order they changed), and delivers what it finds.
async fn work(
    mut comparer: Comparer,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    stop: Arc<AtomicBool>,
    events: Arc<EventLog>,
    notifier: Notifier,
) {
    let mut queue: VecDeque<PathBuf> = VecDeque::new();
    let mut queued: HashSet<PathBuf> = HashSet::new();
    loop {
        // Wait only when there is nothing to compare; take everything that came meanwhile.
        if queue.is_empty() {
            match rx.recv().await {
                Some(msg) => take(&mut comparer, msg, &mut queue, &mut queued),
                None => return,
            }
        }
        while let Ok(msg) = rx.try_recv() {
            take(&mut comparer, msg, &mut queue, &mut queued);
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Some(dir) = queue.pop_front() else {
            continue;
        };
        // Out of the queue before it is compared: a change during the comparison queues it
        // again, and it is compared once more afterwards.
        queued.remove(&dir);
        for found in comparer.changed(&dir, &stop).await {
            deliver(&found, &events, &notifier).await;
        }
    }
}

fn take(
    comparer: &mut Comparer,
    msg: Msg,
    queue: &mut VecDeque<PathBuf>,
    queued: &mut HashSet<PathBuf>,
) {
    match msg {
        Msg::Watch { name, dir } => comparer.watch(&name, &dir),
        Msg::Forget { name } => comparer.forget(&name),
        Msg::Changed { name } => {
            if let Some(dir) = comparer.dir_of(&name)
                && queued.insert(dir.to_path_buf())
            {
                queue.push_back(dir.to_path_buf());
            }
        }
    }
}

/// Tells both loops of `found`, then records it (once both alerts are in their inboxes),
/// unless neither could be told (both ended meanwhile).
async fn deliver(found: &Found, events: &EventLog, notifier: &Notifier) {
    let [a, b] = &found.loops;
    let mut told = false;
    for (me, other) in [(a, b), (b, a)] {
        let message = warning(other, &found.files);
        if notifier.notify(me, EVENT_TYPE, &message).await {
            told = true;
        } else {
            tracing::debug!("conflict warnings: loop {me} was not told (no longer running)");
        }
    }
    if told {
        events.record(EventKind::ConflictPredicted {
            loops: found.loops.to_vec(),
            files: found.files.clone(),
        });
    }
}

/// The alert a loop gets about its conflict with loop `other` in `files`.
pub fn warning(other: &str, files: &[String]) -> String {
    let mut shown: Vec<String> = files
        .iter()
        .take(LISTED_FILES)
        .map(|f| format!("`{f}`"))
        .collect();
    if files.len() > LISTED_FILES {
        shown.push(format!("and {} more", files.len() - LISTED_FILES));
    }
    format!(
        "your work and loop `{other}`'s will conflict when merged, in {}: you both changed \
         the same lines (or one of you changed a file the other deleted or added \
         differently). Nothing is merged yet. Agree with `{other}` on who changes what \
         (query_loop, share_data), or keep your changes out of these files, before either \
         of you finishes.",
        shown.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(files: &[&str]) -> BTreeSet<String> {
        files.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn a_pair_is_told_once_per_new_file_and_again_after_its_conflict_went_away() {
        let mut c = Comparer::new(Path::new("/repo"));
        let found = c.note("two", "one", &set(&["a.rs"]));
        assert_eq!(
            found,
            Some(Found {
                loops: ["one".into(), "two".into()],
                files: vec!["a.rs".into()]
            }),
            "sorted pair"
        );
        assert_eq!(c.note("one", "two", &set(&["a.rs"])), None, "same files");
        assert_eq!(c.note("two", "one", &set(&["a.rs"])), None, "either order");
        let more = c.note("one", "two", &set(&["a.rs", "b.rs"])).unwrap();
        assert_eq!(
            more.files,
            vec!["a.rs", "b.rs"],
            "a new file: all are named"
        );
        assert_eq!(c.note("one", "two", &set(&["b.rs"])), None, "fewer files");
        assert!(
            c.note("one", "two", &set(&["a.rs", "b.rs"])).is_some(),
            "a.rs is back"
        );
        assert_eq!(c.note("one", "two", &set(&[])), None, "resolved");
        assert!(
            c.note("one", "two", &set(&["a.rs", "b.rs"])).is_some(),
            "conflicts again"
        );
        // Another pair has its own memory.
        assert!(c.note("one", "three", &set(&["a.rs"])).is_some());
    }

    #[test]
    fn a_loop_that_ended_is_forgotten_with_its_pairs_and_its_worktree_when_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let (own, shared) = (tmp.path().join("own"), tmp.path().join("shared"));
        std::fs::create_dir_all(&own).unwrap();
        std::fs::create_dir_all(&shared).unwrap();
        let mut c = Comparer::new(tmp.path());
        c.watch("a", &own);
        c.watch("s1", &shared);
        c.watch("s2", &shared);
        let (own, shared) = (own.canonicalize().unwrap(), shared.canonicalize().unwrap());
        c.snapshots
            .insert(own.clone(), Arc::new(Taken::unchanged("c1")));
        c.snapshots
            .insert(shared.clone(), Arc::new(Taken::unchanged("c2")));
        assert!(c.note("a", "s1", &set(&["f"])).is_some());
        assert_eq!(
            c.names_at(&shared),
            ["s1", "s2"],
            "members share a worktree"
        );

        c.forget("s1");
        assert!(c.snapshots.contains_key(&shared), "s2 still works there");
        assert!(c.told.is_empty());
        c.forget("s2");
        assert!(!c.snapshots.contains_key(&shared));
        c.forget("a");
        assert!(c.snapshots.is_empty() && c.loops.is_empty());
        c.forget("never-watched");
    }

    #[test]
    fn the_warning_names_the_other_loop_and_at_most_twenty_files() {
        let text = warning("two", &["shared.txt".to_string()]);
        assert!(
            text.contains("loop `two`'s") && text.contains("`shared.txt`"),
            "{text}"
        );
        let many: Vec<String> = (0..25).map(|i| format!("f{i:02}")).collect();
        let text = warning("x", &many);
        assert!(text.contains("`f19`, and 5 more"), "{text}");
        assert!(!text.contains("f20"), "{text}");
    }
}
