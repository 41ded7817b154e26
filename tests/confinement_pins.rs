//! Hidden and protected paths inside a path a command may write, attacked through the real
//! binary (`tool exec` and `taskdaemon run`). Their mounts are made per command, in the
//! command's own mount namespace; a command cannot rename or remove a mount point there, but
//! it could rename the directories above one, and the next command's mounts (made at the old,
//! now missing, paths) would then hide and protect nothing. The directories between the
//! writable root and such a path are mount points too ("pins"), and a path that is no longer
//! the one the daemon started with stops every command.
//!
//! Each test first checks that the machine gives commands every protection; where it does
//! not, it says so and returns (`tests/confinement.rs` checks that the gap is reported).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

mod common;
use common::attack::{
    VICTIM_TURNS, assert_chain_key_kept_from, assert_victim_record_intact,
    victim_and_attacker_config,
};
use common::fully_confined;
use common::tool_exec::Exec;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

/// The output of one `run_command` that must have run.
fn sh(exec: &mut Exec, command: &str) -> String {
    let v = exec.request("run_command", json!({"command": command}));
    assert_eq!(v["is_error"], false, "{v}");
    v["content"].as_str().unwrap().to_string()
}

const DIR_SECRET: &str = "pinned-secret-in-a-hidden-dir";
const FILE_SECRET: &str = "pinned-secret-in-a-hidden-file";
const DEEP_SECRET: &str = "pinned-secret-deep-down";
const SECRETS: [&str; 3] = [DIR_SECRET, FILE_SECRET, DEEP_SECRET];

/// `<root>/wt` with a hidden directory, a hidden file beside it and a hidden file three
/// directories down; `<root>/taskdaemon.yml` hides the three.
fn hidden_worktree(root: &Path) -> (PathBuf, PathBuf) {
    let wt = root.join("wt");
    std::fs::create_dir_all(wt.join("conf/secrets")).unwrap();
    std::fs::create_dir_all(wt.join("a/b/c")).unwrap();
    std::fs::create_dir_all(wt.join("spare")).unwrap();
    std::fs::write(wt.join("conf/secrets/key.txt"), format!("{DIR_SECRET}\n")).unwrap();
    std::fs::write(wt.join("conf/hidden_file.txt"), format!("{FILE_SECRET}\n")).unwrap();
    std::fs::write(wt.join("a/b/c/deep.txt"), format!("{DEEP_SECRET}\n")).unwrap();
    std::fs::write(wt.join("conf/plain.txt"), "plain\n").unwrap();
    let config = root.join("taskdaemon.yml");
    std::fs::write(
        &config,
        "sandbox: {hide: [wt/conf/secrets, wt/conf/hidden_file.txt, wt/a/b/c/deep.txt]}\n",
    )
    .unwrap();
    (wt, config)
}

