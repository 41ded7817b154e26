//! The `taskdaemon tool exec` contract, driven through the real binary: one ToolContext for
//! the whole stream, one flushed answer per line before the next line is read, read tracking
//! active across calls, receipts that `replay verify` can re-run, and `web_fetch` confined to
//! the public internet unless `-c FILE` allows more.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

mod common;
use common::http_once::LocalPage;
use common::tool_exec::Exec;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

#[test]
fn one_context_for_the_stream_and_changes_between_calls_are_seen() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "alpha\nbeta\n").unwrap();
    let mut exec = Exec::start(dir.path());

    let edit = json!({"path": "a.txt", "old_string": "beta", "new_string": "gamma"});
    let r = exec.answer("1", "edit_file", edit.clone());
    assert_eq!(
        r["is_error"], true,
        "edit without read must be refused: {r}"
    );
    assert!(r["content"].as_str().unwrap().contains("read_file"));

    let r = exec.answer("2", "read_file", json!({"path": "a.txt"}));
    assert_eq!(r["is_error"], false, "{r}");
    assert!(r["content"].as_str().unwrap().contains("beta"));

    // The caller changes the file between two calls: the stamp from call 2 is now stale.
    std::fs::write(dir.path().join("a.txt"), "alpha\nbeta\nchanged\n").unwrap();
    let r = exec.answer("3", "edit_file", edit.clone());
    assert_eq!(r["is_error"], true, "{r}");
    assert!(
        r["content"].as_str().unwrap().contains("changed on disk"),
        "{r}"
    );

    let r = exec.answer("4", "read_file", json!({"path": "a.txt"}));
    assert_eq!(r["is_error"], false);
    let r = exec.answer("5", "edit_file", edit);
    assert_eq!(r["is_error"], false, "{r}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "alpha\ngamma\nchanged\n"
    );

    // The loop's own write refreshes the stamp: an edit right after it works.
    let r = exec.answer(
        "6",
        "write_file",
        json!({"path": "b.txt", "content": "one\n"}),
    );
    assert_eq!(r["is_error"], false, "{r}");
    let r = exec.answer(
        "7",
        "edit_file",
        json!({"path": "b.txt", "old_string": "one", "new_string": "two"}),
    );
    assert_eq!(r["is_error"], false, "{r}");
    assert!(exec.finish().success());
}

#[test]
fn tools_flag_restricts_the_set_and_refuses_unknown_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut exec = Exec::start_with(dir.path(), &["--tools", "read_file,glob"]);
    let r = exec.answer("1", "write_file", json!({"path": "x", "content": "y"}));
    assert_eq!(r["is_error"], true);
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains("unknown tool 'write_file'")
    );
    assert!(!dir.path().join("x").exists());
    assert!(exec.finish().success());

    let out = Command::new(bin())
        .args([
            "tool",
            "exec",
            "--tools",
            "read_file,raed_file",
            "--worktree",
        ])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown tool 'raed_file'"), "{err}");
}

#[test]
fn missing_worktree_is_a_clear_startup_error() {
    let out = Command::new(bin())
        .args(["tool", "exec", "--worktree", "/no/such/dir"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/dir"));
}

#[test]
fn config_overrides_reach_the_calls() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("td.yml");
    std::fs::write(&cfg, "catalog:\n  read_file:\n    max-output-bytes: 200\n").unwrap();
    let wt = dir.path().join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    std::fs::write(wt.join("big.txt"), "line of text\n".repeat(1000)).unwrap();
    let mut exec = Exec::start_with(&wt, &["-c", cfg.to_str().unwrap()]);
    let r = exec.answer("1", "read_file", json!({"path": "big.txt"}));
    assert!(r["content"].as_str().unwrap().len() < 400, "{r}");
    assert!(exec.finish().success());

    std::fs::write(&cfg, "catalog:\n  read_file:\n    max-output-byte: 200\n").unwrap();
    let out = Command::new(bin())
        .args(["tool", "exec", "-c", cfg.to_str().unwrap(), "--worktree"])
        .arg(&wt)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":3:") && err.contains("did you mean `max-output-bytes`"),
        "{err}"
    );
}

