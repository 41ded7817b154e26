//! Secrets never leave the process: the real binary is given keys in its environment (or in
//! a key file) and made to meet them in a command's output, in a model's own words and in a
//! provider's error reply. Every answer, every file of the run record or receipt log, and
//! stdout and stderr must show `[REDACTED:NAME]` and never the value.
//!
//! Every process gets an isolated `HOME` and none of the provider keys of the machine running
//! the tests; the test process's own environment is never changed (tests run in parallel).

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

mod common;
use common::http_once::{HttpRequest, answer_once};
use common::init_repo;

/// `taskdaemon ARGS` with an isolated home, no provider keys but those in `env`, run in `dir`.
fn taskdaemon(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = common::isolated_taskdaemon(dir, args);
    cmd.envs(env.iter().copied());
    cmd
}

/// Runs `cmd` to its end with `stdin` as its input.
fn run_with_input(mut cmd: Command, stdin: &str) -> Output {
    let mut child = cmd.stdin(Stdio::piped()).spawn().unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.as_bytes()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every file under `dir` (recursively) whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path)
                && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
            {
                found.push(path);
            }
        }
    }
    found
}

/// Every file under `dir`, for messages.
fn file_count(dir: &Path) -> usize {
    let mut count = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                count += 1;
            }
        }
    }
    count
}

// ---------------------------------------------------------------------------------------
// (i) tool exec

const ANTHROPIC_KEY: &str = "sk-ant-test-3b8e41c0d7a95f26";

#[test]
fn tool_exec_redacts_a_key_a_command_prints_from_its_results_and_receipts() {
    let tmp = tempfile::tempdir().unwrap();
    let worktree = tmp.path().join("wt");
    std::fs::create_dir_all(&worktree).unwrap();
    std::fs::write(worktree.join("key.txt"), format!("{ANTHROPIC_KEY}\n")).unwrap();
    // The worktree as it was before the calls, for `replay verify`.
    let before = tmp.path().join("before");
    std::fs::create_dir_all(&before).unwrap();
    std::fs::copy(worktree.join("key.txt"), before.join("key.txt")).unwrap();
    let receipts = tmp.path().join("receipts.jsonl");

    let requests = [
        json!({"id": "echo", "name": "run_command",
               "input": {"command": format!("echo typed {ANTHROPIC_KEY}")}}),
        json!({"id": "cat", "name": "run_command", "input": {"command": "cat key.txt"}}),
        json!({"id": "read", "name": "read_file", "input": {"path": "key.txt"}}),
    ];
    let stdin: String = requests.iter().map(|r| format!("{r}\n")).collect();
    let cmd = taskdaemon(
        tmp.path(),
        &[
            "tool",
            "exec",
            "--worktree",
            worktree.to_str().unwrap(),
            "--receipts",
            receipts.to_str().unwrap(),
        ],
        &[("ANTHROPIC_API_KEY", ANTHROPIC_KEY)],
    );
    let out = run_with_input(cmd, &stdin);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");

    assert!(!stdout.contains(ANTHROPIC_KEY), "{stdout}");
    assert!(!stderr.contains(ANTHROPIC_KEY), "{stderr}");
    let answers: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 3, "{stdout}");
    for answer in &answers {
        assert_eq!(answer["is_error"], false, "{answer}");
        let content = answer["content"].as_str().unwrap();
        assert!(
            content.contains("[REDACTED:ANTHROPIC_API_KEY]"),
            "{}: {content}",
            answer["id"]
        );
    }
    assert!(
        answers[0]["content"]
            .as_str()
            .unwrap()
            .contains("typed [REDACTED:ANTHROPIC_API_KEY]")
    );

    // The receipts record the redacted command line and output hashes.
    let log = std::fs::read_to_string(&receipts).unwrap();
    assert_eq!(log.lines().count(), 3, "{log}");
    assert!(!log.contains(ANTHROPIC_KEY), "{log}");
    assert!(
        log.contains("echo typed [REDACTED:ANTHROPIC_API_KEY]"),
        "{log}"
    );

    // Replaying the log (which redacts alike) finds the same outputs.
    let replay = taskdaemon(
        tmp.path(),
        &[
            "replay",
            "verify",
            receipts.to_str().unwrap(),
            "--worktree",
            before.to_str().unwrap(),
        ],
        &[("ANTHROPIC_API_KEY", ANTHROPIC_KEY)],
    )
    .output()
    .unwrap();
    let report = text(&replay.stdout);
    assert!(
        replay.status.success(),
        "{report}\n{}",
        text(&replay.stderr)
    );
    assert!(report.contains("3 identical"), "{report}");
    assert!(!report.contains(ANTHROPIC_KEY), "{report}");
}

