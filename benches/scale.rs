//! `cargo bench --bench scale`: 1,000 and 10,000 loops on the scripted provider.
//!
//! Each loop (a `ralph` loop with its own worktree, context and tool set, as `taskdaemon run`
//! builds them, minus git and the run record) runs 3 iterations; each iteration is one
//! model turn calling `write_file`, `read_file`, `edit_file` and `grep` on a file of its own
//! (iteration 1 also calls `query_loop` to another loop, which answers from its script;
//! iteration 3 ends with `complete_task`), then a text-only turn. Loops hear no alerts
//! (`subscriptions: []`): with the default (every alert) each of N loops receives the
//! "loop started" alert of every other one, N² inbox items (see the `alerts` run below).
//!
//! Every configuration runs in a fresh child process (this binary re-executed with
//! `--child`), so one run's freed memory cannot hide the next one's growth. Measured:
//! - wall time from the first `spawn_loop` until every loop reported its end;
//! - the daemon's baseline RSS (`VmRSS` after the runtime started, the script was parsed and
//!   the worktrees were created), then the peak (`VmHWM`, reset to the baseline before the
//!   loops start) and (peak − baseline) / loops;
//! - baseline for the wall time, in the same run: the same 12 file-tool calls per loop made
//!   directly with `ToolSet::call` from one tokio task per loop (no actors, no engine, no
//!   model, no query): the floor of the useful work.
//!
//! Options (after `--`): `--sizes 1000,10000` (default), `--no-watch-10k` to skip the
//! 10,000-loop run with file watching.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Report;
use common::actors::{LoopParams, loop_spec, print_machine, proc_status_kb, reset_peak_rss};
use serde_json::{Value, json};
use td_engine::LoopEnd;
use td_llm::scripted::ScriptedLlm;
use td_protocol::events::EventLog;
use td_runtime::daemon::{Runtime, RuntimeConfig};
use td_toolkit::context::ToolContext;

const ITERATIONS: u32 = 3;
const WAIT: Duration = Duration::from_secs(1_800);

fn name(i: usize) -> String {
    format!("l{i:05}")
}

/// The file-tool calls of iteration `it` (1-based), as (tool, input).
fn file_calls(it: u32) -> Vec<(&'static str, Value)> {
    let path = format!("notes/it{it}.txt");
    vec![
        (
            "write_file",
            json!({"path": path, "content": format!("alpha {it}\nbeta\ndelta\n")}),
        ),
        ("read_file", json!({"path": path})),
        (
            "edit_file",
            json!({"path": path, "old_string": "beta", "new_string": format!("gamma {it}")}),
        ),
        ("grep", json!({"pattern": "gamma|fn ", "path": "."})),
    ]
}

/// The scripted turns of loop `i` of `n`, as YAML.
fn script_of(i: usize, n: usize) -> String {
    let target = name((i * 7919 + 1) % n);
    let target = if target == name(i) {
        name((i + 1) % n)
    } else {
        target
    };
    let mut s = format!("{}:\n  turns:\n", name(i));
    for it in 1..=ITERATIONS {
        s.push_str("    - calls:\n");
        for (tool, input) in file_calls(it) {
            s.push_str(&format!("        - {tool}: {input}\n"));
        }
        if it == 1 {
            s.push_str(&format!(
                "        - query_loop: {{target_exec_id: {target}, question: \"What is your status?\"}}\n"
            ));
        }
        if it == ITERATIONS {
            s.push_str("        - complete_task: {summary: \"done\"}\n");
        } else {
            s.push_str("    - say: \"iteration done\"\n");
        }
    }
    s.push_str("  answers:\n    - reply: \"status: fine\"\n");
    s
}

fn make_worktrees(base: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let wt = base.join(name(i));
            std::fs::create_dir_all(wt.join("src")).expect("worktree");
            std::fs::write(
                wt.join("src/lib.rs"),
                "pub fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n",
            )
            .expect("seed file");
            wt
        })
        .collect()
}

