//! `cargo bench --bench lane`: one small `read_file` through a tool lane vs the same call
//! made directly.
//!
//! Ours: `CallPath::call` over `ToolLanes` exactly as the engine calls it (route → loop task
//! → lane pool actor → worker actor → reply straight to the caller; no receipt log).
//! Baseline: `ToolSet::call` on the same context, tool set and input in the caller's task
//! (what `InCallerTask` does).
//! Both run alternately, sample by sample, from one tokio task; both include everything the
//! registry does (schema validation, timeout guard, receipt, stamp). The file is 20 short
//! lines. Target: p50(ours) − p50(baseline) ≤ 20 µs.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::Report;
use common::actors::{Dist, print_machine};
use serde_json::json;
use td_runtime::tool_lanes::{LaneSizes, ToolLanes};
use td_toolkit::call_path::CallPath;
use td_toolkit::context::ToolContext;

#[tokio::main]
async fn main() {
    print_machine("lane");
    let mut report = Report::new("lane");
    let dir = tempfile::tempdir().expect("tempdir");
    let text: String = (1..=20)
        .map(|i| format!("line {i} of a small file\n"))
        .collect();
    std::fs::write(dir.path().join("small.txt"), text).expect("write");
    let ctx = Arc::new(ToolContext::new(dir.path(), "bench").expect("ctx"));
    let tools = Arc::new(td_tools::tool_set(&["read_file"]).expect("tools"));
    let lanes = ToolLanes::start(LaneSizes::default(), None)
        .await
        .expect("lanes");

    const WARMUP: usize = 2_000;
    const SAMPLES: usize = 30_000;
    let calls = CallPath::new(ctx.clone(), tools.clone(), Arc::new(lanes.clone()), None);
    let driver = tokio::spawn(async move {
        let input = json!({"path": "small.txt"});
        let mut ours = Vec::with_capacity(SAMPLES);
        let mut base = Vec::with_capacity(SAMPLES);
        for i in 0..WARMUP + SAMPLES {
            let t = Instant::now();
            let out = calls
                .call(Some("c"), "read_file", input.clone())
                .await
                .outcome;
            let d_ours = t.elapsed();
            assert!(!out.is_error, "{}", out.content);

            let t = Instant::now();
            let out = tools
                .call(&ctx, Some("c"), "read_file", input.clone())
                .await;
            let d_base = t.elapsed();
            assert!(!out.is_error, "{}", out.content);
            if i >= WARMUP {
                ours.push(d_ours);
                base.push(d_base);
            }
        }
        (Dist::new(&ours), Dist::new(&base))
    });
    let (ours, base) = driver.await.expect("driver");
    eprintln!("# {} samples each, alternating", ours.len());
    let added = ours.p50() - base.p50();
    report.row(
        "read_file_p50",
        "us",
        ours.p50(),
        Some(base.p50()),
        "added <= 20 us",
        Some(added <= 20.0),
    );
    report.row(
        "read_file_p99",
        "us",
        ours.p99(),
        Some(base.p99()),
        "(reported)",
        None,
    );
    report.row(
        "added_latency_p50",
        "us",
        added,
        None,
        "<= 20",
        Some(added <= 20.0),
    );
    lanes.stop_and_wait().await;
    report.finish();
}
