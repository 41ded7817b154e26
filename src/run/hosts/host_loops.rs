//! A worker host's loops: the head sends a loop ([`ToHost::StartLoop`]); the host fetches
//! its base commit into a mirror under its work directory, checks a worktree out of it,
//! and runs the loop in a runtime of its own (its tool lanes, file watcher and tool context
//! are this host's, so tools cost what they cost on one machine). What differs from a loop
//! on the head:
//! - the model: the host has no keys; each model call goes to the head ([`RemoteLlm`]),
//!   which calls its own client and charges the loop's budget and the run's;
//! - records: the loop's events, transcript entries and receipts stream to the head
//!   ([`Streamer`]), which appends them to the run's record; a batch that cannot be
//!   delivered after a few tries makes the loop's record unwritable, so the loop stops
//!   before its next call with the reason (nothing is done that is not recorded);
//! - confinement: the run's `sandbox:` policy applies as this host takes it
//!   (`guard::host_policy`: no paths of the head's, no host secret passed, never below
//!   `--sandbox-floor`), with this host's paths: its work directory protected (the mirror,
//!   other loops' worktrees) and its secret file hidden;
//! - trust: every name the head sends that becomes a path is checked first, and a loop's
//!   directories are named after its loop name (`guard`);
//! - its work as it goes: after each failed iteration (at its progress note) the host
//!   commits the worktree and sends the commits since the last tip the head took
//!   ([`FromHost::Checkpoint`], [`Checkpoints`]) before that note and before the loop's next
//!   model call, so that the head holds every finished iteration's work and can resume the
//!   loop elsewhere if this host is lost;
//! - its end: its last work goes as a checkpoint before the events that end it (a passing
//!   iteration's `iteration_ended`, a `loop_failed`), so that a host lost before its
//!   `Ended` leaves the head with the end and its work; then the host commits what is left,
//!   bundles its branch from the last tip the head took and sends it back in chunks with
//!   the loop's end ([`FromHost::Ended`]);
//! - its placement: every request about a loop carries the attempt id of its
//!   [`StartLoop`] (the head refuses an attempt that is no longer the loop's).
//!
//! - coordination: the host's runtime routes nothing itself; its loops' queries, shares,
//!   alerts and listings go to the head ([`HeadUpstream`]), which reaches the loops here
//!   through [`ToHost::Deliver`] and [`ToHost::Answer`].

mod base_lfs;
mod checkpoint;
mod guard;
mod web;

use checkpoint::{Checkpoints, send_bundle};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::model_wire::Outgoing;
use crate::run::compiler_cache::CompilerCaches;
use td_base::sync::lock;
use td_cluster::protocol::{
    BranchBundle, CHUNK_BYTES, Chunk, CompleteAnswer, CoordRequest, FromHost, HostLimits, RawJson,
    StartLoop, ToHost, WirePricing,
};
use td_cluster::{HeadLink, HeadRequest};
use td_engine::LoopEnd;
use td_engine::budget::{Budgets, Carried, Limits, Pricing};
use td_engine::transcript::{TranscriptEntry, TranscriptSink};
use td_git::transfer::Mirror;
use td_git::worktree::Worktree;
use td_llm::{LlmClient, LlmError, LlmRequest, LlmResponse, Purpose};
use td_protocol::events::{Event, EventLog};
use td_runtime::coordinator::{CoordinatorPort, SYSTEM_SENDER};
use td_runtime::coordinator_handle::CoordinatorHandle;
use td_runtime::daemon::{Runtime, RuntimeConfig};
use td_runtime::loop_actor::LoopSpec;
use td_runtime::upstream::{QUERY_GRACE, UPSTREAM_TIMEOUT, Upstream};
use td_toolkit::context::{CompilerCacheAccess, LoopCommands};
use td_toolkit::coordination::{Delivery, LoopInfo};
use td_toolkit::error::ToolError;
use td_toolkit::receipts::ReceiptLog;

/// The largest base bundle a host takes from the head.
pub const MAX_BASE_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// How long one model call through the head may take (the head's client has its own,
/// shorter, limits; this one only keeps a host from waiting forever).
const MODEL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How long one request of records, chunks or an end may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How many times a request that failed is sent again before its loop is marked.
const TRIES: u32 = 4;

/// The most items and bytes of one batch of records.
const BATCH_ITEMS: usize = 512;
const BATCH_BYTES: usize = 1024 * 1024;
/// How long a batch waits for more records after its first (a flush sends at once): a
/// loop's records come a few at a time (a query's receipt, an answer's transcript), and a
/// batch each cost the head a request each (benches/hosts.rs: a query stream's batches
/// were most of the head's work per query).
const BATCH_LINGER: Duration = Duration::from_millis(10);

pub use guard::HostFloor;

/// What loop `name`'s `web_fetch` may reach here: the run's `web.allow-private` (`asked`)
/// within this host's `--web-allow-private`; what of the run's is left out is said on
/// stderr, as for the sandbox.
fn web_access(name: &str, asked: &Value) -> Result<td_toolkit::web_access::WebAccess, String> {
    let floor = FLOOR.get().cloned().unwrap_or_default();
    let (access, left_out) = web::host_web_access(asked, &floor.web)?;
    for what in left_out {
        eprintln!("taskdaemon host: loop {name}: the head's {what} is left out");
    }
    Ok(access)
}

/// This host's own floor under the head's sandbox policy, set once by `taskdaemon host`
/// before it joins (a process runs one host).
static FLOOR: OnceLock<HostFloor> = OnceLock::new();

/// Sets this host's floor under the head's sandbox policy (the first call wins).
pub fn set_floor(floor: HostFloor) {
    let _ = FLOOR.set(floor);
}

/// A name that is safe as one path component.
fn plain(name: &str) -> bool {
    td_cluster::protocol::valid_host_name(name)
}

/// What the driver of the host's runtime is told.
enum Command {
    Spawn(Box<LoopSpec>),
    Stop { name: String, now: bool },
    Shutdown,
}

