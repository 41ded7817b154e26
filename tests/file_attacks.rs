//! The file tools attacked as the path sandbox's second round did, through the real binary
//! (`taskdaemon tool exec`): hard links to outside, a symlink swapped in and out of a path
//! while calls run, FIFOs, a full disk, and appends racing an edit.
//!
//! Layout of every case:
//!   tmp/wt/            the worktree
//!   tmp/outside/       secret.txt ("TOP-SECRET")

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;

use common::attack::{Fixture, Swapping, mkfifo};
use common::tool_exec::{Exec, peak_kib};

const SECRET: &str = "TOP-SECRET";

fn fixture() -> Fixture {
    let f = common::attack::fixture();
    std::fs::write(f.outside.join("secret.txt"), format!("{SECRET}\n")).unwrap();
    f
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_hard_link_to_a_file_outside_is_neither_read_nor_written() {
    let f = fixture();
    std::fs::hard_link(f.outside.join("secret.txt"), f.wt.join("h.txt")).unwrap();
    std::fs::write(f.wt.join("plain.txt"), "plain TOP\n").unwrap();
    let mut exec = Exec::start(&f.wt);

    let (is_error, content) = exec.call("read_file", json!({"path": "h.txt"}));
    assert!(is_error, "{content}");
    assert!(!content.contains(SECRET), "{content}");
    assert!(content.contains("hard link"), "{content}");
    for input in [
        json!({"pattern": "TOP", "path": "h.txt"}),
        json!({"pattern": "TOP"}),
    ] {
        let (_, content) = exec.call("grep", input);
        assert!(!content.contains(SECRET), "{content}");
    }
    let (is_error, content) = exec.call(
        "write_file",
        json!({"path": "h.txt", "content": "overwritten\n"}),
    );
    assert!(is_error, "{content}");
    let edit = json!({"path": "h.txt", "old_string": "TOP", "new_string": "x"});
    let (is_error, content) = exec.call("edit_file", edit);
    assert!(is_error, "{content}");
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        format!("{SECRET}\n")
    );
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn hard_links_within_the_worktree_still_work() {
    let f = fixture();
    // As cargo links target/debug/x to target/debug/deps/x-hash.
    std::fs::create_dir_all(f.wt.join("target/deps")).unwrap();
    std::fs::write(f.wt.join("target/deps/tool-1234"), "built one\n").unwrap();
    std::fs::hard_link(f.wt.join("target/deps/tool-1234"), f.wt.join("target/tool")).unwrap();
    let mut exec = Exec::start(&f.wt);
    let (is_error, content) = exec.call("read_file", json!({"path": "target/tool"}));
    assert!(!is_error, "{content}");
    assert!(content.contains("built one"), "{content}");
    let edit = json!({"path": "target/tool", "old_string": "one", "new_string": "two"});
    let (is_error, content) = exec.call("edit_file", edit);
    assert!(!is_error, "{content}");
    assert_eq!(
        std::fs::read_to_string(f.wt.join("target/tool")).unwrap(),
        "built two\n"
    );
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn a_symlink_swapped_in_and_out_of_a_path_leaks_nothing_and_writes_nothing_outside() {
    const CALLS: usize = 1_000;
    let f = fixture();
    // `d` is a real directory inside; `x` a symlink to outside. The swapper exchanges them,
    // so `d` is now one, now the other.
    std::fs::create_dir_all(f.wt.join("d")).unwrap();
    std::fs::write(f.wt.join("d/secret.txt"), "inside\n").unwrap();
    std::fs::write(f.wt.join("d/code.rs"), "fn inside() {}\n").unwrap();
    std::fs::write(
        f.outside.join("code.rs"),
        format!("fn {SECRET}() {{}}\n").replace('-', "_"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&f.outside, f.wt.join("x")).unwrap();
    let outside_before = entries(&f.outside);

    let swapping = Swapping::start(&[(f.wt.join("d"), f.wt.join("x"))]);
    let mut exec = Exec::start(&f.wt);
    let leaked = |content: &str| content.contains(SECRET) || content.contains("TOP_SECRET");
    let mut answered = std::collections::BTreeMap::<&str, usize>::new();
    for i in 0..CALLS {
        let calls: Vec<(&str, Value)> = vec![
            ("read_file", json!({"path": "d/secret.txt"})),
            ("grep", json!({"pattern": "TOP|inside", "path": "d"})),
            ("grep", json!({"pattern": "TOP", "path": "d/secret.txt"})),
            ("list_directory", json!({"path": "d"})),
            ("glob", json!({"pattern": "d/*"})),
            ("symbols", json!({"path": "d"})),
            (
                "write_file",
                json!({"path": format!("d/new-{i}/w.txt"), "content": "mine\n"}),
            ),
            (
                "edit_file",
                json!({"path": "d/secret.txt", "old_string": "inside", "new_string": "inside"}),
            ),
        ];
        for (tool, input) in calls {
            let (is_error, content) = exec.call(tool, input);
            assert!(!leaked(&content), "{tool} leaked on call {i}: {content}");
            if !is_error {
                *answered.entry(tool).or_default() += 1;
            }
        }
        // An edit needs a read of the same file; make sure one happens now and then.
        let _ = exec.call("read_file", json!({"path": "d/secret.txt"}));
        let (_, content) = exec.call(
            "edit_file",
            json!({"path": "d/secret.txt", "old_string": "inside", "new_string": "inside!"}),
        );
        assert!(!leaked(&content), "{content}");
    }
    let swaps = swapping.stop();
    assert!(exec.finish_within(Duration::from_secs(10)));
    assert!(swaps > CALLS, "the race ran");
    assert_eq!(
        entries(&f.outside),
        outside_before,
        "nothing created outside"
    );
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        format!("{SECRET}\n"),
        "nothing changed outside"
    );
    // The tools still did their work whenever the path was the real directory.
    for tool in ["read_file", "list_directory", "write_file"] {
        assert!(
            answered.get(tool).copied().unwrap_or(0) > 0,
            "{tool}: {answered:?}"
        );
    }
}

#[test]
fn files_swapped_for_symlinks_or_fifos_mid_call_leak_nothing_and_hang_nothing() {
    const CALLS: usize = 1_000;
    let f = fixture();
    // `f.txt` trades places with a symlink to the secret outside, `g.txt` with a FIFO.
    std::fs::write(f.wt.join("f.txt"), "inside\n").unwrap();
    std::fs::write(f.wt.join("g.txt"), "inside too\n").unwrap();
    std::os::unix::fs::symlink(f.outside.join("secret.txt"), f.wt.join("l")).unwrap();
    mkfifo(&f.wt.join("q"));
    let swapping = Swapping::start(&[
        (f.wt.join("f.txt"), f.wt.join("l")),
        (f.wt.join("g.txt"), f.wt.join("q")),
    ]);
    let mut exec = Exec::start(&f.wt);
    let mut slowest = Duration::ZERO;
    let mut answered = 0usize;
    for i in 0..CALLS {
        let calls: Vec<(&str, Value)> = vec![
            ("read_file", json!({"path": "f.txt"})),
            ("grep", json!({"pattern": "TOP|inside", "path": "f.txt"})),
            ("grep", json!({"pattern": "TOP|inside"})),
            (
                "edit_file",
                json!({"path": "f.txt", "old_string": "inside", "new_string": "inside"}),
            ),
            (
                "write_file",
                json!({"path": "f.txt", "content": format!("inside {i}\n")}),
            ),
            ("read_file", json!({"path": "g.txt"})),
            ("grep", json!({"pattern": "inside", "path": "g.txt"})),
            ("symbols", json!({"path": "g.txt"})),
        ];
        for (tool, input) in calls {
            let started = Instant::now();
            let (is_error, content) = exec.call(tool, input);
            slowest = slowest.max(started.elapsed());
            assert!(
                !content.contains(SECRET),
                "{tool} leaked on round {i}: {content}"
            );
            assert!(
                !content.contains("timed out"),
                "{tool} on round {i}: {content}"
            );
            answered += usize::from(!is_error);
        }
    }
    let swaps = swapping.stop();
    println!("{answered} calls succeeded; slowest answer {slowest:?}");
    assert!(
        slowest < Duration::from_secs(5),
        "a call hung for {slowest:?}"
    );
    assert!(swaps > CALLS, "the race ran");
    assert!(
        answered > CALLS,
        "the tools still worked between swaps: {answered}"
    );
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        format!("{SECRET}\n"),
        "nothing changed outside"
    );
    assert!(
        std::fs::symlink_metadata(f.outside.join("secret.txt"))
            .unwrap()
            .is_file()
    );
    assert!(
        exec.finish_within(Duration::from_secs(10)),
        "tool exec exits"
    );
}

#[test]
fn fifos_are_answered_at_once_and_tool_exec_exits() {
    let f = fixture();
    for name in ["p", "p.rs"] {
        mkfifo(&f.wt.join(name));
    }
    std::fs::write(f.wt.join("ok.txt"), "needle\n").unwrap();
    let mut exec = Exec::start(&f.wt);
    let calls = [
        ("read_file", json!({"path": "p"})),
        ("grep", json!({"pattern": "x", "path": "p"})),
        ("symbols", json!({"path": "p.rs"})),
        (
            "edit_file",
            json!({"path": "p", "old_string": "a", "new_string": "b"}),
        ),
        ("write_file", json!({"path": "p", "content": "x"})),
    ];
    for (tool, input) in calls {
        let started = Instant::now();
        let (is_error, content) = exec.call(tool, input);
        assert!(is_error, "{tool}: {content}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{tool} took {:?}: {content}",
            started.elapsed()
        );
    }
    // A search of the tree skips the FIFOs and finds the rest.
    let (is_error, content) = exec.call("grep", json!({"pattern": "needle"}));
    assert!(!is_error && content.contains("ok.txt"), "{content}");
    assert!(
        exec.finish_within(Duration::from_secs(5)),
        "tool exec must exit at the end of its input"
    );
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Result<SmallDisk, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(SmallDisk { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_disk_leaves_every_file_as_it_was() {
    let disk = match SmallDisk::mount("1m") {
        Ok(disk) => disk,
        Err(why) => {
            println!("skipped: cannot mount a tmpfs here ({why})");
            return;
        }
    };
    let wt = disk.path().join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let original = format!("first line\n{}", "line one\nline two\n".repeat(2_000));
    std::fs::write(wt.join("f.txt"), &original).unwrap();
    let mut exec = Exec::start(&wt);
    let (is_error, content) = exec.call("read_file", json!({"path": "f.txt", "limit": 1}));
    assert!(!is_error, "{content}");
    // Fill the disk, leaving less room than the edited file needs.
    let mut filler = std::fs::File::create(wt.join("filler")).unwrap();
    let block = vec![b'x'; 4096];
    while filler.write_all(&block).is_ok() {}
    drop(filler);

    let edit =
        json!({"path": "f.txt", "old_string": "first line", "new_string": "changed first line"});
    let (is_error, content) = exec.call("edit_file", edit);
    assert!(is_error, "{content}");
    assert!(content.contains("left as it was"), "{content}");
    assert_eq!(std::fs::read_to_string(wt.join("f.txt")).unwrap(), original);

    let big = "y".repeat(200_000);
    let (is_error, content) = exec.call(
        "write_file",
        json!({"path": "f.txt", "content": big.clone()}),
    );
    assert!(is_error, "{content}");
    assert_eq!(std::fs::read_to_string(wt.join("f.txt")).unwrap(), original);
    let (is_error, content) = exec.call(
        "write_file",
        json!({"path": "new/deeper/g.txt", "content": big}),
    );
    assert!(is_error, "{content}");
    assert!(
        !wt.join("new").exists(),
        "the directories made for the write are gone"
    );
    assert_eq!(
        entries(&wt),
        ["f.txt", "filler"],
        "no temp file left behind"
    );
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn appends_racing_edits_are_never_lost_unseen() {
    // Another process appends a line every 0.2 to 4.2 ms (open, write, close, as a logger does)
    // while the loop reads and edits the file's first line. Every append must end up in the
    // file, unless an edit said that a write reached a version that lost the name, or the
    // append was out of reach of any check: its file had already lost its name (an edit had
    // swapped, checked and removed it) when its write began. That is the one window a
    // replace by rename leaves (ARCHITECTURE.md, "Atomic writes"): a writer preempted
    // between its open and its write on a busy machine lands in it.
    const EDITS: usize = 150;
    const APPENDS: usize = 3_000;
    let f = fixture();
    let path = f.wt.join("log.txt");
    std::fs::write(&path, "marker 0\n").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Per append: whether the file it opened had lost its name when the write began.
    let appends = Arc::new(std::sync::Mutex::new(Vec::<bool>::new()));
    let appender = {
        let (path, stop, appends) = (path.clone(), stop.clone(), appends.clone());
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap();
                let unlinked =
                    std::os::unix::fs::MetadataExt::nlink(&file.metadata().unwrap()) == 0;
                file.write_all(format!("append {n}\n").as_bytes()).unwrap();
                drop(file);
                appends.lock().unwrap().push(unlinked);
                n += 1;
                // Gaps of 0.2 to 4.2 ms: some edits fall between appends, some race them.
                std::thread::sleep(Duration::from_micros(200 + (n as u64 * 7919) % 4000));
            }
        })
    };
    let appended = || appends.lock().unwrap().len();
    let mut exec = Exec::start(&f.wt);
    let mut marker = 0usize;
    let (mut edits, mut stale, mut reported, mut tries) = (0usize, 0usize, 0usize, 0usize);
    let started = Instant::now();
    while (edits < EDITS || appended() < APPENDS) && started.elapsed() < Duration::from_secs(120) {
        tries += 1;
        let _ = exec.call("read_file", json!({"path": "log.txt", "limit": 1}));
        let edit = json!({
            "path": "log.txt",
            "old_string": format!("marker {marker}\n"),
            "new_string": format!("marker {}\n", marker + 1),
        });
        let (is_error, content) = exec.call("edit_file", edit);
        if is_error {
            assert!(content.contains("changed on disk"), "{content}");
            stale += 1;
            if content.contains("is lost") {
                reported += 1;
            }
        } else {
            if content.contains("another process wrote") {
                reported += 1;
            }
            marker += 1;
            edits += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    appender.join().unwrap();
    assert!(exec.finish_within(Duration::from_secs(10)));
    let appends = appends.lock().unwrap().clone();
    let text = std::fs::read_to_string(&path).unwrap();
    let present: std::collections::HashSet<&str> = text.lines().collect();
    let lost: Vec<usize> = (0..appends.len())
        .filter(|n| !present.contains(format!("append {n}").as_str()))
        .collect();
    let unexplained: Vec<usize> = lost.iter().copied().filter(|&n| !appends[n]).collect();
    println!(
        "{tries} edit attempts: {edits} done, {stale} refused as stale, {reported} reported a lost write; {} appends, {} lost, {} of them written to a file that had already lost its name",
        appends.len(),
        lost.len(),
        lost.len() - unexplained.len()
    );
    assert!(
        edits >= 20,
        "the edits must get through the race: {edits} of {tries}"
    );
    assert!(
        appends.len() >= APPENDS,
        "the appender must have raced the edits: {} appends",
        appends.len()
    );
    assert!(text.contains(&format!("marker {marker}\n")));
    assert!(
        unexplained.len() <= reported,
        "appends lost without an edit saying so: {unexplained:?} ({reported} reported)"
    );
}

#[test]
fn names_with_newlines_or_bytes_that_are_not_utf8_are_shown_escaped_and_can_be_passed_back() {
    use std::os::unix::ffi::OsStrExt as _;
    let f = fixture();
    std::fs::create_dir_all(f.wt.join("d")).unwrap();
    // A name built to forge result lines, and one that is not UTF-8.
    let forged = "a.txt:1:forged match\nb";
    std::fs::write(f.wt.join("d").join(forged), "needle one\n").unwrap();
    let raw = std::ffi::OsStr::from_bytes(b"bad\xffname.txt");
    std::fs::write(f.wt.join("d").join(raw), "needle two\n").unwrap();
    let mut exec = Exec::start(&f.wt);

    let shown_forged = r#""a.txt:1:forged match\nb""#;
    let shown_raw = r#""bad\xffname.txt""#;
    let (is_error, listing) = exec.call("list_directory", json!({"path": "d"}));
    assert!(!is_error, "{listing}");
    assert!(
        listing.contains(shown_forged) && listing.contains(shown_raw),
        "{listing}"
    );
    assert!(
        !listing.lines().any(|l| l.trim() == "b"),
        "a name split the listing: {listing}"
    );
    let (_, globbed) = exec.call("glob", json!({"pattern": "d/*"}));
    assert!(globbed.contains(&format!("d/{shown_forged}")), "{globbed}");
    assert!(globbed.contains(&format!("d/{shown_raw}")), "{globbed}");
    let (_, grepped) = exec.call("grep", json!({"pattern": "needle"}));
    assert!(
        !grepped.lines().any(|l| l.starts_with("b:") || l == "b"),
        "{grepped}"
    );
    assert!(
        grepped.contains(shown_forged) && grepped.contains(shown_raw),
        "{grepped}"
    );

    // What was shown opens the file it names, alone after its directory or as a whole.
    for (shown, text) in [(shown_forged, "needle one"), (shown_raw, "needle two")] {
        let (is_error, content) = exec.call("read_file", json!({"path": format!("d/{shown}")}));
        assert!(!is_error && content.contains(text), "{shown}: {content}");
    }
    let edit = json!({"path": format!("d/{shown_raw}"), "old_string": "two", "new_string": "2"});
    let (is_error, content) = exec.call("edit_file", edit);
    assert!(!is_error, "{content}");
    assert_eq!(
        std::fs::read_to_string(f.wt.join("d").join(raw)).unwrap(),
        "needle 2\n"
    );
    let (is_error, content) = exec.call("read_file", json!({"path": r#"d/"bad\q""#}));
    assert!(is_error && content.contains("unknown escape"), "{content}");
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn a_huge_single_line_file_keeps_grep_and_edit_file_bounded() {
    const BYTES: usize = 300 * 1024 * 1024;
    const BOUND_KIB: u64 = 100 * 1024;
    let f = fixture();
    {
        let mut file = std::fs::File::create(f.wt.join("one-line.txt")).unwrap();
        let block = vec![b'a'; 1024 * 1024];
        for _ in 0..BYTES / block.len() {
            file.write_all(&block).unwrap();
        }
        file.write_all(b" needle").unwrap();
    }
    let mut exec = Exec::start(&f.wt);
    let pid = exec.child.id();
    let (is_error, content) =
        exec.call("grep", json!({"pattern": "needle", "path": "one-line.txt"}));
    assert!(is_error && content.contains("longer than"), "{content}");
    let (_, content) = exec.call("grep", json!({"pattern": "needle"}));
    assert!(!content.contains("aaaa"), "{content}");
    let started = Instant::now();
    let edit = json!({"path": "one-line.txt", "old_string": "needle", "new_string": "pin"});
    let (is_error, content) = exec.call("edit_file", edit);
    assert!(is_error && content.contains("read"), "{content}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the refusal read the file: {:?}",
        started.elapsed()
    );
    let peak = peak_kib(pid);
    assert!(peak < BOUND_KIB, "tool exec peaked at {peak} KiB");
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn a_run_whose_loop_meets_fifos_answers_at_once_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    common::init_repo(&repo, &[("README.md", "fifo test\n")]);
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("script.yml"),
        r#"
fifo:
  turns:
    - calls:
        - run_command: {command: "mkfifo p p.rs"}
    - calls:
        - read_file: {path: p}
        - grep: {pattern: x, path: p}
        - symbols: {path: p.rs}
        - grep: {pattern: x}
        - edit_file: {path: p, old_string: a, new_string: b}
        - write_file: {path: p, content: x}
        - complete_task: {summary: "met the FIFOs"}
"#,
    )
    .unwrap();
    std::fs::write(
        config.join("taskdaemon.yml"),
        format!(
            "repo: {}\nllm: {{provider: scripted, script: script.yml}}\nloops:\n  - name: fifo\n    type: code\n    task: Meet FIFOs.\n    validation: \"true\"\n",
            repo.display()
        ),
    )
    .unwrap();
    let run_dir = dir.path().join("run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .arg("run")
        .arg("-c")
        .arg(config.join("taskdaemon.yml"))
        .arg("--run-dir")
        .arg(&run_dir)
        .env("HOME", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("taskdaemon run did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    let transcript = std::fs::read_to_string(run_dir.join("loops/fifo/transcript.jsonl")).unwrap();
    let refusals = transcript.matches("not a regular file").count();
    assert!(
        refusals >= 5,
        "each FIFO call refused as such: {transcript}"
    );
    assert!(!transcript.contains("timed out"), "{transcript}");
    assert!(!transcript.contains("timed out"), "{transcript}");
}

#[test]
fn hidden_files_are_neither_read_nor_written_by_the_file_tools_under_any_name() {
    let f = fixture();
    std::fs::create_dir_all(f.wt.join("keys")).unwrap();
    std::fs::write(f.wt.join("keys/api.key"), format!("{SECRET}\n")).unwrap();
    std::fs::write(f.wt.join("token.txt"), format!("{SECRET}\n")).unwrap();
    // Another name for the same file, inside the worktree: hidden by identity too.
    std::fs::hard_link(f.wt.join("token.txt"), f.wt.join("alias.txt")).unwrap();
    let mut exec = Exec::hiding(
        &f.wt,
        &f.outside,
        &[&f.wt.join("keys"), &f.wt.join("token.txt")],
    );
    for path in ["keys/api.key", "token.txt", "alias.txt"] {
        let (is_error, content) = exec.call("read_file", json!({"path": path}));
        assert!(is_error && content.contains("hidden"), "{path}: {content}");
        let (_, content) = exec.call("grep", json!({"pattern": "TOP", "path": path}));
        assert!(!content.contains(SECRET), "{path}: {content}");
        let (is_error, content) =
            exec.call("write_file", json!({"path": path, "content": "replaced\n"}));
        assert!(is_error && content.contains("hidden"), "{path}: {content}");
    }
    let (is_error, content) = exec.call(
        "write_file",
        json!({"path": "keys/new.key", "content": "planted\n"}),
    );
    assert!(is_error, "{content}");
    let (_, content) = exec.call("grep", json!({"pattern": "TOP"}));
    assert!(!content.contains(SECRET), "{content}");
    assert_eq!(
        std::fs::read_to_string(f.wt.join("token.txt")).unwrap(),
        format!("{SECRET}\n")
    );
    assert!(!f.wt.join("keys/new.key").exists());
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn artifacts_are_never_written_through_a_symlink_a_command_planted() {
    // A command plants `taskdaemon-artifacts/plan-x.md -> ../.git/hooks/pre-commit` (the
    // folder is an ordinary one, the loop's to write); create_plan must not write the hook,
    // which git would run unconfined.
    let f = fixture();
    common::init_repo(&f.wt, &[("README.md", "x\n")]);
    let hook = f.wt.join(".git/hooks/pre-commit");
    std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
    let mut exec = Exec::start(&f.wt);
    let (is_error, content) = exec.call(
        "run_command",
        json!({"command": "mkdir -p taskdaemon-artifacts && ln -s ../.git/hooks/pre-commit taskdaemon-artifacts/plan-x.md && ln -s ../.git/hooks/pre-commit taskdaemon-artifacts/plan-x.json && ln -s ../.git taskdaemon-artifacts/gitdir"}),
    );
    assert!(!is_error, "{content}");
    let plan = json!({
        "name": "x",
        "title": "t",
        "overview": "touch /tmp/pwned-by-a-plan",
        "specs": [{"name": "s", "title": "t", "description": "d"}]
    });
    let (is_error, content) = exec.call("create_plan", plan);
    assert!(is_error, "{content}");
    assert!(content.contains("symlink"), "{content}");
    assert_eq!(
        std::fs::read_to_string(&hook).unwrap(),
        "#!/bin/sh\nexit 0\n"
    );
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn an_edit_whose_result_would_be_huge_is_refused_before_anything_is_allocated() {
    let f = fixture();
    std::fs::write(f.wt.join("f.txt"), "a".repeat(512 * 1024)).unwrap();
    std::fs::write(f.wt.join("g.txt"), "a").unwrap();
    let mut exec = Exec::start(&f.wt);
    let pid = exec.child.id();
    let _ = exec.call("read_file", json!({"path": "f.txt"}));
    // 512 Ki replacements, each 1 MiB long: half a terabyte, once.
    let edit = json!({"path": "f.txt", "old_string": "a", "new_string": "b".repeat(1024 * 1024), "replace_all": true});
    let (is_error, content) = exec.call("edit_file", edit);
    assert!(is_error && content.contains("larger than"), "{content}");
    // Growing sixteenfold 7 times in one call would make 256 MiB: refused on the way, by the
    // cap on replacements or on the result's size, whichever comes first.
    let _ = exec.call("read_file", json!({"path": "g.txt"}));
    let doubling: Vec<Value> = (0..7)
        .map(|_| json!({"old_string": "a", "new_string": "a".repeat(16), "replace_all": true}))
        .collect();
    let started = Instant::now();
    let (is_error, content) = exec.call("edit_file", json!({"path": "g.txt", "edits": doubling}));
    let bounded = content.contains("larger than") || content.contains("matches more than");
    assert!(is_error && bounded, "{content}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        std::fs::read_to_string(f.wt.join("g.txt")).unwrap(),
        "a",
        "nothing written"
    );
    // The process is alive and its memory stayed far from the sizes asked for.
    let (is_error, content) = exec.call("read_file", json!({"path": "g.txt"}));
    assert!(!is_error, "{content}");
    assert!(
        peak_kib(pid) < 1024 * 1024,
        "peaked at {} KiB",
        peak_kib(pid)
    );
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn names_cannot_forge_a_grep_match_a_hint_or_hide_behind_invisible_characters() {
    let f = fixture();
    std::fs::write(f.wt.join("x:99:FAKE MATCH.rs"), "needle\n").unwrap();
    std::fs::write(f.wt.join("evil\u{202E}txt.rs"), "needle\n").unwrap();
    std::fs::write(f.wt.join("in\nner.rs"), "x\n").unwrap();
    let mut exec = Exec::start(&f.wt);
    let (_, grepped) = exec.call("grep", json!({"pattern": "needle"}));
    assert!(
        grepped.lines().all(|l| !l.starts_with("x:99:")),
        "a name forged a match line: {grepped}"
    );
    assert!(
        grepped.contains(r#""x:99:FAKE MATCH.rs":1:needle"#),
        "{grepped}"
    );
    assert!(!grepped.contains('\u{202E}'), "{grepped}");
    let (is_error, hint) = exec.call("read_file", json!({"path": "in\nner.r"}));
    assert!(is_error, "{hint}");
    assert!(
        !hint.contains("in\nner"),
        "the hint shows a raw newline: {hint}"
    );
    assert!(hint.contains(r#""in\nner.rs""#), "{hint}");
    // A name cannot smuggle a separator or a parent step through an escape.
    for smuggled in [r#""a\x2fb""#, r#""\x2e\x2e"/x"#, r#""\x00""#] {
        let (is_error, content) = exec.call("read_file", json!({"path": smuggled}));
        assert!(is_error, "{smuggled}: {content}");
    }
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn a_directory_moved_back_and_forth_during_the_link_census_does_not_count_twice() {
    // `A` holds a hard link to a file outside. Moved between `q` and `p` while the census
    // walks, it could be read in both places, its link counted twice, and the outside file
    // taken for one whose links are all inside.
    let f = fixture();
    for d in ["q/A", "p", "filler"] {
        std::fs::create_dir_all(f.wt.join(d)).unwrap();
    }
    std::fs::hard_link(f.outside.join("secret.txt"), f.wt.join("q/A/h")).unwrap();
    for i in 0..20_000 {
        std::fs::write(f.wt.join(format!("filler/{i}")), "").unwrap();
    }
    std::fs::write(f.wt.join("decoy"), "decoy\n").unwrap();
    std::fs::hard_link(f.wt.join("decoy"), f.wt.join("decoy2")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let (q, p, stop) = (f.wt.join("q/A"), f.wt.join("p/A"), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::rename(&q, &p);
                let _ = std::fs::rename(&p, &q);
            }
        })
    };
    let mut exec = Exec::start(&f.wt);
    for round in 0..60 {
        // A decoy whose links just changed makes the next read take a new census.
        std::fs::remove_file(f.wt.join("decoy2")).unwrap();
        std::fs::hard_link(f.wt.join("decoy"), f.wt.join("decoy2")).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let _ = exec.call("read_file", json!({"path": "decoy"}));
        for path in ["q/A/h", "p/A/h"] {
            let (_, content) = exec.call("read_file", json!({"path": path}));
            assert!(
                !content.contains(SECRET),
                "round {round}, {path}: {content}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    mover.join().unwrap();
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn a_special_file_named_by_the_model_is_never_opened_for_reading() {
    // Opening a device runs its driver; opening a FIFO for reading releases a writer waiting
    // on it. The FIFO shows it: a writer blocked in open() must stay blocked.
    let f = fixture();
    let fifo = f.wt.join("pipe.rs");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let opened = Arc::new(AtomicBool::new(false));
    let writer = {
        let (fifo, opened) = (fifo.clone(), opened.clone());
        std::thread::spawn(move || {
            let file = std::fs::OpenOptions::new().write(true).open(&fifo);
            opened.store(true, Ordering::SeqCst);
            drop(file);
        })
    };
    let mut exec = Exec::start(&f.wt);
    for (tool, input) in [
        ("read_file", json!({"path": "pipe.rs"})),
        (
            "edit_file",
            json!({"path": "pipe.rs", "old_string": "a", "new_string": "b"}),
        ),
        ("grep", json!({"pattern": "x", "path": "pipe.rs"})),
        ("symbols", json!({"path": "pipe.rs"})),
    ] {
        let (is_error, content) = exec.call(tool, input);
        assert!(
            is_error && content.contains("not a regular file"),
            "{tool}: {content}"
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    let released = opened.load(Ordering::SeqCst);
    // Let the writer go either way, then judge.
    let _reader = std::os::unix::fs::OpenOptionsExt::custom_flags(
        std::fs::OpenOptions::new().read(true),
        libc::O_NONBLOCK,
    )
    .open(&fifo);
    writer.join().unwrap();
    assert!(!released, "a tool opened the FIFO for reading");
    assert!(exec.finish_within(Duration::from_secs(10)));
}

#[test]
fn entries_planted_at_guessed_temp_names_neither_block_a_write_nor_are_removed() {
    let f = fixture();
    std::fs::write(f.wt.join("a.txt"), "old\n").unwrap();
    let mut exec = Exec::start(&f.wt);
    let pid = exec.child.id();
    // What the temp names of this process would have been, planted as links to outside.
    let planted: Vec<PathBuf> = (0..50)
        .map(|n| f.wt.join(format!(".taskdaemon-write-{pid}-{n}.tmp")))
        .collect();
    for p in &planted {
        std::os::unix::fs::symlink(f.outside.join("secret.txt"), p).unwrap();
    }
    for round in 0..5 {
        let (is_error, content) = exec.call(
            "write_file",
            json!({"path": "a.txt", "content": format!("new {round}\n")}),
        );
        assert!(!is_error, "{content}");
    }
    assert_eq!(
        std::fs::read_to_string(f.wt.join("a.txt")).unwrap(),
        "new 4\n"
    );
    assert!(
        planted.iter().all(|p| p.is_symlink()),
        "a planted entry was removed"
    );
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        format!("{SECRET}\n")
    );
    assert!(exec.finish_within(Duration::from_secs(10)));
}