/// A shell script that tries each way to move a name away and prints `<label>: moved` or
/// `<label>: refused` for each. `renames` are `mv` pairs; `exchanges` are swapped with
/// `renameat2(RENAME_EXCHANGE)` (both names must exist).
fn attack_script(
    renames: &[(&str, &str)],
    exchanges: &[(&str, &str)],
    removals: &[&str],
) -> String {
    let mut script = String::from(
        "try() { label=$1; shift; if \"$@\" 2>/dev/null; then echo \"$label: moved\"; else echo \"$label: refused\"; fi; }\n",
    );
    for (from, to) in renames {
        script.push_str(&format!("try 'mv {from}' mv {from} {to}\n"));
    }
    for path in removals {
        script.push_str(&format!("try 'rmdir {path}' rmdir {path}\n"));
        script.push_str(&format!("try 'rm {path}' rm {path}\n"));
    }
    let pairs: Vec<String> = exchanges
        .iter()
        .map(|(a, b)| format!("(\"{a}\", \"{b}\")"))
        .collect();
    script.push_str(&format!(
        "python3 - <<'EOF'\nimport ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nfor a, b in [{}]:\n    r = libc.renameat2(-100, a.encode(), -100, b.encode(), 2)\n    print('exchange %s %s: %s' % (a, b, 'moved' if r == 0 else 'refused'))\n    if r == 0:\n        libc.renameat2(-100, a.encode(), -100, b.encode(), 2)\nfor a in [{}]:\n    try:\n        os.rename(a, a + '.renamed')\n        print('rename(2) %s: moved' % a)\n    except OSError:\n        print('rename(2) %s: refused' % a)\nEOF\n",
        pairs.join(", "),
        renames
            .iter()
            .map(|(from, _)| format!("\"{from}\""))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    script
}

/// Every line of the attack's output says `refused`.
fn assert_all_refused(out: &str, expected_lines: usize) {
    let verdicts: Vec<&str> = out
        .lines()
        .filter(|l| l.ends_with(": moved") || l.ends_with(": refused"))
        .collect();
    assert_eq!(verdicts.len(), expected_lines, "{out}");
    let moved: Vec<&&str> = verdicts.iter().filter(|l| l.ends_with("moved")).collect();
    assert!(moved.is_empty(), "moved: {moved:?}\n{out}");
}

fn assert_no_secret(out: &str) {
    for secret in SECRETS {
        assert!(!out.contains(secret), "{secret} leaked:\n{out}");
    }
}

#[test]
fn hidden_files_and_directories_stay_hidden_when_their_parents_are_renamed() {
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (wt, config) = hidden_worktree(tmp.path());
    let mut exec = Exec::start_with(&wt, &["-c", config.to_str().unwrap()]);
    let renames = [
        ("conf", "conf2"),
        ("a", "a2"),
        ("a/b", "a/b2"),
        ("a/b/c", "a/b/c2"),
        ("conf/secrets", "secrets2"),
        ("conf/hidden_file.txt", "h2"),
        ("a/b/c/deep.txt", "d2"),
    ];
    let exchanges = [
        ("conf", "spare"),
        ("a", "spare"),
        ("a/b/c", "spare"),
        ("conf/secrets", "spare"),
    ];
    let removals = ["conf/secrets", "conf/hidden_file.txt", "a/b/c/deep.txt"];
    let script = attack_script(&renames, &exchanges, &removals);
    let out = sh(&mut exec, &script);
    assert_all_refused(
        &out,
        renames.len() * 2 + exchanges.len() + removals.len() * 2,
    );
    // The pinned directories are still the loop's to work in.
    let out = sh(
        &mut exec,
        "echo fine > conf/new.txt && mkdir -p a/b/c/d && cat conf/new.txt",
    );
    assert!(out.contains("fine"), "{out}");
    assert!(wt.join("a/b/c/d").is_dir());
    // A hard link to a hidden file cannot be made (it is a mount of another file system);
    // nor can the parents go with their contents.
    let out = sh(
        &mut exec,
        "ln conf/hidden_file.txt linked 2>&1 || echo link-refused; \
         rm -rf conf a 2>/dev/null; ls conf a/b/c | sort",
    );
    assert!(out.contains("link-refused"), "{out}");
    // The next command (a new mount namespace) finds everything where it was, hidden.
    let out = sh(
        &mut exec,
        "grep -rh pinned-secret . 2>/dev/null; \
         echo \"file:[$(cat conf/hidden_file.txt)] deep:[$(cat a/b/c/deep.txt)]\"; \
         ls -A conf/secrets | wc -l",
    );
    assert_no_secret(&out);
    assert!(out.contains("file:[] deep:[]"), "{out}");
    exec.finish_ok();
    // Hidden for commands only: the files are untouched.
    assert_eq!(
        std::fs::read_to_string(wt.join("conf/secrets/key.txt")).unwrap(),
        format!("{DIR_SECRET}\n")
    );
    assert_eq!(
        std::fs::read_to_string(wt.join("a/b/c/deep.txt")).unwrap(),
        format!("{DEEP_SECRET}\n")
    );
}

#[test]
fn a_hidden_path_moved_or_replaced_behind_the_daemons_back_stops_every_command() {
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (wt, config) = hidden_worktree(tmp.path());
    let mut exec = Exec::start_with(&wt, &["-c", config.to_str().unwrap()]);
    assert!(sh(&mut exec, "echo ran").contains("ran"));
    // Something other than a command (the user, another program) moves the directory and
    // puts a decoy in its place: the hidden names now hold other files.
    std::fs::rename(wt.join("conf"), wt.join("conf-moved")).unwrap();
    std::fs::create_dir_all(wt.join("conf/secrets")).unwrap();
    std::fs::write(wt.join("conf/hidden_file.txt"), "decoy\n").unwrap();
    let v = exec.request(
        "run_command",
        json!({"command": "cat conf-moved/hidden_file.txt conf-moved/secrets/key.txt; echo ran"}),
    );
    let text = v["content"].as_str().unwrap();
    assert_eq!(v["is_error"], true, "{v}");
    assert!(!text.contains("ran\n"), "the command ran: {text}");
    assert_no_secret(text);
    assert!(
        text.contains("conf/secrets") || text.contains("conf/hidden_file.txt"),
        "the path is not named: {text}"
    );
    assert!(text.contains("moved or replaced"), "{text}");
    // Put back, the same files are hidden again and commands run.
    std::fs::remove_dir_all(wt.join("conf")).unwrap();
    std::fs::rename(wt.join("conf-moved"), wt.join("conf")).unwrap();
    let out = sh(&mut exec, "cat conf/hidden_file.txt; echo ran");
    assert!(out.contains("ran"), "{out}");
    assert_no_secret(&out);
    // Gone (moved out of the worktree): refused again, naming it.
    std::fs::rename(wt.join("a/b/c/deep.txt"), tmp.path().join("deep.txt")).unwrap();
    let v = exec.request("run_command", json!({"command": "echo ran"}));
    let text = v["content"].as_str().unwrap();
    assert_eq!(v["is_error"], true, "{v}");
    assert!(text.contains("a/b/c/deep.txt"), "{text}");
    exec.finish_ok();
}

#[test]
fn a_hidden_file_with_a_second_name_stops_every_command() {
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (wt, config) = hidden_worktree(tmp.path());
    std::fs::hard_link(wt.join("conf/hidden_file.txt"), wt.join("notes.txt")).unwrap();
    let mut exec = Exec::start_with(&wt, &["-c", config.to_str().unwrap()]);
    let v = exec.request("run_command", json!({"command": "cat notes.txt; echo ran"}));
    let text = v["content"].as_str().unwrap();
    assert_eq!(v["is_error"], true, "{v}");
    assert_no_secret(text);
    assert!(text.contains("conf/hidden_file.txt"), "{text}");
    assert!(text.contains("hard link"), "{text}");
    exec.finish_ok();
}

#[test]
fn a_receipts_log_where_commands_may_write_is_refused_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let wt = root.join("wt");
    let shared = root.join("shared");
    for dir in [&wt, &shared] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let key = root.join("outside.key");
    let config = root.join("taskdaemon.yml");
    std::fs::write(&config, "sandbox: {writable: [shared]}\n").unwrap();
    // The attack this prevents: the first command moves the log's directory away, the next
    // one appends to the log under its new name (or blocks LOG.RECEIPT.json with a directory).
    let calls = [
        json!({"id": "1", "name": "run_command", "input": {"command": "mv logs logs2"}}),
        json!({"id": "2", "name": "run_command", "input": {"command": "echo forged >> logs2/r.jsonl; mkdir logs2/r.jsonl.RECEIPT.json"}}),
    ];
    let input: String = calls.iter().map(|c| format!("{c}\n")).collect();
    for log in [wt.join("logs/r.jsonl"), shared.join("logs/r.jsonl")] {
        let out = session(&wt, &log, &key, &config, &input);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", log.display());
        assert!(
            stderr.contains("where commands may write"),
            "{}: {stderr}",
            log.display()
        );
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let dir = log.parent().unwrap();
        assert!(!dir.exists(), "{} was made", dir.display());
    }
    assert!(!key.exists());
    // Outside every writable path the log is fine.
    let log = root.join("logs/r.jsonl");
    let out = session(&wt, &log, &key, &config, "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(log.exists() && key.exists());
}

fn session(wt: &Path, log: &Path, key: &Path, config: &Path, input: &str) -> Output {
    let mut child = common::spawn_piped(
        Exec::command(wt)
            .arg("--receipts")
            .arg(log)
            .arg("--chain-key")
            .arg(key)
            .arg("-c")
            .arg(config),
    );
    let mut stdin = child.stdin.take().unwrap();
    // The session may refuse to start and close its end before reading.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// The attacker's script for the run below: it tries to move the directories above the run
/// record (`a/records`, a `--run-dir` inside the repository) away, then to read the receipt
/// chain key and to rewrite the victim's record under every name it might have now.
/// (`victim`, from `common::attack`, writes a file and completes first.)
const ATTACKER_TURNS: &str = r#"
attacker:
  turns:
    - calls:
        - run_command: {command: {{ATTACK}}}
        - run_command: {command: "cat a2/records/receipt-chain.key a/records/receipt-chain.key spare/receipt-chain.key 2>&1; for f in $(find . -name receipts.jsonl -o -name transcript.jsonl -o -name summary.json -o -name events.jsonl); do echo forged > \"$f\"; done; echo tried"}
        - complete_task: {summary: "tried"}
"#;

#[test]
fn a_loop_that_renames_the_directories_above_the_run_record_reaches_neither_its_key_nor_its_files()
{
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let repo = root.join("repo");
    std::fs::create_dir_all(repo.join("spare")).unwrap();
    std::fs::write(repo.join("spare/keep.txt"), "spare\n").unwrap();
    common::init_repo(&repo, &[("README.md", "x\n"), (".gitignore", "records/\n")]);
    let config_dir = root.join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    let attack = attack_script(
        &[("a", "a2"), ("a/records", "a/r2")],
        &[("a", "spare"), ("a/records", "spare")],
        &["a/records"],
    );
    std::fs::write(
        config_dir.join("script.yml"),
        [
            VICTIM_TURNS,
            &ATTACKER_TURNS.replace("{{ATTACK}}", &json!(attack).to_string()),
        ]
        .concat(),
    )
    .unwrap();
    std::fs::write(
        config_dir.join("taskdaemon.yml"),
        victim_and_attacker_config(&repo),
    )
    .unwrap();
    let run_dir = repo.join("a/records");
    let out = Command::new(bin())
        .arg("run")
        .arg("-c")
        .arg(config_dir.join("taskdaemon.yml"))
        .arg("--run-dir")
        .arg(&run_dir)
        .env("HOME", &root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The record is where the daemon put it, and the victim's part of it is intact.
    assert_victim_record_intact(&run_dir, &stderr);
    let transcript =
        std::fs::read_to_string(run_dir.join("loops/attacker/transcript.jsonl")).unwrap();
    // What the commands printed (the transcript also holds the script itself).
    let results: Vec<String> = transcript
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["entry"] == "tool_result" && e["name"] == "run_command")
        .map(|e| e["content"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(results.len(), 2, "{transcript}");
    assert!(results[1].contains("tried"), "the attack ran: {transcript}");
    assert!(results[0].contains("mv a: refused"), "{}", results[0]);
    assert_all_refused(&results[0], 2 * 2 + 2 + 2);
    assert_chain_key_kept_from(&run_dir, &transcript);
    assert!(!repo.join("a2").exists() && !repo.join("a/r2").exists());
}
