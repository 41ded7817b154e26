//! Which commit HEAD names, read from the repository's files without starting a process
//! where the files answer unambiguously, and asked of git (the daemon's git, see
//! [`crate::daemon_git::command`]) everywhere else.
//!
//! Every receipt carries its worktree's commit, and the lookup runs again after each command;
//! a `git rev-parse` per lookup cost a process start from async worker code. The files
//! answer the shapes the daemon makes and meets: `.git` as a directory or as a `gitdir:` file
//! (linked worktrees, submodules), the `commondir` of a linked worktree, HEAD as a symbolic
//! ref (a branch, through at most [`MAX_SYMREF_DEPTH`] refs) or detached, loose refs and
//! `packed-refs`.
//!
//! Every byte read is hostile (a repository is data, and a loop's commands may have written
//! it): each file is opened without following a final symlink and without blocking (a FIFO
//! cannot hang the lookup), must be a regular file, and is read to a bound. A ref name must
//! be a plain `refs/...` name (no `..`, no component starting with `.`, none of the bytes git
//! refuses), so it can only name a file beneath the repository's `refs`; paths in `gitdir:`
//! and `commondir` are followed as git follows them. Whatever is not exactly one of the
//! shapes above — a symlinked HEAD, a reftable or SHA-256 repository (any `extensions` in the
//! config), a repository owned by another user (git's `safe.directory` check), discovery
//! steered by `GIT_CEILING_DIRECTORIES` or `GIT_DISCOVERY_ACROSS_FILESYSTEM`, a malformed
//! line — is left to git, which then gives the answer, so where the files answer they answer
//! as git does (the tests compare both on real repositories).
//!
//! The same discovery tells the attributes guard ([`crate::attributes`]) which object format
//! a repository has, where the files say it without doubt (`format_by_files`).
//!
//! Like the daemon's git, the lookup ignores `GIT_DIR` and the other variables of
//! [`crate::daemon_git::SCRUBBED_ENV`]: the repository is the one holding the directory.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

/// Longest HEAD, loose ref, `.git` file or `commondir` read (each is one short line).
const MAX_SMALL_FILE: u64 = 4096;

/// Longest repository `config` read (it is only searched for what the files cannot answer).
const MAX_CONFIG: u64 = 1 << 20;

/// Largest `packed-refs` read (a repository with a hundred thousand refs has about 10 MB).
const MAX_PACKED_REFS: u64 = 64 << 20;

/// Longest line of `packed-refs` read: an object id, a space and a ref name.
const MAX_PACKED_LINE: u64 = 64 + 1 + MAX_REF_NAME as u64 + 1;

/// Longest ref name followed.
const MAX_REF_NAME: usize = 1024;

/// How many symbolic refs are followed from HEAD (git's own limit).
pub const MAX_SYMREF_DEPTH: usize = 5;

/// Environment variables that change where git's discovery of the repository stops; when
/// one is set, git decides.
const DISCOVERY_ENV: &[&str] = &[
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_TEST_ASSUME_DIFFERENT_OWNER",
];

/// What the repository's files say about HEAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadFromFiles {
    /// HEAD names this commit (its full id in lowercase hex).
    Commit(String),
    /// Git finds no commit: no repository holds the directory, or HEAD names a branch that
    /// has no commit yet.
    NoCommit,
    /// The files alone cannot answer as git would (why, for the log); ask git.
    AskGit(&'static str),
}

/// The commit HEAD names for the repository holding `dir`, `None` outside a repository or on
/// a branch without commits — what `git rev-parse --verify -q HEAD` prints in `dir`.
///
/// Blocking: reads a few small files (see the module docs), and where they cannot answer
/// runs the daemon's git. Called on a worker of a multi-threaded tokio runtime, that git
/// runs in `tokio::task::block_in_place`, so the worker's other tasks move to another thread
/// meanwhile.
pub fn head_commit(dir: &Path) -> Option<String> {
    match head_from_files(dir) {
        HeadFromFiles::Commit(commit) => Some(commit),
        HeadFromFiles::NoCommit => None,
        HeadFromFiles::AskGit(why) => {
            tracing::debug!(dir = %dir.display(), why, "HEAD asked of git");
            off_async_workers(|| head_commit_by_git(dir))
        }
    }
}

