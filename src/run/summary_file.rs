//! `summary.json`, written behind the run by a thread of its own.
//!
//! The summary changes on every loop start, iteration end and model reply. Each write is
//! durable (temporary file, synced, renamed, directory synced: [`td_base::record_io::replace`]),
//! which takes milliseconds; done in the caller, it would hold up the loop that made the
//! change and, for changes made by events, every loop of the run. So a change only marks the
//! summary dirty, and the writer thread writes the latest version: changes that come while a
//! write is in progress are written together by the next one. After a write the writer
//! rests [`REST_FACTOR`] times as long as the write took (at most [`MAX_REST`]): a run of
//! 1,000 loops changes its summary thousands of times a second, and rewriting a file of
//! 1,000 entries back to back took half the daemon's CPU (`benches/ui.rs`, perf: 14 of
//! 28 s), while a small run's writes take a millisecond or two and stay as prompt as before
//! (what a crash leaves in `summary.json` is what a resume starts from, with the events).
//! [`SummaryFile::flush`] does not wait for the rest: it waits until what was changed is on
//! the disk (the end of a run, tests).
//!
//! The summary is a view of the events and transcripts, which a resume can rebuild it from
//! (`rebuild.rs`): a summary a little behind the events is never a loss. A write that fails
//! is reported to the record's [`Failures`], which makes the record unwritable.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::run::record::{RunSummary, SUMMARY_FILE};
use td_base::sync::lock;

/// The writes of a run record that failed: the first makes the record unwritable.
#[derive(Debug)]
pub struct Failures {
    dir: PathBuf,
    count: AtomicU64,
    first: OnceLock<String>,
}

impl Failures {
    /// No failure yet, for the record in `dir`.
    pub fn new(dir: &Path) -> Self {
        Failures {
            dir: dir.to_path_buf(),
            count: AtomicU64::new(0),
            first: OnceLock::new(),
        }
    }

    /// Records a failed write: the first is logged loudly and kept; repeats (a full disk
    /// fails every write) are logged quietly.
    pub fn record(&self, what: String) {
        if self.count.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::error!("run record {}: {what}", self.dir.display());
        } else {
            tracing::debug!("run record {}: {what}", self.dir.display());
        }
        let _ = self.first.set(what);
    }

    /// How many writes failed.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The first failed write, once there was one.
    pub fn first(&self) -> Option<String> {
        self.first.get().cloned()
    }
}

/// How many times as long as a write took the writer waits before the next one: it spends
/// at most about a tenth of its time writing.
pub const REST_FACTOR: u32 = 10;
/// The longest rest between two writes during a run (a flush writes at once).
pub const MAX_REST: Duration = Duration::from_millis(250);
/// The shortest rest between two writes during a run (a flush writes at once): a write
/// (temporary file, two syncs, a rename) costs the daemon ~0.3 ms of CPU however small the
/// summary, and a stream of cross-host queries changed the spend, so wrote the summary,
/// ~50 times a second (7% of the head's CPU: benches/hosts.rs). A summary is at most this
/// much behind its events (which a resume rebuilds it from).
pub const MIN_REST: Duration = Duration::from_millis(50);

struct State {
    summary: RunSummary,
    /// Changed since the last snapshot was taken for writing.
    dirty: bool,
    /// A snapshot is being written.
    writing: bool,
    /// The record is going away: write what is dirty, then stop.
    closing: bool,
    /// Callers waiting in [`SummaryFile::flush`]: the writer does not rest while there is
    /// one.
    flushing: usize,
    /// Writes made by the writer (tests check the interval with it).
    #[cfg_attr(not(test), allow(dead_code))]
    writes: u64,
    /// Changes that woke the writer (tests check that a change to a summary already
    /// waiting to be written wakes nobody).
    #[cfg_attr(not(test), allow(dead_code))]
    wakes: u64,
    /// The outcome of the last write.
    last: Result<(), String>,
}

struct Shared {
    dir: PathBuf,
    state: Mutex<State>,
    /// Signalled on every change and after every write.
    changed: Condvar,
    failures: Arc<Failures>,
}

impl Shared {
    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        // A bounded wait: a flush also notices a writer thread that is gone.
        match self.changed.wait_timeout(state, Duration::from_millis(200)) {
            Ok((guard, _)) => guard,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }

    /// Writes the latest summary if it changed; returns whether there was something to do.
    fn write_dirty(&self) -> bool {
        let snapshot = {
            let mut state = lock(&self.state);
            if !state.dirty {
                return false;
            }
            state.dirty = false;
            state.writing = true;
            state.summary.clone()
        };
        let written = write_summary(&self.dir, &snapshot);
        if let Err(e) = &written {
            self.failures.record(e.clone());
        }
        let mut state = lock(&self.state);
        state.writing = false;
        state.writes = state.writes.saturating_add(1);
        state.last = written;
        self.changed.notify_all();
        true
    }
}