/// One measured configuration, in this (child) process. Prints one JSON result line.
async fn child_loops(n: usize, watch: bool, alerts: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().canonicalize().expect("canonical");
    let worktrees = make_worktrees(&base, n);
    let script: String = (0..n).map(|i| script_of(i, n)).collect();
    let llm = Arc::new(ScriptedLlm::from_yaml(&script, "scale-script.yml").expect("script"));
    drop(script);
    let events = Arc::new(EventLog::new());
    let counted = Arc::new(AtomicU64::new(0));
    {
        let c = counted.clone();
        events.subscribe(move |_| {
            c.fetch_add(1, Ordering::Relaxed);
        });
    }
    let mut rt = Runtime::start(
        RuntimeConfig {
            watch_files: watch,
            ..RuntimeConfig::default()
        },
        events.clone(),
    )
    .await
    .expect("runtime");
    let baseline_kb = proc_status_kb("VmRSS").unwrap_or(0);
    let reset = reset_peak_rss();

    let started = Instant::now();
    let mut names = Vec::with_capacity(n);
    for (i, wt) in worktrees.iter().enumerate() {
        let nm = name(i);
        let spec = loop_spec(
            &rt,
            LoopParams {
                name: &nm,
                worktree: wt,
                max_iterations: ITERATIONS,
                subscriptions: if alerts { None } else { Some(Vec::new()) },
            },
            llm.clone(),
            events.clone(),
            None,
        );
        rt.spawn_loop(spec).await.expect("spawn");
        names.push(nm);
    }
    let spawned = started.elapsed();
    let spawned_kb = proc_status_kb("VmRSS").unwrap_or(0);
    rt.release().await;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let ends = rt.wait_for(&refs, WAIT).await;
    let wall = started.elapsed();
    let peak_kb = proc_status_kb("VmHWM").unwrap_or(0);
    let completed = ends
        .values()
        .filter(|e| {
            matches!(
                e,
                LoopEnd::Completed {
                    iterations: ITERATIONS,
                    ..
                }
            )
        })
        .count();
    if let Some((nm, end)) = ends
        .iter()
        .find(|(_, e)| !matches!(e, LoopEnd::Completed { .. }))
    {
        eprintln!("# first loop that did not complete: {nm}: {end:?}");
    }
    let end_kb = proc_status_kb("VmRSS").unwrap_or(0);
    // SAFETY: malloc_trim only hands free heap pages back to the OS.
    unsafe { libc::malloc_trim(0) };
    let trimmed_kb = proc_status_kb("VmRSS").unwrap_or(0);
    let result = json!({
        "mode": "loops", "loops": n, "watch": watch, "alerts": alerts,
        "wall_s": wall.as_secs_f64(), "spawn_s": spawned.as_secs_f64(),
        "ended": ends.len(), "completed": completed,
        "baseline_kb": baseline_kb, "peak_kb": peak_kb, "peak_reset": reset,
        "spawned_kb": spawned_kb, "end_kb": end_kb,
        "threads": proc_status_kb("Threads").unwrap_or(0),
        "trimmed_kb": trimmed_kb,
        "events": counted.load(Ordering::Relaxed),
    });
    println!("RESULT {result}");
    eprintln!("# {result}");
    rt.shutdown().await;
}

/// The floor: the same file-tool calls, directly, one task per loop.
async fn child_direct(n: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().canonicalize().expect("canonical");
    let worktrees = make_worktrees(&base, n);
    let tools = Arc::new(
        td_tools::tool_set(&["write_file", "read_file", "edit_file", "grep"]).expect("tools"),
    );
    let started = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for (i, wt) in worktrees.into_iter().enumerate() {
        let tools = tools.clone();
        handles.push(tokio::spawn(async move {
            let ctx = ToolContext::new(&wt, name(i)).expect("ctx");
            let mut ok = true;
            for it in 1..=ITERATIONS {
                for (tool, input) in file_calls(it) {
                    ok &= !tools.call(&ctx, None, tool, input).await.is_error;
                }
            }
            ok
        }));
    }
    let mut ok = 0;
    for h in handles {
        ok += usize::from(h.await.unwrap_or(false));
    }
    let wall = started.elapsed();
    let result = json!({"mode": "direct", "loops": n, "wall_s": wall.as_secs_f64(), "ok": ok});
    println!("RESULT {result}");
}

