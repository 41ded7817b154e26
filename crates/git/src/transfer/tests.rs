//! Real git, real bundles: the head's repository, a host's mirror and worktree, and bundles
//! a hostile host (or head) makes by hand.

use super::*;
use crate::test_support::git_stdout;
use std::process::Command;

/// Every hook git may run around fetches, ref updates, commits and checkouts.
const HOOKS: &[&str] = &[
    "pre-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "post-checkout",
    "post-merge",
    "post-rewrite",
    "post-index-change",
    "reference-transaction",
    "pre-auto-gc",
    "pre-receive",
    "update",
    "post-receive",
    "post-update",
];

const CAP: u64 = 64 * 1024 * 1024;

struct Fx {
    tmp: tempfile::TempDir,
    /// The head's repository (a work tree on `main`).
    head: PathBuf,
}

impl Fx {
    /// A head repository on `main` with `history` commits, each adding a file of
    /// incompressible text (so that a bundle's size follows what it carries).
    fn new(history: usize) -> Fx {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("home")).unwrap();
        let head = tmp.path().join("head");
        std::fs::create_dir(&head).unwrap();
        let fx = Fx { tmp, head };
        fx.git(&fx.head, &["init", "--quiet", "-b", "main"]);
        for i in 0..history.max(1) {
            fx.commit_file(
                &fx.head,
                &format!("f{i}.txt"),
                &noise(i as u64, 4096),
                &format!("c{i}"),
            );
        }
        fx
    }

    fn env(&self) -> Vec<(String, PathBuf)> {
        vec![
            ("HOME".into(), self.tmp.path().join("home")),
            ("GIT_CONFIG_NOSYSTEM".into(), PathBuf::from("1")),
        ]
    }

    fn git(&self, dir: &Path, args: &[&str]) -> String {
        git_stdout(&mut self.cmd(dir, args), false)
    }

    fn cmd(&self, dir: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("git");
        c.args(["-c", "user.name=U", "-c", "user.email=u@example.com"])
            .args(args)
            .current_dir(dir)
            .envs(self.env());
        c
    }

    fn commit_file(&self, dir: &Path, file: &str, text: &str, message: &str) -> String {
        std::fs::write(dir.join(file), text).unwrap();
        self.git(dir, &["add", "-A"]);
        self.git(dir, &["commit", "--quiet", "-m", message]);
        self.git(dir, &["rev-parse", "HEAD"])
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    async fn repo(&self) -> Repo {
        Repo::open_with_env(&self.head, self.env()).await.unwrap()
    }

    async fn mirror(&self, name: &str) -> Mirror {
        Mirror::open_with_env(&self.path(name), self.env())
            .await
            .unwrap()
    }

    fn main_tip(&self) -> String {
        self.git(&self.head, &["rev-parse", "main"])
    }

    /// A host's own clone of the head (how a hostile host crafts its bundles), with a
    /// branch `loop` at `main`.
    fn host_clone(&self, name: &str) -> PathBuf {
        let dir = self.path(name);
        self.git(
            self.tmp.path(),
            &[
                "clone",
                "--quiet",
                self.head.to_str().unwrap(),
                dir.to_str().unwrap(),
            ],
        );
        self.git(&dir, &["checkout", "--quiet", "-b", "loop"]);
        dir
    }

    /// Every ref and every file of the repository's git dir (name, size): what must not
    /// change when a bundle is refused.
    fn state(&self, git_dir: &Path) -> (String, Vec<(PathBuf, u64)>) {
        let refs = git_stdout(
            &mut self.cmd(
                git_dir,
                &[
                    "--git-dir=.",
                    "for-each-ref",
                    "--format=%(refname) %(objectname)",
                ],
            ),
            false,
        );
        let mut files = Vec::new();
        let mut stack = vec![git_dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    files.push((p.clone(), p.metadata().unwrap().len()));
                }
            }
        }
        files.sort();
        (refs, files)
    }

    fn head_state(&self) -> (String, Vec<(PathBuf, u64)>) {
        self.state(&self.head.join(".git"))
    }

    /// Hooks in the head's repository (and in a `core.hooksPath` its config names) that
    /// leave a flag file when any of them runs.
    fn install_hooks(&self) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let flag = self.path("hook-ran");
        let custom = self.path("custom-hooks");
        std::fs::create_dir_all(&custom).unwrap();
        for dir in [self.head.join(".git/hooks"), custom.clone()] {
            std::fs::create_dir_all(&dir).unwrap();
            for hook in HOOKS {
                let path = dir.join(hook);
                std::fs::write(
                    &path,
                    format!("#!/bin/sh\necho {hook} >> '{}'\n", flag.display()),
                )
                .unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        self.git(
            &self.head,
            &["config", "core.hooksPath", custom.to_str().unwrap()],
        );
        flag
    }
}

/// `len` bytes of hex text that does not compress, different for each `seed`.
fn noise(seed: u64, len: usize) -> String {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut s = String::with_capacity(len);
    while s.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!("{x:016x}"));
    }
    s.truncate(len);
    s
}

/// The bundle `bytes` with the ref line `old` renamed `new` (the pack is left as it is).
fn rename_ref(bytes: &[u8], old: &str, new: &[u8]) -> Vec<u8> {
    let needle = format!(" {old}\n").into_bytes();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap();
    let mut out = bytes[..at + 1].to_vec();
    out.extend_from_slice(new);
    out.push(b'\n');
    out.extend_from_slice(&bytes[at + needle.len()..]);
    out
}

/// A commit object git's checks refuse (an author line without a date), on `parent`.
fn malformed_commit(fx: &Fx, dir: &Path, parent: &str) -> String {
    let tree = fx.git(dir, &["rev-parse", &format!("{parent}^{{tree}}")]);
    let body = format!(
        "tree {tree}\nparent {parent}\nauthor bad <x> notadate\ncommitter c <c@d> 1 +0000\n\nbad\n"
    );
    let path = fx.path("bad-commit");
    std::fs::write(&path, body).unwrap();
    fx.git(
        dir,
        &[
            "hash-object",
            "-t",
            "commit",
            "--literally",
            "-w",
            path.to_str().unwrap(),
        ],
    )
}

/// A commit on `parent` whose tree holds an entry named `.git` (checking it out would
/// write into the repository's own directory; git's checks call it `hasDotgit`).
fn dotgit_commit(fx: &Fx, dir: &Path, parent: &str) -> String {
    let blob = fx.git(dir, &["hash-object", "-w", "--stdin"]);
    let list = fx.path("mktree");
    std::fs::write(&list, format!("100644 blob {blob}\t.git\n")).unwrap();
    let mut c = fx.cmd(dir, &["mktree", "--missing"]);
    c.stdin(std::fs::File::open(&list).unwrap());
    let tree = git_stdout(&mut c, false);
    fx.git(dir, &["commit-tree", &tree, "-p", parent, "-m", "dotgit"])
}

