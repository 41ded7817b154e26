//! The heavy lane through the real binary (issue 16): with `lanes: {heavy: 1}`, two loops
//! whose builds, tests and validations take a while share one worker, so one of them waits;
//! the run record says per loop how long its calls waited and how long its builds, tests and
//! validations ran (`summary.json`'s `heavy`, rebuilt the same from the events), and the
//! plain progress says who waited.

use std::process::Command;

use serde_json::Value;

mod common;
use common::flagged_run::{FlaggedRun, summary};

/// Each loop builds, tests, then completes; its validation runs after that.
const SCRIPT: &str = r#"
a:
  turns:
    - calls:
        - build: {}
        - test: {}
        - complete_task: {summary: "a done"}
b:
  turns:
    - calls:
        - build: {}
        - test: {}
        - complete_task: {summary: "b done"}
"#;

const LOOPS: &str = "  - {name: a, type: slow, task: \"Build it.\", validation: \"sleep 0.4\"}\n  - {name: b, type: slow, task: \"Build it.\", validation: \"sleep 0.4\"}\n";

fn taskdaemon(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .args(args)
        .output()
        .unwrap()
}

fn ms(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field}: {v:#}"))
}

#[test]
fn a_heavy_lane_of_one_makes_a_loop_wait_and_the_record_says_how_long() {
    let run = FlaggedRun::new(SCRIPT, LOOPS);
    let config = std::fs::read_to_string(&run.config).unwrap();
    std::fs::write(
        &run.config,
        format!(
            "{config}lanes: {{heavy: 1}}\nloop-types:\n  slow: {{extends: code, build: \"sleep 0.3\", test: \"sleep 0.2\"}}\n"
        ),
    )
    .unwrap();
    let out = run.command(&[]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");

    let s = summary(&run.run_dir);
    let mut waited = 0;
    for name in ["a", "b"] {
        let l = &s["loops"][name];
        assert_eq!(l["status"], "completed", "{s:#}");
        let heavy = &l["heavy"];
        // build, test, the loop's validation and the merge queue's (both under its name).
        assert!(ms(heavy, "calls") >= 3, "{heavy:#}");
        let build = ms(heavy, "build_ms");
        let test = ms(heavy, "test_ms");
        let validate = ms(heavy, "validate_ms");
        assert!((300..30_000).contains(&build), "{name}: {heavy:#}");
        assert!((200..30_000).contains(&test), "{name}: {heavy:#}");
        assert!((400..60_000).contains(&validate), "{name}: {heavy:#}");
        waited += ms(heavy, "waited_ms");
    }
    // One worker for two loops' calls of a few hundred ms each: one of them waited.
    assert!(waited > 0, "{s:#}");
    let events = run.events();
    assert!(
        events.iter().any(|e| e["event"] == "heavy_queued"),
        "no call queued"
    );
    assert!(
        stdout.contains("waited") && stdout.contains("for the heavy lane"),
        "{stdout}"
    );

    // The same figures come back from the events alone.
    std::fs::remove_file(run.run_dir.join("summary.json")).unwrap();
    let dir = run.run_dir.display().to_string();
    let out = taskdaemon(&["status", "--dir", &dir, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rebuilt: Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in ["a", "b"] {
        assert_eq!(
            rebuilt["loops"][name]["heavy"], s["loops"][name]["heavy"],
            "{rebuilt:#}"
        );
    }
    // And the table says it per loop, in words.
    let out = taskdaemon(&["status", "--dir", &dir]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    for name in ["a", "b"] {
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("heavy {name}: waited ")))
            .unwrap_or_else(|| panic!("no heavy line for {name}:\n{table}"));
        assert!(
            line.contains("build ") && line.contains("test ") && line.contains("validate "),
            "{line}"
        );
    }
}
