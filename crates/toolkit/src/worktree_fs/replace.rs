//! Writing a file so that nothing is half done: the new content goes to a temp file in the
//! same directory, is flushed to disk, and takes the file's place in one rename; on any
//! failure (a full disk, a file that changed) the old file is left as it was, and
//! directories made for the write are removed again.
//!
//! The place is taken with `renameat2(RENAME_EXCHANGE)`: the old file then sits under the
//! temp name, still open to this call, and is checked there (for an edit: the same inode
//! with the same bytes the loop saw; for a write: a regular file, not a directory swapped
//! in). If the check fails, the two are exchanged back. A process that appends by opening
//! the path after the exchange writes to the new file; one whose write lands in the old file
//! before the check makes the edit fail as stale. What remains is a writer that opened the
//! file before the exchange and writes after the check: its bytes go to the old file, which
//! is then deleted (ARCHITECTURE.md, "Atomic writes", has the measurement).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::hard_links::Links;
use super::{OpenError, WorktreeFs, beneath};
use crate::stamp::Stamp;
use crate::stamp::StampHasher;

/// What the file being replaced must be, just before it is replaced.
pub enum Expect<'a> {
    /// Anything but a directory or a special file, or nothing (`write_file`); missing parent
    /// directories are made when `create_parents`.
    Anything {
        /// Make missing parent directories (removed again if the write fails).
        create_parents: bool,
    },
    /// The file `old`, still holding exactly the bytes with stamp `stamp` (`edit_file`).
    Unchanged {
        /// The file as opened for reading.
        old: &'a File,
        /// Its state when it was opened, before it was read.
        since: FileState,
        /// The stamp of what was read.
        stamp: Stamp,
    },
}

/// What a replace did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    /// Size of the file replaced, `None` when there was none.
    pub before: Option<u64>,
    /// Whether parent directories were made.
    pub made_parents: bool,
    /// Whether another process wrote to the replaced file after it was checked (through a
    /// descriptor it opened before the exchange): those bytes are not in the new file.
    pub late_write: bool,
    /// Whether another process moved the replaced file away before it could be checked: the
    /// new content is in place, but was not checked against what the loop read.
    pub unchecked: bool,
}

/// Why a replace did not happen; the old file is as it was.
#[derive(Debug)]
pub enum ReplaceError {
    /// Opening the place failed.
    Open(OpenError),
    /// Writing the new content failed (e.g. the disk is full).
    Write(std::io::Error),
    /// The file changed (or went away) since it was read.
    Stale,
    /// The file changed since it was read, and a process wrote to the new version while it
    /// briefly had the name: what it wrote is gone with the refused edit.
    StaleWithLostWrite,
}

/// Temp names differ within the process (counter) and between processes (pid).
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

impl WorktreeFs {
    /// Replaces (or creates) the file at `real` with `content`, as `expect` allows.
    pub fn replace(
        &self,
        real: &Path,
        content: &[u8],
        expect: Expect<'_>,
    ) -> Result<Replaced, ReplaceError> {
        let rel = self.relative(real).map_err(ReplaceError::Open)?;
        // Nothing is made inside a hidden directory (the identity of a file there is checked
        // below, with its links).
        if self.hides(real, (u64::MAX, u64::MAX)) {
            return Err(ReplaceError::Open(OpenError::Hidden));
        }
        let (name, parent_rel) = match (rel.file_name(), rel.parent()) {
            (Some(name), Some(parent)) => (name, parent),
            _ => return Err(ReplaceError::Open(OpenError::Directory)),
        };
        let create = matches!(
            expect,
            Expect::Anything {
                create_parents: true
            }
        );
        let mut made = MadeDirs::default();
        let parent = match open_parent(self.root_fd(), parent_rel, create, &mut made) {
            Ok(fd) => fd,
            Err(e) => {
                made.remove();
                return Err(ReplaceError::Open(OpenError::from_io(e)));
            }
        };
        // A file hidden from loops is not theirs to replace either, under any name.
        let links_allowed = |links: Links| {
            if self.hides(real, (links.dev, links.ino)) {
                return Err(OpenError::Hidden);
            }
            self.check_links(links)
        };
        let result = replace_in(&parent, name, content, &expect, &links_allowed);
        if result.is_err() {
            made.remove();
        }
        result.map(|(before, outcome)| Replaced {
            before,
            made_parents: !made.dirs.is_empty(),
            late_write: outcome == Outcome::LateWrite,
            unchecked: outcome == Outcome::Unchecked,
        })
    }
}

