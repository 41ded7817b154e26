//! Moving commits between the head's repository and a worker host, as git bundle files (the
//! bytes travel over the cluster connection; this module only writes and reads files).
//!
//! - The head bundles the history of a loop's base commit, leaving out what the host says it
//!   already has ([`bundle_commits`]); the host keeps what it receives in a bare repository
//!   of its own, its [`Mirror`] ([`Mirror::receive`]), and checks the loop's worktree out of
//!   it ([`Mirror::add_worktree`]).
//! - At the loop's end the host bundles the commits the loop made on its base
//!   ([`Mirror::bundle_branch`]), and the head takes them into one ref ([`take_branch`]).
//!
//! Each side treats the other's file as hostile: a host runs a model's commands, and a head
//! may be an impostor or broken. A bundle is received in three steps, and nothing changes in
//! the receiving repository before the last one:
//! 1. the file is copied where nobody else writes, its size capped before anything reads it
//!    whole ([`private_copy`]); its header is read by hand ([`header`]): exactly one ref,
//!    a name without `..` or control characters, the receiver's object format;
//! 2. its pack is indexed into a quarantine, a scratch bare repository that sees the
//!    receiver's objects through `objects/info/alternates` but writes only to its own
//!    (`git index-pack --strict`: every object checked as `git fsck` would, every link
//!    present), and the tip's history is walked to its prerequisites there; on the head,
//!    what that history needs beyond the loop's base must be in the bundle's own pack, and
//!    what else it or the pack's deltas use must be reached by the base ([`sent`]: the
//!    quarantine would otherwise lend the host any commit or file the head has);
//! 3. only then are the objects the tip needs (and no others the file may carry) packed out
//!    of the quarantine into the receiver, and the one ref is set (`git update-ref`).
//!
//! Why not `git fetch <bundle>`: it updates whatever refs the refspec matches, reads the
//! user's `fetch.*` config (prune, submodules), checks objects only from git 2.46 on (2.39
//! accepts a malformed commit from a bundle with `transfer.fsckObjects=true`), and leaves a
//! `tmp_pack_*` file in the repository when its check fails.
//!
//! Every git command runs as the daemon's own git does ([`crate::daemon_git::command`]: no
//! hooks, no fsmonitor, nothing inherited that points git elsewhere), with `--git-dir` given
//! explicitly (a bare repository is then found even with `safe.bareRepository=explicit`, and
//! the `.git` file of a worktree a loop writes in is never what decides the repository).

mod header;
pub mod lfs;
mod sent;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::worktree::{GitInput, GitOutput, MAX_STDERR, Repo, Worktree, WorktreeError};
use header::{Header, ObjectFormat, is_object_id, refname_problem};

/// Most commits a host may name as already had ([`bundle_commits`]'s `have`). A host names
/// the tips of its mirror's refs, one or two per loop it ran; more than this is a host
/// flooding the head's git with arguments.
pub const MAX_HAVES: usize = 10_000;

/// Most prerequisites a received bundle may name: a loop's branch has one (its base), a
/// few more when it merged other work; thousands are a host making the head check them all.
pub const MAX_PREREQUISITES: usize = 1_000;

/// Where a mirror keeps each tip it received: `refs/taskdaemon/received/<tip>`, so that
/// what it received stays reachable (git's garbage collection keeps it) and
/// [`Mirror::commits`] can name it.
pub const RECEIVED_PREFIX: &str = "refs/taskdaemon/received/";

/// The ref a bundle made on the head carries (the tip is a commit id, and git bundles only
/// name refs).
const HEAD_BUNDLE_REF: &str = "refs/taskdaemon/tip";

/// Result of this module's operations.
pub type Result<T, E = TransferError> = std::result::Result<T, E>;

/// What a bundle file holds, as written or received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleInfo {
    /// The commit its one ref points at.
    pub tip: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Commits the receiver must already have: the bundle's history stops at them.
    pub prerequisites: Vec<String>,
}

/// Everything that can go wrong; each message says what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// A git command failed, or git cannot be run.
    #[error(transparent)]
    Git(#[from] WorktreeError),
    /// A file or directory could not be read or written.
    #[error("cannot {action} {}: {detail}; check that the path exists and is writable by TaskDaemon", path.display())]
    File {
        /// What was being done ("read the bundle", ...).
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// What the file system said.
        detail: String,
    },
    /// A bundle larger than the cap the caller set.
    #[error(
        "refused the bundle {}: it holds {bytes} bytes, over the cap of {max}; nothing was changed in {}. If a history this large is expected, raise the cap; otherwise look at what was committed (large generated files?)",
        path.display(), repo.display()
    )]
    TooBig {
        /// The bundle file.
        path: PathBuf,
        /// The receiving repository.
        repo: PathBuf,
        /// Its size (at least; reading stopped at the cap).
        bytes: u64,
        /// The cap.
        max: u64,
    },
    /// A bundle that is not one, or fails a check (refs, names, prerequisites, ancestry,
    /// objects). The receiving repository is as it was.
    #[error(
        "refused the bundle {}: {reason}; nothing was changed in {}. The sender is broken or hostile: do not retry with the same file",
        path.display(), repo.display()
    )]
    Refused {
        /// The bundle file.
        path: PathBuf,
        /// The receiving repository.
        repo: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// An argument that cannot be used (not a commit id, an unknown commit, a bad ref name).
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// The value given (cut when long).
        value: String,
        /// Why, and what to give instead.
        reason: String,
    },
    /// The mirror directory exists and is not a bare git repository.
    #[error(
        "{} cannot be the host's mirror: {detail}; remove it or give the host another work directory",
        dir.display()
    )]
    NotAMirror {
        /// The directory.
        dir: PathBuf,
        /// What is there.
        detail: String,
    },
}

