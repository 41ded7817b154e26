//! Budgets and accounting through the real binary, on the scripted model with the usage
//! figures its script reports: a money budget pauses a loop (status `paused`, the spend
//! shown) and `run --resume` with a raised budget completes it; the tokens of an answer are
//! charged to the loop that asked; loops in parallel overshoot the run's budget by at most
//! the calls in flight when it was reached.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::init_repo;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A repository with `script.yml` and a `taskdaemon.yml` made of `config` (the `llm:` line
/// is added), and a run directory beside it.
struct Project {
    _tmp: tempfile::TempDir,
    config: PathBuf,
    run_dir: PathBuf,
}

impl Project {
    fn new(script: &str, config: &str) -> Project {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let repo = root.join("repo");
        init_repo(&repo, &[("README.md", "sample\n")]);
        std::fs::write(repo.join("script.yml"), script).unwrap();
        let project = Project {
            _tmp: tmp,
            config: repo.join("taskdaemon.yml"),
            run_dir: root.join("run"),
        };
        project.configure(config);
        project
    }

    fn configure(&self, config: &str) {
        std::fs::write(
            &self.config,
            format!("llm: {{provider: scripted, script: script.yml}}\n{config}"),
        )
        .unwrap();
    }

    fn run(&self, extra: &[&str]) -> Output {
        Command::new(bin())
            .args(["run", "-c"])
            .arg(&self.config)
            .arg("--run-dir")
            .arg(&self.run_dir)
            .args(extra)
            .output()
            .unwrap()
    }

