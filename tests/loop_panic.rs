//! A loop actor that panics in a real run is restarted by the daemon and goes on at its
//! next iteration (issue 15), through the real binary: the scripted model's `panic` turn
//! makes the loop's engine panic in iteration 1, as a bug in a model client would.

use serde_json::Value;

mod common;
use common::flagged_run::{FlaggedRun, summary};

#[test]
fn a_loop_actor_that_panics_is_restarted_and_completes_at_its_next_iteration() {
    let run = FlaggedRun::new(
        r#"
p:
  turns:
    - calls:
        - write_file: {path: a.txt, content: "a\n"}
    - panic: "injected by the script"
    - calls:
        - write_file: {path: b.txt, content: "b\n"}
        - complete_task: {summary: "done after a restart"}
"#,
        "  - name: p\n    type: ralph\n    task: \"Write a.txt and b.txt.\"\n    validation: \"test -e a.txt && test -e b.txt\"\n",
    );
    let out = run.command(&[]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let s = summary(&run.run_dir);
    assert_eq!(s["loops"]["p"]["status"], "completed", "{s:#}");
    // The iteration the panic cut counts as run: the loop completed in iteration 2, with
    // what iteration 1 wrote before the panic still in its worktree.
    assert_eq!(s["loops"]["p"]["iterations"], 2, "{s:#}");
    let restarted: Vec<Value> = run
        .events()
        .into_iter()
        .filter(|e| e["event"] == "loop_restarted")
        .collect();
    assert_eq!(restarted.len(), 1, "{restarted:#?}");
    assert_eq!(restarted[0]["loop_name"], "p");
    assert_eq!(restarted[0]["restarts"], 1);
    assert!(
        restarted[0]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("injected by the script"),
        "{:#}",
        restarted[0]
    );
    // Its peers are not told it started again; the run has one start of it.
    assert_eq!(run.count("loop_started", "p"), 1);
    assert_eq!(run.count("loop_completed", "p"), 1);
}