/// The commit HEAD names, asked of the daemon's git (`rev-parse --verify -q HEAD`): `None`
/// when git says there is none, or cannot be run. Blocking.
pub fn head_commit_by_git(dir: &Path) -> Option<String> {
    let out = crate::daemon_git::command(dir)
        .args(["rev-parse", "--verify", "-q", "HEAD"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!commit.is_empty()).then_some(commit)
}

/// Runs the blocking `f` so that it holds up no async task: through `block_in_place` on a
/// worker of a multi-threaded runtime; directly anywhere else (a plain thread, a blocking
/// task; a current-thread runtime has no other thread to hand its tasks to).
pub(crate) fn off_async_workers<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// What the files of the repository holding `dir` say about HEAD, without starting a
/// process (see the module docs).
pub fn head_from_files(dir: &Path) -> HeadFromFiles {
    if DISCOVERY_ENV
        .iter()
        .any(|key| std::env::var_os(key).is_some())
    {
        return HeadFromFiles::AskGit("the environment steers repository discovery");
    }
    match discover(dir) {
        Ok(Some(repo)) => repo.head(),
        Ok(None) => HeadFromFiles::NoCommit,
        Err(why) => HeadFromFiles::AskGit(why),
    }
}

/// What the files say of the object format of the repository holding `dir`, or of the git
/// directory `dir` is (a bare repository, named with `--git-dir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FormatByFiles {
    /// SHA-1 object ids: the config names no extension (git reads `extensions.objectFormat`
    /// from that one file). With the repository's common directory (shared refs and
    /// objects), as the files name it.
    Sha1 { common_dir: PathBuf },
    /// No repository: no `.git` from `dir` up and `dir` is no git directory, so git finds
    /// none either way.
    NoRepository,
    /// The files cannot say (an extension, another owner, discovery steered by the
    /// environment): ask git.
    AskGit,
}

/// [`FormatByFiles`] for `dir`. Blocking: reads a few small files.
pub(crate) fn format_by_files(dir: &Path) -> FormatByFiles {
    if DISCOVERY_ENV
        .iter()
        .any(|key| std::env::var_os(key).is_some())
    {
        return FormatByFiles::AskGit;
    }
    match discover(dir) {
        // Found only when its config names no extension (`FoundRepo::at`).
        Ok(Some(repo)) => FormatByFiles::Sha1 {
            common_dir: repo.common_dir,
        },
        // Discovery also stops at a directory holding `HEAD` (below), so `dir` is none.
        Ok(None) => FormatByFiles::NoRepository,
        Err(_) => {
            let head = std::fs::symlink_metadata(dir.join("HEAD")).is_ok_and(|m| m.is_file());
            match FoundRepo::at(dir.to_path_buf()) {
                Ok(repo) if head => FormatByFiles::Sha1 {
                    common_dir: repo.common_dir,
                },
                _ => FormatByFiles::AskGit,
            }
        }
    }
}

/// A repository found from a directory: where HEAD lives (`git_dir`) and where the shared
/// refs live (`common_dir`; the same directory except in a linked worktree).
#[derive(Debug)]
struct FoundRepo {
    git_dir: PathBuf,
    common_dir: PathBuf,
}

/// Why the files cannot answer.
type Unanswerable = &'static str;

/// Finds the repository holding `dir` as git's discovery does: the nearest ancestor (from
/// `dir` itself up) with a `.git`, stopping at a file system boundary. `None`: git finds
/// none.
fn discover(dir: &Path) -> Result<Option<FoundRepo>, Unanswerable> {
    // Git walks up the real path of its working directory.
    let dir = dir
        .canonicalize()
        .map_err(|_| "the directory cannot be resolved")?;
    let device = std::fs::metadata(&dir)
        .map_err(|_| "the directory cannot be examined")?
        .dev();
    for (i, candidate) in dir.ancestors().enumerate() {
        if i > 0 {
            // Git does not step onto another file system (without
            // GIT_DISCOVERY_ACROSS_FILESYSTEM, handled above).
            let meta = std::fs::metadata(candidate)
                .map_err(|_| "a parent directory cannot be examined")?;
            if meta.dev() != device {
                return Ok(None);
            }
        }
        let dot_git = candidate.join(".git");
        match std::fs::symlink_metadata(&dot_git) {
            Ok(meta) if meta.is_dir() => {
                let repo = FoundRepo::at(dot_git.clone())?;
                check_owner(&[candidate, &dot_git])?;
                return Ok(Some(repo));
            }
            Ok(meta) if meta.is_file() => {
                let git_dir = read_gitfile(&dot_git, candidate)?;
                let repo = FoundRepo::at(git_dir)?;
                check_owner(&[candidate, &dot_git, &repo.git_dir])?;
                return Ok(Some(repo));
            }
            Ok(_) => return Err("`.git` is neither a directory nor a file"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return Err("`.git` cannot be examined"),
        }
        // A directory that is itself a git directory (a bare repository, or a place inside
        // `.git`): git's rules for those (`safe.bareRepository`) are its own.
        match std::fs::symlink_metadata(candidate.join("HEAD")) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            _ => return Err("a directory on the way up may be a bare repository"),
        }
    }
    Ok(None)
}