#[test]
fn receipts_replay_identically_and_divergence_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let pristine = dir.path().join("pristine");
    let wt = dir.path().join("wt");
    for d in [&pristine, &wt] {
        std::fs::create_dir_all(d.join("src")).unwrap();
        std::fs::write(d.join("src/lib.rs"), "pub fn a() -> u32 { 1 }\n").unwrap();
    }
    let log = dir.path().join("receipts.jsonl");
    let mut exec = Exec::start_with(&wt, &["--receipts", log.to_str().unwrap()]);
    exec.answer("1", "read_file", json!({"path": "src/lib.rs"}));
    exec.answer(
        "2",
        "edit_file",
        json!({"path": "src/lib.rs", "old_string": "1 }", "new_string": "2 }"}),
    );
    exec.answer(
        "3",
        "write_file",
        json!({"path": "notes.md", "content": "# n\n"}),
    );
    exec.answer("4", "grep", json!({"pattern": "fn a"}));
    exec.answer(
        "5",
        "run_command",
        json!({"command": "cat notes.md src/lib.rs"}),
    );
    exec.answer("6", "read_file", json!({"path": "missing.txt"}));
    assert!(exec.finish().success());

    let lines = std::fs::read_to_string(&log).unwrap();
    let receipts: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(receipts.len(), 6);
    let write = &receipts[2];
    assert_eq!(write["tool"], "write_file");
    assert_eq!(write["side_effects"][0]["kind"], "file_written");
    assert_eq!(write["side_effects"][0]["path"], "notes.md");
    assert_eq!(receipts[4]["side_effects"][0]["kind"], "command_run");
    assert_eq!(receipts[4]["side_effects"][0]["exit_code"], 0);
    for r in &receipts {
        assert!(r["input_hash"].as_str().unwrap().starts_with("sha256:"));
        assert!(r["output_hash"].as_str().unwrap().starts_with("sha256:"));
        assert_eq!(r["exec_id"], "exec");
    }

    let verify = |worktree: &Path| {
        Command::new(bin())
            .args(["replay", "verify"])
            .arg(&log)
            .arg("--worktree")
            .arg(worktree)
            .output()
            .unwrap()
    };
    let out = verify(&pristine);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("6 identical, 0 differ"), "{text}");
    // Replay worked on a copy: the pristine tree is unchanged.
    assert_eq!(
        std::fs::read_to_string(pristine.join("src/lib.rs")).unwrap(),
        "pub fn a() -> u32 { 1 }\n"
    );
    assert!(!pristine.join("notes.md").exists());

    // A different starting tree makes the outputs differ, and each difference is named.
    std::fs::write(
        pristine.join("src/lib.rs"),
        "pub fn a() -> u32 { 1 } // x\n",
    )
    .unwrap();
    let out = verify(&pristine);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("DIFFERS #1 read_file"), "{text}");
}

/// Fetches each URL in one `tool exec` stream started with `extra`; returns each answer's
/// error flag and content.
fn fetch_all(worktree: &Path, extra: &[&str], urls: &[String]) -> Vec<(bool, String)> {
    let mut args = vec!["--tools", "web_fetch"];
    args.extend_from_slice(extra);
    let mut exec = Exec::start_with(worktree, &args);
    let answers = urls
        .iter()
        .enumerate()
        .map(|(i, url)| {
            let r = exec.answer(&i.to_string(), "web_fetch", json!({ "url": url }));
            let content = r["content"].as_str().unwrap().to_string();
            (r["is_error"].as_bool().unwrap(), content)
        })
        .collect();
    assert!(exec.finish().success());
    answers
}