/// A loop this host runs.
struct Running {
    start: StartLoop,
    worktree: Option<Worktree>,
    streamer: Streamer,
    /// The head, asked about this placement of the loop.
    link: HeadLink,
    /// Its work as the head holds it.
    checkpoints: Arc<Checkpoints>,
    /// The stop the head asked of it ([`STOP_ASKED`], [`STOP_NOW_ASKED`]; 0: none), set
    /// before its runtime is told: a loop still being set up then is stopped as it starts,
    /// and a model call the head gives up waits for the loop's stop instead of failing it.
    stop_asked: Arc<AtomicU8>,
}

/// [`Running::stop_asked`]: a stop after the tool call in flight.
const STOP_ASKED: u8 = 1;
/// [`Running::stop_asked`]: a stop now.
const STOP_NOW_ASKED: u8 = 2;

/// How long a model call the head gave up (the loop is stopping) waits for the loop's stop
/// to end it, before it fails as a model error (a stop that never reaches the loop must
/// not hold it forever).
const STOPPING_GRACE: Duration = Duration::from_secs(30);

/// What this host's loops' builds start from, as its owner set it.
#[derive(Debug, Clone, Default)]
pub struct BuildState {
    /// This machine's sccache (`--sccache`; `None`: the one on PATH), for runs with
    /// `compiler-cache`.
    pub sccache: Option<PathBuf>,
    /// The checkout each new worktree's `warm:` paths are copied from (`--warm-from`;
    /// `None`: they are not seeded here).
    pub warm_from: Option<PathBuf>,
}

/// The attempt id of each loop placed here (the last placement of each name), for the
/// requests this host's runtime makes about its loops ([`HeadUpstream`]).
type Attempts = Arc<Mutex<BTreeMap<String, u64>>>;

/// The loops of this host.
pub struct HostLoops {
    workdir: PathBuf,
    link: HeadLink,
    slots: usize,
    /// The host's secret file, hidden from commands.
    secret_file: Option<PathBuf>,
    loops: Mutex<BTreeMap<String, Running>>,
    commands: mpsc::UnboundedSender<Command>,
    mirror: tokio::sync::Mutex<Option<Mirror>>,
    runtime: OnceLock<RuntimeParts>,
    /// Held by a loop's end until its worktree and branch are gone, and by a start of the
    /// same loop while it makes its worktree ([`guard::LoopLocks`]).
    locks: guard::LoopLocks,
    /// The attempt of each loop placed here.
    attempts: Attempts,
    /// Where its loops' builds start from (`--sccache`, `--warm-from`).
    build: BuildState,
    /// The compiler cache servers of the loops whose run asks for the cache, made at the
    /// first such loop.
    compiler_caches: tokio::sync::OnceCell<Arc<CompilerCaches>>,
}

/// What loop specs take from the host's runtime.
#[derive(Clone)]
struct RuntimeParts {
    coordinator: ractor::ActorRef<td_runtime::coordinator::CoordMsg>,
    handle: CoordinatorHandle,
    lanes: td_runtime::tool_lanes::ToolLanes,
    events: Arc<EventLog>,
}

impl HostLoops {
    /// Starts the host's runtime; the returned task drives it until the host ends.
    pub async fn start(
        workdir: &Path,
        link: HeadLink,
        slots: u32,
        secret_file: Option<PathBuf>,
        build: BuildState,
    ) -> Result<(Arc<HostLoops>, tokio::task::JoinHandle<()>), String> {
        // Parts of LFS objects an earlier process of this host was fetching when it ended.
        td_git::transfer::lfs::sweep_parts(&workdir.join("bundles"));
        let events = Arc::new(EventLog::new());
        let attempts: Attempts = Arc::new(Mutex::new(BTreeMap::new()));
        let config = RuntimeConfig {
            upstream: Some(Arc::new(HeadUpstream {
                link: link.clone(),
                attempts: attempts.clone(),
            })),
            ..RuntimeConfig::default()
        };
        let mut rt = Runtime::start(config, events.clone())
            .await
            .map_err(|e| format!("cannot start the host's runtime: {e}"))?;
        // A host's loops do not wait for peers: the head released the run's loops already.
        rt.release().await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let loops = Arc::new(HostLoops {
            workdir: workdir.to_path_buf(),
            link,
            slots: slots as usize,
            secret_file,
            loops: Mutex::new(BTreeMap::new()),
            commands: tx,
            mirror: tokio::sync::Mutex::new(None),
            runtime: OnceLock::new(),
            locks: guard::LoopLocks::default(),
            attempts,
            build,
            compiler_caches: tokio::sync::OnceCell::new(),
        });
        let _ = loops.runtime.set(RuntimeParts {
            coordinator: rt.coordinator.clone(),
            handle: rt.handle(),
            lanes: rt.lanes.clone(),
            events: events.clone(),
        });
        // Every event of a loop goes to its streamer.
        let weak = Arc::downgrade(&loops);
        events.subscribe(move |event: &Event| {
            if let Some(loops) = weak.upgrade() {
                loops.on_event(event);
            }
        });
        let me = loops.clone();
        let driver = tokio::spawn(async move {
            loop {
                tokio::select! {
                    command = rx.recv() => match command {
                        Some(Command::Spawn(spec)) => {
                            let name = spec.config.name.clone();
                            if let Err(e) = rt.spawn_loop(*spec).await {
                                me.clone().finish(name, LoopEnd::Failed {
                                    iterations: 0,
                                    reason: format!("it did not start on its host: {e}"),
                                });
                            } else {
                                // A stop asked while it was set up found no loop to stop
                                // then: it is stopped now.
                                let asked = lock(&me.loops)
                                    .get(&name)
                                    .map_or(0, |r| r.stop_asked.load(Ordering::SeqCst));
                                let _ = match asked {
                                    STOP_NOW_ASKED => rt.stop_loop_now(&name),
                                    STOP_ASKED => rt.stop_loop(&name),
                                    _ => Ok(()),
                                };
                            }
                        }
                        Some(Command::Stop { name, now }) => {
                            let _ = if now { rt.stop_loop_now(&name) } else { rt.stop_loop(&name) };
                        }
                        Some(Command::Shutdown) | None => break,
                    },
                    ended = rt.next_end(Duration::from_secs(3600)) => {
                        if let Some((name, end)) = ended {
                            let _ = rt.retire_loop(&name);
                            me.clone().finish(name, end);
                        }
                    }
                }
            }
            rt.shutdown().await;
        });
        Ok((loops, driver))
    }

