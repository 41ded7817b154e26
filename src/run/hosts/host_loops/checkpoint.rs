//! A host loop's work as the head holds it. A host may vanish at any moment (SIGKILL, a cut
//! link) and its worktree with it, so the head must hold each finished iteration's work,
//! not only the loop's end: after each failed iteration (at its progress note) the host
//! commits the loop's worktree and sends the commits since the last tip the head took, as
//! an incremental branch bundle ([`FromHost::Checkpoint`]). The head takes it as it takes a
//! loop's end (`take_branch`, from the last tip it took) and moves its worktree of the loop
//! there. A loop moved elsewhere then starts from exactly that commit.
//!
//! Order is what makes the resume point exact. The checkpoint goes in the loop's records
//! stream before its progress note (the head never holds a note whose work it does not
//! hold), and the loop's next iteration's model call waits for it ([`Checkpoints::wait`]):
//! between a progress note and that call the engine writes nothing in the worktree, so
//! the commit is the iteration's end, not a mix with the next one.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

use td_protocol::events::EventKind;

use td_base::sync::lock;
use td_cluster::HeadLink;
use td_cluster::protocol::{BranchBundle, CHUNK_BYTES, FromHost};
use td_git::transfer::Mirror;
use td_git::transfer::lfs::LfsObject;
use td_git::worktree::Worktree;

use super::ask_again;
use crate::run::hosts::remote::MAX_BRANCH_BYTES;

/// The longest a model call waits for the checkpoint before it (a checkpoint is a commit,
/// a bundle and one request per MiB; each request has its own timeout and tries).
const WAIT_LIMIT: Duration = Duration::from_secs(15 * 60);

/// One loop's checkpoints: the last tip of its branch the head took, and the iterations
/// whose work was asked for and sent.
pub(super) struct Checkpoints {
    /// Its worktree and the mirror it is in, once set up.
    place: OnceLock<(Worktree, Mirror)>,
    /// The last tip of its branch the head took (at first the base it was sent).
    taken: Mutex<String>,
    /// The last iteration whose checkpoint was asked for.
    asked: AtomicU32,
    /// The last iteration the loop started (from its events).
    started: AtomicU32,
    /// The last iteration whose checkpoint is done (sent, or failed: then `failed`).
    done: watch::Sender<u32>,
    /// Why a checkpoint could not reach the head: the loop makes no more model calls.
    failed: OnceLock<String>,
}

impl Checkpoints {
    /// A loop whose branch the head holds up to `base`.
    pub(super) fn new(base: &str) -> Checkpoints {
        Checkpoints {
            place: OnceLock::new(),
            taken: Mutex::new(base.to_string()),
            asked: AtomicU32::new(0),
            started: AtomicU32::new(0),
            done: watch::Sender::new(0),
            failed: OnceLock::new(),
        }
    }

    /// Its worktree, once made.
    pub(super) fn set_place(&self, worktree: Worktree, mirror: Mirror) {
        let _ = self.place.set((worktree, mirror));
    }

    /// The last tip of its branch the head took.
    pub(super) fn taken(&self) -> String {
        lock(&self.taken).clone()
    }

    /// Iteration `n`'s checkpoint is asked for (called where its progress note is recorded,
    /// before the engine goes on): the next model call waits for it.
    pub(super) fn ask(&self, n: u32) {
        self.asked.fetch_max(n, Ordering::SeqCst);
    }

    /// The iteration whose work must reach the head before the loop's event `kind` (asked
    /// for here), if any: a failed iteration's at its progress note; the loop's last work
    /// before what ends it (a passing iteration's `iteration_ended`, which the loop's
    /// completion follows, or a `loop_failed`). At most one per iteration: the head takes
    /// one per iteration, in order (what is left after it goes with the loop's end).
    pub(super) fn before(&self, kind: &EventKind) -> Option<u32> {
        let n = match kind {
            EventKind::IterationStarted { iteration, .. } => {
                self.started.fetch_max(*iteration, Ordering::SeqCst);
                return None;
            }
            EventKind::ProgressNoted { iteration, .. }
            | EventKind::IterationEnded {
                iteration,
                validation_passed: Some(true),
                ..
            } => *iteration,
            EventKind::LoopFailed { .. } => self.started.load(Ordering::SeqCst),
            _ => return None,
        };
        if n == 0 || n <= self.asked.load(Ordering::SeqCst) {
            return None;
        }
        self.ask(n);
        Some(n)
    }

