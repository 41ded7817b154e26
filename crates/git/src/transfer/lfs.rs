//! The git-lfs objects of a loop's branch, carried from a host to the head beside its bundle,
//! and those of a loop's base, carried from the head to a host before its worktree is made.
//!
//! Where the user's attributes say `filter=lfs`, a host's git (git-lfs's clean filter)
//! commits a pointer and keeps the file's content in its mirror's LFS storage; a bundle
//! carries only the pointer. So the host lists the pointers its branch's new commits hold
//! whose objects its mirror has ([`Mirror::lfs_objects`]) and sends each object's bytes;
//! the head keeps an object only when its bytes hash to the id the pointer names
//! ([`LfsIntake`]), so a host can add no content under another object's name. The other way,
//! the head lists the objects the base commit's tree points at which it holds
//! ([`lfs_objects_at`]), and a host's mirror takes them the same way
//! ([`Mirror::lfs_intake`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::header::{ObjectFormat, is_object_id};
use super::{Mirror, Result, Target, TransferError};
use crate::worktree::{GitInput, Repo};
use td_base::sync::lock;

/// The most bytes git-lfs reads as a pointer (its spec: pointers are under 1024 bytes).
const MAX_POINTER_BYTES: u64 = 1024;

/// The fewest bytes of a pointer (the version line, a SHA-256 `oid` line and `size 0`):
/// smaller blobs are not read at all.
const MIN_POINTER_BYTES: u64 = 126;

/// Blobs read at a time when looking for pointers (`git cat-file --batch`: at most ~1 MiB of
/// answer held at once, however many small files a tree has).
const POINTERS_PER_BATCH: usize = 1024;

/// The first line of every git-lfs pointer.
const POINTER_VERSION: &str = "version https://git-lfs.github.com/spec/v1";

/// What a git-lfs pointer names: its object's SHA-256 (lowercase hex) and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LfsPointer {
    /// The object's id: the SHA-256 of its content, 64 lowercase hex digits.
    pub oid: String,
    /// Its size in bytes.
    pub size: u64,
}

/// `text` read as a git-lfs pointer (as git-lfs writes one: the version line first, then
/// sorted `key value` lines with `oid sha256:<64 hex>` and `size <decimal>`, each ending
/// in a newline); `None` for anything else.
pub fn parse_pointer(text: &[u8]) -> Option<LfsPointer> {
    if text.len() as u64 >= MAX_POINTER_BYTES {
        return None;
    }
    let text = std::str::from_utf8(text).ok()?;
    let body = text.strip_suffix('\n')?;
    let mut lines = body.split('\n');
    if lines.next()? != POINTER_VERSION {
        return None;
    }
    let (mut oid, mut size) = (None, None);
    for line in lines {
        let (key, value) = line.split_once(' ')?;
        match key {
            "oid" => {
                let hex = value.strip_prefix("sha256:")?;
                is_oid(hex).then_some(())?;
                oid = Some(hex.to_string());
            }
            "size" => {
                let digits = value.bytes().all(|b| b.is_ascii_digit()) && !value.is_empty();
                size = Some(value.parse::<u64>().ok().filter(|_| digits)?);
            }
            // Other keys (`ext-…`) are git-lfs's to read; the object is still the oid's.
            _ => {}
        }
    }
    Some(LfsPointer {
        oid: oid?,
        size: size?,
    })
}

/// Whether `text` is an LFS object id: a SHA-256 in lowercase hex, as a SHA-256 git object
/// id is written.
pub fn is_oid(text: &str) -> bool {
    is_object_id(text, ObjectFormat::Sha256)
}

/// Where a repository's git-lfs objects are, once read from its config: like its object
/// format ([`super::KnownFormat`]), read from git once per handle (the config of a run's
/// repository, or of a host's mirror, is not expected to move its LFS storage meanwhile).
#[derive(Debug, Clone, Default)]
pub(crate) struct KnownLfsObjects(std::sync::Arc<std::sync::OnceLock<PathBuf>>);

/// A cache: not part of what a repository is.
impl PartialEq for KnownLfsObjects {
    fn eq(&self, _: &KnownLfsObjects) -> bool {
        true
    }
}