    /// Stops the runtime and every loop still in it (the host's session ended).
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
    }

    /// Stops every compiler cache server still running and waits for them (the host is
    /// ending; a loop's own server stops with the loop).
    pub async fn stop_compiler_caches(&self) {
        if let Some(caches) = self.compiler_caches.get() {
            caches.stop_all().await;
        }
    }

    /// Seeds loop `start`'s new `worktree` with its `warm:` paths from this host's
    /// `--warm-from` checkout, and records what was copied (or why nothing was) as the head
    /// does for its own loops. The paths were checked with the start ([`guard::check_start`]);
    /// they come as paths (a preset's name here is a directory of that name).
    async fn warm(&self, start: &StartLoop, worktree: &Worktree) {
        let paths: Vec<PathBuf> = start.warm.iter().map(PathBuf::from).collect();
        let seed = match &self.build.warm_from {
            Some(checkout) => crate::run::warm::seed_worktree(checkout, worktree, &paths).await,
            None => crate::run::warm::not_on_host(&paths),
        };
        if let (Some(seed), Some(parts)) = (seed, self.runtime.get()) {
            parts
                .events
                .record(td_protocol::events::EventKind::WorktreeSeeded {
                    loop_name: start.loop_name.clone(),
                    seed,
                });
        }
    }

    /// How loop `name`'s commands reach the compiler cache server of `worktree` (started
    /// now), when its run asks for the cache; refused, saying what to do, when this host
    /// cannot give it one.
    async fn compiler_cache(
        &self,
        start: &StartLoop,
        worktree: &Path,
        sandbox: &td_confine::SandboxSettings,
    ) -> Result<Option<CompilerCacheAccess>, String> {
        if !start.compiler_cache {
            return Ok(None);
        }
        let caches = self
            .compiler_caches
            .get_or_try_init(|| async {
                CompilerCaches::for_host(self.build.sccache.as_deref(), &self.workdir)
            })
            .await?;
        caches.access_for(worktree, sandbox).await.map(Some)
    }

    /// Answers a request of the head.
    pub fn handle(self: &Arc<Self>, request: HeadRequest) {
        let HeadRequest { request, reply } = request;
        match request {
            ToHost::StartLoop(start) => {
                let me = self.clone();
                tokio::spawn(async move { reply.send(me.accept(*start).await) });
            }
            ToHost::StopLoop { loop_name, now } => {
                let asked = if now { STOP_NOW_ASKED } else { STOP_ASKED };
                let known = lock(&self.loops).get(&loop_name).map(|running| {
                    running.stop_asked.fetch_max(asked, Ordering::SeqCst);
                });
                if known.is_some() {
                    let _ = self.commands.send(Command::Stop {
                        name: loop_name,
                        now,
                    });
                    reply.send(Ok(()));
                } else {
                    reply.send(Err::<(), _>(format!("no loop {loop_name} runs here")));
                }
            }
            ToHost::Deliver {
                loop_name,
                item,
                delivery,
            } => {
                let Some(handle) = self.runtime.get().map(|p| p.handle.clone()) else {
                    return reply.send(Ok(false));
                };
                let item: td_protocol::inbox::InboxItem = match serde_json::from_value(item) {
                    Ok(i) => i,
                    Err(e) => {
                        return reply.send(Err::<bool, _>(format!(
                            "the item for loop {loop_name} cannot be read: {e}"
                        )));
                    }
                };
                tokio::spawn(async move {
                    let there = handle
                        .deliver_local(&loop_name, delivery, Arc::new(item))
                        .await;
                    reply.send(Ok::<bool, String>(there));
                });
            }
            ToHost::Answer {
                loop_name,
                from,
                question,
                timeout_ms,
            } => {
                let Some(handle) = self.runtime.get().map(|p| p.handle.clone()) else {
                    return reply
                        .send(Err::<String, _>("the host's runtime is not running".into()));
                };
                tokio::spawn(async move {
                    let answer = handle
                        .answer_local(
                            &loop_name,
                            &from,
                            &question,
                            Duration::from_millis(timeout_ms),
                        )
                        .await;
                    reply.send(answer.map_err(|e| e.to_string()));
                });
            }
            other => reply.send(Err::<(), _>(format!("not a loop request: {other:?}"))),
        }
    }

    /// Takes loop `start` (its setup goes on in a task of its own).
    async fn accept(self: Arc<Self>, start: StartLoop) -> Result<(), String> {
        guard::check_start(&start).await?;
        {
            let mut loops = lock(&self.loops);
            if loops.contains_key(&start.loop_name) {
                return Err(format!("loop {} runs here already", start.loop_name));
            }
            if loops.len() >= self.slots {
                return Err(format!("all {} slots of this host are busy", self.slots));
            }
            let link = self.link.for_attempt(start.attempt);
            let checkpoints = Arc::new(Checkpoints::new(&start.base_commit));
            let streamer = Streamer::start(
                link.clone(),
                start.loop_name.clone(),
                checkpoints.clone(),
                self.workdir.join("bundles"),
            );
            lock(&self.attempts).insert(start.loop_name.clone(), start.attempt);
            loops.insert(
                start.loop_name.clone(),
                Running {
                    start: start.clone(),
                    worktree: None,
                    streamer,
                    link,
                    checkpoints,
                    stop_asked: Arc::new(AtomicU8::new(0)),
                },
            );
        }
        tokio::spawn(async move {
            let name = start.loop_name.clone();
            if let Err(why) = self.set_up(start).await {
                self.finish(
                    name,
                    LoopEnd::Failed {
                        iterations: 0,
                        reason: format!("its host could not set it up: {why}"),
                    },
                );
            }
        });
        Ok(())
    }

    fn on_event(&self, event: &Event) {
        // Written once, here: the batch carries the text as it is, and the loop it is about
        // is read back from that text (an event of no loop of this host is not sent).
        let raw = match RawJson::to(&event.kind) {
            Ok(raw) => raw,
            Err(e) => {
                // Not dropped without a word: whose it was cannot be read, so every loop's
                // record here is unwritable, and each loop's end says why.
                let why = format!("an event of this host could not be written: {e}");
                for running in lock(&self.loops).values() {
                    running.streamer.write_failed(why.clone());
                }
                return;
            }
        };
        let Ok(super::EventAbout {
            loop_name: Some(name),
            ..
        }) = serde_json::from_str(raw.get())
        else {
            return;
        };
        if let Some(running) = lock(&self.loops).get(&*name) {
            // A failed iteration's work goes to the head before its note does (and before the
            // loop's next model call, which waits for it), and the loop's last work before
            // the events that end it: the head never holds a note or an end whose work it
            // does not hold (a host lost before its `Ended` leaves an end the head can take).
            if let Some(n) = running.checkpoints.before(&event.kind) {
                running.streamer.send(Item::Checkpoint(n));
            }
            running.streamer.send(Item::Event(raw));
        }
    }

    /// The mirror, opened once.
    async fn mirror(&self) -> Result<Mirror, String> {
        let mut slot = self.mirror.lock().await;
        if let Some(m) = slot.as_ref() {
            return Ok(m.clone());
        }
        let m = Mirror::open(&self.workdir.join("mirror"))
            .await
            .map_err(|e| e.to_string())?;
        *slot = Some(m.clone());
        Ok(m)
    }

    /// Has this host's own git read `.gitattributes` in the mirror (and so in every loop's
    /// worktree) from `commit`, the run's (a commit the user made), or from none: never from
    /// what a loop wrote (`td_git::attributes`). A commit the mirror lacks is refused, and
    /// none is read.
    fn trust_attributes(&self, name: &str, commit: Option<&str>) {
        let mirror = self.workdir.join("mirror");
        let Some(commit) = commit else {
            td_git::attributes::distrust(&mirror);
            return;
        };
        if let Err(e) = td_git::attributes::trust(&mirror, commit) {
            eprintln!(
                "taskdaemon host: loop {name}: this host's git reads no .gitattributes: {}",
                td_base::secrets::redact(&e.to_string())
            );
        }
    }

    /// Fetches the loop's base, makes its worktree, and starts it.
    async fn set_up(self: &Arc<Self>, start: StartLoop) -> Result<(), String> {
        let name = start.loop_name.clone();
        let link = self.link.for_attempt(start.attempt);
        let mirror = self.mirror().await?;
        if !mirror.has(&start.base_commit).await.unwrap_or(false) {
            let have = mirror.commits().await.map_err(|e| e.to_string())?;
            let bytes: Option<u64> = ask_again(&link, || FromHost::PrepareBase {
                loop_name: name.clone(),
                have: have.clone(),
            })
            .await?;
            if let Some(bytes) = bytes {
                if bytes > MAX_BASE_BYTES {
                    return Err(format!(
                        "its base bundle has {bytes} bytes, over the {MAX_BASE_BYTES} a host takes"
                    ));
                }
                let file = self
                    .workdir
                    .join("bundles")
                    .join(format!("{name}.base.bundle"));
                self.fetch_base(&link, &name, &file, bytes).await?;
                let received = mirror
                    .receive(&file, &start.base_commit, MAX_BASE_BYTES)
                    .await
                    .map_err(|e| e.to_string());
                let _ = std::fs::remove_file(&file);
                received?;
            }
        }
        base_lfs::fetch_base_lfs(
            &link,
            &name,
            &format!("{name}.{}.base", start.attempt),
            &mirror,
            &self.workdir.join("bundles"),
        )
        .await?;
        self.trust_attributes(&name, start.attributes_from.as_deref());
        // Not while an earlier start of this loop is still being cleaned up.
        let held = self.locks.hold(&name).await;
        let worktree = guard::make_worktree(&mirror, &self.workdir, &start).await?;
        drop(held);
        let spec = async {
            self.warm(&start, &worktree).await;
            let sandbox = self.sandbox(&name, &start.sandbox)?;
            let cache = self
                .compiler_cache(&start, worktree.path(), &sandbox)
                .await?;
            self.spec(&start, &worktree, sandbox, cache)
        };
        let spec = match spec.await {
            Ok(spec) => spec,
            Err(why) => {
                // Nothing ran in it: its worktree and branch go with the failed start (and
                // a compiler cache server started for it, if one was).
                if let Some(caches) = self.compiler_caches.get() {
                    caches.stop_for(worktree.path()).await;
                }
                let _ = mirror.remove_worktree(&worktree, false).await;
                return Err(why);
            }
        };
        if let Some(running) = lock(&self.loops).get_mut(&name) {
            running
                .checkpoints
                .set_place(worktree.clone(), mirror.clone());
            running.worktree = Some(worktree);
        }
        self.commands
            .send(Command::Spawn(Box::new(spec)))
            .map_err(|_| "the host's runtime stopped".to_string())
    }

    /// Fetches the base bundle of loop `name` (`bytes` long) into `file`, a chunk at a time.
    async fn fetch_base(
        &self,
        link: &HeadLink,
        name: &str,
        file: &Path,
        bytes: u64,
    ) -> Result<(), String> {
        use std::io::Write;
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot make {}: {e}", parent.display()))?;
        }
        let mut out = std::fs::File::create(file)
            .map_err(|e| format!("cannot make {}: {e}", file.display()))?;
        let mut offset = 0u64;
        while offset < bytes {
            let chunk: Chunk = ask_again(link, || FromHost::BaseChunk {
                loop_name: name.to_string(),
                offset,
            })
            .await?;
            let data = hex::decode(&chunk.data)
                .map_err(|e| format!("a chunk of the base is not hex: {e}"))?;
            if chunk.total != bytes || data.is_empty() || data.len() > CHUNK_BYTES {
                return Err(format!(
                    "the head sent a chunk of {} bytes of a {}-byte bundle, at {offset} of {bytes}",
                    data.len(),
                    chunk.total
                ));
            }
            out.write_all(&data)
                .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
            offset = offset.saturating_add(data.len() as u64);
        }
        out.sync_all()
            .map_err(|e| format!("cannot write {}: {e}", file.display()))
    }

    /// The loop's spec, on this host, its commands confined by `sandbox` and built through
    /// `compiler_cache` when the run asks for one.
    fn spec(
        &self,
        start: &StartLoop,
        worktree: &Worktree,
        sandbox: td_confine::SandboxSettings,
        compiler_cache: Option<CompilerCacheAccess>,
    ) -> Result<LoopSpec, String> {
        let parts = self
            .runtime
            .get()
            .ok_or_else(|| "the host's runtime is not running".to_string())?;
        let name = &start.loop_name;
        let (streamer, link, checkpoints, stop_asked) = lock(&self.loops)
            .get(name)
            .map(|r| {
                (
                    r.streamer.clone(),
                    r.link.clone(),
                    r.checkpoints.clone(),
                    r.stop_asked.clone(),
                )
            })
            .ok_or_else(|| format!("loop {name} was dropped"))?;
        let web_access = web_access(name, &start.web_allow_private)?;
        let ctx = td_toolkit::context::ToolContext::new(worktree.path(), name)
            .map_err(|e| e.to_string())?
            .with_coordination(Arc::new(CoordinatorPort::new(parts.coordinator.clone())))
            .with_catalog(Arc::new(guard::catalog_of(start)?))
            .with_sandbox_settings(Arc::new(sandbox))
            .with_web_access(web_access)
            .with_commands(LoopCommands {
                build: start.build.clone(),
                test: start.test.clone(),
                validate: start.validate.clone(),
            });
        let ctx = match compiler_cache {
            Some(access) => ctx.with_compiler_cache(access),
            None => ctx,
        };
        let tools = td_tools::tool_set(&start.tools).map_err(|e| e.to_string())?;
        let validation_tools = td_tools::tool_set(&["validate"]).map_err(|e| e.to_string())?;
        let receipts_path = guard::loop_dirs(&self.workdir, start)?
            .records
            .join("receipts.jsonl");
        let _ = std::fs::remove_file(&receipts_path);
        // The loop's record is the head's, which syncs each receipt before it takes its
        // batch; this file is the host's copy (removed when the loop starts here again), so
        // it is not synced: a sync per tool call stood in the loop's way (an fdatasync, 0.1
        // to several ms, and 13% of a host's CPU in a stream of queries: benches/hosts.rs).
        let receipts = ReceiptLog::open(&receipts_path)
            .map_err(|e| format!("cannot open {}: {e}", receipts_path.display()))?
            .unsynced();
        receipts.set_tool_set(tools.names());
        let stream = streamer.clone();
        receipts.observe(Box::new(move |_, line| {
            // The line as the log wrote it (redacted with the host's secrets too), carried as
            // it is: the receipt is not written again for the batch.
            if let Some(raw) = stream.written("receipt", RawJson::from_text(line.to_string())) {
                stream.send(Item::Receipt(raw));
            }
        }));
        let budgets = host_budgets(name, &start.limits, &start.pricing);
        let mut initial_inbox = Vec::with_capacity(start.initial_inbox.len());
        for item in &start.initial_inbox {
            initial_inbox.push(
                serde_json::from_value(item.clone())
                    .map_err(|e| format!("an inbox item cannot be read: {e}"))?,
            );
        }
        Ok(LoopSpec {
            config: td_engine::EngineConfig {
                name: name.clone(),
                loop_type: start.loop_type.clone(),
                task: start.task.clone(),
                max_iterations: start.max_iterations,
                max_turns: start.max_turns,
                iteration_timeout: start.iteration_timeout_ms.map(Duration::from_millis),
                success_code: start.success_code,
                system_template: start.system_template.clone(),
                iteration_template: start.iteration_template.clone(),
                peers: start.peers.clone(),
                first_iteration: start.first_iteration,
            },
            ctx: Arc::new(ctx),
            tools: Arc::new(tools),
            validation_tools: Arc::new(validation_tools),
            llm: Arc::new(RemoteLlm {
                link,
                checkpoints,
                stop_asked,
            }),
            runner: Arc::new(parts.lanes.clone()),
            coordinator: parts.coordinator.clone(),
            events: parts.events.clone(),
            transcript: Arc::new(streamer),
            receipts: Some(Arc::new(receipts)),
            subscriptions: start.subscriptions.clone(),
            ended: None,
            gate: None,
            initial_inbox,
            initial_progress: start.initial_progress.clone(),
            announced: start.announced,
            budgets,
        })
    }

    /// The run's confinement policy as this host takes it ([`guard::host_policy`]), with
    /// this host's paths; refused when it requires what this machine lacks.
    fn sandbox(&self, name: &str, policy: &Value) -> Result<td_confine::SandboxSettings, String> {
        let floor = FLOOR.get().cloned().unwrap_or_default();
        let (mut settings, dropped) = guard::host_policy(policy, &floor)?;
        for what in dropped {
            eprintln!("taskdaemon host: loop {name}: the head's {what} is left out");
        }
        // This machine's own hide list, before `required` is checked: hiding needs mount
        // namespaces, and a host that cannot hide them does not pretend to.
        for path in &floor.hide {
            settings = settings.hiding(path);
        }
        td_base::secrets::register_environment(&settings.env.secret);
        td_confine::SandboxReport::of(&settings)
            .check_required()
            .map_err(|e| format!("{e}"))?;
        // The mirror, the bundles and the other loops' worktrees are the host's, not the
        // loop's (its own worktree inside stays its own).
        let mut settings = settings.protecting(&self.workdir);
        if let Some(file) = &self.secret_file {
            let real = file.canonicalize().unwrap_or_else(|_| file.clone());
            if let Err(why) = td_confine::hide_from_commands(&mut settings, &real) {
                eprintln!(
                    "taskdaemon host: warning: the hosts' secret file {why}; a loop's command could read it"
                );
            }
        }
        Ok(settings)
    }

    /// Loop `name` ended with `end`: its last records go, then its branch, then its end.
    fn finish(self: Arc<Self>, name: String, end: LoopEnd) {
        tokio::spawn(async move {
            // Held until its worktree and branch are gone: the head may hand this loop back
            // as soon as it has the end, and that start waits for this lock.
            let _cleaning = self.locks.hold(&name).await;
            let Some((start, worktree, streamer, link, checkpoints)) =
                lock(&self.loops).get_mut(&name).map(|r| {
                    (
                        r.start.clone(),
                        r.worktree.take(),
                        r.streamer.clone(),
                        r.link.clone(),
                        r.checkpoints.clone(),
                    )
                })
            else {
                return;
            };
            // Its records, and the checkpoints among them, reach the head first.
            let mut problem = streamer.flush().await.err();
            let mut branch = None;
            if let (None, Some(worktree)) = (&problem, &worktree) {
                let base = checkpoints.taken();
                match self.send_branch(&link, &start, &base, worktree, &end).await {
                    Ok(b) => branch = b,
                    Err(why) => problem = Some(why),
                }
            }
            // Its slot is free from here on: the head may send the next loop (or this one
            // again, handed back by its merge queue) as soon as it has this end.
            lock(&self.loops).remove(&name);
            let end_value = serde_json::to_value(&end).unwrap_or(Value::Null);
            let sent: Result<(), String> = ask_again(&link, || FromHost::Ended {
                loop_name: name.clone(),
                end: end_value.clone(),
                branch: branch.clone(),
                problem: problem.clone(),
            })
            .await;
            if let Err(why) = sent {
                // The head is lost or refuses: the host's heartbeat watch ends the host.
                eprintln!(
                    "taskdaemon host: loop {name}: its end could not reach the head: {}",
                    td_base::secrets::redact(&why)
                );
            }
            // Its compiler cache server (which runs in the worktree) stops with it.
            if let (Some(caches), Some(worktree)) = (self.compiler_caches.get(), &worktree) {
                caches.stop_for(worktree.path()).await;
            }
            // The head has its commits (or refused them): the worktree and its branch go.
            if let (Some(worktree), Ok(mirror)) = (worktree, self.mirror().await) {
                let _ = mirror.remove_worktree(&worktree, false).await;
            }
        });
    }

    /// Commits the loop's work and sends its branch from `base` (the last tip the head
    /// took); `None` when it committed nothing since.
    async fn send_branch(
        &self,
        link: &HeadLink,
        start: &StartLoop,
        base: &str,
        worktree: &Worktree,
        end: &LoopEnd,
    ) -> Result<Option<BranchBundle>, String> {
        let name = &start.loop_name;
        let message = match end {
            LoopEnd::Completed { summary, .. } => format!(
                "taskdaemon: {name} completed\n\n{}",
                summary.as_deref().unwrap_or("")
            ),
            other => format!("taskdaemon: {name} {} (work in progress)", other.status()),
        };
        worktree
            .commit_all(&message)
            .await
            .map_err(|e| format!("could not commit its work: {e}"))?;
        let mirror = self.mirror().await?;
        let file = self
            .workdir
            .join("bundles")
            .join(format!("{name}.branch.bundle"));
        send_bundle(link, name, &mirror, worktree, base, &file).await
    }
}