/// Opens the directory `rel` beneath `root` as a handle, making missing components when
/// `create` (each one recorded in `made`).
fn open_parent(
    root: &OwnedFd,
    rel: &Path,
    create: bool,
    made: &mut MadeDirs,
) -> std::io::Result<OwnedFd> {
    if !create {
        return beneath::open(root, rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty());
    }
    let mut at = rustix::io::dup(root)?;
    for part in beneath::plain_components(rel)? {
        let next = match beneath::step(&at, part) {
            Err(Errno::NOENT) => {
                match rustix::fs::mkdirat(&at, part, Mode::from_raw_mode(0o777)) {
                    Ok(()) => made.dirs.push((rustix::io::dup(&at)?, part.to_os_string())),
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                beneath::step(&at, part)?
            }
            other => other?,
        };
        at = next;
    }
    Ok(at)
}

/// Directories a write made, to remove again (deepest first) when the write fails.
#[derive(Default)]
struct MadeDirs {
    dirs: Vec<(OwnedFd, OsString)>,
}

impl MadeDirs {
    fn remove(&mut self) {
        while let Some((parent, name)) = self.dirs.pop() {
            // Only empty directories go: something another process put there stays.
            let _ = rustix::fs::unlinkat(&parent, name.as_os_str(), AtFlags::REMOVEDIR);
        }
    }
}

/// Writes `content` to a temp file in `parent` and exchanges it with `name`; returns the
/// size of the file replaced and whether it was written to after its check.
fn replace_in(
    parent: &OwnedFd,
    name: &OsStr,
    content: &[u8],
    expect: &Expect<'_>,
    links_allowed: &dyn Fn(Links) -> Result<(), OpenError>,
) -> Result<(Option<u64>, Outcome), ReplaceError> {
    let existing = existing_file(parent, name, links_allowed)?;
    if matches!(expect, Expect::Unchanged { .. }) && existing.is_none() {
        return Err(ReplaceError::Stale);
    }
    let (temp, temp_file) = create_temp(parent).map_err(ReplaceError::Write)?;
    // Only a name this call made is ever removed.
    let discard_temp = || {
        let _ = rustix::fs::unlinkat(parent, temp.as_os_str(), AtFlags::empty());
    };
    if let Err(e) = write_temp(temp_file, content, existing.as_ref()) {
        discard_temp();
        return Err(ReplaceError::Write(e));
    }
    // The cheap check, right before the exchange: a file that visibly changed since it was
    // read is refused without ever being moved (a process appending to it meanwhile would
    // otherwise append to the new file, which the refusal then throws away).
    if let Expect::Unchanged { old, since, .. } = expect
        && !unchanged_since(parent, name, old, *since)
    {
        discard_temp();
        return Err(ReplaceError::Stale);
    }
    let before = existing
        .as_ref()
        .map(|s| u64::try_from(s.st_size).unwrap_or(0));
    let exchanged = match existing {
        None => match rustix::fs::renameat_with(
            parent,
            temp.as_os_str(),
            parent,
            name,
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => false,
            // Something appeared at the name meanwhile: a write takes its place if it is a
            // regular file (checked after the exchange below).
            Err(Errno::EXIST) => exchange(parent, &temp, name).map_err(|e| {
                discard_temp();
                ReplaceError::Write(e.into())
            })?,
            Err(e) => {
                discard_temp();
                return Err(ReplaceError::Write(e.into()));
            }
        },
        Some(_) => match exchange(parent, &temp, name) {
            Ok(exchanged) => exchanged,
            Err(Errno::NOENT) => {
                discard_temp();
                return Err(ReplaceError::Stale);
            }
            Err(e) => {
                discard_temp();
                return Err(ReplaceError::Write(e.into()));
            }
        },
    };
    let mut checked = None;
    if exchanged {
        // The old file now sits under the temp name: check it is what may be replaced.
        match check_replaced(parent, &temp, expect) {
            Ok(state) => checked = state,
            Err(refusal) => {
                if exchange(parent, &temp, name).is_err() {
                    return put_back_failed(parent, &temp, name, before, refusal);
                }
                // While the new file had the name, a process that opened the name wrote to
                // it; those bytes leave with it. Rare (the cheap check passed just before),
                // but never silent.
                let written_meanwhile =
                    rustix::fs::statat(parent, &temp, AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|s| u64::try_from(s.st_size).ok() != Some(content.len() as u64));
                discard_temp();
                return Err(match refusal {
                    ReplaceError::Stale if written_meanwhile => ReplaceError::StaleWithLostWrite,
                    other => other,
                });
            }
        }
        discard_temp();
    }
    sync_directory(parent);
    // A process that opened the old file before the exchange can still write to it; what it
    // wrote after the check is not in the new file. That cannot be prevented without locks
    // the writer does not take, so it is detected (as late as possible) and reported.
    let late_write = match (checked, expect) {
        (Some(state), Expect::Unchanged { old, .. }) => {
            rustix::fs::fstat(old.as_fd()).is_ok_and(|now| FileState::of(&now) != state)
        }
        _ => false,
    };
    Ok((
        before,
        if late_write {
            Outcome::LateWrite
        } else {
            Outcome::Clean
        },
    ))
}

/// What is at `name` now: nothing, or a regular file that may be replaced (its links all
/// inside the worktree); anything else is refused.
fn existing_file(
    parent: &OwnedFd,
    name: &OsStr,
    links_allowed: &dyn Fn(Links) -> Result<(), OpenError>,
) -> Result<Option<rustix::fs::Stat>, ReplaceError> {
    let stat = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(ReplaceError::Open(OpenError::from_io(e.into()))),
    };
    match FileType::from_raw_mode(stat.st_mode) {
        // A file also linked from outside is not the loop's to replace: the write would
        // succeed here and leave the outside name with the old content, which a user reads
        // as "the tool wrote through the link".
        FileType::RegularFile => links_allowed(Links::of(&stat)).map_err(ReplaceError::Open)?,
        FileType::Directory => return Err(ReplaceError::Open(OpenError::Directory)),
        FileType::Symlink => return Err(ReplaceError::Open(OpenError::Swapped)),
        _ => return Err(ReplaceError::Open(OpenError::NotRegular)),
    }
    Ok(Some(stat))
}

