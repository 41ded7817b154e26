//! `taskdaemon run`: loads `taskdaemon.yml`, prepares a worktree per loop, starts the loops
//! as their dependencies complete (at most `max-loops` at once), commits and optionally
//! merges each loop's work when it ends, records everything under the run directory, and
//! stops cleanly on Ctrl-C or SIGTERM (see `run/signals.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::config::loops::Handover;
use crate::config::{Config, ConflictWarnings, LoopDef, LoopType, WorktreeMode};
use crate::run::compiler_cache::CompilerCaches;
use crate::run::conflict_watch::ConflictWatch;
use crate::run::control::{Command, ControlRequest, ControlSocket};
use crate::run::handover;
use crate::run::hosts::HeadHosts;
use crate::run::hosts::moves::Back;
use crate::run::hosts::placement::{self, Free, Site};
use crate::run::hosts::remote::{self, HeadSide, Placed, RemoteLoops};
use crate::run::merge_queue::{self, After, Ledger, MergeQueue, Validator};
use crate::run::owner;
use crate::run::progress::{ProgressDisplay, ProgressMode};
use crate::run::record::{
    LoopStatus, RunMeta, RunRecord, RunStatus, RunSummary, duration_between, new_run_id,
    now_rfc3339,
};
use crate::run::signals::{StopSignal, StopSignals};
use td_engine::budget::{Budgets, Carried};
use td_engine::{EngineConfig, LoopEnd};
use td_git::worktree::{Repo, Worktree};
use td_protocol::events::{EventKind, EventLog};
use td_runtime::daemon::{Runtime, RuntimeConfig};
use td_runtime::loop_actor::LoopSpec;
use td_toolkit::context::LoopCommands;

/// What `taskdaemon run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The config file.
    pub config: PathBuf,
    /// Only these loops (and what they depend on); empty = all.
    pub only: Vec<String>,
    /// Where the run record goes (default `<repo>/.taskdaemon/runs/<run-id>`).
    pub run_dir: Option<PathBuf>,
    /// How progress is shown.
    pub progress: ProgressMode,
    /// Continue this earlier run (its id, or its directory) instead of starting a new one.
    pub resume: Option<String>,
    /// Told the run directory once the record exists and before any loop starts (`run --ui`
    /// starts its dashboard on it then).
    pub record_ready: Option<tokio::sync::mpsc::UnboundedSender<PathBuf>>,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The run id.
    pub run_id: String,
    /// Where its record is.
    pub run_dir: PathBuf,
    /// Final status per loop.
    pub loops: BTreeMap<String, LoopStatus>,
    /// The signal that stopped it (the first one, when several came), if any.
    pub interrupted: Option<StopSignal>,
    /// Why its record could not be written, when a write failed: the loops stopped before
    /// their next call, and the run can be resumed once the disk has room.
    pub record_failure: Option<String>,
    /// The repository the loops' work was integrated in (a `copy-repo` run's copy).
    pub repo: PathBuf,
    /// The branches that received integrated work in this run, sorted.
    pub integrated: Vec<String>,
}

impl RunReport {
    /// 0 when every loop completed, 130 after Ctrl-C (SIGINT), 143 after SIGTERM, 1 otherwise
    /// (also when the record could not be written).
    pub fn exit_code(&self) -> u8 {
        if self.record_failure.is_some() {
            1
        } else if let Some(signal) = self.interrupted {
            signal.exit_code()
        } else if self.loops.values().all(|s| *s == LoopStatus::Completed) {
            0
        } else {
            1
        }
    }
}

/// Returns once a host joined, was lost or left; never without hosts.
async fn hosts_changed(hosts: &Option<HeadHosts>) {
    match hosts {
        Some(h) => h.changed().await,
        None => std::future::pending().await,
    }
}

/// Notes that loop `name` waits (`why`), once per reason: in its record and the progress
/// display (`status` shows it).
fn note_waiting(
    name: &str,
    why: String,
    waiting: &mut BTreeMap<String, String>,
    record: &RunRecord,
    progress: &ProgressDisplay,
) {
    if waiting.get(name) == Some(&why) {
        return;
    }
    let _ = record.update_loop(name, |s| s.reason = Some(why.clone()));
    progress.set_status(name, "pending", &why);
    waiting.insert(name.to_string(), why);
}

/// Where one loop works.
struct Place {
    dir: PathBuf,
    /// The git worktree, when the loop has one (own or shared); `None` for `repo` mode.
    worktree: Option<Arc<Worktree>>,
    base: String,
    /// How its worktree was seeded, when it was made now and `warm:` named something (see
    /// `run::warm`); taken by `start_loop` into a `worktree_seeded` event.
    warm: Option<td_protocol::events::WarmSeed>,
}

/// What a run will do: the config, the directory it lies in, its loop types and the loops
/// picked (see `plan`).
struct RunPlan {
    config: Config,
    base_dir: PathBuf,
    types: BTreeMap<String, LoopType>,
    loops: Vec<LoopDef>,
}

/// Loads the config and picks the loops to run (`only` plus their dependencies).
fn plan(options: &RunOptions) -> Result<RunPlan, String> {
    let config = Config::load(&options.config)?;
    let base_dir = options
        .config
        .canonicalize()
        .map_err(|e| format!("{}: {e}", options.config.display()))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let types = config.loop_types()?;
    if config.loops.is_empty() {
        return Err(format!(
            "{}: no loops to run; add a `loops:` list",
            options.config.display()
        ));
    }
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    if options.only.is_empty() {
        wanted.extend(config.loops.iter().map(|l| l.name.clone()));
    } else {
        let by_name: BTreeMap<&str, &LoopDef> =
            config.loops.iter().map(|l| (l.name.as_str(), l)).collect();
        let mut stack: Vec<String> = options.only.clone();
        while let Some(n) = stack.pop() {
            let Some(def) = by_name.get(n.as_str()) else {
                return Err(format!(
                    "--loop {n}: no such loop in {}; loops: {}",
                    options.config.display(),
                    by_name.keys().copied().collect::<Vec<_>>().join(", ")
                ));
            };
            if wanted.insert(n.clone()) {
                stack.extend(def.depends_on.iter().cloned());
            }
        }
    }
    let loops = config
        .loops
        .iter()
        .filter(|l| wanted.contains(&l.name))
        .cloned()
        .collect();
    Ok(RunPlan {
        config,
        base_dir,
        types,
        loops,
    })
}

/// Why a run did not go: the message for stderr and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunError {
    /// What went wrong and what to do.
    pub message: String,
    /// 2 for a startup error, [`owner::HELD_EXIT_CODE`] when another process holds the run.
    pub exit_code: u8,
}

impl From<String> for RunError {
    fn from(message: String) -> Self {
        RunError {
            message,
            exit_code: 2,
        }
    }
}

/// Takes the run in `dir` for this process: refused when another process holds it.
/// Has the daemon's own git read `.gitattributes` from a commit the user made: the one a
/// resumed run recorded, else the repository's HEAD now (`td_git::attributes::trust`), never
/// what a loop wrote. Returns the commit trusted; `None` (no attributes read, with a warning
/// where there was a commit to trust) when there is none or git cannot use it.
fn trust_attributes(repo: &Repo, resumed: Option<&RunSummary>) -> Option<String> {
    let commit = resumed
        .and_then(|s| s.attributes_from.clone())
        .or_else(|| td_git::head::head_commit(repo.root()))?;
    match td_git::attributes::trust(repo.root(), &commit) {
        Ok(()) => Some(commit),
        Err(e) => {
            eprintln!(
                "taskdaemon: the daemon's git reads no .gitattributes in this run: {}",
                td_base::secrets::redact(&e.to_string())
            );
            None
        }
    }
}

fn take_run(dir: &Path) -> Result<owner::OwnerLock, RunError> {
    owner::take(dir).map_err(|e| match e {
        owner::TakeError::Held(holder) => RunError {
            message: owner::held_message(dir, holder.as_ref()),
            exit_code: owner::HELD_EXIT_CODE,
        },
        owner::TakeError::Io(why) => RunError::from(why),
    })
}

