//! Command confinement, attacked through the real binary (`tool exec` and `taskdaemon run`):
//! writes outside the worktree, other loops' worktrees and git metadata; secrets in the
//! environment and in the daemon's /proc; the network and host sockets from the no-net lane;
//! processes that try to outlive their command or the daemon.
//!
//! Each test first checks that the machine gives commands every protection (the probe the
//! launcher uses); where it does not, it says so and checks that the gap is reported.

use std::net::TcpListener;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

mod common;
use common::tool_exec::Exec;
use common::{fully_confined, wait_until};

/// How long the tests wait for processes to start or die.
const WAIT: Duration = Duration::from_secs(10);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

/// A marker no other test's processes carry (a `sleep` argument that sleeps long).
fn marker(tag: u32) -> String {
    format!("{}{:03}.{}", 9000 + tag, std::process::id() % 1000, tag)
}

/// Three ways out of a process group: `setsid`, a double fork, `setpgid(0, 0)`.
fn escapes(marker: &str) -> String {
    format!(
        "setsid sleep {marker} & (sleep {marker} &); \
         perl -e 'setpgrp(0,0); exec \"sleep\", \"{marker}\"' & sleep 0.3; echo started"
    )
}

#[test]
fn commands_write_only_in_their_worktree_in_every_lane_and_through_a_makefile() {
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let wt = tmp.path().join("wt");
    let sibling = tmp.path().join("other-loop");
    let outside = tmp.path().join("outside");
    for d in [&wt, &sibling, &outside] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(
        wt.join("Makefile"),
        format!(
            "all:\n\tcp /etc/hostname {o}/from-make\n",
            o = outside.display()
        ),
    )
    .unwrap();
    let validate = format!("touch {}/from-validate", outside.display());
    let mut exec = Exec::start_with(&wt, &["--build-cmd", "make", "--validate-cmd", &validate]);
    for tool in ["run_command", "run_command_isolated"] {
        let out = exec.sh(
            tool,
            &format!(
                "echo x > {o}/{tool} || echo refused; echo y > {s}/{tool} || echo refused; echo ok > in-{tool}",
                o = outside.display(),
                s = sibling.display()
            ),
        );
        assert!(out.contains("refused\nrefused"), "{tool}: {out}");
        assert!(wt.join(format!("in-{tool}")).exists(), "{tool}: {out}");
    }
    let build = exec.request("build", json!({}));
    assert_eq!(build["is_error"], true, "{build}");
    let validate = exec.request("validate", json!({}));
    assert_eq!(validate["is_error"], true, "{validate}");
    exec.finish_ok();
    let leaked: Vec<_> = std::fs::read_dir(&outside).unwrap().flatten().collect();
    assert!(leaked.is_empty(), "written outside: {leaked:?}");
    assert_eq!(std::fs::read_dir(&sibling).unwrap().count(), 0);
}

#[test]
fn commands_get_no_secrets_and_cannot_read_the_daemons_environment() {
    if !fully_confined() {
        return;
    }
    let wt = tempfile::tempdir().unwrap();
    let keys = [
        ("ANTHROPIC_API_KEY", "sk-ant-confinement-test-0001"),
        ("OPENAI_API_KEY", "sk-openai-confinement-test-0002"),
        ("BRAVE_SEARCH_API_KEY", "brave-confinement-test-0003"),
        ("GH_TOKEN", "ghp_confinementtest0004"),
        ("AWS_SECRET_ACCESS_KEY", "aws-confinement-test-0005"),
        ("INNOCENT_LOOKING", "sk-ant-confinement-test-0001"),
    ];
    let mut exec = Exec::spawn(Exec::command(wt.path()).envs(keys));
    let daemon = exec.child.id();
    let env = exec.sh("run_command", "env");
    for (name, value) in keys {
        assert!(!env.contains(name), "{name} reached the command: {env}");
        assert!(
            !env.contains(value),
            "the value of {name} reached the command"
        );
    }
    assert!(env.contains("TMPDIR="), "{env}");
    for tool in ["run_command", "run_command_isolated"] {
        let out = exec.sh(
            tool,
            &format!(
                "cat /proc/{daemon}/environ || echo unreadable; \
                 tr '\\0' '\\n' < /proc/1/environ | grep -c _KEY || true"
            ),
        );
        assert!(out.contains("unreadable"), "{tool}: {out}");
        for (_, value) in keys {
            assert!(!out.contains(value), "{tool}: {out}");
        }
    }
    exec.finish_ok();
}

