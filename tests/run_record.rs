//! The run record (`.taskdaemon/runs/<run-id>/`) and the `status` / `logs` views of it.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use taskdaemon::run::record::{
    LoopStatus, MergeSummary, RunMeta, RunRecord, RunStatus, RunSummary, read_events, read_jsonl,
    read_receipts, read_summary, read_transcript, runs_root,
};
use taskdaemon::run::status::{
    LogsOptions, logs_command, render_status, resolve_run_dir, status_command,
};
use td_engine::transcript::{TranscriptEntry, TranscriptSink};
use td_llm::{Block, LlmResponse, Message, Purpose, Role, StopReason, ToolCall, Usage};
use td_protocol::events::{EventKind, EventLog};
use td_protocol::spend::Spend;
use td_toolkit::receipts::{Receipt, hash_output, hash_value};

fn meta(loops: &[(&str, &str)]) -> RunMeta {
    RunMeta {
        config: Some("taskdaemon.yml".into()),
        loops: loops
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect(),
        sandbox: None,
    }
}

fn append_raw(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

fn response(
    text: Option<&str>,
    calls: &[(&str, &str, serde_json::Value)],
    tokens: u64,
) -> LlmResponse {
    LlmResponse {
        text: text.map(str::to_string),
        tool_calls: calls
            .iter()
            .map(|(id, name, input)| ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                input: input.clone().into(),
            })
            .collect(),
        stop_reason: if calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        },
        usage: Usage {
            input_tokens: tokens,
            output_tokens: tokens / 10,
            ..Default::default()
        },
    }
}

fn receipt(exec_id: &str, tool: &str) -> Receipt {
    Receipt {
        id: uuid::Uuid::now_v7().to_string().into(),
        call_id: Some("c1".into()),
        exec_id: exec_id.into(),
        tool: tool.to_string().into(),
        input: json!({"path": "a.txt"}).into(),
        input_hash: hash_value(&json!({"path": "a.txt"})),
        output_hash: hash_output("x", false),
        is_error: false,
        error_kind: None,
        output_bytes: 1,
        output_capped: false,
        latency_ms: 3,
        latency_us: None,
        side_effects: vec![],
        time: "2025-01-01T00:00:00.000Z".into(),
        commit: None,
        schema_valid: Some(true),
        seq: None,
        chain: None,
    }
}

#[test]
fn create_lays_out_the_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = runs_root(tmp.path()).join("20250101-120000-ab12");
    let record = RunRecord::create(&dir, "20250101-120000-ab12", meta(&[("api", "code")])).unwrap();
    assert_eq!(record.dir(), dir);
    for path in ["summary.json", "events.jsonl", "loops/api"] {
        assert!(dir.join(path).exists(), "{path} missing");
    }
    let summary = read_summary(&dir).unwrap();
    assert_eq!(summary.version, 1);
    assert_eq!(summary.run_id, "20250101-120000-ab12");
    assert_eq!(summary.config.as_deref(), Some("taskdaemon.yml"));
    assert_eq!(summary.status, RunStatus::Running);
    assert!(summary.ended_at.is_none());
    let api = &summary.loops["api"];
    assert_eq!(
        (api.status, api.loop_type.as_str()),
        (LoopStatus::Pending, "code")
    );

    let again = RunRecord::create(&dir, "x", RunMeta::default()).unwrap_err();
    assert!(again.contains("already holds a run"), "{again}");
    let bad = RunRecord::create(&tmp.path().join("r2"), "r2", meta(&[("../escape", "code")]))
        .unwrap_err();
    assert!(bad.contains("cannot name a directory"), "{bad}");
    assert!(!tmp.path().join("escape").exists());
}

