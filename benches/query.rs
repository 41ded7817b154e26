//! `cargo bench --bench query`: `query_loop` between loop actors vs a plain ractor call.
//!
//! Latency: loop `a` asks loop `b` (both real loop actors on a `Runtime`, scripted provider,
//! their engines parked at the start gate so nothing else runs). Measured, alternating in
//! the same task, sample by sample, in 7 rounds (medians over rounds reported); each round
//! is 4,000 port/echo pairs, then 4,000 tool/echo pairs, then 4,000 (tool, receipt made)/echo pairs:
//! - `port`: `CoordinatorPort::query` (what the `query_loop` tool calls): asker → coordinator
//!   (checks, records, hands back the target's answerer) → the target's answer (prompt,
//!   scripted model call) run in the asker's task under its deadline;
//! - `tool`: the whole `query_loop` tool as a loop calls it, through its `CallPath` (route,
//!   schema validation, the registry's guards; the bench's loops keep no receipt log, so the
//!   receipt is not made) on top of the same route, and the same with each call's receipt
//!   made (read) in the timed part, as for a loop that keeps a log (the write excluded);
//! - baseline: `ActorRef::call` to an echo actor that returns the question.
//!
//! Run on a current-thread runtime (what the code costs) and on the multi-threaded one the
//! daemon uses; the driver yields before every timed call (see [`settle`]).
//!
//! Throughput: 1,000 loops registered; one task per loop (a loop's engine asks one question
//! at a time) calls `CoordinatorPort::query` to a random other loop, back to back. Counted:
//! answered queries (Ok replies) per second over a timed window. Reference in the same run:
//! 1,000 tasks calling one echo actor. Rounds alternate ours/echo; medians are reported.
//! Rate limits are lifted (`CoordinatorLimits` burst and rate set very high) because the
//! default 10 messages/s per loop would refuse almost every query: the bench measures
//! routing capacity, not the limiter.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::actors::{
    Dist, LoopParams, Rng, loop_spec, median_f64, print_machine, unlimited_runtime,
};
use common::{Report, selected};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::json;
use td_llm::scripted::ScriptedLlm;
use td_protocol::events::EventLog;
use td_runtime::coordinator::CoordinatorPort;
use td_runtime::daemon::Runtime;
use td_toolkit::call_path::CallPath;
use td_toolkit::coordination::Coordination;

const QUESTION: &str = "Which port does the api listen on?";
const ANSWER: &str = "8080";
const TIMEOUT: Duration = Duration::from_secs(30);

struct Echo;

struct Ask(String, RpcReplyPort<String>);
impl ractor::Message for Ask {}

impl Actor for Echo {
    type Msg = Ask;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<Ask>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<Ask>,
        Ask(question, reply): Ask,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let _ = reply.send(question);
        Ok(())
    }
}

async fn echo_call(echo: &ActorRef<Ask>) -> String {
    match echo
        .call(|port| Ask(QUESTION.to_string(), port), None)
        .await
    {
        Ok(ractor::rpc::CallResult::Success(s)) => s,
        other => panic!("echo failed: {other:?}"),
    }
}

/// A runtime with `names` registered as loops (engines parked at the gate), all answering
/// every question with [`ANSWER`].
async fn start_loops(dir: &Path, names: &[String]) -> Runtime {
    let mut script = String::new();
    for n in names {
        script.push_str(&format!("{n}:\n  answers:\n    - reply: \"{ANSWER}\"\n"));
    }
    let llm = Arc::new(ScriptedLlm::from_yaml(&script, "bench-script.yml").expect("script"));
    let events = Arc::new(EventLog::new());
    // Queries touch no files; 1,000 idle inotify watches would only slow the setup.
    let mut rt = unlimited_runtime(false, events.clone()).await;
    for n in names {
        let wt = dir.join(n);
        std::fs::create_dir_all(&wt).expect("worktree");
        let spec = loop_spec(
            &rt,
            LoopParams {
                name: n,
                worktree: &wt,
                max_iterations: 1,
                subscriptions: Some(Vec::new()),
            },
            llm.clone(),
            events.clone(),
            None,
        );
        rt.spawn_loop(spec).await.expect("spawn");
    }
    // The gate is never released: the loops only answer questions.
    rt.flush().await;
    rt
}

/// Lets the driver start each sample from the same scheduler state. tokio polls at most 3
/// woken tasks in a row from a worker's LIFO slot; a ping-pong of calls (driver → actor →
/// driver → actor ...) otherwise runs into that limit at the same place in every cycle, and
/// the hop that lands there is queued and stolen by the other worker: one of the two
/// alternating calls then pays a cross-thread wake every time and the other never does,
/// and which one depends on the run. Yielding outside the timed part resets the streak.
async fn settle() {
    tokio::task::yield_now().await;
}

