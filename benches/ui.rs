//! `cargo bench --bench ui`: the dashboard with 1,000 scripted loops open in headless Chromium.
//!
//! Each round runs the same scripted run (the real binary, the scripted provider) three
//! times, the order rotating every round so that a noisy spell of the machine hits each:
//! - `plain`: `taskdaemon run`, no dashboard;
//! - `open`: `taskdaemon run --ui --ui-port 0` with the page open in headless Chromium;
//! - `closed`: `taskdaemon run --ui --ui-port 0`, no browser (the server alone).
//!
//! The run: a `gate` loop whose command waits for a flag file, and N loops (default 1,000)
//! that depend on it, each writing and reading a file, asking the previous loop a question
//! (answered from its script), sharing data with the next one and completing (one iteration,
//! two model turns, validation `true`); all in the repository itself (`worktree: repo`), so
//! that git worktrees do not dominate the time. The gate lets the browser load the page and
//! read the first events before the loops start: from then on every event the page gets is
//! live, and `window.tdMetrics` (reset when the gate opens) holds, per event, the time from
//! the event's `time` (written by the daemon) to the first animation frame after the page
//! drew it, and the page's own share (receipt → that frame).
//!
//! Measured: the latency p50/p95/p99/max over every event of the `open` runs; the daemon's
//! CPU time (utime + stime of its own threads, `/proc/PID/stat`), plus with `--ui` that of
//! its dashboard process (`taskdaemon ui --run-dir-from-stdin`, its child), from the gate's
//! opening to the run's end (`run finished` for `--ui` runs; the last sample before exit,
//! every 10 ms, for `plain`), median per mode, `open` and `closed` against `plain`; and the
//! dashboard process's own CPU alone against `plain`.
//!
//! The daemon (with its commands) runs on the last CPU; the browser and the dashboard
//! process on the others (`taskset`; see [`pinning`]; `BENCH_PIN=0` lets all run anywhere).
//! The dashboard process's CPU is counted with the daemon's wherever it runs.
//!
//! Needs Debian's `chromium` and `chromium-driver` (fails, saying so, without them).
//! Options (after `--`): `--loops N` (default 1000). `BENCH_ROUNDS` (default 2).

mod common;

#[path = "../tests/common/browser.rs"]
#[allow(dead_code)]
mod browser;

// What `browser` installs its packages with.
#[path = "../tests/common/debian_packages.rs"]
mod debian_packages;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use browser::{Driver, UiRun, require_browser, until, wait_line};
use common::Report;
use serde_json::Value;

/// Longest one run may take (a guard against a hang, not an expectation).
const GUARD: Duration = Duration::from_secs(900);
/// Target: event-to-screen p99.
const P99_TARGET_MS: f64 = 200.0;
/// Target: CPU the open dashboard adds to the daemon's.
const CPU_ADDED_TARGET: f64 = 0.05;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Plain,
    Open,
    Closed,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Open => "open",
            Mode::Closed => "closed",
        }
    }
}

/// What one run gave.
struct Outcome {
    /// The daemon's CPU and, with `--ui`, its dashboard process's.
    cpu_ms: f64,
    /// The dashboard process's share of `cpu_ms`.
    dashboard_ms: f64,
    wall_ms: f64,
    latencies: Vec<f64>,
    page_ms: Vec<f64>,
}

fn loop_name(i: usize) -> String {
    format!("l{i:04}")
}