impl Eq for KnownLfsObjects {}

/// Where git-lfs keeps the objects of `target` (its common git directory): `objects` in
/// `lfs.storage` of the config git-lfs reads, relative to the git directory as git-lfs takes
/// it (and `~/` expanded), else in `<git dir>/lfs`.
async fn objects_dir(target: &Target) -> Result<PathBuf> {
    if let Some(objects) = target.lfs.0.get() {
        return Ok(objects.clone());
    }
    let out = target
        .output(
            &["config", "--type=path", "--get", "lfs.storage"],
            GitInput::None,
        )
        .await?;
    let set = out.text();
    let storage = match out.status.code() {
        Some(0) if !set.trim_end_matches('\n').is_empty() => {
            target.git_dir.join(set.trim_end_matches('\n'))
        }
        // Unset (git says 1) or empty: git-lfs's default.
        Some(0 | 1) => target.git_dir.join("lfs"),
        _ => {
            return Err(TransferError::Git(out.into_error(
                "check the repository's git config (`git config lfs.storage`)",
            )));
        }
    };
    Ok(target.lfs.0.get_or_init(|| storage.join("objects")).clone())
}

/// Where git-lfs keeps object `oid` in the objects directory `objects` (`<2>/<2>/<oid>`).
fn object_path(objects: &Path, oid: &str) -> PathBuf {
    let (a, b) = (oid.get(..2).unwrap_or(""), oid.get(2..4).unwrap_or(""));
    objects.join(a).join(b).join(oid)
}

/// An LFS object a branch points at, with where the mirror keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LfsObject {
    /// Its pointer.
    pub pointer: LfsPointer,
    /// Its file in the mirror's LFS storage.
    pub path: PathBuf,
}

impl Mirror {
    /// The LFS objects the commits from `base` (excluded) to `tip` point at, blobs that read
    /// as git-lfs pointers, which the mirror's LFS storage holds at their size, each once. A
    /// pointer whose object the mirror lacks (a loop that wrote a pointer by hand) is left
    /// out: there is nothing to send; so is an empty one.
    pub async fn lfs_objects(&self, base: &str, tip: &str) -> Result<Vec<LfsObject>> {
        let target = self.target();
        // git-lfs makes its storage when it first stores an object: without it, no pointer
        // can have one here, and a repository without LFS pays no more git for the question.
        let objects = objects_dir(&target).await?;
        if !objects.is_dir() {
            return Ok(Vec::new());
        }
        let format = target.object_format().await?;
        super::check_id("base commit", base, format)?;
        super::check_id("tip", tip, format)?;
        let listed = target
            .rev_list(
                &["--objects", "--no-object-names"],
                &[tip],
                &[base.to_string()],
            )
            .await?;
        held_objects(&target, &objects, &listed).await
    }

    /// The mirror's side of LFS objects the head sends (those of a loop's base, fetched
    /// before its worktree is checked out): put together in `parts`, kept in the mirror's
    /// LFS storage once their bytes hash to their id.
    pub async fn lfs_intake(&self, parts: &Path) -> Result<LfsIntake> {
        Ok(LfsIntake {
            objects: objects_dir(&self.target()).await?,
            parts: parts.to_path_buf(),
        })
    }
}

/// Head: the LFS objects the tree of `commit` points at which `repo`'s LFS storage holds,
/// each once: what a host's mirror needs so that git-lfs fills a worktree of `commit` with
/// the content the user's own checkout has (a missing object stays a pointer there as here).
pub async fn lfs_objects_at(repo: &Repo, commit: &str) -> Result<Vec<LfsObject>> {
    let target = super::repo_target(repo);
    let objects = objects_dir(&target).await?;
    if !objects.is_dir() {
        return Ok(Vec::new());
    }
    let format = target.object_format().await?;
    super::check_id("commit", commit, format)?;
    let listed = target
        .rev_list(
            &["--objects", "--no-object-names", "--no-walk"],
            &[commit],
            &[],
        )
        .await?;
    held_objects(&target, &objects, &listed).await
}