/// Runs the loops of a config to the end and returns the report.
pub async fn run(options: RunOptions) -> Result<RunReport, RunError> {
    let RunPlan {
        config,
        base_dir,
        types,
        loops,
    } = plan(&options)?;
    // Every secret of our environment is redacted from what leaves the process from here on
    // (the provider's key is registered where it is loaded, also when it comes from a file).
    td_base::secrets::register_environment(&[]);
    // Listen for Ctrl-C and SIGTERM from here on: until now either would kill the process
    // with its default action, and from here on that would leave a run record saying
    // "running" forever. The first one that came is what `interrupted` holds.
    let mut signals = StopSignals::install();
    let mut interrupted: Option<StopSignal> = signals.arrived();
    // Everything that can still refuse the config (the model client, the catalog) comes
    // before anything is written, so a startup error leaves no run record behind.
    let in_flight = Arc::new(Semaphore::new(config.concurrency.max_model_calls));
    let llm_config = config.llm.clone().ok_or_else(|| {
        format!(
            "{}: no `llm:` section; for an offline run use `llm: {{provider: scripted, script: script.yml}}`",
            options.config.display()
        )
    })?;
    let llm = td_llm::config::build_client(&llm_config, &base_dir, in_flight)
        .map_err(|e| e.to_string())?;
    let catalog = Arc::new(config.catalog()?);
    let sandbox = Arc::new(config.sandbox_settings(&base_dir));
    let sandbox_report =
        td_confine::SandboxReport::at_start(&sandbox).map_err(|e| e.to_string())?;
    let web_access = config.web_access()?;
    let compiler_caches = CompilerCaches::from_config(&config.compiler_cache, &base_dir)?;
    // Worker hosts (`hosts:`): the secret is read and the address checked now.
    let hosts = crate::run::hosts::prepare(config.hosts.as_ref(), &base_dir)?;
    // The repository too (a copy of it is made in the run directory, so only its source can
    // be checked here).
    let source = base_dir.join(config.repo.clone().unwrap_or_else(|| PathBuf::from(".")));
    let user_repo = if config.copy_repo {
        if !source.is_dir() {
            return Err(format!(
                "repo: {} is not a directory; `repo` (relative to the config file) names the project to copy",
                source.display()
            )
            .into());
        }
        None
    } else {
        Some(Repo::open(&source).await.map_err(|e| e.to_string())?)
    };
    // Held until the run returns: the run is this process's (see `owner`).
    let mut owner_lock: Option<owner::OwnerLock> = None;
    let restored = match &options.resume {
        Some(which) => {
            let dir = match &options.run_dir {
                Some(d) => d.clone(),
                None => crate::run::status::resolve_run_dir(&base_dir, Some(which))?,
            };
            // Before anything of the record is read: a run another process holds goes on
            // there, not here. (A directory that is not there has no run to resume: restore
            // says so.)
            if dir.is_dir() {
                owner_lock = Some(take_run(&dir)?);
            }
            let restored = crate::run::resume::restore(&dir)?;
            for warning in &restored.warnings {
                eprintln!("taskdaemon: resume: {}", td_base::secrets::redact(warning));
            }
            Some((dir, restored))
        }
        None => None,
    };
    let (run_id, run_dir) = match &restored {
        Some((dir, r)) => (r.run_id.clone(), dir.clone()),
        None => {
            let run_id = new_run_id();
            let dir = match &options.run_dir {
                Some(d) => d.clone(),
                None => {
                    let root = base_dir.join(".taskdaemon");
                    std::fs::create_dir_all(&root)
                        .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
                    // Keep run records, worktrees and copies out of the user's `git status`.
                    let ignore = root.join(".gitignore");
                    if !ignore.exists() {
                        let _ = std::fs::write(&ignore, "*\n");
                    }
                    root.join("runs").join(&run_id)
                }
            };
            (run_id, dir)
        }
    };
    std::fs::create_dir_all(&run_dir)
        .map_err(|e| format!("cannot create {}: {e}", run_dir.display()))?;
    if owner_lock.is_none() {
        owner_lock = Some(take_run(&run_dir)?);
    }
    // The record may lie inside a loop's writable area (`worktree: repo` with the config in a
    // subdirectory of the repository, or a `--run-dir` inside it): no loop may change it.
    // With the record in its default place, the whole `.taskdaemon` beside the config is the
    // daemon's (other runs, and a loop must not plant a fake run that `status` would take for
    // the latest); a loop's own worktree inside it stays its own.
    let mut settings = (*sandbox).clone().protecting(&run_dir);
    if options.run_dir.is_none() {
        settings = settings.protecting(&base_dir.join(".taskdaemon"));
    }
    let sandbox = Arc::new(settings);
    let repo = match user_repo {
        Some(repo) => repo,
        None => {
            let copy = run_dir.join("repo");
            // A resumed run goes on in the copy it made the first time.
            let copy = if restored.is_some() && copy.join(".git").exists() {
                copy
            } else {
                td_git::fresh_copy::fresh_copy(&source, &copy)
                    .await
                    .map_err(|e| e.to_string())?
            };
            Repo::open(&copy).await.map_err(|e| e.to_string())?
        }
    };
    let default_base = repo
        .head_branch()
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or_else(|| "HEAD".to_string());
    let record = match &restored {
        Some((_, r)) => RunRecord::reopen(&run_dir, r.summary.clone())?,
        None => RunRecord::create(
            &run_dir,
            &run_id,
            RunMeta {
                config: Some(options.config.display().to_string()),
                loops: loops
                    .iter()
                    .map(|l| (l.name.clone(), l.loop_type.clone()))
                    .collect(),
                sandbox: Some(sandbox_report.clone()),
            },
        )?,
    };
    let record = Arc::new(record);
    // The receipt chain key exists before the first loop starts, and commands see it empty.
    let sandbox = hide_chain_key(&record, &sandbox)?;
    // The control socket (`run/control.rs`): the dashboard's stop buttons. Its key is hidden
    // from commands as the chain key is. A run without it goes on (only Ctrl-C stops it).
    let (control, mut control_rx) = match ControlSocket::open(&run_dir) {
        Ok((socket, rx)) => (Some(socket), Some(rx)),
        Err(why) => {
            eprintln!(
                "taskdaemon: warning: {}; the dashboard cannot stop this run or its loops",
                td_base::secrets::redact(&why)
            );
            (None, None)
        }
    };
    let sandbox = match &control {
        Some(socket) => hide_control_key(socket.key_path(), &sandbox),
        None => sandbox,
    };
    if let Some(ready) = &options.record_ready {
        let _ = ready.send(run_dir.clone());
    }
    let mut resume_state: BTreeMap<String, crate::run::resume::LoopResume> = restored
        .as_ref()
        .map(|(_, r)| r.loops.clone())
        .unwrap_or_default();
    let budgets = run_budgets(&config, restored.as_ref().map(|(_, r)| &r.summary))?;
    let events = Arc::new(match &restored {
        Some((_, r)) => EventLog::continuing_after(r.last_seq).map_err(|e| {
            format!(
                "{}: {e}; this record cannot be continued",
                run_dir.join(crate::run::record::EVENTS_FILE).display()
            )
        })?,
        None => EventLog::new(),
    });
    events.subscribe(record.events_listener());
    let progress = Arc::new(ProgressDisplay::new(
        options.progress,
        &loops
            .iter()
            .map(|l| (l.name.clone(), types[&l.loop_type].max_iterations))
            .collect::<Vec<_>>(),
        record.clone(),
    ));
    {
        let p = progress.clone();
        events.subscribe(move |e| p.on_event(e));
    }
    // Dropped before `progress` on every way out of the run: it writes out the last lines.
    let _progress_background = progress.start_background();
    let attributes_from = trust_attributes(&repo, restored.as_ref().map(|(_, r)| &r.summary));
    if restored.is_none() {
        // The first event says what the run is, so that its summary can be rebuilt from the
        // events alone.
        events.record(EventKind::RunStarted {
            run_id: run_id.clone(),
            config: Some(options.config.display().to_string()),
            loops: loops
                .iter()
                .map(|l| td_protocol::events::PlannedLoop {
                    name: l.name.clone(),
                    loop_type: l.loop_type.clone(),
                })
                .collect(),
            sandbox: Some(sandbox_report.clone()),
            attributes_from: attributes_from.clone(),
        });
    }
    let mut rt = Runtime::start(
        RuntimeConfig {
            lanes: config.lanes,
            limits: config.limits,
            watch_files: true,
            upstream: None,
        },
        events.clone(),
    )
    .await
    .map_err(|e| e.to_string())?;
    // The head listens for hosts while the run goes (`run/hosts`), and serves the loops it
    // places on them (`run/hosts/remote`).
    let (remote, mut remote_ends) = match &hosts {
        Some(hosts) => {
            let (remote, ends) = RemoteLoops::new(HeadSide {
                llm: llm.clone(),
                budgets: budgets.clone(),
                events: events.clone(),
                record: record.clone(),
                transcript: progress.clone(),
                repo: repo.clone(),
                dir: run_dir.join("hosts"),
                coordinator: rt.coordinator.clone(),
                max_record_bytes: hosts.max_record_bytes(),
                attributes_from: attributes_from.clone(),
            });
            (Some(remote), Some(ends))
        }
        None => (None, None),
    };
    let sandbox_policy = match &hosts {
        Some(_) => remote::sandbox_policy(&options.config)?,
        None => serde_json::Value::Null,
    };
    let hosts = match hosts {
        Some(prepared) => Some(
            prepared
                .start(
                    &events,
                    restored.as_ref().map(|(_, r)| &r.summary.hosts),
                    remote.clone(),
                )
                .await?,
        ),
        None => None,
    };

    // Early conflict warnings between running loops (`run/conflict_watch.rs`).
    let conflicts = match config.conflict_warnings {
        ConflictWarnings::On => {
            let notifier = td_runtime::coordinator::Notifier::new(rt.coordinator.clone());
            ConflictWatch::start(repo.root(), &events, notifier).await
        }
        ConflictWarnings::Off => ConflictWatch::off(),
    };

    let names: Vec<String> = loops.iter().map(|l| l.name.clone()).collect();
    // A resumed run keeps the loops that ran to their end (completed, failed, or blocked by
    // their merge); everything else starts (again) from its next iteration.
    let mut status: BTreeMap<String, LoopStatus> = names
        .iter()
        .map(|n| {
            let s = resume_state
                .get(n)
                .and_then(|r| r.finished)
                .unwrap_or(LoopStatus::Pending);
            (n.clone(), s)
        })
        .collect();
    for (name, r) in &resume_state {
        if status.get(name) == Some(&LoopStatus::Pending) {
            llm.resume(name, r.responses);
        }
    }
    let mut places: BTreeMap<String, Place> = BTreeMap::new();
    let mut shared: BTreeMap<String, Arc<Worktree>> = BTreeMap::new();
    // Loops ready to start that wait for a host or a slot, and why (as `status` shows it).
    let mut waiting: BTreeMap<String, String> = BTreeMap::new();
    // Loops taken back from lost hosts, to start again elsewhere (`run/hosts/moves`).
    let mut moves = crate::run::hosts::moves::Moves::default();
    // The loops a user asked to stop, and who: one whose host is lost before it ends is
    // stopped, not moved.
    let mut stops_asked: BTreeMap<String, String> = BTreeMap::new();
    let mut released = false;
    let mut stops_sent = false;
    // After the first stop signal, a second one (of either kind) stops the loops at once
    // instead of after their calls in flight (a long command or model call would otherwise
    // keep the user waiting).
    let mut forced = false;
    // The merge queue (see `merge_queue`): completed loops in, outcomes out, one at a time.
    let scratch_root = run_dir.join("scratch");
    // A killed run's scratch worktrees go (their loops are queued again below).
    if let Err(e) = repo.clear_scratch(&scratch_root).await {
        eprintln!("taskdaemon: {}", td_base::secrets::redact(&e.to_string()));
    }
    let mut queue = MergeQueue::start(
        repo.clone(),
        scratch_root.clone(),
        Validator {
            catalog: catalog.clone(),
            sandbox: sandbox.clone(),
            web_access: web_access.clone(),
            lanes: Arc::new(rt.lanes.clone()),
        },
    );
    let mut ledger = Ledger::from_summary(&record.summary());
    // The run's integration branches exist from its start, so that `git log` finds them
    // (each once, however many loops integrate into it).
    let run_targets: BTreeMap<String, String> = loops
        .iter()
        .filter(|d| merge_queue::integrates(d) && !d.merge.unwrap_or(config.merge))
        .map(|d| {
            (
                merge_queue::target_of(&run_id, d, &config, &default_base),
                merge_queue::target_start(d, &default_base),
            )
        })
        .collect();
    for (target, start) in &run_targets {
        repo.ensure_branch(target, start)
            .await
            .map_err(|e| format!("cannot create the integration branch {target}: {e}"))?;
    }
    // A resumed run queues again the completed loops whose integration never happened (the
    // process died with them in the queue).
    let mut queued_groups: BTreeSet<String> = BTreeSet::new();
    // `queue_after_end` with what stays the same for the whole run.
    let queue_end = |name: &str,
                     places: &BTreeMap<String, Place>,
                     ledger: &Ledger,
                     status: &mut BTreeMap<String, LoopStatus>,
                     queued_groups: &mut BTreeSet<String>,
                     queue: &mut MergeQueue| {
        queue_after_end(
            name,
            &loops,
            &types,
            &config,
            &run_id,
            &default_base,
            places,
            ledger,
            status,
            queued_groups,
            queue,
            &record,
            &progress,
            &events,
        );
    };
    for def in &loops {
        if status[&def.name] == LoopStatus::Completed
            && merge_queue::integrates(def)
            && !ledger.landed.contains_key(&def.name)
        {
            let base = def.base.clone().unwrap_or_else(|| default_base.clone());
            // Only integrated now: no build state to seed.
            match make_place(def, &base, &repo, &run_id, &run_dir, &mut shared, &[]).await {
                Ok(place) => {
                    places.insert(def.name.clone(), place);
                }
                Err(why) => {
                    eprintln!("taskdaemon: resume: {}", td_base::secrets::redact(&why));
                    continue;
                }
            }
            queue_end(
                &def.name,
                &places,
                &ledger,
                &mut status,
                &mut queued_groups,
                &mut queue,
            );
        }
    }

    loop {
        if interrupted.is_none() {
            // A signal during setup, or while the previous loop's end was being handled.
            interrupted = signals.arrived();
        }
        // Once the record cannot be written, no loop starts (the running ones stop before
        // their next call by themselves): the run ends as if interrupted, to be resumed.
        let halted = interrupted.is_some() || record.unwritable().is_some();
        if !halted {
            // After Ctrl-C, loops stopped by it do not block the loops waiting on them: those
            // are stopped too (below), as the user asked.
            block_orphans(&loops, &mut status, &record, &progress, &events);
        }
        // The free slots: the head's (`max-loops` less the loops running on it), and each
        // joined host's (its slots less the loops running there).
        // Loops running on a host, by name: the host's.
        let on_hosts = remote.as_ref().map(|r| r.running()).unwrap_or_default();
        let mut free = Free {
            head: config.concurrency.max_loops.saturating_sub(
                status
                    .iter()
                    .filter(|(n, s)| **s == LoopStatus::Running && !on_hosts.contains_key(*n))
                    .count(),
            ),
            hosts: BTreeMap::new(),
        };
        let joined = match &hosts {
            Some(h) if !halted => h.joined().await,
            _ => BTreeMap::new(),
        };
        for (host, slots) in &joined {
            let busy = on_hosts.values().filter(|h| *h == host).count();
            free.hosts
                .insert(host.clone(), (*slots as usize).saturating_sub(busy));
        }
        for def in &loops {
            if interrupted.is_none() {
                // A signal while the previous loop's worktree was being made.
                interrupted = signals.arrived();
            }
            if interrupted.is_some() || record.unwritable().is_some() {
                break;
            }
            if hosts.is_none() && free.head == 0 {
                break;
            }
            if status[&def.name] != LoopStatus::Pending
                || !handover::ready(
                    def,
                    handover::handover_of(def, &types),
                    &loops,
                    &status,
                    &ledger.landed,
                )
            {
                continue;
            }
            // Where it runs (`run/hosts/placement`), or why it waits.
            let chosen = match &config.hosts {
                None => Ok(Site::Head),
                Some(h) => {
                    let head_only = !matches!(def.worktree, None | Some(WorktreeMode::Own));
                    placement::choose(h.hosts_for(def), head_only, &free, &joined)
                }
            };
            let site = match chosen {
                Ok(site) => site,
                Err(why) => {
                    // A loop taken back from a lost host says so while it waits.
                    let why = match moves.moving(&def.name) {
                        Some(lost) => format!("{why} (moving: {})", lost.reason),
                        None => why,
                    };
                    note_waiting(&def.name, why, &mut waiting, &record, &progress);
                    continue;
                }
            };
            waiting.remove(&def.name);
            let resume = resume_state.get(&def.name);
            if let Some(r) = resume {
                // The delivery numbers its record holds are not given again.
                td_runtime::coordinator_handle::CoordinatorHandle::new(rt.coordinator.clone())
                    .number_after(&def.name, r.last_delivery);
            }
            // A new branch starts where its dependencies' work is (see `handover`).
            let base = def.base.clone().unwrap_or_else(|| default_base.clone());
            let start_at = if resume.is_some() {
                None
            } else if def.depends_on.is_empty()
                || handover::handover_of(def, &types) == Handover::Base
            {
                Some(base)
            } else {
                let target = merge_queue::target_of(&run_id, def, &config, &default_base);
                let start = handover::start_point(
                    &repo,
                    &scratch_root,
                    def,
                    &target,
                    &merge_queue::target_start(def, &default_base),
                    &ledger.landed,
                )
                .await;
                match start {
                    Ok(start) => Some(start),
                    Err(why) => {
                        mark_blocked(&def.name, &why, &mut status, &record, &progress, &events);
                        continue;
                    }
                }
            };
            // A loop taken back from a lost host says where it went: on the head once it
            // starts, on a host once the host accepts it (`RemoteLoops::start`).
            let to = site.host().unwrap_or(td_cluster::protocol::HEAD_NAME);
            let iteration = resume.map_or(1, |r| r.next_iteration);
            let mut moved = moves.started(&def.name, to, iteration);
            let started = match (&site, &remote) {
                (Site::Host(host), Some(remote)) => start_remote(
                    def,
                    resume,
                    start_at.as_deref(),
                    &types[&def.loop_type],
                    &config,
                    &catalog,
                    &names,
                    &repo,
                    &run_id,
                    &run_dir,
                    &default_base,
                    &mut shared,
                    &record,
                    &budgets,
                    host,
                    remote,
                    &sandbox_policy,
                    moved.take(),
                )
                .await
                .map(|place| (None, place)),
                _ => start_loop(
                    def,
                    resume,
                    start_at.as_deref(),
                    &types[&def.loop_type],
                    &config,
                    &names,
                    &repo,
                    &run_id,
                    &run_dir,
                    &default_base,
                    &mut shared,
                    &rt,
                    &llm,
                    &catalog,
                    &sandbox,
                    &web_access,
                    &events,
                    &progress,
                    &record,
                    &budgets,
                    compiler_caches.as_deref(),
                )
                .await
                .map(|(spec, place)| (Some(spec), place)),
            };
            match started {
                Ok((spec, place)) => {
                    if let Some(moved) = moved {
                        events.record(moved);
                    }
                    let _ = record.update_loop(&def.name, |s| {
                        s.host = site.host().map(str::to_string);
                        s.branch = place.worktree.as_ref().map(|w| w.branch().to_string());
                        s.worktree = Some(place.dir.display().to_string());
                        s.started_at = Some(now_rfc3339());
                        s.status = LoopStatus::Running;
                        // Why it stopped or never started in the run a resume continues
                        // ("never started: the run was interrupted") is no longer true.
                        s.reason = None;
                    });
                    conflicts.watch(&def.name, &place.dir);
                    places.insert(def.name.clone(), place);
                    if let Some(spec) = spec {
                        rt.spawn_loop(spec).await.map_err(|e| e.to_string())?;
                    }
                    status.insert(def.name.clone(), LoopStatus::Running);
                    free.take(&site);
                }
                Err(why) => {
                    status.insert(def.name.clone(), LoopStatus::Failed);
                    let _ = record.update_loop(&def.name, |s| {
                        s.status = LoopStatus::Failed;
                        s.reason = Some(why.clone());
                        let now = now_rfc3339();
                        s.started_at.get_or_insert_with(|| now.clone());
                        s.mark_ended(&now);
                    });
                    progress.set_status(&def.name, "failed", &why);
                    close_loop_record(&record, &def.name);
                }
            }
        }
        if interrupted.is_some() && !stops_sent {
            // Before the release, so that loops started just now stop before they begin.
            for (name, s) in &status {
                if *s == LoopStatus::Running {
                    match &remote {
                        Some(r) if r.is_remote(name) => r.stop(name, false),
                        _ => {
                            let _ = rt.stop_loop(name);
                        }
                    }
                }
            }
            stops_sent = true;
        }
        if !released {
            rt.release().await;
            released = true;
        }
        let any_running = status.values().any(|s| *s == LoopStatus::Running);
        // A loop that waited and was stopped or blocked meanwhile waits no more.
        waiting.retain(|n, _| status.get(n) == Some(&LoopStatus::Pending));
        // Loops waiting for a host keep the run going until one comes (or a stop).
        let halted = interrupted.is_some() || record.unwritable().is_some();
        if !any_running && !queue.busy() && (waiting.is_empty() || halted) {
            break;
        }
        let any_local = status.iter().any(|(n, s)| {
            *s == LoopStatus::Running && !remote.as_ref().is_some_and(|r| r.is_remote(n))
        });
        let ended = tokio::select! {
            e = rt.next_end(Duration::from_secs(3600)), if any_local => e,
            e = next_remote_end(&mut remote_ends) => match &e.lost {
                // Its host was lost: it starts again elsewhere when it can (at the top of
                // the loop, placed as a pending loop is), or ends interrupted.
                Some(lost) => {
                    let stopping = interrupted.is_some() || record.unwritable().is_some();
                    let iterations = match &e.end {
                        LoopEnd::Completed { iterations, .. }
                        | LoopEnd::Failed { iterations, .. }
                        | LoopEnd::Paused { iterations, .. }
                        | LoopEnd::Stopped { iterations, .. } => *iterations,
                    };
                    let back = match stops_asked.get(&e.name) {
                        // A user asked it to stop: stopped, not moved.
                        Some(by) => Ok(Back::Ended(LoopEnd::Stopped {
                            iterations,
                            reason: Some(format!(
                                "stopped by the {by}; {} before it ended, so it was not moved (what it did after its last records is not in the run)",
                                lost.reason
                            )),
                        })),
                        None => moves.take_back(&e.name, lost, iterations, &run_dir, stopping).await,
                    };
                    match back {
                        Ok(Back::Moved(resume)) => {
                            conflicts.forget(&e.name);
                            take_back(&e.name, resume, &lost.reason, &llm, &mut resume_state, &mut status, &record, &progress);
                            continue;
                        }
                        // Its end and its work are on the head (or it was asked to stop).
                        Ok(Back::Ended(end)) => {
                            // Announced as a local loop's end is (its host never sent the
                            // `Ended` on which the head announces a remote loop's); not
                            // awaited: the alert settles its remote deliveries by itself.
                            if let Some((event_type, message)) =
                                crate::run::hosts::remote::end_alert(&e.name, &end)
                            {
                                let _ = rt.coordinator.cast(td_runtime::coordinator::CoordMsg::Alert {
                                    from: td_runtime::coordinator::SYSTEM_SENDER.to_string(),
                                    event_type: event_type.to_string(),
                                    message,
                                    data: None,
                                    about: Some(e.name.clone()),
                                    reply: None,
                                });
                            }
                            Some((e.name, end))
                        }
                        Err(why) => {
                            // Interrupted, saying why it was not moved.
                            let mut end = e.end.clone();
                            if let LoopEnd::Stopped { reason, .. } = &mut end {
                                *reason = Some(why);
                            }
                            Some((e.name, end))
                        }
                    }
                }
                None => Some((e.name, e.end)),
            },
            outcome = queue.next(), if queue.busy() => {
                let Some(outcome) = outcome else { continue };
                let members = outcome.members().to_vec();
                let after = merge_queue::record_outcome(
                    outcome, &mut ledger, &mut status, &record, &progress, &events,
                );
                if let After::Restart(names) = after {
                    for name in names {
                        // A group is queued again once its restarted members ended again.
                        if let Some(WorktreeMode::Shared(g)) =
                            loops.iter().find(|l| l.name == name).and_then(|l| l.worktree.clone())
                        {
                            queued_groups.remove(&g);
                        }
                        restart_handed_back(
                            &name,
                            &run_dir,
                            interrupted.is_some(),
                            &rt,
                            &mut resume_state,
                            &mut status,
                            &record,
                            &progress,
                        );
                    }
                }
                // The session receipt says how each loop ended after its integration.
                for name in members {
                    if status.get(&name) != Some(&LoopStatus::Pending) {
                        close_loop_record(&record, &name);
                    }
                }
                continue;
            }
            () = hosts_changed(&hosts), if !waiting.is_empty() => continue,
            signal = signals.next(), if !forced => {
                if interrupted.is_none() {
                    // The stops are sent at the top of the loop.
                    interrupted = Some(signal);
                } else {
                    forced = true;
                    stop_at_once(&mut queue, &rt, &remote, &status);
                }
                continue;
            }
            request = next_control(&mut control_rx) => {
                let ControlRequest { command, by, reply } = request;
                let answer = match command {
                    Command::StopLoop(name) => stop_loop_asked(
                        &name, &by, &rt, &remote, &mut status, &record, &progress, &events,
                        &mut stops_asked,
                    ),
                    Command::StopRun => {
                        events.record(EventKind::StopRequested { loop_name: None, by });
                        // As SIGTERM: the first stops the loops (at the top of the loop),
                        // the next at once.
                        if interrupted.is_none() {
                            interrupted = Some(StopSignal::Terminate);
                        } else if !forced {
                            forced = true;
                            stop_at_once(&mut queue, &rt, &remote, &status);
                        }
                        Ok(())
                    }
                };
                let _ = reply.send(answer);
                continue;
            }
        };
        let Some((name, end)) = ended else {
            continue;
        };
        // A stop asked of it is done with (a loop run again later is stopped again if asked).
        stops_asked.remove(&name);
        conflicts.forget(&name);
        let final_status = finish_loop(&name, &end, &places, &record, &progress).await;
        // Its plans, specs and phases into the record (the worktree goes at the run's end).
        let tools = loops
            .iter()
            .find(|l| l.name == name)
            .and_then(|l| types.get(&l.loop_type))
            .map_or(&[][..], |t| t.tools.as_slice());
        let place = places.get(&name).map(|p| p.dir.as_path());
        let completed = matches!(end, LoopEnd::Completed { .. });
        crate::run::artifacts::keep_at_end(
            &record, &progress, &name, place, tools, completed, &sandbox,
        )
        .await;
        close_loop_record(&record, &name);
        status.insert(name.clone(), final_status);
        // Its compiler cache server goes with it, unless a loop sharing its worktree still
        // runs (a loop that runs again later gets a new one).
        if let (Some(caches), Some(place)) = (&compiler_caches, places.get(&name)) {
            let in_use = places.iter().any(|(other, p)| {
                p.dir == place.dir && status.get(other) == Some(&LoopStatus::Running)
            });
            if !in_use {
                caches.stop_for(&place.dir).await;
            }
        }
        if final_status != LoopStatus::Running && !forced {
            queue_end(
                &name,
                &places,
                &ledger,
                &mut status,
                &mut queued_groups,
                &mut queue,
            );
        }
    }

    // Loops never started (interrupted, halted by the record, or waiting on a loop that did
    // not complete).
    let record_failure = record.unwritable();
    for (name, s) in status.iter_mut() {
        if *s == LoopStatus::Pending {
            *s = if interrupted.is_some() || record_failure.is_some() {
                LoopStatus::Stopped
            } else {
                LoopStatus::Blocked
            };
            let st = *s;
            let why = if interrupted.is_some() {
                "never started: the run was interrupted"
            } else if record_failure.is_some() {
                "never started: the run record could not be written"
            } else {
                "never started"
            };
            // What it was waiting for is no longer what it is.
            let why = match (moves.never_restarted(name), waiting.get(name)) {
                (Some(moving), Some(waited)) => format!("{moving} (it was {waited})"),
                (Some(moving), None) => moving,
                (None, Some(waited)) => format!("{why} (it was {waited})"),
                (None, None) => why.to_string(),
            };
            let _ = record.update_loop(name, |l| {
                l.status = st;
                if waiting.contains_key(name) {
                    l.reason = None;
                }
                l.reason.get_or_insert_with(|| why.clone());
            });
            progress.set_status(name, st.as_str(), &why);
        }
    }
    // Nothing more can be stopped: the socket and its key go.
    drop(control_rx);
    drop(control);
    // Before the worktrees go: no comparison may run in a worktree being removed, no cache
    // server may write into one.
    conflicts.stop().await;
    if let Some(caches) = &compiler_caches {
        caches.stop_all().await;
    }
    rt.flush().await;
    rt.shutdown().await;
    if let Some(hosts) = hosts {
        let why = if interrupted.is_some() {
            "the run was stopped"
        } else {
            "the run ended"
        };
        hosts.shutdown(why).await;
    }
    if !config.keep_worktrees {
        for place in places.values() {
            if let Some(wt) = &place.worktree {
                let _ = repo.remove_worktree(wt, true).await;
            }
        }
        let _ = std::fs::remove_dir(run_dir.join("worktrees"));
        let _ = std::fs::remove_dir(&scratch_root);
    }
    // The loops' last lines before the run's closing messages (stderr), in a merged log too.
    progress.flush();
    let run_status = if interrupted.is_some() || record.unwritable().is_some() {
        RunStatus::Stopped
    } else {
        record.summary().status_from_loops()
    };
    // Loops that never started or were blocked close their record too.
    if let Err(e) = record.close_ended_loops() {
        eprintln!(
            "taskdaemon: cannot write the session receipts: {}",
            td_base::secrets::redact(&e)
        );
    }
    // A final summary that cannot be written is one more write of the record that failed.
    let _ = record.finish(run_status);
    let record_failure = record.unwritable();
    if let Some(why) = &record_failure {
        let dir_arg = match &options.run_dir {
            Some(d) => format!(" --run-dir {}", d.display()),
            None => String::new(),
        };
        eprintln!(
            "taskdaemon: the run record in {} could not be written: {}. Every loop stopped \
             before its next model or tool call, so nothing ran unrecorded after that. Free \
             space (or fix the disk), then continue the run with: taskdaemon run -c {}{dir_arg} \
             --resume {run_id}",
            run_dir.display(),
            td_base::secrets::redact(why),
            options.config.display()
        );
    }
    let paused: Vec<&str> = status
        .iter()
        .filter(|(_, s)| **s == LoopStatus::Paused)
        .map(|(n, _)| n.as_str())
        .collect();
    if !paused.is_empty() && record_failure.is_none() {
        let dir_arg = match &options.run_dir {
            Some(d) => format!(" --run-dir {}", d.display()),
            None => String::new(),
        };
        eprintln!(
            "taskdaemon: paused by a budget, with their work kept: {}. Raise the budget in {}              (see each loop's reason in the table), then continue the run with: taskdaemon              run -c {}{dir_arg} --resume {run_id}",
            paused.join(", "),
            options.config.display(),
            options.config.display()
        );
    }
    // The record is final: another process may take the run now.
    drop(owner_lock);
    let integrated: BTreeSet<String> = record
        .summary()
        .loops
        .values()
        .filter_map(|l| l.merge.as_ref())
        .filter(|m| m.merged)
        .filter_map(|m| m.into.clone())
        .collect();
    Ok(RunReport {
        run_id,
        run_dir,
        loops: status,
        interrupted,
        record_failure,
        repo: repo.root().to_path_buf(),
        integrated: integrated.into_iter().collect(),
    })
}