#[test]
fn the_no_net_lane_reaches_no_listener_no_host_socket_and_cannot_nsenter() {
    if !fully_confined() {
        return;
    }
    let wt = tempfile::tempdir().unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("host.sock");
    let _unix = UnixListener::bind(&path).unwrap();
    let abstract_name = format!("taskdaemon-test-{}", std::process::id());
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
    let _abstract = UnixListener::bind_addr(&addr).unwrap();
    let probe = format!(
        r#"python3 - <<'EOF'
import socket
def attempt(what, family, address):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(address)
        print(what, "reached")
    except OSError as e:
        print(what, "refused")
for what, family, address in [
    ("tcp", socket.AF_INET, ("127.0.0.1", {port})),
    ("unix", socket.AF_UNIX, "{path}"),
    ("abstract", socket.AF_UNIX, "\0{abstract_name}"),
]:
    try:
        attempt(what, family, address)
    except OSError:
        print(what, "refused")
EOF"#,
        path = path.display()
    );
    let mut exec = Exec::start(wt.path());
    let daemon = exec.child.id();
    let isolated = exec.sh("run_command_isolated", &probe);
    for what in ["tcp", "unix", "abstract"] {
        assert!(
            isolated.contains(&format!("{what} refused")),
            "{what}: {isolated}"
        );
    }
    // The same probe in the net lane reaches the listener, so the refusal above is the
    // lane's doing, not a broken probe.
    let net = exec.sh("run_command", &probe);
    assert!(net.contains("tcp reached"), "{net}");
    let nsenter = exec.sh(
        "run_command_isolated",
        &format!(
            "nsenter --net=/proc/{daemon}/ns/net true && echo escaped || echo refused; \
             nsenter --net=/proc/1/ns/net true && echo escaped || echo refused"
        ),
    );
    assert!(!nsenter.contains("escaped"), "{nsenter}");
    exec.finish_ok();
}

#[test]
fn processes_that_leave_their_group_are_gone_after_exit_and_after_a_timeout() {
    if !fully_confined() {
        return;
    }
    let wt = tempfile::tempdir().unwrap();
    let mut exec = Exec::start(wt.path());
    let normal = marker(1);
    let out = exec.sh("run_command", &escapes(&normal));
    assert!(out.contains("started"), "{out}");
    wait_until("escapees of a finished command to die", WAIT, || {
        common::pids_with(&normal).is_empty()
    });
    let timed = marker(2);
    let v = exec.request(
        "run_command",
        json!({"command": format!("{}; sleep 60", escapes(&timed)), "timeout_ms": 1500}),
    );
    assert!(
        v["content"].as_str().unwrap().starts_with("timed out"),
        "{v}"
    );
    wait_until("escapees of a timed-out command to die", WAIT, || {
        common::pids_with(&timed).is_empty()
    });
    exec.finish_ok();
}

/// A config and script for `taskdaemon run` in `dir`, on a fresh repository `dir/repo`.
fn write_run(dir: &Path, config_tail: &str, script: &str) -> PathBuf {
    common::init_repo(&dir.join("repo"), &[("README.md", "test\n")]);
    std::fs::write(dir.join("script.yml"), script).unwrap();
    let config = dir.join("taskdaemon.yml");
    std::fs::write(
        &config,
        format!("repo: repo\nllm: {{provider: scripted, script: script.yml}}\n{config_tail}"),
    )
    .unwrap();
    config
}

/// The run directory of the one run made beside `config_dir`'s taskdaemon.yml.
fn only_run(config_dir: &Path) -> PathBuf {
    let runs = config_dir.join(".taskdaemon/runs");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.remove(0)
}

fn run_command(config: &Path) -> Command {
    let mut command = Command::new(bin());
    command
        .arg("run")
        .arg("-c")
        .arg(config)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@localhost")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@localhost")
        .stdin(Stdio::null());
    command
}

#[test]
fn sigkill_of_the_daemon_leaves_no_command_running() {
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = marker(3);
    let command = json!(format!("{}; sleep {m}", escapes(&m))).to_string();
    let script =
        format!("a:\n  turns:\n    - calls:\n        - run_command: {{command: {command}}}\n");
    let config = write_run(
        tmp.path(),
        "loops:\n  - {name: a, type: code, task: wait}\n",
        &script,
    );
    let mut child = run_command(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the command's processes to start", WAIT, || {
        common::pids_with(&m).len() >= 4
    });
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until(
        "every process of the command to die with the daemon",
        WAIT,
        || common::pids_with(&m).is_empty(),
    );
}

