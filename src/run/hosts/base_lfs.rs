//! The head's side of the git-lfs objects a host fetches for a loop's base
//! ([`FromHost::BaseLfs`](td_cluster::protocol::FromHost::BaseLfs)): which objects the tree of
//! the base commit points at that the head's repository holds, and their bytes, a chunk at a
//! time. A host asks only for the objects of the base of a loop it runs (the head answers for
//! no other object), and keeps one only when its bytes hash to its id.

use std::sync::Arc;

use td_cluster::protocol::{Chunk, LfsObjectName};
use td_git::transfer::lfs::{LfsObject, lfs_objects_at};
use td_git::worktree::Repo;

/// How many bases' listings the head keeps: a run's loops mostly share its base; a loop that
/// moved starts from its own last commit.
const KEPT_LISTINGS: usize = 16;

/// How many chunks for hosts the head reads at a time: each is a 1 MiB read, held twice
/// over in hex until it is sent, and a host may ask for many at once.
const READS_AT_ONCE: usize = 4;

/// The listings of the bases hosts asked about, the latest last, and the head's reads of
/// chunks for hosts.
pub struct BaseLfs {
    listings: tokio::sync::Mutex<Vec<(String, Arc<Vec<LfsObject>>)>>,
    reads: tokio::sync::Semaphore,
}

impl Default for BaseLfs {
    fn default() -> Self {
        BaseLfs {
            listings: tokio::sync::Mutex::new(Vec::new()),
            reads: tokio::sync::Semaphore::new(READS_AT_ONCE),
        }
    }
}

impl BaseLfs {
    /// A chunk of the file at `path` from `offset` for a host (a base bundle's, an LFS
    /// object's), read off the runtime's workers, [`READS_AT_ONCE`] at a time.
    pub async fn read(&self, path: &std::path::Path, offset: u64) -> Result<Chunk, String> {
        let _permit = self
            .reads
            .acquire()
            .await
            .map_err(|e| format!("the head's reads stopped: {e}"))?;
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || super::remote::read_chunk(&path, offset))
            .await
            .unwrap_or_else(|e| Err(format!("the head's read failed: {e}")))
    }

    /// The LFS objects the tree of `base` points at which `repo` holds (read from git once
    /// per base while it is among the last [`KEPT_LISTINGS`] asked about).
    async fn listing(&self, repo: &Repo, base: &str) -> Result<Arc<Vec<LfsObject>>, String> {
        // Held while git lists, so that the loops of one base starting together list it once.
        let mut listings = self.listings.lock().await;
        if let Some(at) = listings.iter().position(|(b, _)| b == base) {
            let kept = listings.remove(at);
            let objects = kept.1.clone();
            listings.push(kept);
            return Ok(objects);
        }
        let objects = Arc::new(
            lfs_objects_at(repo, base)
                .await
                .map_err(|e| format!("cannot list the LFS objects of {base}: {e}"))?,
        );
        if listings.len() >= KEPT_LISTINGS {
            listings.remove(0);
        }
        listings.push((base.to_string(), objects.clone()));
        Ok(objects)
    }

    /// The objects for a host: [`FromHost::BaseLfs`](td_cluster::protocol::FromHost::BaseLfs)'s
    /// answer.
    pub async fn names(&self, repo: &Repo, base: &str) -> Result<Vec<LfsObjectName>, String> {
        Ok(self
            .listing(repo, base)
            .await?
            .iter()
            .map(|o| LfsObjectName {
                oid: o.pointer.oid.clone(),
                size: o.pointer.size,
            })
            .collect())
    }

    /// A chunk of object `oid` from `offset`, when it is one of `base`'s.
    pub async fn chunk(
        &self,
        repo: &Repo,
        base: &str,
        oid: &str,
        offset: u64,
    ) -> Result<Chunk, String> {
        let listing = self.listing(repo, base).await?;
        let Some(object) = listing.iter().find(|o| o.pointer.oid == oid) else {
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
