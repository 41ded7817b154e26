//! Ignore files as an attacker plants them, through the real binary (`taskdaemon tool
//! exec`): a `.gitignore` that is a FIFO, an endless device or a 64 GiB sparse file, one that
//! is a symlink or hard link to a file outside or hidden from loops (a guess oracle: which
//! names it hides tells what the file says), and a `.git` file whose `gitdir` points outside.
//! The walking tools (`glob`, `grep`, `list_directory`, `symbols`) must answer at once, in
//! bounded memory, leave no thread behind and apply none of these files. Also: what the walk
//! errors of `list_directory` and a `glob` that names a directory say about outside.
//!
//! Layout of every case:
//!   tmp/wt/            the worktree
//!   tmp/outside/       files the loop must learn nothing about

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;

use common::attack::{Swapping, fixture, mkfifo};
use common::tool_exec::{Exec, peak_kib, proc_status};

fn write(dir: &Path, rel: &str, content: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// The calls of every walking tool over the whole worktree.
fn walking_calls() -> Vec<(&'static str, Value)> {
    vec![
        ("glob", json!({"pattern": "**/*"})),
        ("grep", json!({"pattern": "fn "})),
        ("list_directory", json!({"recursive": true})),
        ("symbols", json!({"path": "."})),
    ]
}

/// Makes `call` and checks it is answered within 2 s, without an error; returns the answer.
fn answered_at_once(exec: &mut Exec, tool: &str, input: Value) -> String {
    let started = Instant::now();
    let (is_error, content) = exec.call(tool, input.clone());
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "{tool} {input} took {took:?}"
    );
    assert!(!is_error, "{tool} {input}: {content}");
    content
}

/// Threads of process `pid` blocked opening a FIFO (waiting for a writer).
fn threads_opening_a_fifo(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("wchan")).ok())
        .filter(|wchan| wchan.contains("wait_for_partner") || wchan.contains("fifo_open"))
        .count()
}

#[test]
fn a_fifo_ignore_file_hangs_no_walk_and_leaves_no_thread_behind() {
    let f = fixture();
    write(&f.wt, "d/code.rs", "fn kept() {}\n");
    write(&f.wt, "top.rs", "fn top() {}\n");
    mkfifo(&f.wt.join("d/.gitignore"));
    mkfifo(&f.wt.join(".ignore"));
    let mut exec = Exec::start(&f.wt);
    let pid = exec.child.id();
    let mut threads_after_first_round = 0;
    for round in 0..5 {
        for (tool, input) in walking_calls() {
            let content = answered_at_once(&mut exec, tool, input);
            // A FIFO's rules cannot be read: nothing is hidden, and the answer says why.
            if tool != "list_directory" {
                assert!(content.contains("d/code.rs"), "{tool}: {content}");
            }
            assert!(
                content.contains("'d/.gitignore'") && content.contains("'.ignore'"),
                "{tool}: {content}"
            );
            assert!(content.contains("not a regular file"), "{tool}: {content}");
        }
        // Named as the search path, the directory's own and its ancestors' files still count.
        let content = answered_at_once(&mut exec, "glob", json!({"pattern": "*", "path": "d"}));
        assert!(content.contains("d/code.rs"), "{content}");
        assert_eq!(threads_opening_a_fifo(pid), 0, "round {round}");
        let threads = proc_status(pid, "Threads");
        if round == 0 {
            threads_after_first_round = threads;
        } else {
            // A blocked call would leave a thread each: 4 more a round, 16 by the last round
            // (and `threads_opening_a_fifo` above names any such thread directly). Under load
            // the blocking pool may start a few more when calls come while earlier threads are
            // being handed back (seen: 3); that bounded slack is all it may grow by.
            assert!(
                threads <= threads_after_first_round + 4,
                "round {round}: {threads} threads, {threads_after_first_round} after the first"
            );
        }
    }
    assert!(
        exec.finish_within(Duration::from_secs(10)),
        "tool exec exits"
    );
}

