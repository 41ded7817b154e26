//! The run's merge queue: completed loops are integrated one at a time, each into its
//! integration target (its base branch with `merge: true`, otherwise the run's branch
//! `taskdaemon/<run>/integration`). For each: the loop's branch is merged onto the target's
//! head in a scratch worktree under `RUN/scratch/` (never in a checkout of the user's), the
//! loop's validation runs on that merged tree, confined and in the heavy lane as the engine
//! runs it, and only then is the target advanced to the merge commit (see
//! `td_git::integrate`). A conflict or a failing merged validation is handed back: the
//! target's head is merged into the loop's own worktree (conflict markers left for it), and
//! the orchestrator runs the loop again with what went wrong in its inbox.
//!
//! The queue runs as its own task: the orchestrator pushes completed loops in and takes
//! outcomes out in its select loop, so running loops and new starts never wait on a merge.
//! `taskdaemon merge` runs the same [`integrate`] by hand.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use tokio::sync::mpsc;

use crate::config::{Config, LoopDef, LoopType, WorktreeMode};
use crate::run::handover::Landed;
use crate::run::progress::ProgressDisplay;
use crate::run::record::{LoopStatus, MergeSummary, RunRecord};
use td_base::text::head_tail;
use td_git::integrate::{Advance, ConflictFile, HandBackMerge, ScratchMerge};
use td_git::worktree::{BRANCH_PREFIX, Repo, Worktree};
use td_protocol::events::{EventKind, EventLog};
use td_toolkit::call_path::{CallPath, LaneRunner};
use td_toolkit::context::{LoopCommands, ToolContext};
use td_toolkit::receipts::SideEffect;

/// Hand backs a loop gets before it is blocked, unless `merge-attempts` says otherwise.
pub const DEFAULT_MERGE_ATTEMPTS: u32 = 3;

/// Longest validation output kept for a hand back (head and tail).
const MAX_VALIDATION_OUTPUT: usize = 4_000;

/// How often a job is merged again because its target moved under it before it gives up.
const MAX_RACES: usize = 5;

/// The branch loop `def` integrates into: its base with `merge: true` (run or loop),
/// otherwise the run's own integration branch for that base.
pub fn target_of(run_id: &str, def: &LoopDef, config: &Config, default_base: &str) -> String {
    let base = def.base.as_deref().unwrap_or(default_base);
    if def.merge.unwrap_or(config.merge) {
        return base.to_string();
    }
    if def.base.as_deref().is_none_or(|b| b == default_base) {
        return format!("{BRANCH_PREFIX}/{run_id}/integration");
    }
    let safe: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("{BRANCH_PREFIX}/{run_id}/integration-{safe}")
}

/// Where a missing integration target starts: the loop's base.
pub fn target_start(def: &LoopDef, default_base: &str) -> String {
    def.base.clone().unwrap_or_else(|| default_base.to_string())
}

/// Hand backs loop `def` gets before it is blocked.
pub fn merge_attempts(config: &Config, def: &LoopDef) -> u32 {
    def.merge_attempts
        .or(config.merge_attempts)
        .unwrap_or(DEFAULT_MERGE_ATTEMPTS)
}

/// Whether loop `def`'s work goes through the queue: not with `worktree: repo` (it works in
/// the repository's own checkout, where its changes already are).
pub fn integrates(def: &LoopDef) -> bool {
    !matches!(def.worktree, Some(WorktreeMode::Repo))
}

/// The validation of loop `def` (its own, else its type's), as the queue runs it.
pub fn validation_of(def: &LoopDef, loop_type: &LoopType) -> Validation {
    Validation {
        loop_name: def.name.clone(),
        commands: LoopCommands {
            build: loop_type.build.clone(),
            test: loop_type.test.clone(),
            validate: def
                .validation
                .clone()
                .or_else(|| loop_type.validation.clone()),
        },
        success_code: loop_type.success_code,
    }
}