/// Runs this binary as a child with `args` and returns its RESULT line.
fn run_child(args: &[String]) -> Option<Value> {
    let exe = std::env::current_exe().ok()?;
    eprintln!("# child: {}", args.join(" "));
    let out = Command::new(exe)
        .arg("--child")
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("# child {} failed: {}", args.join(" "), out.status);
        return None;
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix("RESULT "))?;
    serde_json::from_str(line).ok()
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn parent(args: &[String]) {
    print_machine("scale");
    let mut sizes = vec![1_000usize, 10_000];
    let mut watch_10k = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sizes" => {
                if let Some(list) = it.next() {
                    sizes = list.split(',').filter_map(|s| s.parse().ok()).collect();
                }
            }
            "--no-watch-10k" => watch_10k = false,
            _ => {}
        }
    }
    let mut report = Report::new("scale");
    for &n in &sizes {
        let mut configs = vec![(false, false)];
        if n < 10_000 || watch_10k {
            configs.insert(0, (true, false));
        }
        if n <= 1_000 {
            configs.push((true, true));
        }
        for (watch, alerts) in configs {
            // The floor first, then ours, each in a fresh process.
            let direct = run_child(&["direct".into(), n.to_string()]);
            let ours = run_child(&[
                "loops".into(),
                n.to_string(),
                watch.to_string(),
                alerts.to_string(),
            ]);
            let label = format!(
                "{n} loops, watch {}{}",
                if watch { "on" } else { "off" },
                if alerts { ", all alerts" } else { "" }
            );
            let Some(r) = ours else {
                report.row(
                    &format!("{label}: finished"),
                    "bool",
                    0.0,
                    None,
                    "all",
                    Some(false),
                );
                continue;
            };
            let completed = f(&r, "completed");
            let all = completed == n as f64;
            report.row(
                &format!("{label}: completed"),
                "loops",
                completed,
                None,
                "all",
                Some(all),
            );
            let wall = f(&r, "wall_s");
            let floor = direct.as_ref().map(|d| f(d, "wall_s"));
            let wall_target = if n == 1_000 { "< 10 s" } else { "(reported)" };
            let wall_met = (n == 1_000).then_some(wall < 10.0);
            report.row(
                &format!("{label}: wall"),
                "s",
                wall,
                floor,
                wall_target,
                wall_met,
            );
            report.row(
                &format!("{label}: spawn"),
                "s",
                f(&r, "spawn_s"),
                None,
                "(reported)",
                None,
            );
            let base_kb = f(&r, "baseline_kb");
            let peak_kb = f(&r, "peak_kb");
            report.row(
                &format!("{label}: peak RSS"),
                "MB",
                peak_kb / 1024.0,
                Some(base_kb / 1024.0),
                "(baseline = daemon before loops)",
                None,
            );
            let per_loop = (peak_kb - base_kb) / n as f64;
            report.row(
                &format!("{label}: RSS per loop"),
                "KB",
                per_loop,
                None,
                "<= 100 KB",
                Some(per_loop <= 100.0),
            );
            if r.get("peak_reset") != Some(&Value::Bool(true)) {
                eprintln!("# note: VmHWM could not be reset; the peak includes the setup");
            }
        }
    }
    report.finish();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("--child") {
        // `cargo bench` passes `--bench`; ignore anything we do not know.
        parent(&args);
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1_000);
    match args.get(1).map(String::as_str) {
        Some("direct") => rt.block_on(child_direct(n)),
        Some("loops") => {
            let watch = args.get(3).is_none_or(|s| s == "true");
            let alerts = args.get(4).is_some_and(|s| s == "true");
            rt.block_on(child_loops(n, watch, alerts));
        }
        other => eprintln!("unknown child mode {other:?}"),
    }
}
