//! The head's side of the git-lfs objects a host fetches for a loop's base
//! ([`FromHost::BaseLfs`](td_cluster::protocol::FromHost::BaseLfs)): which objects the tree of
//! the base commit points at that the head's repository holds, in pages, and their bytes, a
//! chunk at a time. A placement gets the listing of its own base, kept from its first page
//! until its loop runs, and the head answers chunks of those objects only. (A loop's base is the run's commit, or
//! after a move its own last commit, whose pointers the loop wrote: it can name any object of
//! the user's LFS storage there, which a loop on the head reads anyway, `.git` being
//! readable to its commands.) The host keeps an object only when its bytes hash to its id.
//! Every chunk a host fetches, its base bundle's too, is read here ([`BaseLfs::read`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use td_base::sync::lock;
use td_cluster::protocol::{
    CHUNK_BYTES, Chunk, LFS_LISTING_PAGE, LfsObjectName, MAX_BASE_LFS_BYTES,
};
use td_git::transfer::lfs::{LfsObject, lfs_objects_at};
use td_git::worktree::Repo;

/// How many bases' listings the head keeps for placements still to ask: a run's loops mostly
/// share its base; a loop that moved starts from its own last commit.
const KEPT_BASES: usize = 16;

/// How many chunks for hosts the head reads at a time: each is a 1 MiB read, held twice
/// over in hex until it is sent, and a host may ask for many at once.
const READS_AT_ONCE: usize = 4;

/// The LFS objects of a base that the head holds, sorted by id.
type Objects = Arc<Vec<LfsObject>>;

/// A base's listing, made once however many placements ask at once.
type Listing = Arc<tokio::sync::OnceCell<Objects>>;

/// The listings of bases and placements, and the head's reads of chunks for hosts.
pub struct BaseLfs {
    /// The last bases asked about, the latest last.
    bases: std::sync::Mutex<Vec<(String, Listing)>>,
    /// Each loop's placement (its attempt) and the listing of its base, until it runs.
    placements: std::sync::Mutex<BTreeMap<String, (u64, Objects)>>,
    /// The bases whose objects the head said pass what a host fetches.
    warned: std::sync::Mutex<Vec<String>>,
    reads: tokio::sync::Semaphore,
}

impl Default for BaseLfs {
    fn default() -> Self {
        BaseLfs {
            bases: std::sync::Mutex::new(Vec::new()),
            placements: std::sync::Mutex::new(BTreeMap::new()),
            warned: std::sync::Mutex::new(Vec::new()),
            reads: tokio::sync::Semaphore::new(READS_AT_ONCE),
        }
    }
}

