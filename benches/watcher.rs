//! `cargo bench --bench watcher`: from an outside write to the owning loop's read stamp
//! being dropped, vs the raw `notify` event latency of the same write.
//!
//! 100 loops run on a `Runtime` with file watching on (engines parked at the start gate),
//! each in its own worktree holding `src/data.txt`, each holding a read stamp for that file
//! (as after `read_file`). A bare `notify` watcher, set up like the daemon's (recursive on
//! the same 100 roots), runs in the same process. Each sample writes new content to one
//! worktree's file (round robin), taking `t0` just before the write, and records:
//! - ours: when the loop actor dropped the stamp — the `FileChanged` event it records right
//!   after `ToolContext::note_outside_change` returns true (an event listener timestamps
//!   it; the stamp is then checked to be gone);
//! - raw: the first `notify` event for that file on the bare watcher's callback thread that
//!   reports a change (a modify, create or remove event; the `Access(Open)` that precedes
//!   the write is not a change, and the daemon rightly ignores it).
//!
//! Target: p99(ours) ≤ p99(raw) + 5 ms.

mod common;

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Report;
use common::actors::{Dist, LoopParams, loop_spec, print_machine, unlimited_runtime};
use notify::{RecursiveMode, Watcher as _};
use td_llm::scripted::ScriptedLlm;
use td_protocol::events::{EventKind, EventLog};
use td_toolkit::context::ToolContext;

const WORKTREES: usize = 100;
const WARMUP: usize = 200;
const SAMPLES: usize = 2_000;
const GIVE_UP: Duration = Duration::from_secs(5);

/// Waits for the first message on `rx` that `pred` accepts, until `deadline`.
fn wait_for<T>(rx: &mpsc::Receiver<T>, deadline: Instant, pred: impl Fn(&T) -> bool) -> Option<T> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(m) if pred(&m) => return Some(m),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

#[tokio::main]
async fn main() {
    print_machine("watcher");
    let mut report = Report::new("watcher");
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().canonicalize().expect("canonical tempdir");

    // Stamp drops, as the loops record them.
    let (drop_tx, drop_rx) = mpsc::channel::<(Instant, String, String)>();
    let events = Arc::new(EventLog::new());
    {
        let tx = Mutex::new(drop_tx);
        events.subscribe(move |e| {
            if let EventKind::FileChanged { loop_name, path } = &e.kind {
                let now = Instant::now();
                let _ = tx
                    .lock()
                    .expect("sender")
                    .send((now, loop_name.clone(), path.clone()));
            }
        });
    }

    let names: Vec<String> = (0..WORKTREES).map(|i| format!("w{i:03}")).collect();
    let script: String = names.iter().map(|n| format!("{n}: {{}}\n")).collect();
    let llm = Arc::new(ScriptedLlm::from_yaml(&script, "bench-script.yml").expect("script"));
    let mut rt = unlimited_runtime(true, events.clone()).await;

    let mut loops: Vec<(String, Arc<ToolContext>, PathBuf)> = Vec::new();
    for n in &names {
        let wt = base.join(n);
        std::fs::create_dir_all(wt.join("src")).expect("worktree");
        let file = wt.join("src/data.txt");
        std::fs::write(&file, "version 0\n").expect("write");
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
        let ctx = spec.ctx.clone();
        ctx.record_stamp(&file, b"version 0\n");
        rt.spawn_loop(spec).await.expect("spawn");
        loops.push((n.clone(), ctx, file));
    }

    // The bare watcher: same roots, recursive, events timestamped on notify's thread.
    let (raw_tx, raw_rx) = mpsc::channel::<(Instant, notify::Event)>();
    let raw_tx = Mutex::new(raw_tx);
    let mut raw = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res {
            let now = Instant::now();
            let _ = raw_tx.lock().expect("sender").send((now, ev));
        }
    })
    .expect("raw watcher");
    for n in &names {
        raw.watch(&base.join(n), RecursiveMode::Recursive)
            .expect("raw watch");
    }

    // The measuring runs on a blocking thread: it waits on std channels.
    let measured = tokio::task::spawn_blocking(move || {
        let mut ours = Vec::with_capacity(SAMPLES);
        let mut raws = Vec::with_capacity(SAMPLES);
        let mut missed = 0usize;
        for k in 0..WARMUP + SAMPLES {
            let (name, ctx, file) = &loops[k % WORKTREES];
            let content = format!("version {}\n", k + 1);
            while raw_rx.try_recv().is_ok() {}
            while drop_rx.try_recv().is_ok() {}
            let t0 = Instant::now();
            std::fs::write(file, &content).expect("outside write");
            let deadline = t0 + GIVE_UP;
            let dropped = wait_for(&drop_rx, deadline, |(_, l, p)| {
                l == name && p == "src/data.txt"
            });
            // The first event that says the content changed: opening the file for writing
            // (`Access(Open)`, seen tens of µs before the write) is not yet a change.
            let first_raw = wait_for(&raw_rx, deadline, |(_, ev)| {
                ev.paths.contains(file) && !matches!(ev.kind, notify::EventKind::Access(_))
            });
            match (dropped, first_raw) {
                (Some((t_ours, _, _)), Some((t_raw, _))) => {
                    assert!(
                        ctx.stamp(file).is_none(),
                        "stamp still held after the event"
                    );
                    if k >= WARMUP {
                        ours.push(t_ours - t0);
                        raws.push(t_raw - t0);
                    }
                }
                _ => missed += 1,
            }
            // The loop has now "read" the new content again; let the write's trailing
            // events pass before the next sample.
            ctx.record_stamp(file, content.as_bytes());
            std::thread::sleep(Duration::from_millis(3));
        }
        drop(raw);
        (Dist::new(&ours), Dist::new(&raws), missed)
    });
    let (ours, raws, missed) = measured.await.expect("measure");
    eprintln!(
        "# {} samples over {WORKTREES} watched worktrees; {missed} writes gave no event within {GIVE_UP:?}",
        ours.len()
    );
    report.row(
        "write_to_stamp_dropped_p50",
        "us",
        ours.p50(),
        Some(raws.p50()),
        "(reported)",
        None,
    );
    let met = ours.p99() <= raws.p99() + 5_000.0 && missed == 0;
    report.row(
        "write_to_stamp_dropped_p99",
        "us",
        ours.p99(),
        Some(raws.p99()),
        "<= raw p99 + 5000 us",
        Some(met),
    );
    report.row(
        "added_p99",
        "us",
        ours.p99() - raws.p99(),
        None,
        "<= 5000",
        Some(met),
    );
    rt.shutdown().await;
    report.finish();
}
