//! What the attack suites plant: a worktree with a directory outside it, FIFOs, a thread
//! that swaps two paths while calls run, and the victim loop of the run-record attacks.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The scripted model's turns for `victim`, the loop whose run record the record attacks go
/// after: it writes `victim.txt` and completes. An attack script is these followed by the
/// turns of `attacker`.
pub const VICTIM_TURNS: &str = r#"
victim:
  turns:
    - calls:
        - write_file: {path: victim.txt, content: "victim was here\n"}
        - complete_task: {summary: "done"}
"#;

/// A config that runs `victim`, then `attacker` once it is done, both in the repository
/// `repo` itself (`worktree: repo`) and played by the scripted model from `script.yml` beside
/// the config.
pub fn victim_and_attacker_config(repo: &Path) -> String {
    format!(
        "repo: {}\nllm: {{provider: scripted, script: script.yml}}\nloops:\n  - {{name: victim, type: code, task: Write., worktree: repo, validation: \"true\"}}\n  - {{name: attacker, type: code, task: Attack., worktree: repo, depends-on: [victim], validation: \"true\"}}\n",
        repo.display()
    )
}

/// Checks that the victim's part of the run record in `run_dir` is there and was neither
/// forged nor emptied by the attacker (`stderr`, the run's, is shown on failure).
pub fn assert_victim_record_intact(run_dir: &Path, stderr: &str) {
    for rel in [
        "loops/victim/receipts.jsonl",
        "loops/victim/transcript.jsonl",
        "summary.json",
        "events.jsonl",
    ] {
        let text = std::fs::read_to_string(run_dir.join(rel))
            .unwrap_or_else(|e| panic!("{rel}: {e}\n{stderr}"));
        assert!(
            !text.contains("forged"),
            "{rel} was changed by the attacker: {text}\n{stderr}"
        );
        assert!(!text.trim().is_empty(), "{rel} was emptied\n{stderr}");
    }
}

/// Checks that the run's receipt chain key (in `run_dir`) is a real key and never reached the
/// attacker's model: `transcript` is the attacker's.
pub fn assert_chain_key_kept_from(run_dir: &Path, transcript: &str) {
    let key = std::fs::read_to_string(run_dir.join("receipt-chain.key")).unwrap();
    let key = key.trim();
    assert!(key.len() >= 32, "{key}");
    assert!(
        !transcript.contains(key),
        "the chain key leaked: {transcript}"
    );
}

/// A temporary directory holding `wt/` (the worktree) and `outside/` beside it.
pub struct Fixture {
    _dir: tempfile::TempDir,
    /// The worktree (canonical).
    pub wt: PathBuf,
    /// A directory outside the worktree (canonical).
    pub outside: PathBuf,
}

/// A fresh [`Fixture`] with both directories empty.
pub fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let wt = root.join("wt");
    let outside = root.join("outside");
    std::fs::create_dir_all(&wt).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    Fixture {
        _dir: dir,
        wt,
        outside,
    }
}

/// Makes a FIFO at `path` (and its parent directories).
pub fn mkfifo(path: &Path) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

/// Threads that each swap a pair of paths (`renameat2(RENAME_EXCHANGE)`) in a loop, so that
/// each path is now the one, now the other, while calls run.
pub struct Swapping {
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Swapping {
    /// Starts one thread per pair.
    pub fn start(pairs: &[(PathBuf, PathBuf)]) -> Swapping {
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicUsize::new(0));
        let threads = pairs
            .iter()
            .map(|(a, b)| {
                let (a, b, stop, swaps) = (a.clone(), b.clone(), stop.clone(), swaps.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = rustix::fs::renameat_with(
                            rustix::fs::CWD,
                            &a,
                            rustix::fs::CWD,
                            &b,
                            rustix::fs::RenameFlags::EXCHANGE,
                        );
                        swaps.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Swapping {
            stop,
            swaps,
            threads,
        }
    }

    /// Stops and joins the threads; returns how many swaps they made.
    pub fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        self.swaps.load(Ordering::Relaxed)
    }
}
