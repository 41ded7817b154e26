//! File access beneath a worktree root that no race can walk out of: every file tool opens,
//! lists and replaces through the worktree's directory handle, in the kernel
//! ([`beneath`]), and then works on the handle it got: `fstat`, read, write.
//!
//! Path names are still resolved first (`crate::sandbox::resolve_in`, which follows the
//! model's symlinks and refuses escapes with a message that names the link). That
//! resolution is only a name: using it goes through here, where a symlink swapped in after
//! resolution is refused, a FIFO, socket or device is refused before any read (opened
//! non-blocking, checked with `fstat`), a file with a hard link outside the worktree is
//! refused ([`hard_links`]), and a write replaces the file atomically ([`replace`]).

pub mod beneath;
pub mod hard_links;
pub mod replace;

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::error::ToolError;
use hard_links::{HardLinkCensus, Links, Verdict};

/// The worktree's root handle, the state of its hard-link rule, and what it hides.
pub struct WorktreeFs {
    root: PathBuf,
    root_fd: OwnedFd,
    census: HardLinkCensus,
    hidden: std::sync::RwLock<Hidden>,
}

/// Files and directories no file tool may open (`sandbox.hide`: credentials, the receipt
/// chain's key), known by identity as well as by path, so that neither a hard link nor a
/// rename inside the worktree shows them under another name.
#[derive(Debug, Default)]
struct Hidden {
    /// (device, inode) of each hidden file and directory that existed at start.
    identities: Vec<(u64, u64)>,
    /// Their canonical paths (what lies beneath a hidden directory is hidden too).
    paths: Vec<PathBuf>,
}

impl Hidden {
    fn of(paths: &[PathBuf]) -> Self {
        let mut hidden = Hidden::default();
        for path in paths {
            if let Ok(meta) = std::fs::metadata(path) {
                use std::os::unix::fs::MetadataExt as _;
                hidden.identities.push((meta.dev(), meta.ino()));
            }
            hidden
                .paths
                .push(std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()));
        }
        hidden
    }

    fn hides(&self, real: &Path, identity: (u64, u64)) -> bool {
        self.identities.contains(&identity) || self.paths.iter().any(|p| real.starts_with(p))
    }
}

impl std::fmt::Debug for WorktreeFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorktreeFs")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// A regular file opened for reading beneath the root.
#[derive(Debug)]
pub struct OpenedFile {
    /// The open file (non-blocking mode is harmless on a regular file).
    pub file: File,
    /// Its identity and link state at opening.
    pub links: Links,
    /// Its size at opening.
    pub len: u64,
    /// Its size and modification time at opening (before any read).
    pub state: replace::FileState,
}

/// What [`WorktreeFs::inspect`] saw.
#[derive(Debug, Clone)]
pub struct Inspected {
    /// The kind of entry.
    pub kind: rustix::fs::FileType,
    /// Its size.
    pub len: u64,
    /// A symlink's target.
    pub link_target: Option<std::ffi::OsString>,
}

/// Why a path could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// An error from the system (missing file, permissions...).
    Io(std::io::Error),
    /// A symlink or an escape appeared on the path after it was resolved.
    Swapped,
    /// The path is a directory.
    Directory,
    /// The path is a FIFO, socket or device.
    NotRegular,
    /// The file is hidden from loops (`sandbox.hide`).
    Hidden,
    /// The file has hard links outside the worktree.
    LinkedOutside {
        /// Links the file has.
        nlink: u64,
        /// Links found inside the worktree.
        inside: u64,
    },
    /// The file's links could not be counted: they changed meanwhile, or a directory of the
    /// worktree could not be read.
    LinksChanging,
}

impl OpenError {
    fn from_io(err: std::io::Error) -> Self {
        if beneath::is_escape(&err) {
            OpenError::Swapped
        } else {
            OpenError::Io(err)
        }
    }

