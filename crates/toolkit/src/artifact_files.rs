//! Where plans, specs and phases live in a worktree, and which files there are artifacts.
//!
//! `create_plan`, `create_spec` and `create_phase` write `<kind>-<name>.json` and `.md` into
//! [`ARTIFACT_DIR`] at the worktree's root: an ordinary, committed folder, so a stage's
//! output is on the loop's branch (and reaches the next stage through it), not only in the
//! worktree that is deleted at the end of the run. The engine lists the folder for the
//! `artifacts` prompt variable, and the daemon copies it into the run record when a loop
//! ends; both read it beneath the worktree's root handle ([`WorktreeFs`]) without following
//! a symlink, because the loop (and its commands) may have put anything there.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::worktree_fs::WorktreeFs;

/// Worktree-relative folder holding the artifacts; committed with the loop's work.
pub const ARTIFACT_DIR: &str = "taskdaemon-artifacts";

/// The kinds of artifact, in the order of the stages that write them.
pub const KINDS: [&str; 3] = ["plan", "spec", "phase"];

/// The extensions of an artifact's two files: the structured input and a readable copy.
pub const EXTENSIONS: [&str; 2] = ["json", "md"];

/// Pattern of artifact, spec and phase names. Names become file names, so the pattern also
/// keeps them from escaping the artifact folder.
pub const NAME_PATTERN: &str = "^[a-z0-9][a-z0-9_-]{0,63}$";

/// Longest name [`NAME_PATTERN`] allows.
const NAME_MAX: usize = 64;

/// Most entries of the folder looked at: a loop that filled it with a million files must
/// not make every iteration (or the end of the loop) read them all.
pub const MAX_ENTRIES: usize = 10_000;

/// Whether `name` matches [`NAME_PATTERN`] (checked in code too: the tools may be called
/// without schema validation, and a name is a file name).
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= NAME_MAX
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-')
}

/// The file name of an artifact's `ext` file: `<kind>-<name>.<ext>`.
pub fn file_name(kind: &str, name: &str, ext: &str) -> String {
    format!("{kind}-{name}.{ext}")
}

/// The worktree-relative path of an artifact file named `file`.
pub fn worktree_path(file: &str) -> String {
    format!("{ARTIFACT_DIR}/{file}")
}

/// The kind and name of an artifact file name (`plan-auth.md` -> `("plan", "auth")`);
/// `None` for any other name (nothing else in the folder is an artifact).
pub fn parse_file_name(file: &str) -> Option<(&'static str, &str)> {
    let stem = EXTENSIONS
        .iter()
        .find_map(|ext| file.strip_suffix(ext)?.strip_suffix('.'))?;
    // Kinds hold no '-': the first one ends the kind.
    let (kind, name) = stem.split_once('-')?;
    let kind = KINDS.iter().copied().find(|k| *k == kind)?;
    is_valid_name(name).then_some((kind, name))
}

/// An artifact file as the `artifacts` prompt variable and the run record show it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ArtifactRef {
    /// `plan`, `spec` or `phase`.
    pub kind: String,
    /// The artifact's name.
    pub name: String,
    /// Where the file is: worktree-relative in a prompt, run-directory-relative in a record.
    pub path: String,
}

/// What is in the artifact folder, read beneath the worktree's root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Folder {
    /// The names of its entries (any kind: the caller looks at each without following it),
    /// sorted, at most [`MAX_ENTRIES`].
    pub names: Vec<OsString>,
    /// Whether it held more entries than were read.
    pub truncated: bool,
}

/// Why the folder could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FolderProblem {
    /// It is a symlink (or a symlink is on the way): not followed.
    Symlink,
    /// It is not a directory.
    NotADirectory,
    /// Any other error of the system.
    Io(String),
}

impl std::fmt::Display for FolderProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FolderProblem::Symlink => write!(f, "{ARTIFACT_DIR} is a symlink (not followed)"),
            FolderProblem::NotADirectory => write!(f, "{ARTIFACT_DIR} is not a directory"),
            FolderProblem::Io(e) => write!(f, "{ARTIFACT_DIR} cannot be read: {e}"),
        }
    }
}

/// The folder's path under `files`' root.
pub fn folder_path(files: &WorktreeFs) -> PathBuf {
    files.root().join(ARTIFACT_DIR)
}

/// Reads the names in the artifact folder beneath `files`' root, never through a symlink:
/// `Ok(None)` when there is no folder.
pub fn read_folder(files: &WorktreeFs) -> Result<Option<Folder>, FolderProblem> {
    let fd = match files.open_dir(&folder_path(files)) {
        Ok(fd) => fd,
        Err(crate::worktree_fs::OpenError::Swapped) => return Err(FolderProblem::Symlink),
        Err(crate::worktree_fs::OpenError::Io(e)) => {
            return match e.raw_os_error().map(rustix::io::Errno::from_raw_os_error) {
                Some(rustix::io::Errno::NOENT) => Ok(None),
                // `O_DIRECTORY | O_NOFOLLOW` on a symlink says "not a directory" too.
                Some(rustix::io::Errno::NOTDIR)
                    if entry_kind(files, &folder_path(files)) == Some(EntryKind::Symlink) =>
                {
                    Err(FolderProblem::Symlink)
                }
                Some(rustix::io::Errno::NOTDIR) => Err(FolderProblem::NotADirectory),
                _ => Err(FolderProblem::Io(e.to_string())),
            };
        }
        Err(other) => return Err(FolderProblem::Io(format!("{other:?}"))),
    };
    let dir = rustix::fs::Dir::read_from(&fd).map_err(|e| FolderProblem::Io(e.to_string()))?;
    let mut folder = Folder::default();
    for entry in dir {
        let entry = entry.map_err(|e| FolderProblem::Io(e.to_string()))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if folder.names.len() == MAX_ENTRIES {
            folder.truncated = true;
            break;
        }
        folder
            .names
            .push(std::ffi::OsStr::from_bytes(name).to_os_string());
    }
    folder.names.sort();
    Ok(Some(folder))
}