    /// Waits until every checkpoint asked for is done; why the loop cannot go on when one
    /// failed.
    pub(super) async fn wait(&self) -> Result<(), String> {
        let asked = self.asked.load(Ordering::SeqCst);
        let mut done = self.done.subscribe();
        let waited = tokio::time::timeout(WAIT_LIMIT, done.wait_for(|d| *d >= asked)).await;
        if let Some(why) = self.failed.get() {
            return Err(why.clone());
        }
        match waited {
            Ok(Ok(_)) => Ok(()),
            _ => Err(format!(
                "the work of its iteration {asked} did not reach the head within {} s",
                WAIT_LIMIT.as_secs()
            )),
        }
    }

    /// Commits iteration `n`'s work and sends what the head does not hold yet; marks it
    /// done whatever happens (a failure is kept, and returned).
    pub(super) async fn make(
        &self,
        link: &HeadLink,
        name: &str,
        n: u32,
        bundles: &Path,
    ) -> Result<(), String> {
        let made = self.send(link, name, n, bundles).await;
        match &made {
            Err(why) => self.make_failed(
                n,
                format!(
                    "the work of its iteration {n} could not reach the head ({why}); it stops so that nothing is done that the head cannot resume from"
                ),
            ),
            Ok(()) => self.done.send_modify(|d| *d = (*d).max(n)),
        }
        made
    }

    /// Iteration `n`'s checkpoint was not sent because its records were not (`why`).
    pub(super) fn make_failed(&self, n: u32, why: String) {
        let _ = self.failed.set(why);
        self.done.send_modify(|d| *d = (*d).max(n));
    }

    async fn send(
        &self,
        link: &HeadLink,
        name: &str,
        n: u32,
        bundles: &Path,
    ) -> Result<(), String> {
        // Not set up yet (its setup failed): there is no work.
        let Some((worktree, mirror)) = self.place.get() else {
            return Ok(());
        };
        worktree
            .commit_all(&format!(
                "taskdaemon: {name} iteration {n} (work in progress)"
            ))
            .await
            .map_err(|e| format!("could not commit its work: {e}"))?;
        let base = self.taken();
        let file = bundles.join(format!("{name}.checkpoint.bundle"));
        let Some(branch) = send_bundle(link, name, mirror, worktree, &base, &file).await? else {
            // Nothing new since the last tip the head took.
            return Ok(());
        };
        let () = ask_again(link, || FromHost::Checkpoint {
            loop_name: name.to_string(),
            iteration: n,
            branch: branch.clone(),
        })
        .await?;
        *lock(&self.taken) = branch.tip;
        Ok(())
    }
}

/// Bundles the commits of `worktree`'s branch since `base` into `file` and sends it to the
/// head in chunks ([`FromHost::BranchChunk`], from offset 0); `None`, sending nothing, when
/// the branch is still at `base`.
pub(super) async fn send_bundle(
    link: &HeadLink,
    name: &str,
    mirror: &Mirror,
    worktree: &Worktree,
    base: &str,
    file: &Path,
) -> Result<Option<BranchBundle>, String> {
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot make {}: {e}", parent.display()))?;
    }
    let Some(info) = mirror
        .bundle_branch(worktree, base, file)
        .await
        .map_err(|e| format!("could not bundle its branch: {e}"))?
    else {
        return Ok(None);
    };
    let sent = send_chunks(link, name, file, MAX_BRANCH_BYTES).await;
    let _ = std::fs::remove_file(file);
    sent?;
    // The bundle carries the pointers of the files the user's attributes give to git-lfs;
    // their content is in the mirror's LFS storage, and goes to the head before the branch
    // is taken there.
    let objects = mirror
        .lfs_objects(base, &info.tip)
        .await
        .map_err(|e| format!("could not list its branch's LFS objects: {e}"))?;
    for object in objects {
        send_lfs_object(link, name, &object).await?;
    }
    Ok(Some(BranchBundle {
        tip: info.tip,
        bytes: info.bytes,
    }))
}