    /// The tool error for this refusal of `shown` during `action` (e.g. "reading");
    /// `directory_advice` tells the model what to do with a directory; `io` maps system
    /// errors (each tool has its own "not found" help).
    pub fn into_tool_error(
        self,
        action: &str,
        shown: &str,
        directory_advice: &str,
        io: impl FnOnce(std::io::Error) -> ToolError,
    ) -> ToolError {
        match self {
            OpenError::Io(e) => io(e),
            OpenError::Swapped => swapped(shown),
            OpenError::Directory => ToolError::failed(
                format!("{action} '{shown}'"),
                "it is a directory",
                directory_advice,
            ),
            OpenError::NotRegular => ToolError::failed(
                format!("{action} '{shown}'"),
                "it is not a regular file (a FIFO, socket or device)",
                "Only regular files can be read or written by the file tools; choose another path.",
            ),
            OpenError::LinkedOutside { nlink, inside } => ToolError::SandboxViolation {
                path: shown.to_string(),
                detail: format!(
                    " (it is a hard link: the file has {nlink} links and only {inside} of them are inside the worktree, so it is also a file outside it)"
                ),
            },
            OpenError::Hidden => ToolError::ProtectedPath {
                path: shown.to_string(),
                reason: "it is hidden from loops (sandbox.hide: credentials, or the run's receipt key); work without it.".to_string(),
            },
            OpenError::LinksChanging => ToolError::failed(
                format!("{action} '{shown}'"),
                "it has several hard links, and they could not all be found inside the worktree (they changed while they were being counted, or a directory of the worktree cannot be read)",
                "Try the call again once whatever is linking the file has finished; make every directory of the worktree readable.",
            ),
        }
    }
}

/// The refusal of a path that changed under the call (a symlink appeared on it).
pub fn swapped(shown: &str) -> ToolError {
    ToolError::SandboxViolation {
        path: shown.to_string(),
        detail: " (a symlink appeared on the path while the call was using it; nothing was read or written through it)".to_string(),
    }
}