/// The budgets a host keeps for its loop: the loop's iterations and wall time (its money
/// and tokens, and every run limit, are the head's to check at each model call), with the
/// head's prices so that what the transcript says was spent is what the head charged.
fn host_budgets(name: &str, limits: &HostLimits, pricing: &WirePricing) -> Arc<Budgets> {
    let budgets = Budgets::new(
        Limits::default(),
        Pricing {
            model: pricing.model.clone(),
            price: pricing
                .price
                .map(
                    |[input, output, cache_read, cache_write]| td_llm::prices::Price {
                        input,
                        output,
                        cache_read,
                        cache_write,
                    },
                ),
            max_output_tokens: pricing.max_output_tokens,
        },
        Carried::default(),
    );
    budgets.open_loop(
        name,
        Limits {
            iterations: limits.iterations,
            wall: limits.wall_ms.map(Duration::from_millis),
            soft_percent: limits.soft_percent,
            ..Limits::default()
        },
        Carried {
            iterations: limits.carried_iterations,
            wall: Duration::from_millis(limits.carried_wall_ms),
            ..Carried::default()
        },
    );
    budgets
}

/// Asks the head `make()` up to [`TRIES`] times (a lost answer, a busy head); the last
/// error when every try failed.
async fn ask_again<T: serde::de::DeserializeOwned>(
    link: &HeadLink,
    make: impl Fn() -> FromHost,
) -> Result<T, String> {
    let mut last = String::new();
    for attempt in 1..=TRIES {
        match link.ask(make(), REQUEST_TIMEOUT).await {
            Ok(answer) => return Ok(answer),
            Err(e) => last = e.to_string(),
        }
        if attempt < TRIES {
            tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
        }
    }
    Err(last)
}