/// Tries this many temp names before giving up (a name is taken only if something else made
/// it: a command that plants entries where it guesses the next temp name will be).
const TEMP_ATTEMPTS: usize = 16;

/// Makes a new, empty temp file in `parent` under a fresh name; a name that exists already
/// (planted, or left by a crash) is left alone and another one tried.
fn create_temp(parent: &OwnedFd) -> std::io::Result<(OsString, File)> {
    let mut last = Errno::EXIST;
    for _ in 0..TEMP_ATTEMPTS {
        let temp = temp_name();
        match rustix::fs::openat(
            parent,
            temp.as_os_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o666),
        ) {
            Ok(fd) => return Ok((temp, File::from(fd))),
            Err(Errno::EXIST) => last = Errno::EXIST,
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.into())
}

/// Fills the temp file with `content`, flushed to disk, with the permissions (not set-id
/// bits) and, where allowed, the owner of the file it replaces.
fn write_temp(
    mut temp_file: File,
    content: &[u8],
    existing: Option<&rustix::fs::Stat>,
) -> std::io::Result<()> {
    if let Some(stat) = existing {
        rustix::fs::fchmod(&temp_file, Mode::from_raw_mode(stat.st_mode & 0o777))?;
        let _ = rustix::fs::fchown(
            &temp_file,
            Some(rustix::fs::Uid::from_raw(stat.st_uid)),
            Some(rustix::fs::Gid::from_raw(stat.st_gid)),
        );
    }
    temp_file.write_all(content)?;
    rustix::fs::fdatasync(&temp_file)?;
    Ok(())
}