#[test]
fn events_are_appended_and_keep_the_summary_in_step() {
    let tmp = tempfile::tempdir().unwrap();
    let record = RunRecord::create(tmp.path(), "r", meta(&[("api", "code")])).unwrap();
    let log = EventLog::new();
    log.subscribe(record.events_listener());
    let api = || "api".to_string();
    log.record(EventKind::LoopStarted {
        loop_name: api(),
        loop_type: "code".into(),
        host: None,
    });
    log.record(EventKind::IterationEnded {
        loop_name: api(),
        iteration: 1,
        ended_by: "end_turn".into(),
        validation_exit: Some(1),
        validation_passed: Some(false),
        model_calls: Some(1),
        spend: None,
        wall_ms: None,
    });
    // summary.json follows the summary in memory from a writer thread: flush waits for it.
    assert_eq!(record.summary().loops["api"].iterations, 1);
    record.flush().unwrap();
    let mid = read_summary(tmp.path()).unwrap();
    assert_eq!(mid.loops["api"].status, LoopStatus::Running);
    assert_eq!(mid.loops["api"].iterations, 1);
    assert_eq!(mid.loops["api"].validation.unwrap().exit_code, Some(1));
    log.record(EventKind::QueryAsked {
        id: 7,
        from: "client".into(),
        to: api().into(),
        question: "Which port?".into(),
    });
    log.record(EventKind::IterationEnded {
        loop_name: api(),
        iteration: 2,
        ended_by: "complete_task".into(),
        validation_exit: Some(0),
        validation_passed: Some(true),
        model_calls: Some(1),
        spend: None,
        wall_ms: None,
    });
    log.record(EventKind::LoopCompleted {
        loop_name: api(),
        iterations: 2,
        summary: Some("api done".into()),
    });
    for (name, kind) in [
        (
            "web",
            EventKind::LoopFailed {
                loop_name: "web".into(),
                reason: "max iterations (3) reached".into(),
            },
        ),
        (
            "docs",
            EventKind::LoopStopped {
                loop_name: "docs".into(),
            },
        ),
    ] {
        log.record(EventKind::LoopStarted {
            loop_name: name.into(),
            loop_type: "ralph".into(),
            host: None,
        });
        log.record(kind);
    }

    let events = read_events(tmp.path()).unwrap();
    assert!(events.bad_lines.is_empty());
    let seqs: Vec<u64> = events.items.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=9).collect::<Vec<_>>());
    assert!(
        matches!(&events.items[2].kind, EventKind::QueryAsked { id: 7, question, .. } if &**question == "Which port?")
    );

    record.flush().unwrap();
    let summary = read_summary(tmp.path()).unwrap();
    assert_eq!(summary, record.summary());
    let api = &summary.loops["api"];
    assert_eq!(api.status, LoopStatus::Completed);
    assert_eq!(api.iterations, 2);
    assert_eq!(api.summary.as_deref(), Some("api done"));
    let validation = api.validation.unwrap();
    assert_eq!((validation.exit_code, validation.passed), (Some(0), true));
    assert_eq!(
        api.started_at.as_deref(),
        Some(events.items[0].time.text().as_ref())
    );
    assert_eq!(
        api.ended_at.as_deref(),
        Some(events.items[4].time.text().as_ref())
    );
    assert!(api.duration_ms.is_some());
    let web = &summary.loops["web"];
    assert_eq!(web.status, LoopStatus::Failed);
    assert_eq!(web.reason.as_deref(), Some("max iterations (3) reached"));
    assert_eq!(web.loop_type, "ralph");
    assert_eq!(summary.loops["docs"].status, LoopStatus::Stopped);
    assert_eq!(record.write_errors(), 0);
}