/// `value` for an error message: cut, so a host cannot make the head's log huge.
fn shown(value: &str) -> String {
    td_base::text::head_tail(value, 200)
}

fn invalid(what: &'static str, value: &str, reason: impl Into<String>) -> TransferError {
    TransferError::Invalid {
        what,
        value: shown(value),
        reason: reason.into(),
    }
}

/// A repository git is pointed at with `--git-dir` (the head's common git dir, a mirror, a
/// quarantine), with the environment of the [`Repo`] or [`Mirror`] it belongs to.
struct Target {
    git: crate::worktree::Git,
    git_dir: PathBuf,
    /// Its object format, once read: shared with the [`Repo`] or [`Mirror`].
    format: KnownFormat,
    /// Where its git-lfs objects are, once read: shared with the [`Repo`] or [`Mirror`].
    lfs: lfs::KnownLfsObjects,
}

/// A repository's object format, read from git once and kept: every transfer checks ids
/// against it, and asking git each time was one process more per transfer (two per branch
/// taken, which the head does for each checkpoint of every loop on a host). A repository's
/// format is fixed when it is made; git cannot convert one in place.
#[derive(Debug, Clone, Default)]
pub(crate) struct KnownFormat(Arc<OnceLock<ObjectFormat>>);

impl KnownFormat {
    /// Known already (a quarantine is made in its target's format).
    fn of(format: ObjectFormat) -> KnownFormat {
        KnownFormat(Arc::new(OnceLock::from(format)))
    }
}

/// A cache: not part of what a repository is (two handles of one repository are equal
/// whether or not either has read its format yet).
impl PartialEq for KnownFormat {
    fn eq(&self, _: &KnownFormat) -> bool {
        true
    }
}

impl Eq for KnownFormat {}

impl Target {
    async fn output<S: AsRef<OsStr>>(&self, args: &[S], input: GitInput) -> Result<GitOutput> {
        let mut all: Vec<OsString> = Vec::with_capacity(args.len() + 1);
        let mut flag = OsString::from("--git-dir=");
        flag.push(&self.git_dir);
        all.push(flag);
        all.extend(args.iter().map(|a| a.as_ref().to_owned()));
        Ok(self.git.output_with(&self.git_dir, all, input).await?)
    }

    async fn run<S: AsRef<OsStr>>(
        &self,
        args: &[S],
        input: GitInput,
        hint: &str,
    ) -> Result<String> {
        let out = self.output(args, input).await?;
        if out.success() {
            Ok(out.text())
        } else {
            Err(out.into_error(hint).into())
        }
    }

    async fn object_format(&self) -> Result<ObjectFormat> {
        if let Some(format) = self.format.0.get() {
            return Ok(*format);
        }
        let name = self
            .run(
                &["rev-parse", "--show-object-format"],
                GitInput::None,
                "TaskDaemon needs git 2.25 or newer; check `git --version`",
            )
            .await?;
        let format = ObjectFormat::parse(&name).ok_or_else(|| {
            invalid(
                "repository",
                &self.git_dir.display().to_string(),
                format!("its object format {name:?} is unknown to TaskDaemon"),
            )
        })?;
        Ok(*self.format.0.get_or_init(|| format))
    }

    /// Which of `ids` (valid object ids) name commits here.
    async fn commits_among(&self, ids: &[String]) -> Result<HashSet<String>> {
        if ids.is_empty() {
            return Ok(HashSet::new());
        }
        let mut input = ids.join("\n").into_bytes();
        input.push(b'\n');
        let listing = self
            .run(
                &["cat-file", "--batch-check=%(objectname) %(objecttype)"],
                GitInput::Bytes(input),
                "check that the repository is readable",
            )
            .await?;
        Ok(listing
            .lines()
            .filter_map(|l| l.strip_suffix(" commit"))
            .map(str::to_string)
            .collect())
    }

    async fn is_commit(&self, id: &str) -> Result<bool> {
        Ok(self.commits_among(&[id.to_string()]).await?.contains(id))
    }

    /// Whether `ancestor` is reachable from `descendant` (both commits here).
    async fn is_ancestor(&self, ancestor: &str, descendant: &str) -> Result<bool> {
        let out = self
            .output(
                &["merge-base", "--is-ancestor", ancestor, descendant],
                GitInput::None,
            )
            .await?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(out
                .into_error("check that the repository is readable")
                .into()),
        }
    }

    /// The commits reachable from `from` and from none of `not`, listed by `rev-list` with
    /// `options` (all ids valid; given on stdin, so any number fits).
    async fn rev_list(&self, options: &[&str], from: &[&str], not: &[String]) -> Result<String> {
        let mut input = String::new();
        for id in from {
            input.push_str(id);
            input.push('\n');
        }
        for id in not {
            input.push('^');
            input.push_str(id);
            input.push('\n');
        }
        let mut args = vec!["rev-list"];
        args.extend_from_slice(options);
        args.push("--stdin");
        self.run(
            &args,
            GitInput::Bytes(input.into_bytes()),
            "check that the repository is readable",
        )
        .await
    }

    /// Whether git accepts `name` as a full ref name (its rules, beyond [`refname_problem`]).
    async fn ref_name_ok(&self, name: &str) -> Result<bool> {
        let out = self
            .output(&["check-ref-format", name], GitInput::None)
            .await?;
        Ok(out.success())
    }
}