/// The LFS objects that the blobs among `listed` (object ids, one a line) point at, which
/// the LFS objects directory `objects` holds at their size, each once.
async fn held_objects(target: &Target, objects: &Path, listed: &str) -> Result<Vec<LfsObject>> {
    let mut ids = String::new();
    for id in listed.lines().map(str::trim).filter(|id| !id.is_empty()) {
        ids.push_str(id);
        ids.push('\n');
    }
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let checked = target
        .run(
            &[
                "cat-file",
                "--batch-check=%(objectname) %(objecttype) %(objectsize)",
            ],
            GitInput::Bytes(ids.into_bytes()),
            "check that the repository is readable",
        )
        .await?;
    let mut small: Vec<&str> = Vec::new();
    for line in checked.lines() {
        let mut fields = line.split(' ');
        let (Some(id), Some("blob"), Some(size)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if size
            .parse::<u64>()
            .is_ok_and(|s| (MIN_POINTER_BYTES..MAX_POINTER_BYTES).contains(&s))
        {
            small.push(id);
        }
    }
    let mut found: Vec<LfsObject> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for batch in small.chunks(POINTERS_PER_BATCH) {
        let mut ids = batch.join("\n");
        ids.push('\n');
        let out = target
            .output(&["cat-file", "--batch"], GitInput::Bytes(ids.into_bytes()))
            .await?;
        if !out.success() {
            return Err(TransferError::Git(
                out.into_error("check that the repository is readable"),
            ));
        }
        for content in batch_contents(&out.stdout) {
            let Some(pointer) = parse_pointer(content) else {
                continue;
            };
            let path = object_path(objects, &pointer.oid);
            // An empty file is no LFS object (git-lfs keeps it as it is): nothing to send.
            if pointer.size > 0 && is_held(&path, pointer.size) && seen.insert(pointer.oid.clone())
            {
                found.push(LfsObject { pointer, path });
            }
        }
    }
    Ok(found)
}

/// Whether `path` is an object file of `size` bytes (not a symlink, not cut short).
fn is_held(path: &Path, size: u64) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == size)
}

/// The contents of `git cat-file --batch`'s answer (`<id> <type> <size>\n<content>\n` each;
/// `<id> missing\n` for none), in order; stops at anything else.
fn batch_contents(mut out: &[u8]) -> Vec<&[u8]> {
    let mut contents = Vec::new();
    while let Some(end) = out.iter().position(|b| *b == b'\n') {
        let header = String::from_utf8_lossy(out.get(..end).unwrap_or_default()).into_owned();
        let rest = out.get(end + 1..).unwrap_or_default();
        let size = header
            .rsplit(' ')
            .next()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|_| header.split(' ').count() == 3);
        let Some(size) = size else {
            out = rest;
            continue;
        };
        let Some(content) = rest.get(..size) else {
            break;
        };
        contents.push(content);
        out = rest.get(size + 1..).unwrap_or_default();
    }
    contents
}

/// How far the head got with an LFS object a host sends ([`LfsIntake::take_chunk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LfsReceived {
    /// The object is in the repository's LFS storage (it was, or its last chunk came and
    /// its bytes hash to its id): send no more of it.
    Held,
    /// This many bytes of it have come; send the rest from there.
    Partly(u64),
}

/// The parts being written or checked now ([`LfsIntake::take_chunk`]): one call at a time
/// per part (a host's resent chunk, a lost placement's request still running).
static BUSY: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Holds a part in [`BUSY`] until dropped.
struct Claim(PathBuf);

impl Claim {
    fn take(part: &Path) -> std::result::Result<Claim, String> {
        let mut busy = lock(&BUSY);
        if busy.iter().any(|p| p == part) {
            return Err(format!(
                "a chunk of {} is being taken; send it again",
                part.display()
            ));
        }
        busy.push(part.to_path_buf());
        Ok(Claim(part.to_path_buf()))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        lock(&BUSY).retain(|p| *p != self.0);
    }
}