/// A model client that asks the head, for one loop placed here.
struct RemoteLlm {
    link: HeadLink,
    /// An iteration's call waits for the checkpoints asked before it.
    checkpoints: Arc<Checkpoints>,
    /// The stop the head asked of the loop ([`Running::stop_asked`]).
    stop_asked: Arc<AtomicU8>,
}

#[async_trait]
impl LlmClient for RemoteLlm {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        if matches!(request.purpose, Purpose::Iteration) {
            // The last iteration's work is at the head before this one's first call: a move
            // resumes from exactly it (see `checkpoint`). Failing here stops the loop.
            self.checkpoints.wait().await.map_err(LlmError::Transport)?;
        }
        // Written once, without the tools (the head calls with its own copy of them).
        let body = RawJson::to(&Outgoing::of(request))
            .map_err(|e| LlmError::Transport(format!("cannot write the request: {e}")))?;
        let answer: CompleteAnswer = self
            .link
            .ask(
                FromHost::Complete {
                    loop_name: request.loop_name.to_string(),
                    request: body,
                },
                MODEL_TIMEOUT,
            )
            .await
            .map_err(|e| LlmError::Transport(format!("the head: {e}")))?;
        match answer {
            CompleteAnswer::Response { response } => response
                .parse()
                .map_err(|e| LlmError::BadReply(format!("the head's response: {e}"))),
            CompleteAnswer::OverBudget { reason } => Err(LlmError::OverBudget(reason)),
            // The head gave the call up because the loop is stopping (it says so only once
            // this host took the stop): the loop's stop ends the call here, as a head loop's
            // ends its call, not a model error (which would fail the loop instead).
            CompleteAnswer::Failed { kind, message, .. }
                if kind == td_cluster::protocol::GIVEN_UP_STOPPING
                    && self.stop_asked.load(Ordering::SeqCst) != 0 =>
            {
                tokio::time::sleep(STOPPING_GRACE).await;
                Err(LlmError::Transport(message))
            }
            CompleteAnswer::Failed {
                kind,
                status,
                message,
            } => Err(match (kind.as_str(), status) {
                ("api", Some(status)) => LlmError::Api { status, message },
                ("bad_reply", _) => LlmError::BadReply(message),
                ("script", _) => LlmError::Script(message),
                _ => LlmError::Transport(message),
            }),
        }
    }
}

