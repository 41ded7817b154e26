//! Warm worktrees (issue 16), through the real binary, the scripted provider and real git:
//! a loop's new worktree starts with the base checkout's build state (`warm:`) with the
//! base's mtimes; what a loop's build rewrites is its own (the base's and another loop's
//! copies stay); a base without the named path starts as today; a symlink in the base's
//! `target/` is copied as a link, never followed (and the file tools still cannot read
//! through it); a confined command writes into its seeded `target/`.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;

mod common;

use common::flagged_run::summary;

/// The base's build output's mtime (seconds since the epoch).
const BASE_MTIME: i64 = 1_600_000_000;

fn set_mtime(path: &Path, secs: i64) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs());
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

#[test]
fn seeded_worktrees_see_the_base_build_output_and_own_their_copy() {
    let confined = common::fully_confined();
    eprintln!("branch: commands fully confined: {confined}");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let repo = root.join("repo");
    let flags = root.join("flags");
    let outside = root.join("outside");
    std::fs::create_dir_all(&flags).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "TOPSECRET-OUTSIDE").unwrap();
    common::init_repo(
        &repo,
        &[
            ("README.md", "sample\n"),
            (".gitignore", "target/\n.taskdaemon/\n"),
        ],
    );
    // The base checkout's build state: an output with an old mtime, and a symlink planted in
    // target/ that points out of the repository.
    let out = repo.join("target/debug/out.txt");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, "base").unwrap();
    set_mtime(&out, BASE_MTIME);
    std::os::unix::fs::symlink(&outside, repo.join("target/escape")).unwrap();
    let base_ino = std::fs::metadata(&out).unwrap().ino();

    let f = flags.display();
    // `a` reports the mtime it sees, rewrites the output in place (as a build does) and
    // adds one, then tries to read through the planted link. `b` does nothing. `c` names
    // only `node`, which the base has not.
    let script = format!(
        r#"
a:
  turns:
    - calls:
        - run_command: {{command: "stat -c %Y target/debug/out.txt > {f}/a-mtime && printf a > target/debug/out.txt && echo new > target/debug/new && echo ok > {f}/a-wrote"}}
        - read_file: {{path: target/escape/secret}}
        - complete_task: {{summary: built}}
b:
  turns:
    - calls:
        - complete_task: {{summary: idle}}
c:
  turns:
    - calls:
        - run_command: {{command: "ls -A > {f}/c-ls"}}
        - complete_task: {{summary: bare}}
"#
    );
    std::fs::write(repo.join("script.yml"), script).unwrap();
    let config = repo.join("taskdaemon.yml");
    std::fs::write(
        &config,
        format!(
            "llm: {{provider: scripted, script: script.yml}}\nsandbox: {{writable: ['{f}']}}\nkeep-worktrees: true\nwarm: [cargo]\nloops:\n  - {{name: a, type: code, task: t}}\n  - {{name: b, type: code, task: t}}\n  - {{name: c, type: code, task: t, warm: [node]}}\n"
        ),
    )
    .unwrap();
    let run_dir = root.join("run");
    let (stdout, stderr) = common::run_to_success(&config, &run_dir);

    // The loop saw the base's output with the base's mtime, and its confined command could
    // write into its seeded target/.
    assert_eq!(
        std::fs::read_to_string(flags.join("a-mtime"))
            .unwrap()
            .trim(),
        BASE_MTIME.to_string()
    );
    assert_eq!(
        std::fs::read_to_string(flags.join("a-wrote"))
            .unwrap()
            .trim(),
        "ok"
    );
    let wt = |name: &str| run_dir.join("worktrees").join(name);
    assert_eq!(
        std::fs::read_to_string(wt("a").join("target/debug/out.txt")).unwrap(),
        "a"
    );
    // Its output is its own: the base's and b's copies are as they were.
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "base");
    assert_eq!(std::fs::metadata(&out).unwrap().mtime(), BASE_MTIME);
    assert_eq!(std::fs::metadata(&out).unwrap().ino(), base_ino);
    assert!(!repo.join("target/debug/new").exists());
    let b_out = wt("b").join("target/debug/out.txt");
    assert_eq!(std::fs::read_to_string(&b_out).unwrap(), "base");
    assert_eq!(std::fs::metadata(&b_out).unwrap().mtime(), BASE_MTIME);
    assert!(!wt("b").join("target/debug/new").exists());

    // The planted link is a link in each copy, never followed, and the file tools refused it.
    for name in ["a", "b"] {
        let link = wt(name).join("target/escape");
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{name}"
        );
        assert_eq!(std::fs::read_link(&link).unwrap(), outside);
    }
    let transcript =
        std::fs::read_to_string(run_dir.join("loops/a/transcript.jsonl")).unwrap_or_default();
    assert!(!transcript.is_empty());
    assert!(
        !transcript.contains("TOPSECRET-OUTSIDE"),
        "the file tools read through the seeded link"
    );

    // A base without the named path: the worktree starts as today.
    assert!(!wt("c").join("target").exists());
    assert!(!wt("c").join("node_modules").exists());
    let c_ls = std::fs::read_to_string(flags.join("c-ls")).unwrap();
    assert!(
        !c_ls.contains("target") && !c_ls.contains("node_modules"),
        "{c_ls}"
    );

    // The record: per loop what was seeded, how, how much; the progress line says so.
    let s = summary(&run_dir);
    let warm = |name: &str| s["loops"][name]["warm"].clone();
    for name in ["a", "b"] {
        let w = warm(name);
        assert_eq!(w["paths"], serde_json::json!(["target"]), "{s}");
        assert_eq!(w["files"], 1, "{w}");
        assert_eq!(w["bytes"], 4, "{w}");
        assert_eq!(w["symlinks"], 1, "{w}");
        assert!(
            matches!(w["method"].as_str(), Some("copy" | "reflink")),
            "{w}"
        );
        assert!(w["ms"].is_u64(), "{w}");
    }
    let c = warm("c");
    assert_eq!(c["paths"], serde_json::json!([]), "{c}");
    assert_eq!(
        c["skipped"],
        serde_json::json!(["node_modules: not in the base checkout"]),
        "{c}"
    );
    let events: Vec<Value> = common::lines(&run_dir.join("events.jsonl"))
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let seeded = |name: &str| {
        events
            .iter()
            .position(|e| e["event"] == "worktree_seeded" && e["loop_name"] == name)
    };
    let started = |name: &str| {
        events
            .iter()
            .position(|e| e["event"] == "loop_started" && e["loop_name"] == name)
    };
    for name in ["a", "b", "c"] {
        assert!(
            seeded(name).unwrap() < started(name).unwrap(),
            "{name}: seeded before it starts"
        );
    }
    assert!(
        stdout.contains("a: warm: target seeded, 1 files, ")
            || stderr.contains("a: warm: target seeded, 1 files, "),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );

    // `status` tells the same per loop.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .arg("status")
        .arg("--dir")
        .arg(&run_dir)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{table}");
    assert!(table.contains("warm a: target (1 files, 4 B, "), "{table}");
    assert!(
        table.contains("warm c: nothing seeded (node_modules: not in the base checkout)"),
        "{table}"
    );
}

