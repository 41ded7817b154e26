//! What a bundle's own pack carried, held against what its tip's history needs (the head
//! taking a loop's branch back, [`super::take_branch`]).
//!
//! The quarantine sees every object of the head's repository through its alternates. So
//! `index-pack --strict`, the history walk and the ancestry checks all pass for a tip whose
//! history holds a commit the host was never sent (another loop's tip, a user's branch),
//! found in the head's repository rather than in the bundle; and `--fix-thin` completes
//! deltas against any object the head has, so a small delta can copy such an object's
//! content into a new file. The head sent the host the base's history and nothing else: a
//! loop's branch may bring what its pack carries, and use what the base reaches.

use std::collections::HashSet;
use std::io::{Read, Seek};
use std::path::PathBuf;

use super::header::{ObjectFormat, is_object_id};
use super::{Incoming, Result, Target, TransferError, shown};
use crate::worktree::GitInput;

/// The objects of a bundle's pack once indexed in the quarantine, by where their data came
/// from.
struct PackObjects {
    /// Carried in the bundle's pack.
    sent: HashSet<String>,
    /// Delta bases `index-pack --fix-thin` copied into the indexed pack from the head's
    /// objects: the pack's deltas are made against them.
    borrowed: Vec<String>,
}

impl Incoming {
    /// Refuses the bundle unless every commit its tip's history has beyond `base` (and the
    /// prerequisites) is in its own pack (`pack`, the name `index-pack` gave it in the
    /// quarantine), and every other object the tip or the pack's deltas use without the
    /// pack carrying it is one `base` reaches.
    pub(super) async fn check_sent(&self, pack: &str, base: &str) -> Result<()> {
        let objects = self.pack_objects(pack).await?;
        let mut edges = vec![base.to_string()];
        edges.extend(self.header.prerequisites.iter().cloned());
        let missing = self.missing_from(&objects.sent, &edges).await?;
        self.refuse_commits_among(&missing, base).await?;
        self.refuse_unreached(&missing, &objects.borrowed, &edges, base)
            .await
    }

    /// Refuses the bundle when one of `missing` (objects the tip needs that its pack lacks)
    /// is a commit: the commit walk of `rev-list` is exact, so the base does not reach it,
    /// and it was found in the head's repository.
    async fn refuse_commits_among(&self, missing: &[String], base: &str) -> Result<()> {
        let commits = self.quarantine.repo.commits_among(missing).await?;
        match missing.iter().find(|id| commits.contains(*id)) {
            Some(commit) => Err(self.refused(format!(
                "its history holds the commit {commit}, which is not in its pack and which the base {base} does not reach: the host was never sent it"
            ))),
            None => Ok(()),
        }
    }

    /// Refuses the bundle unless `base`'s history (walked from `edges`: the base and the
    /// prerequisites) reaches each of `missing` (trees and blobs the tip needs that its
    /// pack lacks) and of `borrowed` (the bases of its thin deltas).
    async fn refuse_unreached(
        &self,
        missing: &[String],
        borrowed: &[String],
        edges: &[String],
        base: &str,
    ) -> Result<()> {
        let unsure: HashSet<String> = missing.iter().chain(borrowed).cloned().collect();
        if unsure.is_empty() {
            return Ok(());
        }
        let left = self.quarantine.repo.unreached(edges, unsure).await?;
        if let Some(id) = borrowed.iter().find(|id| left.contains(*id)) {
            return Err(self.refused(format!(
                "its pack holds deltas against the object {id}, which the base {base} does not reach: the host was never sent it"
            )));
        }
        match left.iter().min() {
            Some(id) => Err(self.refused(format!(
                "its history holds the object {id}, which is not in its pack and which the base {base} does not reach: the host was never sent it"
            ))),
            None => Ok(()),
        }
    }

    /// The objects `rev-list --objects` lists for the tip beyond `edges` that the pack did
    /// not carry. The listing leaves out only what the edges' own trees hold (not their
    /// older history), so a tree or blob among these may still be one the base reaches: a
    /// file reverted to an old version, which a host whose git walks with reachability
    /// bitmaps does not send.
    async fn missing_from(&self, sent: &HashSet<String>, edges: &[String]) -> Result<Vec<String>> {
        let listed = self
            .quarantine
            .repo
            .rev_list(&["--objects", "--no-object-names"], &[&self.tip], edges)
            .await?;
        Ok(listed
            .lines()
            .map(str::trim)
            .filter(|id| !id.is_empty() && !sent.contains(*id))
            .map(str::to_string)
            .collect())
    }

    /// The objects of the quarantine's pack `pack-<pack>`, split at what the bundle's pack
    /// header counts: `--fix-thin` appends the bases it copies after the pack's own objects.
    async fn pack_objects(&self, pack: &str) -> Result<PackObjects> {
        let carried = self.pack_count()?;
        let q = &self.quarantine.repo;
        let idx = q.git_dir.join(format!("objects/pack/pack-{pack}.idx"));
        let unreadable = |detail: String| TransferError::File {
            action: "read the pack index",
            path: idx.clone(),
            detail,
        };
        let file = std::fs::File::open(&idx).map_err(|e| unreadable(e.to_string()))?;
        let listing = q
            .run(
                &["show-index"],
                GitInput::File(file),
                "check that the temporary directory is readable",
            )
            .await?;
        let mut entries = parse_show_index(&listing, self.header.format).ok_or_else(|| {
            unreadable(format!(
                "`git show-index` printed a line that is not `<offset> <id>`: {}",
                shown(&listing)
            ))
        })?;
        if entries.len() < carried {
            return Err(unreadable(format!(
                "it lists {} objects and the bundle's pack counts {carried}",
                entries.len()
            )));
        }
        entries.sort_unstable();
        let borrowed = entries.split_off(carried);
        Ok(PackObjects {
            sent: entries.into_iter().map(|(_, id)| id).collect(),
            borrowed: borrowed.into_iter().map(|(_, id)| id).collect(),
        })
    }