#[test]
fn transcripts_are_kept_per_loop_and_count_token_usage() {
    let tmp = tempfile::tempdir().unwrap();
    let record = RunRecord::create(tmp.path(), "r", meta(&[("api", "code")])).unwrap();
    let entries = vec![
        TranscriptEntry::IterationStarted {
            iteration: 1,
            system: "You are api".into(),
        },
        TranscriptEntry::Request {
            iteration: 1,
            turn: 1,
            purpose: Purpose::Iteration,
            new_messages: vec![Message::user_text("Build the api")],
        },
        TranscriptEntry::Response {
            iteration: 1,
            turn: 1,
            response: response(
                Some("ok"),
                &[("c1", "read_file", json!({"path": "a"}))],
                100,
            ),
        },
        TranscriptEntry::Spent {
            iteration: 1,
            turn: 1,
            charged_to: None,
            spend: Spend::call([100, 10, 0, 0], Some(450_000)),
        },
        TranscriptEntry::ToolResult {
            iteration: 1,
            turn: 1,
            call_id: "c1".into(),
            name: "read_file".into(),
            content: "1 | a".into(),
            is_error: false,
        },
        TranscriptEntry::Response {
            iteration: 1,
            turn: 2,
            response: response(None, &[], 250),
        },
        TranscriptEntry::Spent {
            iteration: 1,
            turn: 2,
            charged_to: None,
            spend: Spend::call([250, 25, 0, 0], None),
        },
    ];
    for e in &entries {
        record.record("api", e.clone());
    }
    record.record(
        "new-loop",
        TranscriptEntry::ModelError {
            iteration: 1,
            error: "boom".into(),
        },
    );
    // Read while the record is alive: every line is on disk as soon as it is recorded.
    let read = read_transcript(tmp.path(), "api").unwrap();
    assert_eq!(read.items, entries);
    assert!(read.bad_lines.is_empty());
    assert_eq!(
        read_transcript(tmp.path(), "new-loop").unwrap().items.len(),
        1
    );
    record.flush().unwrap();
    let summary = read_summary(tmp.path()).unwrap();
    // What each call spent (the entry after its response) adds up: tokens, calls, and the
    // cost of the priced ones, with the unpriced call counted apart.
    assert_eq!(
        summary.loops["api"].usage,
        Usage {
            input_tokens: 350,
            output_tokens: 35,
            ..Default::default()
        }
    );
    let charged = summary.loops["api"].charged;
    assert_eq!((charged.model_calls, charged.unpriced_calls), (2, 1));
    assert_eq!(charged.cost_text(), "$0.0005 + unknown price (1 call)");
    assert_eq!(summary.spend, charged);

    // A name that would leave the run directory is refused and counted, never written.
    record.record(
        "../x",
        TranscriptEntry::ModelError {
            iteration: 1,
            error: "e".into(),
        },
    );
    assert_eq!(record.write_errors(), 1);
    assert!(!tmp.path().join("x").exists());
    assert!(read_transcript(tmp.path(), "../x").is_err());
}

#[test]
fn receipts_go_to_the_loop_log() {
    let tmp = tempfile::tempdir().unwrap();
    let record = RunRecord::create(tmp.path(), "r", meta(&[])).unwrap();
    let log = record.receipts_for("api").unwrap();
    assert!(Arc::ptr_eq(&log, &record.receipts_for("api").unwrap()));
    assert_eq!(log.path(), tmp.path().join("loops/api/receipts.jsonl"));
    log.append(&receipt("api", "read_file")).unwrap();
    log.append(&receipt("api", "write_file")).unwrap();
    let read = read_receipts(tmp.path(), "api").unwrap();
    let tools: Vec<&str> = read.items.iter().map(|r| r.tool.as_ref()).collect();
    assert_eq!(tools, ["read_file", "write_file"]);
    // The same file is what `replay verify` reads.
    assert_eq!(
        td_toolkit::receipts::read_log(log.path())
            .unwrap()
            .items
            .len(),
        2
    );
    assert!(record.receipts_for("a/b").is_err());
}

#[test]
fn summary_updates_replace_the_file_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let record = RunRecord::create(tmp.path(), "r", meta(&[("api", "code")])).unwrap();
    record
        .update_loop("api", |s| {
            s.branch = Some("taskdaemon/api".into());
            s.worktree = Some("/w/api".into());
            s.status = LoopStatus::Blocked;
            s.reason = Some("waits on `db`, which failed".into());
            s.name = "renamed".into(); // ignored: the key is the name
        })
        .unwrap();
    record.flush().unwrap();
    let s = read_summary(tmp.path()).unwrap();
    let api = &s.loops["api"];
    assert_eq!(api.name, "api");
    assert_eq!(api.branch.as_deref(), Some("taskdaemon/api"));
    assert_eq!(api.worktree.as_deref(), Some("/w/api"));
    assert_eq!(api.status, LoopStatus::Blocked);
    assert!(!tmp.path().join("summary.json.tmp").exists());

    // Readers racing many writers only ever see whole summaries.
    std::thread::scope(|scope| {
        for t in 0..4 {
            let record = record.clone();
            scope.spawn(move || {
                for i in 0..100u32 {
                    record
                        .update_loop(&format!("loop{t}"), |s| s.iterations = i + 1)
                        .unwrap();
                }
            });
        }
        scope.spawn(|| {
            for _ in 0..200 {
                read_summary(tmp.path()).unwrap();
            }
        });
    });
    record.flush().unwrap();
    let s = read_summary(tmp.path()).unwrap();
    for t in 0..4 {
        assert_eq!(s.loops[&format!("loop{t}")].iterations, 100);
    }

    record
        .update_loop("api", |s| {
            s.merge = Some(MergeSummary {
                merged: true,
                into: Some("main".into()),
                commit: Some("abc123".into()),
                detail: None,
                attempts: 0,
            })
        })
        .unwrap();
    record.finish(RunStatus::Failed).unwrap();
    let s = read_summary(tmp.path()).unwrap();
    assert_eq!(s.status, RunStatus::Failed);
    assert!(s.ended_at.is_some());
    assert_eq!(
        s.loops["api"].merge.as_ref().unwrap().commit.as_deref(),
        Some("abc123")
    );
}