/// What a loop records, on its way to the head.
enum Item {
    Event(RawJson),
    Transcript(RawJson),
    Receipt(RawJson),
    Flush(oneshot::Sender<Result<(), String>>),
    /// Iteration N's work, sent after the records before it and before those after it.
    Checkpoint(u32),
}

/// Sends one loop's records to the head in numbered batches, in order; once a batch could
/// not be delivered, the loop's record is unwritable (see the module doc).
#[derive(Clone)]
struct Streamer {
    tx: mpsc::UnboundedSender<Item>,
    failed: Arc<OnceLock<String>>,
}

impl Streamer {
    fn start(
        link: HeadLink,
        name: String,
        checkpoints: Arc<Checkpoints>,
        bundles: PathBuf,
    ) -> Streamer {
        let (tx, mut rx) = mpsc::unbounded_channel::<Item>();
        let failed: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
        let fail = failed.clone();
        tokio::spawn(async move {
            let mut batch = 0u64;
            let mut next: Option<Item> = None;
            loop {
                let first = match next.take() {
                    Some(item) => item,
                    None => match rx.recv().await {
                        Some(item) => item,
                        None => return,
                    },
                };
                let (mut events, mut transcript, mut receipts) =
                    (Vec::new(), Vec::new(), Vec::new());
                let mut flushes = Vec::new();
                let mut bytes = 0usize;
                // A checkpoint ends the batch: what comes after it goes after it.
                let mut take = |item: Item, bytes: &mut usize| -> Option<u32> {
                    match item {
                        Item::Event(v) => {
                            *bytes += v.get().len();
                            events.push(v);
                        }
                        Item::Transcript(v) => {
                            *bytes += v.get().len();
                            transcript.push(v);
                        }
                        Item::Receipt(v) => {
                            *bytes += v.get().len();
                            receipts.push(v);
                        }
                        Item::Flush(done) => flushes.push(done),
                        Item::Checkpoint(n) => return Some(n),
                    }
                    None
                };
                let mut flushing = matches!(first, Item::Flush(_));
                let mut checkpoint = take(first, &mut bytes);
                let mut count = 1usize;
                let linger = tokio::time::sleep(BATCH_LINGER);
                tokio::pin!(linger);
                while count < BATCH_ITEMS && bytes < BATCH_BYTES && checkpoint.is_none() {
                    let item = match rx.try_recv() {
                        Ok(item) => item,
                        Err(_) if flushing => break,
                        Err(_) => tokio::select! {
                            item = rx.recv() => match item {
                                Some(item) => item,
                                None => break,
                            },
                            () = &mut linger => break,
                        },
                    };
                    flushing |= matches!(item, Item::Flush(_));
                    checkpoint = take(item, &mut bytes);
                    count += 1;
                }
                let result = if let Some(why) = fail.get() {
                    Err(why.clone())
                } else if events.is_empty() && transcript.is_empty() && receipts.is_empty() {
                    Ok(())
                } else {
                    batch = batch.saturating_add(1);
                    let sent: Result<(), String> = ask_again(&link, || FromHost::Records {
                        loop_name: name.clone(),
                        batch,
                        events: events.clone(),
                        transcript: transcript.clone(),
                        receipts: receipts.clone(),
                    })
                    .await;
                    sent.map_err(|e| {
                        let why = format!("its records could not reach the head: {e}");
                        let _ = fail.set(why.clone());
                        why
                    })
                };
                let result = match (result, checkpoint) {
                    (Ok(()), Some(n)) => {
                        let made = checkpoints.make(&link, &name, n, &bundles).await;
                        made.map_err(|e| {
                            let why = format!(
                                "the work of its iteration {n} could not reach the head: {e}"
                            );
                            let _ = fail.set(why.clone());
                            why
                        })
                    }
                    (result, Some(n)) => {
                        // The records before it did not go: neither does it, and the loop's
                        // next call learns why.
                        checkpoints
                            .make_failed(n, result.as_ref().err().cloned().unwrap_or_default());
                        result
                    }
                    (result, None) => result,
                };
                for done in flushes {
                    let _ = done.send(result.clone());
                }
                next = None;
            }
        });
        Streamer { tx, failed }
    }