/// Reads a `.git` file (`gitdir: PATH`); a relative path is relative to the directory that
/// holds the file, as in git.
fn read_gitfile(path: &Path, holder: &Path) -> Result<PathBuf, Unanswerable> {
    let bytes = match read_small(path, MAX_SMALL_FILE) {
        SmallFile::Bytes(bytes) => bytes,
        SmallFile::Missing => return Err("the `.git` file vanished"),
        SmallFile::Unusable(why) => return Err(why),
    };
    let target = bytes
        .strip_prefix(b"gitdir: ")
        .and_then(one_line)
        .ok_or("the `.git` file is not one `gitdir:` line")?;
    Ok(holder.join(Path::new(OsStr::from_bytes(target))))
}

impl FoundRepo {
    /// The repository whose git directory is `git_dir`, if it has what git checks for
    /// (`HEAD`, and `objects` and `refs` in the common directory).
    fn at(git_dir: PathBuf) -> Result<Self, Unanswerable> {
        let common_dir = match read_small(&git_dir.join("commondir"), MAX_SMALL_FILE) {
            SmallFile::Missing => git_dir.clone(),
            SmallFile::Bytes(bytes) => {
                let line = one_line(&bytes).ok_or("`commondir` is not one line")?;
                git_dir.join(Path::new(OsStr::from_bytes(line)))
            }
            SmallFile::Unusable(why) => return Err(why),
        };
        let is_dir = |p: PathBuf| std::fs::metadata(p).is_ok_and(|m| m.is_dir());
        if !is_dir(common_dir.join("objects")) || !is_dir(common_dir.join("refs")) {
            return Err("the git directory lacks `objects` or `refs`");
        }
        let repo = FoundRepo {
            git_dir,
            common_dir,
        };
        repo.check_config()?;
        Ok(repo)
    }

    /// Refuses what the config may change about reading refs: a format version git may not
    /// know, and any extension (reftable refs, SHA-256 object ids, ones git refuses).
    fn check_config(&self) -> Result<(), Unanswerable> {
        let bytes = match read_small(&self.common_dir.join("config"), MAX_CONFIG) {
            SmallFile::Bytes(bytes) => bytes,
            SmallFile::Missing => return Err("the repository has no config"),
            SmallFile::Unusable(why) => return Err(why),
        };
        let text = String::from_utf8_lossy(&bytes).to_ascii_lowercase();
        if text.contains("extensions") || text.contains("refstorage") {
            return Err("the config names extensions");
        }
        for line in text.lines() {
            let Some(rest) = line.trim().strip_prefix("repositoryformatversion") else {
                continue;
            };
            let value = rest.trim_start().strip_prefix('=').map(str::trim);
            if !matches!(value, Some("0" | "1")) {
                return Err("the config has an unexpected repositoryformatversion");
            }
        }
        Ok(())
    }

    /// What HEAD names.
    fn head(&self) -> HeadFromFiles {
        let bytes = match read_small(&self.git_dir.join("HEAD"), MAX_SMALL_FILE) {
            SmallFile::Bytes(bytes) => bytes,
            SmallFile::Missing => return HeadFromFiles::AskGit("HEAD is missing"),
            SmallFile::Unusable(why) => return HeadFromFiles::AskGit(why),
        };
        let mut name = match parse_ref(&bytes) {
            Some(RefContent::Commit(commit)) => return HeadFromFiles::Commit(commit),
            Some(RefContent::Symbolic(name)) => name,
            None => return HeadFromFiles::AskGit("HEAD is not in a form read here"),
        };
        for _ in 0..MAX_SYMREF_DEPTH {
            match self.resolve(&name) {
                Ok(Some(RefContent::Commit(commit))) => return HeadFromFiles::Commit(commit),
                Ok(Some(RefContent::Symbolic(next))) => name = next,
                Ok(None) => return HeadFromFiles::NoCommit,
                Err(why) => return HeadFromFiles::AskGit(why),
            }
        }
        HeadFromFiles::AskGit("symbolic refs nest too deep")
    }

