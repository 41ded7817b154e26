//! `cargo bench --bench record`: what writing a run record costs per operation, on the disk
//! the bench runs on (`BENCH_DIR`, default the system temp directory).
//!
//! Each loop (a thread of its own, as loops write their records in parallel) records what a
//! real loop records, through the same `RunRecord` a run uses: its start; then per iteration
//! its start, 4 model turns (request, reply and what the call spent — which changes
//! `summary.json`'s usage and spend —, one tool call's receipt and result), its end and a
//! progress note; then its end.
//! Reported per kind of write: p50 and p99 latency, and the run's wall time (until its final
//! summary is written), for 1, 10 and 100 loops (`--loops 1,10,100`).
//!
//! The model and the tools are left out on purpose: against a real model turn (seconds) the
//! record's cost is small whatever it is; this shows it alone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use taskdaemon::run::record::{RunMeta, RunRecord, RunStatus};
use td_engine::transcript::{TranscriptEntry, TranscriptSink};
use td_llm::{LlmResponse, Message, Purpose, StopReason, ToolCall, Usage};
use td_protocol::events::{EventKind, EventLog};
use td_protocol::spend::Spend;
use td_toolkit::context::ToolContext;
use td_toolkit::receipts::Receipt;

const ITERATIONS: u32 = 3;
const TURNS: u32 = 4;

/// Latencies of one kind of write.
#[derive(Default)]
struct Samples {
    receipt: Vec<Duration>,
    reply: Vec<Duration>,
    iteration_end: Vec<Duration>,
    other: Vec<Duration>,
}

impl Samples {
    fn extend(&mut self, other: Samples) {
        self.receipt.extend(other.receipt);
        self.reply.extend(other.reply);
        self.iteration_end.extend(other.iteration_end);
        self.other.extend(other.other);
    }
}

fn timed(into: &mut Vec<Duration>, f: impl FnOnce()) {
    let start = Instant::now();
    f();
    into.push(start.elapsed());
}

/// One loop's whole record.
fn one_loop(record: &RunRecord, events: &EventLog, name: &str, receipt: &Receipt) -> Samples {
    let mut s = Samples::default();
    let log = record.receipts_for(name).unwrap();
    timed(&mut s.other, || {
        events.record(EventKind::LoopStarted {
            loop_name: name.into(),
            loop_type: "ralph".into(),
            host: None,
        })
    });
    for iteration in 1..=ITERATIONS {
        timed(&mut s.other, || {
            events.record(EventKind::IterationStarted {
                loop_name: name.into(),
                iteration,
            });
            record.record(
                name,
                TranscriptEntry::IterationStarted {
                    iteration,
                    system: "You are a coding loop. ".repeat(40),
                },
            );
        });
        for turn in 1..=TURNS {
            timed(&mut s.other, || {
                record.record(
                    name,
                    TranscriptEntry::Request {
                        iteration,
                        turn,
                        purpose: Purpose::Iteration,
                        new_messages: vec![Message::user_text("x".repeat(400))],
                    },
                )
            });
            timed(&mut s.reply, || {
                record.record(
                    name,
                    TranscriptEntry::Response {
                        iteration,
                        turn,
                        response: LlmResponse {
                            text: Some("Reading the file.".into()),
                            tool_calls: vec![ToolCall {
                                id: format!("{name}-{turn}"),
                                name: "read_file".into(),
                                input: json!({"path": "src/lib.rs"}).into(),
                            }],
                            stop_reason: StopReason::ToolUse,
                            usage: Usage {
                                input_tokens: 1200,
                                output_tokens: 40,
                                ..Default::default()
                            },
                        },
                    },
                );
                // What the call spent: since issue 14 this entry, not the reply, changes the
                // summary's usage and spend.
                record.record(
                    name,
                    TranscriptEntry::Spent {
                        iteration,
                        turn,
                        charged_to: None,
                        spend: Spend::call([1200, 40, 0, 0], Some(4_200_000)),
                    },
                )
            });
            timed(&mut s.receipt, || log.append(receipt).unwrap());
            timed(&mut s.other, || {
                record.record(
                    name,
                    TranscriptEntry::ToolResult {
                        iteration,
                        turn,
                        call_id: format!("{name}-{turn}"),
                        name: "read_file".into(),
                        content: "1 | fn main() {}\n".repeat(20),
                        is_error: false,
                    },
                )
            });
        }
        timed(&mut s.iteration_end, || {
            events.record(EventKind::IterationEnded {
                loop_name: name.into(),
                iteration,
                ended_by: "end_turn".into(),
                validation_exit: Some(1),
                validation_passed: Some(false),
                model_calls: Some(1),
                spend: None,
                wall_ms: None,
            })
        });
        timed(&mut s.other, || {
            events.record(EventKind::ProgressNoted {
                loop_name: name.into(),
                iteration,
                note: "validation failed".into(),
            })
        });
    }
    timed(&mut s.other, || {
        events.record(EventKind::LoopCompleted {
            loop_name: name.into(),
            iterations: ITERATIONS,
            summary: None,
        })
    });
    s
}

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort_unstable();
    let at = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[at].as_secs_f64() * 1e6
}