/// The job integrating `branch`, the work of `members` (one loop, or every member of a
/// shared-worktree group, the first one's target and base used), handed back to
/// `hand_back_to` when it does not merge or pass.
pub fn job_for(
    members: &[&LoopDef],
    types: &BTreeMap<String, LoopType>,
    config: &Config,
    run_id: &str,
    default_base: &str,
    branch: &str,
    hand_back_to: Option<Worktree>,
) -> Option<Job> {
    let first = members.first()?;
    Some(Job {
        members: members.iter().map(|d| d.name.clone()).collect(),
        branch: branch.to_string(),
        target: target_of(run_id, first, config, default_base),
        target_start: target_start(first, default_base),
        validations: members
            .iter()
            .filter_map(|d| types.get(&d.loop_type).map(|t| validation_of(d, t)))
            .collect(),
        hand_back_to,
        run_id: run_id.to_string(),
    })
}

/// One validation to run on the merged tree.
#[derive(Debug, Clone)]
pub struct Validation {
    /// The loop whose validation it is.
    pub loop_name: String,
    /// Its commands (`validate` is the one run).
    pub commands: LoopCommands,
    /// The exit code that passes.
    pub success_code: i32,
}

/// What runs validations in a scratch worktree: the loops' catalog, sandbox and web access,
/// and the runtime's tool lanes.
#[derive(Clone)]
pub struct Validator {
    /// Tool routes and limits (the `validate` tool's lane: heavy).
    pub catalog: Arc<td_toolkit::catalog::Catalog>,
    /// How commands are confined (the loops' settings).
    pub sandbox: Arc<td_confine::SandboxSettings>,
    /// What the loops' web tools may reach.
    pub web_access: td_toolkit::web_access::WebAccess,
    /// Where lane calls run.
    pub lanes: Arc<dyn LaneRunner>,
}

/// A merged validation that did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    /// The loop whose validation it was.
    pub loop_name: String,
    /// The command.
    pub command: String,
    /// Its exit code (`None`: killed, timed out, did not run).
    pub exit: Option<i32>,
    /// Its output (head and tail).
    pub output: String,
}

impl Validator {
    /// Runs `v`'s validation in `dir` as the engine does (the `validate` tool through the
    /// lanes, confined); `None` when it passed or there is none.
    pub async fn run(&self, dir: &Path, v: &Validation) -> Option<Failed> {
        let command = v.commands.validate.clone()?;
        let failed = |exit, output: String| {
            Some(Failed {
                loop_name: v.loop_name.clone(),
                command: command.clone(),
                exit,
                output,
            })
        };
        let ctx = match ToolContext::new(dir, &v.loop_name) {
            Ok(ctx) => ctx
                .with_catalog(self.catalog.clone())
                .with_sandbox_settings(self.sandbox.clone())
                .with_web_access(self.web_access.clone())
                .with_commands(v.commands.clone()),
            Err(e) => return failed(None, format!("the validation could not run: {e}")),
        };
        let tools = match td_tools::tool_set(&["validate"]) {
            Ok(t) => t,
            Err(e) => return failed(None, format!("the validation could not run: {e}")),
        };
        // No receipts: the loop's receipt log closed when it completed; the run's events
        // record the outcome (`loop_merged` or `merge_handed_back` with the output).
        let path = CallPath::new(Arc::new(ctx), Arc::new(tools), self.lanes.clone(), None);
        let outcome = path.call(None, "validate", json!({})).await.outcome;
        let exit = outcome.receipt.side_effects.iter().find_map(|e| match e {
            SideEffect::CommandRun { exit_code, .. } => *exit_code,
            _ => None,
        });
        if exit == Some(v.success_code) {
            return None;
        }
        failed(exit, head_tail(&outcome.content, MAX_VALIDATION_OUTPUT))
    }
}

/// One integration: a loop's (or a shared worktree group's) branch into its target.
#[derive(Debug, Clone)]
pub struct Job {
    /// The loops whose work it is (one; every member of a shared-worktree group).
    pub members: Vec<String>,
    /// The branch to integrate.
    pub branch: String,
    /// The integration target.
    pub target: String,
    /// Where the target starts when it does not exist yet.
    pub target_start: String,
    /// Validations to run on the merged tree, in order.
    pub validations: Vec<Validation>,
    /// The worktree the branch is checked out in: where a hand back merges the target.
    /// `None`: nothing is handed back (a conflict blocks).
    pub hand_back_to: Option<Worktree>,
    /// The run id, for the commands a blocked loop is told to run.
    pub run_id: String,
}

impl Job {
    /// The loops as one name (`a` or `a, b`).
    pub fn who(&self) -> String {
        self.members.join(", ")
    }
}