/// Refuses `id` unless it is an object id of `format`.
fn check_id(what: &'static str, id: &str, format: ObjectFormat) -> Result<()> {
    if is_object_id(id, format) {
        Ok(())
    } else {
        Err(invalid(
            what,
            id,
            format!(
                "it is not a full {} commit id ({} lowercase hex digits)",
                format.name(),
                format.hex_len()
            ),
        ))
    }
}

/// Refuses `into` unless it is a full ref name the caller may set.
async fn check_into_ref(target: &Target, into: &str) -> Result<()> {
    if let Some(problem) = refname_problem(into) {
        return Err(invalid(
            "ref",
            into,
            format!("{problem}; give a full ref name such as refs/taskdaemon/incoming/<loop>"),
        ));
    }
    if !target.ref_name_ok(into).await? {
        return Err(invalid(
            "ref",
            into,
            "git does not accept it as a ref name (`git check-ref-format`); give a full ref name such as refs/taskdaemon/incoming/<loop>",
        ));
    }
    Ok(())
}

/// Absolute form of a path given by the caller (git runs elsewhere).
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|e| TransferError::File {
        action: "resolve",
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

/// Copies `src` to `dest`, refusing it unless it is a regular file of at most `max_bytes`.
/// The size is checked on the opened file before anything is read (a host's bundle of
/// gigabytes costs nothing), and the copy stops one byte past the cap (a file that grows
/// while it is copied). `O_NOFOLLOW` and `O_NONBLOCK`: a symlink is not followed to some
/// other file, and a FIFO put in the file's place does not block the open forever (it then
/// fails the regular-file check). Returns the bytes copied.
fn private_copy(src: &Path, dest: &Path, max_bytes: u64) -> std::result::Result<u64, CopyProblem> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        src,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| CopyProblem::NotReadable(std::io::Error::from(e).to_string()))?;
    let file = std::fs::File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| CopyProblem::NotReadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(CopyProblem::NotAFile);
    }
    if meta.len() > max_bytes {
        return Err(CopyProblem::TooBig(meta.len()));
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dest)
        .map_err(|e| CopyProblem::NotWritable(e.to_string()))?;
    let copied = std::io::copy(&mut file.take(max_bytes.saturating_add(1)), &mut out)
        .map_err(|e| CopyProblem::NotReadable(e.to_string()))?;
    if copied > max_bytes {
        return Err(CopyProblem::TooBig(copied));
    }
    Ok(copied)
}

/// Why [`private_copy`] refused or failed.
enum CopyProblem {
    NotReadable(String),
    NotWritable(String),
    NotAFile,
    TooBig(u64),
}

/// A scratch bare repository that sees a target's objects (alternates) and writes only its
/// own; removed when dropped.
struct Quarantine {
    dir: tempfile::TempDir,
    repo: Target,
}

/// A new scratch directory under the system's temporary directory, removed when dropped.
fn scratch_dir() -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("taskdaemon-transfer-")
        .tempdir()
        .map_err(|e| TransferError::File {
            action: "create a scratch directory in",
            path: std::env::temp_dir(),
            detail: e.to_string(),
        })
}

impl Quarantine {
    /// The quarantine of `target`, made in `dir` (which it then owns).
    async fn new(
        dir: tempfile::TempDir,
        target: &Target,
        format: ObjectFormat,
    ) -> Result<Quarantine> {
        let git_dir = dir.path().join("quarantine.git");
        let mut args: Vec<OsString> = ["init", "--bare", "--quiet", "--template="]
            .iter()
            .map(OsString::from)
            .collect();
        // Only when needed: `--object-format` is refused by a git older than 2.29.
        if format != ObjectFormat::Sha1 {
            args.push(format!("--object-format={}", format.name()).into());
        }
        args.push(git_dir.clone().into_os_string());
        let out = target
            .git
            .output_with(dir.path(), args, GitInput::None)
            .await?;
        if !out.success() {
            return Err(out
                .into_error("check that the temporary directory is writable")
                .into());
        }
        let objects = std::fs::canonicalize(target.git_dir.join("objects")).map_err(|e| {
            TransferError::File {
                action: "find the objects of",
                path: target.git_dir.clone(),
                detail: e.to_string(),
            }
        })?;
        let alternates = git_dir.join("objects/info/alternates");
        let mut line = objects.into_os_string().into_encoded_bytes();
        line.push(b'\n');
        std::fs::write(&alternates, line).map_err(|e| TransferError::File {
            action: "write",
            path: alternates.clone(),
            detail: e.to_string(),
        })?;
        Ok(Quarantine {
            repo: Target {
                git: target.git.clone(),
                git_dir,
                format: KnownFormat::of(format),
                lfs: Default::default(),
            },
            dir,
        })
    }
}

/// A received bundle: copied, its header read, its one ref checked; not yet indexed.
struct Incoming {
    quarantine: Quarantine,
    copy: PathBuf,
    header: Header,
    bytes: u64,
    tip: String,
    source: PathBuf,
    receiver: PathBuf,
}

impl Incoming {
    fn refused(&self, reason: impl Into<String>) -> TransferError {
        TransferError::Refused {
            path: self.source.clone(),
            repo: self.receiver.clone(),
            reason: reason.into(),
        }
    }