/// `taskdaemon.yml` and `script.yml` of the run, the gate waiting for `flag`.
fn scenario(n: usize, flag: &Path) -> (String, String) {
    let mut cfg = String::from(
        "repo: ../user\n\
         llm: {provider: scripted, script: script.yml}\n\
         concurrency: {max-loops: 200, max-model-calls: 32}\n\
         conflict-warnings: off\n\
         loop-types:\n  bench: {extends: code, subscriptions: [], max-iterations: 2}\n\
         loops:\n  - {name: gate, type: bench, task: Wait for the dashboard., worktree: repo, validation: \"true\"}\n",
    );
    let mut script = format!(
        "gate:\n  turns:\n    - calls:\n        - run_command: {{command: \"until [ -e '{}' ]; do sleep 0.05; done\"}}\n        - complete_task: {{summary: open}}\n",
        flag.display()
    );
    for i in 0..n {
        let me = loop_name(i);
        let asked = loop_name((i + n - 1) % n);
        let told = loop_name((i + 1) % n);
        cfg.push_str(&format!(
            "  - {{name: {me}, type: bench, task: Write your notes., worktree: repo, depends-on: [gate], validation: \"true\"}}\n"
        ));
        script.push_str(&format!(
            "{me}:\n  turns:\n    - calls:\n        - write_file: {{path: notes/{me}.txt, content: \"alpha\\nbeta\\n\"}}\n        - read_file: {{path: notes/{me}.txt}}\n        - query_loop: {{target_exec_id: {asked}, question: \"What is your status?\"}}\n    - calls:\n        - share_data: {{target_exec_ids: [{told}], data_type: status, data: {{from: {me}}}}}\n        - complete_task: {{summary: done}}\n  answers:\n    - reply: \"status: fine\"\n"
        ));
    }
    (cfg, script)
}