/// Why a job's work did not land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trouble {
    /// The branch conflicts with the target's head.
    Conflict {
        /// The conflicting files, with both sides' changes.
        files: Vec<ConflictFile>,
    },
    /// The branch holds files with conflict markers (a hand back not resolved).
    Markers {
        /// The files.
        files: Vec<String>,
    },
    /// The merged tree failed a validation.
    Validation(Failed),
}

impl Trouble {
    /// The files it is about.
    pub fn files(&self) -> Vec<String> {
        match self {
            Trouble::Conflict { files } => files.iter().map(|f| f.path.clone()).collect(),
            Trouble::Markers { files } => files.clone(),
            Trouble::Validation(_) => Vec::new(),
        }
    }

    /// One line for the record and the status table.
    pub fn reason(&self, target: &str) -> String {
        match self {
            Trouble::Conflict { files } => format!(
                "merging into `{target}` conflicts in: {}",
                files
                    .iter()
                    .map(|f| f.path.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Trouble::Markers { files } => format!(
                "conflict markers are still in: {} (not merged into `{target}`)",
                files.join(", ")
            ),
            Trouble::Validation(f) => format!(
                "the validation of `{}` fails on the work merged with `{target}` ({}, exit code {})",
                f.loop_name,
                f.command,
                f.exit.map_or("none".to_string(), |c| c.to_string())
            ),
        }
    }

    /// What the loop is told in its next iteration: what happened, the details, what to do.
    pub fn message(&self, target: &str, merge: &HandBackMerge) -> String {
        let mut text = format!(
            "Your completed work could not be integrated into `{target}`: {}.\n",
            self.reason(target)
        );
        match self {
            Trouble::Conflict { files } => {
                text.push_str(
                    "The latest work of `",
                );
                text.push_str(target);
                text.push_str("` has been merged into your worktree, and these files now hold conflict markers (<<<<<<< ours / ======= / >>>>>>> theirs). For each: keep both sides' intent, remove every marker, make your validation pass, then complete the task again.\n");
                for f in files {
                    text.push_str(&format!("\n## {}\n", f.path));
                    if !f.target_side.is_empty() {
                        text.push_str(&format!(
                            "What `{target}` changed (since the common ancestor):\n{}\n",
                            f.target_side
                        ));
                    }
                    if !f.loop_side.is_empty() {
                        text.push_str(&format!(
                            "What you changed (since the common ancestor):\n{}\n",
                            f.loop_side
                        ));
                    }
                }
            }
            Trouble::Markers { files } => text.push_str(&format!(
                "Remove the conflict markers from {} (keep both sides' intent), make your validation pass, then complete the task again.\n",
                files.join(", ")
            )),
            Trouble::Validation(f) => {
                text.push_str(&format!(
                    "The latest work of `{target}` has been merged into your worktree{}. Run `{}` and fix what fails with both changes together, then complete the task again.\nOutput:\n{}\n",
                    match merge {
                        HandBackMerge::Committed { .. } => " and committed",
                        _ => "",
                    },
                    f.command,
                    f.output
                ));
            }
        }
        text
    }
}

/// How a job ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The target now holds the work.
    Landed {
        /// The job.
        job: Job,
        /// The target's new head.
        commit: String,
    },
    /// The work went back to the loop's worktree, with the target's head merged in.
    HandedBack {
        /// The job.
        job: Job,
        /// What went wrong.
        trouble: Trouble,
        /// How the target's head was merged into the loop's worktree.
        merge: HandBackMerge,
    },
    /// Nothing landed and nothing was handed back.
    Blocked {
        /// The job.
        job: Job,
        /// Why, and what to do.
        reason: String,
        /// What went wrong, when it was the work itself.
        trouble: Option<Trouble>,
    },
}

impl Outcome {
    /// The loops whose work it was.
    pub fn members(&self) -> &[String] {
        match self {
            Outcome::Landed { job, .. }
            | Outcome::HandedBack { job, .. }
            | Outcome::Blocked { job, .. } => &job.members,
        }
    }
}

/// Integrates one job: scratch merge, merged validation, advance (see the module doc).
pub async fn integrate(
    repo: &Repo,
    scratch_root: &Path,
    validator: &Validator,
    job: Job,
) -> Outcome {
    let blocked = |job: Job, reason: String| Outcome::Blocked {
        job,
        reason,
        trouble: None,
    };
    let scratch_dir = scratch_root.join(job.members.first().map_or("loop", String::as_str));
    for _ in 0..MAX_RACES {
        let head = match repo.ensure_branch(&job.target, &job.target_start).await {
            Ok(h) => h,
            Err(e) => return blocked(job, format!("cannot prepare the integration target: {e}")),
        };
        let scratch = match repo.scratch(&scratch_dir, &head).await {
            Ok(s) => s,
            Err(e) => return blocked(job, format!("cannot make the scratch worktree: {e}")),
        };
        let message = format!(
            "taskdaemon: integrate {} ({}) into {}",
            job.who(),
            job.branch,
            job.target
        );
        let merged = scratch.merge(&job.branch, &message).await;
        let trouble = match merged {
            Err(e) => {
                let _ = scratch.remove().await;
                return blocked(job, format!("the merge could not run: {e}"));
            }
            Ok(ScratchMerge::Refused { reason }) => {
                let _ = scratch.remove().await;
                return blocked(job, format!("git refused the merge: {reason}"));
            }
            Ok(ScratchMerge::Conflict { files }) => Some(Trouble::Conflict { files }),
            Ok(ScratchMerge::Merged { commit }) => {
                match checked(repo, validator, &scratch, &head, &commit, &job).await {
                    Ok(None) => {
                        let _ = scratch.remove().await;
                        match repo.advance_branch(&job.target, &commit, &head).await {
                            Ok(Advance::Advanced) => return Outcome::Landed { job, commit },
                            Ok(Advance::Moved) => continue,
                            Ok(Advance::Blocked { reason }) => {
                                let run = job.run_id.clone();
                                let loops = job.members.join(" ");
                                return blocked(
                                    job,
                                    format!(
                                        "{reason}; the merged work passed and waits: commit or stash there, then run `taskdaemon merge {run} {loops}`"
                                    ),
                                );
                            }
                            Err(e) => return blocked(job, format!("cannot advance: {e}")),
                        }
                    }
                    Ok(Some(t)) => Some(t),
                    Err(e) => {
                        let _ = scratch.remove().await;
                        return blocked(job, e);
                    }
                }
            }
        };
        let _ = scratch.remove().await;
        let Some(trouble) = trouble else { continue };
        return hand_back(job, trouble, &head).await;
    }
    blocked(
        job,
        format!(
            "the integration target kept moving during {MAX_RACES} merges; run `taskdaemon merge` again"
        ),
    )
}

/// Conflict markers, then each validation, on the merged tree in `scratch`.
async fn checked(
    repo: &Repo,
    validator: &Validator,
    scratch: &td_git::integrate::Scratch,
    head: &str,
    commit: &str,
    job: &Job,
) -> Result<Option<Trouble>, String> {
    let marked = repo
        .conflict_markers(head, commit)
        .await
        .map_err(|e| format!("cannot check the merged work for conflict markers: {e}"))?;
    if !marked.is_empty() {
        return Ok(Some(Trouble::Markers { files: marked }));
    }
    for v in &job.validations {
        if let Some(f) = validator.run(scratch.path(), v).await {
            return Ok(Some(Trouble::Validation(f)));
        }
    }
    Ok(None)
}

/// Gives `trouble` back to the job's worktree (the target's head `head` merged into it), or
/// blocks when there is no worktree to give it to.
async fn hand_back(job: Job, trouble: Trouble, head: &str) -> Outcome {
    let Some(wt) = job.hand_back_to.clone() else {
        let reason = trouble.reason(&job.target);
        return Outcome::Blocked {
            job,
            reason,
            trouble: Some(trouble),
        };
    };
    let message = format!(
        "taskdaemon: merge {} into {} to resolve: {}",
        job.target,
        job.who(),
        trouble.reason(&job.target)
    );
    match wt.merge_from(head, &message).await {
        Ok(HandBackMerge::Refused { reason })
        | Err(td_git::worktree::WorktreeError::Git { stderr: reason, .. }) => {
            let reason = format!(
                "{}; and the target's work could not be merged into its worktree: {reason}",
                trouble.reason(&job.target)
            );
            Outcome::Blocked {
                job,
                reason,
                trouble: Some(trouble),
            }
        }
        Err(e) => Outcome::Blocked {
            reason: format!("{}; and {e}", trouble.reason(&job.target)),
            job,
            trouble: Some(trouble),
        },
        Ok(merge) => Outcome::HandedBack {
            job,
            trouble,
            merge,
        },
    }
}

/// The queue task's handles: jobs in, outcomes out.
pub struct MergeQueue {
    jobs: mpsc::UnboundedSender<Job>,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
    pending: usize,
    task: tokio::task::JoinHandle<()>,
}

impl MergeQueue {
    /// Starts the queue task for `repo`; scratch worktrees go under `scratch_root`.
    pub fn start(repo: Repo, scratch_root: PathBuf, validator: Validator) -> MergeQueue {
        let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
        let (tx, outcomes) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(job) = rx.recv().await {
                let outcome = integrate(&repo, &scratch_root, &validator, job).await;
                if tx.send(outcome).is_err() {
                    return;
                }
            }
        });
        MergeQueue {
            jobs,
            outcomes,
            pending: 0,
            task,
        }
    }

    /// Queues a job (behind the ones queued before).
    pub fn push(&mut self, job: Job) {
        if self.jobs.send(job).is_ok() {
            self.pending = self.pending.saturating_add(1);
        }
    }

    /// Whether a job is queued or being integrated.
    pub fn busy(&self) -> bool {
        self.pending > 0
    }

    /// The next outcome (pending forever when the queue is idle: use with [`Self::busy`]).
    pub async fn next(&mut self) -> Option<Outcome> {
        let outcome = self.outcomes.recv().await;
        if outcome.is_some() {
            self.pending = self.pending.saturating_sub(1);
        }
        outcome
    }

    /// Stops at once (a second Ctrl-C): a job being integrated is dropped; its loop stays
    /// completed and not integrated, and a resume queues it again. (Git commands already
    /// started finish on their own; the scratch worktree is removed by the next attempt.)
    pub fn abort(&mut self) {
        self.task.abort();
        self.pending = 0;
    }
}