#[test]
fn a_loop_cannot_move_another_loops_branch_or_the_users_checkout() {
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let attack = "git -c user.name=x -c user.email=x@x commit --allow-empty -qm evil 2>&1; \
                  git update-ref refs/heads/main HEAD 2>&1; \
                  git branch -f main 2>&1; \
                  echo evil > ../b/planted 2>&1; \
                  echo evil > $(git rev-parse --git-common-dir)/hooks/pre-commit 2>&1; \
                  echo 'gitdir: /tmp' > .git 2>&1; \
                  echo '{}' >> ../../events.jsonl 2>&1; \
                  true";
    let attack = json!(attack).to_string();
    let script = format!(
        "a:\n  turns:\n    - calls:\n        - run_command: {{command: {attack}}}\n        - write_file: {{path: a.txt, content: a}}\n        - complete_task: {{summary: done}}\nb:\n  turns:\n    - calls:\n        - write_file: {{path: b.txt, content: b}}\n        - complete_task: {{summary: done}}\n"
    );
    let config = write_run(
        tmp.path(),
        "keep-worktrees: true\nloops:\n  - {name: a, type: code, task: attack, validation: 'touch ../../../../../outside-by-validation; true'}\n  - {name: b, type: code, task: work}\n",
        &script,
    );
    let repo = tmp.path().join("repo");
    let main_before = common::git(&repo, &["rev-parse", "main"]);
    let out = run_command(&config).output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The attack ran and was refused (not skipped): its output is in a's transcript.
    let run = only_run(tmp.path());
    let transcript = std::fs::read_to_string(run.join("loops/a/transcript.jsonl")).unwrap();
    for refusal in ["Permission denied", "Read-only file system"] {
        assert!(transcript.contains(refusal), "{refusal}: {transcript}");
    }
    assert_eq!(common::git(&repo, &["rev-parse", "main"]), main_before);
    // The loop's validation command is confined like its tools.
    assert!(!tmp.path().join("outside-by-validation").exists());
    // The run record is not the loop's to write either.
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    assert!(events.lines().all(|l| l != "{}"), "{events}");
    assert!(!repo.join(".git/hooks/pre-commit").exists());
    let branches = common::git(&repo, &["branch", "--list", "taskdaemon/*"]);
    for name in ["a", "b"] {
        let branch = branches
            .lines()
            .map(|l| l.trim_start_matches(['*', '+', ' ']))
            .find(|l| l.ends_with(&format!("/{name}")))
            .unwrap_or_else(|| panic!("no branch for {name}: {branches}"))
            .to_string();
        let log = common::git(&repo, &["log", "--format=%s", &format!("main..{branch}")]);
        assert!(!log.contains("evil"), "{name}: {log}");
        let files = common::git(&repo, &["ls-tree", "-r", "--name-only", &branch]);
        assert!(!files.contains("planted"), "{name}: {files}");
    }
}

#[test]
fn ordinary_work_still_works_a_rust_crate_with_a_dependency_and_python_tests() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    common::init_repo(
        &repo,
        &[
            (
                "Cargo.toml",
                "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nitoa = \"1\"\n",
            ),
            ("README.md", "tiny\n"),
        ],
    );
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(
        repo.join("src/lib.rs"),
        "pub fn show(n: u32) -> String { itoa::Buffer::new().format(n).to_string() }\n",
    )
    .unwrap();
    common::git(&repo, &["add", "-A"]);
    common::git(&repo, &["commit", "-qm", "lib"]);
    let rust_test = json!("#[test]\nfn shows() { assert_eq!(tiny::show(42), \"42\"); }\n");
    let py_test = json!(
        "import unittest\n\nclass T(unittest.TestCase):\n    def test_sum(self):\n        self.assertEqual(sum([1, 2]), 3)\n"
    );
    let script = format!(
        "rust:\n  turns:\n    - calls:\n        - write_file: {{path: tests/it.rs, content: {rust_test}}}\n        - test: {{}}\n        - complete_task: {{summary: tested}}\npy:\n  turns:\n    - calls:\n        - write_file: {{path: test_sum.py, content: {py_test}}}\n        - complete_task: {{summary: tested}}\n"
    );
    std::fs::write(tmp.path().join("script.yml"), script).unwrap();
    let config = tmp.path().join("taskdaemon.yml");
    std::fs::write(
        &config,
        "repo: repo\nllm: {provider: scripted, script: script.yml}\n\
         sandbox: {writable: [~/.cargo/registry, ~/.cargo/git]}\n\
         loop-types:\n  rust: {extends: code, test: cargo test --offline, max-iterations: 1}\n\
         loops:\n\
         \x20 - {name: rust, type: rust, task: test it, validation: cargo test --offline}\n\
         \x20 - {name: py, type: code, task: test it, validation: python3 -m unittest -q}\n",
    )
    .unwrap();
    let out = run_command(&config)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = only_run(tmp.path());
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    for name in ["rust", "py"] {
        let l = &summary["loops"][name];
        assert_eq!(l["status"], "completed", "{name}: {l}");
    }
    if fully_confined() {
        assert_eq!(summary["sandbox"]["missing"], json!([]), "{summary}");
    }
}