    /// Step 1: the private copy and its header. `receiver` names the repository in errors.
    async fn read(
        target: &Target,
        receiver: &Path,
        bundle: &Path,
        max_bytes: u64,
    ) -> Result<Incoming> {
        let format = target.object_format().await?;
        // The copy first, the quarantine (a `git init`) only for a file that may be a bundle.
        let dir = scratch_dir()?;
        let copy = dir.path().join("incoming.bundle");
        let refused = |reason: String| TransferError::Refused {
            path: bundle.to_path_buf(),
            repo: receiver.to_path_buf(),
            reason,
        };
        let (src, dest) = (bundle.to_path_buf(), copy.clone());
        let copied = tokio::task::spawn_blocking(move || private_copy(&src, &dest, max_bytes))
            .await
            .map_err(|e| TransferError::File {
                action: "read the bundle",
                path: bundle.to_path_buf(),
                detail: e.to_string(),
            })?;
        let bytes = match copied {
            Ok(n) => n,
            Err(CopyProblem::TooBig(bytes)) => {
                return Err(TransferError::TooBig {
                    path: bundle.to_path_buf(),
                    repo: receiver.to_path_buf(),
                    bytes,
                    max: max_bytes,
                });
            }
            Err(CopyProblem::NotAFile) => {
                return Err(refused(
                    "it is not a regular file (a directory, FIFO, device or symlink)".to_string(),
                ));
            }
            Err(CopyProblem::NotReadable(detail)) => {
                return Err(TransferError::File {
                    action: "read the bundle",
                    path: bundle.to_path_buf(),
                    detail,
                });
            }
            Err(CopyProblem::NotWritable(detail)) => {
                return Err(TransferError::File {
                    action: "copy the bundle into",
                    path: copy,
                    detail,
                });
            }
        };
        let header = read_header(&copy).map_err(refused)?;
        if header.format != format {
            return Err(refused(format!(
                "its objects are {} and the repository's are {}",
                header.format.name(),
                format.name()
            )));
        }
        // One ref: the branch the sender was asked for. A second one is the sender trying
        // to set (or make the receiver hold) something else.
        let (tip, name) = match header.refs.as_slice() {
            [one] => one.clone(),
            [] => return Err(refused("it carries no ref".to_string())),
            more => {
                return Err(refused(format!(
                    "it carries {} refs ({}), and one was expected",
                    more.len(),
                    shown(
                        &more
                            .iter()
                            .map(|(_, n)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                )));
            }
        };
        if !target.ref_name_ok(&name).await? {
            return Err(refused(format!(
                "git does not accept its ref name {:?}",
                shown(&name)
            )));
        }
        if header.prerequisites.len() > MAX_PREREQUISITES {
            return Err(refused(format!(
                "it names {} prerequisites, over {MAX_PREREQUISITES}",
                header.prerequisites.len()
            )));
        }
        let quarantine = Quarantine::new(dir, target, format).await?;
        Ok(Incoming {
            quarantine,
            copy,
            header,
            bytes,
            tip,
            source: bundle.to_path_buf(),
            receiver: receiver.to_path_buf(),
        })
    }

    /// Refuses the bundle unless every prerequisite is a commit `target` has: the sender
    /// claims the receiver has them; checked before git reads the pack.
    async fn check_prerequisites_present(&self, target: &Target) -> Result<()> {
        let present = target.commits_among(&self.header.prerequisites).await?;
        let missing: Vec<&str> = self
            .header
            .prerequisites
            .iter()
            .filter(|p| !present.contains(*p))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(self.refused(format!(
                "it needs commits the repository does not have: {}",
                shown(&missing.join(", "))
            )))
        }
    }

    /// Step 2: the pack indexed into the quarantine, every object checked, and the tip's
    /// whole history present there (down to the prerequisites). Returns the name
    /// `index-pack` gave the pack (`pack-<name>.pack` in the quarantine).
    async fn index(&self) -> Result<String> {
        let q = &self.quarantine.repo;
        let mut pack = std::fs::File::open(&self.copy).map_err(|e| TransferError::File {
            action: "read",
            path: self.copy.clone(),
            detail: e.to_string(),
        })?;
        pack.seek(std::io::SeekFrom::Start(self.header.pack_offset))
            .map_err(|e| TransferError::File {
                action: "read",
                path: self.copy.clone(),
                detail: e.to_string(),
            })?;
        // `--strict`: each object is checked as `git fsck` would (a commit with a forged
        // author line, a tree with `..` or `.git` entries), and every object it names must
        // exist. `--fix-thin`: a bundle's pack may hold deltas against the receiver's objects.
        // Its memory bounded (`GitInput::Pack`): objects and deltas inflate in memory, and a
        // pack of a few KiB can ask for gigabytes. Four threads at most, whatever the
        // machine: each thread's stack counts against that bound.
        let out = q
            .output(
                &[
                    "index-pack",
                    "--stdin",
                    "--fix-thin",
                    "--strict",
                    "--threads=4",
                ],
                GitInput::Pack(pack),
            )
            .await?;
        if !out.success() {
            if out.stderr.to_ascii_lowercase().contains("out of memory") {
                return Err(self.refused(format!(
                    "its pack needs more memory to index than the head gives git ({} MiB): an object or a delta of it inflates past that",
                    crate::worktree::MAX_INDEX_MEMORY / (1024 * 1024)
                )));
            }
            return Err(self.refused(format!(
                "its pack does not pass git's checks: {}",
                td_base::text::head_tail(out.stderr.trim(), MAX_STDERR)
            )));
        }
        let answer = out.text();
        let pack = sent::indexed_pack_name(&answer, self.header.format)
            .ok_or_else(|| sent::unnamed_pack(q.git_dir.clone(), &answer))?;
        if !q.is_commit(&self.tip).await? {
            return Err(self.refused(format!(
                "its ref points at {}, which is not a commit it or the repository holds",
                self.tip
            )));
        }
        // The history of the tip, every commit, tree and blob, down to the prerequisites:
        // a pack may leave some out and still index.
        let walk = q
            .rev_list(
                &["--objects", "--quiet"],
                &[&self.tip],
                &self.header.prerequisites,
            )
            .await;
        if let Err(e) = walk {
            return Err(self.refused(format!("its history is incomplete ({e})")));
        }
        Ok(pack)
    }

    /// Step 3: the objects reachable from the tip and not from `known` (commits the target
    /// has) packed out of the quarantine into `target`, and `into_ref` set to the tip. What
    /// else the file carried stays in the quarantine and is deleted with it.
    async fn land(&self, target: &Target, known: &[String], into_ref: &str) -> Result<()> {
        let q = &self.quarantine.repo;
        let base_name = self.quarantine.dir.path().join("landing");
        let mut input = format!("{}\n", self.tip);
        for id in known {
            input.push_str(&format!("^{id}\n"));
        }
        let mut args = vec![OsString::from("pack-objects"), "--revs".into(), "-q".into()];
        args.push(base_name.clone().into_os_string());
        let hash = q
            .run(
                &args,
                GitInput::Bytes(input.into_bytes()),
                "check that the temporary directory has free space",
            )
            .await?;
        let mut name = base_name.into_os_string();
        name.push(format!("-{hash}.pack"));
        let pack = std::fs::File::open(&name).map_err(|e| TransferError::File {
            action: "read",
            path: PathBuf::from(&name),
            detail: e.to_string(),
        })?;
        target
            .run(
                &["index-pack", "--stdin", "--fix-thin", "--strict"],
                GitInput::File(pack),
                "check that the repository is writable and has free space",
            )
            .await?;
        target
            .run(
                &[
                    "update-ref",
                    "-m",
                    "taskdaemon: commits received in a bundle",
                    into_ref,
                    &self.tip,
                ],
                GitInput::None,
                "check that the repository is writable and that no other git command holds the ref's lock",
            )
            .await?;
        Ok(())
    }

    /// The prerequisites, as `rev-list` inputs.
    fn prerequisite_refs(&self) -> Vec<&str> {
        self.header
            .prerequisites
            .iter()
            .map(String::as_str)
            .collect()
    }

    fn info(&self) -> BundleInfo {
        BundleInfo {
            tip: self.tip.clone(),
            bytes: self.bytes,
            prerequisites: self.header.prerequisites.clone(),
        }
    }
}

/// The header of the bundle file at `path`, or why it is not an acceptable bundle.
fn read_header(path: &Path) -> std::result::Result<Header, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("it cannot be read ({e})"))?;
    header::parse(std::io::BufReader::new(file))
}