// ---------------------------------------------------------------------------------------
// (ii) a scripted run

const OPENAI_KEY: &str = "sk-proj-test-9d2c7a14e6b05f83";

/// A project at `<tmp>/repo` (with `secret.txt` holding the key committed) and a config in
/// `<tmp>/config` whose scripted loop prints the key, writes it, says it and completes with it.
fn leaky_project(tmp: &Path) -> PathBuf {
    init_repo(
        &tmp.join("repo"),
        &[
            ("README.md", "a project\n"),
            ("secret.txt", &format!("{OPENAI_KEY}\n")),
        ],
    );
    let config_dir = tmp.join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(
        config_dir.join("script.yml"),
        format!(
            r#"
leaky:
  turns:
    - say: "The key is {OPENAI_KEY}, I will print it."
      calls:
        - run_command: {{command: "echo literal {OPENAI_KEY}; cat secret.txt; echo env $OPENAI_API_KEY"}}
        - write_file: {{path: notes.txt, content: "noted {OPENAI_KEY}\n"}}
        - read_file: {{path: notes.txt}}
        - complete_task: {{summary: "finished with {OPENAI_KEY}"}}
"#
        ),
    )
    .unwrap();
    let config = config_dir.join("taskdaemon.yml");
    std::fs::write(
        &config,
        r#"
repo: ../repo
llm: {provider: scripted, script: script.yml}
loops:
  - name: leaky
    type: code
    task: Print the key.
    validation: "true"
"#,
    )
    .unwrap();
    config
}