/// The run's budgets: the `budget:` of the config, calls priced by its model, and what a
/// resumed run (its `summary`) spent, counted and took before.
fn run_budgets(config: &Config, summary: Option<&RunSummary>) -> Result<Arc<Budgets>, String> {
    let carried = match summary {
        Some(s) => Carried {
            spend: s.spend,
            iterations: s
                .loops
                .values()
                .fold(0u64, |n, l| n.saturating_add(u64::from(l.iterations))),
            // The run's wall time runs from its start, a pause included.
            wall: Duration::from_millis(
                duration_between(&s.started_at, &now_rfc3339()).unwrap_or(0),
            ),
        },
        None => Carried::default(),
    };
    Ok(Budgets::new(
        config.budget.limits(),
        config.pricing()?,
        carried,
    ))
}

/// Writes the session receipt of a loop that ended; a failure is said, and the run goes on
/// (`replay verify` then reports the receipt missing).
fn close_loop_record(record: &RunRecord, name: &str) {
    if let Err(e) = record.close_loop(name) {
        eprintln!(
            "taskdaemon: loop {name}: cannot write its session receipt: {}",
            td_base::secrets::redact(&e)
        );
    }
}

/// Makes the run's receipt chain key (before any loop starts) and the sandbox settings that
/// hide it from loops (file tools always; commands where the machine has mount namespaces,
/// with a warning where it has not).
pub(crate) fn hide_chain_key(
    record: &RunRecord,
    sandbox: &Arc<td_confine::SandboxSettings>,
) -> Result<Arc<td_confine::SandboxSettings>, String> {
    let key = record.chain_key()?;
    let real = key
        .path()
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", key.path().display()))?;
    let (settings, hidden) = hiding(sandbox, &real);
    if let Err(why) = hidden {
        eprintln!(
            "taskdaemon: warning: the receipt chain key {why}; a command that reads it could forge the receipts of its loop"
        );
    }
    Ok(settings)
}

