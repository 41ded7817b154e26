//! Shared by the actor benches (`query`, `lane`, `watcher`, `scale`): latency statistics,
//! `/proc/self/status` memory readings, a tiny deterministic RNG, and a helper that builds
//! loops on the `Runtime` the way `taskdaemon run` does (minus git worktrees and the run
//! record).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use td_engine::transcript::{NoTranscript, TranscriptSink};
use td_engine::{EngineConfig, prompt};
use td_llm::LlmClient;
use td_protocol::events::EventLog;
use td_runtime::coordinator::CoordinatorLimits;
use td_runtime::daemon::{Runtime, RuntimeConfig};
use td_runtime::loop_actor::LoopSpec;
use td_toolkit::catalog::default_tool_set;

/// A runtime whose coordinator never refuses (a bench measures routing, not the rate
/// limiter), with or without file watching.
pub async fn unlimited_runtime(watch_files: bool, events: Arc<EventLog>) -> Runtime {
    let limits = CoordinatorLimits {
        burst: u32::MAX,
        per_second: 1e12,
        ..CoordinatorLimits::default()
    };
    let config = RuntimeConfig {
        limits,
        watch_files,
        ..RuntimeConfig::default()
    };
    Runtime::start(config, events).await.expect("runtime")
}

/// Percentiles of a sample of durations (nanoseconds).
#[derive(Debug, Clone)]
pub struct Dist {
    sorted: Vec<u64>,
}

impl Dist {
    /// From raw samples.
    pub fn new(samples: &[Duration]) -> Self {
        let mut sorted: Vec<u64> = samples.iter().map(|d| d.as_nanos() as u64).collect();
        sorted.sort_unstable();
        Self { sorted }
    }

    /// The `q` quantile (0..=1), nearest rank, in microseconds.
    pub fn q_us(&self, q: f64) -> f64 {
        if self.sorted.is_empty() {
            return f64::NAN;
        }
        let rank = ((self.sorted.len() as f64 * q).ceil() as usize).clamp(1, self.sorted.len());
        self.sorted[rank - 1] as f64 / 1_000.0
    }

    /// Median in µs.
    pub fn p50(&self) -> f64 {
        self.q_us(0.50)
    }

    /// 99th percentile in µs.
    pub fn p99(&self) -> f64 {
        self.q_us(0.99)
    }

    /// Sample count.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }
}

/// Median of a few numbers (rounds of a throughput run).
pub fn median_f64(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// A field of `/proc/self/status` in kB (`VmRSS`, `VmHWM`...), when the platform has it.
pub fn proc_status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// Resets the peak resident size (`VmHWM`) to the current one (Linux ≥ 4.0). Returns whether
/// it worked.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A small xorshift generator: deterministic runs without a `rand` dependency.
pub struct Rng(u64);

impl Rng {
    /// Seeded generator (0 is replaced by a fixed odd seed).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// What a bench loop looks like.
pub struct LoopParams<'a> {
    /// Loop name (exec id).
    pub name: &'a str,
    /// Its worktree (must exist).
    pub worktree: &'a Path,
    /// Iterations before it fails.
    pub max_iterations: u32,
    /// Alert event types it hears (`None` = all, the config default).
    pub subscriptions: Option<Vec<String>>,
}

/// Builds a loop spec as the orchestrator does for a `ralph` loop: its own context connected
/// to the coordinator, its own `ToolSet` from the loop type's default tool names, the lanes as
/// runner. Events go to `events`, transcripts to `transcript` (or nowhere), no receipts.
pub fn loop_spec(
    rt: &Runtime,
    p: LoopParams<'_>,
    llm: Arc<dyn LlmClient>,
    events: Arc<EventLog>,
    transcript: Option<Arc<dyn TranscriptSink>>,
) -> LoopSpec {
    let ctx = rt.context(p.worktree, p.name).expect("worktree exists");
    let names = default_tool_set("ralph").expect("ralph is a built-in loop type");
    let tools = td_tools::tool_set(&names).expect("built-in tools");
    LoopSpec {
        config: EngineConfig {
            name: p.name.to_string(),
            loop_type: "ralph".to_string(),
            task: format!("Bench task of {}", p.name),
            max_iterations: p.max_iterations,
            max_turns: 10,
            iteration_timeout: None,
            success_code: 0,
            system_template: prompt::DEFAULT_SYSTEM.to_string(),
            iteration_template: prompt::DEFAULT_ITERATION.to_string(),
            peers: Vec::new(),
            first_iteration: 1,
        },
        ctx: Arc::new(ctx),
        tools: Arc::new(tools),
        validation_tools: Arc::new(td_tools::tool_set(&["validate"]).expect("built-in tools")),
        llm,
        runner: Arc::new(rt.lanes.clone()),
        coordinator: rt.coordinator.clone(),
        events,
        transcript: transcript.unwrap_or_else(|| Arc::new(NoTranscript)),
        receipts: None,
        subscriptions: p.subscriptions,
        ended: None,
        gate: None,
        initial_inbox: Vec::new(),
        initial_progress: Vec::new(),
        announced: false,
        budgets: td_engine::budget::Budgets::unlimited(),
    }
}

/// The machine line every bench prints first: cores and kernel limits that matter here.
pub fn print_machine(bench: &str) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".to_string())
    };
    let nofile = {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct we pass.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
        if ok {
            format!("{}/{}", lim.rlim_cur, lim.rlim_max)
        } else {
            "?".to_string()
        }
    };
    eprintln!(
        "# {bench}: {cores} cores; inotify max_user_watches={} max_user_instances={}; ulimit -n (soft/hard)={nofile}",
        read("/proc/sys/fs/inotify/max_user_watches"),
        read("/proc/sys/fs/inotify/max_user_instances"),
    );
}