/// What a bundle this module wrote holds, checked to carry `tip`.
fn written_info(out: &Path, tip: &str) -> Result<BundleInfo> {
    let header = read_header(out).map_err(|reason| TransferError::File {
        action: "read back the bundle",
        path: out.to_path_buf(),
        detail: reason,
    })?;
    match header.refs.as_slice() {
        [(id, _)] if id == tip => {}
        _ => {
            return Err(TransferError::File {
                action: "read back the bundle",
                path: out.to_path_buf(),
                detail: format!(
                    "it does not carry exactly the commit {tip} (did the branch move while it was written?)"
                ),
            });
        }
    }
    let bytes = std::fs::metadata(out)
        .map_err(|e| TransferError::File {
            action: "read back the bundle",
            path: out.to_path_buf(),
            detail: e.to_string(),
        })?
        .len();
    Ok(BundleInfo {
        tip: tip.to_string(),
        bytes,
        prerequisites: header.prerequisites,
    })
}

fn repo_target(repo: &Repo) -> Target {
    Target {
        git: repo.git.clone(),
        git_dir: repo.common_dir.clone(),
        format: repo.format.clone(),
        lfs: repo.lfs.clone(),
    }
}

/// Head: writes to `out_file` a bundle with the history of `tip_commit`, leaving out what
/// the commits in `have` already reach: a host that holds the base of an earlier loop gets
/// only the commits since. Returns `None`, writing nothing, when `have` already reaches the
/// tip (git writes no empty bundle; the host has what it needs).
///
/// `have` comes from the host: ids that are not commit ids are refused, commits this
/// repository does not have are skipped (a host may hold commits the head never took),
/// and more than [`MAX_HAVES`] are refused. The bundle's one ref is `refs/taskdaemon/tip`;
/// the repository is not changed (the ref exists only in a scratch repository that reads
/// this one's objects).
pub async fn bundle_commits(
    repo: &Repo,
    tip_commit: &str,
    have: &[String],
    out_file: &Path,
) -> Result<Option<BundleInfo>> {
    let target = repo_target(repo);
    let format = target.object_format().await?;
    check_id("tip commit", tip_commit, format)?;
    if !target.is_commit(tip_commit).await? {
        return Err(invalid(
            "tip commit",
            tip_commit,
            format!("{} has no such commit", repo.root.display()),
        ));
    }
    if have.len() > MAX_HAVES {
        return Err(invalid(
            "list of commits the host has",
            &format!("{} commits", have.len()),
            format!("at most {MAX_HAVES} are taken; name the tips of the mirror's refs only"),
        ));
    }
    for id in have {
        check_id("commit the host has", id, format)?;
    }
    let present = target.commits_among(have).await?;
    let known: Vec<String> = have
        .iter()
        .filter(|h| present.contains(*h))
        .cloned()
        .collect();
    let count = target.rev_list(&["--count"], &[tip_commit], &known).await?;
    if count.trim() == "0" {
        return Ok(None);
    }
    let out = absolute(out_file)?;
    let scratch = Quarantine::new(scratch_dir()?, &target, format).await?;
    let q = &scratch.repo;
    q.run(
        &["update-ref", HEAD_BUNDLE_REF, tip_commit],
        GitInput::None,
        "check that the temporary directory is writable",
    )
    .await?;
    let mut input = format!("{HEAD_BUNDLE_REF}\n");
    for id in &known {
        input.push_str(&format!("^{id}\n"));
    }
    let args = [
        OsString::from("bundle"),
        "create".into(),
        out.clone().into_os_string(),
        "--stdin".into(),
    ];
    q.run(
        &args,
        GitInput::Bytes(input.into_bytes()),
        "check that the bundle's directory is writable and has free space",
    )
    .await?;
    written_info(&out, tip_commit).map(Some)
}