impl BaseLfs {
    /// A chunk of the file at `path` from `offset` for a host (a base bundle's, an LFS
    /// object's), read off the runtime's workers, [`READS_AT_ONCE`] at a time.
    pub async fn read(&self, path: &Path, offset: u64) -> Result<Chunk, String> {
        let _permit = self
            .reads
            .acquire()
            .await
            .map_err(|e| format!("the head's reads stopped: {e}"))?;
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || read_chunk(&path, offset))
            .await
            .unwrap_or_else(|e| Err(format!("the head's read failed: {e}")))
    }

    /// The LFS objects the tree of `base` points at which `repo` holds, sorted by id: read
    /// from git once per base while it is among the last [`KEPT_BASES`] asked about (the
    /// placements of one base asking together wait for one listing; other bases' go on).
    async fn listing(&self, repo: &Repo, base: &str) -> Result<Objects, String> {
        let cell = {
            let mut bases = lock(&self.bases);
            let cell = match bases.iter().position(|(b, _)| b == base) {
                Some(at) => bases.remove(at).1,
                None => Listing::default(),
            };
            if bases.len() >= KEPT_BASES {
                bases.remove(0);
            }
            bases.push((base.to_string(), cell.clone()));
            cell
        };
        let listed = cell
            .get_or_try_init(|| async {
                let mut objects = lfs_objects_at(repo, base)
                    .await
                    .map_err(|e| format!("cannot list the LFS objects of {base}: {e}"))?;
                objects.sort_by(|a, b| a.pointer.oid.cmp(&b.pointer.oid));
                Ok::<_, String>(Arc::new(objects))
            })
            .await?;
        Ok(listed.clone())
    }

    /// [`FromHost::BaseLfs`](td_cluster::protocol::FromHost::BaseLfs)'s answer for loop
    /// `name`'s placement `attempt` on `base`: the page of its listing after `after`. The
    /// first page fixes the placement's listing.
    pub async fn names(
        &self,
        repo: &Repo,
        name: &str,
        attempt: u64,
        base: &str,
        after: Option<&str>,
    ) -> Result<Vec<LfsObjectName>, String> {
        let kept = lock(&self.placements)
            .get(name)
            .filter(|(a, _)| *a == attempt)
            .map(|(_, listing)| listing.clone());
        let listing = match (kept, after) {
            (Some(listing), Some(_)) => listing,
            _ => {
                let listing = self.listing(repo, base).await?;
                self.fix(name, attempt, &listing);
                self.warn_if_large(name, base, &listing);
                listing
            }
        };
        Ok(page(&listing, after))
    }

    /// Keeps `listing` as placement `attempt` of loop `name`'s; not over a later placement's
    /// (the loop may have moved while git listed; attempts only grow).
    fn fix(&self, name: &str, attempt: u64, listing: &Objects) {
        let mut placements = lock(&self.placements);
        let later = placements.get(name).is_some_and(|(a, _)| *a > attempt);
        if !later {
            placements.insert(name.to_string(), (attempt, listing.clone()));
        }
    }

    /// Says once per base, on the head's terminal, when its LFS objects pass what a host
    /// fetches for one base (the host says which it left out, on its own terminal; it
    /// fetches only those its mirror lacks, so it may leave out none).
    fn warn_if_large(&self, name: &str, base: &str, listing: &[LfsObject]) {
        let total = listing
            .iter()
            .fold(0u64, |sum, o| sum.saturating_add(o.pointer.size));
        if total <= MAX_BASE_LFS_BYTES {
            return;
        }
        let first = {
            let mut warned = lock(&self.warned);
            let first = !warned.iter().any(|b| b == base);
            if first {
                warned.push(base.to_string());
            }
            first
        };
        if first {
            eprintln!(
                "taskdaemon: loop {name}: the LFS objects of its base ({base}) come to {total} bytes, over the {MAX_BASE_LFS_BYTES} a host fetches for one base: on a host that lacks them, those past that stay pointers in the loop's worktree (place such loops on the head, hosts.placement, to give them their content)"
            );
        }
    }

    /// Forgets placement `attempt` of loop `name`'s listing once the loop runs (its host has
    /// fetched what it needed before it started it).
    pub fn forget(&self, name: &str, attempt: u64) {
        let mut placements = lock(&self.placements);
        if placements.get(name).is_some_and(|(a, _)| *a == attempt) {
            placements.remove(name);
        }
    }

    /// A chunk of object `oid` from `offset` for loop `name`'s placement `attempt`, when it
    /// is one of its listing's.
    pub async fn chunk(
        &self,
        name: &str,
        attempt: u64,
        oid: &str,
        offset: u64,
    ) -> Result<Chunk, String> {
        let listing = lock(&self.placements)
            .get(name)
            .filter(|(a, _)| *a == attempt)
            .map(|(_, listing)| listing.clone())
            .ok_or_else(|| {
                format!(
                    "loop {name} asked for no listing of its base's LFS objects in this placement: ask for it first"
                )
            })?;
        let Some(object) = listing
            .binary_search_by(|o| o.pointer.oid.as_str().cmp(oid))
            .ok()
            .and_then(|at| listing.get(at))
        else {
            return Err(format!(
                "{oid:?} is not an LFS object of the loop's base that the head holds"
            ));
        };
        let chunk = self.read(&object.path, offset).await?;
        if chunk.total != object.pointer.size {
            return Err(format!(
                "the head's LFS object {oid} has {} bytes, not its pointer's {}",
                chunk.total, object.pointer.size
            ));
        }
        Ok(chunk)
    }
}

/// A chunk of the file at `path` from `offset`, when `path` is a file itself (not a symlink,
/// not a FIFO: what a host gets is the file the head listed or made, not what a link put in
/// its place since; directories above it are followed).
fn read_chunk(path: &Path, offset: u64) -> Result<Chunk, String> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        // Non-blocking: a FIFO put in its place opens at once (and is refused below).
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    let total = meta.len();
    if offset > total {
        return Err(format!("offset {offset} is past the file's {total} bytes"));
    }
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut buf = Vec::with_capacity(CHUNK_BYTES);
    file.take(CHUNK_BYTES as u64)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(Chunk {
        data: hex::encode(buf),
        total,
    })
}

