//! Dependencies hand over their work: with `handover: merged` (the default) a loop starts
//! only once each dependency completed and its work landed in its integration target, and
//! it starts from its own target's head at that moment; the work of a dependency that
//! landed in another target is merged into that start point first (in a scratch
//! worktree). `handover: base` starts from the base branch as it is (dependencies only
//! order the loops).

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::loops::Handover;
use crate::config::{LoopDef, LoopType, WorktreeMode};
use crate::run::merge_queue::integrates;
use crate::run::record::{LoopStatus, RunSummary};
use td_git::integrate::ScratchMerge;
use td_git::worktree::Repo;

/// Where a loop's work landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    /// The integration target.
    pub into: String,
    /// The target's head right after the loop's work landed.
    pub commit: String,
}

/// The loops whose work landed, from a run's summary (a resumed run's).
pub fn landed_from(summary: &RunSummary) -> BTreeMap<String, Landed> {
    summary
        .loops
        .iter()
        .filter_map(|(name, l)| {
            let m = l.merge.as_ref()?;
            if !m.merged {
                return None;
            }
            Some((
                name.clone(),
                Landed {
                    into: m.into.clone()?,
                    commit: m.commit.clone()?,
                },
            ))
        })
        .collect()
}

/// What loop `def` starts from: its own `handover`, else its type's.
pub fn handover_of(def: &LoopDef, types: &BTreeMap<String, LoopType>) -> Handover {
    def.handover
        .or_else(|| types.get(&def.loop_type).map(|t| t.handover))
        .unwrap_or_default()
}

/// Whether `def` may start: each dependency completed, and (with `handover: merged`) its
/// work landed, unless the dependency is never integrated (`worktree: repo`) or works in
/// `def`'s own shared worktree.
pub fn ready(
    def: &LoopDef,
    handover: Handover,
    loops: &[LoopDef],
    status: &BTreeMap<String, LoopStatus>,
    landed: &BTreeMap<String, Landed>,
) -> bool {
    def.depends_on.iter().all(|d| {
        if status.get(d) != Some(&LoopStatus::Completed) {
            return false;
        }
        if handover == Handover::Base || landed.contains_key(d) {
            return true;
        }
        // Never integrated (`worktree: repo`), or in the same shared worktree: its work is
        // where `def` works already (a group lands only once every member ended).
        loops.iter().find(|l| &l.name == d).is_some_and(|l| {
            !integrates(l)
                || matches!(
                    (&l.worktree, &def.worktree),
                    (Some(WorktreeMode::Shared(a)), Some(WorktreeMode::Shared(b))) if a == b
                )
        })
    })
}

/// The commit a new loop branch of `def` (`handover: merged`, with dependencies) starts
/// from: the head of `target`, its integration target (made from `target_start` when
/// missing), with the work of dependencies landed in other targets merged in; such a merge
/// that conflicts is an `Err` with the files and why.
pub async fn start_point(
    repo: &Repo,
    scratch_root: &Path,
    def: &LoopDef,
    target: &str,
    target_start: &str,
    landed: &BTreeMap<String, Landed>,
) -> Result<String, String> {
    let head = repo
        .ensure_branch(target, target_start)
        .await
        .map_err(|e| format!("cannot prepare its integration target: {e}"))?;
    let foreign: Vec<(&String, &Landed)> = def
        .depends_on
        .iter()
        .filter_map(|d| landed.get(d).map(|l| (d, l)))
        .filter(|(_, l)| l.into != target)
        .collect();
    if foreign.is_empty() {
        return Ok(head);
    }
    let scratch = repo
        .scratch(&scratch_root.join(format!("start-{}", def.name)), &head)
        .await
        .map_err(|e| format!("cannot make a scratch worktree for its start point: {e}"))?;
    let mut result = Ok(head);
    for (dep, l) in foreign {
        let message = format!(
            "taskdaemon: start {} with the work of {dep} (landed in {})",
            def.name, l.into
        );
        match scratch.merge(&l.commit, &message).await {
            Ok(ScratchMerge::Merged { commit }) => result = Ok(commit),
            Ok(ScratchMerge::Conflict { files }) => {
                result = Err(format!(
                    "the work of its dependency `{dep}` (landed in `{}`) conflicts with `{target}` in: {}; merge them by hand (or give it `handover: base`), then run it again",
                    l.into,
                    files
                        .iter()
                        .map(|f| f.path.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                break;
            }
            Ok(ScratchMerge::Refused { reason }) => {
                result = Err(format!(
                    "the work of its dependency `{dep}` could not be merged: {reason}"
                ));
                break;
            }
            Err(e) => {
                result = Err(format!(
                    "the work of its dependency `{dep}` could not be merged: {e}"
                ));
                break;
            }
        }
    }
    let _ = scratch.remove().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defs(yaml: &str) -> Vec<LoopDef> {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn a_dependency_must_have_landed_unless_the_handover_is_base() {
        let loops = defs(
            "- {name: a, type: code, task: t}\n- {name: r, type: code, task: t, worktree: repo}\n- {name: b, type: code, task: t, depends-on: [a, r]}\n- {name: c, type: code, task: t, depends-on: [a], handover: base}\n- {name: w, type: code, task: t, worktree: 'shared:g'}\n- {name: v, type: code, task: t, worktree: 'shared:g', depends-on: [w]}\n",
        );
        let mut status: BTreeMap<String, LoopStatus> = loops
            .iter()
            .map(|l| (l.name.clone(), LoopStatus::Completed))
            .collect();
        let mut landed = BTreeMap::new();
        let types = crate::config::loop_types::resolve(&BTreeMap::new()).unwrap();
        let h = |d: &LoopDef| handover_of(d, &types);
        // In one shared worktree, a member's work is there already: no landing to wait for.
        assert!(ready(
            &loops[5],
            h(&loops[5]),
            &loops,
            &status,
            &BTreeMap::new()
        ));
        assert!(!ready(&loops[2], h(&loops[2]), &loops, &status, &landed));
        assert!(ready(&loops[3], h(&loops[3]), &loops, &status, &landed));
        landed.insert(
            "a".to_string(),
            Landed {
                into: "x".into(),
                commit: "c".into(),
            },
        );
        // `r` works in the repository itself: nothing of it is integrated.
        assert!(ready(&loops[2], h(&loops[2]), &loops, &status, &landed));
        status.insert("r".into(), LoopStatus::Running);
        assert!(!ready(&loops[2], h(&loops[2]), &loops, &status, &landed));
        // A type's `handover: base` holds for its loops unless a loop says otherwise.
        let mut type_defs = BTreeMap::new();
        type_defs.insert(
            "free".to_string(),
            serde_yaml_ng::from_str("{extends: code, handover: base}").unwrap(),
        );
        let types = crate::config::loop_types::resolve(&type_defs).unwrap();
        let typed = defs(
            "- {name: x, type: free, task: t, depends-on: [a]}\n- {name: y, type: free, task: t, depends-on: [a], handover: merged}\n",
        );
        assert_eq!(handover_of(&typed[0], &types), Handover::Base);
        assert_eq!(handover_of(&typed[1], &types), Handover::Merged);
    }
}