/// Head: takes a loop's commits from the bundle a host sent and sets `into_ref` (a full ref
/// name, e.g. `refs/taskdaemon/incoming/<loop>`) to their tip, which it returns; the
/// caller then moves the loop's branch and worktree on the head to it.
///
/// The bundle is refused, with the repository left as it was (no ref, no object, no file
/// added), unless: it is a regular file of at most `max_bytes`; a git bundle of this
/// repository's object format with exactly one ref, whose name git accepts and holds no
/// `..` nor control character; each prerequisite a commit this repository has and
/// `base_commit` reaches (the host got nothing else from the head); every object passes
/// git's checks and the tip's history is complete; the tip is a commit that descends from
/// `base_commit`, is not the base itself, and no commit between them is a root (unrelated
/// history grafted in); every commit between them is in the bundle's own pack, and every
/// other object the tip needs or the pack's deltas are made against is in the pack or
/// reached by `base_commit` (a commit or file of the head's that the host was never sent
/// is not the host's to bring in). Only the objects the tip needs land in the repository.
/// No hook runs. `into_ref` may not be a branch checked out in a worktree (its files would
/// no longer match it); it is overwritten when it exists.
pub async fn take_branch(
    repo: &Repo,
    bundle_file: &Path,
    base_commit: &str,
    into_ref: &str,
    max_bytes: u64,
) -> Result<String> {
    let target = repo_target(repo);
    let format = target.object_format().await?;
    check_id("base commit", base_commit, format)?;
    if !target.is_commit(base_commit).await? {
        return Err(invalid(
            "base commit",
            base_commit,
            format!("{} has no such commit", repo.root.display()),
        ));
    }
    check_into_ref(&target, into_ref).await?;
    if let Some(branch) = into_ref.strip_prefix("refs/heads/")
        && let Some(at) = repo.checked_out_at(branch).await?
    {
        return Err(invalid(
            "ref",
            into_ref,
            format!(
                "the branch is checked out in {}; take the bundle into another ref and move the worktree there",
                at.display()
            ),
        ));
    }
    let incoming = Incoming::read(&target, &repo.root, bundle_file, max_bytes).await?;
    let base = base_commit.to_string();
    if incoming.tip == base {
        return Err(incoming.refused("its ref points at the base itself: it holds no commit"));
    }
    incoming.check_prerequisites_present(&target).await?;
    // The head gave the host the base's history and nothing else, so a real branch can
    // only stop at commits the base reaches. A prerequisite elsewhere (another loop's
    // branch, a commit the user never shared) would have the head vouch for history the
    // host was never sent.
    let outside = target
        .rev_list(
            &["--max-count=1"],
            &incoming.prerequisite_refs(),
            std::slice::from_ref(&base),
        )
        .await?;
    if !outside.is_empty() {
        return Err(incoming.refused(format!(
            "the base {base} does not reach its prerequisite {outside}: it was not made from the loop's base"
        )));
    }
    let pack = incoming.index().await?;
    let q = &incoming.quarantine.repo;
    // The loop's branch starts at its base; anything else is not the loop's work.
    if !q.is_ancestor(&base, &incoming.tip).await? {
        return Err(incoming.refused(format!(
            "its tip {} does not descend from the base {base}: it is unrelated history",
            incoming.tip
        )));
    }
    // A root commit after the base is another project's history merged in
    // (`--allow-unrelated-histories`): the merge descends from the base, and still brings
    // history the head never had.
    let roots = q
        .rev_list(
            &["--max-parents=0", "--max-count=1"],
            &[&incoming.tip],
            std::slice::from_ref(&base),
        )
        .await?;
    if !roots.is_empty() {
        return Err(incoming.refused(format!(
            "it carries the root commit {roots}: history unrelated to the base is merged in"
        )));
    }
    // The quarantine sees all of the head's objects: the checks above pass for history
    // found there rather than sent (another loop's tip merged in, a delta against a user's
    // file). What the base does not reach must have come in the pack.
    incoming.check_sent(&pack, &base).await?;
    incoming
        .land(&target, std::slice::from_ref(&base), into_ref)
        .await?;
    let tip = incoming.tip.clone();
    Ok(tip)
}

/// A host's bare repository holding what it received from the head, and the worktrees its
/// loops work in.
#[derive(Debug, Clone)]
pub struct Mirror {
    dir: PathBuf,
    git: crate::worktree::Git,
    /// Its object format, once read.
    format: KnownFormat,
    /// Where its git-lfs objects are, once read.
    lfs: lfs::KnownLfsObjects,
}

impl Mirror {
    /// Opens the mirror at `dir` (made, with missing parents, when missing or empty).
    pub async fn open(dir: &Path) -> Result<Mirror> {
        Self::open_with_env(dir, std::iter::empty::<(OsString, OsString)>()).await
    }

