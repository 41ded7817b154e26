//! `cargo bench --bench hosts`: worker hosts (issue 18), through the real binaries on
//! 127.0.0.1 — a head (`taskdaemon run` with a `hosts:` section) and hosts (`taskdaemon host
//! --join`), each a process of its own, on the scripted provider.
//!
//! Two parts (`BENCH_ONLY=query` or `BENCH_ONLY=loops` runs one):
//!
//! - **query**: a loop `asker` on host h1 calls `query_loop` N times (one model turn holding
//!   N calls, which the engine makes one after the other) to a loop `answerer` on host h2.
//!   Each query goes h1 → head (coordinator) → h2, where the answer's model call goes to the
//!   head and back (hosts have no model keys), and the answer h2 → head → h1. The round trip
//!   of each is the asker's receipt's `latency_us` (the whole `query_loop` call as the loop
//!   makes it: schema check, route, receipt). Baseline, same bench run: three processes of
//!   this bench (`BENCH_HOSTS_ROLE`), ractor_cluster nodes as our head and hosts make them
//!   (`td_cluster::node::start`: the same transport, frame limit and isolated mode), h1 and
//!   h2 connected to the head only, a tiny actor on each: h1 calls the head's relay, which
//!   calls h2's answerer, which calls the head's "model" and answers; the same route with the
//!   question's and the answer's bytes, raw (no JSON, no coordinator, no record). Ours and
//!   the raw relay alternate by chunks of 100 (the asker waits for a go file before each of
//!   its chunks), so each pair of chunks sees the same machine; the verdict is ours' p50
//!   against the p50 of the raw relay's faster half of chunks (its fast state: on this VM it
//!   runs ~2-5x slower in spells when idle cores are slow to wake), and the median of the
//!   pairs' ratios must hold too; a run whose raw relay never reached its fast state
//!   (`BENCH_RAW_FAST_US`, default 100) is reported, not judged. `BENCH_SPIN=1` keeps every
//!   core busy at nice 19 meanwhile (the fastest raw state). `BENCH_PLACE=HEAD/H1/H2` (CPU
//!   lists as `taskset -c` takes them, e.g. `0/0/1`) starts ours' head, h1 and h2 and the raw
//!   relay's three on those CPUs alike: which CPU each of the three processes runs on moves
//!   both routes' round trips by ~100 µs on two cores, and the kernel places the two routes'
//!   processes differently when left to it. `BENCH_CHUNK=N` sets the chunk size (default
//!   100; a larger one leaves less of each chunk's end in ours' CPU per query). Also
//!   measured: the route without the model hop (h1 → head → h2 → head → h1), the floor of any
//!   relay through the head.
//! - **loops**: N scripted loops (default 200; `--loops 1000` for the figure of the issue),
//!   each in its own worktree writing, reading and completing, spread over 4 hosts (a
//!   placement rule keeps them off the head; 8 slots each), against the same loops on the
//!   head alone (`max-loops` 32, the 4 hosts' slots together), and on the head with one host
//!   of 32 slots. Two times from the head's start (hosts are started as soon as it
//!   listens): until every loop has ended (`loop_completed` in the record), and until the
//!   head exits (the merge queue done); CPU (utime+stime, and that of its waited children:
//!   git) of the head and of the hosts from `/proc`, sampled until the loops ended (or the
//!   end, when the run is not stopped there).
//!
//! Options (after `--`): `--queries N` (default 400), `--loops N` (default 200), `--hosts N`
//! (default 4), `--stop-at-end` (kill each loops run's head once its loops have ended: the
//! merge queue's tail is the same on every spread, takes minutes at 1,000 loops, and a
//! Ctrl-C lets it drain), `--no-one-host`. `BENCH_ROUNDS` rounds of each part (default 3 for query, 1 for
//! loops).

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Report;
use common::actors::Dist;
use serde_json::Value;

/// Longest one run may take (a guard against a hang, not an expectation).
const GUARD: Duration = Duration::from_secs(1800);
/// The query bench's target: p50 round trip against the raw same-route call.
const QUERY_TARGET: f64 = 2.0;
/// The shared secret of the bench's head and hosts (and of the baseline's nodes).
const SECRET: &str = "the-hosts-bench-secret-0123456789abcdef";
/// Sizes of the question and of the answer, ours and the baseline's.
const QUESTION_BYTES: usize = 64;
const ANSWER_BYTES: usize = 64;
/// Where a child of this bench learns it is a baseline node.
const ROLE_ENV: &str = "BENCH_HOSTS_ROLE";

fn main() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        echo::node_main(&role);
        return;
    }
    common::actors::print_machine("hosts");
    let arg = |name: &str, default: usize| -> usize {
        let args: Vec<String> = std::env::args().collect();
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let mut report = Report::new("hosts");
    if common::selected("query") {
        query_bench(&mut report, arg("--queries", 400), common::rounds(3));
    }
    if common::selected("loops") {
        let flag = |name: &str| std::env::args().any(|a| a == name);
        loops_bench(
            &mut report,
            &LoopsOptions {
                loops: arg("--loops", 200),
                hosts: arg("--hosts", 4),
                rounds: common::rounds(1),
                stop_at_end: flag("--stop-at-end"),
                no_one_host: flag("--no-one-host"),
            },
        );
    }
    report.finish();
}

fn question() -> String {
    "q".repeat(QUESTION_BYTES)
}

fn answer() -> String {
    "a".repeat(ANSWER_BYTES)
}

// ---------------------------------------------------------------------------------------
// The scripted runs: a project, a head and its hosts.

/// A temp dir with the user's repository (`user/`), the config and script (`cfg/`), the
/// secret, flags, the run directory and the hosts' work directories.
struct Setup {
    dir: tempfile::TempDir,
    port: u16,
    /// Whether `BENCH_PLACE` places this setup's head and hosts (the query part's only).
    placing: bool,
}