    /// What the ref `name` (a checked `refs/...` name) holds: its loose file, else its line
    /// in `packed-refs`; `None` when neither has it.
    fn resolve(&self, name: &str) -> Result<Option<RefContent>, Unanswerable> {
        // Refs of one worktree live in its own git directory; git knows which those are.
        if ["refs/worktree/", "refs/bisect/", "refs/rewritten/"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
        {
            return Err("HEAD names a per-worktree ref");
        }
        match read_small(&self.common_dir.join(name), MAX_SMALL_FILE) {
            SmallFile::Bytes(bytes) => {
                return parse_ref(&bytes)
                    .map(Some)
                    .ok_or("a loose ref is not in a form read here");
            }
            SmallFile::Missing => {}
            SmallFile::Unusable(why) => return Err(why),
        }
        self.packed(name)
    }

    /// The line of `packed-refs` for `name`, if any. The whole file is checked (git may
    /// refuse a file with a malformed line anywhere), and a name listed twice is git's to
    /// judge.
    fn packed(&self, name: &str) -> Result<Option<RefContent>, Unanswerable> {
        const MALFORMED: Unanswerable = "`packed-refs` has a malformed line";
        let file = match open_regular(&self.common_dir.join("packed-refs"), MAX_PACKED_REFS) {
            Ok(Some(file)) => file,
            Ok(None) => return Ok(None),
            Err(why) => return Err(why),
        };
        let mut reader = BufReader::new(file.take(MAX_PACKED_REFS));
        let mut line = Vec::new();
        let mut first = true;
        let mut found = None;
        loop {
            line.clear();
            let read = (&mut reader)
                .take(MAX_PACKED_LINE)
                .read_until(b'\n', &mut line)
                .map_err(|_| "`packed-refs` cannot be read")?;
            if read == 0 {
                return Ok(found.map(RefContent::Commit));
            }
            let body = line
                .strip_suffix(b"\n")
                .ok_or("`packed-refs` has an overlong or unterminated line")?;
            if std::mem::take(&mut first) && body.starts_with(b"# pack-refs with:") {
                continue;
            }
            if let Some(peeled) = body.strip_prefix(b"^") {
                // The commit an annotated tag above points to: not a ref of its own.
                object_id(peeled).ok_or(MALFORMED)?;
                continue;
            }
            let space = body.iter().position(|&b| b == b' ').ok_or(MALFORMED)?;
            let (id, listed) = (&body[..space], &body[space + 1..]);
            let id = object_id(id).ok_or(MALFORMED)?;
            if listed == name.as_bytes() && found.replace(id).is_some() {
                return Err("`packed-refs` lists the ref twice");
            }
        }
    }
}

/// What a HEAD or a loose ref holds.
#[derive(Debug, PartialEq, Eq)]
enum RefContent {
    /// An object id (lowercase hex).
    Commit(String),
    /// The name of another ref (checked by [`ref_name`]).
    Symbolic(String),
}

/// Reads a HEAD or loose ref in its canonical forms only: `ref: NAME\n` or `ID\n` (the
/// newline optional); anything git may read differently is `None`.
fn parse_ref(bytes: &[u8]) -> Option<RefContent> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    match body.strip_prefix(b"ref: ") {
        Some(name) => ref_name(name).map(RefContent::Symbolic),
        None => object_id(body).map(RefContent::Commit),
    }
}

/// `bytes` as a full object id: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits.
fn object_id(bytes: &[u8]) -> Option<String> {
    let hex = matches!(bytes.len(), 40 | 64)
        && bytes
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    hex.then(|| String::from_utf8_lossy(bytes).into_owned())
}

/// `bytes` as a ref name this module follows: `refs/` and components git accepts (a subset
/// of `git check-ref-format`), so that it names a file beneath `refs` and nothing else.
fn ref_name(bytes: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(bytes).ok()?;
    let rest = name.strip_prefix("refs/")?;
    if name.len() > MAX_REF_NAME || name.contains("@{") || name.contains("..") {
        return None;
    }
    let forbidden =
        |c: char| c.is_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\');
    let component_ok = |c: &str| {
        !c.is_empty()
            && !c.starts_with('.')
            && !c.ends_with(".lock")
            && !c.ends_with('.')
            && !c.contains(forbidden)
    };
    rest.split('/').all(component_ok).then(|| name.to_string())
}

/// The content of a one-line file: everything before a final newline, which must hold no
/// other line break or NUL and must not be empty.
fn one_line(bytes: &[u8]) -> Option<&[u8]> {
    let line = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let clean = !line.is_empty() && !line.iter().any(|b| matches!(b, b'\n' | b'\r' | 0));
    clean.then_some(line)
}

/// How reading a small file went.
enum SmallFile {
    /// Its bytes.
    Bytes(Vec<u8>),
    /// It does not exist (nor does a directory on its path).
    Missing,
    /// It exists and is not something read here.
    Unusable(Unanswerable),
}

/// Reads the regular file at `path`, at most `limit` bytes (see [`open_regular`]).
fn read_small(path: &Path, limit: u64) -> SmallFile {
    let file = match open_regular(path, limit) {
        Ok(Some(file)) => file,
        Ok(None) => return SmallFile::Missing,
        Err(why) => return SmallFile::Unusable(why),
    };
    let mut bytes = Vec::new();
    match file.take(limit.saturating_add(1)).read_to_end(&mut bytes) {
        Ok(_) if bytes.len() as u64 <= limit => SmallFile::Bytes(bytes),
        Ok(_) => SmallFile::Unusable("a file grew past its bound while read"),
        Err(_) => SmallFile::Unusable("a file cannot be read"),
    }
}