/// What the latency part measures: loops `a` and `b` on a runtime, `a`'s port and call
/// path, and the echo actor.
struct Rig {
    _dir: tempfile::TempDir,
    rt: Runtime,
    port: Arc<CoordinatorPort>,
    calls: CallPath,
    echo: ActorRef<Ask>,
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    let names = vec!["a".to_string(), "b".to_string()];
    let rt = start_loops(dir.path(), &names).await;
    let port = Arc::new(CoordinatorPort::new(rt.coordinator.clone()));
    let ctx_a = Arc::new(rt.context(&dir.path().join("a"), "a").expect("ctx"));
    let tools = Arc::new(td_tools::tool_set(&["query_loop"]).expect("tools"));
    let calls = CallPath::new(ctx_a, tools, Arc::new(rt.lanes.clone()), None);
    let (echo, _) = Actor::spawn(None, Echo, ()).await.expect("echo");
    Rig {
        _dir: dir,
        rt,
        port,
        calls,
        echo,
    }
}

/// `BENCH_CALLS=KIND:N` (KIND `port`, `tool`, `tool-receipt` or `echo`): the latency part's
/// setup, then `N` calls of one kind on the current-thread runtime, and no report but their
/// mean wall time. `tool-receipt` is `tool` with each call's receipt made (read), as a loop
/// that keeps a receipt log makes it (the write itself excluded). For counting instructions:
/// run it under `valgrind --tool=callgrind` with two values of `N`; the difference of the two
/// totals over the difference of `N` is what one call costs, setup and shutdown excluded
/// (see BENCHMARKS.md).
async fn calls_only(kind: &str, n: usize) {
    let Rig {
        _dir,
        rt,
        port,
        calls,
        echo,
    } = rig().await;
    // Shared, as a loop's conversation shares each call's input with the call.
    let input = Arc::new(json!({"target_exec_id": "b", "question": QUESTION}));
    let asker: Arc<str> = Arc::from("a");
    let started = Instant::now();
    for _ in 0..n {
        settle().await;
        match kind {
            "port" => {
                let answer = port.query(&asker, "b", QUESTION, TIMEOUT).await;
                assert_eq!(answer.as_deref().ok(), Some(ANSWER), "{answer:?}");
            }
            "tool" => {
                let input = Arc::clone(&input);
                let out = calls.call(Some("q"), "query_loop", input).await.outcome;
                assert!(!out.is_error, "{}", out.content);
            }
            "tool-receipt" => {
                let input = Arc::clone(&input);
                let out = calls.call(Some("q"), "query_loop", input).await.outcome;
                assert!(!out.is_error, "{}", out.content);
                assert!(out.receipt.input_hash.starts_with("sha256:"));
            }
            "echo" => assert_eq!(echo_call(&echo).await, QUESTION),
            other => {
                panic!("BENCH_CALLS: unknown kind '{other}' (port, tool, tool-receipt or echo)")
            }
        }
    }
    eprintln!(
        "# {kind}: {n} calls, {:.0} ns each (with a yield before each)",
        started.elapsed().as_nanos() as f64 / n.max(1) as f64
    );
    echo.stop(None);
    rt.shutdown().await;
}

