//! The daemon's own git and git-lfs (the real one, Debian's `git-lfs`): the user's committed
//! `*.bin filter=lfs` still turns what a loop writes into LFS pointers on the way into a
//! commit (git 2.42 and newer read the run's commit's attributes; below, git-lfs's own filter
//! is the one driver left on), the user's LFS checkout does not look changed to the daemon's
//! git (it merges into it), loops' worktrees hold the content of the LFS objects the user's
//! repository has, and git-lfs never fetches for the daemon's git: its smudge would fetch a
//! missing object from the URL in the checkout's `.lfsconfig`, which a loop can write, with
//! the user's credentials and outside every sandbox.
//!
//! The user's `HOME` has git-lfs installed (`git lfs install --skip-repo`). Loop `one`
//! checks that its worktree holds the user's `base.bin` (not its pointer), and writes
//! `new.bin` and a `.lfsconfig` naming a listener of the test's as the LFS server; loop
//! `two`, merged after it, writes `ghost.bin`, the pointer of an object nobody has: the
//! merge queue checks that out on `main` (where `one`'s `.lfsconfig` is), in its scratch
//! worktree and in the user's checkout, where a smudge would ask the listener for the ghost.
//! Each git on this machine is put first on `PATH` in turn.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

mod common;
use common::machine_gits::{case_dirs, gits, run, run_failed, version};

/// The pointer git-lfs writes for an object of `size` bytes with id `oid`.
fn pointer(oid: &str, size: usize) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n")
}

/// Counts the connections made to a listener on 127.0.0.1; returns its port and the count.
fn listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (port, count)
}

/// git with the user's `HOME`, as the user runs it.
fn users_git(repo: &Path, home: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .current_dir(repo)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn git_lfs_fills_loops_worktrees_from_local_objects_cleans_what_they_write_and_never_fetches() {
    common::debian_packages::install(&["git-lfs"], &["/usr/bin/git-lfs"], "the LFS test");
    let lfs = Command::new("git-lfs").arg("version").output();
    assert!(
        lfs.is_ok_and(|o| o.status.success()),
        "this test needs git-lfs on PATH: apt-get install git-lfs (the test does it itself when it runs as root or with passwordless sudo; .ci/run does it in CI)"
    );
    let mut problems = Vec::new();
    for git_dir in gits() {
        let which = version(&git_dir);
        let (_tmp, root, home) = case_dirs();
        users_git(&root, &home, &["lfs", "install", "--skip-repo"]);
        let repo = root.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        users_git(&repo, &home, &["init", "-q", "-b", "main"]);
        std::fs::write(
            repo.join(".gitattributes"),
            "*.bin filter=lfs diff=lfs merge=lfs -text\n",
        )
        .unwrap();
        std::fs::write(repo.join("base.bin"), "the user's large file\n").unwrap();
        users_git(&repo, &home, &["add", "-A"]);
        users_git(&repo, &home, &["commit", "-q", "-m", "lfs"]);
        let (port, connections) = listener();
        let ghost = pointer(&"ab".repeat(32), 1234).replace('\n', "\\n");
        let script = format!(
            "one:\n  turns:\n    - calls:\n        \
             - write_file: {{path: .lfsconfig, content: \"[lfs]\\n\\turl = http://127.0.0.1:{port}/lfs\\n\"}}\n        \
             - write_file: {{path: new.bin, content: \"the loop's large file\\n\"}}\n        \
             - complete_task: {{summary: done}}\n\
             two:\n  turns:\n    - calls:\n        - run_command: {{command: \"sleep 1\"}}\n    - calls:\n        \
             - write_file: {{path: ghost.bin, content: \"{ghost}\"}}\n        \
             - complete_task: {{summary: done}}\n"
        );
        std::fs::write(root.join("script.yml"), script).unwrap();
        let config = root.join("taskdaemon.yml");
        std::fs::write(
            &config,
            "repo: repo\nllm: {provider: scripted, script: script.yml}\nmerge: true\n\
             loops:\n  - {name: one, type: code, task: Add files., validation: 'test -s new.bin && grep -q large base.bin'}\n  \
             - {name: two, type: code, task: Add files., validation: 'test -s ghost.bin'}\n",
        )
        .unwrap();
        let out = run(&config, &git_dir, &home);
        let case = which.clone();
        let failed = run_failed(&case, &out);
        problems.extend(failed.clone());
        let made = connections.load(Ordering::SeqCst);
        if made > 0 {
            problems.push(format!(
                "{case}: git-lfs connected {made} time(s) to the loop's .lfsconfig URL"
            ));
        }
        if failed.is_some() {
            continue;
        }
        // What `main` holds for the loop's new file: a pointer (git-lfs's clean ran, with
        // every git: below 2.42 git-lfs's own filter is the one driver left on), its object
        // stored in the repository.
        let new = common::git(&repo, &["show", "main:new.bin"]);
        let content = "the loop's large file\n";
        let oid = td_base::hash::sha256_hex(content.as_bytes());
        if new != pointer(&oid, content.len()) {
            problems.push(format!("{case}: main has new.bin {new:?}, not a pointer"));
        }
        let object = repo
            .join(".git/lfs/objects")
            .join(&oid[..2])
            .join(&oid[2..4])
            .join(&oid);
        if std::fs::read_to_string(&object).ok().as_deref() != Some(content) {
            problems.push(format!("{case}: no LFS object at {}", object.display()));
        }
        // The user's checkout, advanced by the merge queue: the loop's file as content (its
        // object is here), the ghost as the pointer it is (no object anywhere).
        let checked_out = std::fs::read_to_string(repo.join("new.bin")).unwrap_or_default();
        if checked_out != content {
            problems.push(format!(
                "{case}: the user's checkout has new.bin {checked_out:?}, not its content"
            ));
        }
        let ghost = std::fs::read_to_string(repo.join("ghost.bin")).unwrap_or_default();
        if !ghost.starts_with("version https://git-lfs.github.com/spec/v1\n") {
            problems.push(format!(
                "{case}: the user's checkout has ghost.bin {ghost:?}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the daemon's git and git-lfs:\n{}",
        problems.join("\n")
    );
}