/// Opens the regular file at `path` of at most `limit` bytes, without following a symlink
/// in its last component and without blocking (a FIFO opens at once, and is refused);
/// `None` when it (or a directory on its path) does not exist.
fn open_regular(path: &Path, limit: u64) -> Result<Option<File>, Unanswerable> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = match rustix::fs::open(path, flags | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR) => return Ok(None),
        Err(Errno::LOOP) => return Err("a file of the repository is a symbolic link"),
        Err(_) => return Err("a file of the repository cannot be opened"),
    };
    let stat = rustix::fs::fstat(&fd).map_err(|_| "a file of the repository cannot be examined")?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err("a file of the repository is not a regular file");
    }
    if u64::try_from(stat.st_size).map_or(true, |size| size > limit) {
        return Err("a file of the repository is larger than read here");
    }
    Ok(Some(File::from(fd)))
}

/// Refuses a repository git would check ownership of against `safe.directory`: one of
/// `paths` (the worktree, its `.git` and the git directory) owned by another user than the
/// daemon's, or a root daemon run through sudo (git then checks against `SUDO_UID`).
fn check_owner(paths: &[&Path]) -> Result<(), Unanswerable> {
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 && std::env::var_os("SUDO_UID").is_some() {
        return Err("git checks ownership against SUDO_UID");
    }
    for path in paths {
        let owner = std::fs::symlink_metadata(path)
            .map_err(|_| "a repository directory cannot be examined")?
            .uid();
        if owner != uid {
            return Err("the repository belongs to another user (git's safe.directory)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::git_stdout;
    use std::os::unix::fs::PermissionsExt;

    /// Runs git as a user would set a repository up, with an identity and no hooks.
    fn git(dir: &Path, args: &[&str]) -> String {
        git_stdout(
            crate::daemon_git::command(dir)
                .args(["-c", "user.name=T", "-c", "user.email=t@localhost"])
                .args(["-c", "commit.gpgsign=false"])
                .args(args),
            false,
        )
    }

    fn repo_with_commit(dir: &Path) -> PathBuf {
        let repo = dir.join("repo");
        std::fs::create_dir_all(repo.join("src")).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("src/a.txt"), "a\n").unwrap();
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", "first"]);
        repo
    }

    /// The files' answer for `dir`, checked against git's: an answer the files give must be
    /// git's, and `head_commit` always gives git's.
    fn agrees_with_git(dir: &Path) -> HeadFromFiles {
        let git_says = head_commit_by_git(dir);
        let files = head_from_files(dir);
        match &files {
            HeadFromFiles::Commit(commit) => {
                assert_eq!(Some(commit), git_says.as_ref(), "in {}", dir.display())
            }
            HeadFromFiles::NoCommit => assert_eq!(git_says, None, "in {}", dir.display()),
            HeadFromFiles::AskGit(_) => {}
        }
        assert_eq!(head_commit(dir), git_says, "in {}", dir.display());
        files
    }

    fn answered(files: HeadFromFiles) -> Option<String> {
        match files {
            HeadFromFiles::Commit(c) => Some(c),
            HeadFromFiles::NoCommit => None,
            HeadFromFiles::AskGit(why) => panic!("the files should answer, yet: {why}"),
        }
    }

    #[test]
    fn the_files_answer_as_git_does_for_the_shapes_the_daemon_meets() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        // A branch with no commit yet.
        assert_eq!(answered(agrees_with_git(&repo)), None);

        let repo = repo_with_commit(dir.path());
        let first = git(&repo, &["rev-parse", "HEAD"]);
        assert_eq!(answered(agrees_with_git(&repo)), Some(first.clone()));
        // From a directory inside the worktree.
        assert_eq!(
            answered(agrees_with_git(&repo.join("src"))),
            Some(first.clone())
        );

        // A linked worktree on its own branch: `.git` is a `gitdir:` file, branches live in
        // the common directory.
        let linked = dir.path().join("linked");
        git(
            &repo,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                "loop",
                linked.to_str().unwrap(),
            ],
        );
        assert!(linked.join(".git").is_file());
        assert_eq!(answered(agrees_with_git(&linked)), Some(first.clone()));
        std::fs::write(linked.join("src/a.txt"), "b\n").unwrap();
        git(&linked, &["commit", "-qam", "second"]);
        let second = git(&linked, &["rev-parse", "HEAD"]);
        assert_ne!(first, second);
        assert_eq!(answered(agrees_with_git(&linked)), Some(second.clone()));
        assert_eq!(answered(agrees_with_git(&repo)), Some(first.clone()));

        // Every ref packed: no loose ref file left.
        git(&repo, &["tag", "-a", "-m", "annotated", "v1"]);
        git(&repo, &["pack-refs", "--all"]);
        assert!(!repo.join(".git/refs/heads/main").exists());
        let packed = std::fs::read_to_string(repo.join(".git/packed-refs")).unwrap();
        assert!(packed.contains("refs/heads/loop") && packed.contains("\n^"));
        assert_eq!(answered(agrees_with_git(&repo)), Some(first.clone()));
        assert_eq!(answered(agrees_with_git(&linked)), Some(second.clone()));

        // Detached HEAD, in the main worktree and in the linked one.
        git(&repo, &["checkout", "-q", "--detach", "HEAD"]);
        assert_eq!(answered(agrees_with_git(&repo)), Some(first.clone()));
        git(&linked, &["checkout", "-q", "--detach", &first]);
        assert_eq!(answered(agrees_with_git(&linked)), Some(first.clone()));

        // A branch that is a symbolic ref to another.
        git(
            &repo,
            &["symbolic-ref", "refs/heads/alias", "refs/heads/loop"],
        );
        git(&repo, &["symbolic-ref", "HEAD", "refs/heads/alias"]);
        assert_eq!(answered(agrees_with_git(&repo)), Some(second.clone()));
        // A symbolic ref to a branch that does not exist: no commit.
        git(&repo, &["symbolic-ref", "HEAD", "refs/heads/nothing/yet"]);
        assert_eq!(answered(agrees_with_git(&repo)), None);

        // A relative `gitdir:` line (as `git worktree add --relative-paths` and submodules
        // write) is relative to the directory holding the file.
        let relative = dir.path().join("relative");
        std::fs::create_dir(&relative).unwrap();
        std::fs::write(relative.join(".git"), "gitdir: ../repo/.git\n").unwrap();
        git(&repo, &["symbolic-ref", "HEAD", "refs/heads/main"]);
        assert_eq!(answered(agrees_with_git(&relative)), Some(first));
    }

    #[test]
    fn outside_any_repository_there_is_no_commit() {
        let dir = tempfile::tempdir().unwrap();
        // The walk reaches `/` (or stops at a mount point) without finding a repository.
        assert_eq!(agrees_with_git(dir.path()), HeadFromFiles::NoCommit);
    }

    #[test]
    fn hostile_heads_are_left_to_git_or_read_as_git_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repo_with_commit(dir.path());
        let head = repo.join(".git/HEAD");
        // A ref file outside `refs` that a path escape would reach.
        let planted = "1111111111111111111111111111111111111111";
        std::fs::write(repo.join(".git/planted"), format!("{planted}\n")).unwrap();
        std::fs::write(dir.path().join("planted"), format!("{planted}\n")).unwrap();
        let first = git(&repo, &["rev-parse", "HEAD"]);
        let heads: Vec<Vec<u8>> = vec![
            b"ref: refs/../planted\n".to_vec(),
            b"ref: refs/heads/../../planted\n".to_vec(),
            b"ref: refs/heads/../../../planted\n".to_vec(),
            b"ref: /etc/passwd\n".to_vec(),
            b"ref: planted\n".to_vec(),
            b"ref: refs/heads/.hidden\n".to_vec(),
            b"ref: refs/heads/main.lock\n".to_vec(),
            b"ref: refs/heads//main\n".to_vec(),
            b"ref: refs/heads/ma\0in\n".to_vec(),
            b"ref: refs/heads/main\n\n".to_vec(),
            b"ref:refs/heads/main\n".to_vec(),
            b"ref:  refs/heads/main  \n".to_vec(),
            b"ref: refs/heads/main".to_vec(),
            b"ref: refs/heads/.invalid\n".to_vec(),
            format!("{}\n", first.to_uppercase()).into_bytes(),
            format!("{first} trailing\n").into_bytes(),
            first.clone().into_bytes(),
            first.as_bytes()[..39].to_vec(),
            b"\n".to_vec(),
            Vec::new(),
            vec![b'a'; 100_000],
            [b"ref: refs/heads/".as_slice(), &[b'm'; 5000]].concat(),
            vec![0xff, 0xfe, b'\n'],
        ];
        for content in &heads {
            std::fs::write(&head, content).unwrap();
            let files = agrees_with_git(&repo);
            assert_ne!(
                files,
                HeadFromFiles::Commit(planted.to_string()),
                "HEAD {:?} led outside refs",
                String::from_utf8_lossy(content)
            );
        }
        // The canonical forms are answered from the files.
        std::fs::write(&head, "ref: refs/heads/main\n").unwrap();
        assert_eq!(answered(agrees_with_git(&repo)), Some(first.clone()));
        std::fs::write(&head, format!("{first}\n")).unwrap();
        assert_eq!(answered(agrees_with_git(&repo)), Some(first.clone()));
        std::fs::write(&head, "ref: refs/heads/main\n").unwrap();

        // Loose refs as hostile as HEAD.
        let loose = repo.join(".git/refs/heads/main");
        for content in [
            b"ref: refs/heads/../../planted\n".to_vec(),
            b"garbage\n".to_vec(),
            vec![b'0'; 10_000],
        ] {
            std::fs::write(&loose, &content).unwrap();
            assert_ne!(
                agrees_with_git(&repo),
                HeadFromFiles::Commit(planted.to_string())
            );
        }
        std::fs::write(&loose, format!("{first}\n")).unwrap();
        assert_eq!(answered(agrees_with_git(&repo)), Some(first.clone()));
        // Symbolic refs that loop: git gives up, so do the files.
        std::fs::write(&loose, "ref: refs/heads/main\n").unwrap();
        assert!(matches!(agrees_with_git(&repo), HeadFromFiles::AskGit(_)));
        std::fs::write(&loose, format!("{first}\n")).unwrap();

        // A symlink as HEAD or as the branch's ref is left to git (which follows it).
        std::fs::remove_file(&loose).unwrap();
        std::os::unix::fs::symlink(dir.path().join("planted"), &loose).unwrap();
        assert!(matches!(agrees_with_git(&repo), HeadFromFiles::AskGit(_)));
        std::fs::remove_file(&loose).unwrap();
        std::fs::write(&loose, format!("{first}\n")).unwrap();
        std::fs::rename(&head, repo.join(".git/HEAD.real")).unwrap();
        std::os::unix::fs::symlink("HEAD.real", &head).unwrap();
        assert!(matches!(agrees_with_git(&repo), HeadFromFiles::AskGit(_)));
        std::fs::remove_file(&head).unwrap();
        std::fs::rename(repo.join(".git/HEAD.real"), &head).unwrap();
        assert_eq!(answered(agrees_with_git(&repo)), Some(first));
    }

    #[test]
    fn a_fifo_where_a_ref_should_be_cannot_hang_the_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repo_with_commit(dir.path());
        let loose = repo.join(".git/refs/heads/main");
        std::fs::remove_file(&loose).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &loose,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // No writer ever comes: a blocking open would never return.
        let (tx, rx) = std::sync::mpsc::channel();
        let at = repo.clone();
        std::thread::spawn(move || tx.send(head_from_files(&at)));
        let files = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the lookup returned");
        assert!(matches!(files, HeadFromFiles::AskGit(_)), "{files:?}");
    }

    #[test]
    fn hostile_gitdir_files_and_packed_refs_are_left_to_git() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repo_with_commit(dir.path());
        let first = git(&repo, &["rev-parse", "HEAD"]);
        let wt = dir.path().join("wt");
        std::fs::create_dir(&wt).unwrap();
        let gitfile = wt.join(".git");
        let good = format!("gitdir: {}\n", repo.join(".git").display());
        for content in [
            b"gitdir: /nonexistent/place\n".to_vec(),
            b"gitdir: \n".to_vec(),
            b"gitdir:\n".to_vec(),
            b"gitdir: ../repo/.git\r\n".to_vec(),
            format!("{good}{good}").into_bytes(),
            [good.as_bytes(), &vec![b' '; 10_000]].concat(),
            b"nothing git would read\n".to_vec(),
            // A directory that is no git directory.
            format!("gitdir: {}\n", repo.join("src").display()).into_bytes(),
        ] {
            std::fs::write(&gitfile, &content).unwrap();
            assert!(
                matches!(agrees_with_git(&wt), HeadFromFiles::AskGit(_)),
                "{:?}",
                String::from_utf8_lossy(&content)
            );
        }
        std::fs::write(&gitfile, &good).unwrap();
        assert_eq!(answered(agrees_with_git(&wt)), Some(first.clone()));

        // Packed refs: a malformed or overlong line is git's to judge.
        git(&repo, &["pack-refs", "--all"]);
        let packed_path = repo.join(".git/packed-refs");
        let packed = std::fs::read_to_string(&packed_path).unwrap();
        for content in [
            format!("{packed}garbage line\n"),
            packed.trim_end().to_string(),
            format!("{packed}{} refs/heads/{}\n", first, "x".repeat(5000)),
            packed.replace(&first, &first.to_uppercase()),
        ] {
            std::fs::write(&packed_path, &content).unwrap();
            assert!(matches!(agrees_with_git(&repo), HeadFromFiles::AskGit(_)));
        }
        std::fs::write(&packed_path, &packed).unwrap();
        assert_eq!(answered(agrees_with_git(&repo)), Some(first));
    }

    #[test]
    fn repositories_whose_refs_the_files_cannot_read_are_asked_of_git() {
        let dir = tempfile::tempdir().unwrap();
        // SHA-256 object ids and reftable refs are both announced by `extensions` in the
        // config; git (2.45 and newer for reftable) reads them.
        for (name, format) in [
            ("sha256", "--object-format=sha256"),
            ("reftable", "--ref-format=reftable"),
        ] {
            let repo = dir.path().join(name);
            std::fs::create_dir(&repo).unwrap();
            let init = crate::daemon_git::command(&repo)
                .args(["init", "-q", "-b", "main", format])
                .output()
                .unwrap();
            if !init.status.success() {
                // An older git without this format: nothing of the kind can exist here.
                continue;
            }
            std::fs::write(repo.join("a"), "a").unwrap();
            git(&repo, &["add", "-A"]);
            git(&repo, &["commit", "-q", "-m", "first"]);
            assert!(matches!(agrees_with_git(&repo), HeadFromFiles::AskGit(_)));
            assert!(head_commit(&repo).is_some());
        }
    }

    #[test]
    fn a_repository_of_another_user_is_left_to_git() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repo_with_commit(dir.path());
        let ours = rustix::process::geteuid().as_raw();
        if ours != 0 {
            // Only root can give a directory away; the check itself is exercised below.
            assert_eq!(check_owner(&[&repo]), Ok(()));
            return;
        }
        std::fs::set_permissions(&repo, std::fs::Permissions::from_mode(0o755)).unwrap();
        rustix::fs::chown(&repo, Some(rustix::fs::Uid::from_raw(4242)), None).unwrap();
        assert!(matches!(
            agrees_with_git(&repo),
            HeadFromFiles::AskGit("the repository belongs to another user (git's safe.directory)")
        ));
        rustix::fs::chown(&repo, Some(rustix::fs::Uid::from_raw(ours)), None).unwrap();
        assert!(matches!(agrees_with_git(&repo), HeadFromFiles::Commit(_)));
    }

    #[test]
    fn ref_names_are_plain_names_beneath_refs() {
        for good in [
            "refs/heads/main",
            "refs/heads/taskdaemon/r1/api",
            "refs/heads/fé",
        ] {
            assert_eq!(ref_name(good.as_bytes()).as_deref(), Some(good));
        }
        for bad in [
            "refs/heads/../x",
            "refs/heads/.x",
            "refs/heads/x.lock",
            "refs/heads/x.",
            "refs/heads/",
            "refs//x",
            "refs/heads/a b",
            "refs/heads/a@{1}",
            "refs/heads/a:b",
            "heads/main",
            "/refs/heads/main",
            "HEAD",
        ] {
            assert_eq!(ref_name(bad.as_bytes()), None, "{bad}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn git_is_asked_safely_from_either_kind_of_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repo_with_commit(dir.path());
        std::fs::write(repo.join(".git/HEAD"), "ref:refs/heads/main\n").unwrap();
        let expected = git(&repo, &["rev-parse", "HEAD"]);
        assert!(matches!(head_from_files(&repo), HeadFromFiles::AskGit(_)));
        assert_eq!(head_commit(&repo), Some(expected));
        // And on a current-thread runtime, where block_in_place would panic.
        let at = repo.clone();
        let answer = tokio::task::spawn_blocking(move || {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(async { head_commit(&at) })
        })
        .await
        .unwrap();
        assert!(answer.is_some());
    }

    #[test]
    fn the_files_say_sha1_only_where_git_does() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repo_with_commit(dir.path());
        let format = |at: &Path| {
            git(at, &["rev-parse", "--show-object-format"])
                .trim()
                .to_string()
        };
        // A worktree root, a directory in it, a bare repository and a linked worktree.
        let bare = dir.path().join("bare.git");
        git(dir.path(), &["clone", "-q", "--bare", "repo", "bare.git"]);
        let linked = dir.path().join("linked");
        git(&repo, &["worktree", "add", "-q", linked.to_str().unwrap()]);
        for at in [repo.clone(), repo.join("src"), bare.clone(), linked] {
            assert_eq!(format(&at), "sha1", "{at:?}");
            // And the common directory is git's.
            let common = git(
                &at,
                &["rev-parse", "--path-format=absolute", "--git-common-dir"],
            );
            let common = Path::new(common.trim()).canonicalize().unwrap();
            match format_by_files(&at) {
                FormatByFiles::Sha1 { common_dir } => {
                    assert_eq!(common_dir.canonicalize().unwrap(), common, "{at:?}")
                }
                other => panic!("{at:?}: {other:?}"),
            }
        }
        // SHA-256: git answers; and no repository at all.
        let sha256 = dir.path().join("sha256");
        std::fs::create_dir_all(&sha256).unwrap();
        git(&sha256, &["init", "-q", "--object-format=sha256"]);
        assert_eq!(format(&sha256), "sha256");
        assert_eq!(format_by_files(&sha256), FormatByFiles::AskGit);
        let bare256 = dir.path().join("bare256.git");
        git(
            &sha256,
            &[
                "init",
                "-q",
                "--bare",
                "--object-format=sha256",
                bare256.to_str().unwrap(),
            ],
        );
        assert_eq!(format_by_files(&bare256), FormatByFiles::AskGit);
        let nowhere = dir.path().join("nowhere");
        std::fs::create_dir_all(&nowhere).unwrap();
        let out = crate::daemon_git::unguarded(&nowhere)
            .args(["rev-parse", "--show-object-format"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "git finds no repository either");
        assert_eq!(format_by_files(&nowhere), FormatByFiles::NoRepository);
    }
}
