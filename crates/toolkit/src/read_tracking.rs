//! Read tracking of one loop: which bytes the loop last saw of each file (its stamps), which
//! of those an outside change dropped, which writes in flight are the loop's own, the
//! indexes of large files read in full, and who is told about each new stamp (the file
//! watcher).
//!
//! It answers the question every edit asks — "is this file still what the loop read?" — and
//! the one every model turn asks — "what changed under the loop since it read it?". The
//! stamps and everything derived from them sit behind one lock, so that a read, a write and
//! an outside change of the same path are seen in one order; the observer sits apart because
//! it is called with no lock held.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::read_index::ReadIndex;
use crate::stamp::Stamp;
use crate::worktree_fs::WorktreeFs;
use crate::worktree_fs::replace::stamp_of_open;
use td_base::sync::lock;

/// How many large-file indexes a loop keeps (see [`ReadTracking::keep_read_index`]).
const MAX_READ_INDEXES: usize = 16;

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

/// Called with the path of each new stamp: one for a path the tracking held no stamp for.
pub type StampObserver = Arc<dyn Fn(&Path) + Send + Sync>;

/// What is tracked, under one lock.
#[derive(Default)]
struct Tracked {
    stamps: HashMap<PathBuf, Stamp>,
    /// Paths whose stamp an outside change dropped: an edit is refused as stale, not as
    /// "never read", so the model learns what happened.
    dropped: HashSet<PathBuf>,
    /// Paths the loop is writing right now: a change event for them is the loop's own.
    writing: HashSet<PathBuf>,
    /// Dropped paths not yet reported to the model (in the order they were dropped).
    changed_since_read: Vec<PathBuf>,
    /// Indexes of large files read in full (see `read_file`), so that reading another
    /// window of an unchanged file reads only that window.
    read_indexes: HashMap<PathBuf, Arc<ReadIndex>>,
}

/// The read tracking of one loop (see the module docs). Paths are the real paths the
/// context resolved; files are re-read only through the worktree's handle.
pub struct ReadTracking {
    /// The worktree the paths lie in: an outside change is checked by opening the file
    /// beneath its root.
    files: Arc<WorktreeFs>,
    tracked: Mutex<Tracked>,
    /// Told about every path that starts holding a stamp (see `observe_stamps`).
    observer: Mutex<Option<StampObserver>>,
}

impl std::fmt::Debug for ReadTracking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tracked = lock(&self.tracked);
        f.debug_struct("ReadTracking")
            .field("stamps", &tracked.stamps.len())
            .field("dropped", &tracked.dropped.len())
            .field("writing", &tracked.writing.len())
            .finish_non_exhaustive()
    }
}

impl ReadTracking {
    /// Tracking for files beneath `files`' root, with nothing read yet.
    pub fn new(files: Arc<WorktreeFs>) -> Self {
        Self {
            files,
            tracked: Mutex::new(Tracked::default()),
            observer: Mutex::new(None),
        }
    }

    /// Records that the loop saw (or wrote) exactly `content` at `path`.
    pub fn record_stamp(&self, path: &Path, content: &[u8]) {
        self.record_stamp_hash(path, Stamp::of(content));
    }

