//! `taskdaemon merge RUN [LOOP…]`: integrates completed (or merge-blocked) loops of a run
//! by hand, in config order, through the merge queue's own code ([`merge_queue::integrate`]:
//! scratch worktree, merged validation confined in the heavy lane, guarded advance). No
//! model is called: a conflict or a failing validation is reported and the loop stays
//! blocked, with what to do. The run's owner lock is taken first, so this never runs beside
//! a live run; what happens is appended to the run's events.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Config;
use crate::run::merge_queue::{self, Outcome, Trouble, Validator};
use crate::run::owner;
use crate::run::record::{LoopStatus, MergeSummary, RunRecord};
use td_git::worktree::Repo;
use td_protocol::events::{EventKind, EventLog};
use td_runtime::daemon::{Runtime, RuntimeConfig};

/// What `taskdaemon merge` was asked.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// The run id (or a run directory).
    pub run: String,
    /// Only these loops (default: every loop that is completed or blocked by its merge and
    /// whose work has not landed).
    pub loops: Vec<String>,
    /// Where the runs are (as for `status`).
    pub dir: PathBuf,
    /// The run's config, when the one its record names cannot be found.
    pub config: Option<PathBuf>,
}

/// The report and the exit code: 0 when every loop asked for is integrated, 1 otherwise,
/// [`owner::HELD_EXIT_CODE`] when a live process owns the run, 2 for a usage error.
pub async fn merge_command(options: MergeOptions) -> (String, u8) {
    match merge(options).await {
        Ok(r) => r,
        Err((why, code)) => (format!("taskdaemon: {why}\n"), code),
    }
}