#[test]
fn a_shared_worktree_is_seeded_once_for_its_group() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let repo = root.join("repo");
    common::init_repo(
        &repo,
        &[
            ("README.md", "sample\n"),
            (".gitignore", "target/\n.taskdaemon/\n"),
        ],
    );
    std::fs::create_dir_all(repo.join("target")).unwrap();
    std::fs::write(repo.join("target/out"), "base").unwrap();
    std::fs::write(
        repo.join("script.yml"),
        "d:\n  turns:\n    - calls:\n        - complete_task: {summary: d}\ne:\n  turns:\n    - calls:\n        - complete_task: {summary: e}\n",
    )
    .unwrap();
    let config = repo.join("taskdaemon.yml");
    std::fs::write(
        &config,
        "llm: {provider: scripted, script: script.yml}\nkeep-worktrees: true\nwarm: [cargo]\nloops:\n  - {name: d, type: code, task: t, worktree: 'shared:g'}\n  - {name: e, type: code, task: t, worktree: 'shared:g'}\n",
    )
    .unwrap();
    let run_dir = root.join("run");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .args(["run", "-c"])
        .arg(&config)
        .arg("--run-dir")
        .arg(&run_dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seeded: Vec<Value> = common::lines(&run_dir.join("events.jsonl"))
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "worktree_seeded")
        .collect();
    assert_eq!(seeded.len(), 1, "{seeded:?}");
    assert_eq!(seeded[0]["seed"]["paths"], serde_json::json!(["target"]));
    assert_eq!(
        std::fs::read_to_string(run_dir.join("worktrees/shared-g/target/out")).unwrap(),
        "base"
    );
}