/// `sandbox` with `path` hidden from commands, and whether it could be.
fn hiding(
    sandbox: &Arc<td_confine::SandboxSettings>,
    path: &Path,
) -> (
    Arc<td_confine::SandboxSettings>,
    Result<(), td_confine::HideError>,
) {
    let mut settings = (**sandbox).clone();
    let hidden = td_confine::hide_from_commands(&mut settings, path);
    (Arc::new(settings), hidden)
}

/// The second stop of a run (a signal, or the dashboard's run stop): the merge queue's job
/// is dropped and every running loop stops at once, its call in flight killed.
fn stop_at_once(
    queue: &mut MergeQueue,
    rt: &Runtime,
    remote: &Option<Arc<RemoteLoops>>,
    status: &BTreeMap<String, LoopStatus>,
) {
    queue.abort();
    for (name, s) in status {
        if *s == LoopStatus::Running {
            match remote {
                Some(r) if r.is_remote(name) => r.stop(name, true),
                _ => {
                    let _ = rt.kill_loop(name);
                }
            }
        }
    }
}

/// The next end of a loop on a host; never, when the run has no hosts.
async fn next_remote_end(
    ends: &mut Option<tokio::sync::mpsc::UnboundedReceiver<remote::RemoteEnd>>,
) -> remote::RemoteEnd {
    match ends {
        Some(rx) => match rx.recv().await {
            Some(end) => end,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// The next request of the control socket; never, when the run has none.
async fn next_control(
    rx: &mut Option<tokio::sync::mpsc::Receiver<ControlRequest>>,
) -> ControlRequest {
    match rx {
        Some(r) => match r.recv().await {
            Some(request) => request,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Acts on a stop of loop `name` asked through the control socket, after recording the
/// request: a running loop stops now (its call in flight cancelled), a loop that has not
/// started never will (and its dependents are blocked). An ended or unknown loop is refused.
#[allow(clippy::too_many_arguments)]
fn stop_loop_asked(
    name: &str,
    by: &str,
    rt: &Runtime,
    remote: &Option<Arc<RemoteLoops>>,
    status: &mut BTreeMap<String, LoopStatus>,
    record: &RunRecord,
    progress: &ProgressDisplay,
    events: &EventLog,
    stops_asked: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    let Some(current) = status.get(name).copied() else {
        return Err(format!("no loop `{name}` in this run"));
    };
    let stop_event = || EventKind::StopRequested {
        loop_name: Some(name.to_string()),
        by: by.to_string(),
    };
    match current {
        LoopStatus::Running => {
            events.record(stop_event());
            match remote {
                Some(r) if r.is_remote(name) => {
                    stops_asked.insert(name.to_string(), by.to_string());
                    r.stop(name, true);
                    Ok(())
                }
                _ => rt.stop_loop_now(name).map_err(|e| e.to_string()),
            }
        }
        LoopStatus::Pending => {
            events.record(stop_event());
            let why = format!("stopped by the {by} before it started");
            status.insert(name.to_string(), LoopStatus::Stopped);
            let _ = record.update_loop(name, |s| {
                s.status = LoopStatus::Stopped;
                s.reason = Some(why.clone());
            });
            progress.set_status(name, "stopped", &why);
            events.record(EventKind::LoopStopped {
                loop_name: name.to_string(),
            });
            Ok(())
        }
        ended => Err(format!(
            "loop `{name}` is not running: it is {}",
            ended.as_str()
        )),
    }
}

/// Hides the control socket's key from commands, as the chain key is (see
/// [`hide_chain_key`]); where commands cannot be kept from it, says so only when they may
/// reach the socket (`sandbox.unix-sockets: host`).
fn hide_control_key(
    key: &Path,
    sandbox: &Arc<td_confine::SandboxSettings>,
) -> Arc<td_confine::SandboxSettings> {
    let real = key.canonicalize().unwrap_or_else(|_| key.to_path_buf());
    let (settings, hidden) = hiding(sandbox, &real);
    if let Err(why) = hidden
        && settings.unix_sockets != td_confine::UnixSockets::Refuse
    {
        eprintln!(
            "taskdaemon: warning: the control key {why}; with `sandbox.unix-sockets` open, a command that reads it could stop the run's loops"
        );
    }
    settings
}

/// Marks loop `name` blocked for `why`: in the run's statuses, its record, the progress
/// display and the events.
fn mark_blocked(
    name: &str,
    why: &str,
    status: &mut BTreeMap<String, LoopStatus>,
    record: &RunRecord,
    progress: &ProgressDisplay,
    events: &EventLog,
) {
    status.insert(name.to_string(), LoopStatus::Blocked);
    let _ = record.update_loop(name, |s| {
        s.status = LoopStatus::Blocked;
        s.reason = Some(why.to_string());
    });
    progress.set_status(name, "blocked", why);
    events.record(EventKind::LoopBlocked {
        loop_name: name.to_string(),
        reason: why.to_string(),
    });
}

/// Marks pending loops whose dependency can no longer complete as blocked.
fn block_orphans(
    loops: &[LoopDef],
    status: &mut BTreeMap<String, LoopStatus>,
    record: &RunRecord,
    progress: &ProgressDisplay,
    events: &EventLog,
) {
    loop {
        let mut changed = false;
        for def in loops {
            if status[&def.name] != LoopStatus::Pending {
                continue;
            }
            let dead = def.depends_on.iter().find(|d| {
                matches!(
                    status.get(*d),
                    Some(
                        LoopStatus::Failed
                            | LoopStatus::Blocked
                            | LoopStatus::Stopped
                            | LoopStatus::Paused
                    )
                )
            });
            if let Some(dep) = dead {
                let why = format!("its dependency `{dep}` did not complete");
                mark_blocked(&def.name, &why, status, record, progress, events);
                changed = true;
            }
        }
        if !changed {
            return;
        }
    }
}

/// Makes (or, for a loop that ran before, reopens) the place where loop `def` works; a new
/// branch starts at `start`. A worktree made now (not one reopened: a resumed loop's build
/// state is its own) is seeded with `warm` from the repository's checkout first; a shared
/// worktree once, by the first loop of its group.
async fn make_place(
    def: &LoopDef,
    start: &str,
    repo: &Repo,
    run_id: &str,
    run_dir: &Path,
    shared: &mut BTreeMap<String, Arc<Worktree>>,
    warm: &[PathBuf],
) -> Result<Place, String> {
    let base = start.to_string();
    Ok(match def.worktree.clone().unwrap_or(WorktreeMode::Own) {
        WorktreeMode::Own => {
            let dir = run_dir.join("worktrees").join(&def.name);
            let fresh = !dir.exists();
            let wt = repo
                .add_worktree(run_id, &def.name, Some(start), &dir)
                .await
                .map_err(|e| format!("cannot create the worktree of {}: {e}", def.name))?;
            let warm = match fresh {
                true => crate::run::warm::seed_worktree(repo.root(), &wt, warm).await,
                false => None,
            };
            Place {
                dir,
                worktree: Some(Arc::new(wt)),
                base,
                warm,
            }
        }
        WorktreeMode::Shared(group) => {
            let (wt, seeded) = match shared.get(&group) {
                Some(w) => (w.clone(), None),
                None => {
                    let dir = run_dir.join("worktrees").join(format!("shared-{group}"));
                    let fresh = !dir.exists();
                    let w = Arc::new(
                        repo.add_worktree(run_id, &format!("shared-{group}"), Some(start), &dir)
                            .await
                            .map_err(|e| {
                                format!("cannot create the shared worktree {group}: {e}")
                            })?,
                    );
                    let seeded = match fresh {
                        true => crate::run::warm::seed_worktree(repo.root(), &w, warm).await,
                        false => None,
                    };
                    shared.insert(group.clone(), w.clone());
                    (w, seeded)
                }
            };
            Place {
                dir: wt.path().to_path_buf(),
                worktree: Some(wt),
                base,
                warm: seeded,
            }
        }
        WorktreeMode::Repo => Place {
            dir: repo.root().to_path_buf(),
            worktree: None,
            base,
            warm: None,
        },
    })
}

/// After loop `name` ended: queues its work for integration when it completed (a
/// shared-worktree group once every member ended: all completed, or nothing of it lands).
#[allow(clippy::too_many_arguments)]
fn queue_after_end(
    name: &str,
    loops: &[LoopDef],
    types: &BTreeMap<String, LoopType>,
    config: &Config,
    run_id: &str,
    default_base: &str,
    places: &BTreeMap<String, Place>,
    ledger: &Ledger,
    status: &mut BTreeMap<String, LoopStatus>,
    queued_groups: &mut BTreeSet<String>,
    queue: &mut MergeQueue,
    record: &RunRecord,
    progress: &ProgressDisplay,
    events: &EventLog,
) {
    let Some(def) = loops.iter().find(|l| l.name == name) else {
        return;
    };
    if !merge_queue::integrates(def) {
        return;
    }
    let Some(wt) = places.get(name).and_then(|p| p.worktree.clone()) else {
        return;
    };
    let group = match &def.worktree {
        Some(WorktreeMode::Shared(group)) => Some(group.clone()),
        _ => None,
    };
    let members: Vec<&LoopDef> = match &group {
        Some(g) => loops
            .iter()
            .filter(|l| l.worktree == Some(WorktreeMode::Shared(g.clone())))
            .collect(),
        None => vec![def],
    };
    let ended = |n: &str| {
        !matches!(
            status.get(n),
            Some(LoopStatus::Pending | LoopStatus::Running) | None
        )
    };
    if !members.iter().all(|m| ended(&m.name)) {
        if status.get(name) == Some(&LoopStatus::Completed) {
            progress.set_status(name, "completed", "waits for its worktree group to end");
        }
        return;
    }
    if let Some(g) = &group
        && !queued_groups.insert(g.clone())
    {
        return;
    }
    let failed = members
        .iter()
        .find(|m| status.get(&m.name) != Some(&LoopStatus::Completed));
    if let Some(failed) = failed {
        // A member that did not complete: nothing of the group lands.
        let why = format!(
            "member `{}` did not complete; the group's work stays on branch {}",
            failed.name,
            wt.branch()
        );
        let completed: Vec<String> = members
            .iter()
            .filter(|m| status.get(&m.name) == Some(&LoopStatus::Completed))
            .map(|m| m.name.clone())
            .collect();
        for m in completed {
            mark_blocked(&m, &why, status, record, progress, events);
        }
        return;
    }
    let hand_back_to = ledger
        .may_hand_back(config, &members)
        .then(|| (*wt).clone());
    let Some(job) = merge_queue::job_for(
        &members,
        types,
        config,
        run_id,
        default_base,
        wt.branch(),
        hand_back_to,
    ) else {
        return;
    };
    for m in &members {
        progress.set_status(
            &m.name,
            "completed",
            &format!("queued for integration into {}", job.target),
        );
    }
    queue.push(job);
}

/// Runs loop `name` again at its next iteration after the queue handed its work back (as a
/// resume does: same worktree and branch, its progress notes, its budget spent so far, and
/// the hand back's alert in its inbox). After a stop signal it stays stopped instead; a
/// resume goes on with it.
#[allow(clippy::too_many_arguments)]
fn restart_handed_back(
    name: &str,
    run_dir: &Path,
    interrupted: bool,
    rt: &Runtime,
    resume_state: &mut BTreeMap<String, crate::run::resume::LoopResume>,
    status: &mut BTreeMap<String, LoopStatus>,
    record: &RunRecord,
    progress: &ProgressDisplay,
) {
    let stop = |why: String, status: &mut BTreeMap<String, LoopStatus>| {
        status.insert(name.to_string(), LoopStatus::Stopped);
        let _ = record.update_loop(name, |s| {
            s.status = LoopStatus::Stopped;
            s.reason = Some(why.clone());
        });
        progress.set_status(name, "stopped", &why);
    };
    if interrupted {
        stop(
            "its work was handed back by the merge queue; the run was interrupted before it ran again (`run --resume` goes on with it)".to_string(),
            status,
        );
        return;
    }
    // What its next iteration goes on from, read back from the record as a resume does (the
    // hand back's events are in it).
    let restored = match crate::run::resume::restore(run_dir) {
        Ok(r) => r,
        Err(e) => {
            stop(format!("cannot run it again: {e}"), status);
            return;
        }
    };
    let Some(mut loop_resume) = restored.loops.get(name).cloned() else {
        stop(
            "cannot run it again: it is not in the record".to_string(),
            status,
        );
        return;
    };
    loop_resume.finished = None;
    loop_resume.announced = true;
    let _ = rt.retire_loop(name);
    resume_state.insert(name.to_string(), loop_resume);
    // Started by the main loop like any pending loop (its dependencies landed already).
    status.insert(name.to_string(), LoopStatus::Pending);
}

/// Loop `name`, taken back from its lost host (`why`), waits to start again with `resume`
/// (`run/hosts/moves`): pending, with its model script (a scripted run) rewound to the end
/// of its last finished iteration, as `run --resume` would.
#[allow(clippy::too_many_arguments)]
fn take_back(
    name: &str,
    resume: crate::run::resume::LoopResume,
    why: &str,
    llm: &Arc<dyn td_llm::LlmClient>,
    resume_state: &mut BTreeMap<String, crate::run::resume::LoopResume>,
    status: &mut BTreeMap<String, LoopStatus>,
    record: &RunRecord,
    progress: &ProgressDisplay,
) {
    llm.resume(name, resume.responses);
    let why = format!(
        "{why}; it goes on elsewhere with iteration {}",
        resume.next_iteration
    );
    resume_state.insert(name.to_string(), resume);
    status.insert(name.to_string(), LoopStatus::Pending);
    let _ = record.update_loop(name, |s| {
        s.status = LoopStatus::Pending;
        s.reason = Some(why.clone());
    });
    progress.set_status(name, "pending", &why);
}

/// Prepares a loop's place, context, tools and engine settings.
#[allow(clippy::too_many_arguments)]
async fn start_loop(
    def: &LoopDef,
    resume: Option<&crate::run::resume::LoopResume>,
    start_at: Option<&str>,
    loop_type: &LoopType,
    config: &Config,
    names: &[String],
    repo: &Repo,
    run_id: &str,
    run_dir: &Path,
    default_base: &str,
    shared: &mut BTreeMap<String, Arc<Worktree>>,
    rt: &Runtime,
    llm: &Arc<dyn td_llm::LlmClient>,
    catalog: &Arc<td_toolkit::catalog::Catalog>,
    sandbox: &Arc<td_confine::SandboxSettings>,
    web_access: &td_toolkit::web_access::WebAccess,
    events: &Arc<EventLog>,
    progress: &Arc<ProgressDisplay>,
    record: &Arc<RunRecord>,
    budgets: &Arc<Budgets>,
    compiler_caches: Option<&CompilerCaches>,
) -> Result<(LoopSpec, Place), String> {
    let base = def.base.clone().unwrap_or_else(|| default_base.to_string());
    let mut place = make_place(
        def,
        start_at.unwrap_or(&base),
        repo,
        run_id,
        run_dir,
        shared,
        &config.warm_paths(def, loop_type),
    )
    .await?;
    place.base = base;
    if let Some(seed) = place.warm.take() {
        events.record(EventKind::WorktreeSeeded {
            loop_name: def.name.clone(),
            seed,
        });
    }
    let validation = def
        .validation
        .clone()
        .or_else(|| loop_type.validation.clone());
    let ctx = rt
        .context(&place.dir, &def.name)
        .map_err(|e| e.to_string())?
        .with_catalog(catalog.clone())
        .with_sandbox_settings(sandbox.clone())
        .with_web_access(web_access.clone())
        .with_commands(LoopCommands {
            build: loop_type.build.clone(),
            test: loop_type.test.clone(),
            validate: validation,
        });
    let ctx = match compiler_caches {
        Some(caches) => ctx.with_compiler_cache(caches.access_for(&place.dir, sandbox).await?),
        None => ctx,
    };
    let tools = td_tools::tool_set(&loop_type.tools).map_err(|e| e.to_string())?;
    let validation_tools = td_tools::tool_set(&["validate"]).map_err(|e| e.to_string())?;
    let receipts = record.receipts_for(&def.name)?;
    receipts.set_tool_set(tools.names());
    let carried = carried_of(resume, record, &def.name);
    budgets.open_loop(&def.name, config.loop_limits(def, loop_type), carried);
    let spec = LoopSpec {
        config: EngineConfig {
            name: def.name.clone(),
            loop_type: loop_type.name.clone(),
            task: def.task.clone(),
            max_iterations: loop_type.max_iterations,
            max_turns: loop_type.max_turns,
            iteration_timeout: loop_type.iteration_timeout,
            success_code: loop_type.success_code,
            system_template: loop_type.system_prompt.clone(),
            iteration_template: loop_type.iteration_prompt.clone(),
            peers: names.iter().filter(|n| **n != def.name).cloned().collect(),
            first_iteration: resume.map_or(1, |r| r.next_iteration),
        },
        ctx: Arc::new(ctx),
        tools: Arc::new(tools),
        validation_tools: Arc::new(validation_tools),
        llm: llm.clone(),
        runner: Arc::new(rt.lanes.clone()),
        coordinator: rt.coordinator.clone(),
        events: events.clone(),
        transcript: progress.clone(),
        receipts: Some(receipts),
        subscriptions: loop_type.subscriptions.clone(),
        ended: None,
        gate: None,
        initial_inbox: resume.map(|r| r.unseen_inbox.clone()).unwrap_or_default(),
        initial_progress: resume.map(|r| r.progress.clone()).unwrap_or_default(),
        announced: resume.is_some_and(|r| r.announced),
        budgets: budgets.clone(),
    };
    Ok((spec, place))
}

/// What a resumed loop spent before counts against its budget: its charges, its finished
/// iterations, the time they took.
fn carried_of(
    resume: Option<&crate::run::resume::LoopResume>,
    record: &RunRecord,
    name: &str,
) -> Carried {
    match resume {
        Some(r) => {
            let entry = record.loop_summary(name);
            Carried {
                spend: entry.as_ref().map(|e| e.charged).unwrap_or_default(),
                iterations: u64::from(r.next_iteration.saturating_sub(1)),
                wall: Duration::from_millis(entry.map_or(0, |e| e.wall_ms)),
            }
        }
        None => Carried::default(),
    }
}

/// Makes a loop's place on the head (its worktree and branch stay the record of its work)
/// and starts it on `host` (`run/hosts/remote`): its engine settings, tools, commands,
/// limits and resume state go there, never a secret of the head's.
#[allow(clippy::too_many_arguments)]
async fn start_remote(
    def: &LoopDef,
    resume: Option<&crate::run::resume::LoopResume>,
    start_at: Option<&str>,
    loop_type: &LoopType,
    config: &Config,
    catalog: &td_toolkit::catalog::Catalog,
    names: &[String],
    repo: &Repo,
    run_id: &str,
    run_dir: &Path,
    default_base: &str,
    shared: &mut BTreeMap<String, Arc<Worktree>>,
    record: &Arc<RunRecord>,
    budgets: &Arc<Budgets>,
    host: &str,
    remote: &Arc<RemoteLoops>,
    sandbox_policy: &serde_json::Value,
    moved: Option<EventKind>,
) -> Result<Place, String> {
    let base = def.base.clone().unwrap_or_else(|| default_base.to_string());
    // Its build state is made on the host (seeded there from the host's own checkout):
    // nothing is seeded on the head.
    let mut place = make_place(
        def,
        start_at.unwrap_or(&base),
        repo,
        run_id,
        run_dir,
        shared,
        &[],
    )
    .await?;
    place.base = base;
    let worktree = place
        .worktree
        .clone()
        .ok_or_else(|| format!("loop {} has no worktree of its own to send", def.name))?;
    let base_commit = worktree
        .head_commit()
        .await
        .map_err(|e| format!("cannot read the commit of {}: {e}", def.name))?;
    let tools = td_tools::tool_set(&loop_type.tools).map_err(|e| e.to_string())?;
    // The host runs the loop's tools under the run's catalog (sent below), and its answers
    // may use only the read-only lane tools under it: what the head offers an answer's
    // model call, as the host's answerer allows.
    let answer_tools = tools.answer_definitions(catalog);
    let receipts = record.receipts_for(&def.name)?;
    receipts.set_tool_set(tools.names());
    let limits = config.loop_limits(def, loop_type);
    let carried = carried_of(resume, record, &def.name);
    budgets.open_loop(&def.name, limits, carried);
    let pricing = budgets.pricing();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let start = td_cluster::protocol::StartLoop {
        // Given by `RemoteLoops::start`, fresh for each placement.
        attempt: 0,
        loop_name: def.name.clone(),
        loop_type: loop_type.name.clone(),
        task: def.task.clone(),
        max_iterations: loop_type.max_iterations,
        max_turns: loop_type.max_turns,
        iteration_timeout_ms: loop_type.iteration_timeout.map(ms),
        success_code: loop_type.success_code,
        system_template: loop_type.system_prompt.clone(),
        iteration_template: loop_type.iteration_prompt.clone(),
        peers: names.iter().filter(|n| **n != def.name).cloned().collect(),
        first_iteration: resume.map_or(1, |r| r.next_iteration),
        tools: loop_type.tools.clone(),
        catalog: serde_json::to_value(&config.catalog)
            .map_err(|e| format!("cannot write the catalog's overrides: {e}"))?,
        build: loop_type.build.clone(),
        test: loop_type.test.clone(),
        validate: def
            .validation
            .clone()
            .or_else(|| loop_type.validation.clone()),
        subscriptions: loop_type.subscriptions.clone(),
        initial_inbox: resume
            .map(|r| {
                r.unseen_inbox
                    .iter()
                    .filter_map(|i| serde_json::to_value(i).ok())
                    .collect()
            })
            .unwrap_or_default(),
        initial_progress: resume.map(|r| r.progress.clone()).unwrap_or_default(),
        announced: resume.is_some_and(|r| r.announced),
        limits: td_cluster::protocol::HostLimits {
            iterations: limits.iterations,
            wall_ms: limits.wall.map(ms),
            carried_iterations: carried.iterations,
            carried_wall_ms: ms(carried.wall),
            soft_percent: limits.soft_percent,
        },
        pricing: td_cluster::protocol::WirePricing {
            model: pricing.model.clone(),
            price: pricing
                .price
                .map(|p| [p.input, p.output, p.cache_read, p.cache_write]),
            max_output_tokens: pricing.max_output_tokens,
        },
        base_commit,
        // Given by `RemoteLoops::start`, the run's.
        attributes_from: None,
        branch: worktree.branch().to_string(),
        sandbox: sandbox_policy.clone(),
        web_allow_private: config.web.allow_private.to_value(),
        compiler_cache: !matches!(
            config.compiler_cache,
            crate::config::compiler_cache::CompilerCacheConfig::None
        ),
        warm: config
            .warm_paths(def, loop_type)
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
    };
    remote.start(Placed {
        host: host.to_string(),
        start,
        worktree,
        tools: tools.shared_definitions(),
        answer_tools,
        moved,
    })?;
    Ok(place)
}

/// Commits a loop's work (its integration is the merge queue's) and returns its final
/// status.
async fn finish_loop(
    name: &str,
    end: &LoopEnd,
    places: &BTreeMap<String, Place>,
    record: &RunRecord,
    progress: &ProgressDisplay,
) -> LoopStatus {
    let status = match end {
        LoopEnd::Completed { .. } => LoopStatus::Completed,
        LoopEnd::Failed { .. } => LoopStatus::Failed,
        LoopEnd::Paused { .. } => LoopStatus::Paused,
        LoopEnd::Stopped { .. } => LoopStatus::Stopped,
    };
    let _ = record.update_loop(name, |s| {
        s.apply_end(end);
        s.mark_ended(&now_rfc3339());
    });
    let Some(place) = places.get(name) else {
        return status;
    };
    let Some(wt) = &place.worktree else {
        return status;
    };
    let message = match end {
        LoopEnd::Completed { summary, .. } => format!(
            "taskdaemon: {name} completed\n\n{}",
            summary.as_deref().unwrap_or("")
        ),
        other => format!("taskdaemon: {name} {} (work in progress)", other.status()),
    };
    if let Err(e) = wt.commit_all(&message).await {
        let why = format!("could not commit its work: {e}");
        let _ = record.update_loop(name, |s| s.reason = Some(why.clone()));
        progress.set_status(name, status.as_str(), &why);
        // Work that could not be committed is not integrated either.
        if status == LoopStatus::Completed {
            let _ = record.update_loop(name, |s| s.status = LoopStatus::Blocked);
            return LoopStatus::Blocked;
        }
        return status;
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resumed_run_reads_the_attributes_of_the_commit_it_first_started_from() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        git(dir, &["init", "-q", "-b", "main"]);
        std::fs::write(dir.join(".gitattributes"), "*.a filter=x\n").unwrap();
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-q", "-m", "first"]);
        let first = git(dir, &["rev-parse", "HEAD"]);
        // What a loop's merged work could have changed since the run first started.
        std::fs::write(dir.join(".gitattributes"), "* filter=x\n").unwrap();
        git(dir, &["commit", "-q", "-am", "second"]);
        let second = git(dir, &["rev-parse", "HEAD"]);
        let repo = Repo::open(dir).await.unwrap();
        // A new run: HEAD now.
        assert_eq!(trust_attributes(&repo, None), Some(second.clone()));
        // A resumed one: the commit it recorded.
        let mut summary = RunSummary {
            attributes_from: Some(first.clone()),
            ..RunSummary::default()
        };
        assert_eq!(trust_attributes(&repo, Some(&summary)), Some(first));
        // A record of before the field: HEAD now.
        summary.attributes_from = None;
        assert_eq!(trust_attributes(&repo, Some(&summary)), Some(second));
        // A recorded commit the repository lacks: none read.
        summary.attributes_from = Some("0".repeat(40));
        assert_eq!(trust_attributes(&repo, Some(&summary)), None);
    }
}
