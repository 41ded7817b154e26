//! `taskdaemon host --join HEAD:PORT`: a worker host. It takes its work directory (one host
//! process per directory), joins the head with the shared secret, and stays until the run
//! ends (exit 0), the head is lost or refuses it (exit 1), or it is stopped (Ctrl-C or
//! SIGTERM: it tells the head it leaves, exit 130 or 143). While joined it runs the loops
//! the head sends it ([`super::host_loops`]).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use td_cluster::head::MAX_SLOTS;
use td_cluster::protocol::{HEAD_NAME, HOST_NAME_RULE, valid_host_name};
use td_cluster::{ClusterSecret, HostEnd, HostOptions, JoinError};

use crate::run::signals::StopSignals;

/// The lock file in a host's work directory.
pub const LOCK_FILE: &str = "host.lock";

/// Exit code: bad options (name, secret, work directory).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: refused, unreachable, or the head was lost.
pub const EXIT_FAILED: u8 = 1;

/// What `taskdaemon host` was asked.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The head's address.
    pub join: String,
    /// The host's name (default: this machine's host name).
    pub name: Option<String>,
    /// Where the host keeps its worktrees (default: `.taskdaemon/host-<name>`).
    pub workdir: Option<PathBuf>,
    /// Loops it offers to run at once (default: the head's `hosts.slots`).
    pub slots: Option<u32>,
    /// The file holding the shared secret.
    pub secret_file: Option<PathBuf>,
    /// The environment variable holding the shared secret.
    pub secret_env: Option<String>,
    /// How long connecting, the handshake and joining may each take.
    pub timeout: Duration,
    /// This machine's sccache (`--sccache`), for runs with a compiler cache.
    pub sccache: Option<PathBuf>,
    /// The checkout new worktrees are seeded from (`--warm-from`), for loops with `warm:`.
    pub warm_from: Option<PathBuf>,
}

/// This machine's host name, when it is a valid host name.
fn machine_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().split('.').next()?.to_string();
    (valid_host_name(&name) && name != HEAD_NAME).then_some(name)
}

/// The checked name.
fn host_name(asked: Option<&str>) -> Result<String, String> {
    let name = match asked {
        Some(n) => n.to_string(),
        None => machine_name().ok_or_else(|| {
            format!("this machine's host name is not a host name ({HOST_NAME_RULE}); give one with --name")
        })?,
    };
    if !valid_host_name(&name) {
        return Err(format!("--name {name:?}: a host name is {HOST_NAME_RULE}"));
    }
    if name == HEAD_NAME {
        return Err(format!(
            "--name {HEAD_NAME}: `{HEAD_NAME}` stands for the head itself in placement rules; choose another name"
        ));
    }
    Ok(name)
}

/// The work directory, made if missing, held by this process (its lock is released when the
/// process ends, however it ends).
fn take_workdir(dir: &Path) -> Result<File, String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot make the work directory {}: {e}", dir.display()))?;
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = holder.trim();
            return Err(format!(
                "another host process{} uses the work directory {}; give this one another --workdir",
                if holder.is_empty() {
                    String::new()
                } else {
                    format!(" (pid {holder})")
                },
                dir.display()
            ));
        }
        Err(TryLockError::Error(e)) => {
            return Err(format!("cannot lock {}: {e}", path.display()));
        }
    }
    // Who holds it, for the message above (the lock, not this number, is what counts).
    let _ = file.set_len(0);
    let _ = writeln!(file, "{}", std::process::id());
    Ok(file)
}

/// The shared secret from `--secret-file` or `--secret-env` (exactly one).
fn secret(options: &WorkerOptions) -> Result<ClusterSecret, String> {
    let secret = match (&options.secret_file, &options.secret_env) {
        (Some(file), None) => ClusterSecret::from_file(file),
        (None, Some(name)) => ClusterSecret::from_env(name),
        (Some(_), Some(_)) => {
            return Err("give --secret-file or --secret-env, not both".to_string());
        }
        (None, None) => {
            return Err(
                "the head's shared secret is needed: give --secret-file FILE (chmod 600) or --secret-env NAME"
                    .to_string(),
            );
        }
    };
    secret.map_err(|e| e.to_string())
}