#[test]
fn concurrent_appends_never_interleave_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let record = RunRecord::create(tmp.path(), "r", meta(&[])).unwrap();
    let log = Arc::new(EventLog::new());
    log.subscribe(record.events_listener());
    let big = "x".repeat(64 * 1024);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (record, log, big) = (record.clone(), log.clone(), big.clone());
            scope.spawn(move || {
                for i in 0..50u32 {
                    // Two threads share each loop's file.
                    record.record(
                        &format!("loop{}", t % 2),
                        TranscriptEntry::ModelError {
                            iteration: i,
                            error: big.clone(),
                        },
                    );
                    log.record(EventKind::InboxShown {
                        loop_name: format!("loop{t}"),
                        items: i as usize,
                        deliveries: Vec::new(),
                    });
                }
            });
        }
    });
    for name in ["loop0", "loop1"] {
        let read = read_transcript(tmp.path(), name).unwrap();
        assert!(read.bad_lines.is_empty(), "{:?}", read.bad_lines);
        assert_eq!(read.items.len(), 100);
    }
    let events = read_events(tmp.path()).unwrap();
    assert!(events.bad_lines.is_empty());
    assert_eq!(events.items.len(), 200);
}

#[test]
fn a_torn_last_line_is_reported_by_every_reader_and_closed_on_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    {
        let record = RunRecord::create(dir, "r", meta(&[("api", "code")])).unwrap();
        let log = EventLog::new();
        log.subscribe(record.events_listener());
        log.record(EventKind::LoopStarted {
            loop_name: "api".into(),
            loop_type: "code".into(),
            host: None,
        });
        record.record(
            "api",
            TranscriptEntry::ModelError {
                iteration: 1,
                error: "first".into(),
            },
        );
        record
            .receipts_for("api")
            .unwrap()
            .append(&receipt("api", "grep"))
            .unwrap();
        record.finish(RunStatus::Stopped).unwrap();
    }
    // A crash in the middle of each file's second line.
    append_raw(&dir.join("events.jsonl"), b"{\"seq\":2,\"time\":\"2025");
    append_raw(
        &dir.join("loops/api/transcript.jsonl"),
        b"{\"entry\":\"model_err",
    );
    append_raw(
        &dir.join("loops/api/receipts.jsonl"),
        "{\"id\":\"é".as_bytes(),
    );

    let events = read_events(dir).unwrap();
    assert_eq!(events.items.len(), 1);
    assert_eq!(events.bad_lines.len(), 1);
    assert_eq!(events.bad_lines[0].0, 2);
    assert!(
        events.bad_lines[0].1.starts_with("incomplete last line"),
        "{}",
        events.bad_lines[0].1
    );
    let transcript = read_transcript(dir, "api").unwrap();
    assert_eq!((transcript.items.len(), transcript.bad_lines[0].0), (1, 2));
    let receipts = read_receipts(dir, "api").unwrap();
    assert_eq!((receipts.items.len(), receipts.bad_lines[0].0), (1, 2));
    let logs = logs_command(dir, None, "api", &LogsOptions::default()).unwrap();
    assert!(logs.contains("✗ model error: first"), "{logs}");
    assert!(
        logs.contains("! 1 line(s) of") && logs.contains("line 2: incomplete last line"),
        "{logs}"
    );
    // Not JSON at all, and not at the end: reported as an invalid line.
    let generic = tmp.path().join("g.jsonl");
    std::fs::write(&generic, "1\nnot json\n\n3\n").unwrap();
    let read = read_jsonl::<u32>(&generic).unwrap();
    assert_eq!(read.items, [1, 3]);
    assert_eq!(read.bad_lines.len(), 1);
    assert_eq!(read.bad_lines[0].0, 2);
    assert!(read.bad_lines[0].1.starts_with("invalid line"));

    // Resuming closes the torn lines off, so what is appended next reads back whole.
    let record = RunRecord::open_existing(dir).unwrap();
    let summary = record.summary();
    assert_eq!(summary.status, RunStatus::Running);
    assert!(summary.ended_at.is_none());
    assert_eq!(summary.loops["api"].status, LoopStatus::Running);
    let log = EventLog::new();
    log.subscribe(record.events_listener());
    log.record(EventKind::LoopStopped {
        loop_name: "api".into(),
    });
    record.record(
        "api",
        TranscriptEntry::ModelError {
            iteration: 2,
            error: "second".into(),
        },
    );
    record
        .receipts_for("api")
        .unwrap()
        .append(&receipt("api", "glob"))
        .unwrap();
    let events = read_events(dir).unwrap();
    assert_eq!(events.items.len(), 2);
    assert_eq!(events.bad_lines.len(), 1);
    assert!(events.bad_lines[0].1.starts_with("invalid line"));
    assert_eq!(read_transcript(dir, "api").unwrap().items.len(), 2);
    assert_eq!(read_receipts(dir, "api").unwrap().items.len(), 2);
    record.flush().unwrap();
    assert_eq!(
        read_summary(dir).unwrap().loops["api"].status,
        LoopStatus::Stopped
    );
}