#[test]
fn the_models_key_file_and_hidden_paths_read_as_empty() {
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let wt = tmp.path().join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    std::fs::write(tmp.path().join("key.txt"), "sk-hidden-key-file-0006\n").unwrap();
    std::fs::create_dir_all(tmp.path().join("creds")).unwrap();
    std::fs::write(tmp.path().join("creds/token"), "token-in-a-hidden-dir\n").unwrap();
    let config = tmp.path().join("taskdaemon.yml");
    std::fs::write(
        &config,
        "llm: {provider: openai, base-url: 'http://127.0.0.1:9/v1', model: m, api-key-file: key.txt}\n\
         sandbox: {hide: [creds]}\n",
    )
    .unwrap();
    let mut exec = Exec::start_with(&wt, &["-c", config.to_str().unwrap()]);
    let out = exec.sh(
        "run_command",
        &format!(
            "echo \"key:[$(cat {t}/key.txt)]\"; ls {t}/creds | wc -l; cat {t}/creds/token || echo no-token",
            t = tmp.path().display()
        ),
    );
    assert!(out.contains("key:[]"), "{out}");
    assert!(
        !out.contains("sk-hidden") && !out.contains("token-in-a"),
        "{out}"
    );
    assert!(out.contains("no-token"), "{out}");
    exec.finish_ok();
    // Hidden for commands only: the files are untouched.
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("key.txt")).unwrap(),
        "sk-hidden-key-file-0006\n"
    );
}

#[test]
fn strict_reads_limit_reading_and_commands_cannot_trace_or_signal_out() {
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let wt = tmp.path().join("wt");
    let data = tmp.path().join("data");
    let private = tmp.path().join("private");
    for d in [&wt, &data, &private] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(data.join("fixture.txt"), "fixture\n").unwrap();
    std::fs::write(private.join("notes.txt"), "private\n").unwrap();
    std::fs::write(wt.join("own.txt"), "own\n").unwrap();
    let config = tmp.path().join("taskdaemon.yml");
    std::fs::write(&config, "sandbox: {read: strict, readable: [data]}\n").unwrap();
    let mut exec = Exec::start_with(&wt, &["-c", config.to_str().unwrap()]);
    let out = exec.sh(
        "run_command",
        &format!(
            "cat own.txt {d}/fixture.txt; cat {p}/notes.txt || echo private-refused; \
             ls / >/dev/null 2>&1 || echo root-listing-refused; head -c 3 /etc/hostname >/dev/null && echo etc-ok",
            d = data.display(),
            p = private.display()
        ),
    );
    assert!(out.contains("own\nfixture\n"), "{out}");
    assert!(
        out.contains("private-refused") && !out.contains("private\n"),
        "{out}"
    );
    assert!(out.contains("root-listing-refused"), "{out}");
    assert!(out.contains("etc-ok"), "{out}");
    exec.finish_ok();

    // Default reads: everywhere; but no tracing or signalling outside the command's tree.
    let mut exec = Exec::start(&wt);
    let daemon = exec.child.id();
    let out = exec.sh(
        "run_command",
        &format!(
            "cat {p}/notes.txt; \
             python3 -c 'import ctypes; print(\"ptrace\", ctypes.CDLL(None).ptrace(16, 1, 0, 0))'; \
             kill -0 {daemon} 2>/dev/null && echo signalled-daemon || echo no-daemon",
            p = private.display()
        ),
    );
    assert!(out.contains("private\n"), "{out}");
    assert!(out.contains("ptrace -1"), "{out}");
    assert!(out.contains("no-daemon"), "{out}");
    exec.finish_ok();
}