/// What the run keeps about integration while it goes: where each loop's work landed, and
/// how many times each loop's work was handed back.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Loops whose work landed.
    pub landed: BTreeMap<String, Landed>,
    /// Hand backs so far, per loop.
    pub attempts: BTreeMap<String, u32>,
}

impl Ledger {
    /// What a (resumed) run's summary says.
    pub fn from_summary(summary: &crate::run::record::RunSummary) -> Ledger {
        Ledger {
            landed: crate::run::handover::landed_from(summary),
            attempts: summary
                .loops
                .iter()
                .filter_map(|(n, l)| Some((n.clone(), l.merge.as_ref()?.attempts)))
                .collect(),
        }
    }

    /// Whether the work of `members` (one loop, or a shared-worktree group) may be handed
    /// back once more: each of them has hand backs left.
    pub fn may_hand_back(&self, config: &Config, members: &[&LoopDef]) -> bool {
        members
            .iter()
            .all(|d| self.attempts.get(&d.name).copied().unwrap_or(0) < merge_attempts(config, d))
    }
}

/// What the run does after an outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    /// Nothing more (landed, or blocked).
    Done,
    /// Run these loops again at their next iteration (their work was handed back).
    Restart(Vec<String>),
}

/// Records an outcome of the queue (events, summary, progress) and says what follows.
pub fn record_outcome(
    outcome: Outcome,
    ledger: &mut Ledger,
    status: &mut BTreeMap<String, LoopStatus>,
    record: &RunRecord,
    progress: &ProgressDisplay,
    events: &EventLog,
) -> After {
    match outcome {
        Outcome::Landed { job, commit } => {
            for name in &job.members {
                ledger.landed.insert(
                    name.clone(),
                    Landed {
                        into: job.target.clone(),
                        commit: commit.clone(),
                    },
                );
                events.record(EventKind::LoopMerged {
                    loop_name: name.clone(),
                    into: job.target.clone(),
                    commit: commit.clone(),
                });
                progress.set_status(name, "completed", &format!("merged into {}", job.target));
            }
            After::Done
        }
        Outcome::Blocked {
            job,
            reason,
            trouble,
        } => {
            let reason = match (&trouble, job.hand_back_to.is_none()) {
                (Some(_), true) => {
                    let n = job
                        .members
                        .iter()
                        .map(|m| ledger.attempts.get(m).copied().unwrap_or(0))
                        .max()
                        .unwrap_or(0);
                    format!(
                        "{reason} (after {n} hand backs, the limit: raise `merge-attempts` or merge by hand; the work stays on branch {})",
                        job.branch
                    )
                }
                _ => reason,
            };
            for name in &job.members {
                block(
                    name, &job, &reason, ledger, status, record, progress, events,
                );
            }
            After::Done
        }
        Outcome::HandedBack {
            job,
            trouble,
            merge,
        } => {
            let message = trouble.message(&job.target, &merge);
            let reason = trouble.reason(&job.target);
            // A group's failing validation goes back to the member whose validation it is;
            // a conflict (or markers) to every member.
            let restart: Vec<String> = match &trouble {
                Trouble::Validation(f) if job.members.contains(&f.loop_name) => {
                    vec![f.loop_name.clone()]
                }
                _ => job.members.clone(),
            };
            for name in &restart {
                let attempt = ledger
                    .attempts
                    .get(name)
                    .copied()
                    .unwrap_or(0)
                    .saturating_add(1);
                ledger.attempts.insert(name.clone(), attempt);
                events.record(EventKind::MergeHandedBack {
                    loop_name: name.clone(),
                    into: job.target.clone(),
                    attempt,
                    reason: reason.clone(),
                    files: trouble.files(),
                });
                // In the record, so that a resumed run shows it too (see `resume`).
                events.record(EventKind::Alert {
                    from: td_runtime::coordinator::SYSTEM_SENDER.to_string(),
                    event_type: "merge_handed_back".to_string(),
                    message: message.clone(),
                    data: Some(json!({
                        "into": job.target,
                        "attempt": attempt,
                        "files": trouble.files(),
                    })),
                    recipients: vec![name.clone()],
                    error: None,
                    // Not delivered by the coordinator: shown by count (see `resume`).
                    deliveries: Default::default(),
                });
                progress.set_status(name, "running", &format!("handed back: {reason}"));
                status.insert(name.clone(), LoopStatus::Running);
            }
            After::Restart(restart)
        }
    }
}