/// A temp dir with the user's repository (`user/`), the config (`cfg/`) and the flag's place.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(n: usize) -> Setup {
        let setup = Setup {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        let user = setup.path("user");
        std::fs::create_dir_all(&user).expect("user dir");
        std::fs::create_dir_all(setup.path("cfg")).expect("cfg dir");
        std::fs::create_dir_all(setup.path("home")).expect("home dir");
        std::fs::write(user.join("README.md"), "bench\n").expect("README");
        common::init_repo(&user, || setup.command("git"));
        let (cfg, script) = scenario(n, &setup.path("flag"));
        std::fs::write(setup.path("cfg/taskdaemon.yml"), cfg).expect("config");
        std::fs::write(setup.path("cfg/script.yml"), script).expect("script");
        setup
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A command isolated from the machine's git config and home.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("HOME", self.path("home"))
            .env("XDG_CONFIG_HOME", self.path("home"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdin(Stdio::null());
        cmd
    }

    fn run_command(&self, ui: bool) -> Command {
        let mut cmd = match &PINNING.get().and_then(|p| p.daemon.clone()) {
            Some(cpus) => {
                let mut cmd = self.command("taskset");
                cmd.args(["-c", cpus, env!("CARGO_BIN_EXE_taskdaemon")]);
                cmd
            }
            None => self.command(env!("CARGO_BIN_EXE_taskdaemon")),
        };
        let cfg = self.path("cfg/taskdaemon.yml");
        let run = self.path("run");
        cmd.arg("run")
            .arg("-c")
            .arg(cfg)
            .arg("--run-dir")
            .arg(run)
            .current_dir(self.dir.path());
        if ui {
            cmd.args(["--ui", "--ui-port", "0"]);
        }
        cmd
    }

    /// Whether the gate's command is running (its iteration started).
    fn gate_waiting(&self) -> bool {
        std::fs::read_to_string(self.path("run/events.jsonl"))
            .map(|t| {
                t.lines()
                    .any(|l| l.contains("\"iteration_started\"") && l.contains("\"gate\""))
            })
            .unwrap_or(false)
    }

    fn wait_gate(&self) {
        let start = Instant::now();
        while !self.gate_waiting() {
            assert!(
                start.elapsed() < GUARD,
                "the gate loop never started its iteration"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Its command starts right after its first turn: give it that moment.
        std::thread::sleep(Duration::from_millis(200));
    }

    fn open_gate(&self) {
        std::fs::write(self.path("flag"), "go\n").expect("flag");
    }

    /// Every loop completed, or a panic saying which did not.
    fn check_completed(&self, n: usize) {
        let text = std::fs::read_to_string(self.path("run/summary.json")).expect("summary");
        let summary: Value = serde_json::from_str(&text).expect("summary JSON");
        let loops = summary["loops"].as_object().expect("loops");
        let done = loops
            .values()
            .filter(|l| l["status"] == "completed")
            .count();
        assert_eq!(
            done,
            n + 1,
            "not every loop completed; the bench measured a broken run"
        );
    }
}

/// The daemon's own CPU time (utime + stime of its threads) in ms, from `/proc/PID/stat`.
/// Which CPUs the daemon and the browser may use (`taskset -c` lists), when they are kept
/// apart.
struct Pinning {
    daemon: Option<String>,
    browser: Option<String>,
}

static PINNING: std::sync::OnceLock<Pinning> = std::sync::OnceLock::new();

/// The daemon (and its commands) on the last CPU, the browser and the dashboard process on
/// the others, unless `BENCH_PIN=0` or there is one CPU: on a shared 2-CPU machine a browser
/// drawing 10,000 events competes with the daemon for its CPU, and the daemon's threads
/// then spend more CPU on the same work (preemptions, cache), an effect of where the
/// browser runs rather than of the dashboard (a user's browser is often on another machine).
/// The dashboard process left on the daemon's one CPU (its inherited affinity) woke there
/// every 20 ms: with a quiet machine the daemon then used about 10% more CPU with `--ui` even
/// without a browser (BENCHMARKS.md, run 13), where a machine with a free CPU would run it
/// beside the daemon, not on top of it.
fn pinning() -> Pinning {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 || std::env::var("BENCH_PIN").is_ok_and(|v| v == "0") {
        return Pinning {
            daemon: None,
            browser: None,
        };
    }
    let last = cpus - 1;
    Pinning {
        daemon: Some(last.to_string()),
        browser: Some(if last == 1 {
            "0".to_string()
        } else {
            format!("0-{}", last - 1)
        }),
    }
}

fn cpu_ms(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: fields are counted after its `)`.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) * 1000.0 / ticks as f64)
}

async fn run_once(n: usize, mode: Mode, client: &fantoccini::Client) -> Outcome {
    let setup = Setup::new(n);
    match mode {
        Mode::Plain => {
            // Its output is read as the `--ui` runs' is (a pipe, drained by a thread, its
            // own process group), so that the modes differ only by the dashboard.
            let mut cmd = setup.run_command(false);
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
            let mut child = cmd.spawn().expect("taskdaemon starts");
            let stdout = browser::line_channel(child.stdout.take());
            let stderr = browser::line_channel(child.stderr.take());
            let pid = i32::try_from(child.id()).expect("pid");
            setup.wait_gate();
            let cpu0 = cpu_ms(pid).expect("the daemon's /proc stat");
            let start = Instant::now();
            setup.open_gate();
            let mut last = cpu0;
            loop {
                if let Some(c) = cpu_ms(pid) {
                    last = c;
                }
                if let Some(status) = child.try_wait().expect("wait") {
                    if !status.success() {
                        let said: Vec<String> =
                            stdout.try_iter().chain(stderr.try_iter()).collect();
                        let tail = &said[said.len().saturating_sub(30)..];
                        panic!(
                            "the plain run failed: {status}; its last lines:\n{}",
                            tail.join("\n")
                        );
                    }
                    break;
                }
                assert!(start.elapsed() < GUARD, "the plain run hung");
                std::thread::sleep(Duration::from_millis(10));
            }
            let wall_ms = start.elapsed().as_secs_f64() * 1000.0;
            setup.check_completed(n);
            Outcome {
                cpu_ms: last - cpu0,
                dashboard_ms: 0.0,
                wall_ms,
                latencies: Vec::new(),
                page_ms: Vec::new(),
            }
        }
        Mode::Open | Mode::Closed => {
            let mut run = UiRun::start(setup.run_command(true), GUARD);
            let pid = run.pid();
            let dashboard = dashboard_pid(pid);
            // The dashboard process serves the browser: with the CPUs split, it runs on the
            // browser's side (as the scheduler would put it on an idle CPU rather than beside
            // the busy daemon); its CPU is counted with the daemon's all the same.
            if let Some(cpus) = PINNING.get().and_then(|p| p.browser.clone()) {
                let moved = Command::new("taskset")
                    .args(["-a", "-p", "-c", &cpus, &dashboard.to_string()])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(moved, "taskset could not move the dashboard process");
            }
            if mode == Mode::Open {
                client.goto(&run.url).await.expect("the dashboard loads");
                // The page has read the first events and drawn the gate's row.
                until("the gate's row on the page", GUARD, || async {
                    let v = client
                        .execute(
                            "return document.querySelector('#loops tr[data-loop=\"gate\"]') !== null",
                            vec![],
                        )
                        .await
                        .ok()?;
                    (v == Value::Bool(true)).then_some(())
                })
                .await;
            }
            setup.wait_gate();
            if mode == Mode::Open {
                client
                    .execute(
                        "const m = window.tdMetrics; m.latencies_ms.length = 0; m.page_ms.length = 0; m.events = 0; return true;",
                        vec![],
                    )
                    .await
                    .expect("metrics reset");
            }
            let cpu0 = cpu_ms(pid).expect("the daemon's /proc stat");
            let dash0 = cpu_ms(dashboard).expect("the dashboard's /proc stat");
            let start = Instant::now();
            setup.open_gate();
            let finished = wait_line(&run.stdout, GUARD, |l| {
                l.starts_with("run finished").then_some(())
            });
            let cpu1 = cpu_ms(pid).expect("the daemon's /proc stat");
            let dash1 = cpu_ms(dashboard).expect("the dashboard's /proc stat");
            let wall_ms = start.elapsed().as_secs_f64() * 1000.0;
            assert!(finished.is_some(), "the --ui run never said it finished");
            setup.check_completed(n);
            let (mut latencies, mut page_ms) = (Vec::new(), Vec::new());
            if mode == Mode::Open {
                // Everything sent has been drawn once the count stops moving.
                let mut seen = -1.0;
                let mut metrics = Value::Null;
                for _ in 0..100 {
                    metrics = client
                        .execute("return window.tdMetrics;", vec![])
                        .await
                        .expect("metrics");
                    let now = metrics["events"].as_f64().unwrap_or(0.0);
                    if now == seen
                        && metrics["latencies_ms"].as_array().map(Vec::len) == Some(now as usize)
                    {
                        break;
                    }
                    seen = now;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                let nums = |key: &str| -> Vec<f64> {
                    metrics[key]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_f64).collect())
                        .unwrap_or_default()
                };
                latencies = nums("latencies_ms");
                page_ms = nums("page_ms");
                let shown = client
                    .execute(
                        "return document.getElementById('loops-count').textContent;",
                        vec![],
                    )
                    .await
                    .expect("the loop count");
                assert_eq!(
                    shown,
                    Value::String(format!("{} loops", n + 1)),
                    "the page does not show every loop"
                );
            }
            run.terminate(GUARD);
            Outcome {
                cpu_ms: (cpu1 - cpu0) + (dash1 - dash0),
                dashboard_ms: dash1 - dash0,
                wall_ms,
                latencies,
                page_ms,
            }
        }
    }
}