/// What an entry of the folder is, looked at beneath the root without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    Regular,
    /// A symlink (never followed).
    Symlink,
    /// A directory.
    Directory,
    /// A FIFO, socket or device (never opened for reading).
    Special,
}

/// What the entry at `path` (under `files`' root) is, without following a symlink on the way
/// or at the end and without opening it for reading; `None` when it is not there like that.
pub fn entry_kind(files: &WorktreeFs, path: &std::path::Path) -> Option<EntryKind> {
    let inspected = files.inspect(path)?;
    Some(match inspected.kind {
        rustix::fs::FileType::RegularFile => EntryKind::Regular,
        rustix::fs::FileType::Symlink => EntryKind::Symlink,
        rustix::fs::FileType::Directory => EntryKind::Directory,
        _ => EntryKind::Special,
    })
}

/// The artifact files present in the worktree of `files`: regular files (looked at without
/// following a symlink) whose names are artifact names, by kind in stage order, then name,
/// then extension; paths relative to the worktree. Empty when there is no folder or it
/// cannot be read as one (a symlink in its place lists nothing).
pub fn present(files: &WorktreeFs) -> Vec<ArtifactRef> {
    let Ok(Some(folder)) = read_folder(files) else {
        return Vec::new();
    };
    let base = folder_path(files);
    let mut found: Vec<(usize, ArtifactRef)> = folder
        .names
        .iter()
        .filter_map(|n| n.to_str())
        .filter_map(|file| {
            let (kind, name) = parse_file_name(file)?;
            let kind_of_entry = entry_kind(files, &base.join(file))?;
            (kind_of_entry == EntryKind::Regular).then(|| {
                let order = KINDS.iter().position(|k| *k == kind).unwrap_or(KINDS.len());
                let item = ArtifactRef {
                    kind: kind.to_string(),
                    name: name.to_string(),
                    path: worktree_path(file),
                };
                (order, item)
            })
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, item)| item).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_pattern() {
        for ok in ["a", "0", "auth-api", "x_1", &"a".repeat(64)] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "_a",
            "A",
            "a b",
            "../x",
            "a/b",
            "é",
            &"a".repeat(65),
            "a.",
        ] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn only_artifact_file_names_parse() {
        assert_eq!(parse_file_name("plan-auth.md"), Some(("plan", "auth")));
        assert_eq!(parse_file_name("spec-a-b.json"), Some(("spec", "a-b")));
        assert_eq!(parse_file_name("phase-x_1.json"), Some(("phase", "x_1")));
        for bad in [
            "plan-auth.txt",
            "plan-.md",
            "plan.md",
            "code-x.md",
            "plan-Auth.md",
            "plan-a.md.swp",
            ".plan-a.md",
            "plan-../x.md",
            "",
        ] {
            assert_eq!(parse_file_name(bad), None, "{bad}");
        }
        assert_eq!(file_name("plan", "x", "md"), "plan-x.md");
        assert_eq!(worktree_path("plan-x.md"), "taskdaemon-artifacts/plan-x.md");
    }

    #[test]
    fn present_lists_regular_artifact_files_in_stage_order_and_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let files = WorktreeFs::new(&root).unwrap();
        assert!(present(&files).is_empty(), "no folder, no artifacts");
        let folder = root.join(ARTIFACT_DIR);
        std::fs::create_dir(&folder).unwrap();
        for f in [
            "spec-b.md",
            "plan-z.json",
            "plan-z.md",
            "notes.txt",
            "code-x.md",
        ] {
            std::fs::write(folder.join(f), "x").unwrap();
        }
        std::fs::create_dir(folder.join("phase-dir.md")).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), folder.join("spec-link.md"))
            .unwrap();
        let listed: Vec<String> = present(&files).into_iter().map(|a| a.path).collect();
        assert_eq!(
            listed,
            [
                "taskdaemon-artifacts/plan-z.json",
                "taskdaemon-artifacts/plan-z.md",
                "taskdaemon-artifacts/spec-b.md"
            ]
        );
        // The folder itself a symlink to a directory full of artifacts: nothing is listed.
        std::fs::remove_dir_all(&folder).unwrap();
        std::fs::write(outside.path().join("plan-o.md"), "o").unwrap();
        std::os::unix::fs::symlink(outside.path(), &folder).unwrap();
        assert!(present(&files).is_empty());
        assert_eq!(read_folder(&files), Err(FolderProblem::Symlink));
    }
}