#[test]
fn an_endless_or_huge_ignore_file_keeps_memory_bounded() {
    const BOUND_KIB: u64 = 100 * 1024;
    let f = fixture();
    write(&f.wt, "a/code.rs", "fn in_a() {}\n");
    write(&f.wt, "b/code.rs", "fn in_b() {}\n");
    std::os::unix::fs::symlink("/dev/zero", f.wt.join("a/.gitignore")).unwrap();
    // 64 GiB of nothing: sparse, it takes no disk.
    let huge = std::fs::File::create(f.wt.join("b/.ignore")).unwrap();
    huge.set_len(64 << 30).unwrap();
    drop(huge);
    // Just over the cap, and with rules that would hide everything: not applied either.
    let mut over = "*\n".repeat(512 * 1024);
    over.push('\n');
    write(&f.wt, "c/.gitignore", &over);
    write(&f.wt, "c/code.rs", "fn in_c() {}\n");
    let mut exec = Exec::start(&f.wt);
    let pid = exec.child.id();
    for (tool, input) in walking_calls() {
        let content = answered_at_once(&mut exec, tool, input);
        for dir in ["a", "b", "c"] {
            assert!(content.contains(&format!("{dir}/code.rs")) || tool == "list_directory");
        }
        assert!(
            content.contains("'b/.ignore'") && content.contains("larger than"),
            "{tool}: {content}"
        );
        assert!(content.contains("'c/.gitignore'"), "{tool}: {content}");
        assert!(content.contains("'a/.gitignore'"), "{tool}: {content}");
    }
    let content = answered_at_once(&mut exec, "list_directory", json!({"path": "c"}));
    assert!(content.contains("code.rs"), "{content}");
    let peak = peak_kib(pid);
    assert!(peak < BOUND_KIB, "tool exec peaked at {peak} KiB");
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn an_ignore_file_linked_to_a_hidden_or_outside_file_is_not_applied() {
    let f = fixture();
    // The secret: a PIN hidden from loops. Were a link to it read as rules, the names it
    // hides would say what it holds.
    std::fs::write(f.outside.join("pin.txt"), "hunter2\n").unwrap();
    std::fs::write(f.outside.join("rules"), "*.txt\n").unwrap();
    std::fs::write(f.outside.join("linked"), "hunter3\n").unwrap();
    std::fs::write(f.wt.join("pin-inside.txt"), "hunter1\n").unwrap();
    for dir in ["probe", "probe/inner", "soft", "hard", "inner-hidden"] {
        for n in 1..=3 {
            write(&f.wt, &format!("{dir}/hunter{n}"), "x\n");
        }
        write(&f.wt, &format!("{dir}/n.txt"), "x\n");
    }
    let link = |target: &Path, at: &str| std::os::unix::fs::symlink(target, f.wt.join(at));
    link(&f.outside.join("pin.txt"), "probe/.gitignore").unwrap();
    link(&f.outside.join("rules"), "soft/.ignore").unwrap();
    std::fs::hard_link(f.outside.join("linked"), f.wt.join("hard/.gitignore")).unwrap();
    // A hard link inside the worktree to a hidden file inside it.
    std::fs::hard_link(
        f.wt.join("pin-inside.txt"),
        f.wt.join("inner-hidden/.ignore"),
    )
    .unwrap();
    let mut exec = Exec::hiding(
        &f.wt,
        &f.outside,
        &[&f.outside.join("pin.txt"), &f.wt.join("pin-inside.txt")],
    );
    let every_name = |content: &str, dir: &str| {
        for name in ["hunter1", "hunter2", "hunter3", "n.txt"] {
            assert!(
                content.contains(&format!("{dir}/{name}")),
                "{dir}/{name} hidden: {content}"
            );
        }
    };
    let content = answered_at_once(&mut exec, "glob", json!({"pattern": "**/*"}));
    for dir in ["probe", "probe/inner", "soft", "hard", "inner-hidden"] {
        every_name(&content, dir);
    }
    for ignore_file in [
        "probe/.gitignore",
        "soft/.ignore",
        "hard/.gitignore",
        "inner-hidden/.ignore",
    ] {
        assert!(content.contains(&format!("'{ignore_file}'")), "{content}");
    }
    // As the search path, and from below (the links are then ancestors' ignore files).
    for path in ["probe", "probe/inner", "soft", "hard", "inner-hidden"] {
        let content = answered_at_once(&mut exec, "glob", json!({"pattern": "**/*", "path": path}));
        every_name(&content, path);
        let content = answered_at_once(&mut exec, "grep", json!({"pattern": "x", "path": path}));
        every_name(&content, path);
        let content = answered_at_once(&mut exec, "list_directory", json!({"path": path}));
        for name in ["hunter1", "hunter2", "hunter3", "n.txt"] {
            assert!(content.contains(name), "{path}: {content}");
        }
    }
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn a_dot_git_file_pointing_outside_is_never_followed() {
    let f = fixture();
    // A gitdir outside whose files would block whoever opens them: an open is a hang.
    let gitdir = f.outside.join("gd");
    mkfifo(&gitdir.join("commondir"));
    mkfifo(&gitdir.join("info/exclude"));
    let dot_git = format!("gitdir: {}\n", gitdir.display());
    write(&f.wt, "sub/.git", &dot_git);
    write(&f.wt, "sub/code.rs", "fn in_sub() {}\n");
    write(&f.wt, "top.rs", "fn top() {}\n");
    let mut exec = Exec::start(&f.wt);
    for (tool, input) in walking_calls() {
        let content = answered_at_once(&mut exec, tool, input);
        if tool != "list_directory" {
            assert!(content.contains("sub/code.rs"), "{tool}: {content}");
        }
    }
    for path in ["sub", "."] {
        answered_at_once(&mut exec, "glob", json!({"pattern": "*", "path": path}));
    }
    assert!(exec.finish_within(Duration::from_secs(10)));
    // The worktree's own `.git` a file (as in a git worktree): not followed either.
    write(&f.wt, ".git", &dot_git);
    let mut exec = Exec::start(&f.wt);
    for (tool, input) in walking_calls() {
        answered_at_once(&mut exec, tool, input);
    }
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn the_root_git_directory_exclude_file_still_applies() {
    let f = fixture();
    write(&f.wt, ".git/info/exclude", "*.local\n");
    write(&f.wt, "x.local", "fn hidden_by_exclude() {}\n");
    write(&f.wt, "sub/y.local", "fn also() {}\n");
    write(&f.wt, "sub/z.rs", "fn kept() {}\n");
    let mut exec = Exec::start(&f.wt);
    for path in [".", "sub"] {
        let content = answered_at_once(&mut exec, "glob", json!({"pattern": "**/*", "path": path}));
        assert!(!content.contains(".local"), "{content}");
        assert!(content.contains("sub/z.rs"), "{content}");
    }
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn list_directory_walk_errors_name_nothing_outside() {
    const CALLS: usize = 1_500;
    let f = fixture();
    // `d` trades places with a symlink to a directory outside full of named subdirectories:
    // a walk that lists `d` while it points outside, then reads a subdirectory after the
    // swap back, fails on a name it found outside.
    for i in 0..40 {
        write(&f.outside, &format!("TOPSECRET_SUBDIR{i}/f"), "x\n");
        write(&f.wt, &format!("d/inside{i}/f"), "x\n");
    }
    std::os::unix::fs::symlink(&f.outside, f.wt.join("x")).unwrap();
    let swapping = Swapping::start(&[(f.wt.join("d"), f.wt.join("x"))]);
    let mut exec = Exec::start(&f.wt);
    let mut errors_reported = 0;
    for i in 0..CALLS {
        let (_, content) = exec.call("list_directory", json!({"recursive": true}));
        assert!(!content.contains("TOPSECRET"), "call {i}: {content}");
        errors_reported += usize::from(content.contains("could not be read"));
    }
    let swaps = swapping.stop();
    println!("{errors_reported} of {CALLS} listings reported entries that could not be read");
    assert!(swaps > CALLS, "the race ran");
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn glob_tells_nothing_about_directories_outside() {
    let f = fixture();
    std::fs::create_dir_all(f.outside.join("out")).unwrap();
    std::os::unix::fs::symlink(&f.outside, f.wt.join("L")).unwrap();
    std::fs::create_dir_all(f.wt.join("src")).unwrap();
    let mut exec = Exec::start(&f.wt);
    let (_, there) = exec.call("glob", json!({"pattern": "L/out"}));
    let (_, absent) = exec.call("glob", json!({"pattern": "L/absent"}));
    assert!(!there.contains("is a directory"), "{there}");
    assert_eq!(there.replace("L/out", "L/absent"), absent);
    // A directory inside is still pointed out.
    let (_, content) = exec.call("glob", json!({"pattern": "src"}));
    assert!(content.contains("'src' is a directory"), "{content}");
    assert!(exec.finish_within(Duration::from_secs(10)));
}