/// Runs a worker host; returns the exit code. Messages go to stderr.
pub async fn run(options: WorkerOptions) -> u8 {
    let say = |line: &str| eprintln!("taskdaemon host: {}", td_base::secrets::redact(line));
    let name = match host_name(options.name.as_deref()) {
        Ok(n) => n,
        Err(e) => {
            say(&e);
            return EXIT_USAGE;
        }
    };
    if let Some(n) = options.slots
        && !(1..=MAX_SLOTS).contains(&n)
    {
        say(&format!(
            "--slots {n}: a host runs 1 to {MAX_SLOTS} loops at once"
        ));
        return EXIT_USAGE;
    }
    let secret = match secret(&options) {
        Ok(s) => s,
        Err(e) => {
            say(&e);
            return EXIT_USAGE;
        }
    };
    td_base::secrets::register("hosts secret", secret.expose());
    // Keys this machine's environment holds are redacted too (and kept from commands).
    td_base::secrets::register_environment(&[]);
    let workdir = options
        .workdir
        .clone()
        .unwrap_or_else(|| PathBuf::from(".taskdaemon").join(format!("host-{name}")));
    let _lock = match take_workdir(&workdir) {
        Ok(lock) => lock,
        Err(e) => {
            say(&e);
            return EXIT_USAGE;
        }
    };
    let workdir = std::fs::canonicalize(&workdir).unwrap_or(workdir);
    let mut signals = StopSignals::install();
    let (requests_tx, mut requests) = tokio::sync::mpsc::unbounded_channel();
    let joining = td_cluster::host::join(HostOptions {
        head: options.join.clone(),
        name: name.clone(),
        slots: options.slots,
        workdir: workdir.display().to_string(),
        secret,
        timeout: options.timeout,
        requests: Some(requests_tx),
    });
    let session = tokio::select! {
        joined = joining => match joined {
            Ok(s) => s,
            Err(e) => {
                say(&e.to_string());
                return match e {
                    JoinError::Node(_) => EXIT_USAGE,
                    _ => EXIT_FAILED,
                };
            }
        },
        signal = signals.next() => {
            say(&format!("stopped by {} before joining", signal.name()));
            return signal.exit_code();
        }
    };
    say(&format!(
        "joined the head at {} as {name} ({} slots; work directory {}); running the loops it sends until the run ends",
        session.head_addr,
        session.joined.slots,
        workdir.display()
    ));
    let secret_file = options
        .secret_file
        .as_ref()
        .map(|f| std::fs::canonicalize(f).unwrap_or_else(|_| f.clone()));
    let (loops, driver) = match super::host_loops::HostLoops::start(
        &workdir,
        session.link(),
        session.joined.slots,
        secret_file,
        super::host_loops::BuildState {
            sccache: options.sccache.clone(),
            warm_from: options.warm_from.clone(),
        },
    )
    .await
    {
        Ok(started) => started,
        Err(e) => {
            say(&e);
            return EXIT_FAILED;
        }
    };
    let serve = loops.clone();
    let serving = tokio::spawn(async move {
        while let Some(request) = requests.recv().await {
            serve.handle(request);
        }
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<String>();
    let mut signal_seen = None;
    let end = {
        let run = session.run(async move { stop_rx.await.unwrap_or_default() });
        tokio::pin!(run);
        let mut stop_tx = Some(stop_tx);
        loop {
            tokio::select! {
                end = &mut run => break end,
                signal = signals.next(), if stop_tx.is_some() => {
                    signal_seen = Some(signal);
                    if let Some(tx) = stop_tx.take() {
                        let _ = tx.send(format!("stopped by its user ({})", signal.name()));
                    }
                }
            }
        }
    };
    // The session is over: no request comes any more, and the loops' runtime stops (a
    // loop still running is stopped with it; the head marked it already).
    serving.abort();
    loops.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(10), driver).await;
    loops.stop_compiler_caches().await;
    match end {
        HostEnd::RunEnded(reason) => {
            say(&format!(
                "the head at {} says: {reason}; leaving",
                options.join
            ));
            0
        }
        HostEnd::HeadLost(reason) => {
            say(&format!("lost the head at {}: {reason}", options.join));
            EXIT_FAILED
        }
        HostEnd::Stopped => {
            say("stopped; the head was told");
            signal_seen.map_or(EXIT_FAILED, |s| s.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_head_is_taken() {
        assert_eq!(host_name(Some("b1")).unwrap(), "b1");
        let err = host_name(Some("b 1")).unwrap_err();
        assert!(err.contains("a host name is"), "{err}");
        let err = host_name(Some("head")).unwrap_err();
        assert!(err.contains("stands for the head itself"), "{err}");
    }

    #[test]
    fn a_work_directory_is_held_by_one_host_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let wd = dir.path().join("w");
        let first = take_workdir(&wd).unwrap();
        let err = take_workdir(&wd).unwrap_err();
        assert!(err.contains("another host process (pid"), "{err}");
        assert!(err.contains("another --workdir"), "{err}");
        drop(first);
        assert!(take_workdir(&wd).is_ok());
        // A file where the directory should be is an error, not a panic.
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(take_workdir(&file).is_err());
    }

    #[test]
    fn the_secret_comes_from_exactly_one_place() {
        let options = WorkerOptions {
            join: "h:1".into(),
            name: None,
            workdir: None,
            slots: None,
            secret_file: None,
            secret_env: None,
            timeout: Duration::from_secs(1),
            sccache: None,
            warm_from: None,
        };
        assert!(secret(&options).unwrap_err().contains("--secret-file FILE"));
        let both = WorkerOptions {
            secret_file: Some("f".into()),
            secret_env: Some("E".into()),
            ..options
        };
        assert!(secret(&both).unwrap_err().contains("not both"));
    }
}
