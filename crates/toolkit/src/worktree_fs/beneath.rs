//! Opening a path beneath the worktree root, in the kernel: `openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or, where the kernel has no `openat2` (before
//! Linux 5.6), one `openat(.., O_NOFOLLOW)` per component starting from the root's handle.
//!
//! The paths given here are already resolved (`crate::sandbox::resolve_in` followed every
//! symlink the model's path went through), so a symlink met now can only be one swapped in
//! after resolution: it is refused, never followed. Either way the kernel walks from the
//! root's file descriptor and cannot leave it, whatever is renamed meanwhile.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Cleared at the first `ENOSYS`: the kernel has no `openat2`, use the component walk.
static OPENAT2_AVAILABLE: AtomicBool = AtomicBool::new(true);

/// How many times an `openat2` that the kernel asks to retry (`EAGAIN`: a rename raced the
/// walk) is tried before giving up.
const RETRIES: usize = 4;

/// Opens `rel` (relative, no `.`/`..`, no symlinks expected) beneath `root` with `flags`.
///
/// `O_NOFOLLOW` and `O_CLOEXEC` are always added. A symlink anywhere on the way fails with
/// `ELOOP`; a `..` or an absolute path fails with `EXDEV`; neither is ever followed.
pub fn open(root: impl AsFd, rel: &Path, flags: OFlags, mode: Mode) -> std::io::Result<OwnedFd> {
    open_with(
        root,
        rel,
        flags,
        mode,
        OPENAT2_AVAILABLE.load(Ordering::Relaxed),
    )
}

/// [`open`] choosing the kernel interface (tests run both).
pub(crate) fn open_with(
    root: impl AsFd,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
    use_openat2: bool,
) -> std::io::Result<OwnedFd> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    if use_openat2 {
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        for _ in 0..RETRIES {
            match rustix::fs::openat2(root.as_fd(), rel, flags, mode, resolve) {
                Err(Errno::AGAIN) => continue,
                Err(Errno::NOSYS) => {
                    OPENAT2_AVAILABLE.store(false, Ordering::Relaxed);
                    break;
                }
                other => return other.map_err(std::io::Error::from),
            }
        }
        if OPENAT2_AVAILABLE.load(Ordering::Relaxed) {
            return Err(Errno::AGAIN.into());
        }
    }
    walk(root, rel, flags, mode)
}

/// The component walk: `openat` of each directory with `O_PATH | O_NOFOLLOW`, then of the
/// last component with `flags` (which hold `O_NOFOLLOW`).
fn walk(root: impl AsFd, rel: &Path, flags: OFlags, mode: Mode) -> std::io::Result<OwnedFd> {
    let parts = plain_components(rel)?;
    let Some((last, dirs)) = parts.split_last() else {
        return rustix::fs::openat(root.as_fd(), ".", flags, mode).map_err(Into::into);
    };
    let mut at: Option<OwnedFd> = None;
    for dir in dirs {
        let next = {
            let from = match &at {
                Some(fd) => fd.as_fd(),
                None => root.as_fd(),
            };
            step(from, dir)?
        };
        at = Some(next);
    }
    let from = match &at {
        Some(fd) => fd.as_fd(),
        None => root.as_fd(),
    };
    rustix::fs::openat(from, *last, flags, mode).map_err(Into::into)
}

/// Opens the directory `name` in `from` as a handle, never through a symlink (`ELOOP`).
pub fn step(from: impl AsFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    match rustix::fs::openat(from.as_fd(), name, directory_step(), Mode::empty()) {
        // `O_DIRECTORY | O_NOFOLLOW` on a symlink says "not a directory"; name it as
        // `openat2` does, so that a swapped path is told from a file in the way.
        Err(Errno::NOTDIR) if is_symlink(from.as_fd(), name) => Err(Errno::LOOP),
        other => other,
    }
}

/// Whether `name` in `dir` is a symlink (not followed).
fn is_symlink(dir: impl AsFd, name: &OsStr) -> bool {
    rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|s| {
        rustix::fs::FileType::from_raw_mode(s.st_mode) == rustix::fs::FileType::Symlink
    })
}

/// Flags that open one directory of a walk as a handle only, never through a symlink.
fn directory_step() -> OFlags {
    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// The components of `rel`, refusing anything but plain names (`EXDEV`, as `openat2`
/// answers an escape).
pub fn plain_components(rel: &Path) -> std::io::Result<Vec<&OsStr>> {
    rel.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| match c {
            Component::Normal(name) if !name.as_bytes().contains(&0) => Ok(name),
            _ => Err(std::io::Error::from(Errno::XDEV)),
        })
        .collect()
}

/// Whether `err` says that the path met a symlink or tried to leave the root: what a path
/// swapped under a call looks like.
pub fn is_escape(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error().map(Errno::from_raw_os_error),
        Some(Errno::LOOP | Errno::XDEV)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("wt/src")).unwrap();
        std::fs::write(dir.path().join("wt/src/a.txt"), "inside").unwrap();
        std::fs::write(dir.path().join("secret"), "outside").unwrap();
        let fd = rustix::fs::open(
            dir.path().join("wt"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        (dir, fd)
    }

    fn read(fd: OwnedFd) -> String {
        std::io::read_to_string(std::fs::File::from(fd)).unwrap()
    }

    #[test]
    fn both_interfaces_open_plain_paths_and_refuse_every_symlink_and_escape() {
        for use_openat2 in [true, false] {
            let (dir, fd) = root();
            let wt = dir.path().join("wt");
            symlink(dir.path().join("secret"), wt.join("out")).unwrap();
            symlink(dir.path(), wt.join("outdir")).unwrap();
            symlink("src", wt.join("in")).unwrap();
            let open = |p: &str| {
                open_with(
                    &fd,
                    Path::new(p),
                    OFlags::RDONLY,
                    Mode::empty(),
                    use_openat2,
                )
            };
            assert_eq!(read(open("src/a.txt").unwrap()), "inside");
            assert_eq!(read(open("./src/a.txt").unwrap()), "inside");
            for bad in [
                "out",
                "outdir/secret",
                "in/a.txt",
                "../secret",
                "src/../../secret",
                "/etc/passwd",
            ] {
                let err = open(bad).unwrap_err();
                assert!(is_escape(&err), "{bad} via openat2={use_openat2}: {err}");
            }
            assert_eq!(
                open("src/missing").unwrap_err().kind(),
                std::io::ErrorKind::NotFound
            );
        }
    }
}