/// Sends `file` (a branch bundle) to the head in chunks, one read at a time: a loop can
/// commit files of any size, and the whole bundle in memory could take the host down with
/// every loop on it. A bundle over `most` bytes (what the head takes of one loop's
/// branch) is refused before any of it is read or sent, saying so.
async fn send_chunks(link: &HeadLink, name: &str, file: &Path, most: u64) -> Result<(), String> {
    let mut chunks = BundleChunks::open(file, most)?;
    let mut offset = 0u64;
    while let Some(piece) = chunks.next_chunk()? {
        let data = hex::encode(&piece);
        let () = ask_again(link, || FromHost::BranchChunk {
            loop_name: name.to_string(),
            offset,
            data: data.clone(),
        })
        .await?;
        offset = offset.saturating_add(piece.len() as u64);
    }
    Ok(())
}

/// Sends one git-lfs object of the loop's branch to the head ([`FromHost::LfsChunk`]): first
/// an empty chunk, which the head answers with `None` when it holds the object already, then
/// the object a chunk at a time from where the head says it stands, until it holds it.
async fn send_lfs_object(link: &HeadLink, name: &str, object: &LfsObject) -> Result<(), String> {
    use std::io::{Read, Seek, SeekFrom};
    let oid = &object.pointer.oid;
    let size = object.pointer.size;
    let fail = |e: String| format!("LFS object {oid}: {e}");
    let mut file = BundleChunks::open(&object.path, MAX_BRANCH_BYTES)
        .map_err(fail)?
        .file;
    let mut offset = 0u64;
    let mut data = String::new();
    // Each answer moves the offset forward or ends the sending; a head that answered the
    // same offset twice for a chunk of bytes is not taking them.
    let mut stalled = false;
    loop {
        let next: Option<u64> = ask_again(link, || FromHost::LfsChunk {
            loop_name: name.to_string(),
            oid: oid.clone(),
            size,
            offset,
            data: data.clone(),
        })
        .await?;
        let Some(next) = next else {
            return Ok(());
        };
        if next > size || (next <= offset && !data.is_empty()) {
            if stalled || next > size {
                return Err(fail(format!(
                    "the head stands at {next} of {size} bytes after a chunk at {offset}"
                )));
            }
            stalled = true;
        }
        offset = next;
        let mut piece = Vec::with_capacity(CHUNK_BYTES);
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| (&mut file).take(CHUNK_BYTES as u64).read_to_end(&mut piece))
            .map_err(|e| fail(format!("cannot read {}: {e}", object.path.display())))?;
        if piece.is_empty() {
            return Err(fail(format!(
                "the head did not take it whole ({offset} of {size} bytes sent)"
            )));
        }
        data = hex::encode(&piece);
    }
}

/// A bundle file read [`CHUNK_BYTES`] at a time, its size checked first.
struct BundleChunks {
    file: std::fs::File,
}