async fn latency(report: &mut Report, runtime: &str) {
    let Rig {
        _dir,
        rt,
        port,
        calls,
        echo,
    } = rig().await;

    // Rounds of alternating samples; each metric is the median over rounds of the round's
    // percentile, so that one unlucky stretch (the machine is shared) moves neither side much.
    const WARMUP: usize = 2_000;
    const ROUNDS: usize = 7;
    const PER_ROUND: usize = 4_000;
    // Each round: a block of port/echo pairs, then a block of tool/echo pairs (the two
    // variants were kept apart when the tool armed a timer per call, which disturbed the
    // samples around it; kept so that figures stay comparable).
    let driver = tokio::spawn(async move {
        // Shared, as a loop's conversation shares each call's input with the call.
        let input = Arc::new(json!({"target_exec_id": "b", "question": QUESTION}));
        // The asker's name as its context shares it (see `Coordination::query`).
        let asker: Arc<str> = Arc::from("a");
        let mut rounds = Vec::new();
        for round in 0..=ROUNDS {
            let n = if round == 0 { WARMUP } else { PER_ROUND };
            let (mut ours, mut base_ours) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for _ in 0..n {
                settle().await;
                let t = Instant::now();
                let answer = port.query(&asker, "b", QUESTION, TIMEOUT).await;
                ours.push(t.elapsed());
                assert_eq!(answer.as_deref().ok(), Some(ANSWER), "{answer:?}");

                settle().await;
                let t = Instant::now();
                let echoed = echo_call(&echo).await;
                base_ours.push(t.elapsed());
                assert_eq!(echoed, QUESTION);
            }
            let (mut tool, mut base_tool) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for _ in 0..n {
                settle().await;
                let t = Instant::now();
                let out = calls
                    .call(Some("q"), "query_loop", Arc::clone(&input))
                    .await
                    .outcome;
                tool.push(t.elapsed());
                assert!(!out.is_error, "{}", out.content);

                settle().await;
                let t = Instant::now();
                let echoed = echo_call(&echo).await;
                base_tool.push(t.elapsed());
                assert_eq!(echoed, QUESTION);
            }
            // The tool again, each call's receipt made (read) in the timed part, as it is
            // for a loop that keeps a receipt log (the log's write excluded).
            let (mut made, mut base_made) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for _ in 0..n {
                settle().await;
                let t = Instant::now();
                let out = calls
                    .call(Some("q"), "query_loop", Arc::clone(&input))
                    .await
                    .outcome;
                let hashed = out.receipt.input_hash.starts_with("sha256:");
                made.push(t.elapsed());
                assert!(!out.is_error && hashed, "{}", out.content);

                settle().await;
                let t = Instant::now();
                let echoed = echo_call(&echo).await;
                base_made.push(t.elapsed());
                assert_eq!(echoed, QUESTION);
            }
            if round > 0 {
                rounds.push([
                    Dist::new(&ours),
                    Dist::new(&base_ours),
                    Dist::new(&tool),
                    Dist::new(&base_tool),
                    Dist::new(&made),
                    Dist::new(&base_made),
                ]);
            }
        }
        echo.stop(None);
        rounds
    });
    let rounds = driver.await.expect("driver");
    for (i, [o, bo, t, bt, m, bm]) in rounds.iter().enumerate() {
        eprintln!(
            "# {runtime}, round {}: p50 port {:.2} / echo {:.2}, tool {:.2} / echo {:.2}, tool with receipt {:.2} / echo {:.2} us; p99 port {:.2} / echo {:.2}, tool {:.2} / echo {:.2} us",
            i + 1,
            o.p50(),
            bo.p50(),
            t.p50(),
            bt.p50(),
            m.p50(),
            bm.p50(),
            o.p99(),
            bo.p99(),
            t.p99(),
            bt.p99()
        );
    }
    // Each figure is the median over rounds; the ratio that is judged is the median of the
    // per-round ratios (both sides of a ratio were measured in the same stretch of time).
    let med = |f: &dyn Fn(&[Dist; 6]) -> f64| median_f64(&rounds.iter().map(f).collect::<Vec<_>>());
    eprintln!(
        "# latency ({runtime}): {ROUNDS} rounds of {PER_ROUND} pairs each, alternating; medians over rounds"
    );
    let p50_ratio = med(&|r| r[0].p50() / r[1].p50());
    let worst_ratio = rounds
        .iter()
        .map(|r| r[0].p50() / r[1].p50())
        .fold(f64::MIN, f64::max);
    report.row(
        &format!("round_trip_p50 (port, {runtime})"),
        "us",
        med(&|r| r[0].p50()),
        Some(med(&|r| r[1].p50())),
        "median round ratio <= 4",
        Some(p50_ratio <= 4.0),
    );
    report.row(
        &format!("round_trip_p50 ratio (port, {runtime})"),
        "x",
        p50_ratio,
        None,
        &format!("<= 4 (worst round {worst_ratio:.2})"),
        Some(p50_ratio <= 4.0),
    );
    report.row(
        &format!("round_trip_p99 (port, {runtime})"),
        "us",
        med(&|r| r[0].p99()),
        Some(med(&|r| r[1].p99())),
        "(reported)",
        None,
    );
    let tool_ratio = med(&|r| r[2].p50() / r[3].p50());
    let tool_worst = rounds
        .iter()
        .map(|r| r[2].p50() / r[3].p50())
        .fold(f64::MIN, f64::max);
    report.row(
        &format!("round_trip_p50 (query_loop tool, {runtime})"),
        "us",
        med(&|r| r[2].p50()),
        Some(med(&|r| r[3].p50())),
        "median round ratio <= 4",
        Some(tool_ratio <= 4.0),
    );
    report.row(
        &format!("round_trip_p50 ratio (query_loop tool, {runtime})"),
        "x",
        tool_ratio,
        None,
        &format!("<= 4 (worst round {tool_worst:.2})"),
        Some(tool_ratio <= 4.0),
    );
    let made_ratio = med(&|r| r[4].p50() / r[5].p50());
    report.row(
        &format!("round_trip_p50 ratio (query_loop tool, receipt made, {runtime})"),
        "x",
        made_ratio,
        None,
        "<= 4 (as a loop that keeps a receipt log calls it)",
        Some(made_ratio <= 4.0),
    );
    report.row(
        &format!("round_trip_p99 (query_loop tool, {runtime})"),
        "us",
        med(&|r| r[2].p99()),
        Some(med(&|r| r[3].p99())),
        "(reported)",
        None,
    );
    rt.shutdown().await;
}

