//! What the attack suites plant: a worktree with a directory outside it, FIFOs, and a thread
//! that swaps two paths while calls run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
