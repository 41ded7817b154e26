//! One process owns a run record: `run` holds an exclusive lock (flock) on `owner.lock` in
//! the run directory for as long as it lives, and writes its pid and start time into the
//! file for people and for `status`. The kernel drops the lock when the process ends, however
//! it ends (SIGKILL too), so a free lock means that no process owns the run — a pid alone
//! could not say so (pids are reused).
//!
//! A second process that finds the lock taken refuses at once instead of running the loops
//! again: nothing is read or written before the lock is held.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The lock file in a run directory.
pub const OWNER_FILE: &str = "owner.lock";

/// The exit code of a `run` refused because another process holds the run (EX_TEMPFAIL:
/// try again once that process ended).
pub const HELD_EXIT_CODE: u8 = 75;

/// How long a `run` tries again when the lock is taken: `status` takes it for a moment
/// (shared) to see whether anyone holds it.
const RETRY_FOR: Duration = Duration::from_millis(500);

/// What the owner writes into the lock file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OwnerInfo {
    /// The owning process.
    pub pid: u32,
    /// When it took the run (RFC 3339).
    pub since: String,
}

/// The lock held by this process; the run is ours until it is dropped (or the process
/// ends).
#[derive(Debug)]
pub struct OwnerLock {
    _file: File,
}

/// Why the run could not be taken.
#[derive(Debug)]
pub enum TakeError {
    /// Another process holds it: what its lock file says (`None`: unreadable).
    Held(Option<OwnerInfo>),
    /// The lock file could not be made or locked.
    Io(String),
}

/// Takes the run in `run_dir` for this process, or says who holds it.
pub fn take(run_dir: &Path) -> Result<OwnerLock, TakeError> {
    let path = run_dir.join(OWNER_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| TakeError::Io(format!("cannot open {}: {e}", path.display())))?;
    let start = std::time::Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) if start.elapsed() < RETRY_FOR => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(TryLockError::WouldBlock) => return Err(TakeError::Held(read_info(&mut file))),
            Err(TryLockError::Error(e)) => {
                return Err(TakeError::Io(format!(
                    "cannot lock {}: {e}",
                    path.display()
                )));
            }
        }
    }
    let info = OwnerInfo {
        pid: std::process::id(),
        since: crate::run::record::now_rfc3339(),
    };
    let text = serde_json::to_string(&info).map_err(|e| TakeError::Io(e.to_string()))?;
    let written = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(format!("{text}\n").as_bytes()))
        .and_then(|()| file.sync_data());
    written.map_err(|e| TakeError::Io(format!("cannot write {}: {e}", path.display())))?;
    Ok(OwnerLock { _file: file })
}

/// Whether a live process owns the run in `run_dir`. No lock file: none does (a run takes
/// its lock before it writes anything). An error that keeps the lock from being tested
/// counts as owned: `status` then shows what the record says.
///
/// A held lock whose file names a process that no longer exists is not an owner: a lock
/// lives as long as any process shares its open file, and a process the owner forked keeps
/// it for the moment between its fork and its exec (or its closing every descriptor) —
/// so just after an owner was killed, the lock can still be held for an instant by nobody
/// who runs the run.
pub fn is_owned(run_dir: &Path) -> bool {
    let Ok(mut file) = File::open(run_dir.join(OWNER_FILE)) else {
        return false;
    };
    match file.try_lock_shared() {
        // Free: the owner is gone. The shared lock ends with `file`.
        Ok(()) => false,
        Err(TryLockError::WouldBlock) => match read_info(&mut file) {
            Some(owner) => process_exists(owner.pid),
            None => true,
        },
        Err(TryLockError::Error(_)) => true,
    }
}

/// Whether process `pid` exists (as anything, a zombie included).
fn process_exists(pid: u32) -> bool {
    pid != 0 && Path::new("/proc").join(pid.to_string()).exists()
}

/// What the lock file says, when it can be read (it is the owner's, but treat it as any
/// file: at most a small JSON object).
fn read_info(file: &mut File) -> Option<OwnerInfo> {
    let mut text = String::new();
    file.rewind().ok()?;
    Read::by_ref(file)
        .take(4096)
        .read_to_string(&mut text)
        .ok()?;
    serde_json::from_str(text.trim()).ok()
}

/// The message for a run that `holder` holds.
pub fn held_message(run_dir: &Path, holder: Option<&OwnerInfo>) -> String {
    let lock = run_dir.join(OWNER_FILE);
    let who = match holder {
        Some(h) => format!("process {} (since {})", h.pid, h.since),
        None => "another process".to_string(),
    };
    format!(
        "the run in {} is in use by {who}: it holds {}. Only one process may run a run; wait \
         for it to end (`taskdaemon status` shows it `running`), or stop it (Ctrl-C, or kill \
         that pid) and resume the run then",
        run_dir.display(),
        lock.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_a_free_lock_means_no_owner() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_owned(dir.path()), "no lock file: no owner");
        let lock = take(dir.path()).unwrap();
        assert!(is_owned(dir.path()));
        // A second taker (another open file: flock locks belong to it, not to the pid).
        match take(dir.path()) {
            Err(TakeError::Held(Some(info))) => {
                assert_eq!(info.pid, std::process::id());
                assert!(
                    held_message(dir.path(), Some(&info))
                        .contains(&format!("process {} (since ", info.pid))
                );
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(lock);
        assert!(
            !is_owned(dir.path()),
            "released: the stale pid in the file does not count"
        );
        let again = take(dir.path()).unwrap();
        assert!(is_owned(dir.path()));
        drop(again);
    }

    #[test]
    fn a_held_lock_naming_a_gone_process_is_no_owner() {
        let dir = tempfile::tempdir().unwrap();
        let lock = take(dir.path()).unwrap();
        assert!(is_owned(dir.path()), "this process holds it");
        // The lock is still held (by this process), but the file names a process that does
        // not exist: what a forked child of a killed owner looks like for an instant.
        std::fs::write(
            dir.path().join(OWNER_FILE),
            "{\"pid\": 4294967295, \"since\": \"then\"}\n",
        )
        .unwrap();
        assert!(!is_owned(dir.path()));
        drop(lock);
    }

    #[test]
    fn a_damaged_lock_file_still_locks_and_names_no_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(OWNER_FILE), "not json at all").unwrap();
        let _lock = take(dir.path()).unwrap();
        let mut other = File::open(dir.path().join(OWNER_FILE)).unwrap();
        assert!(read_info(&mut other).is_some(), "rewritten by the taker");
        std::fs::write(dir.path().join(OWNER_FILE), "garbage").unwrap();
        match take(dir.path()) {
            Err(TakeError::Held(None)) => {}
            other => panic!("expected Held(None), got {other:?}"),
        }
        assert!(held_message(dir.path(), None).contains("another process"));
    }
}