/// The dashboard process of the `run --ui` daemon `daemon` (its child `taskdaemon ui
/// --run-dir-from-stdin`).
fn dashboard_pid(daemon: i32) -> i32 {
    let children = std::fs::read_to_string(format!("/proc/{daemon}/task/{daemon}/children"))
        .expect("the daemon's children");
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|p: &i32| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"--run-dir-from-stdin"))
        })
        .expect("the daemon runs its dashboard process")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    percentile(&s, 50.0)
}

fn main() {
    require_browser();
    common::actors::print_machine("ui");
    let args: Vec<String> = std::env::args().collect();
    let n = args
        .iter()
        .position(|a| a == "--loops")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000usize);
    let rounds = common::rounds(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let pinned = PINNING.get_or_init(pinning);
    eprintln!(
        "# CPUs: daemon {}, browser {} (BENCH_PIN=0: both anywhere)",
        pinned.daemon.as_deref().unwrap_or("any"),
        pinned.browser.as_deref().unwrap_or("any")
    );
    let driver = Driver::start_on(pinned.browser.as_deref());
    let client = rt.block_on(driver.session());
    let modes = [Mode::Plain, Mode::Open, Mode::Closed];
    let mut cpu: [Vec<f64>; 3] = Default::default();
    let mut wall: [Vec<f64>; 3] = Default::default();
    let mut dashboard: [Vec<f64>; 3] = Default::default();
    let (mut latencies, mut page_ms) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for k in 0..modes.len() {
            let m = (round + k) % modes.len();
            let mode = modes[m];
            let out = rt.block_on(run_once(n, mode, &client));
            eprintln!(
                "# round {} {:<6} cpu {:>8.0} ms (dashboard process {:>6.0} ms)  wall {:>7.0} ms  events drawn {}",
                round + 1,
                mode.name(),
                out.cpu_ms,
                out.dashboard_ms,
                out.wall_ms,
                out.latencies.len()
            );
            cpu[m].push(out.cpu_ms);
            dashboard[m].push(out.dashboard_ms);
            wall[m].push(out.wall_ms);
            latencies.extend(out.latencies);
            page_ms.extend(out.page_ms);
        }
    }
    let _ = rt.block_on(client.close());
    drop(driver);

    latencies.sort_by(f64::total_cmp);
    page_ms.sort_by(f64::total_cmp);
    let mut report = Report::new("ui");
    let p99 = percentile(&latencies, 99.0);
    report.row(
        &format!("event-to-screen p99, {n} loops (ms)"),
        "ms",
        p99,
        None,
        &format!("<= {P99_TARGET_MS} ms"),
        Some(p99 <= P99_TARGET_MS),
    );
    for (label, p) in [("p50", 50.0), ("p95", 95.0), ("max", 100.0)] {
        report.row(
            &format!("event-to-screen {label} (ms)"),
            "ms",
            percentile(&latencies, p),
            None,
            "(reported)",
            None,
        );
    }
    report.row(
        "page's share p99: received -> painted",
        "ms",
        percentile(&page_ms, 99.0),
        None,
        "(reported)",
        None,
    );
    report.row(
        "events drawn (all open runs)",
        "count",
        latencies.len() as f64,
        None,
        "(reported)",
        None,
    );
    let (plain, open, closed) = (median(&cpu[0]), median(&cpu[1]), median(&cpu[2]));
    let added = open / plain - 1.0;
    report.row(
        "daemon CPU: dashboard open / no --ui (ms)",
        "ms",
        open,
        Some(plain),
        &format!("added <= {:.0}%", CPU_ADDED_TARGET * 100.0),
        Some(added <= CPU_ADDED_TARGET),
    );
    report.row(
        "dashboard process CPU, page open / daemon without --ui (ms)",
        "ms",
        median(&dashboard[1]),
        Some(plain),
        "(reported: the part of the added CPU that is the dashboard's own)",
        None,
    );
    report.row(
        "daemon CPU: --ui, no browser / no --ui (ms)",
        "ms",
        closed,
        Some(plain),
        "(reported)",
        None,
    );
    report.row(
        "run wall: dashboard open / no --ui (ms)",
        "ms",
        median(&wall[1]),
        Some(median(&wall[0])),
        "(reported)",
        None,
    );
    report.finish();
}