    fn summary(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.run_dir.join("summary.json")).unwrap())
            .unwrap()
    }

    fn status(&self, json: bool) -> Output {
        let mut c = Command::new(bin());
        c.arg("status");
        if json {
            c.arg("--json");
        }
        c.arg("--dir").arg(&self.run_dir).output().unwrap()
    }

    fn events(&self) -> Vec<Value> {
        common::lines(&self.run_dir.join("events.jsonl"))
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// `n` scripted turns that each write a file and report `usage`, then `complete_task`.
fn turns(n: usize, usage: &str) -> String {
    let mut s = String::new();
    for i in 0..n {
        s.push_str(&format!(
            "    - calls:\n        - write_file: {{path: f{i}.txt, content: \"{i}\\n\"}}\n      usage: {usage}\n"
        ));
    }
    s.push_str(&format!(
        "    - calls:\n        - complete_task: {{summary: done}}\n      usage: {usage}\n"
    ));
    s
}

/// A loop type with few tools, so that a request's worst case stays small and predictable.
const MINI: &str =
    "loop-types:\n  mini: {extends: ralph, tools: [write_file, complete_task], max-turns: 40}\n";

/// $100 per million input tokens (1000 cost $0.10), $1 per million output tokens.
const PRICES: &str =
    "prices:\n  scripted: {input: 100, output: 1, cache-read: 10, cache-write: 125}\n";

fn nano(v: &Value) -> u64 {
    v["cost_nano_usd"].as_u64().unwrap_or_else(|| panic!("{v}"))
}

#[test]
fn a_money_budget_pauses_the_loop_and_resume_with_a_raised_budget_completes_it() {
    // Each turn costs $0.0101, less than the worst case reserved for it (its request's bytes
    // at $100 per million tokens, and 1,024 output tokens).
    let script = format!(
        "work:\n  turns:\n{}",
        turns(8, "{input_tokens: 100, output_tokens: 100}")
    );
    let loops = "loops:\n  - {name: work, type: mini, task: write the files}\n";
    let p = Project::new(
        &script,
        &format!("{MINI}{PRICES}budget: {{usd: 0.1, soft-percent: 10}}\n{loops}"),
    );
    let out = p.run(&[]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--resume"), "the way on is said: {stderr}");

    let summary = p.summary();
    let work = &summary["loops"]["work"];
    assert_eq!(work["status"], "paused", "{work:#}");
    assert!(
        work["reason"].as_str().unwrap().contains("budget"),
        "{work:#}"
    );
    assert_eq!(summary["status"], "paused", "{summary:#}");
    // The budget is never passed: no call's real cost was above what it reserved.
    let spent = nano(&work["charged"]);
    assert!(spent > 0 && spent <= 100_000_000, "{work:#}");
    assert_eq!(spent % 10_100_000, 0, "whole turns: {work:#}");
    assert!(spent < 9 * 10_100_000, "it did not finish: {work:#}");
    assert_eq!(
        work["usage"]["input_tokens"],
        work["charged"]["input_tokens"]
    );
    assert!(
        p.events()
            .iter()
            .any(|e| e["event"] == "loop_paused" && e["loop_name"] == "work"),
        "a loop_paused event"
    );
    let ended: Vec<Value> = p
        .events()
        .into_iter()
        .filter(|e| e["event"] == "iteration_ended")
        .collect();
    assert!(
        !ended.is_empty()
            && ended
                .iter()
                .all(|e| e["spend"]["model_calls"].as_u64().is_some()),
        "per-iteration spend in the events: {ended:?}"
    );

    // Past the soft threshold the model was told what is left: at the end of the
    // conversation, never in the system prompt (which a prompt cache keeps).
    let transcript: Vec<Value> = common::lines(&p.run_dir.join("loops/work/transcript.jsonl"))
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let told: Vec<&Value> = transcript
        .iter()
        .filter(|e| e["entry"] == "request" && e.to_string().contains("[budget: "))
        .collect();
    assert!(!told.is_empty(), "the model was told its budget");
    assert!(
        told[0].to_string().contains("money ($0.0"),
        "what is left: {}",
        told[0]
    );
    assert!(
        transcript
            .iter()
            .filter(|e| e["entry"] == "iteration_started")
            .all(|e| !e["system"].as_str().unwrap().contains("budget")),
        "not in the system prompt"
    );

    let status = p.status(false);
    let shown = text(&status.stdout);
    let row = shown.lines().find(|l| l.starts_with("work ")).unwrap();
    assert!(row.contains("paused"), "{shown}");
    let cost = format!("${:.4}", spent as f64 / 1e9);
    assert!(row.contains(&cost), "the spend {cost} in: {shown}");

    // A higher budget, and the same run goes on where it paused.
    p.configure(&format!("{MINI}{PRICES}budget: {{usd: 5}}\n{loops}"));
    let run_id = summary["run_id"].as_str().unwrap().to_string();
    let out = p.run(&["--resume", &run_id]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = p.summary();
    let work = &summary["loops"]["work"];
    assert_eq!(work["status"], "completed", "{work:#}");
    // What was spent before the pause still counts: the paused iteration runs again from
    // its start (like one cut short by a stop), so its calls are made, and paid, again:
    // nine turns after the resume, on top of those before it.
    let total = nano(&work["charged"]);
    assert_eq!(total, spent + 9 * 10_100_000, "{work:#}");
    let paused_ends = p
        .events()
        .iter()
        .filter(|e| e["event"] == "iteration_ended" && e["ended_by"] == "paused")
        .count();
    assert_eq!(paused_ends, 1, "the iteration cut short by the budget");
    assert!(total <= 5_000_000_000, "{work:#}");
    assert_eq!(summary["status"], "completed");
    // The work done before the pause was kept: every file is on the loop's branch.
    let branch = work["branch"].as_str().unwrap();
    let repo = p.config.parent().unwrap();
    for i in 0..8 {
        assert_eq!(
            common::git(repo, &["show", &format!("{branch}:f{i}.txt")]),
            format!("{i}\n")
        );
    }
}

#[test]
fn the_tokens_of_an_answer_are_charged_to_the_loop_that_asked() {
    let script = "\
asker:
  turns:
    - calls:
        - query_loop: {target_exec_id: answerer, question: \"Which port?\"}
      usage: {input_tokens: 100, output_tokens: 10}
    - calls:
        - complete_task: {summary: asked}
      usage: {input_tokens: 100, output_tokens: 10}
answerer:
  turns:
    - calls:
        - complete_task: {summary: here}
      usage: {input_tokens: 7, output_tokens: 3}
  answers:
    - reply: \"8080\"
      usage: {input_tokens: 5000, output_tokens: 50, cache_read_tokens: 20}
";
    let loops = "loops:\n  - {name: asker, type: ralph, task: ask}\n  - {name: answerer, type: ralph, task: answer}\n";
    let p = Project::new(script, &format!("{PRICES}{loops}"));
    let out = p.run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let check = |summary: &Value| {
        let asker = &summary["loops"]["asker"];
        let answerer = &summary["loops"]["answerer"];
        assert_eq!(asker["spent_on_answers"]["input_tokens"], 5000, "{asker:#}");
        assert_eq!(
            asker["spent_on_answers"]["cache_read_tokens"], 20,
            "{asker:#}"
        );
        assert_eq!(asker["spend"]["input_tokens"], 200, "{asker:#}");
        assert_eq!(asker["charged"]["input_tokens"], 5200, "{asker:#}");
        assert_eq!(asker["usage"]["input_tokens"], 5200, "{asker:#}");
        assert_eq!(
            answerer["answers_for_others"]["input_tokens"], 5000,
            "{answerer:#}"
        );
        assert_eq!(answerer["charged"]["input_tokens"], 7, "{answerer:#}");
        assert_eq!(answerer["usage"]["input_tokens"], 7, "{answerer:#}");
        // 5000 × $100/M + 50 × $1/M + 20 × $10/M
        assert_eq!(nano(&asker["spent_on_answers"]), 500_250_000, "{asker:#}");
        assert_eq!(summary["spend"]["input_tokens"], 5207, "{summary:#}");
    };
    check(&p.summary());
    // The event of the answer says what it cost, charged to the asker.
    let answered: Vec<Value> = p
        .events()
        .into_iter()
        .filter(|e| e["event"] == "query_answered")
        .collect();
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["from"], "asker");
    assert_eq!(answered[0]["spend"]["input_tokens"], 5000, "{answered:?}");
    assert_eq!(answered[0]["spend"]["cost"], "$0.5003", "{answered:?}");
    // The summary is a view of the record: made again from it, it says the same.
    std::fs::remove_file(p.run_dir.join("summary.json")).unwrap();
    let out = p.status(true);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    check(&serde_json::from_slice(&out.stdout).unwrap());
}

#[test]
fn a_model_without_a_price_shows_unknown_price_and_a_money_budget_needs_one() {
    let script = format!(
        "work:\n  turns:\n{}",
        turns(1, "{input_tokens: 10, output_tokens: 1}")
    );
    let loops = "loops:\n  - {name: work, type: mini, task: t}\n";
    let p = Project::new(&script, &format!("{MINI}{loops}"));
    let out = p.run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = p.summary();
    let work = &summary["loops"]["work"];
    assert_eq!(work["charged"]["cost"], "unknown price", "{work:#}");
    assert!(work["charged"].get("cost_nano_usd").is_none_or(|c| c == 0));
    let shown = text(&p.status(false).stdout);
    assert!(shown.contains("unknown price"), "{shown}");
    assert!(!shown.contains("$0.0000"), "{shown}");

    std::fs::remove_dir_all(&p.run_dir).unwrap();
    p.configure(&format!("{MINI}budget: {{usd: 1}}\n{loops}"));
    let out = p.run(&[]);
    assert_eq!(out.status.code(), Some(2), "a config error");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("no price") && stderr.contains("prices:"),
        "{stderr}"
    );
    assert!(!p.run_dir.join("summary.json").exists());

    p.configure(&format!(
        "{MINI}prices: {{scripted: {{input: 1, outptu: 2}}}}\n{loops}"
    ));
    let out = p.run(&[]);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("did you mean `output`"), "{stderr}");
}

#[test]
fn loops_in_parallel_overshoot_the_run_budget_by_at_most_the_calls_in_flight() {
    // Each call reports more output than the worst case reserved for it (1,024 tokens), so
    // that every call in flight when the budget is reached can push past it: the bound.
    let usage = "{input_tokens: 1000, output_tokens: 20000}";
    let mut script = String::new();
    let mut loops = String::from("loops:\n");
    let n = 4;
    for l in 0..n {
        script.push_str(&format!("l{l}:\n  turns:\n"));
        for i in 0..30 {
            script.push_str(&format!(
                "    - calls:\n        - write_file: {{path: f{i}.txt, content: x}}\n      usage: {usage}\n      delay_ms: 20\n"
            ));
        }
        loops.push_str(&format!("  - {{name: l{l}, type: mini, task: t}}\n"));
    }
    // A call costs $0.1 + $0.02 = $0.12.
    let per_call: u64 = 120_000_000;
    let limit: u64 = 2_000_000_000;
    let p = Project::new(
        &script,
        &format!(
            "{MINI}{PRICES}concurrency: {{max-loops: {n}, max-model-calls: {n}}}\nbudget: {{usd: 2}}\n{loops}"
        ),
    );
    let out = p.run(&[]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = p.summary();
    let total = nano(&summary["spend"]);
    let calls = summary["spend"]["model_calls"].as_u64().unwrap();
    eprintln!(
        "run budget $2: spent {} over {calls} calls ({} past the budget; bound {} = {n} calls)",
        summary["spend"]["cost"],
        total.saturating_sub(limit),
        per_call * n as u64
    );
    for l in 0..n {
        let s = &summary["loops"][format!("l{l}")];
        assert_eq!(s["status"], "paused", "{s:#}");
    }
    assert!(
        total >= limit - per_call * n as u64,
        "it ran up to the budget: {total}"
    );
    assert!(
        total <= limit + per_call * n as u64,
        "at most one call per loop in flight past the budget: {total} over {calls} calls"
    );
}