/// Runs `tasks` drivers for `window`; each repeats `op` until the window closes. Returns
/// successful operations per second and the number of failures.
async fn timed_round<F, Fut>(tasks: usize, window: Duration, op: F) -> (f64, u64)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (op, stop, done, failed) = (op.clone(), stop.clone(), done.clone(), failed.clone());
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ok = op(t, n).await;
                n += 1;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    for h in handles {
        let _ = h.await;
    }
    (
        done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        failed.load(Ordering::Relaxed),
    )
}

async fn throughput(report: &mut Report) {
    const LOOPS: usize = 1_000;
    const ROUNDS: usize = 3;
    let window = Duration::from_secs(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let names: Vec<String> = (0..LOOPS).map(|i| format!("l{i:04}")).collect();
    let t = Instant::now();
    let rt = start_loops(dir.path(), &names).await;
    eprintln!(
        "# throughput: {LOOPS} loops registered in {:?}",
        t.elapsed()
    );
    // Shared names, as a loop's context holds its own (`query` keeps the asker's uncopied).
    let names: Arc<Vec<Arc<str>>> = Arc::new(names.iter().map(|n| Arc::from(n.as_str())).collect());
    let port = Arc::new(CoordinatorPort::new(rt.coordinator.clone()));
    let (echo, _) = Actor::spawn(None, Echo, ()).await.expect("echo");

    let mut ours = Vec::new();
    let mut base = Vec::new();
    let mut failures = 0;
    // A short warm-up round of each, not counted.
    for round in 0..=ROUNDS {
        let w = if round == 0 {
            Duration::from_millis(300)
        } else {
            window
        };
        let (names, port) = (names.clone(), port.clone());
        let (qps, failed) = timed_round(LOOPS, w, move |t, n| {
            let (names, port) = (names.clone(), port.clone());
            async move {
                let mut rng = Rng::new((t as u64) << 32 | n);
                let mut target = rng.below(LOOPS - 1);
                if target >= t {
                    target += 1;
                }
                port.query(&names[t], &names[target], QUESTION, TIMEOUT)
                    .await
                    .is_ok_and(|a| a == ANSWER)
            }
        })
        .await;
        let e = echo.clone();
        let (eps, _) = timed_round(LOOPS, w, move |_, _| {
            let e = e.clone();
            async move { echo_call(&e).await == QUESTION }
        })
        .await;
        if round > 0 {
            ours.push(qps);
            base.push(eps);
            failures += failed;
        }
        eprintln!("# round {round}: ours {qps:.0}/s (failed {failed}), echo {eps:.0}/s");
    }
    let q = median_f64(&ours);
    report.row(
        "answered_queries_per_s (1000 loops)",
        "1/s",
        q,
        Some(median_f64(&base)),
        ">= 50000",
        Some(q >= 50_000.0 && failures == 0),
    );
    if failures > 0 {
        eprintln!("# {failures} queries failed during the measured rounds");
    }
    echo.stop(None);
    rt.shutdown().await;
}

fn main() {
    if let Ok(spec) = std::env::var("BENCH_CALLS") {
        let (kind, n) = spec
            .split_once(':')
            .and_then(|(k, n)| Some((k.to_string(), n.parse::<usize>().ok()?)))
            .expect("BENCH_CALLS=KIND:N (KIND port, tool, tool-receipt or echo)");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio")
            .block_on(calls_only(&kind, n));
        return;
    }
    print_machine("query");
    // `BENCH_ONLY=latency` (or `1 thread`, `multi-thread`, `throughput`) runs one part only.
    let mut report = Report::new("query");
    {
        // On one thread both sides cost what their code costs. On the multi-threaded
        // runtime the daemon uses, a call is ~0.7 us or ~4 us depending on whether tokio
        // happens to run caller and callee on the same worker, and that placement (not our
        // code) decides the ratio of a run; both are reported.
        let current = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio");
        if selected("latency, 1 thread") {
            current.block_on(latency(&mut report, "1 thread"));
        }
        drop(current);
        let multi = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio");
        if selected("latency, multi-thread") {
            multi.block_on(latency(&mut report, "multi-thread"));
        }
    }
    if selected("throughput") {
        let multi = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio");
        multi.block_on(throughput(&mut report));
    }
    report.finish();
}