/// The receiving side: LFS objects from the other end (the head's repository from hosts, a
/// host's mirror from the head), put together in a directory of the receiver's (`parts`)
/// and moved into the repository's LFS storage once their bytes hash to their id.
#[derive(Debug, Clone)]
pub struct LfsIntake {
    /// The objects directory of the repository's LFS storage (its common git directory's:
    /// every worktree's).
    objects: PathBuf,
    /// Where objects are put together while they come.
    parts: PathBuf,
}

impl LfsIntake {
    /// Objects for `repo`'s LFS storage (where its config's `lfs.storage` says), put
    /// together in `parts` (made when missing).
    pub async fn open(repo: &Repo, parts: &Path) -> Result<LfsIntake> {
        Ok(LfsIntake {
            objects: objects_dir(&super::repo_target(repo)).await?,
            parts: parts.to_path_buf(),
        })
    }

    /// Where the repository keeps object `oid` (`None` for a name that is no id).
    pub fn object_path(&self, oid: &str) -> Option<PathBuf> {
        is_oid(oid).then(|| object_path(&self.objects, oid))
    }

    /// Whether the repository holds object `pointer` whole.
    pub fn holds(&self, pointer: &LfsPointer) -> bool {
        self.object_path(&pointer.oid)
            .is_some_and(|path| is_held(&path, pointer.size))
    }

    /// Takes `bytes` of object `pointer` at `offset`, sent by `sender` (a name for the loop
    /// and its placement, which keeps senders' parts apart). A chunk at offset 0 starts the
    /// object again (an empty one asks how far the head is: [`LfsReceived::Held`] when it
    /// has the object); later chunks continue where the part ends, and one that ends where
    /// the part already does is a resend, answered with how far it is. `charge` is called
    /// with the bytes about to be written, before they are. The whole object is moved into
    /// the repository only when its bytes hash to its id. Any failure drops the part, so the
    /// next try starts clean.
    pub fn take_chunk(
        &self,
        sender: &str,
        pointer: &LfsPointer,
        offset: u64,
        bytes: &[u8],
        charge: impl FnOnce(u64) -> std::result::Result<(), String>,
    ) -> std::result::Result<LfsReceived, String> {
        let oid = &pointer.oid;
        let Some(dest) = self.object_path(oid) else {
            return Err(format!("{oid:?} is not an LFS object id"));
        };
        if is_held(&dest, pointer.size) {
            // Landed by another sender meanwhile: this one's part, if any, is of no use.
            self.drop_part(sender, pointer);
            return Ok(LfsReceived::Held);
        }
        std::fs::create_dir_all(&self.parts)
            .map_err(|e| format!("cannot make {}: {e}", self.parts.display()))?;
        let part = self.part(sender, oid);
        let _claim = Claim::take(&part)?;
        let taken = self.append(&part, pointer, offset, bytes, charge);
        let taken = match taken {
            Ok(had) if had == pointer.size => {
                self.land(&part, pointer, &dest).map(|()| LfsReceived::Held)
            }
            Ok(had) => Ok(LfsReceived::Partly(had)),
            Err(e) => Err(e),
        };
        if taken.is_err() {
            let _ = std::fs::remove_file(&part);
        }
        taken
    }

    /// Where `sender`'s part of object `oid` is put together.
    fn part(&self, sender: &str, oid: &str) -> PathBuf {
        self.parts.join(format!("{sender}{PART_INFIX}{oid}"))
    }

    /// Removes `sender`'s part of object `pointer`, if it has one and no call is taking a
    /// chunk of it now (a sender that gives the object up: its part would stay forever, its
    /// name being its placement's).
    pub fn drop_part(&self, sender: &str, pointer: &LfsPointer) {
        if !is_oid(&pointer.oid) {
            return;
        }
        let part = self.part(sender, &pointer.oid);
        if let Ok(_claim) = Claim::take(&part) {
            let _ = std::fs::remove_file(&part);
        }
    }