#[test]
fn unreadable_summaries_and_directories_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let e = RunRecord::open_existing(tmp.path()).unwrap_err();
    assert!(e.contains("is not a run directory"), "{e}");
    std::fs::write(tmp.path().join("summary.json"), "{\"run_id\": ").unwrap();
    let e = read_summary(tmp.path()).unwrap_err();
    assert!(e.contains("is not a run summary"), "{e}");
    let e = read_events(tmp.path()).unwrap_err();
    assert!(e.contains("cannot read"), "{e}");
}

/// A finished three-loop run with fixed times, under `<project>/.taskdaemon/runs/<id>`.
fn fixed_run(project: &Path, id: &str) -> std::path::PathBuf {
    let dir = runs_root(project).join(id);
    let record = RunRecord::create(
        &dir,
        id,
        meta(&[("api", "code"), ("client", "code"), ("docs", "ralph")]),
    )
    .unwrap();
    record
        .update_loop("api", |s| {
            s.status = LoopStatus::Completed;
            s.iterations = 2;
            s.validation = Some(taskdaemon::run::record::ValidationSummary {
                exit_code: Some(0),
                passed: true,
            });
            s.branch = Some("taskdaemon/api".into());
            // A plan's two files: one artifact in the table.
            s.artifacts = ["json", "md"]
                .map(|ext| taskdaemon::run::artifacts::KeptArtifact {
                    kind: "plan".into(),
                    name: "x".into(),
                    path: format!("loops/api/artifacts/plan-x.{ext}"),
                    bytes: 10,
                })
                .to_vec();
            s.started_at = Some("2025-01-01T12:00:00.000Z".into());
            s.mark_ended("2025-01-01T12:01:05.000Z");
            s.merge = Some(MergeSummary {
                merged: true,
                into: Some("main".into()),
                commit: Some("abc123".into()),
                detail: None,
                attempts: 0,
            });
        })
        .unwrap();
    record
        .update_loop("client", |s| {
            s.status = LoopStatus::Failed;
            s.iterations = 3;
            s.validation = Some(taskdaemon::run::record::ValidationSummary {
                exit_code: None,
                passed: false,
            });
            s.branch = Some("taskdaemon/client".into());
            s.started_at = Some("2025-01-01T12:00:00.000Z".into());
            s.mark_ended("2025-01-01T12:00:42.500Z");
            s.reason = Some("max iterations (3) reached without passing validation".into());
        })
        .unwrap();
    // Tokens and cost come from what each call spent: api's own (priced), and api's answer
    // to a question of client's (charged to client, with no price).
    record.record(
        "api",
        TranscriptEntry::Spent {
            iteration: 1,
            turn: 1,
            charged_to: None,
            spend: Spend::call([1200, 300, 0, 0], Some(8_100_000)),
        },
    );
    record.record(
        "api",
        TranscriptEntry::Spent {
            iteration: 0,
            turn: 1,
            charged_to: Some("client".into()),
            spend: Spend::call([500, 10, 40, 0], None),
        },
    );
    record.finish(RunStatus::Failed).unwrap();
    // Fix the run's own times so the table is the same on every run of the test.
    let mut summary = read_summary(&dir).unwrap();
    summary.started_at = "2025-01-01T12:00:00.000Z".into();
    summary.ended_at = Some("2025-01-01T12:01:10.000Z".into());
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_vec(&summary).unwrap(),
    )
    .unwrap();
    dir
}

