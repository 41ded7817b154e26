//! A host's side of the git-lfs objects of a loop's base. Before the loop's worktree is
//! checked out, the objects the head lists (those the tree of the base commit points at
//! which the head's repository holds) that this host's mirror lacks are fetched into the
//! mirror's LFS storage, each kept only when its bytes hash to its id; git-lfs's smudge then
//! fills the worktree from them, as it fills the user's checkout (it fetches nothing itself:
//! `td_git::daemon_git`). An object the head lacks stays a pointer here as there.

use std::path::Path;

use td_cluster::HeadLink;
use td_cluster::protocol::{
    CHUNK_BYTES, Chunk, FromHost, LFS_LISTING_PAGE, LfsObjectName, MAX_BASE_LFS_BYTES,
};
use td_git::transfer::Mirror;
use td_git::transfer::lfs::{LfsIntake, LfsPointer, LfsReceived};

use super::ask_again;

/// The most pages of a base's listing a host reads (a million objects): a head that lists
/// on and on does not keep a host asking.
const MAX_LISTING_PAGES: usize = 100;

/// Fetches into `mirror` the LFS objects of loop `name`'s base that it lacks, put together
/// in `parts` under the name `sender` (the loop and its placement), a page of the head's
/// listing at a time.
pub(super) async fn fetch_base_lfs(
    link: &HeadLink,
    name: &str,
    sender: &str,
    mirror: &Mirror,
    parts: &Path,
) -> Result<(), String> {
    let intake = mirror
        .lfs_intake(parts)
        .await
        .map_err(|e| format!("the host cannot take LFS objects: {e}"))?;
    let mut left = MAX_BASE_LFS_BYTES;
    let mut over: Vec<String> = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..MAX_LISTING_PAGES {
        let page = next_page(link, name, after.as_deref()).await?;
        let last = page.len() < LFS_LISTING_PAGE;
        after = page.last().map(|o| o.oid.clone());
        for object in page {
            let pointer = LfsPointer {
                oid: object.oid,
                size: object.size,
            };
            if intake.holds(&pointer) {
                continue;
            }
            match left.checked_sub(pointer.size) {
                Some(rest) => left = rest,
                None => {
                    over.push(format!("{} ({} bytes)", pointer.oid, pointer.size));
                    continue;
                }
            }
            let fetched = fetch_object(link, name, sender, &intake, pointer.clone()).await;
            if fetched.is_err() {
                // Not left behind: its name is this placement's, which no later try reuses.
                intake.drop_part(sender, &pointer);
            }
            fetched?;
        }
        if last {
            if !over.is_empty() {
                eprintln!(
                    "taskdaemon host: loop {name}: {} LFS object(s) of its base would take it past the {MAX_BASE_LFS_BYTES} bytes a host fetches for one base; they stay pointers in its worktree: {}",
                    over.len(),
                    over.join(", ")
                );
            }
            return Ok(());
        }
    }
    Err(format!(
        "the head's listing of the base's LFS objects goes past {MAX_LISTING_PAGES} pages of {LFS_LISTING_PAGE}"
    ))
}

/// The page of the head's listing of the loop's base's LFS objects after `after`.
async fn next_page(
    link: &HeadLink,
    name: &str,
    after: Option<&str>,
) -> Result<Vec<LfsObjectName>, String> {
    let page: Vec<LfsObjectName> = ask_again(link, || FromHost::BaseLfs {
        loop_name: name.to_string(),
        after: after.map(str::to_string),
    })
    .await?;
    // In order, each id after the one before (and after `after`): a page cannot loop back.
    let ordered = page.len() <= LFS_LISTING_PAGE
        && after
            .into_iter()
            .chain(page.iter().map(|o| o.oid.as_str()))
            .collect::<Vec<_>>()
            .windows(2)
            .all(|w| w.first() < w.get(1));
    if !ordered {
        return Err(format!(
            "the head's listing of the base's LFS objects is out of order after {after:?}"
        ));
    }
    Ok(page)
}

/// Fetches object `pointer` a chunk at a time, the intake saying where to go on from.
async fn fetch_object(
    link: &HeadLink,
    name: &str,
    sender: &str,
    intake: &LfsIntake,
    pointer: LfsPointer,
) -> Result<(), String> {
    let oid = pointer.oid.clone();
    let mut offset = 0u64;
    loop {
        let chunk: Chunk = ask_again(link, || FromHost::BaseLfsChunk {
            loop_name: name.to_string(),
            oid: oid.clone(),
            offset,
        })
        .await?;
        let data = hex::decode(&chunk.data)
            .map_err(|e| format!("a chunk of LFS object {oid} is not hex: {e}"))?;
        if chunk.total != pointer.size || data.is_empty() || data.len() > CHUNK_BYTES {
            return Err(format!(
                "the head sent a chunk of {} bytes of LFS object {oid} ({} bytes, its pointer says {}), at {offset}",
                data.len(),
                chunk.total,
                pointer.size
            ));
        }
        // Writing and, at the end, hashing the object is file work: not on the runtime's
        // workers.
        let (intake, sender, object) = (intake.clone(), sender.to_string(), pointer.clone());
        let taken = tokio::task::spawn_blocking(move || {
            intake.take_chunk(&sender, &object, offset, &data, |_| Ok(()))
        })
        .await
        .map_err(|e| format!("the host's LFS task failed: {e}"))?
        .map_err(|e| format!("LFS object {oid} of the base: {e}"))?;
        match taken {
            LfsReceived::Held => return Ok(()),
            LfsReceived::Partly(next) if next > offset => offset = next,
            LfsReceived::Partly(next) => {
                return Err(format!(
                    "LFS object {oid} of the base got no further than {next} bytes"
                ));
            }
        }
    }
}
