//! The run record is never inside a loop's writable area: with `worktree: repo` and the run
//! record inside the repository (the config at its root, or a `--run-dir` inside it), a loop
//! tries to rewrite another loop's receipts and empty its transcript with the file tools and
//! with commands, through the real binary. Nothing of the record may change.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::attack::{
    VICTIM_TURNS, assert_chain_key_kept_from, assert_victim_record_intact,
    victim_and_attacker_config,
};

/// The attacker's script: file tools and a command go for the record at `records` (the
/// `--run-dir` case) and under `.taskdaemon` and `sub/.taskdaemon` (config at the root or in
/// a subdirectory). `victim` (from `common::attack`) only writes a file and completes.
const ATTACKER_TURNS: &str = r#"
attacker:
  turns:
    - calls:
        - write_file: {path: "{{RECORD}}/loops/victim/receipts.jsonl", content: "forged\n"}
        - write_file: {path: "{{RECORD}}/loops/victim/transcript.jsonl", content: ""}
        - write_file: {path: "{{RECORD}}/summary.json", content: "{}"}
        - read_file: {path: "{{RECORD}}/receipt-chain.key"}
        - grep: {pattern: "[0-9a-f]{16}", path: "{{RECORD}}"}
        - run_command: {command: "cat {{RECORD}}/receipt-chain.key; find . -name receipt-chain.key -exec cat {} +"}
        - run_command: {command: "for f in $(find . -name receipts.jsonl -o -name transcript.jsonl -o -name summary.json -o -name events.jsonl); do echo forged > \"$f\"; done; find . -name '*.jsonl' -exec rm -f {} +; echo tried"}
        - complete_task: {summary: "tried"}
"#;

/// The attack script with the record at `record`.
fn script(record: &str) -> String {
    [VICTIM_TURNS, &ATTACKER_TURNS.replace("{{RECORD}}", record)].concat()
}

/// Runs the two loops with the config in `config_dir` and (optionally) `--run-dir`.
fn run(home: &Path, config_dir: &Path, run_dir: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskdaemon"));
    cmd.arg("run")
        .arg("-c")
        .arg(config_dir.join("taskdaemon.yml"));
    if let Some(dir) = run_dir {
        cmd.arg("--run-dir").arg(dir);
    }
    cmd.env("HOME", home).output().unwrap()
}

/// `key_path_known`: the script named the real record (`--run-dir`), so its read of the key
/// must be refused as hidden (with the default record it can only guess the run id).
fn check(run_dir: &Path, out: &Output, key_path_known: bool) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_victim_record_intact(run_dir, &stderr);
    let receipts = std::fs::read_to_string(run_dir.join("loops/victim/receipts.jsonl")).unwrap();
    assert!(receipts.contains("write_file"), "{receipts}");
    let transcript =
        std::fs::read_to_string(run_dir.join("loops/attacker/transcript.jsonl")).unwrap();
    assert!(transcript.contains("tried"), "the attack ran: {transcript}");
    // The key that vouches for the receipts never reached the attacker's model.
    assert_chain_key_kept_from(run_dir, &transcript);
    // Not only redacted on the way out (the key is a registered secret): never opened.
    let mut reads = 0;
    for line in transcript.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).unwrap();
        if entry["name"] == "read_file" && entry["entry"] == "tool_result" {
            reads += 1;
            assert_eq!(entry["is_error"], true, "{entry}");
            let content = entry["content"].as_str().unwrap_or("");
            let refused =
                content.contains("hidden") || !key_path_known && content.contains("not found");
            assert!(refused, "{entry}");
        }
    }
    assert_eq!(reads, 1, "{transcript}");
}

#[test]
fn a_run_dir_inside_the_repository_cannot_be_touched_by_a_loop_working_there() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let repo = root.join("repo");
    common::init_repo(&repo, &[("README.md", "x\n"), (".gitignore", "records/\n")]);
    let config_dir = root.join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(config_dir.join("script.yml"), script("records")).unwrap();
    std::fs::write(
        config_dir.join("taskdaemon.yml"),
        victim_and_attacker_config(&repo),
    )
    .unwrap();
    let run_dir = repo.join("records");
    let out = run(&root, &config_dir, Some(&run_dir));
    check(&run_dir, &out, true);
}

#[test]
fn a_config_in_a_subdirectory_of_the_repository_keeps_its_record_from_the_loops() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let repo = root.join("repo");
    std::fs::create_dir_all(repo.join("sub")).unwrap();
    std::fs::write(
        repo.join("sub/script.yml"),
        script("sub/.taskdaemon/runs/latest-placeholder"),
    )
    .unwrap();
    std::fs::write(
        repo.join("sub/taskdaemon.yml"),
        victim_and_attacker_config(Path::new("..")),
    )
    .unwrap();
    common::init_repo(&repo, &[("README.md", "x\n")]);
    let out = run(&root, &repo.join("sub"), None);
    // The run that happened, as the binary names it (not whatever else is under `runs`).
    let stdout = String::from_utf8_lossy(&out.stdout);
    let run_dir = stdout
        .lines()
        .find_map(|l| l.strip_prefix("run record: "))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "no run record named: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    check(&run_dir, &out, false);
    // Nothing but the real run under `runs`: the loop planted no fake one.
    let runs: Vec<_> = std::fs::read_dir(repo.join("sub/.taskdaemon/runs"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
}