/// A run's summary in memory, and its file kept up to date by a writer thread.
pub struct SummaryFile {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SummaryFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SummaryFile")
            .field("dir", &self.shared.dir)
            .finish_non_exhaustive()
    }
}

impl SummaryFile {
    /// Writes `summary` to `dir/summary.json` now (an error when it cannot be), then keeps
    /// the file up to date with every change. Failed writes go to `failures`.
    pub fn start(
        dir: &Path,
        summary: RunSummary,
        failures: Arc<Failures>,
    ) -> Result<SummaryFile, String> {
        write_summary(dir, &summary)?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            state: Mutex::new(State {
                summary,
                dirty: false,
                writing: false,
                closing: false,
                flushing: 0,
                writes: 0,
                wakes: 0,
                last: Ok(()),
            }),
            changed: Condvar::new(),
            failures,
        });
        let thread_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("summary-writer".into())
            .spawn(move || writer_loop(&thread_shared))
            .map_err(|e| format!("cannot start the summary writer: {e}"))?;
        Ok(SummaryFile {
            shared,
            writer: Some(writer),
        })
    }

    /// A copy of the summary as it is now.
    pub fn get(&self) -> RunSummary {
        lock(&self.shared.state).summary.clone()
    }

    /// What `read` takes from the summary as it is now (under the summary's lock: keep it
    /// short), without copying the whole of it.
    pub fn read<T>(&self, read: impl FnOnce(&RunSummary) -> T) -> T {
        read(&lock(&self.shared.state).summary)
    }

    /// Changes the summary with `change`, which says whether it changed anything; a change
    /// is written soon (`change` runs under the summary's lock: keep it short).
    pub fn change(&self, change: impl FnOnce(&mut RunSummary) -> bool) {
        let mut state = lock(&self.shared.state);
        // Only the first change after a write wakes the writer: it writes the summary as it
        // is then, with every later change (each wake-up was a futex call here and a task
        // switch there, several per cross-host query).
        if change(&mut state.summary) && !std::mem::replace(&mut state.dirty, true) {
            state.wakes = state.wakes.saturating_add(1);
            self.shared.changed.notify_all();
        }
    }

    /// Waits until every change made so far is written, and returns how the last write
    /// went. Writes itself when the writer thread is gone.
    pub fn flush(&self) -> Result<(), String> {
        let mut state = lock(&self.shared.state);
        state.flushing = state.flushing.saturating_add(1);
        self.shared.changed.notify_all();
        while state.dirty || state.writing {
            if self.writer.as_ref().is_none_or(JoinHandle::is_finished) {
                drop(state);
                self.shared.write_dirty();
                state = lock(&self.shared.state);
                continue;
            }
            state = self.shared.wait(state);
        }
        state.flushing = state.flushing.saturating_sub(1);
        state.last.clone()
    }
}

impl Drop for SummaryFile {
    fn drop(&mut self) {
        lock(&self.shared.state).closing = true;
        self.shared.changed.notify_all();
        if let Some(writer) = self.writer.take() {
            // It writes what is left, then ends.
            let _ = writer.join();
        }
    }
}

