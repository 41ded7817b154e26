//! Shared by the benches in `benches/` (each is `harness = false`): running ours and a
//! baseline alternately in the same process, medians, the output format (one JSON object
//! per line, then a short table), finding outside programs, and choosing a corpus.
//!
//! Alternation is the point: on a shared, noisy machine a slow spell then hits both sides
//! instead of only the one that happened to run during it.
//!
//! Environment: `BENCH_ROUNDS` (rounds per metric), `BENCH_ONLY` (run only the metrics
//! whose name contains it), `BENCH_CORPUS` (a directory to search instead of the Rust docs).

// Each bench is its own crate and uses only part of this module.
#![allow(dead_code)]

/// Helpers of the actor benches (`query`, `lane`, `watcher`, `scale`).
pub mod actors;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Rounds per metric unless `BENCH_ROUNDS` says otherwise.
pub fn rounds(default: usize) -> usize {
    std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// Whether `metric` should run: all do unless `BENCH_ONLY` is set, then those whose name
/// contains it.
pub fn selected(metric: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |only| metric.contains(&only))
}

/// Milliseconds of a duration.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Median of `samples` (upper median for an even count, so it is always a measured value).
pub fn median(samples: &[Duration]) -> Duration {
    let mut v = samples.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

/// Times `f` once.
pub fn time(f: &mut dyn FnMut()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

/// Medians (in ms) of `ours` and of `baseline` over `rounds` rounds after one warm-up run
/// of each. Each round runs both, the order flipping every round.
pub fn alternate(
    rounds: usize,
    ours: &mut dyn FnMut(),
    mut baseline: Option<&mut dyn FnMut()>,
) -> (f64, Option<f64>) {
    ours();
    if let Some(b) = baseline.as_mut() {
        b();
    }
    let mut a = Vec::with_capacity(rounds);
    let mut b = Vec::with_capacity(rounds);
    for round in 0..rounds {
        if round % 2 == 0 {
            a.push(time(ours));
        }
        if let Some(base) = baseline.as_mut() {
            b.push(time(*base));
        }
        if round % 2 == 1 {
            a.push(time(ours));
        }
    }
    let base = (!b.is_empty()).then(|| ms(median(&b)));
    (ms(median(&a)), base)
}

/// One result line.
#[derive(Debug)]
pub struct Row {
    pub metric: String,
    pub unit: String,
    pub ours: f64,
    pub baseline: Option<f64>,
    /// What counts as met, in words (`ratio <= 1.2`, `< 10 s`, `(reported)`).
    pub target: String,
    /// Whether the target is met; `None` for figures that are only reported.
    pub met: Option<bool>,
}

impl Row {
    pub fn ratio(&self) -> Option<f64> {
        self.baseline.filter(|&b| b > 0.0).map(|b| self.ours / b)
    }
}

/// Collects a bench's results: prints each as a JSON line when added, then a table.
pub struct Report {
    bench: &'static str,
    rows: Vec<Row>,
}

fn round3(x: f64) -> serde_json::Value {
    if x.is_finite() {
        serde_json::json!((x * 1000.0).round() / 1000.0)
    } else {
        serde_json::Value::Null
    }
}

fn fmt_num(x: f64) -> String {
    if x.abs() >= 1000.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

impl Report {
    pub fn new(bench: &'static str) -> Self {
        Self {
            bench,
            rows: Vec::new(),
        }
    }

    /// Records and prints a wall-time metric in ms whose target is a ratio to the baseline.
    pub fn add(&mut self, metric: &str, ours: f64, baseline: Option<f64>, max_ratio: f64) {
        let met = baseline.filter(|&b| b > 0.0).map(|b| ours / b <= max_ratio);
        self.row(
            metric,
            "ms",
            ours,
            baseline,
            &format!("ratio <= {max_ratio}"),
            met,
        );
    }

    /// Records and prints one metric. `baseline` is the same-run reference (if the metric
    /// has one); `target` says what counts as met, `met` whether it is.
    pub fn row(
        &mut self,
        metric: &str,
        unit: &str,
        ours: f64,
        baseline: Option<f64>,
        target: &str,
        met: Option<bool>,
    ) {
        let row = Row {
            metric: metric.to_string(),
            unit: unit.to_string(),
            ours,
            baseline,
            target: target.to_string(),
            met,
        };
        let line = serde_json::json!({
            "bench": self.bench,
            "metric": row.metric,
            "unit": row.unit,
            "ours": round3(row.ours),
            "baseline": row.baseline.map(round3),
            "ratio": row.ratio().map(round3),
            "target": row.target,
            "met": row.met,
        });
        println!("{line}");
        self.rows.push(row);
    }

    /// Prints the human table.
    pub fn finish(self) {
        println!();
        println!(
            "{:<44} {:>11} {:>11} {:>7}  {:<5} {:<4} target",
            format!("{} metric", self.bench),
            "ours",
            "baseline",
            "ratio",
            "unit",
            "met"
        );
        for r in &self.rows {
            let base = r.baseline.map_or("-".to_string(), fmt_num);
            let ratio = r.ratio().map_or("-".to_string(), |x| format!("{x:.2}"));
            let met = match r.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            };
            println!(
                "{:<44} {:>11} {:>11} {:>7}  {:<5} {:<4} {}",
                r.metric,
                fmt_num(r.ours),
                base,
                ratio,
                r.unit,
                met,
                r.target
            );
        }
    }
}

/// Whether `program --version` runs; when not, says so (the bench installs nothing).
pub fn have(program: &str, install_hint: &str) -> bool {
    let ok = Command::new(program)
        .arg("--version")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success());
    match ok {
        Some(o) => {
            let v = String::from_utf8_lossy(&o.stdout);
            println!("# {program}: {}", v.lines().next().unwrap_or("").trim());
            true
        }
        None => {
            println!(
                "# {program} not found on PATH: baselines that need it are skipped ({install_hint})"
            );
            false
        }
    }
}

/// Runs `cmd` and reads all of its stdout; returns the bytes read.
pub fn run_all(cmd: &mut Command) -> Vec<u8> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn baseline");
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_end(&mut out)
        .expect("read baseline output");
    child.wait().expect("wait for baseline");
    out
}