/// Whether `name` is still the file `old` and `old` still has the size and modification
/// time it had when it was opened for reading (`since`).
fn unchanged_since(parent: &OwnedFd, name: &OsStr, old: &File, since: FileState) -> bool {
    let (Ok(at_name), Ok(now)) = (
        rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW),
        rustix::fs::fstat(old.as_fd()),
    ) else {
        return false;
    };
    at_name.st_dev == now.st_dev && at_name.st_ino == now.st_ino && FileState::of(&now) == since
}

/// What is left to do when the old file could not be exchanged back after a failed check
/// (another process renamed one of the two names meanwhile). If the old file is still under
/// the temp name, it takes its name back if that is free (else it stays there, and the
/// error stands). If it is gone, the new content holds the name and cannot be taken back:
/// that is reported as a replace that could not be checked, never as a refusal.
fn put_back_failed(
    parent: &OwnedFd,
    temp: &OsStr,
    name: &OsStr,
    before: Option<u64>,
    refusal: ReplaceError,
) -> Result<(Option<u64>, Outcome), ReplaceError> {
    let old_still_there = rustix::fs::statat(parent, temp, AtFlags::SYMLINK_NOFOLLOW).is_ok();
    if old_still_there {
        let _ = rustix::fs::renameat_with(parent, temp, parent, name, RenameFlags::NOREPLACE);
        return Err(refusal);
    }
    sync_directory(parent);
    Ok((before, Outcome::Unchecked))
}

/// How a replace that happened went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Checked, and nothing wrote to the old version after the check.
    Clean,
    /// Checked, but a process wrote to the old version after the check.
    LateWrite,
    /// The old version was moved away before it could be checked.
    Unchecked,
}

/// Size and modification time of a file, to notice a write after its check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileState {
    len: i64,
    mtime: (i64, i64),
}

impl FileState {
    #[allow(clippy::useless_conversion)] // `stat` field widths differ between architectures.
    /// The state in `stat`.
    pub fn of(stat: &rustix::fs::Stat) -> Self {
        FileState {
            len: i64::from(stat.st_size),
            mtime: (
                i64::from(stat.st_mtime),
                i64::try_from(stat.st_mtime_nsec).unwrap_or(0),
            ),
        }
    }
}

/// Exchanges `temp` and `name` in `parent`. `Ok(false)` where the filesystem cannot
/// exchange and a plain rename was done instead (no check of the old file is possible then).
fn exchange(parent: &OwnedFd, temp: &OsStr, name: &OsStr) -> Result<bool, Errno> {
    match rustix::fs::renameat_with(parent, temp, parent, name, RenameFlags::EXCHANGE) {
        Ok(()) => Ok(true),
        Err(Errno::INVAL | Errno::NOTSUP) => {
            rustix::fs::renameat(parent, temp, parent, name).map(|()| false)
        }
        Err(e) => Err(e),
    }
}