    fn send(&self, item: Item) {
        if self.failed.get().is_none() {
            let _ = self.tx.send(item);
        }
    }

    /// The text of a record `what` made for the head, or `None` when it could not be
    /// written: then, as when a batch cannot reach the head, the loop's record is
    /// unwritable and its end says why (never a record dropped without a word).
    fn written(&self, what: &str, made: Result<RawJson, serde_json::Error>) -> Option<RawJson> {
        written_or_failed(&self.failed, what, made)
    }

    /// Waits until everything sent so far reached the head; why not, when it did not.
    async fn flush(&self) -> Result<(), String> {
        if let Some(why) = self.failed.get() {
            return Err(why.clone());
        }
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Item::Flush(done))
            .map_err(|_| "its records' stream stopped".to_string())?;
        wait.await
            .unwrap_or_else(|_| Err("its records' stream stopped".to_string()))
    }
}

impl TranscriptSink for Streamer {
    fn record(&self, _loop_name: &str, entry: TranscriptEntry) {
        if let Some(raw) = self.written("transcript entry", RawJson::to(&entry)) {
            self.send(Item::Transcript(raw));
        }
    }

    fn unwritable(&self) -> Option<String> {
        self.failed.get().cloned()
    }

    fn write_failed(&self, what: String) {
        let _ = self.failed.set(what);
    }
}