#[test]
fn file_tools_cannot_write_git_metadata_or_the_daemons_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let wt = tmp.path().join("wt");
    common::init_repo(&wt, &[("README.md", "readme\n")]);
    std::fs::create_dir_all(wt.join(".taskdaemon/runs")).unwrap();
    std::os::unix::fs::symlink(wt.join(".git"), wt.join("innocent")).unwrap();
    let config_before = std::fs::read_to_string(wt.join(".git/config")).unwrap();
    let mut exec = Exec::start(&wt);
    for path in [
        ".git",
        ".git/config",
        ".git/hooks/pre-commit",
        "src/../.git/HEAD",
        ".GIT/config",
        "innocent/hooks/post-checkout",
        "vendor/lib/.git",
        ".taskdaemon/runs/summary.json",
    ] {
        let v = exec.request("write_file", json!({"path": path, "content": "evil\n"}));
        assert_eq!(v["is_error"], true, "{path}: {v}");
        assert!(
            v["content"].as_str().unwrap().contains("is protected"),
            "{path}: {v}"
        );
    }
    let read = exec.request("read_file", json!({"path": ".git/config"}));
    assert_eq!(read["is_error"], false, "{read}");
    let edit = exec.request(
        "edit_file",
        json!({"path": ".git/config", "old_string": "[core]", "new_string": "[core]\n\tfsmonitor = evil"}),
    );
    assert_eq!(edit["is_error"], true, "{edit}");
    let ok = exec.request(
        "write_file",
        json!({"path": "src/ok.txt", "content": "fine\n"}),
    );
    assert_eq!(ok["is_error"], false, "{ok}");
    exec.finish_ok();
    assert_eq!(
        std::fs::read_to_string(wt.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!wt.join(".git/hooks/pre-commit").exists());
    assert!(!wt.join("vendor").exists());
}

#[test]
fn a_working_directory_inside_git_or_the_hosts_terminals_give_no_way_out() {
    if !fully_confined() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let wt = tmp.path().join("wt");
    common::init_repo(&wt, &[("README.md", "readme\n")]);
    let mut exec = Exec::start(&wt);
    // std enters the working directory before the mounts; the launcher enters it again
    // after them, so a cwd inside .git is on the read-only mount too.
    let v = exec.request(
        "run_command",
        json!({"cwd": ".git", "command": "echo evil > hooks/post-merge || echo refused; echo x >> config || echo refused"}),
    );
    let out = v["content"].as_str().unwrap();
    assert!(out.contains("refused\nrefused"), "{out}");
    // A private devpts: the host's terminals are not there, yet a pty can be opened.
    let out = exec.sh(
        "run_command",
        "ls /dev/pts; python3 -c 'import pty; pty.openpty(); print(\"pty-ok\")'",
    );
    assert!(out.contains("ptmx\npty-ok"), "{out}");
    assert!(
        !out.lines()
            .any(|l| l.chars().all(|c| c.is_ascii_digit()) && !l.is_empty()),
        "{out}"
    );
    // The no-net lane: no datagram pairs (they could sendto host sockets by path).
    let out = exec.sh(
        "run_command_isolated",
        "python3 -c 'import socket; socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM); print(\"stream-ok\"); socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)' || echo dgram-refused",
    );
    assert!(
        out.contains("stream-ok") && out.contains("dgram-refused"),
        "{out}"
    );
    exec.finish_ok();
    assert!(!wt.join(".git/hooks/post-merge").exists());
}

#[test]
fn no_lane_reaches_the_hosts_unix_sockets_unless_the_config_allows_it() {
    // A path-named Unix socket of the host (here a listener in a temp dir outside the
    // worktree; on a real machine a D-Bus session bus, whose `systemd-run --user` starts
    // processes outside any sandbox, or the Docker socket) is out of reach of every lane's
    // commands; `sandbox.unix-sockets: host` lets the net lanes reach it, as before.
    if !fully_confined() {
        return;
    }
    let wt = tempfile::tempdir().unwrap();
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("host-service.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let probe = format!(
        r#"python3 - <<'EOF'
import socket
for what, family, address in [("unix", socket.AF_UNIX, "{path}"), ("tcp", socket.AF_INET, ("127.0.0.1", {port}))]:
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(address)
        print(what, "reached")
    except OSError as e:
        print(what, "refused")
EOF"#,
        path = path.display()
    );
    let mut exec = Exec::start(wt.path());
    for tool in ["run_command", "run_command_isolated"] {
        let out = exec.sh(tool, &probe);
        assert!(out.contains("unix refused"), "{tool}: {out}");
    }
    // The net lane still has the host's network: the refusal is of Unix sockets only.
    let net = exec.sh("run_command", &probe);
    assert!(net.contains("tcp reached"), "{net}");
    exec.finish_ok();

    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("taskdaemon.yml");
    std::fs::write(&config, "sandbox: {unix-sockets: host}\n").unwrap();
    let mut exec = Exec::start_with(wt.path(), &["-c".as_ref(), config.as_os_str()]);
    let allowed = exec.sh("run_command", &probe);
    assert!(allowed.contains("unix reached"), "{allowed}");
    let isolated = exec.sh("run_command_isolated", &probe);
    assert!(isolated.contains("unix refused"), "{isolated}");
    exec.finish_ok();
}