/// One measured figure: (metric, unit, value).
type Row = (String, &'static str, f64);

fn run(root: &Path, loops: usize, receipt: &Receipt) -> Vec<Row> {
    let dir = root.join(format!("run-{loops}"));
    let names: Vec<String> = (0..loops).map(|i| format!("l{i:04}")).collect();
    let record = Arc::new(
        RunRecord::create(
            &dir,
            "bench",
            RunMeta {
                config: Some("taskdaemon.yml".into()),
                loops: names.iter().map(|n| (n.clone(), "ralph".into())).collect(),
                sandbox: None,
            },
        )
        .unwrap(),
    );
    let events = Arc::new(EventLog::new());
    events.subscribe(record.events_listener());
    let start = Instant::now();
    let threads: Vec<_> = names
        .into_iter()
        .map(|name| {
            let (record, events, receipt) = (record.clone(), events.clone(), receipt.clone());
            std::thread::spawn(move || one_loop(&record, &events, &name, &receipt))
        })
        .collect();
    let mut all = Samples::default();
    for t in threads {
        all.extend(t.join().unwrap());
    }
    // The run's end: the final summary is on the disk.
    record.finish(RunStatus::Completed).unwrap();
    let wall = start.elapsed();
    assert_eq!(record.write_errors(), 0);
    let mut rows: Vec<Row> = vec![(
        format!("{loops} loops: wall"),
        "ms",
        wall.as_secs_f64() * 1e3,
    )];
    for (what, samples) in [
        ("receipt", &mut all.receipt),
        ("reply (+ summary)", &mut all.reply),
        ("iteration end", &mut all.iteration_end),
        ("other lines", &mut all.other),
    ] {
        for (p, name) in [(0.5, "p50"), (0.99, "p99")] {
            rows.push((
                format!("{loops} loops: {what} {name}"),
                "us",
                percentile(samples, p),
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

fn main() {
    let mut sizes = vec![1usize, 10, 100];
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--loops")
        && let Some(list) = args.get(i + 1)
    {
        sizes = list.split(',').filter_map(|s| s.parse().ok()).collect();
    }
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let root = tempfile::tempdir_in(&base).unwrap();
    // A real receipt, whatever fields receipts have.
    let worktree = root.path().join("worktree");
    std::fs::create_dir_all(&worktree).unwrap();
    let ctx = ToolContext::new(&worktree, "bench").unwrap();
    let receipt = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(td_tools::all_tools().call(&ctx, None, "list_directory", json!({})))
        .receipt;
    println!(
        "record bench in {} ({} iterations x {} turns per loop)",
        base.display(),
        ITERATIONS,
        TURNS
    );
    let rows: Vec<Row> = sizes
        .into_iter()
        .flat_map(|loops| run(root.path(), loops, &receipt))
        .collect();
    for (metric, unit, value) in &rows {
        // The format every bench prints; there is no baseline in the same run (the code
        // before a change is run separately) and no target: the figures are reported.
        println!(
            "{{\"bench\": \"record\", \"metric\": \"{metric}\", \"unit\": \"{unit}\", \"ours\": {value:.1}, \"baseline\": null, \"ratio\": null, \"target\": null, \"met\": null}}"
        );
    }
    println!();
    for (metric, unit, value) in &rows {
        println!("{metric:<36} {value:>10.1} {unit}");
    }
}