/// Takes `bundle` into `refs/taskdaemon/incoming/l` on `base`, expecting a refusal whose
/// reason contains `want`, and the head's repository left exactly as it was.
async fn assert_head_refuses(fx: &Fx, bundle: &Path, base: &str, want: &str) {
    let repo = fx.repo().await;
    let before = fx.head_state();
    let err = take_branch(&repo, bundle, base, "refs/taskdaemon/incoming/l", CAP)
        .await
        .unwrap_err();
    match &err {
        TransferError::Refused { reason, .. } => {
            assert!(reason.contains(want), "reason {reason:?} lacks {want:?}")
        }
        other => panic!("expected a refusal for {want:?}, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("nothing was changed"), "{msg}");
    assert_eq!(fx.head_state(), before, "the head's repository changed");
}

/// Receives `bundle` expecting `tip`, expecting a refusal whose reason contains `want`,
/// and the mirror left exactly as it was.
async fn assert_mirror_refuses(fx: &Fx, mirror: &Mirror, bundle: &Path, tip: &str, want: &str) {
    let before = fx.state(mirror.dir());
    let err = mirror.receive(bundle, tip, CAP).await.unwrap_err();
    match &err {
        TransferError::Refused { reason, .. } => {
            assert!(reason.contains(want), "reason {reason:?} lacks {want:?}")
        }
        other => panic!("expected a refusal for {want:?}, got {other:?}"),
    }
    assert_eq!(fx.state(mirror.dir()), before, "the mirror changed");
}

/// A host's loop branch with `n` commits on the head's `main`, bundled `base..loop` by the
/// host's own clone: (the bundle, the base, the tip).
fn host_bundle(fx: &Fx, name: &str, n: usize) -> (PathBuf, String, String) {
    let base = fx.main_tip();
    let host = fx.host_clone(name);
    for i in 0..n {
        fx.commit_file(
            &host,
            &format!("loop{i}.txt"),
            "work\n",
            &format!("loop {i}"),
        );
    }
    let tip = fx.git(&host, &["rev-parse", "HEAD"]);
    let bundle = fx.path(&format!("{name}.bundle"));
    fx.git(
        &host,
        &[
            "bundle",
            "create",
            bundle.to_str().unwrap(),
            "refs/heads/loop",
            &format!("^{base}"),
        ],
    );
    (bundle, base, tip)
}

#[tokio::test]
async fn a_loop_round_trip_lands_exactly_its_commits_on_the_ref_and_runs_no_hook() {
    let fx = Fx::new(5);
    let flag = fx.install_hooks();
    let repo = fx.repo().await;
    let base = fx.main_tip();
    let refs_before = fx.git(
        &fx.head,
        &["for-each-ref", "--format=%(refname) %(objectname)"],
    );

    // Head → host.
    let to_host = fx.path("to-host.bundle");
    let info = bundle_commits(&repo, &base, &[], &to_host)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.tip, base);
    assert!(info.prerequisites.is_empty(), "{info:?}");
    assert_eq!(info.bytes, std::fs::metadata(&to_host).unwrap().len());
    let mirror = fx.mirror("mirror").await;
    assert!(!mirror.has(&base).await.unwrap());
    let got = mirror.receive(&to_host, &base, CAP).await.unwrap();
    assert_eq!(got, info);
    assert!(mirror.has(&base).await.unwrap());
    assert_eq!(mirror.commits().await.unwrap(), vec![base.clone()]);

    // The loop works on the host.
    let wt = mirror
        .add_worktree(&fx.path("wt/a"), "taskdaemon/r1/a", &base)
        .await
        .unwrap();
    assert_eq!(wt.head_commit().await.unwrap(), base);
    assert!(wt.path().join("f0.txt").is_file());
    std::fs::write(wt.path().join("new.txt"), "one\n").unwrap();
    let c1 = wt.commit_all("first").await.unwrap().unwrap();
    std::fs::write(wt.path().join("new.txt"), "two\n").unwrap();
    let c2 = wt.commit_all("second").await.unwrap().unwrap();
    // Asked again, the same worktree.
    let again = mirror
        .add_worktree(&fx.path("wt/a"), "taskdaemon/r1/a", &base)
        .await
        .unwrap();
    assert_eq!(again.path(), wt.path());

    // Host → head.
    let back = fx.path("back.bundle");
    let info = mirror
        .bundle_branch(&wt, &base, &back)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.tip, c2);
    assert_eq!(info.prerequisites, vec![base.clone()]);
    let into = "refs/taskdaemon/incoming/a";
    let tip = take_branch(&repo, &back, &base, into, CAP).await.unwrap();
    assert_eq!(tip, c2);
    assert_eq!(
        fx.git(&fx.head, &["rev-list", &format!("{base}..{into}")]),
        format!("{c2}\n{c1}")
    );
    // The one ref is new; every other ref is as it was.
    let refs_after = fx.git(
        &fx.head,
        &["for-each-ref", "--format=%(refname) %(objectname)"],
    );
    let mut expected: Vec<String> = refs_before.lines().map(str::to_string).collect();
    expected.push(format!("{into} {c2}"));
    expected.sort();
    let mut after: Vec<String> = refs_after.lines().map(str::to_string).collect();
    after.sort();
    assert_eq!(after, expected);
    // The landed history checks out on the head.
    fx.git(&fx.head, &["fsck", "--no-dangling", "--strict"]);
    assert_eq!(
        fx.git(&fx.head, &["show", &format!("{into}:new.txt")]),
        "two"
    );
    assert!(
        !flag.exists(),
        "a hook ran: {:?}",
        std::fs::read_to_string(&flag)
    );

    // A loop that committed nothing has nothing to send.
    let idle = mirror
        .add_worktree(&fx.path("wt/b"), "taskdaemon/r1/b", &base)
        .await
        .unwrap();
    assert_eq!(
        mirror
            .bundle_branch(&idle, &base, &fx.path("idle.bundle"))
            .await
            .unwrap(),
        None
    );
    assert!(!fx.path("idle.bundle").exists());
    // Removed, with its branch; the other loop's branch stays when asked.
    mirror.remove_worktree(&idle, false).await.unwrap();
    mirror.remove_worktree(&wt, true).await.unwrap();
    assert!(!idle.path().exists() && !wt.path().exists());
    let branches = fx.git(mirror.dir(), &["--git-dir=.", "branch", "--list"]);
    assert_eq!(branches, "taskdaemon/r1/a");
}

