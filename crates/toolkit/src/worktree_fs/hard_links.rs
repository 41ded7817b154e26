//! The rule for files with more than one hard link: one is read or written through the
//! worktree only when every one of its links is inside the worktree.
//!
//! A hard link in the worktree to a file outside (made by anyone the confinement does not
//! hold: the user, another program, a loop run without Landlock) would otherwise show or
//! change that file, and no path check can see it: both names are the same inode. Build
//! output uses hard links within the tree (cargo links `target/debug/x` to
//! `target/debug/deps/x-hash`), and that must keep working.
//!
//! So the worktree keeps a census: how many links to each multi-link inode it holds, counted
//! by walking it through directory handles (never through a symlink, never onto another
//! filesystem). A file whose link count equals the count found inside is inside entirely.
//! Every change to an inode's links (a link made or removed, a rename) sets its change time,
//! so a census is trusted for a file only if the file's change time is older than the start
//! of the census; otherwise the census is taken again, once per question.

// `stat` field widths differ between architectures: conversions that are no-ops on one are
// needed on another.
#![allow(clippy::useless_conversion)]

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use rustix::time::{ClockId, Timespec};

use td_base::sync::lock;

/// Directory entries a census visits before it gives up (and the file is refused).
const MAX_ENTRIES: usize = 2_000_000;

/// Timestamps come from the kernel's coarse clock; a census start is moved back by this
/// much so that a change in the same tick as the start is never taken for an older one.
const CLOCK_SLACK_NS: i64 = 20_000_000;

/// A file's identity and link state, from `fstat` of the opened file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Links {
    /// Device of the inode.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Number of hard links.
    pub nlink: u64,
    /// Change time (seconds, nanoseconds).
    pub ctime: (i64, i64),
}

impl Links {
    /// The link state in `stat`.
    pub fn of(stat: &Stat) -> Self {
        Links {
            dev: u64::from(stat.st_dev),
            ino: u64::from(stat.st_ino),
            nlink: u64::from(stat.st_nlink),
            ctime: (
                i64::from(stat.st_ctime),
                i64::try_from(stat.st_ctime_nsec).unwrap_or(0),
            ),
        }
    }
}

/// What the census says of a multi-link file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every link is inside the worktree.
    AllInside,
    /// Only `inside` of the file's links are in the worktree.
    LinkedOutside {
        /// Links found inside.
        inside: u64,
    },
    /// The file's links changed during the census, or the tree was too large to count.
    Unknown,
}

/// One count of the worktree's multi-link inodes.
struct Census {
    /// Coarse-clock time the walk started, less the slack.
    started: (i64, i64),
    /// Links found inside, per (device, inode).
    counts: HashMap<(u64, u64), u64>,
    /// Whether some directory could not be opened: links in it were not counted.
    incomplete: bool,
}

/// The census of one worktree, taken when first needed and again when it is out of date.
#[derive(Default)]
pub struct HardLinkCensus {
    current: Mutex<Option<Census>>,
}

impl HardLinkCensus {
    /// Whether the file `links` describes (more than one link) has all its links inside the
    /// worktree whose root handle is `root`.
    pub fn verdict(&self, root: &OwnedFd, links: Links) -> Verdict {
        if links.nlink <= 1 {
            return Verdict::AllInside;
        }
        let mut current = lock(&self.current);
        let fresh = |c: &Census| links.ctime < c.started;
        for attempt in 0..2 {
            if current.as_ref().is_some_and(fresh) {
                break;
            }
            if attempt > 0 {
                // The file changed just now (a build linked it): once its change time lies
                // before a census start, one census answers for it.
                std::thread::sleep(std::time::Duration::from_nanos(2 * CLOCK_SLACK_NS as u64));
            }
            *current = take(root);
        }
        match current.as_ref() {
            Some(census) if fresh(census) => {
                let inside = census
                    .counts
                    .get(&(links.dev, links.ino))
                    .copied()
                    .unwrap_or(0);
                match inside.cmp(&links.nlink) {
                    std::cmp::Ordering::Equal => Verdict::AllInside,
                    // More than there are: something was counted twice, so the count proves
                    // nothing.
                    std::cmp::Ordering::Greater => Verdict::Unknown,
                    // The missing links may be in a directory the walk could not open.
                    std::cmp::Ordering::Less if census.incomplete => Verdict::Unknown,
                    std::cmp::Ordering::Less => Verdict::LinkedOutside { inside },
                }
            }
            _ => Verdict::Unknown,
        }
    }
}

