//! `cargo bench --bench launch`: what confinement adds to starting a command.
//!
//! Ours: `process::run` of `true` confined as a tool's command is (policy prepared per call:
//! Landlock ruleset, seccomp programs, environment; then setsid, PID + mount namespaces,
//! /proc mounted, `.git` bound read-only, capabilities dropped, no_new_privs, Landlock,
//! seccomp), in the net lane and in the no-net lane (which adds a network namespace).
//! Baseline: `process::run` of the same `true` unconfined (its own process group, same
//! capture and timeout), alternating sample by sample in the same task. Target: added p50
//! ≤ 2 ms (the net lane; the no-net lane is reported).
//!
//! Also reported: the net lane with a hidden file three directories down in the worktree
//! (`sandbox.hide: [a/b/c/key.txt]`), which the launcher pins (three more bind mounts, the
//! file's identity checked) besides hiding it; the default settings above pin nothing.

mod common;

use std::time::{Duration, Instant};

use common::Report;
use common::actors::{Dist, print_machine};
use td_confine::process::{CommandOptions, run};
use td_confine::{CommandPolicy, SandboxSettings, prepare};

const WARMUP: usize = 20;

fn samples() -> usize {
    common::rounds(300)
}

#[tokio::main]
async fn main() {
    print_machine("launch");
    let mut report = Report::new("launch");
    let missing = td_confine::protections().missing();
    if !missing.is_empty() {
        eprintln!("# this machine lacks protections: {missing:?}");
    }
    let worktree = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(worktree.path().join(".git")).expect(".git");
    let tmp = tempfile::tempdir().expect("tempdir");
    let default = SandboxSettings::default();
    std::fs::create_dir_all(worktree.path().join("a/b/c")).expect("a/b/c");
    std::fs::write(worktree.path().join("a/b/c/key.txt"), "secret").expect("key.txt");
    let hidden_deep = SandboxSettings {
        hide: vec!["a/b/c/key.txt".into()],
        ..SandboxSettings::default()
    }
    .resolved(worktree.path());
    for (metric, no_network, settings) in [
        ("true_net_lane", false, &default),
        ("true_no_net_lane", true, &default),
        ("true_net_lane_hidden_deep", false, &hidden_deep),
    ] {
        if !common::selected(metric) {
            continue;
        }
        let mut ours = Vec::new();
        let mut base = Vec::new();
        for i in 0..WARMUP + samples() {
            let t = Instant::now();
            let prepared = prepare(&CommandPolicy {
                settings,
                worktree: worktree.path(),
                cwd: worktree.path(),
                temp_dir: tmp.path(),
                network: if no_network {
                    td_confine::Network::Isolated
                } else {
                    td_confine::Network::Host
                },
                launcher_env: vec![("TMPDIR".into(), tmp.path().into())],
            })
            .expect("prepare");
            if i == 0 && missing.is_empty() {
                // What is measured: the default pins nothing; a/b/c/key.txt pins a, a/b, a/b/c.
                let expected = if std::ptr::eq(settings, &hidden_deep) {
                    3
                } else {
                    0
                };
                assert_eq!(prepared.plan.pins.len(), expected, "{metric}");
            }
            let out = run(CommandOptions::new("true", worktree.path())
                .timeout(Duration::from_secs(10))
                .confined(prepared))
            .await
            .expect("confined run");
            let d_ours = t.elapsed();
            assert!(out.success(), "{out:?}");

            let t = Instant::now();
            let out =
                run(CommandOptions::new("true", worktree.path()).timeout(Duration::from_secs(10)))
                    .await
                    .expect("plain run");
            let d_base = t.elapsed();
            assert!(out.success(), "{out:?}");
            if i >= WARMUP {
                ours.push(d_ours);
                base.push(d_base);
            }
        }
        let (ours, base) = (Dist::new(&ours), Dist::new(&base));
        eprintln!("# {metric}: {} samples each, alternating", ours.len());
        let added_ms = (ours.p50() - base.p50()) / 1000.0;
        let gate = metric == "true_net_lane";
        report.row(
            &format!("{metric}_p50"),
            "us",
            ours.p50(),
            Some(base.p50()),
            if gate { "added <= 2 ms" } else { "(reported)" },
            gate.then_some(added_ms <= 2.0),
        );
        report.row(
            &format!("{metric}_p99"),
            "us",
            ours.p99(),
            Some(base.p99()),
            "(reported)",
            None,
        );
        report.row(
            &format!("{metric}_added_p50"),
            "ms",
            added_ms,
            None,
            if gate { "<= 2" } else { "(reported)" },
            gate.then_some(added_ms <= 2.0),
        );
    }
    report.finish();
}