async fn merge(options: MergeOptions) -> Result<(String, u8), (String, u8)> {
    let usage = |e: String| (e, 2u8);
    // `--dir` may be the run's own directory (a run made with `--run-dir`), named anyhow.
    let own_dir =
        crate::run::rebuild::load_summary(&options.dir).is_ok_and(|(s, _)| s.run_id == options.run);
    let run_dir = if own_dir {
        options.dir.clone()
    } else {
        crate::run::status::resolve_run_dir(&options.dir, Some(&options.run)).map_err(usage)?
    };
    let _lock = owner::take(&run_dir).map_err(|e| match e {
        owner::TakeError::Held(holder) => (
            owner::held_message(&run_dir, holder.as_ref()),
            owner::HELD_EXIT_CODE,
        ),
        owner::TakeError::Io(why) => (why, 2),
    })?;
    let restored = crate::run::resume::restore(&run_dir).map_err(usage)?;
    let config_path = options
        .config
        .clone()
        .or_else(|| restored.config.clone().map(PathBuf::from))
        .ok_or_else(|| usage("the run's record names no config; give it with --config".into()))?;
    let config_path = if config_path.is_relative() && !config_path.exists() {
        options.dir.join(&config_path)
    } else {
        config_path
    };
    let config = Config::load(&config_path).map_err(|e| {
        usage(format!(
            "{e}; give the run's config with --config if it moved"
        ))
    })?;
    let base_dir = config_path
        .canonicalize()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    let types = config.loop_types().map_err(usage)?;
    let repo_dir = if config.copy_repo {
        run_dir.join("repo")
    } else {
        base_dir.join(config.repo.clone().unwrap_or_else(|| PathBuf::from(".")))
    };
    let repo = Repo::open(&repo_dir)
        .await
        .map_err(|e| usage(e.to_string()))?;
    let default_base = repo
        .head_branch()
        .await
        .map_err(|e| usage(e.to_string()))?
        .unwrap_or_else(|| "HEAD".to_string());
    let summary = restored.summary.clone();
    let run_id = restored.run_id.clone();

    // The loops to integrate, in config order.
    let unknown: Vec<&String> = options
        .loops
        .iter()
        .filter(|n| !config.loops.iter().any(|d| &d.name == *n))
        .collect();
    if !unknown.is_empty() {
        return Err(usage(format!(
            "no loop {} in {}",
            unknown
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", "),
            config_path.display()
        )));
    }
    let wanted: Vec<&crate::config::LoopDef> = config
        .loops
        .iter()
        .filter(|d| options.loops.is_empty() || options.loops.contains(&d.name))
        .collect();

    let record = Arc::new(RunRecord::reopen(&run_dir, summary.clone()).map_err(usage)?);
    let events =
        Arc::new(EventLog::continuing_after(restored.last_seq).map_err(|e| usage(e.to_string()))?);
    events.subscribe(record.events_listener());
    let rt = Runtime::start(
        RuntimeConfig {
            lanes: config.lanes,
            limits: config.limits,
            watch_files: false,
            upstream: None,
        },
        events.clone(),
    )
    .await
    .map_err(|e| usage(e.to_string()))?;
    let sandbox = Arc::new(
        config
            .sandbox_settings(&base_dir)
            .protecting(&run_dir)
            .protecting(&base_dir.join(".taskdaemon")),
    );
    let sandbox = crate::run::orchestrator::hide_chain_key(&record, &sandbox).map_err(usage)?;
    let validator = Validator {
        catalog: Arc::new(config.catalog().map_err(usage)?),
        sandbox,
        web_access: config.web_access().map_err(usage)?,
        lanes: Arc::new(rt.lanes.clone()),
    };

    let mut text = String::new();
    let mut all_in = true;
    for def in wanted {
        let name = &def.name;
        let Some(entry) = summary.loops.get(name) else {
            text.push_str(&format!("{name}: not in this run\n"));
            all_in = false;
            continue;
        };
        if entry.merge.as_ref().is_some_and(|m| m.merged) {
            text.push_str(&format!(
                "{name}: already merged into {}\n",
                entry
                    .merge
                    .as_ref()
                    .and_then(|m| m.into.clone())
                    .unwrap_or_default()
            ));
            continue;
        }
        let blocked_by_merge = entry.status == LoopStatus::Blocked && entry.merge.is_some();
        if entry.status != LoopStatus::Completed && !blocked_by_merge {
            if !options.loops.is_empty() {
                text.push_str(&format!(
                    "{name}: {} — only a completed loop (or one blocked by its merge) can be merged; `taskdaemon run --resume {run_id}` goes on with it\n",
                    entry.status.as_str()
                ));
                all_in = false;
            }
            continue;
        }
        if !merge_queue::integrates(def) {
            text.push_str(&format!(
                "{name}: works in the repository itself (worktree: repo); nothing to merge\n"
            ));
            continue;
        }
        let Some(branch) = entry.branch.clone() else {
            text.push_str(&format!("{name}: has no branch in the record\n"));
            all_in = false;
            continue;
        };
        let members = [def];
        let Some(mut job) = merge_queue::job_for(
            &members,
            &types,
            &config,
            &run_id,
            &default_base,
            &branch,
            None,
        ) else {
            continue;
        };
        // The target the run chose (the user's HEAD may have changed since).
        if let Some(into) = entry.merge.as_ref().and_then(|m| m.into.clone()) {
            job.target = into;
        }
        let outcome =
            merge_queue::integrate(&repo, &run_dir.join("scratch"), &validator, job).await;
        match outcome {
            Outcome::Landed { job, commit } => {
                let _ = record.update_loop(name, |s| {
                    s.status = LoopStatus::Completed;
                    s.reason = None;
                });
                events.record(EventKind::LoopMerged {
                    loop_name: name.clone(),
                    into: job.target.clone(),
                    commit: commit.clone(),
                });
                text.push_str(&format!("{name}: merged into {} as {commit}\n", job.target));
            }
            Outcome::Blocked {
                job,
                reason,
                trouble,
            } => {
                all_in = false;
                let attempts = entry.merge.as_ref().map_or(0, |m| m.attempts);
                let _ = record.update_loop(name, |s| {
                    s.status = LoopStatus::Blocked;
                    s.reason = Some(reason.clone());
                    s.merge = Some(MergeSummary::not_merged(&job.target, &reason, attempts));
                });
                events.record(EventKind::LoopBlocked {
                    loop_name: name.clone(),
                    reason: reason.clone(),
                });
                text.push_str(&format!("{name}: not merged: {reason}\n"));
                text.push_str(&details(&job, trouble.as_ref()));
            }
            Outcome::HandedBack { .. } => {
                // Never: no job here has a worktree to hand back to.
                all_in = false;
            }
        }
    }
    let _ = record.finish(record.summary().status_from_loops());
    rt.shutdown().await;
    if let Some(why) = record.unwritable() {
        text.push_str(&format!("the run record could not be written: {why}\n"));
        all_in = false;
    }
    Ok((text, if all_in { 0 } else { 1 }))
}

/// What a blocked loop's user reads: the files and both sides, or the validation output,
/// and what to do.
fn details(job: &merge_queue::Job, trouble: Option<&Trouble>) -> String {
    let mut text = String::new();
    match trouble {
        Some(Trouble::Conflict { files }) => {
            for f in files {
                text.push_str(&format!("  conflict in {}\n", f.path));
            }
            text.push_str(&format!(
                "  to resolve: `git checkout {}`, `git merge {}`, fix the files, commit, then run this command again\n",
                job.branch, job.target
            ));
        }
        Some(Trouble::Markers { files }) => text.push_str(&format!(
            "  remove the conflict markers from {} on branch {}, commit, then run this command again\n",
            files.join(", "),
            job.branch
        )),
        Some(Trouble::Validation(f)) => {
            text.push_str(&format!(
                "  validation `{}` exit code {}:\n",
                f.command,
                f.exit.map_or("none".to_string(), |c| c.to_string())
            ));
            for line in f.output.lines() {
                text.push_str(&format!("    {line}\n"));
            }
            text.push_str(&format!(
                "  fix it on branch {} (with {} merged in), commit, then run this command again\n",
                job.branch, job.target
            ));
        }
        None => {}
    }
    text
}
