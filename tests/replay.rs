//! `replay verify` under attack, through the real binary: receipts edited, inserted,
//! dropped, swapped or cut from the end of a log are named and never run; a log that cannot
//! be checked is never reported as verified; what does run is confined like a loop's
//! commands; and the session receipts and per-tool counts a run leaves behind.
//!
//! Logs are recorded by `tool exec --receipts` sessions and by scripted runs, then changed
//! the way an attacker without the chain key could change them. A local HTTP server stands
//! for the outside world: a replayed command that reaches it ran.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use tempfile::TempDir;

mod common;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

/// Every child gets a home of its own and no proxy (the "outside world" is 127.0.0.1).
fn isolate(cmd: &mut Command, home: &Path) {
    cmd.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("GIT_CONFIG_NOSYSTEM", "1");
    for proxy in [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        cmd.env_remove(proxy);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A local server that answers every request with a 404 and counts the connections: a
/// replayed command that reaches it ran.
fn outside_world() -> common::LocalServer<()> {
    common::LocalServer::start(|mut stream| {
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        let mut buf = [0u8; 4096];
        let _ = stream.read(&mut buf);
        let _ = stream
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        Some(())
    })
}

/// A command whose output is `hello` whether or not it reached `port`.
fn phoning_home(port: u16) -> String {
    format!("git ls-remote http://127.0.0.1:{port}/x.git >/dev/null 2>&1; echo hello")
}

/// A `tool exec --receipts` session: `<tmp>/wt` the worktree, `<tmp>/before` a copy of it as
/// it was before the calls, `<tmp>/logs/receipts.jsonl` the log (its key and session receipt
/// beside it).
struct Recorded {
    tmp: TempDir,
}

impl Recorded {
    fn new(files: &[(&str, &str)]) -> Recorded {
        let tmp = tempfile::tempdir().unwrap();
        for dir in ["wt", "before", "logs", "home/.config"] {
            std::fs::create_dir_all(tmp.path().join(dir)).unwrap();
        }
        for (name, content) in files {
            for dir in ["wt", "before"] {
                std::fs::write(tmp.path().join(dir).join(name), content).unwrap();
            }
        }
        Recorded { tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn log(&self) -> PathBuf {
        self.path("logs/receipts.jsonl")
    }

    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(bin());
        cmd.args(args).current_dir(self.tmp.path());
        isolate(&mut cmd, &self.path("home"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs one session with `calls` (tool name, input) and `extra` arguments.
    fn exec(&self, calls: &[(&str, Value)], extra: &[&str], env: &[(&str, &str)]) -> Output {
        let log = self.log();
        let wt = self.path("wt");
        let mut args = vec![
            "tool",
            "exec",
            "--worktree",
            wt.to_str().unwrap(),
            "--receipts",
            log.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut child = common::spawn_piped(&mut self.command(&args, env));
        let mut stdin = child.stdin.take().unwrap();
        for (i, (name, input)) in calls.iter().enumerate() {
            let line = json!({"id": i.to_string(), "name": name, "input": input});
            writeln!(stdin, "{line}").unwrap();
        }
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let answers = text(&out.stdout);
        assert_eq!(answers.lines().count(), calls.len(), "{answers}");
        out
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn write_lines(&self, lines: &[String]) {
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(self.log(), text).unwrap();
    }

    /// `replay verify LOG --worktree <before> EXTRA`: (exit code, stdout, stderr).
    fn verify(&self, extra: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
        let (log, before) = (self.log(), self.path("before"));
        let mut args = vec![
            "replay",
            "verify",
            log.to_str().unwrap(),
            "--worktree",
            before.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = self.command(&args, env).output().unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    }
}

fn parse(line: &str) -> Value {
    serde_json::from_str(line).unwrap()
}

/// Four calls whose outputs do not depend on each other's order.
fn reads() -> Vec<(&'static str, Value)> {
    vec![
        ("read_file", json!({"path": "a.txt"})),
        ("read_file", json!({"path": "b.txt"})),
        ("list_directory", json!({"path": "."})),
        ("grep", json!({"pattern": "beta"})),
    ]
}

fn two_files() -> Recorded {
    Recorded::new(&[("a.txt", "alpha\n"), ("b.txt", "beta\n")])
}

#[test]
fn an_intact_session_log_verifies_and_names_its_chain_and_session_receipt() {
    let rec = two_files();
    rec.exec(&reads(), &[], &[]);
    // A second session on the same log goes on with the same chain.
    rec.exec(&[("read_file", json!({"path": "a.txt"}))], &[], &[]);
    let lines = rec.lines();
    let seqs: Vec<u64> = lines
        .iter()
        .map(|l| parse(l)["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    for line in &lines {
        let chain = parse(line)["chain"].as_str().unwrap().to_string();
        assert_eq!(chain.len(), 64, "{line}");
    }
    let (code, out, err) = rec.verify(&[], &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("chain: verified, 5 receipt(s), seq 1..5"),
        "{out}"
    );
    assert!(
        out.contains("5 identical, 0 differ, 0 skipped, 0 refused"),
        "{out}"
    );
    assert!(out.contains("receipts.jsonl.RECEIPT.json"), "{out}");
}

#[test]
fn a_command_edited_into_a_receipt_is_refused_by_its_input_hash_and_never_runs() {
    let world = outside_world();
    let rec = two_files();
    rec.exec(
        &[
            ("read_file", json!({"path": "a.txt"})),
            ("run_command", json!({"command": "echo hello"})),
            ("read_file", json!({"path": "b.txt"})),
        ],
        &[],
        &[],
    );
    let mut lines = rec.lines();
    let mut edited = parse(&lines[1]);
    let id = edited["id"].as_str().unwrap().to_string();
    edited["input"]["command"] = json!(phoning_home(world.port));
    lines[1] = edited.to_string();
    rec.write_lines(&lines);

    let (code, out, err) = rec.verify(&[], &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "TAMPERED #2 run_command (seq 2, id {id}): its input does not hash to its input_hash"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "REFUSED #2 run_command (seq 2, id {id}): not replayed"
        )),
        "{out}"
    );
    assert!(
        out.contains("2 identical, 0 differ, 0 skipped, 1 refused"),
        "{out}"
    );
    assert!(world.seen().is_empty(), "the edited command ran:\n{out}");
}

#[test]
fn a_receipt_edited_with_its_input_hash_recomputed_is_named_by_the_chain_and_never_runs() {
    let world = outside_world();
    let rec = two_files();
    rec.exec(
        &[
            ("run_command", json!({"command": "echo hello"})),
            ("read_file", json!({"path": "a.txt"})),
        ],
        &[],
        &[],
    );
    let mut lines = rec.lines();
    let mut edited = parse(&lines[0]);
    let id = edited["id"].as_str().unwrap().to_string();
    edited["input"]["command"] = json!(phoning_home(world.port));
    edited["input_hash"] = json!(td_toolkit::receipts::hash_value(&edited["input"]));
    edited["side_effects"][0]["command"] = edited["input"]["command"].clone();
    lines[0] = edited.to_string();
    rec.write_lines(&lines);

    let (code, out, err) = rec.verify(&[], &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(out.contains("chain: BROKEN"), "{out}");
    assert!(
        out.contains(&format!(
            "TAMPERED #1 run_command (seq 1, id {id}): it does not match its chain value"
        )),
        "{out}"
    );
    assert!(
        out.contains("1 identical, 0 differ, 0 skipped, 1 refused"),
        "{out}"
    );
    assert!(world.seen().is_empty(), "the edited command ran:\n{out}");
}

#[test]
fn a_dropped_middle_receipt_is_named_with_its_id() {
    let rec = two_files();
    rec.exec(&reads(), &[], &[]);
    let mut lines = rec.lines();
    let dropped = parse(&lines[1])["id"].as_str().unwrap().to_string();
    lines.remove(1);
    rec.write_lines(&lines);
    let (code, out, err) = rec.verify(&[], &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "DROPPED seq 2 ({dropped}): missing between #1 (seq 1) and #2 (seq 3)"
        )),
        "{out}"
    );
    assert!(
        out.contains("UNVERIFIABLE #2 list_directory (seq 3,"),
        "{out}"
    );
}

#[test]
fn swapped_receipts_are_named() {
    let rec = two_files();
    rec.exec(&reads(), &[], &[]);
    let mut lines = rec.lines();
    lines.swap(0, 1);
    rec.write_lines(&lines);
    let (code, out, err) = rec.verify(&[], &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("OUT OF ORDER"))
        .unwrap_or_else(|| panic!("no out-of-order line:\n{out}"));
    // One line names both receipts of the swap.
    assert!(line.contains("seq 1") && line.contains("seq 2"), "{line}");
    assert!(out.contains("1 refused"), "{out}");
}

#[test]
fn inserted_and_repeated_receipts_are_named() {
    let rec = two_files();
    rec.exec(&reads(), &[], &[]);
    // A receipt made by someone with another key (another session's log).
    let other = two_files();
    other.exec(&[("read_file", json!({"path": "a.txt"}))], &[], &[]);
    let foreign = other.lines().remove(0);
    let foreign_id = parse(&foreign)["id"].as_str().unwrap().to_string();
    let mut lines = rec.lines();
    lines.insert(2, foreign);
    lines.push(lines[0].clone());
    rec.write_lines(&lines);
    let (code, out, err) = rec.verify(&[], &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        out.contains(&format!("TAMPERED #3 read_file (seq 1, id {foreign_id})")),
        "{out}"
    );
    assert!(out.contains("REPEATED #6 read_file (seq 1,"), "{out}");
}

#[test]
fn a_log_without_a_chain_or_a_key_is_never_reported_as_verified() {
    let world = outside_world();
    let rec = two_files();
    rec.exec(
        &[("run_command", json!({"command": phoning_home(world.port)}))],
        &[],
        &[],
    );
    let hits = world.seen().len();
    assert_eq!(hits, 1, "the recorded command reaches the server");
    let key = rec.path("logs/receipts.jsonl.key");
    let moved = rec.path("kept.key");
    std::fs::rename(&key, &moved).unwrap();

    let (code, out, _) = rec.verify(&[], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("chain: NOT CHECKED: no chain key found"),
        "{out}"
    );
    assert!(
        out.contains("0 identical, 0 differ, 0 skipped, 1 refused"),
        "{out}"
    );
    assert_eq!(world.seen().len(), hits, "nothing ran:\n{out}");
    let (code, out, _) = rec.verify(&["--chain-key", moved.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(world.seen().len(), hits + 1);

    // An older log: no seq, no chain.
    let lines: Vec<String> = rec
        .lines()
        .iter()
        .map(|l| {
            let mut v = parse(l);
            v.as_object_mut().unwrap().remove("seq");
            v.as_object_mut().unwrap().remove("chain");
            v.to_string()
        })
        .collect();
    rec.write_lines(&lines);
    let unchained = ["--chain-key", moved.to_str().unwrap(), "--no-session"];
    let (code, out, _) = rec.verify(&unchained, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("chain: UNCHAINED"), "{out}");
    assert!(out.contains("1 refused"), "{out}");
    assert_eq!(world.seen().len(), hits + 1, "nothing ran:\n{out}");
    let mut asked = unchained.to_vec();
    asked.push("--unverified");
    let (code, out, _) = rec.verify(&asked, &[]);
    assert_eq!(code, Some(1), "replayed, but still not verified:\n{out}");
    assert!(out.contains("1 identical"), "{out}");
}

#[test]
fn a_session_receipt_edited_to_hide_a_cut_log_does_not_verify() {
    let rec = two_files();
    rec.exec(&reads(), &[], &[]);
    let lines = rec.lines();
    let last = parse(&lines[3])["id"].as_str().unwrap().to_string();
    rec.write_lines(&lines[..3]);
    let (code, out, _) = rec.verify(&[], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "DROPPED seq 4 ({last}): missing at the end of the log, after #3 (seq 3)"
        )),
        "{out}"
    );
    let session = rec.path("logs/receipts.jsonl.RECEIPT.json");
    let mut receipt: Value =
        serde_json::from_str(&std::fs::read_to_string(&session).unwrap()).unwrap();
    receipt["chain_seq"] = json!(3);
    receipt["receipt_count"] = json!(3);
    receipt["chain_head"] = parse(&lines[2])["chain"].clone();
    std::fs::write(&session, receipt.to_string()).unwrap();
    let (code, out, _) = rec.verify(&[], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("its seal does not verify"), "{out}");
    std::fs::remove_file(&session).unwrap();
    let (code, out, _) = rec.verify(&[], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("session receipt: MISSING"), "{out}");
}

#[test]
fn the_chain_key_stays_out_of_the_worktree_and_out_of_commands() {
    let rec = two_files();
    let inside = rec.path("wt/logs/r.jsonl");
    let out = rec
        .command(
            &[
                "tool",
                "exec",
                "--worktree",
                rec.path("wt").to_str().unwrap(),
                "--receipts",
                inside.to_str().unwrap(),
            ],
            &[],
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("inside the worktree"),
        "{}",
        text(&out.stderr)
    );
    assert!(!rec.path("wt/logs/r.jsonl.key").exists());

    let key = rec.path("logs/receipts.jsonl.key");
    let out = rec.exec(
        &[(
            "run_command",
            json!({"command": format!("wc -c < '{}'; cat '{}'", key.display(), key.display())}),
        )],
        &[],
        &[],
    );
    let answer = parse(text(&out.stdout).lines().next().unwrap());
    let content = answer["content"].as_str().unwrap();
    assert!(content.contains("--- stdout ---\n0\n"), "{content}");
    let key_text = std::fs::read_to_string(&key).unwrap();
    assert_eq!(key_text.trim().len(), 64);
    assert!(!content.contains(key_text.trim()), "{content}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn replayed_commands_are_confined_like_the_session_that_recorded_them() {
    const CRED: &str = "deploy-cred-5f1e9a3c77b2";
    let rec = two_files();
    let outside = rec.path("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let config = rec.path("taskdaemon.yml");
    std::fs::write(&config, "sandbox:\n  env:\n    secret: [DEPLOY_CRED]\n").unwrap();
    let command = format!(
        "printf 'cred=[%s]\\n' \"$DEPLOY_CRED\"; echo leaked > '{}/leak.txt' 2>/dev/null || echo 'write refused'; echo inside > here.txt",
        outside.display()
    );
    let env = [("DEPLOY_CRED", CRED)];
    let cfg = config.to_str().unwrap();
    let out = rec.exec(
        &[("run_command", json!({"command": command}))],
        &["-c", cfg],
        &env,
    );
    let recorded = text(&out.stdout);
    assert!(
        recorded.contains("cred=[]") && recorded.contains("write refused"),
        "{recorded}"
    );

    let (code, report, err) = rec.verify(&["-c", cfg], &env);
    assert_eq!(code, Some(0), "{report}\n{err}");
    assert!(report.contains("1 identical"), "{report}");
    assert!(!outside.join("leak.txt").exists());
    assert!(
        !rec.path("before/here.txt").exists(),
        "replay works on a copy"
    );
    assert!(!report.contains(CRED) && !err.contains(CRED));
}

// ---------------------------------------------------------------------------------------
// A scripted run: session receipts, per-tool counts, and a cut log caught at its end.

/// A user repository, a config with one loop `a` whose script makes calls of every kind
/// (a write, reads, a schema refusal, an unknown tool, a command that reads the chain
/// key), and the run directory `<tmp>/run`.
struct Run {
    tmp: TempDir,
}

impl Run {
    fn start() -> Run {
        let tmp = tempfile::tempdir().unwrap();
        let run = Run { tmp };
        std::fs::create_dir_all(run.path("home/.config")).unwrap();
        common::init_repo(&run.path("user"), &[("README.md", "project\n")]);
        std::fs::create_dir_all(run.path("config")).unwrap();
        let key = run.path("run/receipt-chain.key");
        std::fs::write(
            run.path("config/taskdaemon.yml"),
            "repo: ../user\nllm: {provider: scripted, script: script.yml}\nmerge: false\nloops:\n  - name: a\n    type: code\n    task: Write x.txt.\n    validation: \"test -s x.txt\"\n",
        )
        .unwrap();
        std::fs::write(
            run.path("config/script.yml"),
            format!(
                "a:\n  turns:\n    - calls:\n        - write_file: {{path: x.txt, content: \"x\\n\"}}\n        - read_file: {{path: x.txt}}\n        - read_file: {{path: 7}}\n        - no_such_tool: {{}}\n        - run_command: {{command: \"wc -c < '{}'; echo done\"}}\n        - complete_task: {{summary: done}}\n",
                key.display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(["run", "-c"])
            .arg(run.path("config/taskdaemon.yml"))
            .arg("--run-dir")
            .arg(run.path("run"))
            .arg("--json")
            .current_dir(run.path(""))
            .stdin(Stdio::null());
        isolate(&mut cmd, &run.path("home"));
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        run
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn log(&self) -> PathBuf {
        self.path("run/loops/a/receipts.jsonl")
    }

    fn receipts(&self) -> Vec<Value> {
        std::fs::read_to_string(self.log())
            .unwrap()
            .lines()
            .map(parse)
            .collect()
    }

    fn verify(&self) -> (Option<i32>, String) {
        let mut cmd = Command::new(bin());
        cmd.args(["replay", "verify"])
            .arg(self.log())
            .arg("--worktree")
            .arg(self.path("user"));
        isolate(&mut cmd, &self.path("home"));
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            format!("{}{}", text(&out.stdout), text(&out.stderr)),
        )
    }
}

#[test]
fn a_run_closes_each_loop_with_a_session_receipt_that_catches_a_cut_log() {
    let run = Run::start();
    let receipts = run.receipts();
    let session: Value = serde_json::from_str(
        &std::fs::read_to_string(run.path("run/loops/a/RECEIPT.json")).unwrap(),
    )
    .unwrap();
    let ids: Vec<Value> = receipts.iter().map(|r| r["id"].clone()).collect();
    let n = receipts.len() as u64;
    assert_eq!(session["version"], 1);
    assert_eq!(session["exec_id"], "a");
    assert_eq!(session["status"], "completed");
    assert!(
        session["session_id"].as_str().unwrap().ends_with("/a"),
        "{session}"
    );
    assert_eq!(session["tool_receipts"], Value::Array(ids));
    assert_eq!(session["receipt_count"], n);
    assert_eq!(session["chain_seq"], n);
    assert_eq!(session["chain_head"], receipts.last().unwrap()["chain"]);
    let latency: u64 = receipts
        .iter()
        .map(|r| r["latency_ms"].as_u64().unwrap())
        .sum();
    assert_eq!(session["total_latency_ms"], latency);
    let effects: Vec<Value> = receipts
        .iter()
        .flat_map(|r| r["side_effects"].as_array().unwrap().clone())
        .collect();
    assert_eq!(session["side_effects"], Value::Array(effects));
    assert_eq!(
        session["validation"],
        json!({"exit_code": 0, "passed": true})
    );
    assert_eq!(session["mac"].as_str().map(str::len), Some(64));
    assert_eq!(session["tool_set"][0], "read_file", "the loop type's tools");

    // The command could not read the key (it reads as empty to commands).
    let command = receipts
        .iter()
        .find(|r| r["tool"] == "run_command")
        .unwrap();
    let transcript = std::fs::read_to_string(run.path("run/loops/a/transcript.jsonl")).unwrap();
    assert!(
        transcript.contains("--- stdout ---\\n0\\ndone"),
        "{transcript}"
    );
    assert_eq!(command["side_effects"][0]["exit_code"], 0);

    let (code, out) = run.verify();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("chain: verified, {n} receipt(s), seq 1..{n}")),
        "{out}"
    );
    assert!(out.contains("0 differ, 0 skipped, 0 refused"), "{out}");

    // Drop the last receipt: every link that is left verifies; the session receipt does not.
    let lines: Vec<String> = std::fs::read_to_string(run.log())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let last = receipts.last().unwrap()["id"].as_str().unwrap().to_string();
    std::fs::write(
        run.log(),
        format!("{}\n", lines[..lines.len() - 1].join("\n")),
    )
    .unwrap();
    let (code, out) = run.verify();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "DROPPED seq {n} ({last}): missing at the end of the log"
        )),
        "{out}"
    );
}

#[test]
fn summary_counts_calls_errors_and_schema_refusals_per_tool() {
    let run = Run::start();
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run.path("run/summary.json")).unwrap())
            .unwrap();
    let tools = &summary["loops"]["a"]["tools"];
    assert_eq!(
        tools["read_file"],
        json!({"calls": 2, "errors": 1, "schema_refused": 1}),
        "{tools}"
    );
    assert_eq!(
        tools["(unknown tool)"],
        json!({"calls": 1, "errors": 1, "schema_refused": 1}),
        "{tools}"
    );
    assert_eq!(
        tools["write_file"],
        json!({"calls": 1, "errors": 0, "schema_refused": 0})
    );
    assert_eq!(tools["validate"]["calls"], 1, "{tools}");
    // The session receipt counts the same.
    let session: Value = serde_json::from_str(
        &std::fs::read_to_string(run.path("run/loops/a/RECEIPT.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(&session["tools"], tools);
    // And each receipt says whether the schema accepted its input.
    let refused: Vec<Value> = run
        .receipts()
        .into_iter()
        .filter(|r| r["schema_valid"] == false)
        .map(|r| r["tool"].clone())
        .collect();
    assert_eq!(refused, [json!("read_file"), json!("no_such_tool")]);
    let key = std::fs::read_to_string(run.path("run/receipt-chain.key")).unwrap();
    assert_eq!(key.trim().len(), 64);
}

/// A crash in the middle of writing a receipt leaves a torn last line; the next session's
/// first receipt starts a line of its own instead of being glued to it (and lost with it).
#[test]
fn a_session_after_a_torn_last_line_writes_its_receipts_on_lines_of_their_own() {
    let rec = two_files();
    rec.exec(&reads(), &[], &[]);
    let torn = r#"{"id":"0196-torn","call_id":"4","exec_i"#;
    let mut text = std::fs::read_to_string(rec.log()).unwrap();
    text.push_str(torn);
    std::fs::write(rec.log(), &text).unwrap();
    rec.exec(&[("read_file", json!({"path": "a.txt"}))], &[], &[]);
    let lines = rec.lines();
    assert_eq!(lines.len(), 6, "{lines:#?}");
    assert_eq!(lines[4], torn, "the torn line is kept as it was");
    let last = parse(&lines[5]);
    assert_eq!(
        (last["tool"].as_str(), last["seq"].as_u64()),
        (Some("read_file"), Some(5))
    );
    let (_, out, err) = rec.verify(&[], &[]);
    assert!(
        out.contains("line 5"),
        "the torn line is reported:\n{out}\n{err}"
    );
}