impl BundleChunks {
    /// `path`, when it holds at most `most` bytes.
    fn open(path: &Path, most: u64) -> Result<BundleChunks, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("cannot read its bundle: {e}"))?;
        let size = file
            .metadata()
            .map_err(|e| format!("cannot read its bundle: {e}"))?
            .len();
        if size > most {
            return Err(format!(
                "its branch bundle is {size} bytes, over the {most} the head takes of a loop's branch: commit less (large generated files belong out of the repository)"
            ));
        }
        Ok(BundleChunks { file })
    }

    /// The next chunk (full but for the last), or `None` at the end.
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, String> {
        use std::io::Read;
        let mut piece = Vec::with_capacity(CHUNK_BYTES);
        (&mut self.file)
            .take(CHUNK_BYTES as u64)
            .read_to_end(&mut piece)
            .map_err(|e| format!("cannot read its bundle: {e}"))?;
        Ok((!piece.is_empty()).then_some(piece))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Second review of the hosts, #4: a branch bundle over what the head takes is refused
    /// before it is read; one within it is read a chunk at a time, all of it, in order.
    #[test]
    fn a_bundle_is_read_a_chunk_at_a_time_and_refused_whole_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.bundle");
        let bytes: Vec<u8> = (0..(2 * CHUNK_BYTES + 7))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let size = bytes.len() as u64;
        let err = BundleChunks::open(&path, size - 1).err().unwrap();
        assert!(
            err.contains(&format!(
                "its branch bundle is {size} bytes, over the {}",
                size - 1
            )),
            "{err}"
        );
        let mut chunks = BundleChunks::open(&path, size).unwrap();
        let mut read = Vec::new();
        let mut sizes = Vec::new();
        while let Some(piece) = chunks.next_chunk().unwrap() {
            sizes.push(piece.len());
            read.extend(piece);
        }
        assert_eq!(sizes, vec![CHUNK_BYTES, CHUNK_BYTES, 7]);
        assert_eq!(read, bytes);
    }

    #[tokio::test]
    async fn a_model_call_waits_for_the_checkpoint_asked_before_it() {
        let cp = std::sync::Arc::new(Checkpoints::new("base"));
        // Nothing asked: no wait.
        cp.wait().await.unwrap();
        cp.ask(2);
        let waiter = {
            let cp = cp.clone();
            tokio::spawn(async move { cp.wait().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiter.is_finished(),
            "the call went on before the checkpoint"
        );
        cp.done.send_modify(|d| *d = 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiter.is_finished(),
            "an older checkpoint released the call"
        );
        cp.done.send_modify(|d| *d = 2);
        assert_eq!(waiter.await.unwrap(), Ok(()));
    }

    /// Review (move/attempt) #1: the loop's last work goes before the events that end it,
    /// once per iteration.
    #[test]
    fn the_last_work_goes_before_the_events_that_end_the_loop() {
        let cp = Checkpoints::new("base");
        let started = |iteration| EventKind::IterationStarted {
            loop_name: "m".into(),
            iteration,
        };
        let ended = |iteration, passed| EventKind::IterationEnded {
            loop_name: "m".into(),
            iteration,
            ended_by: "end_turn".into(),
            validation_exit: None,
            validation_passed: passed,
            model_calls: Some(1),
            spend: None,
            wall_ms: None,
        };
        let noted = |iteration| EventKind::ProgressNoted {
            loop_name: "m".into(),
            iteration,
            note: "n".into(),
        };
        let failed = EventKind::LoopFailed {
            loop_name: "m".into(),
            reason: "r".into(),
        };
        let completed = EventKind::LoopCompleted {
            loop_name: "m".into(),
            iterations: 2,
            summary: None,
        };
        assert_eq!(cp.before(&failed), None, "nothing started");
        assert_eq!(cp.before(&started(1)), None);
        assert_eq!(cp.before(&ended(1, Some(false))), None);
        assert_eq!(cp.before(&noted(1)), Some(1));
        // Failed at its last iteration's note: nothing more to send before the end.
        assert_eq!(cp.before(&failed), None);
        assert_eq!(cp.before(&started(2)), None);
        assert_eq!(cp.before(&ended(2, None)), None);
        assert_eq!(cp.before(&ended(2, Some(true))), Some(2));
        assert_eq!(cp.before(&completed), None);
        assert_eq!(cp.asked.load(Ordering::SeqCst), 2);
        // Failed in an iteration with no note (a model error): its work goes first.
        assert_eq!(cp.before(&started(3)), None);
        assert_eq!(cp.before(&failed), Some(3));
        assert_eq!(cp.before(&failed), None);
    }

    #[tokio::test]
    async fn a_failed_checkpoint_stops_the_next_call_with_why() {
        let cp = Checkpoints::new("base");
        cp.ask(1);
        let _ = cp.failed.set("the head refused it".into());
        cp.done.send_modify(|d| *d = 1);
        assert_eq!(cp.wait().await, Err("the head refused it".to_string()));
    }
}