/// The head's coordinator, as this host's runtime sees it: every call is a
/// [`FromHost::Coord`] request about one of this host's loops, with its placement's
/// attempt.
struct HeadUpstream {
    link: HeadLink,
    attempts: Attempts,
}

impl HeadUpstream {
    async fn ask<T: serde::de::DeserializeOwned>(
        &self,
        loop_name: &str,
        request: CoordRequest,
        timeout: Duration,
    ) -> Result<T, ToolError> {
        let attempt = lock(&self.attempts).get(loop_name).copied().unwrap_or(0);
        self.link
            .for_attempt(attempt)
            .ask(
                FromHost::Coord {
                    loop_name: loop_name.to_string(),
                    request,
                },
                timeout,
            )
            .await
            .map_err(|e| match e {
                // The head's own words (an unknown loop, a rate limit...), as a local loop
                // gets them.
                td_cluster::wire::AskError::Refused(message) => ToolError::Unavailable { message },
                other => ToolError::Unavailable {
                    message: format!(
                        "the head did not answer ({other}); it is not known whether this went through: try again later"
                    ),
                },
            })
    }
}

#[async_trait]
impl Upstream for HeadUpstream {
    async fn register(
        &self,
        name: &str,
        loop_type: &str,
        task: &str,
        subscriptions: Option<&[String]>,
    ) -> Result<(), ToolError> {
        let request = CoordRequest::Register {
            loop_type: loop_type.to_string(),
            task: task.to_string(),
            subscriptions: subscriptions.map(<[String]>::to_vec),
        };
        self.ask(name, request, UPSTREAM_TIMEOUT).await
    }

    async fn set_status(&self, name: &str, status: &str) -> Result<(), ToolError> {
        let request = CoordRequest::SetStatus {
            status: status.to_string(),
        };
        self.ask(name, request, UPSTREAM_TIMEOUT).await
    }

    async fn query(
        &self,
        from: &str,
        target: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<String, ToolError> {
        let request = CoordRequest::Query {
            target: target.to_string(),
            question: question.to_string(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        self.ask(from, request, timeout.saturating_add(QUERY_GRACE))
            .await
    }

    async fn share(
        &self,
        from: &str,
        targets: &[String],
        data_type: &str,
        data: Value,
    ) -> Result<Vec<Delivery>, ToolError> {
        let request = CoordRequest::Share {
            targets: targets.to_vec(),
            data_type: data_type.to_string(),
            data,
        };
        self.ask(from, request, UPSTREAM_TIMEOUT).await
    }

    async fn alert(
        &self,
        from: &str,
        event_type: &str,
        message: &str,
        data: Option<Value>,
        about: Option<&str>,
    ) -> Result<usize, ToolError> {
        if from == SYSTEM_SENDER && about.is_some() {
            // The head announces its hosts' loops' start and end itself and refuses a
            // host's system alert: not sent (it cost a refused request and a warning each).
            return Ok(0);
        }
        let request = CoordRequest::Alert {
            system: false,
            event_type: event_type.to_string(),
            message: message.to_string(),
            data,
        };
        self.ask(from, request, UPSTREAM_TIMEOUT).await
    }

    async fn list_loops(&self, from: &str) -> Result<Vec<LoopInfo>, ToolError> {
        self.ask(from, CoordRequest::List, UPSTREAM_TIMEOUT).await
    }

    async fn unregister(&self, name: &str) -> Result<(), ToolError> {
        self.ask(name, CoordRequest::Unregister, UPSTREAM_TIMEOUT)
            .await
    }
}

/// [`Streamer::written`] on the stream's failure: `made`'s text, or `None` with `failed`
/// set to why (the first failure stays: it is the one the loop's end reports).
fn written_or_failed(
    failed: &OnceLock<String>,
    what: &str,
    made: Result<RawJson, serde_json::Error>,
) -> Option<RawJson> {
    made.map_err(|e| {
        let _ = failed.set(format!("its {what} could not be written: {e}"));
    })
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_that_cannot_be_written_makes_the_loops_record_unwritable_not_lost() {
        let failed = OnceLock::new();
        let fine = written_or_failed(
            &failed,
            "receipt",
            RawJson::to(&serde_json::json!({"a": 1})),
        );
        assert_eq!(
            fine.map(|r| r.get().to_string()).as_deref(),
            Some(r#"{"a":1}"#)
        );
        assert!(failed.get().is_none());
        // JSON keys are strings: a map keyed by pairs cannot be written.
        let bad: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into_iter().collect();
        assert!(written_or_failed(&failed, "transcript entry", RawJson::to(&bad)).is_none());
        let why = failed.get().cloned().unwrap_or_default();
        assert!(
            why.starts_with("its transcript entry could not be written: ") && why.contains("key"),
            "{why}"
        );
        // The first failure is the one reported.
        assert!(written_or_failed(&failed, "receipt", RawJson::to(&bad)).is_none());
        assert_eq!(failed.get(), Some(&why));
    }
}