#[test]
fn a_run_whose_loop_meets_a_key_leaves_no_trace_of_it_in_its_record() {
    let tmp = tempfile::tempdir().unwrap();
    let config = leaky_project(tmp.path());
    let run_dir = tmp.path().join("run");
    let out = taskdaemon(
        tmp.path(),
        &[
            "run",
            "-c",
            config.to_str().unwrap(),
            "--run-dir",
            run_dir.to_str().unwrap(),
        ],
        &[("OPENAI_API_KEY", OPENAI_KEY)],
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");

    let leaks = files_containing(&run_dir, OPENAI_KEY);
    assert!(
        leaks.is_empty(),
        "the key is in {leaks:?} (of {} files)",
        file_count(&run_dir)
    );
    assert!(!stdout.contains(OPENAI_KEY), "{stdout}");
    assert!(!stderr.contains(OPENAI_KEY), "{stderr}");

    let marker = "[REDACTED:OPENAI_API_KEY]";
    let transcript = std::fs::read_to_string(run_dir.join("loops/leaky/transcript.jsonl")).unwrap();
    let entries: Vec<Value> = transcript
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The model's own words.
    let said = entries
        .iter()
        .find(|e| e["entry"] == "response")
        .and_then(|e| e["response"]["text"].as_str())
        .unwrap();
    assert_eq!(said, format!("The key is {marker}, I will print it."));
    // The command's output: typed, read from a file (and from the environment, when the
    // command still gets it).
    let command_result = entries
        .iter()
        .find(|e| e["entry"] == "tool_result" && e["name"] == "run_command")
        .and_then(|e| e["content"].as_str())
        .unwrap();
    assert!(
        command_result.contains(&format!("literal {marker}\n{marker}\n")),
        "{command_result}"
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(
        summary["loops"]["leaky"]["summary"],
        format!("finished with {marker}")
    );
}

// ---------------------------------------------------------------------------------------
// (iii) a provider that echoes the key in its error

/// A one-thread HTTP/1.1 server on 127.0.0.1 that answers every request 401 with an
/// OpenAI-style error quoting the bearer token it was sent, and keeps the tokens.
struct EchoingServer(common::LocalServer<String>);

impl EchoingServer {
    fn start() -> EchoingServer {
        EchoingServer(common::LocalServer::start(answer_401))
    }

    fn base_url(&self) -> String {
        self.0.base_url()
    }

    fn tokens(&self) -> Vec<String> {
        self.0.seen()
    }
}

/// Reads one request and answers 401 quoting its bearer token; returns the token.
fn answer_401(stream: TcpStream) -> Option<String> {
    let request = answer_once(stream, |request| {
        let token = bearer(request);
        let reply = json!({"error": {
            "message": format!("Incorrect API key provided: {token}. You can find your API key at https://example.invalid."),
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }});
        (401, reply.to_string())
    })?;
    Some(bearer(&request))
}

/// The bearer token a request was sent with (empty when none).
fn bearer(request: &HttpRequest) -> String {
    request
        .header("authorization")
        .unwrap_or_default()
        .trim_start_matches("Bearer ")
        .to_string()
}

/// Where the run's key comes from.
enum KeyFrom {
    /// `api-key-env` naming a variable whose name does not look secret.
    Env,
    /// `api-key-file`.
    File,
}

const PROVIDER_KEY: &str = "sk-echoed-test-51f0c9e2a7b4d863";

/// Runs one loop against [`EchoingServer`] with its key from `from`; checks that the key was
/// sent and echoed, and that neither the run directory nor the output holds it.
fn provider_echo_is_redacted(from: KeyFrom) {
    let server = EchoingServer::start();
    let tmp = tempfile::tempdir().unwrap();
    init_repo(&tmp.path().join("repo"), &[("README.md", "a project\n")]);
    let config_dir = tmp.path().join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    let (key_line, env, marker): (&str, Vec<(&str, &str)>, &str) = match from {
        KeyFrom::Env => (
            "api-key-env: TD_TEST_LLM_ACCESS",
            vec![("TD_TEST_LLM_ACCESS", PROVIDER_KEY)],
            "[REDACTED:TD_TEST_LLM_ACCESS]",
        ),
        KeyFrom::File => {
            std::fs::write(config_dir.join("llm.key"), format!("{PROVIDER_KEY}\n")).unwrap();
            (
                "api-key-file: llm.key",
                Vec::new(),
                "[REDACTED:api-key-file]",
            )
        }
    };
    let config = config_dir.join("taskdaemon.yml");
    std::fs::write(
        &config,
        format!(
            r#"
repo: ../repo
llm:
  provider: openai
  base-url: "{}"
  model: x
  {key_line}
  max-retries: 0
  timeout-ms: 20000
loops:
  - name: solo
    type: code
    task: Say hello.
    validation: "true"
"#,
            server.base_url()
        ),
    )
    .unwrap();
    let run_dir = tmp.path().join("run");
    let out = taskdaemon(
        tmp.path(),
        &[
            "run",
            "-c",
            config.to_str().unwrap(),
            "--run-dir",
            run_dir.to_str().unwrap(),
        ],
        &env,
    )
    .env("TASKDAEMON_LOG", "debug")
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert_eq!(server.tokens(), [PROVIDER_KEY], "the key was sent once");

    let leaks = files_containing(&run_dir, PROVIDER_KEY);
    assert!(
        leaks.is_empty(),
        "the key is in {leaks:?} (of {} files)",
        file_count(&run_dir)
    );
    assert!(!stdout.contains(PROVIDER_KEY), "{stdout}");
    assert!(!stderr.contains(PROVIDER_KEY), "{stderr}");

    // The error itself is recorded, with the marker where the key was.
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
            .unwrap();
    let reason = summary["loops"]["solo"]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("Incorrect API key provided: {marker}")),
        "{reason}"
    );
    assert!(stdout.contains(marker), "{stdout}");
}

#[test]
fn a_provider_error_echoing_a_key_from_a_variable_is_redacted_everywhere() {
    provider_echo_is_redacted(KeyFrom::Env);
}

#[test]
fn a_provider_error_echoing_a_key_from_a_file_is_redacted_everywhere() {
    provider_echo_is_redacted(KeyFrom::File);
}

#[test]
fn the_working_directory_is_not_taken_for_a_secret() {
    // `PWD` ends like `DB_PWD`; taken for a secret it would redact every path under the
    // directory the daemon was started in, and be withheld from commands.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().canonicalize().unwrap();
    let wt = dir.join("worktree-of-a-project");
    std::fs::create_dir_all(&wt).unwrap();
    let wt_text = wt.display().to_string();
    let cmd = taskdaemon(
        &wt,
        &["tool", "exec", "--worktree", "."],
        &[("PWD", wt_text.as_str())],
    );
    let line =
        json!({"id": "1", "name": "run_command", "input": {"command": "pwd; echo \"$PWD\""}});
    let out = run_with_input(cmd, &format!("{line}\n"));
    let answer: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    let content = answer["content"].as_str().unwrap();
    assert!(!content.contains("REDACTED"), "{content}");
    assert_eq!(content.matches(&wt_text).count(), 2, "{content}");
}