    /// Appends a chunk to `part` as [`LfsIntake::take_chunk`] says; how long it is then.
    fn append(
        &self,
        part: &Path,
        pointer: &LfsPointer,
        offset: u64,
        bytes: &[u8],
        charge: impl FnOnce(u64) -> std::result::Result<(), String>,
    ) -> std::result::Result<u64, String> {
        let oid = &pointer.oid;
        let end = offset
            .checked_add(bytes.len() as u64)
            .filter(|end| *end <= pointer.size)
            .ok_or_else(|| {
                format!(
                    "a chunk of LFS object {oid} ends past its size of {} bytes",
                    pointer.size
                )
            })?;
        let mut file = open_part(part, offset == 0)?;
        let had = file
            .metadata()
            .map_err(|e| format!("cannot read {}: {e}", part.display()))?
            .len();
        if offset > 0 && end <= had {
            // A resend of a chunk written already.
            return Ok(had);
        }
        if offset != had {
            return Err(format!(
                "a chunk of LFS object {oid} at {offset} came after {had} bytes"
            ));
        }
        if !bytes.is_empty() {
            charge(bytes.len() as u64)?;
            file.write_all(bytes)
                .map_err(|e| format!("cannot write {}: {e}", part.display()))?;
        }
        Ok(end)
    }

    /// Moves the complete object `part` to `dest` when its bytes hash to its id.
    fn land(
        &self,
        part: &Path,
        pointer: &LfsPointer,
        dest: &Path,
    ) -> std::result::Result<(), String> {
        let hashed = std::fs::File::open(part)
            .and_then(td_base::hash::sha256_hex_of)
            .map_err(|e| format!("cannot read {}: {e}", part.display()))?;
        if hashed != pointer.oid {
            return Err(format!(
                "the bytes sent as LFS object {} hash to {hashed}: refused",
                pointer.oid
            ));
        }
        let dir = dest.parent().unwrap_or(dest);
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        // Within one file system a rename; else a copy into a file of its own in the
        // storage's directory, renamed into place, so that git-lfs never reads half an
        // object.
        if std::fs::rename(part, dest).is_ok() {
            return Ok(());
        }
        let stored = (|| -> std::io::Result<()> {
            let mut staged = tempfile::Builder::new()
                .prefix(".taskdaemon-")
                .tempfile_in(dir)?;
            std::io::copy(&mut std::fs::File::open(part)?, staged.as_file_mut())?;
            staged.persist(dest).map_err(|e| e.error)?;
            Ok(())
        })();
        stored.map_err(|e| format!("cannot store {}: {e}", dest.display()))?;
        let _ = std::fs::remove_file(part);
        Ok(())
    }
}

/// What names a part among other files (`<sender>.lfs.<oid>`).
const PART_INFIX: &str = ".lfs.";

/// Removes the parts of LFS objects left in `dir` by a process that ended while they came
/// (called when the process that puts objects together there starts: no part of its own is
/// there yet); how many.
pub fn sweep_parts(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut swept = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let is_part = name
            .to_str()
            .and_then(|n| n.rsplit_once(PART_INFIX))
            .is_some_and(|(sender, oid)| !sender.is_empty() && is_oid(oid));
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_part && is_file && std::fs::remove_file(entry.path()).is_ok() {
            swept += 1;
        }
    }
    swept
}