/// Checks the file moved to `temp` by the exchange against `expect`; for an edit, returns the
/// state of the old file that the check saw.
fn check_replaced(
    parent: &OwnedFd,
    temp: &OsStr,
    expect: &Expect<'_>,
) -> Result<Option<FileState>, ReplaceError> {
    let stat = rustix::fs::statat(parent, temp, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|_| ReplaceError::Stale)?;
    match expect {
        Expect::Anything { .. } => match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Ok(None),
            FileType::Directory => Err(ReplaceError::Open(OpenError::Directory)),
            FileType::Symlink => Err(ReplaceError::Open(OpenError::Swapped)),
            _ => Err(ReplaceError::Open(OpenError::NotRegular)),
        },
        Expect::Unchanged { old, stamp, .. } => {
            let old_stat = rustix::fs::fstat(old.as_fd()).map_err(|_| ReplaceError::Stale)?;
            let same_inode = stat.st_dev == old_stat.st_dev && stat.st_ino == old_stat.st_ino;
            if same_inode && stamp_of_open(old).is_ok_and(|s| s == *stamp) {
                Ok(Some(FileState::of(&old_stat)))
            } else {
                Err(ReplaceError::Stale)
            }
        }
    }
}

/// The stamp of everything in `file`, read from its start with `pread` (its offset is left
/// alone).
pub fn stamp_of_open(file: &File) -> std::io::Result<Stamp> {
    let mut hasher = StampHasher::default();
    let mut buf = vec![0u8; 256 * 1024];
    let mut at = 0u64;
    loop {
        match file.read_at(&mut buf, at) {
            Ok(0) => return Ok(hasher.finish()),
            Ok(n) => {
                hasher.update(&buf[..n]);
                at = at.saturating_add(n as u64);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Flushes the directory entry of a rename to disk. Best effort: the content is already
/// durable, and a failure here cannot be undone.
fn sync_directory(parent: &OwnedFd) {
    if let Ok(dir) = rustix::fs::openat(
        parent,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        let _ = rustix::fs::fsync(&dir);
    }
}

/// A fresh hidden temp name (short, so that it fits whatever the file's name is): the
/// process, a counter, and random bits, so that it cannot be guessed ahead.
fn temp_name() -> OsString {
    let n = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
    let mut random = [0u8; 6];
    // Without random bits the name is still unique to this process and call; an entry
    // planted at it only costs another attempt.
    let _ = getrandom::fill(&mut random);
    let mut name = OsString::from(".taskdaemon-write-");
    name.push(format!(
        "{}-{n}-{}.tmp",
        std::process::id(),
        hex::encode(random)
    ));
    debug_assert!(!name.as_bytes().contains(&b'/'));
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, OwnedFd) {
        let tmp = tempfile::tempdir().unwrap();
        let fd = rustix::fs::open(
            tmp.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        (tmp, fd)
    }

    #[test]
    fn an_old_version_taken_away_before_its_check_makes_an_unchecked_replace_not_a_refusal() {
        let (tmp, fd) = dir();
        std::fs::write(tmp.path().join("f"), "new").unwrap();
        let done = put_back_failed(
            &fd,
            OsStr::new("gone.tmp"),
            OsStr::new("f"),
            Some(3),
            ReplaceError::Stale,
        );
        assert!(
            matches!(done, Ok((Some(3), Outcome::Unchecked))),
            "{done:?}"
        );
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("f")).unwrap(),
            "new"
        );
    }

    #[test]
    fn an_old_version_still_under_the_temp_name_takes_a_free_name_back() {
        let (tmp, fd) = dir();
        std::fs::write(tmp.path().join("old.tmp"), "old").unwrap();
        let done = put_back_failed(
            &fd,
            OsStr::new("old.tmp"),
            OsStr::new("f"),
            Some(3),
            ReplaceError::Stale,
        );
        assert!(matches!(done, Err(ReplaceError::Stale)), "{done:?}");
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("f")).unwrap(),
            "old"
        );
    }

    #[test]
    fn a_planted_temp_name_is_skipped_and_kept() {
        let (tmp, fd) = dir();
        let (name, file) = create_temp(&fd).unwrap();
        drop(file);
        assert!(tmp.path().join(&name).is_file());
        let (other, _) = create_temp(&fd).unwrap();
        assert_ne!(name, other, "temp names are fresh");
    }
}