impl Setup {
    fn new(config: &str, script: &str) -> Setup {
        let setup = Setup {
            dir: tempfile::tempdir().expect("tempdir"),
            port: free_port(),
            placing: false,
        };
        for d in ["user", "cfg", "home", "flags"] {
            std::fs::create_dir_all(setup.path(d)).expect("dir");
        }
        std::fs::write(setup.path("user/README.md"), "bench\n").expect("README");
        common::init_repo(&setup.path("user"), || setup.command("git", "setup"));
        let secret = setup.path("cfg/hosts.secret");
        std::fs::write(&secret, format!("{SECRET}\n")).expect("secret");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600))
                .expect("chmod secret");
        }
        let flags = setup.path("flags").display().to_string();
        let config = config
            .replace("{port}", &setup.port.to_string())
            .replace("{f}", &flags);
        std::fs::write(setup.path("cfg/taskdaemon.yml"), config).expect("config");
        std::fs::write(setup.path("cfg/script.yml"), script.replace("{f}", &flags))
            .expect("script");
        setup
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A command isolated from the machine's git config and home; in a placing setup, on
    /// the CPUs that `BENCH_PLACE` gives process `role` (`head`, `h1`, `h2`; any other is
    /// not placed).
    fn command(&self, program: &str, role: &str) -> Command {
        let mut cmd = if self.placing {
            placed(program, role)
        } else {
            Command::new(program)
        };
        cmd.env("HOME", self.path("home"))
            .env("XDG_CONFIG_HOME", self.path("home"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .current_dir(self.dir.path());
        cmd
    }

    /// `taskdaemon run`, its stderr into `head.err`.
    fn head(&self) -> Child {
        let err = std::fs::File::create(self.path("head.err")).expect("head.err");
        self.command(env!("CARGO_BIN_EXE_taskdaemon"), "head")
            .arg("run")
            .arg("-c")
            .arg(self.path("cfg/taskdaemon.yml"))
            .arg("--run-dir")
            .arg(self.path("run"))
            .stderr(err)
            .spawn()
            .expect("start the head")
    }

    /// Waits until the head listens (or fails, saying why).
    fn wait_listening(&self, head: &mut Child) {
        let start = Instant::now();
        loop {
            let err = std::fs::read_to_string(self.path("head.err")).unwrap_or_default();
            if err.contains("taskdaemon: hosts join at") {
                return;
            }
            if let Ok(Some(status)) = head.try_wait() {
                panic!("the head exited ({status}) before it listened:\n{err}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the head does not listen:\n{err}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `taskdaemon host --join 127.0.0.1:PORT --name NAME --slots SLOTS`, its stderr into
    /// `NAME.err`.
    fn host(&self, name: &str, slots: usize) -> Child {
        let err = std::fs::File::create(self.path(&format!("{name}.err"))).expect("host err");
        self.command(env!("CARGO_BIN_EXE_taskdaemon"), name)
            .args(["host", "--join", &format!("127.0.0.1:{}", self.port)])
            .args(["--name", name, "--slots", &slots.to_string()])
            .arg("--secret-file")
            .arg(self.path("cfg/hosts.secret"))
            .arg("--workdir")
            .arg(self.path(&format!("host-{name}")))
            .stderr(err)
            .spawn()
            .expect("start a host")
    }

    fn stderr_of(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{name}.err"))).unwrap_or_default()
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("run/events.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn flag(&self, name: &str) {
        std::fs::write(self.path(&format!("flags/{name}")), "").expect("flag");
    }
}

/// A port nobody listens on now (the head's `hosts.listen` is a fixed port).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits until `what` holds, polling; panics after `limit` with `context()`.
fn until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool, context: impl Fn() -> String) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < limit,
            "waited {limit:?} for {what}:\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CPU time (utime + stime, and cutime + cstime: the children it waited for) of `pid` in ms.
fn cpu_ms(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // SAFETY: sysconf only reads a system value.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let ms = |i: usize| f.get(i).copied().unwrap_or(0.0) * 1000.0 / tick;
    // utime, stime, cutime, cstime are fields 14..=17 (1-based), 12..=15 here.
    Some((ms(11) + ms(12), ms(13) + ms(14)))
}

/// The sum over `pid`'s threads of what `read` finds in each one's `file` under
/// `/proc/PID/task/TID/` (a thread whose file cannot be read counts nothing).
fn per_thread_sum(pid: u32, file: &str, read: impl Fn(&str) -> f64) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join(file)).ok())
        .map(|text| read(&text))
        .sum()
}

/// Context switches (voluntary and not) of all of `pid`'s threads so far: each is a thread
/// that slept or was preempted, the cost the route's hand-offs and wake-ups add up to.
fn switches(pid: u32) -> f64 {
    per_thread_sum(pid, "status", |status| {
        status
            .lines()
            .filter_map(|line| line.split_once(':'))
            .filter(|(key, _)| key.ends_with("ctxt_switches"))
            .map(|(_, value)| value.trim().parse::<f64>().unwrap_or(0.0))
            .sum()
    })
}

/// The time `pid`'s threads have spent on a CPU so far (ms), as the scheduler counts it (in
/// nanoseconds: `/proc/PID/task/*/schedstat`). Why not utime + stime: `/proc/PID/stat`
/// gives those in clock ticks (10 ms), so each chunk's span (~15 ms of queries) read them
/// ±10 ms off per process, ±25 µs and more in its CPU per query. A thread that ended during
/// a chunk takes its time with it (the runtimes' threads live through a run).
fn on_cpu_ms(pid: u32) -> f64 {
    let ns = per_thread_sum(pid, "schedstat", |stat| {
        stat.split_whitespace()
            .next()
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
    });
    ns / 1e6
}

/// The time on a CPU (ms, [`on_cpu_ms`]) of each of `pids`, then their context switches.
fn gauges_of(pids: [u32; 3]) -> [f64; 6] {
    let cpu = pids.map(on_cpu_ms);
    let switched = pids.map(switches);
    [
        cpu[0],
        cpu[1],
        cpu[2],
        switched[0],
        switched[1],
        switched[2],
    ]
}

/// Waits for `child` to exit (within [`GUARD`]) while sampling the CPU of `watched` (the
/// last sample before each exits); returns the exit code and the samples.
fn wait_sampling(child: &mut Child, watched: &[u32]) -> (i32, Vec<(f64, f64)>) {
    let start = Instant::now();
    let mut last = vec![(0.0, 0.0); watched.len()];
    loop {
        for (i, pid) in watched.iter().enumerate() {
            if let Some(s) = cpu_ms(*pid) {
                last[i] = s;
            }
        }
        if let Some(status) = child.try_wait().expect("wait") {
            return (status.code().unwrap_or(-1), last);
        }
        assert!(
            start.elapsed() < GUARD,
            "the run did not end within {GUARD:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a host to exit after the run's end (it is told); kills it after 30 s.
fn reap(name: &str, mut host: Child, setup: &Setup) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(status)) = host.try_wait() {
            if !status.success() {
                eprintln!(
                    "# host {name} exited with {status}:\n{}",
                    setup.stderr_of(name)
                );
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("# host {name} did not exit within 30 s of the run's end: killed");
    let _ = host.kill();
    let _ = host.wait();
}

// ---------------------------------------------------------------------------------------
// Part 1: a query_loop round trip between loops on two hosts.

fn query_scenario(chunks: usize, per_chunk: usize) -> (String, String) {
    // One iteration per chunk (a wait, a turn of queries, a turn that ends the iteration),
    // so that each chunk's model calls carry that chunk's turns only: in one iteration the
    // asker's history grew by a chunk's calls and results each time, and the head parsed
    // all of it twice a chunk (BENCHMARKS.md "hosts", fifth pass). Then the end.
    let max_turns = 4;
    let max_iterations = chunks + 1;
    let config = format!(
        "repo: ../user\n\
         llm: {{provider: scripted, script: script.yml}}\n\
         conflict-warnings: off\n\
         limits: {{burst: 1000000, per-second: 1000000}}\n\
         loop-types:\n  bench: {{extends: ralph, subscriptions: [], max-iterations: {max_iterations}, max-turns: {max_turns}}}\n\
         loops:\n  - {{name: asker, type: bench, task: Ask.}}\n  - {{name: answerer, type: bench, task: Answer.}}\n\
         hosts:\n  listen: 127.0.0.1:{{port}}\n  secret-file: hosts.secret\n  slots: 2\n  placement:\n    - {{loops: [asker], hosts: [h1]}}\n    - {{loops: [answerer], hosts: [h2]}}\n"
    );
    let q = question();
    let mut script = String::from("asker:\n  turns:\n");
    for chunk in 0..chunks {
        // The asker waits for the bench's go before each chunk: the raw relay's chunk runs
        // meanwhile, with the asker idle (a `sleep` every 0.5 s).
        script.push_str(&format!(
            "    - calls:\n        - run_command: {{command: \"until [ -e {{f}}/go{chunk} ]; do sleep 0.5; done\"}}\n    - calls:\n"
        ));
        for _ in 0..per_chunk {
            script.push_str(&format!(
                "        - query_loop: {{target_exec_id: answerer, question: \"{q}\"}}\n"
            ));
        }
        // No call: the iteration ends, and the next chunk starts a fresh context.
        script.push_str(&format!("    - say: \"chunk {chunk} asked\"\n"));
    }
    script.push_str("    - calls:\n        - complete_task: {summary: asked}\n");
    script.push_str(&format!(
        "answerer:\n  turns:\n    - calls:\n        - run_command: {{command: \"until [ -e {{f}}/done ]; do sleep 0.5; done\"}}\n    - calls:\n        - complete_task: {{summary: answered}}\n  answers:\n    - reply: \"{}\"\n",
        answer()
    ));
    (config, script)
}

/// Reads the asker's receipts on the head as they are appended: the round trips of its
/// `query_loop` calls so far (from each receipt's `latency_us`), read from where it stopped.
///
/// While a chunk runs, [`ReceiptTail::poll`] only counts the query receipts that came (a
/// substring search of the new lines); their JSON is read by [`ReceiptTail::samples`] once
/// the chunk is over. Read every 10 ms during the chunk, the receipts' parsing was the
/// bench's own work on the CPU ours' route runs on (~700 bytes into a `Value` per query, a
/// few µs), where the raw relay's chunk has nothing of the kind beside it.
struct ReceiptTail {
    path: PathBuf,
    offset: usize,
    partial: String,
    /// Query receipts' lines, not read yet.
    unread: Vec<String>,
    samples: Vec<Duration>,
}

impl ReceiptTail {
    fn new(path: PathBuf) -> ReceiptTail {
        ReceiptTail {
            path,
            offset: 0,
            partial: String::new(),
            unread: Vec::new(),
            samples: Vec::new(),
        }
    }

    /// Takes what was appended since the last call; the count of query receipts so far.
    fn poll(&mut self) -> usize {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return self.count();
        };
        let mut more = String::new();
        if file.seek(SeekFrom::Start(self.offset as u64)).is_ok()
            && file.read_to_string(&mut more).is_ok()
        {
            self.offset += more.len();
            self.partial.push_str(&more);
            while let Some(end) = self.partial.find('\n') {
                let line: String = self.partial.drain(..=end).collect();
                // Every receipt names its tool so; only the queries' are kept.
                if line.contains("\"tool\":\"query_loop\"") {
                    self.unread.push(line);
                }
            }
        }
        self.count()
    }

    fn count(&self) -> usize {
        self.samples.len() + self.unread.len()
    }

    /// Every query receipt's round trip so far, in order.
    fn samples(&mut self) -> &[Duration] {
        for line in self.unread.drain(..) {
            let r: Value = serde_json::from_str(&line).expect("a receipt line");
            assert_eq!(r["tool"], "query_loop", "{r}");
            assert_eq!(r["is_error"], false, "a query failed: {r}");
            let us = r["latency_us"].as_u64().expect("latency_us in the receipt");
            self.samples.push(Duration::from_micros(us));
        }
        &self.samples
    }
}

/// One round: `chunks` chunks of `per_chunk` queries of ours, each right after a chunk of
/// as many raw relay calls, so that each pair sees the same machine. Returns ours and the
/// raw relay's round trips, chunk by chunk, and the raw relay's without the model hop.
struct Round {
    ours: Vec<Vec<Duration>>,
    raw: Vec<Vec<Duration>>,
    direct: Vec<Duration>,
}

fn query_round(chunks: usize, per_chunk: usize) -> Round {
    let mut baseline = echo::Cluster::start();
    let (config, script) = query_scenario(chunks, per_chunk);
    let mut setup = Setup::new(&config, &script);
    setup.placing = true;
    let mut head = setup.head();
    setup.wait_listening(&mut head);
    let h1 = setup.host("h1", 2);
    let h2 = setup.host("h2", 2);
    let context = || {
        format!(
            "head:\n{}\nh1:\n{}\nh2:\n{}",
            setup.stderr_of("head"),
            setup.stderr_of("h1"),
            setup.stderr_of("h2")
        )
    };
    // Both loops running (registered with the head's coordinator) before the first query.
    let started = |name: &str| {
        setup
            .events()
            .iter()
            .any(|e| e["event"] == "iteration_started" && e["loop_name"] == name)
    };
    until(
        "both loops to start on their hosts",
        Duration::from_secs(120),
        || started("asker") && started("answerer"),
        context,
    );
    let pids = [head.id(), h1.id(), h2.id()];
    // The CPU (ms) of the head, h1 and h2, then their context switches: sampled together.
    let gauges = || gauges_of(pids);
    let mut tail = ReceiptTail::new(setup.path("run/loops/asker/receipts.jsonl"));
    let mut round = Round {
        ours: Vec::new(),
        raw: Vec::new(),
        direct: Vec::new(),
    };
    let (mut spent, mut raw_spent) = ([0.0; 6], [0.0; 6]);
    for chunk in 0..chunks {
        // The asker is idle in its wait once the chunk before has settled (its iteration's
        // end and the next one's start: a commit, a checkpoint, model calls, the records;
        // measured right after a chunk, they were taken for h1's idle rate, ~2% of a CPU,
        // and that rate over a chunk's half-second wait took out more than h1's queries
        // cost); the three processes' CPU and switches then are their idle rate (timers,
        // heartbeats).
        std::thread::sleep(Duration::from_millis(300));
        let (idle_from, idle_at) = (gauges(), Instant::now());
        std::thread::sleep(Duration::from_millis(100));
        let idle_rate: Vec<f64> = gauges()
            .iter()
            .zip(idle_from)
            .map(|(a, b)| (a - b) / idle_at.elapsed().as_secs_f64())
            .collect();
        let raw_before = baseline.gauges();
        round.raw.push(baseline.calls(per_chunk, true));
        for (s, (a, b)) in raw_spent
            .iter_mut()
            .zip(baseline.gauges().iter().zip(raw_before))
        {
            *s += a - b;
        }
        let (before, at) = (gauges(), Instant::now());
        let from = tail.count();
        setup.flag(&format!("go{chunk}"));
        until(
            "the asker's chunk of queries",
            GUARD,
            || tail.poll() >= from + per_chunk,
            context,
        );
        let after = gauges();
        let samples = tail.samples()[from..from + per_chunk].to_vec();
        // The queries run one after the other: the rest of the span is the asker's wait for
        // the go (up to 0.5 s), charged at the idle rate and taken out.
        let busy: Duration = samples.iter().sum();
        let idle = at.elapsed().saturating_sub(busy).as_secs_f64();
        for ((s, rate), (a, b)) in spent
            .iter_mut()
            .zip(&idle_rate)
            .zip(after.iter().zip(before))
        {
            *s += (a - b - rate * idle).max(0.0);
        }
        round.ours.push(samples);
    }
    round.direct = baseline.calls(chunks * per_chunk, false);
    baseline.stop();
    let n = (chunks * per_chunk) as f64;
    println!(
        "# ours, CPU per query (µs, the chunks' spans less the idle rate over their waits): head {:.0}, h1 {:.0}, h2 {:.0}",
        spent[0] * 1000.0 / n,
        spent[1] * 1000.0 / n,
        spent[2] * 1000.0 / n
    );
    println!(
        "# raw, CPU per call (µs): head {:.0}, h1 {:.0}, h2 {:.0}",
        raw_spent[0] * 1000.0 / n,
        raw_spent[1] * 1000.0 / n,
        raw_spent[2] * 1000.0 / n
    );
    println!(
        "# context switches per query: ours head {:.1}, h1 {:.1}, h2 {:.1}; raw head {:.1}, h1 {:.1}, h2 {:.1}",
        spent[3] / n,
        spent[4] / n,
        spent[5] / n,
        raw_spent[3] / n,
        raw_spent[4] / n,
        raw_spent[5] / n
    );
    until(
        "the asker to complete",
        GUARD,
        || {
            setup
                .events()
                .iter()
                .any(|e| e["event"] == "loop_completed" && e["loop_name"] == "asker")
        },
        context,
    );
    setup.flag("done");
    let (code, _) = wait_sampling(&mut head, &[]);
    assert_eq!(code, 0, "the run failed:\n{}", context());
    reap("h1", h1, &setup);
    reap("h2", h2, &setup);
    // Every query answered, once, on the head's record.
    let answered = setup
        .events()
        .iter()
        .filter(|e| e["event"] == "query_answered" && e["from"] == "asker")
        .count();
    assert_eq!(answered, chunks * per_chunk, "queries answered");
    assert_eq!(tail.poll(), chunks * per_chunk, "query_loop receipts");
    round
}

/// With `BENCH_SPIN=1`, one busy loop per core at nice 19 for the query part: on this VM an
/// idle core is slow to wake (the raw relay's p50 goes from ~75 µs with busy cores to
/// ~130 under other builds' load and ~370 on an idle machine), so this puts both in the
/// state where wake-ups are cheapest, whatever else runs. Killed when dropped.
struct Spinners(Vec<Child>);

impl Spinners {
    fn start() -> Spinners {
        if std::env::var("BENCH_SPIN").map_or(true, |v| v != "1") {
            return Spinners(Vec::new());
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!("# BENCH_SPIN=1: {cores} busy loops at nice 19");
        Spinners(
            (0..cores)
                .map(|_| {
                    Command::new("nice")
                        .args(["-n", "19", "sh", "-c", "while :; do :; done"])
                        .spawn()
                        .expect("a spinner")
                })
                .collect(),
        )
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Queries per chunk: ours and the raw relay's alternate by chunks of this size
/// (`BENCH_CHUNK` sets another).
const CHUNK: usize = 100;

/// [`CHUNK`], or `BENCH_CHUNK` when set to a positive number.
fn chunk_size() -> usize {
    std::env::var("BENCH_CHUNK")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(CHUNK)
}

/// `BENCH_PLACE`, when set.
fn bench_place() -> Option<String> {
    std::env::var("BENCH_PLACE").ok()
}

/// The CPUs `BENCH_PLACE=HEAD/H1/H2` gives process `role` (`head`, `h1` or `h2`; ours' and
/// the raw relay's alike), as `taskset -c` takes them; `None` when not placed.
fn placement(role: &str) -> Option<String> {
    let place = bench_place()?;
    let cpus: Vec<&str> = place.split('/').collect();
    assert_eq!(
        cpus.len(),
        3,
        "BENCH_PLACE is HEAD/H1/H2 (CPU lists), not {place:?}"
    );
    let at = ["head", "h1", "h2"].iter().position(|r| *r == role)?;
    Some(cpus[at].to_string())
}

/// A command for `program` as process `role`, under `taskset -c` when `BENCH_PLACE` places
/// it (taskset execs the program: the child's pid is the program's, and every thread it
/// starts inherits the CPUs).
fn placed(program: impl AsRef<std::ffi::OsStr>, role: &str) -> Command {
    match placement(role) {
        Some(cpus) => {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(cpus).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// The raw relay's p50 (µs) in its fast state on the machine of BENCHMARKS.md (52–72 µs
/// measured with `BENCH_SPIN=1`, its three processes sharing a CPU; 110–280 in its slow
/// spells, ~370 on an idle machine): a run whose raw relay stays above it is reported, not
/// judged (a slow raw relay flatters the ratio: one such run, all its chunks at 121–278 µs,
/// gave 2.0 where the runs around it gave 3.3–4.3). `BENCH_RAW_FAST_US` sets another.
fn raw_fast_us() -> f64 {
    std::env::var("BENCH_RAW_FAST_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100.0)
}

fn query_bench(report: &mut Report, n: usize, rounds: usize) {
    let per_chunk = chunk_size().min(n.max(1));
    let chunks = n.div_ceil(per_chunk);
    println!(
        "# query: {chunks} chunks of {per_chunk} queries per round, {rounds} rounds, ours and raw alternating by chunk; question {QUESTION_BYTES} B, answer {ANSWER_BYTES} B"
    );
    let (mut ours, mut raw, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    let mut pair_ratios = Vec::new();
    let spinners = Spinners::start();
    if let Some(place) = bench_place() {
        println!("# BENCH_PLACE={place}: head/h1/h2 on these CPUs, ours' and the raw relay's");
    }
    for round in 0..rounds {
        let r = query_round(chunks, per_chunk);
        let mut ratios = Vec::new();
        let mut pairs = Vec::new();
        for (o, w) in r.ours.iter().zip(&r.raw) {
            let (o, w) = (Dist::new(o).p50(), Dist::new(w).p50());
            ratios.push(o / w);
            pairs.push(format!("{o:.0}/{w:.0}"));
        }
        println!(
            "# round {round}: chunk pairs' p50, ours/raw (µs): {}",
            pairs.join(" ")
        );
        let (o, w): (Vec<_>, Vec<_>) = (r.ours.concat(), r.raw.concat());
        // The shape, not only the middle: work that runs beside the route (the head taking a
        // host's batch of records, the summary's writer) slows the queries it overlaps.
        let spread = |d: &Dist| {
            [0.1, 0.25, 0.5, 0.75, 0.9]
                .map(|q| format!("{:.0}", d.q_us(q)))
                .join("/")
        };
        println!(
            "# round {round}: p10/p25/p50/p75/p90 (µs): ours {}, raw {}",
            spread(&Dist::new(&o)),
            spread(&Dist::new(&w))
        );
        println!(
            "# round {round}: ours p50 {:.0} µs, raw same route p50 {:.0} µs; chunk pairs' p50 ratios {}",
            Dist::new(&o).p50(),
            Dist::new(&w).p50(),
            ratios
                .iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        pair_ratios.extend(ratios);
        for chunk in r.raw {
            raw.push(chunk);
        }
        ours.extend(o);
        direct.extend(r.direct);
    }
    drop(spinners);
    // The raw relay is bimodal on this VM (~130 or ~250 µs at p50, by spells): judged
    // against its fast state, the faster half of its chunks, never against a slow spell.
    raw.sort_by(|a, b| Dist::new(a).p50().total_cmp(&Dist::new(b).p50()));
    let fast: Vec<Duration> = raw[..raw.len().div_ceil(2)].concat();
    let all_raw: Vec<Duration> = raw.concat();
    let (ours, fast, all_raw, direct) = (
        Dist::new(&ours),
        Dist::new(&fast),
        Dist::new(&all_raw),
        Dist::new(&direct),
    );
    let median_pairs = common::actors::median_f64(&pair_ratios);
    let judged = ours.p50() / fast.p50();
    println!(
        "# raw p50: all chunks {:.0} µs, faster half {:.0} µs; ratio: against the faster half {judged:.2}, median of chunk pairs {median_pairs:.2}, against all raw {:.2}",
        all_raw.p50(),
        fast.p50(),
        ours.p50() / all_raw.p50()
    );
    // Met only when both hold: against the raw relay's fast state, and pair by pair; and
    // judged only when the raw relay reached its fast state at all (a run where the machine
    // slowed every wake-up down makes the ratio smaller, not ours faster).
    let fast_enough = fast.p50() <= raw_fast_us();
    if !fast_enough {
        println!(
            "# the raw relay never reached its fast state (faster half p50 {:.0} µs > {:.0} µs, BENCH_RAW_FAST_US): not judged",
            fast.p50(),
            raw_fast_us()
        );
    }
    // A placement is a diagnosis, not the user's machine: one that splits the processes over
    // CPUs slows the raw relay more than ours (its route has less else to wait on) and would
    // pass a ratio that no unplaced run gives.
    let is_placed = bench_place().is_some();
    if is_placed {
        println!("# BENCH_PLACE: reported, not judged");
    }
    let judge = fast_enough && !is_placed;
    report.row(
        "query h1->h2 p50 vs raw same route, fast half (us)",
        "us",
        ours.p50(),
        Some(fast.p50()),
        &format!("p50 ratio <= {QUERY_TARGET} (and median of chunk pairs)"),
        judge.then_some(judged <= QUERY_TARGET && median_pairs <= QUERY_TARGET),
    );
    report.row(
        "query h1->h2 p99 vs raw same route (us)",
        "us",
        ours.p99(),
        Some(all_raw.p99()),
        "(reported)",
        None,
    );
    report.row(
        "query h1->h2 p50 vs raw without model hop",
        "us",
        ours.p50(),
        Some(direct.p50()),
        "(reported)",
        None,
    );
    report.row(
        "query h1->h2 p99 vs raw without model hop",
        "us",
        ours.p99(),
        Some(direct.p99()),
        "(reported)",
        None,
    );
}

// ---------------------------------------------------------------------------------------
// Part 2: many scripted loops over several hosts against one machine.

/// Where the loops run.
#[derive(Clone, Copy, Debug)]
enum Spread {
    /// The head alone (no `hosts:` section), `max-loops` = every host's slots together.
    HeadOnly,
    /// The head and one host with all the slots; a placement rule keeps loops off the head.
    OneHost,
    /// The head and `hosts` hosts; loops only on hosts.
    Hosts(usize),
}

/// Slots per host of the spread run; the other runs get the same total.
const SLOTS_PER_HOST: usize = 8;

fn loop_name(i: usize) -> String {
    format!("l{i:04}")
}

fn loops_scenario(n: usize, spread: Spread, total_slots: usize) -> (String, String) {
    let mut config = format!(
        "repo: ../user\n\
         llm: {{provider: scripted, script: script.yml}}\n\
         conflict-warnings: off\n\
         concurrency: {{max-loops: {total_slots}, max-model-calls: 64}}\n\
         loop-types:\n  bench: {{extends: ralph, subscriptions: [], max-iterations: 1}}\n"
    );
    let hosts: Vec<String> = match spread {
        Spread::HeadOnly => Vec::new(),
        Spread::OneHost => vec!["h1".into()],
        Spread::Hosts(k) => (1..=k).map(|i| format!("h{i}")).collect(),
    };
    if !hosts.is_empty() {
        let slots = total_slots / hosts.len();
        config.push_str(&format!(
            "hosts:\n  listen: 127.0.0.1:{{port}}\n  secret-file: hosts.secret\n  slots: {slots}\n  lost-after-ms: 30000\n  placement:\n    - {{types: [bench], hosts: [{}]}}\n",
            hosts.join(", ")
        ));
    }
    config.push_str("loops:\n");
    let mut script = String::new();
    for i in 0..n {
        let me = loop_name(i);
        config.push_str(&format!("  - {{name: {me}, type: bench, task: Write.}}\n"));
        script.push_str(&format!(
            "{me}:\n  turns:\n    - calls:\n        - write_file: {{path: notes/{me}.txt, content: \"alpha\\nbeta\\n\"}}\n        - read_file: {{path: notes/{me}.txt}}\n    - calls:\n        - complete_task: {{summary: done}}\n"
        ));
    }
    (config, script)
}

/// What one run of the loops gave.
struct LoopsRun {
    /// From the head's start until every loop has ended.
    ended: Duration,
    /// From the head's start until it exited (the merge queue done); `None` when stopped
    /// at the loops' end.
    wall: Option<Duration>,
    /// Head CPU (own, waited children) in ms.
    head_cpu: (f64, f64),
    /// Every host's CPU (own + children) together, in ms.
    hosts_cpu: f64,
}

/// One run of `n` loops spread as `spread` says, with `total` slots in all; the head
/// stopped once every loop has ended when `stop_at_end`.
fn run_loops(n: usize, spread: Spread, total: usize, stop_at_end: bool) -> LoopsRun {
    let hosts = match spread {
        Spread::HeadOnly => 0,
        Spread::OneHost => 1,
        Spread::Hosts(k) => k,
    };
    let (config, script) = loops_scenario(n, spread, total);
    let setup = Setup::new(&config, &script);
    let started = Instant::now();
    let mut head = setup.head();
    let mut children = Vec::new();
    if hosts > 0 {
        setup.wait_listening(&mut head);
        for i in 1..=hosts {
            let name = format!("h{i}");
            let child = setup.host(&name, total / hosts);
            children.push((name, child));
        }
    }
    let mut pids = vec![head.id()];
    pids.extend(children.iter().map(|(_, c)| c.id()));
    // Until every loop has ended (the merge queue may still be at work).
    let ends = |setup: &Setup| {
        setup
            .events()
            .iter()
            .filter(|e| e["event"] == "loop_completed" || e["event"] == "loop_failed")
            .count()
    };
    let mut sampled = vec![(0.0, 0.0); pids.len()];
    let mut ended = None;
    while ended.is_none() {
        if let Ok(Some(status)) = head.try_wait() {
            panic!(
                "the run ended ({status}) before its loops ({spread:?}):\n{}",
                setup.stderr_of("head")
            );
        }
        for (i, pid) in pids.iter().enumerate() {
            if let Some(s) = cpu_ms(*pid) {
                sampled[i] = s;
            }
        }
        if ends(&setup) >= n {
            ended = Some(started.elapsed());
        }
        assert!(
            started.elapsed() < GUARD,
            "the loops did not end within {GUARD:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ended = ended.unwrap_or_default();
    let (wall, cpu) = if stop_at_end {
        // The merge queue's tail is the same on every spread and grows with the loops
        // (see BENCHMARKS.md); a Ctrl-C lets it drain (minutes at 1,000 loops), so the
        // head is killed once every loop has ended (its hosts see it go and leave).
        let _ = head.kill();
        let _ = head.wait();
        (None, sampled)
    } else {
        let (code, cpu) = wait_sampling(&mut head, &pids);
        assert_eq!(
            code,
            0,
            "the run failed ({spread:?}):\n{}",
            setup.stderr_of("head")
        );
        (Some(started.elapsed()), cpu)
    };
    // The hosts are told the run ended; their last samples stand for their CPU.
    let hosts_cpu = cpu.iter().skip(1).map(|(own, kids)| own + kids).sum();
    for (name, child) in children {
        reap(&name, child, &setup);
    }
    let events = setup.events();
    let completed = events
        .iter()
        .filter(|e| e["event"] == "loop_completed")
        .count();
    assert_eq!(completed, n, "loops completed ({spread:?})");
    LoopsRun {
        ended,
        wall,
        head_cpu: cpu[0],
        hosts_cpu,
    }
}

/// How the loops part runs (its options).
struct LoopsOptions {
    loops: usize,
    hosts: usize,
    rounds: usize,
    /// Stop each run once its loops have ended (`--stop-at-end`).
    stop_at_end: bool,
    /// Leave out the run on one host (`--no-one-host`).
    no_one_host: bool,
}

fn loops_bench(report: &mut Report, o: &LoopsOptions) {
    let (n, hosts) = (o.loops, o.hosts);
    println!(
        "# loops: {n} scripted loops; {hosts} hosts of {SLOTS_PER_HOST} slots vs the head alone (max-loops {}){}; {} round(s){}",
        hosts * SLOTS_PER_HOST,
        if o.no_one_host {
            String::new()
        } else {
            format!(" and one host of {}", hosts * SLOTS_PER_HOST)
        },
        o.rounds,
        if o.stop_at_end {
            "; each run stopped once its loops ended"
        } else {
            ""
        }
    );
    let mut spreads = vec![Spread::HeadOnly, Spread::Hosts(hosts)];
    if !o.no_one_host {
        spreads.push(Spread::OneHost);
    }
    let mut results: Vec<Vec<LoopsRun>> = spreads.iter().map(|_| Vec::new()).collect();
    for round in 0..o.rounds {
        for k in 0..spreads.len() {
            // The order rotates every round, so that a slow spell hits each.
            let i = (k + round) % spreads.len();
            let r = run_loops(n, spreads[i], hosts * SLOTS_PER_HOST, o.stop_at_end);
            println!(
                "# round {round} {:?}: loops ended after {:.2} s, head exited after {}, head cpu {:.2} s (+{:.2} s children), hosts cpu {:.2} s",
                spreads[i],
                r.ended.as_secs_f64(),
                r.wall.map_or("(stopped)".to_string(), |w| format!(
                    "{:.2} s",
                    w.as_secs_f64()
                )),
                r.head_cpu.0 / 1000.0,
                r.head_cpu.1 / 1000.0,
                r.hosts_cpu / 1000.0
            );
            results[i].push(r);
        }
    }
    let median = |runs: &[LoopsRun], f: &dyn Fn(&LoopsRun) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ended = |r: &LoopsRun| r.ended.as_secs_f64();
    let wall = |r: &LoopsRun| r.wall.map_or(f64::NAN, |w| w.as_secs_f64());
    let names: Vec<String> = spreads
        .iter()
        .map(|s| match s {
            Spread::HeadOnly => "head alone".to_string(),
            Spread::OneHost => "1 host".to_string(),
            Spread::Hosts(k) => format!("{k} hosts"),
        })
        .collect();
    for i in 1..spreads.len() {
        report.row(
            &format!("{n} loops ended: {} vs head alone (s)", names[i]),
            "s",
            median(&results[i], &ended),
            Some(median(&results[0], &ended)),
            "(reported: 2 cores)",
            None,
        );
        if !o.stop_at_end {
            report.row(
                &format!("{n} loops, run's end: {} vs head alone (s)", names[i]),
                "s",
                median(&results[i], &wall),
                Some(median(&results[0], &wall)),
                "(reported: 2 cores)",
                None,
            );
        }
    }
    for (i, what) in names.iter().enumerate() {
        let own = median(&results[i], &|r| r.head_cpu.0);
        let kids = median(&results[i], &|r| r.head_cpu.1);
        let on_hosts = median(&results[i], &|r| r.hosts_cpu);
        report.row(
            &format!("{what}: head cpu per loop (ms)"),
            "ms",
            own / n as f64,
            None,
            &format!("(reported; its git {:.2} ms/loop)", kids / n as f64),
            None,
        );
        if i > 0 {
            report.row(
                &format!("{what}: hosts cpu per loop (ms)"),
                "ms",
                on_hosts / n as f64,
                None,
                "(reported)",
                None,
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// The baseline: raw ractor_cluster calls between three processes of this bench.

mod echo {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, ChildStdin, ChildStdout, Stdio};
    use std::time::{Duration, Instant};

    use ractor::message::{BoxedDowncastErr, SerializedMessage};
    use ractor::rpc::CallResult;
    use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
    use td_cluster::node::{self, NodeOptions};
    use td_cluster::secret::ClusterSecret;

    use super::{ANSWER_BYTES, ROLE_ENV, SECRET};

    const SCOPE: &str = "bench";
    const RELAY: &str = "bench-relay";
    const ANSWERER: &str = "bench-answerer";
    const MODEL: &str = "bench-model";
    const TIMEOUT: Duration = Duration::from_secs(10);

    /// A call's bytes and where its answer goes: sent as ractor_cluster sends any
    /// serializable message, with no encoding of ours.
    struct Hop {
        body: Vec<u8>,
        reply: Option<RpcReplyPort<Vec<u8>>>,
    }

    impl ractor::Message for Hop {
        fn serializable() -> bool {
            true
        }

        fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
            Ok(match self.reply {
                Some(reply) => SerializedMessage::Call {
                    variant: String::new(),
                    args: self.body,
                    reply,
                    metadata: None,
                },
                None => SerializedMessage::Cast {
                    variant: String::new(),
                    args: self.body,
                    metadata: None,
                },
            })
        }

        fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
            match message {
                SerializedMessage::Call { args, reply, .. } => Ok(Hop {
                    body: args,
                    reply: Some(reply),
                }),
                SerializedMessage::Cast { args, .. } => Ok(Hop {
                    body: args,
                    reply: None,
                }),
                SerializedMessage::CallReply(..) => Err(BoxedDowncastErr),
            }
        }
    }

    /// The member of `group` (on another node, or this one), waiting for the session to
    /// make it known.
    async fn member(group: &str) -> ActorRef<Hop> {
        let start = Instant::now();
        loop {
            if let Some(cell) =
                ractor::pg::get_scoped_members(&SCOPE.to_string(), &group.to_string())
                    .into_iter()
                    .next()
            {
                return cell.into();
            }
            assert!(start.elapsed() < TIMEOUT, "no member of {group}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn call(to: &ActorRef<Hop>, body: Vec<u8>) -> Vec<u8> {
        match to
            .call(
                move |port| Hop {
                    body,
                    reply: Some(port),
                },
                Some(TIMEOUT),
            )
            .await
        {
            Ok(CallResult::Success(bytes)) => bytes,
            other => panic!("a baseline call failed: {other:?}"),
        }
    }

    /// What an actor of the route does with a call.
    #[derive(Clone, Copy)]
    enum Role {
        /// On the head: hands the question to h2's answerer, and its answer back.
        Relay,
        /// On h2: asks the head's model (a body starting with `M`) or not, and answers.
        Answerer,
        /// On the head: answers the answer's bytes.
        Model,
    }

    struct Hopper(Role, &'static str);

    impl Actor for Hopper {
        type Msg = Hop;
        type State = Option<ActorRef<Hop>>;
        type Arguments = ();

        async fn pre_start(
            &self,
            myself: ActorRef<Hop>,
            (): (),
        ) -> Result<Self::State, ActorProcessingErr> {
            ractor::pg::join_scoped(
                SCOPE.to_string(),
                self.1.to_string(),
                vec![myself.get_cell()],
            );
            Ok(None)
        }

        async fn handle(
            &self,
            _myself: ActorRef<Hop>,
            hop: Hop,
            next: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            let answer = match self.0 {
                Role::Model => vec![b'a'; ANSWER_BYTES],
                Role::Relay => {
                    if next.is_none() {
                        *next = Some(member(ANSWERER).await);
                    }
                    let to = next.as_ref().ok_or("no answerer")?;
                    call(to, hop.body).await
                }
                Role::Answerer => {
                    if hop.body.first() == Some(&b'M') {
                        if next.is_none() {
                            *next = Some(member(MODEL).await);
                        }
                        let to = next.as_ref().ok_or("no model")?;
                        call(to, hop.body).await
                    } else {
                        vec![b'a'; ANSWER_BYTES]
                    }
                }
            };
            if let Some(port) = hop.reply {
                let _ = port.send(answer);
            }
            Ok(())
        }
    }

    /// A baseline node (`BENCH_HOSTS_ROLE` = `head:PORT`, `h1:PORT` or `h2:PORT`). h1 reads
    /// `N M|D` lines on stdin and answers each with the µs of its N calls on one line.
    pub fn node_main(role: &str) {
        let (name, port) = role.split_once(':').expect("ROLE:PORT");
        let port: u16 = port.parse().expect("a port");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(async move {
            let listen = match name {
                "head" => format!("127.0.0.1:{port}").parse().expect("address"),
                _ => node::loopback_any_port(),
            };
            let node = node::start(
                NodeOptions {
                    name: node::unique_node_name(name),
                    host_part: name.to_string(),
                    listen,
                    secret: ClusterSecret::checked(SECRET, "bench".into()).expect("secret"),
                },
                |_| {},
            )
            .await
            .expect("node");
            let spawn = |role, group| async move {
                Actor::spawn(None, Hopper(role, group), ())
                    .await
                    .expect("actor")
                    .0
            };
            match name {
                "head" => {
                    let _relay = spawn(Role::Relay, RELAY).await;
                    let _model = spawn(Role::Model, MODEL).await;
                    println!("ready");
                    // Until the bench closes stdin.
                    let _ = tokio::task::spawn_blocking(|| {
                        let mut line = String::new();
                        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
                    })
                    .await;
                }
                "h2" => {
                    let _answerer = spawn(Role::Answerer, ANSWERER).await;
                    ractor_cluster::client_connect(&node.server, format!("127.0.0.1:{port}"))
                        .await
                        .expect("connect");
                    println!("ready");
                    let _ = tokio::task::spawn_blocking(|| {
                        let mut line = String::new();
                        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {}
                    })
                    .await;
                }
                _ => {
                    ractor_cluster::client_connect(&node.server, format!("127.0.0.1:{port}"))
                        .await
                        .expect("connect");
                    let relay = member(RELAY).await;
                    println!("ready");
                    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
                    std::thread::spawn(move || {
                        for line in std::io::stdin().lines() {
                            let Ok(line) = line else { break };
                            if tx.send(line).is_err() {
                                break;
                            }
                        }
                    });
                    while let Some(line) = rx.recv().await {
                        let mut words = line.split_whitespace();
                        let n: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                        let mode = words.next().unwrap_or("M").as_bytes()[0];
                        let mut question = vec![b'q'; super::QUESTION_BYTES];
                        question[0] = mode;
                        let mut out = Vec::with_capacity(n);
                        for _ in 0..n {
                            let start = Instant::now();
                            let answer = call(&relay, question.clone()).await;
                            out.push(start.elapsed().as_micros().to_string());
                            assert_eq!(answer.len(), ANSWER_BYTES);
                        }
                        println!("{}", out.join(" "));
                    }
                }
            }
        });
    }

    /// The three baseline processes.
    pub struct Cluster {
        nodes: Vec<Child>,
        h1_in: ChildStdin,
        h1_out: BufReader<ChildStdout>,
    }

    fn spawn(role: &str, port: u16) -> (Child, ChildStdin, BufReader<ChildStdout>) {
        let mut child = super::placed(std::env::current_exe().expect("this bench"), role)
            .env(ROLE_ENV, format!("{role}:{port}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("a baseline node");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("ready line");
        assert_eq!(line.trim(), "ready", "baseline node {role}");
        (child, stdin, stdout)
    }

    impl Cluster {
        pub fn start() -> Cluster {
            let port = super::free_port();
            let head = spawn("head", port);
            let h2 = spawn("h2", port);
            let h1 = spawn("h1", port);
            let mut cluster = Cluster {
                nodes: Vec::new(),
                h1_in: h1.1,
                h1_out: h1.2,
            };
            // The others' stdin kept open (closing it ends them).
            std::mem::forget(head.1);
            std::mem::forget(h2.1);
            cluster.nodes = vec![head.0, h2.0, h1.0];
            // Warm up both routes.
            let _ = cluster.ask(200, true);
            let _ = cluster.ask(200, false);
            cluster
        }

        /// `n` calls from h1, through the head's model (`via_model`) or not.
        pub fn calls(&mut self, n: usize, via_model: bool) -> Vec<Duration> {
            self.ask(n, via_model)
        }

        /// Time on a CPU (ms) of the head, h1 and h2 so far, then their context switches.
        pub fn gauges(&self) -> [f64; 6] {
            // `nodes` is head, h2, h1.
            super::gauges_of([0, 2, 1].map(|i| self.nodes[i].id()))
        }

        fn ask(&mut self, n: usize, via_model: bool) -> Vec<Duration> {
            writeln!(self.h1_in, "{n} {}", if via_model { "M" } else { "D" }).expect("ask h1");
            self.h1_in.flush().expect("flush");
            let mut line = String::new();
            self.h1_out.read_line(&mut line).expect("h1's answer");
            line.split_whitespace()
                .map(|us| Duration::from_micros(us.parse().expect("µs")))
                .collect()
        }

        pub fn stop(mut self) {
            for child in &mut self.nodes {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