#[test]
fn web_fetch_reaches_local_addresses_only_when_the_config_allows_them() {
    let dir = tempfile::tempdir().unwrap();
    let wt = dir.path().join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let local = LocalPage::start("hello from a local service");
    let by_address = format!("http://127.0.0.1:{}/", local.port);
    let by_name = format!("http://localhost:{}/", local.port);
    let urls = [by_address.clone(), by_name.clone()];

    // By default both are refused, before anything is sent.
    let answers = fetch_all(&wt, &[], &urls);
    for (is_error, content) in &answers {
        assert!(is_error, "{content}");
        assert!(
            content.starts_with("web_fetch refuses private and loopback addresses: "),
            "{content}"
        );
        assert!(content.contains("127.0.0.1 (loopback)"), "{content}");
        assert!(
            content.contains("`web: {allow-private: true}`"),
            "{content}"
        );
    }
    assert!(answers[1].1.contains("localhost resolves only to"));
    assert_eq!(local.hits(), 0);

    // `allow-private: true` allows both.
    let cfg = dir.path().join("td.yml");
    std::fs::write(&cfg, "web:\n  allow-private: true\n").unwrap();
    for (is_error, content) in fetch_all(&wt, &["-c", cfg.to_str().unwrap()], &urls) {
        assert!(!is_error, "{content}");
        assert!(content.contains("hello from a local service"), "{content}");
    }
    assert_eq!(local.hits(), 2);

    // A host list allows exactly its hosts: the name, not the address it resolves to.
    std::fs::write(&cfg, "web:\n  allow-private: [localhost]\n").unwrap();
    let answers = fetch_all(&wt, &["-c", cfg.to_str().unwrap()], &urls);
    assert!(answers[0].0, "{}", answers[0].1);
    assert!(
        answers[0].1.contains("127.0.0.1 (loopback)"),
        "{}",
        answers[0].1
    );
    assert!(!answers[1].0, "{}", answers[1].1);
    assert!(answers[1].1.contains("hello from a local service"));
    assert_eq!(local.hits(), 3);

    // A bad entry stops the start with its line and column.
    std::fs::write(&cfg, "web:\n  allow-private:\n    - localhost:8080\n").unwrap();
    let out = Command::new(bin())
        .args(["tool", "exec", "-c", cfg.to_str().unwrap(), "--worktree"])
        .arg(&wt)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":3:7: web.allow-private[0]: `localhost:8080` is not a host name"),
        "{err}"
    );
}

#[test]
fn web_fetch_ignores_proxies_from_the_environment_unless_everything_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let wt = dir.path().join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let proxy = LocalPage::start("answered by the proxy");
    let cfg = dir.path().join("td.yml");
    let with_proxy = |config: &str| {
        // A short timeout: without a proxy the name below cannot be resolved anyway.
        std::fs::write(
            &cfg,
            format!("catalog:\n  web_fetch: {{timeout-ms: 5000}}\n{config}"),
        )
        .unwrap();
        let mut command = Exec::command(&wt);
        command.args(["--tools", "web_fetch", "-c", cfg.to_str().unwrap()]);
        let proxy_url = format!("http://127.0.0.1:{}", proxy.port);
        for var in ["NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"] {
            command.env_remove(var);
        }
        command
            .env("HTTP_PROXY", &proxy_url)
            .env("http_proxy", &proxy_url);
        let mut exec = Exec::spawn(&mut command);
        let r = exec.answer(
            "1",
            "web_fetch",
            json!({"url": "http://public.example.invalid/"}),
        );
        assert!(exec.finish().success());
        r
    };

    // The guard is on (the default, or a host list): the proxy is never asked, because it
    // would resolve and connect where no check of ours could see.
    for config in ["", "web: {allow-private: [localhost]}\n"] {
        let r = with_proxy(config);
        assert_eq!(r["is_error"], true, "{r}");
        assert!(
            !r["content"]
                .as_str()
                .unwrap()
                .contains("answered by the proxy"),
            "{r}"
        );
    }
    assert_eq!(proxy.hits(), 0);

    // With every address allowed there is nothing to sidestep: the proxy is used as before.
    let r = with_proxy("web: {allow-private: true}\n");
    assert_eq!(r["is_error"], false, "{r}");
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains("answered by the proxy"),
        "{r}"
    );
    assert_eq!(proxy.hits(), 1);
}