/// The names of `listing` (sorted by id) after `after`, at most [`LFS_LISTING_PAGE`].
fn page(listing: &[LfsObject], after: Option<&str>) -> Vec<LfsObjectName> {
    let from = match after {
        Some(after) => listing.partition_point(|o| o.pointer.oid.as_str() <= after),
        None => 0,
    };
    listing
        .iter()
        .skip(from)
        .take(LFS_LISTING_PAGE)
        .map(|o| LfsObjectName {
            oid: o.pointer.oid.clone(),
            size: o.pointer.size,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use td_git::transfer::lfs::LfsPointer;

    fn object(n: usize) -> LfsObject {
        LfsObject {
            pointer: LfsPointer {
                oid: format!("{n:064x}"),
                size: 1,
            },
            path: format!("/nowhere/{n}").into(),
        }
    }

    #[test]
    fn a_listing_goes_in_pages_by_id() {
        let listing: Vec<LfsObject> = (0..LFS_LISTING_PAGE * 2 + 3).map(object).collect();
        let first = page(&listing, None);
        assert_eq!(first.len(), LFS_LISTING_PAGE);
        assert_eq!(first[0].oid, format!("{:064x}", 0));
        let last_of_first = first.last().map(|o| o.oid.clone());
        let second = page(&listing, last_of_first.as_deref());
        assert_eq!(second.len(), LFS_LISTING_PAGE);
        assert_eq!(second[0].oid, format!("{:064x}", LFS_LISTING_PAGE));
        let third = page(&listing, second.last().map(|o| o.oid.as_str()));
        assert_eq!(third.len(), 3, "the short page is the last");
        assert!(page(&listing, third.last().map(|o| o.oid.as_str())).is_empty());
        // An id between two listed ones goes on from the next.
        assert_eq!(page(&listing[..3], Some("0"))[0].oid, format!("{:064x}", 0));
    }

    #[test]
    fn a_chunk_is_read_from_its_offset_and_past_the_end_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        std::fs::write(&path, b"abcdef").unwrap();
        let chunk = read_chunk(&path, 2).unwrap();
        assert_eq!(hex::decode(chunk.data).unwrap(), b"cdef");
        assert_eq!(chunk.total, 6);
        assert!(read_chunk(&path, 7).is_err());
        assert_eq!(read_chunk(&path, 6).unwrap().data, "");
    }

    #[tokio::test]
    async fn a_chunk_is_read_from_the_file_itself_never_through_a_link_or_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("object");
        std::fs::write(&file, b"content").unwrap();
        let lfs = BaseLfs::default();
        let chunk = lfs.read(&file, 2).await.unwrap();
        assert_eq!((chunk.data, chunk.total), (hex::encode(b"ntent"), 7));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let why = lfs.read(&link, 0).await.unwrap_err();
        assert!(why.contains("cannot open"), "{why}");
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();
        let why = lfs.read(&fifo, 0).await.unwrap_err();
        assert!(why.contains("is not a file"), "{why}");
        let why = lfs.read(&file, 8).await.unwrap_err();
        assert!(why.contains("past the file's 7 bytes"), "{why}");
    }

    #[tokio::test]
    async fn a_chunk_is_answered_only_from_the_placements_own_listing() {
        let lfs = BaseLfs::default();
        lfs.fix("w", 2, &Arc::new((0..3).map(object).collect::<Vec<_>>()));
        // A listing an earlier placement finished late does not replace it.
        lfs.fix("w", 1, &Arc::new(Vec::new()));
        let unlisted = format!("{:064x}", 7);
        let refused = lfs.chunk("w", 2, &unlisted, 0).await.unwrap_err();
        assert!(
            refused.contains("is not an LFS object of the loop's base"),
            "{refused}"
        );
        let listed = format!("{:064x}", 1);
        // Another placement of the loop, or another loop, has no listing here.
        for (name, attempt) in [("w", 1), ("v", 2)] {
            let why = lfs.chunk(name, attempt, &listed, 0).await.unwrap_err();
            assert!(why.contains("ask for it first"), "{why}");
        }
        // A listed object is read (here it is missing: the read says so).
        let why = lfs.chunk("w", 2, &listed, 0).await.unwrap_err();
        assert!(why.contains("/nowhere/1"), "{why}");
        // Once the loop runs, its listing is forgotten; not by an earlier placement's word.
        lfs.forget("w", 1);
        assert!(
            lfs.chunk("w", 2, &listed, 0)
                .await
                .unwrap_err()
                .contains("/nowhere/1")
        );
        lfs.forget("w", 2);
        let why = lfs.chunk("w", 2, &listed, 0).await.unwrap_err();
        assert!(why.contains("ask for it first"), "{why}");
    }
}