#[test]
fn status_shows_a_table_of_the_loops() {
    let tmp = tempfile::tempdir().unwrap();
    fixed_run(tmp.path(), "20250101-120000-ab12");
    let status = status_command(&runs_root(tmp.path()), None, false).unwrap();
    assert!(status.notes.is_empty(), "{:?}", status.notes);
    let text = status.text;
    insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("run_status", text);
    });
    // The project directory works as well as its runs root.
    assert_eq!(status_command(tmp.path(), None, false).unwrap().text, text);
}

#[test]
fn status_json_is_the_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixed_run(tmp.path(), "20250101-120000-ab12");
    let text = status_command(&dir, None, true).unwrap().text;
    let parsed: RunSummary = serde_json::from_str(&text).unwrap();
    assert_eq!(parsed, read_summary(&dir).unwrap());
}

#[test]
fn status_shows_elapsed_time_of_running_loops() {
    let mut summary = RunSummary {
        run_id: "r".into(),
        started_at: "2025-01-01T12:00:00.000Z".into(),
        ..RunSummary::default()
    };
    let mut l = taskdaemon::run::record::LoopSummary::pending("api", "code");
    l.status = LoopStatus::Running;
    l.started_at = Some("2025-01-01T12:00:00.000Z".into());
    l.merge = Some(MergeSummary {
        merged: false,
        into: Some("main".into()),
        commit: None,
        detail: Some("conflict in src/lib.rs".into()),
        attempts: 0,
    });
    summary.loops.insert("api".into(), l);
    let text = render_status(&summary, "2025-01-01T12:01:05.000Z");
    assert!(
        text.contains("\nmerge api: not merged into main: conflict in src/lib.rs\n"),
        "{text}"
    );
    let row = text.lines().find(|l| l.starts_with("api")).unwrap();
    assert!(
        row.contains("running") && row.ends_with("1m 05s         -  -"),
        "{row}"
    );
    assert!(
        text.ends_with(
            "1 loop(s): 1 running; tokens 0 in, 0 out, 0 cache read, 0 cache write; cost -\n"
        ),
        "{text}"
    );
    let empty = render_status(&RunSummary::default(), "2025-01-01T12:00:00Z");
    assert!(empty.contains("no loops recorded yet"), "{empty}");
}