/// Marks `name` blocked by its integration.
#[allow(clippy::too_many_arguments)]
fn block(
    name: &str,
    job: &Job,
    reason: &str,
    ledger: &Ledger,
    status: &mut BTreeMap<String, LoopStatus>,
    record: &RunRecord,
    progress: &ProgressDisplay,
    events: &EventLog,
) {
    status.insert(name.to_string(), LoopStatus::Blocked);
    let attempts = ledger.attempts.get(name).copied().unwrap_or(0);
    let _ = record.update_loop(name, |s| {
        s.status = LoopStatus::Blocked;
        s.reason = Some(reason.to_string());
        s.merge = Some(MergeSummary::not_merged(&job.target, reason, attempts));
    });
    events.record(EventKind::LoopBlocked {
        loop_name: name.to_string(),
        reason: reason.to_string(),
    });
    progress.set_status(name, "blocked", reason);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(yaml: &str) -> LoopDef {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn targets_follow_merge_and_base() {
        let config = Config::default();
        let plain = def("{name: a, type: code, task: t}");
        assert_eq!(
            target_of("r1", &plain, &config, "main"),
            "taskdaemon/r1/integration"
        );
        let same = def("{name: a, type: code, task: t, base: main}");
        assert_eq!(
            target_of("r1", &same, &config, "main"),
            "taskdaemon/r1/integration"
        );
        let other = def("{name: a, type: code, task: t, base: 'release/1 x'}");
        assert_eq!(
            target_of("r1", &other, &config, "main"),
            "taskdaemon/r1/integration-release-1-x"
        );
        let merged = def("{name: a, type: code, task: t, base: dev, merge: true}");
        assert_eq!(target_of("r1", &merged, &config, "main"), "dev");
        let run_merges = Config {
            merge: true,
            ..Config::default()
        };
        assert_eq!(target_of("r1", &plain, &run_merges, "main"), "main");
        assert_eq!(merge_attempts(&config, &plain), DEFAULT_MERGE_ATTEMPTS);
        let once = Config {
            merge_attempts: Some(1),
            ..Config::default()
        };
        assert_eq!(merge_attempts(&once, &plain), 1);
        let own = def("{name: a, type: code, task: t, merge-attempts: 0}");
        assert_eq!(merge_attempts(&once, &own), 0);
    }
}