/// Runs `cmd`, reads `lines` lines of its stdout, then closes the pipe and waits for it to
/// exit: the same as `cmd | head -n lines`, without a shell.
pub fn run_head(cmd: &mut Command, lines: usize) -> Vec<String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn baseline");
    let mut out = Vec::with_capacity(lines);
    {
        let mut reader = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut buf = Vec::new();
        while out.len() < lines {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => out.push(String::from_utf8_lossy(&buf).into_owned()),
            }
        }
    }
    child.wait().expect("wait for baseline");
    out
}

/// A directory tree to search, and what it is.
pub struct Corpus {
    pub path: PathBuf,
    pub what: &'static str,
}

impl Corpus {
    /// Prints what the corpus is and how big.
    pub fn describe(&self) {
        let (files, bytes) = size_of(&self.path);
        println!(
            "# corpus: {} at {} ({files} files, {:.0} MB)",
            self.what,
            self.path.display(),
            bytes as f64 / 1e6
        );
    }
}

fn size_of(dir: &Path) -> (u64, u64) {
    let (mut files, mut bytes) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => {
                    files += 1;
                    bytes += e.metadata().map_or(0, |m| m.len());
                }
                _ => {}
            }
        }
    }
    (files, bytes)
}

/// The Rust documentation shipped with the toolchain, if installed
/// (`rustup component add rust-docs`).
pub fn rust_docs() -> Option<Corpus> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = String::from_utf8(out.stdout).ok()?;
    let path = Path::new(sysroot.trim()).join("share/doc/rust/html");
    path.is_dir().then_some(Corpus {
        path,
        what: "Rust documentation ($(rustc --print sysroot)/share/doc/rust/html)",
    })
}

/// The cargo registry's unpacked sources, if any.
pub fn cargo_registry() -> Option<Corpus> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    let path = home.join("registry/src");
    path.is_dir().then_some(Corpus {
        path,
        what: "cargo registry sources ($CARGO_HOME/registry/src)",
    })
}

/// `BENCH_CORPUS` if set, else the Rust docs, else the cargo registry.
pub fn corpus() -> Option<Corpus> {
    if let Some(p) = std::env::var_os("BENCH_CORPUS") {
        return Some(Corpus {
            path: PathBuf::from(p),
            what: "BENCH_CORPUS",
        });
    }
    rust_docs().or_else(cargo_registry)
}

/// A multi-threaded runtime, as a loop's tools run in.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A context whose output caps are raised so that a correctness check sees the whole
/// answer (the timed calls use the default catalog, as a loop does).
pub fn uncapped_context(root: &Path) -> td_toolkit::context::ToolContext {
    let mut catalog = td_toolkit::catalog::Catalog::default();
    let raise = td_toolkit::catalog::ToolSpecOverride {
        max_output_bytes: Some(64 << 20),
        ..Default::default()
    };
    let overrides = ["glob", "grep", "read_file", "edit_file"]
        .iter()
        .map(|n| (n.to_string(), raise.clone()))
        .collect();
    catalog
        .apply_overrides(&overrides)
        .expect("catalog overrides");
    td_toolkit::context::ToolContext::new(root, "bench-check")
        .expect("context")
        .with_catalog(std::sync::Arc::new(catalog))
}

/// Makes `user` a git repository on `main` with one commit of what it holds, running git
/// as `git()` makes it (each bench sets its own environment).
pub fn init_repo(user: &Path, mut git: impl FnMut() -> Command) {
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-qm",
            "init",
        ],
    ] {
        let ok = git()
            .args(args)
            .current_dir(user)
            .status()
            .expect("git runs")
            .success();
        assert!(ok, "git {args:?} failed");
    }
}