#[test]
fn the_newest_run_is_the_default_and_others_are_chosen_by_id() {
    let tmp = tempfile::tempdir().unwrap();
    let root = runs_root(tmp.path());
    // Created (started) in this order: the newest is the one started last, whatever the
    // order of the names.
    for id in [
        "20250101-000000-aaaa",
        "20241231-235959-ffff",
        "20250102-000000-0000",
    ] {
        RunRecord::create(&root.join(id), id, RunMeta::default()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Directories without a summary are not runs, whatever their names.
    std::fs::create_dir_all(root.join("zzzz-not-a-run")).unwrap();
    let newest = root.join("20250102-000000-0000");
    assert_eq!(resolve_run_dir(&root, None).unwrap(), newest);
    assert_eq!(resolve_run_dir(tmp.path(), None).unwrap(), newest);
    let first = status_command(&root, None, false).unwrap().text;
    // Recorded running, but no process holds these records.
    assert!(
        first.starts_with("run 20250102-000000-0000  interrupted"),
        "{first}"
    );
    let chosen = root.join("20241231-235959-ffff");
    assert_eq!(
        resolve_run_dir(&root, Some("20241231-235959-ffff")).unwrap(),
        chosen
    );
    // A run directory names itself; with another id, its siblings are searched.
    assert_eq!(resolve_run_dir(&chosen, None).unwrap(), chosen);
    assert_eq!(
        resolve_run_dir(&chosen, Some("20250101-000000-aaaa")).unwrap(),
        root.join("20250101-000000-aaaa")
    );
}

#[test]
fn a_missing_run_names_the_available_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let root = runs_root(tmp.path());
    let missing = status_command(&root, None, false).unwrap_err();
    assert!(missing.contains("does not exist"), "{missing}");
    std::fs::create_dir_all(&root).unwrap();
    let empty = status_command(&root, None, false).unwrap_err();
    assert!(
        empty.contains("no runs in") && empty.contains("yet"),
        "{empty}"
    );
    for id in ["20250101-000000-aaaa", "20250102-000000-0000"] {
        RunRecord::create(&root.join(id), id, RunMeta::default()).unwrap();
    }
    let e = status_command(&root, Some("20240101-000000-dead"), false).unwrap_err();
    assert!(e.contains("no run `20240101-000000-dead`"), "{e}");
    assert!(
        e.ends_with("available runs (newest last): 20250101-000000-aaaa, 20250102-000000-0000"),
        "{e}"
    );
    let e = logs_command(&root, Some("nope"), "api", &LogsOptions::default()).unwrap_err();
    assert!(e.contains("no run `nope`"), "{e}");
}

/// A transcript with every kind of entry: two iterations (tool results, validation, a
/// model error) and a query answer that used a tool.
fn hand_built_logs(dir: &Path) -> RunRecord {
    let record = RunRecord::create(dir, "r", meta(&[("api", "code"), ("idle", "code")])).unwrap();
    let entries = vec![
        TranscriptEntry::IterationStarted {
            iteration: 1,
            system: "You are the api loop.".into(),
        },
        TranscriptEntry::Request {
            iteration: 1,
            turn: 1,
            purpose: Purpose::Iteration,
            new_messages: vec![Message::user_text(
                "Task: serve /health on port 8080.\nIteration 1 of 5.",
            )],
        },
        TranscriptEntry::Response {
            iteration: 1,
            turn: 1,
            response: response(
                Some("Reading the server first."),
                &[
                    ("c1", "read_file", json!({"path": "src/main.rs"})),
                    (
                        "c2",
                        "edit_file",
                        json!({"path": "src/x.rs", "old_string": "a", "new_string": "b"}),
                    ),
                ],
                1000,
            ),
        },
        TranscriptEntry::ToolResult {
            iteration: 1,
            turn: 1,
            call_id: "c1".into(),
            name: "read_file".into(),
            content: "1 | fn main() {}".into(),
            is_error: false,
        },
        TranscriptEntry::ToolResult {
            iteration: 1,
            turn: 1,
            call_id: "c2".into(),
            name: "edit_file".into(),
            content: "src/x.rs was never read: read it first".into(),
            is_error: true,
        },
        TranscriptEntry::Request {
            iteration: 1,
            turn: 2,
            purpose: Purpose::Iteration,
            new_messages: vec![
                Message {
                    role: Role::Assistant,
                    content: vec![Block::Text {
                        text: "Reading the server first.".into(),
                    }],
                },
                Message {
                    role: Role::User,
                    content: vec![
                        Block::ToolResult {
                            tool_use_id: "c1".into(),
                            content: "1 | fn main() {}".into(),
                            is_error: false,
                        },
                        Block::ToolResult {
                            tool_use_id: "c2".into(),
                            content: "src/x.rs was never read: read it first".into(),
                            is_error: true,
                        },
                        Block::Text {
                            text: "[inbox: 1 new message(s) from other loops]\nfrom client: port?"
                                .into(),
                        },
                    ],
                },
            ],
        },
        TranscriptEntry::Response {
            iteration: 1,
            turn: 2,
            response: response(Some("Done for now."), &[], 1500),
        },
        TranscriptEntry::Request {
            iteration: 0,
            turn: 1,
            purpose: Purpose::QueryAnswer {
                from: "client".into(),
                question: "Which port?".into(),
            },
            new_messages: vec![Message::user_text(
                "Question from loop `client`:\nWhich port?",
            )],
        },
        TranscriptEntry::Response {
            iteration: 0,
            turn: 1,
            response: response(None, &[("q1", "grep", json!({"pattern": "PORT"}))], 300),
        },
        TranscriptEntry::Request {
            iteration: 0,
            turn: 2,
            purpose: Purpose::QueryAnswer {
                from: "client".into(),
                question: "Which port?".into(),
            },
            new_messages: vec![Message {
                role: Role::User,
                content: vec![Block::ToolResult {
                    tool_use_id: "q1".into(),
                    content: "src/main.rs:3: const PORT: u16 = 8080;".into(),
                    is_error: false,
                }],
            }],
        },
        TranscriptEntry::Response {
            iteration: 0,
            turn: 2,
            response: response(Some("8080"), &[], 320),
        },
        TranscriptEntry::Validation {
            iteration: 1,
            exit_code: Some(101),
            passed: false,
            output: "test health ... FAILED\nthread panicked at 'connection refused'".into(),
        },
        TranscriptEntry::IterationStarted {
            iteration: 2,
            system: "You are the api loop.".into(),
        },
        TranscriptEntry::Request {
            iteration: 2,
            turn: 1,
            purpose: Purpose::Iteration,
            new_messages: vec![Message::user_text("Iteration 2 of 5. Validation failed.")],
        },
        TranscriptEntry::ModelError {
            iteration: 2,
            error: "model API error 529: overloaded".into(),
        },
        TranscriptEntry::ModelError {
            iteration: 0,
            error: "model transport error: reset".into(),
        },
    ];
    for e in entries {
        record.record("api", e);
    }
    record
}

#[test]
fn logs_show_a_transcript_readably() {
    let tmp = tempfile::tempdir().unwrap();
    hand_built_logs(tmp.path());
    append_raw(
        &tmp.path().join("loops/api/transcript.jsonl"),
        b"{\"entry\":\"resp",
    );
    let text = logs_command(tmp.path(), None, "api", &LogsOptions::default()).unwrap();
    // The snapshot must not depend on where the temporary directory is.
    let text = text.replace(&tmp.path().display().to_string(), "<run>");
    insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("run_logs", text);
    });
}