impl WorktreeFs {
    /// Opens the handle of `root` (canonical).
    pub fn new(root: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: root.to_path_buf(),
            root_fd: hard_links::root_handle(root)?,
            census: HardLinkCensus::default(),
            hidden: std::sync::RwLock::new(Hidden::default()),
        })
    }

    /// Hides `paths` (files and directories) from every open from now on.
    pub fn set_hidden(&self, paths: &[PathBuf]) {
        let hidden = Hidden::of(paths);
        *self
            .hidden
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = hidden;
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root's handle.
    pub fn root_fd(&self) -> &OwnedFd {
        &self.root_fd
    }

    /// `real` relative to the root; a path outside it is refused as swapped (resolution
    /// only hands out paths inside).
    pub fn relative<'a>(&self, real: &'a Path) -> Result<&'a Path, OpenError> {
        real.strip_prefix(&self.root)
            .map_err(|_| OpenError::Swapped)
    }

    /// Opens the regular file at `real` for reading: non-blocking (a FIFO swapped in cannot
    /// hang the open), checked with `fstat` before any read, and held to the hard-link rule.
    ///
    /// For entries a directory listing said are regular files (the search tools' walks): a
    /// device node is opened only if one is swapped in between the listing and the open,
    /// which takes a privilege no loop has. A path the model names goes through
    /// [`WorktreeFs::open_named_file`] instead.
    pub fn open_file(&self, real: &Path) -> Result<OpenedFile, OpenError> {
        let rel = self.relative(real)?;
        let fd = beneath::open(
            &self.root_fd,
            rel,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map_err(OpenError::from_io)?;
        self.opened(real, fd)
    }

    /// Opens the regular file at `real`, a path the model named, without ever opening
    /// anything else for reading: the path is first opened as a handle only (`O_PATH`, which
    /// runs no driver code for a device and does not wait for a FIFO's writer), its type
    /// checked, and only then that same inode opened for reading (through `/proc/self/fd`;
    /// where that is missing, by path again, refused if the inode is not the one checked).
    pub fn open_named_file(&self, real: &Path) -> Result<OpenedFile, OpenError> {
        let rel = self.relative(real)?;
        let handle = beneath::open(&self.root_fd, rel, OFlags::PATH, Mode::empty())
            .map_err(OpenError::from_io)?;
        let stat = rustix::fs::fstat(&handle).map_err(|e| OpenError::Io(e.into()))?;
        match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
            rustix::fs::FileType::RegularFile => {}
            rustix::fs::FileType::Directory => return Err(OpenError::Directory),
            // O_PATH | O_NOFOLLOW gives the link itself: one swapped in after resolution.
            rustix::fs::FileType::Symlink => return Err(OpenError::Swapped),
            _ => return Err(OpenError::NotRegular),
        }
        let read_flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let through_proc = format!("/proc/self/fd/{}", handle.as_raw_fd());
        let fd = match rustix::fs::open(through_proc.as_str(), read_flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(_) => {
                let fd = beneath::open(&self.root_fd, rel, read_flags, Mode::empty())
                    .map_err(OpenError::from_io)?;
                let now = rustix::fs::fstat(&fd).map_err(|e| OpenError::Io(e.into()))?;
                if (now.st_dev, now.st_ino) != (stat.st_dev, stat.st_ino) {
                    return Err(OpenError::Swapped);
                }
                fd
            }
        };
        self.opened(real, fd)
    }

    /// The checks every open for reading ends with, on the opened file itself.
    fn opened(&self, real: &Path, fd: OwnedFd) -> Result<OpenedFile, OpenError> {
        let stat = rustix::fs::fstat(&fd).map_err(|e| OpenError::Io(e.into()))?;
        match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
            rustix::fs::FileType::RegularFile => {}
            rustix::fs::FileType::Directory => return Err(OpenError::Directory),
            _ => return Err(OpenError::NotRegular),
        }
        let links = Links::of(&stat);
        if self.hides(real, (links.dev, links.ino)) {
            return Err(OpenError::Hidden);
        }
        self.check_links(links)?;
        Ok(OpenedFile {
            file: File::from(fd),
            links,
            len: u64::try_from(stat.st_size).unwrap_or(0),
            state: replace::FileState::of(&stat),
        })
    }

    /// Whether the file at `real` with `identity` (device, inode) is hidden from loops.
    pub fn hides(&self, real: &Path, identity: (u64, u64)) -> bool {
        self.hidden
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .hides(real, identity)
    }

    /// Applies the hard-link rule to a file with `links`.
    pub fn check_links(&self, links: Links) -> Result<(), OpenError> {
        match self.census.verdict(&self.root_fd, links) {
            Verdict::AllInside => Ok(()),
            Verdict::LinkedOutside { inside } => Err(OpenError::LinkedOutside {
                nlink: links.nlink,
                inside,
            }),
            Verdict::Unknown => Err(OpenError::LinksChanging),
        }
    }

    /// Opens the directory at `real` for reading its entries.
    pub fn open_dir(&self, real: &Path) -> Result<OwnedFd, OpenError> {
        let rel = self.relative(real)?;
        beneath::open(
            &self.root_fd,
            rel,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .map_err(OpenError::from_io)
    }

    /// The names in the directory `real`, read beneath the root (`None` when it cannot be
    /// opened there: missing, not a directory, or reached through a symlink).
    pub fn entry_names(&self, real: &Path) -> Option<Vec<std::ffi::OsString>> {
        let fd = self.open_dir(real).ok()?;
        let dir = rustix::fs::Dir::read_from(&fd).ok()?;
        Some(
            dir.filter_map(Result::ok)
                .map(|e| e.file_name().to_bytes().to_vec())
                .filter(|n| n.as_slice() != b"." && n.as_slice() != b"..")
                .map(std::ffi::OsString::from_vec)
                .collect(),
        )
    }

    /// What `real` is, looked at beneath the root without following a symlink on the way or
    /// at the end; `None` when it is not there like that (a walk that read a directory
    /// swapped for a symlink found it outside, or it went away).
    pub fn inspect(&self, real: &Path) -> Option<Inspected> {
        let rel = self.relative(real).ok()?;
        let fd = beneath::open(&self.root_fd, rel, OFlags::PATH, Mode::empty()).ok()?;
        let stat = rustix::fs::fstat(&fd).ok()?;
        let kind = rustix::fs::FileType::from_raw_mode(stat.st_mode);
        let link_target = if kind == rustix::fs::FileType::Symlink {
            // Read through the handle: the link that was checked is the one read.
            rustix::fs::readlinkat(&fd, "", Vec::new())
                .ok()
                .map(|t| std::ffi::OsString::from_vec(t.into_bytes()))
        } else {
            None
        };
        Some(Inspected {
            kind,
            len: u64::try_from(stat.st_size).unwrap_or(0),
            link_target,
        })
    }

    /// Whether `real` still names, beneath the root and without a symlink on the way, the
    /// entry with inode `ino` that a directory walk found. A walk reads directories by path;
    /// one swapped for a symlink mid-walk would show entries from outside, and this check
    /// drops them before anything about them is shown.
    pub fn still_inside(&self, real: &Path, ino: u64) -> bool {
        let Ok(rel) = self.relative(real) else {
            return false;
        };
        beneath::open(&self.root_fd, rel, OFlags::PATH, Mode::empty())
            .ok()
            .and_then(|fd| rustix::fs::fstat(fd.as_fd()).ok())
            .is_some_and(|stat| Links::of(&stat).ino == ino)
    }
}
