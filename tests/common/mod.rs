//! Helpers shared by the integration tests: git repositories, and finding the processes a
//! confined command left.

// Each test crate uses part of this module.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

pub mod attack;
pub mod python_sdk;
pub mod tool_exec;

/// Runs git in `dir` with a fixed identity and no system config; panics with git's stderr
/// when it fails; returns its stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .current_dir(dir)
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

/// A git repository at `dir` with `files` committed on `main`.
pub fn init_repo(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, content) in files {
        std::fs::write(dir.join(name), content).unwrap();
    }
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "init"]);
}

/// Host pids of live (not zombie) processes whose command line contains `marker`. A confined
/// command lives in its own PID namespace, so the pids it could report (`$$`, `$!`) are not
/// the host's: tests give its processes a unique argument and look for that.
pub fn pids_with(marker: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        if String::from_utf8_lossy(&cmdline).contains(marker) && !state.starts_with(['Z', 'X']) {
            pids.push(pid);
        }
    }
    pids
}

/// A one-thread server on 127.0.0.1 that hands every connection to `serve` and keeps what
/// `serve` returns (a request seen, a token sent), until it is dropped. A panic in the
/// server thread would only stall the client, so tests check what was kept instead.
pub struct LocalServer<T: Send + 'static> {
    /// The port it listens on.
    pub port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<T>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<T: Send + 'static> LocalServer<T> {
    /// Starts serving.
    pub fn start(
        mut serve: impl FnMut(std::net::TcpStream) -> Option<T> + Send + 'static,
    ) -> LocalServer<T> {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (kept, stopping) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if let Some(item) = serve(stream) {
                            kept.lock().unwrap().push(item);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        });
        LocalServer {
            port,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// An OpenAI-style API root on this server.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// What `serve` kept so far.
    pub fn seen(&self) -> Vec<T>
    where
        T: Clone,
    {
        self.seen.lock().unwrap().clone()
    }
}

impl<T: Send + 'static> Drop for LocalServer<T> {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