    /// How many objects the bundle's pack says it holds (its header: `PACK`, a version and
    /// a count, big-endian; `index-pack` checked that the pack holds exactly that many).
    fn pack_count(&self) -> Result<usize> {
        let unreadable = |detail: String| TransferError::File {
            action: "read the pack header of",
            path: self.copy.clone(),
            detail,
        };
        let mut file = std::fs::File::open(&self.copy).map_err(|e| unreadable(e.to_string()))?;
        file.seek(std::io::SeekFrom::Start(self.header.pack_offset))
            .map_err(|e| unreadable(e.to_string()))?;
        let mut head = [0u8; 12];
        file.read_exact(&mut head)
            .map_err(|e| unreadable(e.to_string()))?;
        let [b'P', b'A', b'C', b'K', _, _, _, _, c0, c1, c2, c3] = head else {
            return Err(self.refused("its pack does not start with `PACK`"));
        };
        usize::try_from(u32::from_be_bytes([c0, c1, c2, c3])).map_err(|e| unreadable(e.to_string()))
    }
}

/// `(offset, id)` of each line of `git show-index` (`<offset> <id> (<crc32>)`), or `None`
/// when a line is not that (an id of `format`).
fn parse_show_index(listing: &str, format: ObjectFormat) -> Option<Vec<(u64, String)>> {
    listing
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let mut fields = line.split_whitespace();
            let offset = fields.next()?.parse::<u64>().ok()?;
            let id = fields.next()?;
            is_object_id(id, format).then(|| (offset, id.to_string()))
        })
        .collect()
}

/// The name `index-pack --stdin` gives the pack it wrote (its stdout is `pack\t<hash>`), or
/// `None` when it printed something else.
pub(super) fn indexed_pack_name(stdout: &str, format: ObjectFormat) -> Option<String> {
    let name = stdout.trim().strip_prefix("pack\t")?;
    is_object_id(name, format).then(|| name.to_string())
}

/// Where a quarantine's pack could not be found from `index-pack`'s answer.
pub(super) fn unnamed_pack(git_dir: PathBuf, stdout: &str) -> TransferError {
    TransferError::File {
        action: "find the pack indexed into",
        path: git_dir,
        detail: format!(
            "`git index-pack` answered {:?}, not `pack <hash>`",
            shown(stdout)
        ),
    }
}

impl Target {
    /// Which of `wanted` (objects here) the history of `from` (commits here) does not
    /// reach. First the trees of `from` alone, where a thin pack's bases and a branch's
    /// unchanged files are: a listing as long as one checkout. Only for what is still
    /// unfound, the whole history (one walk of every object the base reaches, held in
    /// memory as one line each): a host whose git walks with reachability bitmaps leaves
    /// out, and makes deltas against, anything the base reaches.
    async fn unreached(
        &self,
        from: &[String],
        mut wanted: HashSet<String>,
    ) -> Result<HashSet<String>> {
        let tips: Vec<&str> = from.iter().map(String::as_str).collect();
        let walks: [&[&str]; 2] = [
            &["--objects", "--no-object-names", "--no-walk"],
            &["--objects", "--no-object-names"],
        ];
        for options in walks {
            if wanted.is_empty() {
                break;
            }
            let listed = self.rev_list(options, &tips, &[]).await?;
            for id in listed.lines() {
                wanted.remove(id.trim());
            }
        }
        Ok(wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_index_lines_are_read_and_anything_else_is_refused() {
        let sha1 = ObjectFormat::Sha1;
        let a = "a".repeat(40);
        let listing = format!("12 {a} (72188af2)\n254 {} (a5f1c686)\n", "b".repeat(40));
        assert_eq!(
            parse_show_index(&listing, sha1),
            Some(vec![(12, a.clone()), (254, "b".repeat(40))])
        );
        assert_eq!(parse_show_index("", sha1), Some(vec![]));
        assert_eq!(
            parse_show_index(&format!("12 {a}"), ObjectFormat::Sha256),
            None
        );
        for bad in [
            format!("x {a}"),
            "12".to_string(),
            "12 abc".to_string(),
            format!("-1 {a}"),
            format!("12 {}", "A".repeat(40)),
        ] {
            assert_eq!(parse_show_index(&bad, sha1), None, "{bad}");
        }
    }

    #[test]
    fn only_a_pack_line_names_the_indexed_pack() {
        let id = "c".repeat(40);
        let sha1 = ObjectFormat::Sha1;
        assert_eq!(
            indexed_pack_name(&format!("pack\t{id}\n"), sha1),
            Some(id.clone())
        );
        assert_eq!(indexed_pack_name(&format!("keep\t{id}"), sha1), None);
        assert_eq!(indexed_pack_name("pack\t../x", sha1), None);
    }
}
