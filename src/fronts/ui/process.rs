//! The dashboard of `taskdaemon run --ui`, served by a process of its own: the daemon starts
//! `taskdaemon ui --run-dir-from-stdin` (this binary), reads the address it prints, and
//! tells it the run directory once the record exists.
//!
//! Why a process and not a task of the daemon: the dashboard reads only the record's files
//! and the control socket, so nothing needs the daemon's memory; in a process of its own a
//! fault in the server cannot touch the run, and its work stays out of the daemon's address
//! space. That space is large in a big run, and the daemon forks it for every command: each
//! fork marks every page copy-on-write, so every thread of the daemon, a dashboard thread
//! too, pays page faults and TLB flushes for the pages it writes next. In a 1,000-loop run
//! (`benches/ui.rs`, perf) that made up about 40% of the dashboard follower's CPU.
//!
//! The child is in a process group of its own (Ctrl-C in the terminal asks the run to stop;
//! the dashboard stays until the daemon lets it go) and ends when its standard input closes:
//! when the daemon drops it, exits or is killed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// The hidden flag of `taskdaemon ui` that makes it the child described above.
pub const CHILD_FLAG: &str = "--run-dir-from-stdin";
/// How long the child may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the child may take to end once its input is closed, before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A dashboard process that listens; [`DashboardProcess::serve`] gives it the run.
pub struct DashboardProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    url: String,
}

impl DashboardProcess {
    /// Starts the dashboard process on 127.0.0.1:`port` (`0`: any free port) and waits for
    /// its address. An error says why it did not start (what it printed went to stderr).
    pub async fn start(port: u16) -> Result<DashboardProcess, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this program to start the dashboard: {e}"))?;
        let mut child = Command::new(exe)
            .args([
                "ui",
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                CHILD_FLAG,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start the dashboard: {e}"))?;
        let stdin = child.stdin.take();
        let Some(stdout) = child.stdout.take() else {
            return Err("cannot start the dashboard: its output is not readable".into());
        };
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(START_TIMEOUT, lines.next_line()).await;
        let url = match first {
            Ok(Ok(Some(line))) => line
                .strip_prefix("dashboard: ")
                .map(str::to_string)
                .ok_or_else(|| format!("the dashboard said {line:?} instead of its address"))?,
            Ok(Ok(None)) | Ok(Err(_)) => {
                // It ended (its reason is on stderr already): its exit code tells the rest.
                let status = child.wait().await.ok();
                return Err(match status.and_then(|s| s.code()) {
                    Some(1) => "the dashboard could not listen (see above)".to_string(),
                    Some(code) => format!("the dashboard ended at start with code {code}"),
                    None => "the dashboard ended at start".to_string(),
                });
            }
            Err(_) => {
                return Err(format!(
                    "the dashboard did not print its address within {}s",
                    START_TIMEOUT.as_secs()
                ));
            }
        };
        Ok(DashboardProcess { child, stdin, url })
    }

    /// The page's address.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Tells the dashboard which run directory to serve.
    pub async fn serve(&mut self, run_dir: &Path) -> Result<(), String> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err("the dashboard was stopped".into());
        };
        let Some(dir) = run_dir.to_str().filter(|d| !d.contains('\n')) else {
            return Err(format!(
                "the dashboard cannot be told the run directory {}: not UTF-8 on one line",
                run_dir.display()
            ));
        };
        let line = format!("{dir}\n");
        stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("the dashboard is gone: {e}"))?;
        stdin
            .flush()
            .await
            .map_err(|e| format!("the dashboard is gone: {e}"))
    }

    /// Ends the dashboard: closes its input, then kills it if it does not end by itself.
    pub async fn stop(mut self) {
        drop(self.stdin.take());
        if tokio::time::timeout(STOP_TIMEOUT, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// In the child: reads the run directory from standard input (one line), then resolves
/// `until_closed` when the input closes. `None` when the input closed before a directory
/// came (the daemon ended before its record existed).
pub async fn run_dir_from_stdin() -> Option<(std::path::PathBuf, tokio::sync::oneshot::Receiver<()>)>
{
    let (dir_tx, dir_rx) = tokio::sync::oneshot::channel();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    // A thread of its own: a blocking read of stdin would hold a runtime worker.
    let spawned = std::thread::Builder::new()
        .name("ui-parent".into())
        .spawn(move || {
            use std::io::BufRead;
            let stdin = std::io::stdin();
            let mut lock = stdin.lock();
            let mut line = String::new();
            match lock.read_line(&mut line) {
                Ok(n) if n > 0 && line.ends_with('\n') => {
                    let _ = dir_tx.send(std::path::PathBuf::from(line.trim_end_matches('\n')));
                }
                _ => return,
            }
            // Anything more is not expected; the end of the input is the daemon's leave.
            let mut rest = Vec::new();
            while lock.read_until(b'\n', &mut rest).is_ok_and(|n| n > 0) {
                rest.clear();
            }
            let _ = closed_tx.send(());
        });
    if let Err(e) = spawned {
        eprintln!("taskdaemon: the dashboard cannot read its input: {e}");
        return None;
    }
    let dir = dir_rx.await.ok()?;
    Some((dir, closed_rx))
}