#[tokio::test]
async fn a_second_loop_gets_only_the_new_commits() {
    let fx = Fx::new(40);
    let repo = fx.repo().await;
    let mirror = fx.mirror("mirror").await;
    let base1 = fx.main_tip();
    let first = fx.path("first.bundle");
    let b1 = bundle_commits(&repo, &base1, &mirror.commits().await.unwrap(), &first)
        .await
        .unwrap()
        .unwrap();
    mirror.receive(&first, &base1, CAP).await.unwrap();
    // The first loop's work comes back and is merged on the head, which moves on.
    let wt = mirror
        .add_worktree(&fx.path("wt/one"), "taskdaemon/r1/one", &base1)
        .await
        .unwrap();
    std::fs::write(wt.path().join("one.txt"), noise(1000, 2048)).unwrap();
    wt.commit_all("loop one").await.unwrap().unwrap();
    let back = fx.path("back.bundle");
    mirror
        .bundle_branch(&wt, &base1, &back)
        .await
        .unwrap()
        .unwrap();
    take_branch(&repo, &back, &base1, "refs/taskdaemon/incoming/one", CAP)
        .await
        .unwrap();
    fx.git(
        &fx.head,
        &[
            "merge",
            "--quiet",
            "--ff-only",
            "refs/taskdaemon/incoming/one",
        ],
    );
    fx.commit_file(&fx.head, "user.txt", &noise(2000, 2048), "user work");
    let base2 = fx.main_tip();

    let second = fx.path("second.bundle");
    let have = mirror.commits().await.unwrap();
    let b2 = bundle_commits(&repo, &base2, &have, &second)
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "bundle sizes: first loop {} bytes ({} commits of history), second loop {} bytes (prerequisites {:?})",
        b1.bytes, 40, b2.bytes, b2.prerequisites
    );
    assert!(
        b2.bytes * 10 < b1.bytes,
        "second {} not much smaller than first {}",
        b2.bytes,
        b1.bytes
    );
    // Its prerequisite is the loop's commit the mirror already holds.
    assert_eq!(b2.prerequisites.len(), 1);
    assert!(have.contains(&b2.prerequisites[0]));
    mirror.receive(&second, &base2, CAP).await.unwrap();
    assert!(mirror.has(&base2).await.unwrap());
    // Nothing to send when the host already has the tip.
    let have = mirror.commits().await.unwrap();
    assert_eq!(
        bundle_commits(&repo, &base2, &have, &fx.path("none.bundle"))
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn the_head_refuses_a_bundle_with_another_ref() {
    let fx = Fx::new(2);
    // The head has a branch `release`; the host sends it moved, next to the loop's branch.
    fx.git(&fx.head, &["branch", "release"]);
    let base = fx.main_tip();
    let host = fx.host_clone("host");
    fx.commit_file(&host, "loop.txt", "work\n", "loop");
    fx.git(
        &host,
        &["checkout", "--quiet", "-b", "release", "origin/release"],
    );
    fx.commit_file(&host, "evil.txt", "evil\n", "evil");
    let bundle = fx.path("two.bundle");
    fx.git(
        &host,
        &[
            "bundle",
            "create",
            bundle.to_str().unwrap(),
            "refs/heads/loop",
            "refs/heads/release",
            &format!("^{base}"),
        ],
    );
    assert_head_refuses(&fx, &bundle, &base, "2 refs").await;
}

#[tokio::test]
async fn the_head_refuses_unrelated_history() {
    let fx = Fx::new(2);
    let base = fx.main_tip();
    let other = fx.path("other");
    std::fs::create_dir(&other).unwrap();
    fx.git(&other, &["init", "--quiet", "-b", "loop"]);
    fx.commit_file(&other, "x.txt", "unrelated\n", "root");
    fx.commit_file(&other, "y.txt", "unrelated\n", "more");
    let bundle = fx.path("unrelated.bundle");
    fx.git(
        &other,
        &[
            "bundle",
            "create",
            bundle.to_str().unwrap(),
            "refs/heads/loop",
        ],
    );
    assert_head_refuses(&fx, &bundle, &base, "does not descend").await;

    // The same history merged onto a loop commit descends from the base, and still brings
    // a root commit of its own.
    let host = fx.host_clone("host");
    fx.commit_file(&host, "loop.txt", "work\n", "loop");
    fx.git(
        &host,
        &[
            "fetch",
            "--quiet",
            other.to_str().unwrap(),
            "loop:unrelated",
        ],
    );
    fx.git(
        &host,
        &[
            "merge",
            "--quiet",
            "--allow-unrelated-histories",
            "-m",
            "graft",
            "unrelated",
        ],
    );
    let grafted = fx.path("grafted.bundle");
    fx.git(
        &host,
        &[
            "bundle",
            "create",
            grafted.to_str().unwrap(),
            "refs/heads/loop",
            &format!("^{base}"),
        ],
    );
    assert_head_refuses(&fx, &grafted, &base, "root commit").await;
}

#[tokio::test]
async fn the_head_refuses_a_bundle_over_the_cap_before_reading_it() {
    let fx = Fx::new(2);
    let (bundle, base, _) = host_bundle(&fx, "host", 1);
    let repo = fx.repo().await;
    let size = std::fs::metadata(&bundle).unwrap().len();
    let before = fx.head_state();
    let err = take_branch(
        &repo,
        &bundle,
        &base,
        "refs/taskdaemon/incoming/l",
        size - 1,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, TransferError::TooBig { bytes, max, .. } if bytes == size && max == size - 1),
        "{err:?}"
    );
    // A sparse file of 64 GiB: refused from its size alone (reading it would take minutes).
    let huge = fx.path("huge.bundle");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(64 << 30)
        .unwrap();
    let started = std::time::Instant::now();
    let err = take_branch(&repo, &huge, &base, "refs/taskdaemon/incoming/l", 1 << 20)
        .await
        .unwrap_err();
    assert!(
        matches!(err, TransferError::TooBig { bytes, .. } if bytes == 64 << 30),
        "{err:?}"
    );
    assert!(err.to_string().contains("over the cap"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(fx.head_state(), before);
}

#[tokio::test]
async fn the_head_refuses_what_is_not_a_bundle() {
    let fx = Fx::new(2);
    let base = fx.main_tip();
    let text = fx.path("text.bundle");
    std::fs::write(&text, "hello, I am a bundle\n").unwrap();
    assert_head_refuses(&fx, &text, &base, "not a git bundle").await;
    let empty = fx.path("empty.bundle");
    std::fs::write(&empty, "").unwrap();
    assert_head_refuses(&fx, &empty, &base, "empty").await;
    // A header and no pack.
    let (good, base, _) = host_bundle(&fx, "host", 1);
    let bytes = std::fs::read(&good).unwrap();
    let at = bytes.windows(5).position(|w| w == b"\nPACK").unwrap();
    let headless = fx.path("headless.bundle");
    std::fs::write(&headless, &bytes[..at + 1]).unwrap();
    assert_head_refuses(&fx, &headless, &base, "no pack").await;
    // A cut pack.
    let cut = fx.path("cut.bundle");
    std::fs::write(&cut, &bytes[..bytes.len() - 30]).unwrap();
    assert_head_refuses(&fx, &cut, &base, "pack does not pass").await;
    // A directory, and a FIFO nobody writes to (which must not hang the head).
    let dir = fx.path("dir.bundle");
    std::fs::create_dir(&dir).unwrap();
    assert_head_refuses(&fx, &dir, &base, "not a regular file").await;
    let fifo = fx.path("fifo.bundle");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        assert_head_refuses(&fx, &fifo, &base, "not a regular file"),
    )
    .await
    .expect("a FIFO hung the transfer");
}

#[tokio::test]
async fn the_head_refuses_malformed_objects() {
    let fx = Fx::new(2);
    let base = fx.main_tip();
    let host = fx.host_clone("host");
    for (name, make) in [
        (
            "bad-date",
            malformed_commit as fn(&Fx, &Path, &str) -> String,
        ),
        ("dotgit", dotgit_commit),
    ] {
        let commit = make(&fx, &host, &base);
        fx.git(&host, &["update-ref", "refs/heads/loop", &commit]);
        let bundle = fx.path(&format!("{name}.bundle"));
        fx.git(
            &host,
            &[
                "bundle",
                "create",
                bundle.to_str().unwrap(),
                "refs/heads/loop",
                &format!("^{base}"),
            ],
        );
        assert_head_refuses(&fx, &bundle, &base, "pack does not pass").await;
    }
}

#[tokio::test]
async fn the_head_refuses_ref_names_with_dots_or_control_characters() {
    let fx = Fx::new(2);
    let (good, base, _) = host_bundle(&fx, "host", 1);
    let bytes = std::fs::read(&good).unwrap();
    for (i, (name, want)) in [
        (&b"refs/heads/a..b"[..], "`..`"),
        (b"refs/heads/../../HEAD", "`..`"),
        (b"refs/heads/a\x1b[31mred", "control"),
        (b"refs/heads/a\rb", "control"),
        (b"HEAD", "not under"),
        (b"refs/heads/a b", "git does not accept"),
        (b"refs/heads/x.lock", "git does not accept"),
    ]
    .into_iter()
    .enumerate()
    {
        let bundle = fx.path(&format!("name{i}.bundle"));
        std::fs::write(&bundle, rename_ref(&bytes, "refs/heads/loop", name)).unwrap();
        assert_head_refuses(&fx, &bundle, &base, want).await;
    }
}

#[tokio::test]
async fn the_head_refuses_prerequisites_it_lacks_or_the_base_does_not_reach() {
    let fx = Fx::new(2);
    let base = fx.main_tip();
    // A commit only the host has, and the loop's work on it.
    let host = fx.host_clone("host");
    let private = fx.commit_file(&host, "private.txt", "host only\n", "private");
    fx.commit_file(&host, "loop.txt", "work\n", "loop");
    let lacking = fx.path("lacking.bundle");
    fx.git(
        &host,
        &[
            "bundle",
            "create",
            lacking.to_str().unwrap(),
            "refs/heads/loop",
            &format!("^{private}"),
        ],
    );
    assert_head_refuses(&fx, &lacking, &base, "does not have").await;

    // A commit the head has on another branch, which the loop's base does not reach.
    fx.git(&fx.head, &["checkout", "--quiet", "-b", "other"]);
    let other = fx.commit_file(&fx.head, "other.txt", "other\n", "other");
    fx.git(&fx.head, &["checkout", "--quiet", "main"]);
    let host2 = fx.host_clone("host2");
    fx.git(&host2, &["reset", "--quiet", "--hard", &other]);
    fx.commit_file(&host2, "loop.txt", "work\n", "loop");
    let sideways = fx.path("sideways.bundle");
    fx.git(
        &host2,
        &[
            "bundle",
            "create",
            sideways.to_str().unwrap(),
            "refs/heads/loop",
            &format!("^{other}"),
        ],
    );
    assert_head_refuses(&fx, &sideways, &base, "does not reach").await;
}

#[tokio::test]
async fn take_branch_refuses_bad_arguments_without_reading_the_bundle() {
    let fx = Fx::new(2);
    let (bundle, base, _) = host_bundle(&fx, "host", 1);
    let repo = fx.repo().await;
    for (b, into, what) in [
        ("main", "refs/taskdaemon/incoming/l", "base commit"),
        (
            &"0".repeat(40)[..],
            "refs/taskdaemon/incoming/l",
            "base commit",
        ),
        (&base[..], "incoming", "ref"),
        (&base[..], "refs/heads/a..b", "ref"),
        (&base[..], "refs/heads/main", "ref"),
    ] {
        let err = take_branch(&repo, &bundle, b, into, CAP).await.unwrap_err();
        assert!(
            matches!(&err, TransferError::Invalid { what: w, .. } if *w == what),
            "{b} {into}: {err:?}"
        );
    }
}

#[tokio::test]
async fn the_mirror_refuses_a_wrong_tip_extra_refs_and_missing_prerequisites() {
    let fx = Fx::new(3);
    let repo = fx.repo().await;
    let mirror = fx.mirror("mirror").await;
    let base = fx.main_tip();
    let full = fx.path("full.bundle");
    bundle_commits(&repo, &base, &[], &full)
        .await
        .unwrap()
        .unwrap();
    // The head said it sends main~1; the bundle holds main.
    let older = fx.git(&fx.head, &["rev-parse", "main~1"]);
    assert_mirror_refuses(&fx, &mirror, &full, &older, "not the expected").await;

    // Two refs.
    fx.git(&fx.head, &["branch", "side", "main~1"]);
    let two = fx.path("two.bundle");
    fx.git(
        &fx.head,
        &["bundle", "create", two.to_str().unwrap(), "main", "side"],
    );
    assert_mirror_refuses(&fx, &mirror, &two, &base, "2 refs").await;

    // An incremental bundle sent to a mirror without its prerequisite.
    let incremental = fx.path("incremental.bundle");
    bundle_commits(&repo, &base, std::slice::from_ref(&older), &incremental)
        .await
        .unwrap()
        .unwrap();
    assert_mirror_refuses(&fx, &mirror, &incremental, &base, "does not have").await;

    // Malformed objects, and what is not a bundle.
    let bad = malformed_commit(&fx, &fx.head, &base);
    fx.git(&fx.head, &["update-ref", "refs/heads/bad", &bad]);
    let malformed = fx.path("malformed.bundle");
    fx.git(
        &fx.head,
        &[
            "bundle",
            "create",
            malformed.to_str().unwrap(),
            "refs/heads/bad",
        ],
    );
    assert_mirror_refuses(&fx, &mirror, &malformed, &bad, "pack does not pass").await;
    let text = fx.path("text.bundle");
    std::fs::write(&text, "not a bundle\n").unwrap();
    assert_mirror_refuses(&fx, &mirror, &text, &base, "not a git bundle").await;
    let before = fx.state(mirror.dir());
    let err = mirror.receive(&full, &base, 100).await.unwrap_err();
    assert!(matches!(err, TransferError::TooBig { .. }), "{err:?}");
    assert_eq!(fx.state(mirror.dir()), before);

    // And the right one is taken.
    mirror.receive(&full, &base, CAP).await.unwrap();
    assert!(mirror.has(&base).await.unwrap());
}

#[tokio::test]
async fn a_mirror_directory_holding_something_else_is_refused() {
    let fx = Fx::new(1);
    let dir = fx.path("busy");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine\n").unwrap();
    let err = Mirror::open_with_env(&dir, fx.env()).await.unwrap_err();
    assert!(matches!(err, TransferError::NotAMirror { .. }), "{err:?}");
    // An existing mirror opens again.
    let m = fx.mirror("m").await;
    let again = fx.mirror("m").await;
    assert_eq!(m.dir(), again.dir());
}

#[tokio::test]
async fn bundle_commits_checks_what_the_host_says_it_has() {
    let fx = Fx::new(3);
    let repo = fx.repo().await;
    let tip = fx.main_tip();
    let out = fx.path("out.bundle");
    // Not an id: refused (it would reach git's command line).
    let err = bundle_commits(&repo, &tip, &["--all".to_string()], &out)
        .await
        .unwrap_err();
    assert!(matches!(err, TransferError::Invalid { .. }), "{err:?}");
    // An id the head does not have: skipped, and the bundle is whole.
    let info = bundle_commits(&repo, &tip, &["1".repeat(40)], &out)
        .await
        .unwrap()
        .unwrap();
    assert!(info.prerequisites.is_empty());
    // Too many.
    let many = vec!["1".repeat(40); MAX_HAVES + 1];
    let err = bundle_commits(&repo, &tip, &many, &out).await.unwrap_err();
    assert!(matches!(err, TransferError::Invalid { .. }), "{err:?}");
}

#[tokio::test]
async fn the_head_refuses_a_ref_that_is_no_new_commit() {
    let fx = Fx::new(2);
    let base = fx.main_tip();
    let host = fx.host_clone("host");
    // A ref at a tree (a bundle may name any object).
    fx.commit_file(&host, "loop.txt", "work\n", "loop");
    let tree = fx.git(&host, &["rev-parse", "HEAD^{tree}"]);
    fx.git(&host, &["update-ref", "refs/tags/t", &tree]);
    let at_tree = fx.path("tree.bundle");
    fx.git(
        &host,
        &["bundle", "create", at_tree.to_str().unwrap(), "refs/tags/t"],
    );
    assert_head_refuses(&fx, &at_tree, &base, "not a commit").await;
    // A ref at the base itself (the header of a real bundle, its tip replaced).
    let (good, base, tip) = host_bundle(&fx, "host2", 1);
    let text = std::fs::read(&good).unwrap();
    let needle = format!("{tip} refs/heads/loop\n").into_bytes();
    let at = text
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap();
    let mut forged = text[..at].to_vec();
    forged.extend_from_slice(format!("{base} refs/heads/loop\n").as_bytes());
    forged.extend_from_slice(&text[at + needle.len()..]);
    let at_base = fx.path("at-base.bundle");
    std::fs::write(&at_base, forged).unwrap();
    assert_head_refuses(&fx, &at_base, &base, "base itself").await;
}

/// The object formats `repo`'s and `mirror`'s handles give.
async fn formats_of(repo: &Repo, mirror: &Mirror) -> (ObjectFormat, ObjectFormat) {
    (
        repo_target(repo).object_format().await.unwrap(),
        mirror.target().object_format().await.unwrap(),
    )
}

#[tokio::test]
async fn a_repositorys_object_format_is_read_once_and_shared_by_its_handles() {
    let fx = Fx::new(1);
    let repo = fx.repo().await;
    let handle = repo.clone();
    let mirror = fx.mirror("mirror").await;
    let sha1 = (ObjectFormat::Sha1, ObjectFormat::Sha1);
    assert_eq!(formats_of(&repo, &mirror).await, sha1);
    // With HEAD gone git cannot tell any more; what was read is kept.
    for git_dir in [repo.common_dir.clone(), mirror.dir().to_path_buf()] {
        std::fs::rename(git_dir.join("HEAD"), git_dir.join("HEAD.away")).unwrap();
        let unread = Target {
            git: repo.git.clone(),
            git_dir: git_dir.clone(),
            format: KnownFormat::default(),
            lfs: Default::default(),
        };
        assert!(unread.object_format().await.is_err());
    }
    assert_eq!(formats_of(&handle, &mirror).await, sha1);
}

/// The pack `git pack-objects --stdout ARGS` writes in `dir` for `input` (object ids; or
/// revisions with `--revs`), as raw bytes.
fn pack_objects(fx: &Fx, dir: &Path, args: &[&str], input: &str) -> Vec<u8> {
    use std::io::Write;
    use std::process::Stdio;
    let mut c = fx.cmd(dir, &["pack-objects", "--stdout", "-q"]);
    c.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    // pack-objects reads its whole list before it writes: no deadlock.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "pack-objects: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A bundle written by hand, as a hostile host would: the prerequisite `base`, one ref
/// `refs/heads/loop` at `tip`, and `pack` (whatever it holds).
fn forged_bundle(fx: &Fx, name: &str, base: &str, tip: &str, pack: &[u8]) -> PathBuf {
    let mut bytes =
        format!("# v2 git bundle\n-{base} base\n{tip} refs/heads/loop\n\n").into_bytes();
    bytes.extend_from_slice(pack);
    let path = fx.path(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Panics unless `pack` is thin: it holds deltas against objects it does not carry (git
/// cannot index it alone).
fn assert_thin(fx: &Fx, pack: &[u8]) {
    let alone = fx.path("thin-check.git");
    let _ = std::fs::remove_dir_all(&alone);
    fx.git(
        fx.tmp.path(),
        &["init", "--quiet", "--bare", alone.to_str().unwrap()],
    );
    let file = fx.path("thin-check.pack");
    std::fs::write(&file, pack).unwrap();
    let mut c = fx.cmd(&alone, &["--git-dir=.", "index-pack", "--stdin"]);
    c.stdin(std::fs::File::open(&file).unwrap());
    let out = c.output().unwrap();
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unresolved"),
        "the pack is not thin: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A thin pack of `tip` (a commit on `base`) whose deltas may use the objects of `against`'s
/// tree, a commit `tip` does not descend from: pack-objects takes delta bases from the
/// commits its walk stops at, so a throwaway commit with `tip`'s tree on `against` makes
/// `against` one. The throwaway commit rides along in the pack.
fn thin_pack_against(fx: &Fx, dir: &Path, tip: &str, base: &str, against: &str) -> Vec<u8> {
    let tree = fx.git(dir, &["rev-parse", &format!("{tip}^{{tree}}")]);
    let lure = fx.git(dir, &["commit-tree", &tree, "-p", against, "-m", "lure"]);
    let pack = pack_objects(
        fx,
        dir,
        &["--revs", "--thin"],
        &format!("{lure}\n{tip}\n^{against}\n^{base}\n"),
    );
    assert_thin(fx, &pack);
    pack
}

/// A commit written byte by byte with `hash-object` (no check that its parents exist, so a
/// host can name commits it only knows the id of).
fn raw_commit(fx: &Fx, dir: &Path, tree: &str, parents: &[&str], message: &str) -> String {
    let mut body = format!("tree {tree}\n");
    for p in parents {
        body.push_str(&format!("parent {p}\n"));
    }
    body.push_str(&format!(
        "author U <u@example.com> 1700000000 +0000\ncommitter U <u@example.com> 1700000000 +0000\n\n{message}\n"
    ));
    let path = fx.path("raw-commit");
    std::fs::write(&path, body).unwrap();
    fx.git(
        dir,
        &["hash-object", "-t", "commit", "-w", path.to_str().unwrap()],
    )
}

/// A commit on the head's branch `other` (off `main`, which stays checked out): another
/// loop's tip or the user's own work, which no host was sent.
fn head_side_commit(fx: &Fx, file: &str, text: &str) -> String {
    fx.git(&fx.head, &["checkout", "--quiet", "-b", "other"]);
    let side = fx.commit_file(&fx.head, file, text, "side work");
    fx.git(&fx.head, &["checkout", "--quiet", "main"]);
    side
}

#[tokio::test]
async fn the_head_refuses_a_ref_at_a_commit_of_its_own_the_bundle_does_not_carry() {
    let fx = Fx::new(2);
    let base = fx.main_tip();
    let side = head_side_commit(&fx, "side.txt", "not the host's\n");
    // No object at all: the head's own commit, named by a host that only learned its id.
    let empty = pack_objects(&fx, &fx.head, &[], "");
    let bundle = forged_bundle(&fx, "empty.bundle", &base, &side, &empty);
    let want = format!("the commit {side}, which is not in its pack");
    assert_head_refuses(&fx, &bundle, &base, &want).await;
}

#[tokio::test]
async fn the_head_refuses_a_merge_of_a_commit_the_host_was_never_sent() {
    let fx = Fx::new(2);
    let base = fx.main_tip();
    // The host is made before the head's side branch: it knows the id only.
    let host = fx.host_clone("host");
    let side = head_side_commit(&fx, "side.txt", "not the host's\n");
    let work = fx.commit_file(&host, "loop.txt", "work\n", "loop");
    let tree = fx.git(&host, &["rev-parse", "HEAD^{tree}"]);
    let blob = fx.git(&host, &["rev-parse", "HEAD:loop.txt"]);
    let merge = raw_commit(&fx, &host, &tree, &[&work, &side], "merge");
    let pack = pack_objects(
        &fx,
        &host,
        &[],
        &format!("{merge}\n{work}\n{tree}\n{blob} loop.txt\n"),
    );
    let bundle = forged_bundle(&fx, "merge.bundle", &base, &merge, &pack);
    let want = format!("the commit {side}, which is not in its pack");
    assert_head_refuses(&fx, &bundle, &base, &want).await;
}

#[tokio::test]
async fn the_head_refuses_deltas_against_objects_the_base_does_not_reach() {
    let fx = Fx::new(2);
    let base = fx.main_tip();
    let secret = noise(7, 8192);
    let side = head_side_commit(&fx, "secret.txt", &secret);
    let host = fx.host_clone("host");
    // The loop's file is the head's side file and a line: packed as a delta against it.
    let tip = fx.commit_file(&host, "secret.txt", &format!("{secret}leak\n"), "leak");
    let pack = thin_pack_against(&fx, &host, &tip, &base, &side);
    let bundle = forged_bundle(&fx, "thin.bundle", &base, &tip, &pack);
    // The bases are the side commit's file and tree, which the host had no right to use.
    assert_head_refuses(
        &fx,
        &bundle,
        &base,
        "its pack holds deltas against the object",
    )
    .await;
}

#[tokio::test]
async fn the_head_takes_objects_and_delta_bases_the_base_reaches_outside_the_pack() {
    let fx = Fx::new(2);
    let (v1, v2) = (noise(50, 8192), noise(51, 8192));
    let old = fx.commit_file(&fx.head, "g.txt", &v1, "g v1");
    fx.commit_file(&fx.head, "g.txt", &v2, "g v2");
    let base = fx.main_tip();
    let repo = fx.repo().await;
    let host = fx.host_clone("host");

    // A real bundle, thin against the base's own tree (the usual case).
    let edited = fx.commit_file(&host, "g.txt", &format!("{v2}more\n"), "edit");
    let real = fx.path("real.bundle");
    fx.git(
        &host,
        &[
            "bundle",
            "create",
            real.to_str().unwrap(),
            "refs/heads/loop",
            &format!("^{base}"),
        ],
    );
    let into = "refs/taskdaemon/incoming/edit";
    assert_eq!(
        take_branch(&repo, &real, &base, into, CAP).await.unwrap(),
        edited
    );

    // A revert to older content, sent without the blob the base's history already holds
    // (as a host whose git walks with reachability bitmaps sends it).
    fx.git(&host, &["reset", "--quiet", "--hard", &base]);
    let reverted = fx.commit_file(&host, "g.txt", &v1, "revert");
    let tree = fx.git(&host, &["rev-parse", "HEAD^{tree}"]);
    let pack = pack_objects(&fx, &host, &[], &format!("{reverted}\n{tree}\n"));
    let bundle = forged_bundle(&fx, "revert.bundle", &base, &reverted, &pack);
    let into = "refs/taskdaemon/incoming/revert";
    take_branch(&repo, &bundle, &base, into, CAP).await.unwrap();
    assert_eq!(fx.git(&fx.head, &["show", &format!("{into}:g.txt")]), v1);

    // A delta against that older blob, in the base's history but not in its tree.
    fx.git(&host, &["reset", "--quiet", "--hard", &base]);
    let again = fx.commit_file(&host, "g.txt", &format!("{v1}again\n"), "again");
    let pack = thin_pack_against(&fx, &host, &again, &base, &old);
    let bundle = forged_bundle(&fx, "again.bundle", &base, &again, &pack);
    let into = "refs/taskdaemon/incoming/again";
    take_branch(&repo, &bundle, &base, into, CAP).await.unwrap();
    assert_eq!(
        fx.git(&fx.head, &["show", &format!("{into}:g.txt")]),
        format!("{v1}again")
    );
    fx.git(&fx.head, &["fsck", "--no-dangling", "--strict"]);
}

/// A zlib stream of `data` in stored blocks (no compression: the tests need the format, not
/// the size).
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let mut blocks = data.chunks(0xffff).peekable();
    if blocks.peek().is_none() {
        out.extend([1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        let len = block.len() as u16;
        out.push(u8::from(blocks.peek().is_none()));
        out.extend(len.to_le_bytes());
        out.extend((!len).to_le_bytes());
        out.extend(block);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in data {
        a = (a + u32::from(byte)) % 65521;
        b = (b + a) % 65521;
    }
    out.extend(((b << 16) | a).to_be_bytes());
    out
}

/// A pack object's header: its type and inflated size.
fn object_header(out: &mut Vec<u8>, kind: u8, size: u64) {
    let mut byte = (kind << 4) | (size & 0x0f) as u8;
    let mut rest = size >> 4;
    while rest > 0 {
        out.push(byte | 0x80);
        byte = (rest & 0x7f) as u8;
        rest >>= 7;
    }
    out.push(byte);
}

/// A size in a delta's header (little-endian groups of 7 bits).
fn delta_size(out: &mut Vec<u8>, mut size: u64) {
    loop {
        let byte = (size & 0x7f) as u8;
        size >>= 7;
        if size == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A pack of two objects that inflate to far more than they weigh, as a hostile host can
/// send: a 64 KiB blob of zeros and a delta against it that copies it `copies` times (one
/// byte, `0x80`, per 64 KiB copied). Written by hand; the trailer's SHA-1 from `sha1sum`.
fn inflating_pack(fx: &Fx, copies: usize) -> Vec<u8> {
    const BASE: usize = 1 << 16;
    let mut delta = Vec::new();
    delta_size(&mut delta, BASE as u64);
    delta_size(&mut delta, (BASE * copies) as u64);
    delta.extend(std::iter::repeat_n(0x80u8, copies));
    let mut pack = b"PACK".to_vec();
    pack.extend(2u32.to_be_bytes());
    pack.extend(2u32.to_be_bytes());
    let base_at = pack.len();
    object_header(&mut pack, 3, BASE as u64);
    pack.extend(zlib_stored(&vec![0u8; BASE]));
    let delta_at = pack.len();
    object_header(&mut pack, 6, delta.len() as u64);
    // The distance back to the base, as OFS_DELTA writes it.
    let mut back = (delta_at - base_at) as u64;
    let mut offset = vec![(back & 0x7f) as u8];
    back >>= 7;
    while back > 0 {
        back -= 1;
        offset.push(0x80 | (back & 0x7f) as u8);
        back >>= 7;
    }
    offset.reverse();
    pack.extend(offset);
    pack.extend(zlib_stored(&delta));
    let path = fx.path("inflating.pack");
    std::fs::write(&path, &pack).unwrap();
    let out = Command::new("sha1sum").arg(&path).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let sum = text.split_whitespace().next().unwrap();
    pack.extend(hex_bytes(sum));
    pack
}

fn hex_bytes(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// Second review of the hosts (git side, #3): a pack of a few dozen KiB whose delta
/// inflates past what the head lets git use to index a bundle is refused, and git never
/// holds that much: without the bound, `index-pack` inflated it whole in memory (a 305 KB
/// pack peaked at 311 MB) before any check could refuse it.
#[tokio::test]
async fn the_head_refuses_a_pack_that_inflates_past_its_memory_bound() {
    let fx = Fx::new(1);
    let base = fx.main_tip();
    let copies = usize::try_from(crate::worktree::MAX_INDEX_MEMORY / (1 << 16)).unwrap() + 1;
    let pack = inflating_pack(&fx, copies);
    assert!(pack.len() < 256 * 1024, "{} bytes", pack.len());
    let tip = "1".repeat(40);
    let bundle = forged_bundle(&fx, "inflating.bundle", &base, &tip, &pack);
    assert_head_refuses(
        &fx,
        &bundle,
        &base,
        "needs more memory to index than the head gives git",
    )
    .await;
}

/// The id of `content` as a git-lfs object, and the pointer git-lfs writes for it.
fn lfs_pointer(content: &str) -> (String, String) {
    let oid = td_base::hash::sha256_hex(content.as_bytes());
    let text = format!(
        "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {}\n",
        content.len()
    );
    (oid, text)
}

/// What a host sends beside its branch's bundle: the git-lfs objects its new commits point
/// at that its mirror holds (git-lfs itself is not needed: the pointers and the storage are
/// written as git-lfs writes them), each once; not a pointer whose object it lacks, not the
/// base's, not a blob that only looks like a pointer in part.
#[tokio::test]
async fn a_branch_lists_the_lfs_objects_its_new_commits_point_at_that_the_mirror_holds() {
    let fx = Fx::new(1);
    let repo = fx.repo().await;
    let (old_oid, old_text) = lfs_pointer("in the base\n");
    fx.commit_file(&fx.head, "old.bin", &old_text, "base pointer");
    let base = fx.main_tip();
    let to_host = fx.path("to-host.bundle");
    bundle_commits(&repo, &base, &[], &to_host).await.unwrap();
    let mirror = fx.mirror("mirror").await;
    mirror.receive(&to_host, &base, CAP).await.unwrap();
    let wt = mirror
        .add_worktree(&fx.path("wt/a"), "taskdaemon/r1/a", &base)
        .await
        .unwrap();
    let (new_oid, new_text) = lfs_pointer("the loop's large file\n");
    let (lost_oid, lost_text) = lfs_pointer("nobody has this\n");
    std::fs::write(wt.path().join("new.bin"), &new_text).unwrap();
    std::fs::write(wt.path().join("copy.bin"), &new_text).unwrap();
    std::fs::write(wt.path().join("lost.bin"), &lost_text).unwrap();
    std::fs::write(wt.path().join("half.txt"), format!("{new_text}and more\n")).unwrap();
    let tip = wt.commit_all("pointers").await.unwrap().unwrap();
    // No LFS storage in the mirror: nothing, without asking git.
    assert!(mirror.lfs_objects(&base, &tip).await.unwrap().is_empty());
    let store = |oid: &str, content: &str| {
        let dir = fx
            .path("mirror")
            .join("lfs/objects")
            .join(&oid[..2])
            .join(&oid[2..4]);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(oid), content).unwrap();
        dir.join(oid)
    };
    let new_path = store(&new_oid, "the loop's large file\n");
    store(&old_oid, "in the base\n");
    let listed = mirror.lfs_objects(&base, &tip).await.unwrap();
    assert_eq!(
        listed,
        vec![lfs::LfsObject {
            pointer: lfs::LfsPointer {
                oid: new_oid,
                size: 22
            },
            path: new_path
        }]
    );
    assert!(listed.iter().all(|o| o.pointer.oid != lost_oid));
}

/// What the head sends a host before a loop's worktree is made: the git-lfs objects the
/// tree of the loop's base points at (in every directory, not only the last commit's
/// changes) that its storage holds, each once; and the host's mirror keeps one only when its
/// bytes hash to its id.
#[tokio::test]
async fn a_commits_tree_lists_the_lfs_objects_the_head_holds_and_a_mirror_takes_them() {
    let fx = Fx::new(1);
    let repo = fx.repo().await;
    let (top_oid, top_text) = lfs_pointer("at the top\n");
    let (deep_oid, deep_text) = lfs_pointer("deep down\n");
    let (lost_oid, lost_text) = lfs_pointer("nobody has this\n");
    fx.commit_file(&fx.head, "top.bin", &top_text, "top");
    fx.commit_file(&fx.head, "again.bin", &top_text, "the same object twice");
    std::fs::create_dir_all(fx.head.join("a/b")).unwrap();
    fx.commit_file(&fx.head, "a/b/deep.bin", &deep_text, "deep");
    fx.commit_file(&fx.head, "lost.bin", &lost_text, "lost");
    let base = fx.main_tip();
    // No LFS storage: nothing, without asking git.
    assert!(lfs::lfs_objects_at(&repo, &base).await.unwrap().is_empty());
    let store = |oid: &str, content: &str| {
        let dir = repo
            .common_dir
            .join("lfs/objects")
            .join(&oid[..2])
            .join(&oid[2..4]);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(oid), content).unwrap();
    };
    store(&top_oid, "at the top\n");
    store(&deep_oid, "deep down\n");
    let mut listed: Vec<String> = lfs::lfs_objects_at(&repo, &base)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.pointer.oid)
        .collect();
    listed.sort();
    let mut expected = vec![top_oid.clone(), deep_oid.clone()];
    expected.sort();
    assert_eq!(listed, expected);
    assert!(!listed.contains(&lost_oid));
    assert!(
        lfs::lfs_objects_at(&repo, "not-a-commit").await.is_err(),
        "an id is checked"
    );

    // The host's mirror takes them as the head takes a host's.
    let mirror = fx.mirror("mirror").await;
    let intake = mirror.lfs_intake(&fx.path("parts")).await.unwrap();
    let deep = lfs::LfsPointer {
        oid: deep_oid.clone(),
        size: 10,
    };
    assert!(!intake.holds(&deep));
    let forged = intake.take_chunk("w.1.base", &deep, 0, b"deep d0wn\n", |_| Ok(()));
    assert!(forged.unwrap_err().contains("refused"));
    assert!(!intake.holds(&deep));
    assert_eq!(
        intake.take_chunk("w.1.base", &deep, 0, b"deep ", |_| Ok(())),
        Ok(lfs::LfsReceived::Partly(5))
    );
    assert_eq!(
        intake.take_chunk("w.1.base", &deep, 5, b"down\n", |_| Ok(())),
        Ok(lfs::LfsReceived::Held)
    );
    assert!(intake.holds(&deep));
    assert_eq!(
        std::fs::read_to_string(
            fx.path("mirror")
                .join("lfs/objects")
                .join(&deep_oid[..2])
                .join(&deep_oid[2..4])
                .join(&deep_oid)
        )
        .unwrap(),
        "deep down\n"
    );
}

/// git-lfs keeps its objects where the config's `lfs.storage` says (relative to the git
/// directory, or absolute), and so do the head's listing and intake and a mirror's: an
/// object stored there is listed and one taken lands there, where git-lfs's smudge reads it.
#[tokio::test]
async fn lfs_objects_are_where_the_configs_lfs_storage_says() {
    let fx = Fx::new(1);
    // The head's repository keeps them beside its git directory; every other repository
    // of the user's (the mirror here) in one absolute place.
    fx.git(&fx.head, &["config", "lfs.storage", "../lfs-beside"]);
    let shared = fx.path("shared-lfs");
    std::fs::write(
        fx.path("home/.gitconfig"),
        format!("[lfs]\n\tstorage = {}\n", shared.display()),
    )
    .unwrap();
    let repo = fx.repo().await;
    let (oid, text) = lfs_pointer("kept elsewhere\n");
    fx.commit_file(&fx.head, "a.bin", &text, "pointer");
    let base = fx.main_tip();
    let beside = repo.common_dir.join("../lfs-beside/objects");
    let path = beside.join(&oid[..2]).join(&oid[2..4]).join(&oid);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "kept elsewhere\n").unwrap();
    let listed = lfs::lfs_objects_at(&repo, &base).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].path, path);
    let intake = lfs::LfsIntake::open(&repo, &fx.path("parts"))
        .await
        .unwrap();
    assert_eq!(intake.object_path(&oid), Some(path.clone()));

    let mirror = fx.mirror("mirror").await;
    let intake = mirror.lfs_intake(&fx.path("parts")).await.unwrap();
    let pointer = lfs::LfsPointer {
        oid: oid.clone(),
        size: 15,
    };
    assert_eq!(
        intake.take_chunk("w.1.base", &pointer, 0, b"kept elsewhere\n", |_| Ok(())),
        Ok(lfs::LfsReceived::Held)
    );
    let landed = shared
        .join("objects")
        .join(&oid[..2])
        .join(&oid[2..4])
        .join(&oid);
    assert_eq!(
        std::fs::read_to_string(&landed).ok().as_deref(),
        Some("kept elsewhere\n")
    );
}