/// `path` opened to append (emptied first when `fresh`), created when missing, never
/// through a symlink.
fn open_part(path: &Path, fresh: bool) -> std::result::Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.create(true);
    if fresh {
        options.write(true).truncate(true);
    } else {
        options.append(true);
    }
    options
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer_text(oid: &str, size: u64) -> String {
        format!("{POINTER_VERSION}\noid sha256:{oid}\nsize {size}\n")
    }

    #[test]
    fn only_a_git_lfs_pointer_reads_as_one() {
        let oid = "ab".repeat(32);
        assert_eq!(
            parse_pointer(pointer_text(&oid, 12).as_bytes()),
            Some(LfsPointer {
                oid: oid.clone(),
                size: 12
            })
        );
        let with_ext = format!(
            "{POINTER_VERSION}\next-0-foo sha256:{}\noid sha256:{oid}\nsize 3\n",
            "cd".repeat(32)
        );
        assert_eq!(parse_pointer(with_ext.as_bytes()).map(|p| p.size), Some(3));
        for bad in [
            pointer_text(&oid, 12).trim_end().to_string(),
            pointer_text(&oid.to_uppercase(), 12),
            pointer_text(&oid[..63], 12),
            pointer_text(
                "../../../../etc/passwd-padding-to-sixty-four-characters-xxxxxx",
                1,
            ),
            pointer_text(&oid, 12).replace("size 12", "size -1"),
            pointer_text(&oid, 12).replace("size 12", "size +1"),
            pointer_text(&oid, 12).replace("size 12", "size 99999999999999999999999"),
            pointer_text(&oid, 12).replace("size 12\n", ""),
            pointer_text(&oid, 12).replace("spec/v1", "spec/v2"),
            format!("{}{}", pointer_text(&oid, 12), "x".repeat(1024)),
            "not a pointer\n".to_string(),
        ] {
            assert_eq!(parse_pointer(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn batch_answers_are_split_into_their_contents() {
        let out = b"a blob 3\nabc\nb missing\nc blob 0\n\nd blob 2\nx\n\n";
        assert_eq!(
            batch_contents(out),
            vec![&b"abc"[..], &b""[..], &b"x\n"[..]]
        );
        // A size past the end stops the reading.
        assert!(batch_contents(b"a blob 9\nabc\n").is_empty());
    }

    fn intake() -> (tempfile::TempDir, LfsIntake) {
        let dir = tempfile::tempdir().unwrap();
        let intake = LfsIntake {
            objects: dir.path().join("git/lfs/objects"),
            parts: dir.path().join("parts"),
        };
        (dir, intake)
    }

    fn free(_: u64) -> std::result::Result<(), String> {
        Ok(())
    }

    #[test]
    fn no_part_is_left_behind() {
        let (dir, intake) = intake();
        let content = b"the loop's large file\n";
        let pointer = LfsPointer {
            oid: td_base::hash::sha256_hex(content),
            size: content.len() as u64,
        };
        let parts = dir.path().join("parts");
        let count = || std::fs::read_dir(&parts).map_or(0, |d| d.count());
        // A sender that gives up drops its part.
        intake
            .take_chunk("a.1.base", &pointer, 0, &content[..4], free)
            .unwrap();
        assert_eq!(count(), 1);
        intake.drop_part("a.1.base", &pointer);
        assert_eq!(count(), 0);
        // A sender whose object another one landed meanwhile: its part goes with the answer.
        intake
            .take_chunk("a.2.base", &pointer, 0, &content[..4], free)
            .unwrap();
        intake
            .take_chunk("b.1.base", &pointer, 0, content, free)
            .unwrap();
        assert_eq!(
            intake.take_chunk("a.2.base", &pointer, 4, &content[4..], free),
            Ok(LfsReceived::Held)
        );
        assert_eq!(count(), 0);
        // A process that ended while objects came left parts: swept at the next start, and
        // nothing else of the directory's.
        intake
            .take_chunk(
                "c.1",
                &LfsPointer {
                    oid: "ab".repeat(32),
                    size: 9,
                },
                0,
                b"half",
                free,
            )
            .unwrap();
        std::fs::write(parts.join("c.base.bundle"), b"a bundle").unwrap();
        std::fs::write(parts.join("x.lfs.not-an-id"), b"?").unwrap();
        assert_eq!(sweep_parts(&parts), 1);
        let mut left: Vec<String> = std::fs::read_dir(&parts)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["c.base.bundle", "x.lfs.not-an-id"]);
        assert_eq!(sweep_parts(&dir.path().join("none")), 0);
    }

    #[test]
    fn an_object_lands_only_whole_in_order_and_with_the_bytes_of_its_id() {
        let (_dir, intake) = intake();
        let content = b"the loop's large file\n";
        let pointer = LfsPointer {
            oid: td_base::hash::sha256_hex(content),
            size: content.len() as u64,
        };
        let dest = intake.object_path(&pointer.oid).unwrap();
        // Asked how far: nowhere.
        assert_eq!(
            intake.take_chunk("w.1", &pointer, 0, b"", free).unwrap(),
            LfsReceived::Partly(0)
        );
        // Out of order: refused.
        let e = intake
            .take_chunk("w.1", &pointer, 4, &content[4..], free)
            .unwrap_err();
        assert!(e.contains("came after 0 bytes"), "{e}");
        let charged = std::cell::Cell::new(0);
        let charge = |n| {
            charged.set(charged.get() + n);
            Ok(())
        };
        assert_eq!(
            intake
                .take_chunk("w.1", &pointer, 0, &content[..4], charge)
                .unwrap(),
            LfsReceived::Partly(4)
        );
        // A resend of a later chunk is answered with how far it is, and not charged.
        assert_eq!(
            intake
                .take_chunk("w.1", &pointer, 2, &content[2..4], charge)
                .unwrap(),
            LfsReceived::Partly(4)
        );
        assert_eq!(charged.get(), 4);
        assert!(!dest.exists());
        // Past its size: refused, and the part is dropped (the next try starts clean).
        let e = intake
            .take_chunk("w.1", &pointer, 4, &[b'x'; 40], free)
            .unwrap_err();
        assert!(e.contains("ends past its size"), "{e}");
        let e = intake
            .take_chunk("w.1", &pointer, 4, &content[4..], free)
            .unwrap_err();
        assert!(e.contains("came after 0 bytes"), "{e}");
        // A chunk at 0 starts again, whatever the part held.
        intake
            .take_chunk("w.1", &pointer, 0, b"junk", free)
            .unwrap();
        intake
            .take_chunk("w.1", &pointer, 0, &content[..4], free)
            .unwrap();
        // Over the budget: refused before anything is written.
        let e = intake
            .take_chunk("w.1", &pointer, 4, &content[4..], |_| Err("over".into()))
            .unwrap_err();
        assert_eq!(e, "over");
        intake
            .take_chunk("w.1", &pointer, 0, &content[..4], free)
            .unwrap();
        assert_eq!(
            intake
                .take_chunk("w.1", &pointer, 4, &content[4..], free)
                .unwrap(),
            LfsReceived::Held
        );
        assert_eq!(std::fs::read(&dest).unwrap(), content);
        // Held already: nothing more is asked for, nothing charged.
        assert_eq!(
            intake
                .take_chunk("v.2", &pointer, 0, b"", |_| Err("charged".into()))
                .unwrap(),
            LfsReceived::Held
        );
    }

    #[test]
    fn one_chunk_of_a_part_is_taken_at_a_time() {
        let (_dir, intake) = intake();
        let pointer = LfsPointer {
            oid: "ab".repeat(32),
            size: 10,
        };
        let part = intake.parts.join(format!("w.1.lfs.{}", pointer.oid));
        let claim = Claim::take(&part).unwrap();
        let e = intake
            .take_chunk("w.1", &pointer, 0, b"x", free)
            .unwrap_err();
        assert!(e.contains("is being taken"), "{e}");
        // Another sender's part of the same object is its own.
        intake.take_chunk("w.2", &pointer, 0, b"x", free).unwrap();
        drop(claim);
        intake.take_chunk("w.1", &pointer, 0, b"x", free).unwrap();
    }

    #[test]
    fn bytes_that_do_not_hash_to_the_id_they_are_sent_as_never_land() {
        let (_dir, intake) = intake();
        let honest = b"the user's file\n";
        let pointer = LfsPointer {
            oid: td_base::hash::sha256_hex(honest),
            size: honest.len() as u64,
        };
        let forged = b"a host's own bytes";
        let forged = &forged[..honest.len()];
        let e = intake
            .take_chunk("w.1", &pointer, 0, forged, free)
            .unwrap_err();
        assert!(e.contains("refused"), "{e}");
        assert!(!intake.object_path(&pointer.oid).unwrap().exists());
        // The part is gone too: the honest bytes are taken from the start again.
        assert_eq!(
            intake.take_chunk("w.1", &pointer, 0, honest, free).unwrap(),
            LfsReceived::Held
        );
        // A name that is no id is refused before any file is touched.
        let bad = LfsPointer {
            oid: "../x".to_string(),
            size: 1,
        };
        assert!(intake.take_chunk("w.1", &bad, 0, b"x", free).is_err());
    }
}