fn writer_loop(shared: &Shared) {
    // When the last write ended, and how long the writer rests after it.
    let mut last_write: Option<(Instant, Duration)> = None;
    loop {
        {
            let mut state = lock(&shared.state);
            loop {
                if state.closing && !state.dirty {
                    return;
                }
                if !state.dirty {
                    state = shared.wait(state);
                    continue;
                }
                // Dirty: written now if the writer rested long enough, or someone waits for
                // it; else after the rest of its rest (changes keep coming meanwhile and go
                // into the same write).
                let hurry = state.closing || state.flushing > 0;
                let left = last_write.map_or(Duration::ZERO, |(at, rest)| {
                    rest.saturating_sub(at.elapsed())
                });
                if hurry || left.is_zero() {
                    break;
                }
                state = match shared.changed.wait_timeout(state, left) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
        }
        let started = Instant::now();
        shared.write_dirty();
        let took = started.elapsed();
        last_write = Some((Instant::now(), rest_after(took)));
    }
}

/// How long the writer rests after a write that took `took`.
fn rest_after(took: Duration) -> Duration {
    took.saturating_mul(REST_FACTOR).clamp(MIN_REST, MAX_REST)
}

/// Milliseconds each write sleeps first (tests: a slow write).
#[cfg(test)]
static SLOW_WRITE_MS: AtomicU64 = AtomicU64::new(0);

/// Replaces `summary.json` atomically and durably: readers see the old or the new file,
/// never a mix, and a power loss keeps one of them. Secrets are redacted.
pub fn write_summary(dir: &Path, summary: &RunSummary) -> Result<(), String> {
    #[cfg(test)]
    std::thread::sleep(Duration::from_millis(SLOW_WRITE_MS.load(Ordering::Relaxed)));
    let path = dir.join(SUMMARY_FILE);
    let text = serde_json::to_string_pretty(summary)
        .map_err(|e| format!("cannot serialize the run summary: {e}"))?;
    let mut text = td_base::secrets::redact_json(&text).into_owned();
    text.push('\n');
    td_base::record_io::replace(&path, text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::record::read_summary;

    #[test]
    fn changes_reach_the_file_and_a_flush_waits_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let failures = Arc::new(Failures::new(dir.path()));
        let file = SummaryFile::start(dir.path(), RunSummary::default(), failures.clone()).unwrap();
        assert_eq!(read_summary(dir.path()).unwrap(), RunSummary::default());
        for n in 0..200 {
            file.change(|s| {
                s.run_id = format!("r{n}");
                true
            });
        }
        file.change(|_| false);
        file.flush().unwrap();
        assert_eq!(read_summary(dir.path()).unwrap().run_id, "r199");
        assert_eq!(file.get().run_id, "r199");
        assert_eq!(failures.count(), 0);
        // What is changed just before the record goes away is written too.
        file.change(|s| {
            s.run_id = "last".into();
            true
        });
        drop(file);
        assert_eq!(read_summary(dir.path()).unwrap().run_id, "last");
    }

    #[test]
    fn writes_are_an_interval_apart_but_a_flush_does_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let failures = Arc::new(Failures::new(dir.path()));
        let file = SummaryFile::start(dir.path(), RunSummary::default(), failures).unwrap();
        // Changes for 0.6 s, one every millisecond. Each write sleeps 20 ms in the test
        // (a slow disk, or a summary of 1,000 loops): the writer then rests 200 ms, so at
        // most one write per 220 ms (and the first at once), where writing back to back
        // would make about thirty.
        SLOW_WRITE_MS.store(20, Ordering::Relaxed);
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < Duration::from_millis(600) {
            file.change(|s| {
                s.run_id = format!("r{n}");
                true
            });
            n += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        let took = start.elapsed();
        let writes = lock(&file.shared.state).writes;
        let most = took.as_millis() / 220 + 1;
        assert!(
            writes >= 1 && u128::from(writes) <= most,
            "{writes} writes in {took:?}"
        );
        // A flush right after a write still writes at once, not after the interval.
        file.flush().unwrap();
        file.change(|s| {
            s.run_id = "flushed".into();
            true
        });
        let asked = Instant::now();
        file.flush().unwrap();
        assert!(
            asked.elapsed() < Duration::from_millis(150),
            "{:?}",
            asked.elapsed()
        );
        SLOW_WRITE_MS.store(0, Ordering::Relaxed);
        assert_eq!(read_summary(dir.path()).unwrap().run_id, "flushed");
    }

    #[test]
    fn a_change_to_a_summary_waiting_to_be_written_wakes_no_one() {
        let dir = tempfile::tempdir().unwrap();
        let failures = Arc::new(Failures::new(dir.path()));
        let file = SummaryFile::start(dir.path(), RunSummary::default(), failures).unwrap();
        // A first write, so that the writer rests (at least MIN_REST) after it.
        file.change(|s| {
            s.run_id = "first".into();
            true
        });
        file.flush().unwrap();
        let (wakes, writes) = {
            let state = lock(&file.shared.state);
            (state.wakes, state.writes)
        };
        for n in 0..100 {
            file.change(|s| {
                s.run_id = format!("r{n}");
                true
            });
        }
        // One wake-up for the hundred changes (the first made it dirty), and no change that
        // says it changed nothing wakes it.
        file.change(|_| false);
        let state = lock(&file.shared.state);
        assert_eq!(state.wakes, wakes + 1);
        assert!(state.writes <= writes + 1, "{} {writes}", state.writes);
        drop(state);
        file.flush().unwrap();
        assert_eq!(read_summary(dir.path()).unwrap().run_id, "r99");
    }

    #[test]
    fn the_rest_after_a_write_is_ten_times_its_time_within_the_floor_and_the_cap() {
        // A fast write (a small run's) still rests the floor: changes a few ms apart (each
        // cross-host query's spend) are one write, not one each.
        assert_eq!(rest_after(Duration::ZERO), MIN_REST);
        assert_eq!(rest_after(Duration::from_millis(2)), MIN_REST);
        assert_eq!(
            rest_after(Duration::from_millis(10)),
            Duration::from_millis(100)
        );
        assert_eq!(rest_after(Duration::from_secs(2)), MAX_REST);
    }

    #[test]
    fn a_write_that_fails_is_a_failure_of_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let failures = Arc::new(Failures::new(dir.path()));
        let file = SummaryFile::start(dir.path(), RunSummary::default(), failures.clone()).unwrap();
        // The temporary file's name taken by a directory: the write cannot be made.
        std::fs::create_dir(dir.path().join("summary.json.tmp")).unwrap();
        file.change(|s| {
            s.run_id = "lost".into();
            true
        });
        let e = file.flush().unwrap_err();
        assert!(e.contains("cannot write"), "{e}");
        assert_eq!(failures.count(), 1);
        assert_eq!(failures.first().as_deref(), Some(e.as_str()));
        assert_eq!(read_summary(dir.path()).unwrap(), RunSummary::default());
    }
}