/// Counts the multi-link regular files under `root`, without following symlinks and without
/// leaving the root's filesystem. `None` when the tree is too large or cannot be read.
fn take(root: &OwnedFd) -> Option<Census> {
    let now = rustix::time::clock_gettime(ClockId::RealtimeCoarse);
    let started = minus_slack(now);
    let root_stat = rustix::fs::fstat(root).ok()?;
    let mut walk = CensusWalk {
        root_dev: u64::from(root_stat.st_dev),
        counts: HashMap::new(),
        incomplete: false,
        seen_dirs: std::collections::HashSet::from([u64::from(root_stat.st_ino)]),
        pending: vec![rustix::fs::openat(root, ".", listing(), Mode::empty()).ok()?],
    };
    let mut visited = 0usize;
    while let Some(dir_fd) = walk.pending.pop() {
        let mut dir = Dir::read_from(&dir_fd).ok()?;
        while let Some(entry) = dir.read() {
            let entry = entry.ok()?;
            let name = entry.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            visited += 1;
            if visited > MAX_ENTRIES {
                return None;
            }
            match entry.file_type() {
                FileType::Directory => walk.enter(&dir_fd, name),
                FileType::RegularFile | FileType::Unknown => {
                    let Ok(stat) = rustix::fs::statat(&dir_fd, name, AtFlags::SYMLINK_NOFOLLOW)
                    else {
                        continue;
                    };
                    let kind = FileType::from_raw_mode(stat.st_mode);
                    if kind == FileType::Directory {
                        walk.enter(&dir_fd, name);
                    } else if kind == FileType::RegularFile && u64::from(stat.st_nlink) > 1 {
                        let links = Links::of(&stat);
                        *walk.counts.entry((links.dev, links.ino)).or_insert(0u64) += 1;
                    }
                }
                _ => {}
            }
        }
    }
    Some(Census {
        started,
        counts: walk.counts,
        incomplete: walk.incomplete,
    })
}

/// The state of one census walk.
struct CensusWalk {
    root_dev: u64,
    counts: HashMap<(u64, u64), u64>,
    /// A directory could not be opened: its links were not counted.
    incomplete: bool,
    /// Directories entered, by inode: one moved during the walk (from a part not read yet
    /// into one read already) is not read, and counted, twice.
    seen_dirs: std::collections::HashSet<u64>,
    pending: Vec<OwnedFd>,
}

impl CensusWalk {
    /// Queues the directory `name` in `dir` (never through a symlink, never onto another
    /// filesystem, never twice).
    fn enter(&mut self, dir: &OwnedFd, name: &std::ffi::CStr) {
        let sub = match rustix::fs::openat(dir, name, listing(), Mode::empty()) {
            Ok(sub) => sub,
            // Gone meanwhile, or no longer a directory (a symlink now is not followed).
            Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => return,
            Err(_) => {
                self.incomplete = true;
                return;
            }
        };
        match rustix::fs::fstat(&sub) {
            Ok(s) if u64::from(s.st_dev) != self.root_dev => {}
            Ok(s) => {
                if self.seen_dirs.insert(u64::from(s.st_ino)) {
                    self.pending.push(sub);
                }
            }
            Err(_) => self.incomplete = true,
        }
    }
}

/// Flags that open a directory for reading its entries, never through a symlink.
fn listing() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn minus_slack(t: Timespec) -> (i64, i64) {
    let total =
        i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec) - i128::from(CLOCK_SLACK_NS);
    let secs = total.div_euclid(1_000_000_000);
    let nanos = total.rem_euclid(1_000_000_000);
    (
        i64::try_from(secs).unwrap_or(i64::MIN),
        i64::try_from(nanos).unwrap_or(0),
    )
}

/// The handle of a directory to keep as a worktree root.
pub fn root_handle(path: &std::path::Path) -> std::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(Into::into)
}

/// The link state of an open file.
pub fn links_of(fd: impl AsFd) -> std::io::Result<Links> {
    Ok(Links::of(&rustix::fs::fstat(fd)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(path: &std::path::Path) -> Links {
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        links_of(&fd).unwrap()
    }

    #[test]
    fn links_inside_pass_and_a_link_to_outside_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let wt = dir.path().join("wt");
        std::fs::create_dir_all(wt.join("target/deps")).unwrap();
        std::fs::write(wt.join("target/deps/bin-1234"), "elf").unwrap();
        std::fs::hard_link(wt.join("target/deps/bin-1234"), wt.join("target/bin")).unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::fs::hard_link(dir.path().join("secret"), wt.join("h")).unwrap();
        std::fs::write(wt.join("single"), "1").unwrap();
        // The census trusts only files changed before it began: let the coarse clock move on.
        std::thread::sleep(std::time::Duration::from_millis(60));
        let root = root_handle(&wt).unwrap();
        let census = HardLinkCensus::default();
        assert_eq!(
            census.verdict(&root, links(&wt.join("single"))),
            Verdict::AllInside
        );
        assert_eq!(
            census.verdict(&root, links(&wt.join("target/bin"))),
            Verdict::AllInside
        );
        assert_eq!(
            census.verdict(&root, links(&wt.join("h"))),
            Verdict::LinkedOutside { inside: 1 }
        );
        // A second link made outside afterwards is seen: the census is taken again.
        std::fs::hard_link(wt.join("target/bin"), dir.path().join("copy")).unwrap();
        assert_eq!(
            census.verdict(&root, links(&wt.join("target/bin"))),
            Verdict::LinkedOutside { inside: 2 }
        );
    }

    #[test]
    fn a_symlinked_directory_is_not_counted_as_inside() {
        let dir = tempfile::tempdir().unwrap();
        let wt = dir.path().join("wt");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::create_dir_all(dir.path().join("out")).unwrap();
        std::fs::write(dir.path().join("out/secret"), "s").unwrap();
        std::fs::hard_link(dir.path().join("out/secret"), wt.join("h")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("out"), wt.join("via")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(60));
        let root = root_handle(&wt).unwrap();
        let census = HardLinkCensus::default();
        assert_eq!(
            census.verdict(&root, links(&wt.join("h"))),
            Verdict::LinkedOutside { inside: 1 }
        );
    }
}