    /// Records a stamp computed elsewhere (e.g. hashed while streaming a file too large to
    /// hold in memory); the same as `record_stamp` with the bytes it was computed from.
    pub fn record_stamp_hash(&self, path: &Path, stamp: Stamp) {
        let new = {
            let mut tracked = lock(&self.tracked);
            tracked.dropped.remove(path);
            tracked.stamps.insert(path.to_path_buf(), stamp).is_none()
        };
        if new {
            // Cloned out of the lock: the observer may take its time (it only enqueues now).
            let observer = lock(&self.observer).clone();
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
        *lock(&self.observer) = observer;
    }

    /// Records the loop's own coming write of `content` at `path` before it happens and
    /// returns the stamp it replaced: the watcher may report the write before the tool
    /// returns, and the loop must then recognise those bytes as its own. Give the returned
    /// value to [`ReadTracking::undo_write_stamp`] if the write fails.
    ///
    /// Until [`ReadTracking::finish_own_write`] (or `undo_write_stamp`), change notices for
    /// the path are the loop's own and are ignored: a notice read while the bytes are half
    /// written must not look like somebody else's change.
    pub fn stamp_own_write(&self, path: &Path, content: &[u8]) -> Option<Stamp> {
        let previous = {
            let mut tracked = lock(&self.tracked);
            tracked.writing.insert(path.to_path_buf());
            tracked.stamps.get(path).copied()
        };
        self.record_stamp_hash(path, Stamp::of(content));
        previous
    }

    /// The loop's own write of `path` is complete.
    pub fn finish_own_write(&self, path: &Path) {
        lock(&self.tracked).writing.remove(path);
    }

    /// Puts back the stamp that [`ReadTracking::stamp_own_write`] replaced (the write
    /// failed), and ends the own-write window.
    pub fn undo_write_stamp(&self, path: &Path, previous: Option<Stamp>) {
        let mut tracked = lock(&self.tracked);
        match previous {
            Some(stamp) => tracked.stamps.insert(path.to_path_buf(), stamp),
            None => tracked.stamps.remove(path),
        };
        tracked.writing.remove(path);
    }

    /// The stamp held for `path`, if any.
    pub fn stamp(&self, path: &Path) -> Option<Stamp> {
        lock(&self.tracked).stamps.get(path).copied()
    }

    /// Paths this loop holds a stamp for (what a file watcher needs to care about).
    pub fn stamped_paths(&self) -> Vec<PathBuf> {
        lock(&self.tracked).stamps.keys().cloned().collect()
    }

    /// Whether `path` currently holds what the loop last saw.
    pub fn check_stamp(&self, path: &Path, current_content: &[u8]) -> StampCheck {
        let tracked = lock(&self.tracked);
        match tracked.stamps.get(path) {
            None if tracked.dropped.contains(path) => StampCheck::Stale,
            None => StampCheck::NeverRead,
            Some(s) if *s == Stamp::of(current_content) => StampCheck::Current,
            Some(_) => StampCheck::Stale,
        }
    }

    /// What a stamp check of `path` says before the file is read: `Some(NeverRead)` or
    /// `Some(Stale)` when the loop holds no stamp for it (an edit is refused without reading
    /// a byte), `None` when the content must be compared.
    pub fn check_without_content(&self, path: &Path) -> Option<StampCheck> {
        let tracked = lock(&self.tracked);
        if tracked.stamps.contains_key(path) {
            None
        } else if tracked.dropped.contains(path) {
            Some(StampCheck::Stale)
        } else {
            Some(StampCheck::NeverRead)
        }
    }

    /// The index kept for `path` by an earlier full read, if the loop still holds the stamp
    /// that read recorded (an own write, a new read or an outside change replaces or drops
    /// the stamp, and so retires the index). `read_file` also checks the file's identity.
    pub fn read_index(&self, path: &Path) -> Option<Arc<ReadIndex>> {
        let tracked = lock(&self.tracked);
        let index = tracked.read_indexes.get(path)?;
        (tracked.stamps.get(path) == Some(index.stamp())).then(|| Arc::clone(index))
    }

    /// Keeps the index of a large file just read in full. A loop reads few large files; past
    /// `MAX_READ_INDEXES` the kept ones are dropped and collecting starts over (an index is
    /// only a shortcut: without it a read makes a full pass).
    pub fn keep_read_index(&self, path: &Path, index: Arc<ReadIndex>) {
        let indexes = &mut lock(&self.tracked).read_indexes;
        if indexes.len() >= MAX_READ_INDEXES && !indexes.contains_key(path) {
            indexes.clear();
        }
        indexes.insert(path.to_path_buf(), index);
    }

    /// Called when something outside the loop may have changed `path`: drops the stamp if
    /// the content on disk really differs (a touch that changes nothing is not a change) and
    /// remembers the path for the next model turn. Returns whether the stamp was dropped.
    ///
    /// Reads the whole file when it holds a stamp: call it off the async threads.
    pub fn note_outside_change(&self, path: &Path) -> bool {
        let stamp = {
            let tracked = lock(&self.tracked);
            if tracked.writing.contains(path) {
                return false;
            }
            let Some(stamp) = tracked.stamps.get(path).copied() else {
                return false;
            };
            stamp
        };
        // Hashed with no lock held (the file may be large). Opened beneath the root and
        // non-blocking: a FIFO or symlink swapped in cannot hang or mislead the check (either
        // counts as a change).
        let now = self
            .files
            .open_named_file(path)
            .ok()
            .and_then(|f| stamp_of_open(&f.file).ok());
        if now == Some(stamp) {
            return false;
        }
        let mut tracked = lock(&self.tracked);
        // A read or write of the new content may have replaced the stamp meanwhile.
        if tracked.stamps.get(path) != Some(&stamp) {
            return false;
        }
        tracked.stamps.remove(path);
        tracked.dropped.insert(path.to_path_buf());
        if !tracked.changed_since_read.iter().any(|p| p == path) {
            tracked.changed_since_read.push(path.to_path_buf());
        }
        true
    }

    /// Paths whose stamp was dropped since the last call (each reported once).
    pub fn take_changed_since_read(&self) -> Vec<PathBuf> {
        std::mem::take(&mut lock(&self.tracked).changed_since_read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracking(dir: &Path) -> (PathBuf, ReadTracking) {
        let root = dir.canonicalize().unwrap();
        let files = Arc::new(WorktreeFs::new(&root).unwrap());
        (root, ReadTracking::new(files))
    }

    #[test]
    fn an_outside_change_to_a_large_file_is_told_from_a_touch() {
        let dir = tempfile::tempdir().unwrap();
        let (root, reads) = tracking(dir.path());
        let p = root.join("big.log");
        // Several of stamp_of_open's chunks, and a last one that is not full.
        let content: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&p, &content).unwrap();
        let opened = reads.files.open_file(&p).unwrap();
        assert_eq!(stamp_of_open(&opened.file).unwrap(), Stamp::of(&content));
        reads.record_stamp(&p, &content);
        std::fs::write(&p, &content).unwrap();
        assert!(!reads.note_outside_change(&p), "same bytes: no change");
        let mut changed = content.clone();
        changed[250_000] = b'!';
        std::fs::write(&p, &changed).unwrap();
        assert!(reads.note_outside_change(&p));
        assert_eq!(reads.check_stamp(&p, &changed), StampCheck::Stale);
        // Gone entirely is a change too.
        reads.record_stamp(&p, &changed);
        std::fs::remove_file(&p).unwrap();
        assert!(reads.note_outside_change(&p));
    }

    #[test]
    fn stamps_track_content_not_time() {
        let dir = tempfile::tempdir().unwrap();
        let (root, reads) = tracking(dir.path());
        let p = root.join("a.txt");
        std::fs::write(&p, "one").unwrap();
        assert_eq!(reads.check_stamp(&p, b"one"), StampCheck::NeverRead);
        assert_eq!(reads.check_without_content(&p), Some(StampCheck::NeverRead));
        reads.record_stamp(&p, b"one");
        assert_eq!(reads.check_without_content(&p), None);
        assert_eq!(reads.check_stamp(&p, b"one"), StampCheck::Current);
        assert_eq!(reads.check_stamp(&p, b"two"), StampCheck::Stale);
        // A touch that leaves the bytes alone is not a change.
        std::fs::write(&p, "one").unwrap();
        assert!(!reads.note_outside_change(&p));
        std::fs::write(&p, "two").unwrap();
        assert!(reads.note_outside_change(&p));
        // The stamp is gone, and an edit is told why: the file changed.
        assert_eq!(reads.stamp(&p), None);
        assert_eq!(reads.check_stamp(&p, b"two"), StampCheck::Stale);
        assert_eq!(reads.check_without_content(&p), Some(StampCheck::Stale));
        reads.record_stamp(&p, b"two");
        assert_eq!(reads.check_stamp(&p, b"two"), StampCheck::Current);
        assert_eq!(reads.take_changed_since_read(), vec![p.clone()]);
        assert!(reads.take_changed_since_read().is_empty());
    }

    #[test]
    fn the_loops_own_write_in_progress_is_not_an_outside_change() {
        let dir = tempfile::tempdir().unwrap();
        let (root, reads) = tracking(dir.path());
        let p = root.join("a.txt");
        std::fs::write(&p, "old").unwrap();
        reads.record_stamp(&p, b"old");
        let previous = reads.stamp_own_write(&p, b"new content");
        assert_eq!(previous, Some(Stamp::of(b"old")));
        // Half written: a notice now must not drop the stamp.
        std::fs::write(&p, "new").unwrap();
        assert!(!reads.note_outside_change(&p));
        std::fs::write(&p, "new content").unwrap();
        reads.finish_own_write(&p);
        assert!(!reads.note_outside_change(&p));
        assert_eq!(reads.check_stamp(&p, b"new content"), StampCheck::Current);
        // A failed write puts the old stamp back and ends the "own write" window.
        let prev2 = reads.stamp_own_write(&p, b"never written");
        reads.undo_write_stamp(&p, prev2);
        assert_eq!(reads.check_stamp(&p, b"new content"), StampCheck::Current);
        std::fs::write(&p, "someone else").unwrap();
        assert!(reads.note_outside_change(&p));
    }

    #[test]
    fn the_observer_hears_of_new_stamps_only() {
        let dir = tempfile::tempdir().unwrap();
        let (root, reads) = tracking(dir.path());
        let heard = Arc::new(Mutex::new(Vec::<PathBuf>::new()));
        let sink = Arc::clone(&heard);
        reads.observe_stamps(Some(Arc::new(move |p: &Path| {
            lock(&sink).push(p.to_path_buf())
        })));
        let p = root.join("a.txt");
        std::fs::write(&p, "one").unwrap();
        reads.record_stamp(&p, b"one");
        reads.record_stamp(&p, b"one again");
        assert_eq!(
            *lock(&heard),
            vec![p.clone()],
            "a replaced stamp is not new"
        );
        std::fs::write(&p, "two").unwrap();
        assert!(reads.note_outside_change(&p));
        reads.record_stamp(&p, b"two");
        assert_eq!(lock(&heard).len(), 2, "a stamp after a drop is new");
        reads.observe_stamps(None);
        reads.record_stamp(&root.join("b.txt"), b"b");
        assert_eq!(lock(&heard).len(), 2, "no observer, nobody told");
        assert_eq!(reads.stamped_paths().len(), 2);
    }

    #[test]
    fn a_read_index_lives_as_long_as_its_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let (root, reads) = tracking(dir.path());
        let p = root.join("big.txt");
        std::fs::write(&p, "x\n").unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        let index = |content: &[u8]| {
            Arc::new(ReadIndex {
                identity: crate::read_index::FileIdentity::of(&meta),
                stamp: Stamp::of(content),
                newlines: 1,
                last: Some(b'\n'),
                checkpoints: vec![(0, 0)],
            })
        };
        reads.keep_read_index(&p, index(b"x\n"));
        assert!(reads.read_index(&p).is_none(), "no stamp held: no index");
        reads.record_stamp(&p, b"x\n");
        assert!(reads.read_index(&p).is_some());
        let _ = reads.stamp_own_write(&p, b"y\n");
        reads.finish_own_write(&p);
        assert!(reads.read_index(&p).is_none(), "an own write retires it");
        // Past the limit, the kept indexes are dropped and collecting starts over.
        reads.record_stamp(&p, b"x\n");
        for i in 0..MAX_READ_INDEXES {
            reads.keep_read_index(&root.join(format!("other{i}")), index(b"o"));
        }
        assert!(reads.read_index(&p).is_none());
    }
}