#[test]
fn logs_options_choose_iteration_length_and_system_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let record = hand_built_logs(tmp.path());
    let only = |iteration| LogsOptions {
        iteration: Some(iteration),
        ..LogsOptions::default()
    };
    let second = logs_command(tmp.path(), None, "api", &only(2)).unwrap();
    assert!(
        second.starts_with("=== iteration 2 ===") && second.contains("529"),
        "{second}"
    );
    assert!(
        !second.contains("iteration 1") && !second.contains("Which port"),
        "{second}"
    );
    let answers = logs_command(tmp.path(), None, "api", &only(0)).unwrap();
    assert!(
        answers.starts_with("=== answering a query from `client` ==="),
        "{answers}"
    );
    assert!(!answers.contains("=== iteration"), "{answers}");
    let none = logs_command(tmp.path(), None, "api", &only(9)).unwrap();
    assert_eq!(none, "loop `api` has nothing recorded for iteration 9\n");

    let system = LogsOptions {
        system: true,
        ..LogsOptions::default()
    };
    let text = logs_command(tmp.path(), None, "api", &system).unwrap();
    assert!(
        text.contains("system:\n    You are the api loop.\n"),
        "{text}"
    );
    let text = logs_command(tmp.path(), None, "api", &LogsOptions::default()).unwrap();
    assert!(!text.contains("You are the api loop."), "{text}");

    // Long multi-byte content is cut on character boundaries, unless told otherwise.
    let long = "é".repeat(3000);
    record.record(
        "api",
        TranscriptEntry::ToolResult {
            iteration: 3,
            turn: 1,
            call_id: "c9".into(),
            name: "read_file".into(),
            content: long.clone(),
            is_error: false,
        },
    );
    let cut = logs_command(tmp.path(), None, "api", &only(3)).unwrap();
    assert!(
        cut.contains("bytes omitted") && !cut.contains(&long),
        "{}",
        cut.len()
    );
    assert!(cut.len() < 2600, "{}", cut.len());
    let full = LogsOptions {
        iteration: Some(3),
        max_content_bytes: None,
        system: false,
    };
    let text = logs_command(tmp.path(), None, "api", &full).unwrap();
    assert!(text.contains(&long) && !text.contains("bytes omitted"));
}

#[test]
fn logs_of_unknown_or_silent_loops_say_so() {
    let tmp = tempfile::tempdir().unwrap();
    hand_built_logs(tmp.path());
    let e = logs_command(tmp.path(), None, "nope", &LogsOptions::default()).unwrap_err();
    assert!(
        e.contains("no loop `nope`") && e.ends_with("its loops: api, idle"),
        "{e}"
    );
    let idle = logs_command(tmp.path(), None, "idle", &LogsOptions::default()).unwrap();
    assert_eq!(
        idle,
        "loop `idle` has no transcript yet: it made no model call in this run\n"
    );
}