    /// Like [`Mirror::open`], with extra environment variables for every git command of the
    /// mirror and its worktrees (e.g. `HOME` and `GIT_CONFIG_NOSYSTEM=1` to keep the
    /// machine's git config out, as the tests do).
    pub async fn open_with_env<I, K, V>(dir: &Path, env: I) -> Result<Mirror>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        let git = crate::worktree::Git {
            extra_env: env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        };
        let file_error = |action: &'static str, e: std::io::Error| TransferError::File {
            action,
            path: dir.to_path_buf(),
            detail: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(|e| file_error("create", e))?;
        let dir = std::fs::canonicalize(dir).map_err(|e| file_error("resolve", e))?;
        let empty = std::fs::read_dir(&dir)
            .map_err(|e| file_error("read", e))?
            .next()
            .is_none();
        let mirror = Mirror {
            dir,
            git,
            format: KnownFormat::default(),
            lfs: Default::default(),
        };
        if empty {
            // No templates: nothing of the machine's template directory (sample hooks, an
            // `info/exclude`) is copied in.
            let out = mirror
                .git
                .output_with(
                    &mirror.dir,
                    [
                        OsStr::new("init"),
                        OsStr::new("--bare"),
                        OsStr::new("--quiet"),
                        OsStr::new("--template="),
                        mirror.dir.as_os_str(),
                    ],
                    GitInput::None,
                )
                .await?;
            if !out.success() {
                return Err(out
                    .into_error("check that the directory is writable")
                    .into());
            }
        }
        // A directory someone else filled is not taken for the mirror: the head's commits
        // would mix with whatever it holds.
        let bare = mirror
            .target()
            .output(&["rev-parse", "--is-bare-repository"], GitInput::None)
            .await?;
        if !bare.success() || bare.text() != "true" {
            return Err(TransferError::NotAMirror {
                dir: mirror.dir.clone(),
                detail: "it is not empty and not a bare git repository".to_string(),
            });
        }
        Ok(mirror)
    }

    /// The mirror's directory (real path).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn target(&self) -> Target {
        Target {
            git: self.git.clone(),
            git_dir: self.dir.clone(),
            format: self.format.clone(),
            lfs: self.lfs.clone(),
        }
    }

    /// Takes a bundle from the head (made by [`bundle_commits`]) into the mirror, and
    /// returns what it held.
    ///
    /// Refused, with the mirror left as it was, unless it is a regular file of at most
    /// `max_bytes`, a git bundle with exactly one ref pointing at `expect_tip` (the head
    /// said which commit it sends; a bundle with another is not the one asked for), whose
    /// prerequisites the mirror has, and whose objects pass git's checks. The tip is kept
    /// under [`RECEIVED_PREFIX`].
    pub async fn receive(
        &self,
        bundle_file: &Path,
        expect_tip: &str,
        max_bytes: u64,
    ) -> Result<BundleInfo> {
        let target = self.target();
        let format = target.object_format().await?;
        check_id("expected tip", expect_tip, format)?;
        let incoming = Incoming::read(&target, &self.dir, bundle_file, max_bytes).await?;
        if incoming.tip != expect_tip {
            return Err(incoming.refused(format!(
                "its ref points at {}, not the expected {expect_tip}",
                incoming.tip
            )));
        }
        incoming.check_prerequisites_present(&target).await?;
        incoming.index().await?;
        let into = format!("{RECEIVED_PREFIX}{expect_tip}");
        incoming
            .land(&target, &incoming.header.prerequisites, &into)
            .await?;
        Ok(incoming.info())
    }

    /// The commits the mirror's refs point at (sorted, each once): what the host names as
    /// `have` to [`bundle_commits`], since the mirror holds their whole history.
    pub async fn commits(&self) -> Result<Vec<String>> {
        let listing = self
            .target()
            .run(
                &["for-each-ref", "--format=%(objectname) %(objecttype)"],
                GitInput::None,
                "check that the mirror is readable",
            )
            .await?;
        let mut ids: Vec<String> = listing
            .lines()
            .filter_map(|l| l.strip_suffix(" commit"))
            .map(str::to_string)
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// Whether the mirror holds `commit` (a full commit id), and so its whole history
    /// (nothing enters the mirror without it).
    pub async fn has(&self, commit: &str) -> Result<bool> {
        let target = self.target();
        let format = target.object_format().await?;
        check_id("commit", commit, format)?;
        target.is_commit(commit).await
    }

    /// A worktree of the mirror at `path` on branch `branch` (a branch name such as
    /// `taskdaemon/<run>/<loop>`), checked out at `commit`, for the existing [`Worktree`]
    /// API (`commit_all`, `head_commit`). The branch is made at `commit`, or reset to it
    /// when it exists and is checked out nowhere (the head's commit is the loop's truth);
    /// when it is already checked out at `path`, that worktree is returned as it is.
    /// `commit` must be in the mirror ([`Mirror::receive`] it first); `path` must not exist
    /// or be an empty directory.
    pub async fn add_worktree(&self, path: &Path, branch: &str, commit: &str) -> Result<Worktree> {
        let target = self.target();
        let format = target.object_format().await?;
        check_id("commit", commit, format)?;
        let full = format!("refs/heads/{branch}");
        if refname_problem(&full).is_some()
            || branch.starts_with('-')
            || !target.ref_name_ok(&full).await?
        {
            return Err(invalid(
                "branch",
                branch,
                "git does not accept it as a branch name; use letters, digits, '-', '_', '.' and '/'",
            ));
        }
        if !target.is_commit(commit).await? {
            return Err(invalid(
                "commit",
                commit,
                format!(
                    "the mirror {} does not have it; receive a bundle with it first",
                    self.dir.display()
                ),
            ));
        }
        let path = absolute(path)?;
        // Serialized with the other worktrees of this mirror: concurrent `worktree add`s
        // and `prune`s could forget one another's registrations.
        let lock = crate::worktree::merge_lock(&self.dir);
        let _serialized = lock.lock().await;
        target
            .run(
                &["worktree", "prune"],
                GitInput::None,
                "check that the mirror is writable",
            )
            .await?;
        let listing = target
            .run(
                &[
                    "for-each-ref",
                    "--format=%(refname)%00%(worktreepath)",
                    &full,
                ],
                GitInput::None,
                "TaskDaemon needs git 2.23 or newer; check `git --version`",
            )
            .await?;
        let at = listing.lines().find_map(|line| {
            let (name, at) = line.split_once('\0')?;
            (name == full && !at.is_empty()).then(|| PathBuf::from(at))
        });
        if let Some(at) = at {
            let same = std::fs::canonicalize(&at).ok() == std::fs::canonicalize(&path).ok();
            if same {
                return Ok(self.worktree(&path, branch));
            }
            return Err(invalid(
                "branch",
                branch,
                format!(
                    "it is checked out in {}, not in {}",
                    at.display(),
                    path.display()
                ),
            ));
        }
        if let Ok(mut entries) = std::fs::read_dir(&path)
            && entries.next().is_some()
        {
            return Err(invalid(
                "worktree directory",
                &path.display().to_string(),
                "it exists and is not empty; remove it or choose another directory",
            ));
        }
        let args = [
            OsString::from("worktree"),
            "add".into(),
            "--quiet".into(),
            "-B".into(),
            branch.into(),
            path.clone().into_os_string(),
            commit.into(),
        ];
        target
            .run(
                &args,
                GitInput::None,
                "check that the directory is writable",
            )
            .await?;
        Ok(self.worktree(&path, branch))
    }

    /// Removes a worktree made by [`Mirror::add_worktree`] (uncommitted changes in it are
    /// discarded) and, unless `keep_branch`, its branch: a host removes a loop's worktree
    /// once the head took its commits. A directory already deleted is fine.
    pub async fn remove_worktree(&self, worktree: &Worktree, keep_branch: bool) -> Result<()> {
        let target = self.target();
        let lock = crate::worktree::merge_lock(&self.dir);
        let _serialized = lock.lock().await;
        if worktree.path.exists() {
            let args = [
                OsString::from("worktree"),
                "remove".into(),
                "--force".into(),
                worktree.path.clone().into_os_string(),
            ];
            target
                .run(
                    &args,
                    GitInput::None,
                    "check that the directory is a worktree of the mirror (`git worktree list`)",
                )
                .await?;
        } else {
            target
                .run(
                    &["worktree", "prune"],
                    GitInput::None,
                    "check that the mirror is writable",
                )
                .await?;
        }
        if !keep_branch {
            let full = format!("refs/heads/{}", worktree.branch);
            let exists = target
                .output(&["show-ref", "--verify", "--quiet", &full], GitInput::None)
                .await?
                .success();
            if exists {
                target
                    .run(
                        &["update-ref", "-d", &full],
                        GitInput::None,
                        "check that the mirror is writable",
                    )
                    .await?;
            }
        }
        Ok(())
    }

    fn worktree(&self, path: &Path, branch: &str) -> Worktree {
        Worktree {
            path: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
            branch: branch.to_string(),
            git: self.git.clone(),
        }
    }

    /// Host, at a loop's end: writes to `out_file` a bundle of the commits `base_commit..`
    /// the loop's branch (the branch of `worktree`, a worktree of this mirror), for
    /// [`take_branch`] on the head. Returns `None`, writing nothing, when the branch is
    /// still at the base (the loop committed nothing).
    ///
    /// The branch is read from the mirror, not through the worktree's `.git` file (which
    /// the loop's commands can rewrite). Fails when the branch no longer descends from the
    /// base (its history was rewritten): the head would refuse such a bundle.
    pub async fn bundle_branch(
        &self,
        worktree: &Worktree,
        base_commit: &str,
        out_file: &Path,
    ) -> Result<Option<BundleInfo>> {
        let target = self.target();
        let format = target.object_format().await?;
        check_id("base commit", base_commit, format)?;
        let full = format!("refs/heads/{}", worktree.branch);
        let spec = format!("{full}^{{commit}}");
        let out = target
            .output(&["rev-parse", "--verify", "--quiet", &spec], GitInput::None)
            .await?;
        let tip = out.text();
        if !out.success() || !is_object_id(&tip, format) {
            return Err(invalid(
                "branch",
                &worktree.branch,
                format!("the mirror {} has no such branch", self.dir.display()),
            ));
        }
        if tip == base_commit {
            return Ok(None);
        }
        if !target.is_commit(base_commit).await? || !target.is_ancestor(base_commit, &tip).await? {
            return Err(invalid(
                "base commit",
                base_commit,
                format!(
                    "the branch {} (at {tip}) does not descend from it: its history was rewritten, and the head would refuse it",
                    worktree.branch
                ),
            ));
        }
        let out = absolute(out_file)?;
        let args = [
            OsString::from("bundle"),
            "create".into(),
            out.clone().into_os_string(),
            "--stdin".into(),
        ];
        target
            .run(
                &args,
                GitInput::Bytes(format!("{full}\n^{base_commit}\n").into_bytes()),
                "check that the bundle's directory is writable and has free space",
            )
            .await?;
        written_info(&out, &tip).map(Some)
    }
}
