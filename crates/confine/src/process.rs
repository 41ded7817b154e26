//! The one launcher: every command a tool runs (`run_command`, `run_command_isolated`,
//! `build`, `test`, `validate`, a loop's validation) starts here, as `/bin/sh -c COMMAND`,
//! with stdin closed, stdout and stderr captured into bounded head+tail buffers while it
//! runs, and a timeout.
//!
//! A confined command ([`CommandOptions::confined`], what every tool uses) runs under the
//! policy of `crate`: no capabilities, Landlock, seccomp, its own PID and mount
//! namespaces (and network namespace in the no-net lane), a built environment. Its process
//! tree is `monitor -> init -> command` (see `confine::child`): when the command exits, times
//! out, is cancelled, or the daemon dies (even by SIGKILL), its init exits and the kernel
//! kills every process left in the namespace, also those that called `setsid` or
//! double-forked.
//!
//! Without confinement (benchmarks' baselines and the launcher's own tests) a command runs in
//! its own process group, which is killed at exit, timeout and drop; a process that left the
//! group on purpose is out of reach there, and its pipes are drained for at most
//! [`DRAIN_TIMEOUT`].
//!
//! Memory stays bounded whatever the command prints: each stream keeps at most its cap.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::Prepared;
use crate::child::{self, STATUS_RECORD_LEN};
use td_base::text::{HeadTailBuffer, head_tail};

/// How long pipes are still read after the process group is gone. Only a process that left
/// the group can keep a pipe open that long; its remaining output is not worth a hung call.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// How long to wait for the killed main process to be reaped before giving up on its status.
const REAP_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a confined command's status report may trail the exit of its monitor (it is
/// written before the init exits, so it is normally there already).
const REPORT_GRACE: Duration = Duration::from_millis(100);

/// Size of one read from a pipe: with the larger pipe below, a command that prints
/// gigabytes is read in few, large chunks.
const READ_CHUNK: usize = 256 * 1024;

/// Pipe capacity requested for stdout and stderr (Linux's default limit for unprivileged
/// processes is 1 MiB).
const PIPE_SIZE: libc::c_int = 1024 * 1024;

/// Room a rendered stream may take beyond its cap for the omission marker.
const MARKER_SLACK: usize = 64;

/// The shell every command runs in. An absolute path, so a model-set `PATH` cannot swap it.
const SHELL: &str = "/bin/sh";

/// What to run and under which limits.
#[derive(Debug)]
pub struct CommandOptions {
    command: String,
    cwd: PathBuf,
    timeout: Duration,
    max_bytes_per_stream: usize,
    env: Vec<(OsString, OsString)>,
    confinement: Option<Prepared>,
}

impl CommandOptions {
    /// `command` run by `/bin/sh -c` in `cwd`, with a 120 s timeout, 100 000 bytes kept per
    /// stream, unconfined, with the environment inherited.
    pub fn new(command: impl Into<String>, cwd: impl Into<PathBuf>) -> Self {
        Self {
            command: command.into(),
            cwd: cwd.into(),
            timeout: Duration::from_secs(120),
            max_bytes_per_stream: 100_000,
            env: Vec::new(),
            confinement: None,
        }
    }

    /// Kills the whole process group after `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Keeps at most `bytes` of each stream (half from the start, half from the end).
    pub fn max_bytes_per_stream(mut self, bytes: usize) -> Self {
        self.max_bytes_per_stream = bytes;
        self
    }

    /// Runs the command confined as `prepared` says (see `crate::prepare`), with
    /// `prepared`'s environment instead of the inherited one.
    pub fn confined(mut self, prepared: Prepared) -> Self {
        self.confinement = Some(prepared);
        self
    }

    /// Sets an environment variable on top of the inherited environment (unconfined
    /// commands; a confined one gets its whole environment from its policy).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// What was captured from one output stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCapture {
    /// The retained text (lossy UTF-8, never cut inside a character); when `truncated`, it
    /// holds the head and the tail with a `[... N bytes omitted ...]` marker between them.
    pub text: String,
    /// Every byte the command wrote to the stream.
    pub total_bytes: u64,
    /// Whether the middle was dropped.
    pub truncated: bool,
}

impl StreamCapture {
    fn from_buffer(buffer: &HeadTailBuffer, cap: usize) -> Self {
        let mut text = buffer.render();
        // Invalid UTF-8 renders as U+FFFD (3 bytes for 1), so binary output could outgrow
        // the cap; cut it again rather than break the bound callers rely on.
        if text.len() > cap + MARKER_SLACK {
            text = head_tail(&text, cap);
        }
        Self {
            text,
            total_bytes: buffer.total(),
            truncated: buffer.truncated(),
        }
    }
}

/// How a command ended and what it printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutput {
    /// Exit code when the shell exited normally; `None` when killed by a signal (also by
    /// the timeout) or when its status could not be collected.
    pub exit_code: Option<i32>,
    /// The signal that ended the shell, if any.
    pub signal: Option<i32>,
    /// Whether the timeout fired and killed the process group.
    pub timed_out: bool,
    /// Captured standard output.
    pub stdout: StreamCapture,
    /// Captured standard error.
    pub stderr: StreamCapture,
}

impl RunOutput {
    /// True when the command exited with code 0 within its timeout.
    pub fn success(&self) -> bool {
        !self.timed_out && self.exit_code == Some(0)
    }
}

/// Why a command could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The command text cannot be passed to a process (it contains a NUL byte).
    #[error("the command contains a NUL byte, which no process argument can hold")]
    InvalidCommand,
    /// The confinement could not be set up; the text says which step failed and why.
    #[error("the command could not be confined: {0}")]
    Confinement(String),
    /// Spawning or waiting for the shell failed.
    #[error("{action}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The underlying error.
        source: io::Error,
    },
}

/// Runs `options.command` to completion, timeout or cancellation. See the module docs for
/// what is guaranteed about child processes and memory.
pub async fn run(options: CommandOptions) -> Result<RunOutput, RunError> {
    if options.command.contains('\0') {
        return Err(RunError::InvalidCommand);
    }
    let mut command = shell_command(&options.command, &options.cwd);
    let mut status_socket: Option<UnixStream> = None;
    match options.confinement {
        Some(prepared) => status_socket = Some(confine(&mut command, prepared)?),
        None => {
            command.stdin(Stdio::null()).process_group(0);
            for (key, value) in &options.env {
                command.env(key, value);
            }
        }
    }
    let confined = status_socket.is_some();
    let spawned = command.spawn();
    // The command holds our copy of the launcher's end; it must not outlive the spawn.
    drop(command);
    let mut child = spawned.map_err(classify_spawn_error)?;
    let mut guard = GroupGuard {
        pgid: child.id().and_then(|id| libc::pid_t::try_from(id).ok()),
    };

    let cap = options.max_bytes_per_stream;
    let mut stdout_buf = HeadTailBuffer::new(cap);
    let mut stderr_buf = HeadTailBuffer::new(cap);
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    for fd in [
        stdout.as_ref().map(AsRawFd::as_raw_fd),
        stderr.as_ref().map(AsRawFd::as_raw_fd),
    ]
    .into_iter()
    .flatten()
    {
        enlarge_pipe(fd);
    }

    let (status, timed_out) = {
        let io = async {
            tokio::join!(pump(stdout, &mut stdout_buf), pump(stderr, &mut stderr_buf));
        };
        tokio::pin!(io);
        let deadline = tokio::time::sleep(options.timeout);
        tokio::pin!(deadline);
        let mut io_done = false;
        // A confined command's status comes from its init, which sends it once every process
        // of the namespace is dead: the call can end there, without waiting for the kernel to
        // tear the namespaces down (an RCU grace period, the bulk of a short command's cost).
        let report = reported_status(status_socket.take());
        tokio::pin!(report);
        let mut report_done = !confined;
        // Pipes are read while waiting, or a chatty command would block on a full pipe.
        let ended = loop {
            tokio::select! {
                status = child.wait() => break Ended::Leader(status),
                status = &mut report, if !report_done => match status {
                    Some(status) => break Ended::Reported(status),
                    // The init died without a word (killed): the leader's end will tell.
                    None => report_done = true,
                },
                () = &mut io, if !io_done => io_done = true,
                () = &mut deadline => break Ended::TimedOut,
            }
        };
        // Background jobs after a normal exit, the whole tree after a timeout: nothing in
        // the group may outlive the call. (On a report or a timeout the leader is not reaped
        // yet; after it exited, its id stays reserved while any member of its group lives,
        // so the kill cannot reach a stranger's group.)
        // A confined command whose monitor already exited left nothing: its init killed and
        // reaped the namespace, and the empty group's id may be reused by now.
        if !(confined && matches!(ended, Ended::Leader(_))) {
            guard.kill_group();
        }
        let timed_out = matches!(ended, Ended::TimedOut);
        let status = match ended {
            Ended::Reported(status) => Some(status),
            Ended::Leader(status) => {
                let leader = status.map_err(|source| RunError::Io {
                    action: "waiting for the command",
                    source,
                })?;
                // The init writes its report before it exits, so it is there unless the init
                // was killed.
                let reported = if report_done {
                    None
                } else {
                    tokio::time::timeout(REPORT_GRACE, &mut report)
                        .await
                        .ok()
                        .flatten()
                };
                Some(reported.unwrap_or(leader))
            }
            Ended::TimedOut => tokio::time::timeout(REAP_TIMEOUT, child.wait())
                .await
                .ok()
                .and_then(Result::ok),
        };
        // The leader may be reaped from now on (by `wait`, or by tokio once the child is
        // dropped), so its pid may be reused: the guard must not fire later.
        guard.disarm();
        if !io_done {
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, &mut io).await;
        }
        (status, timed_out)
    };

    Ok(RunOutput {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        timed_out,
        stdout: StreamCapture::from_buffer(&stdout_buf, cap),
        stderr: StreamCapture::from_buffer(&stderr_buf, cap),
    })
}

/// `/bin/sh -c command` in `cwd`, its output piped, killed when dropped.
pub(crate) fn shell_command(command: &str, cwd: &std::path::Path) -> tokio::process::Command {
    let mut shell = tokio::process::Command::new(SHELL);
    shell
        .arg("-c")
        .arg(command)
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    shell
}

/// Makes `command` start confined as `prepared` says, with `prepared`'s environment. Returns
/// the daemon's end of the socket whose other end is the monitor's fd 0: closing it (by
/// dropping it, or by dying) ends the command's namespace; the init reports the command's
/// status on it.
pub(crate) fn confine(
    command: &mut tokio::process::Command,
    prepared: Prepared,
) -> Result<UnixStream, RunError> {
    let (daemon_end, launcher_end) = UnixStream::pair().map_err(|source| RunError::Io {
        action: "creating the launcher's socket",
        source,
    })?;
    command
        .env_clear()
        .envs(prepared.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::from(OwnedFd::from(launcher_end)));
    let plan = Arc::new(prepared.plan);
    // SAFETY: `child::enter` only makes system calls on data prepared before the fork (the
    // plan), and allocates nothing.
    unsafe {
        command.pre_exec(move || child::enter(&plan));
    }
    Ok(daemon_end)
}

/// How the wait for a command ended.
enum Ended {
    /// The process the daemon started exited (unconfined: the command itself; confined: the
    /// monitor, so the command's own status may still be on the socket).
    Leader(io::Result<std::process::ExitStatus>),
    /// A confined command's init reported the command's status.
    Reported(std::process::ExitStatus),
    /// The timeout fired first.
    TimedOut,
}

/// The command's wait status as its init reports it on `socket`; `None` without a socket, or
/// when the socket closes (or breaks) before a whole record arrived.
async fn reported_status(socket: Option<UnixStream>) -> Option<std::process::ExitStatus> {
    use tokio::io::AsyncReadExt as _;
    let socket = socket?;
    socket.set_nonblocking(true).ok()?;
    let mut socket = tokio::net::UnixStream::from_std(socket).ok()?;
    let mut record = [0u8; STATUS_RECORD_LEN];
    socket.read_exact(&mut record).await.ok()?;
    if record[0] != b'S' {
        return None;
    }
    let raw = i32::from_le_bytes([record[4], record[5], record[6], record[7]]);
    Some(std::process::ExitStatus::from_raw(raw))
}

/// Reads `reader` to its end into `buffer`; a read error ends the stream (what was read
/// so far is kept).
async fn pump<R: AsyncRead + Unpin>(reader: Option<R>, buffer: &mut HeadTailBuffer) {
    let Some(mut reader) = reader else {
        return;
    };
    let mut chunk = vec![0u8; READ_CHUNK];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) => return,
            Ok(n) => buffer.push(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Asks for a larger pipe so a command that prints a lot is read in big chunks (fewer
/// wakeups and buffer pushes). Best effort: the kernel may cap or refuse it.
fn enlarge_pipe(fd: RawFd) {
    // SAFETY: F_SETPIPE_SZ on a pipe we own; failure leaves the pipe as it was.
    unsafe {
        libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_SIZE);
    }
}

/// Kills the command's process group when dropped, so a cancelled call leaves nothing behind.
struct GroupGuard {
    pgid: Option<libc::pid_t>,
}

impl GroupGuard {
    fn kill_group(&self) {
        if let Some(pgid) = self.pgid.filter(|&p| p > 0) {
            // SAFETY: killpg has no memory-safety preconditions; a group that is already
            // gone just yields ESRCH, which is the state we want.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }

    fn disarm(&mut self) {
        self.pgid = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill_group();
    }
}

fn classify_spawn_error(err: io::Error) -> RunError {
    if let Some(detail) = err.raw_os_error().and_then(child::describe) {
        return RunError::Confinement(detail);
    }
    RunError::Io {
        action: "starting /bin/sh",
        source: err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Instant;

    fn opts(command: &str, dir: &Path) -> CommandOptions {
        CommandOptions::new(command, dir).timeout(Duration::from_secs(20))
    }

    /// True once `pid` no longer runs: gone, or a zombie nobody reaped (PID 1 of a container
    /// may not reap orphans; a zombie holds no resources and runs nothing).
    fn pid_is_gone(pid: i32) -> bool {
        // SAFETY: signal 0 only checks for existence.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        if !alive {
            return io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        }
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                let state = s.rsplit(')').next().unwrap_or("").trim_start();
                state.starts_with('Z') || state.starts_with('X')
            })
            .unwrap_or(true)
    }

    async fn wait_gone(pid: i32) -> bool {
        for _ in 0..100 {
            if pid_is_gone(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fn read_pids(path: &Path) -> Vec<i32> {
        std::fs::read_to_string(path)
            .unwrap()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn captures_both_streams_and_the_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(opts("echo out; echo err >&2; exit 3", dir.path()))
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(3));
        assert_eq!(out.signal, None);
        assert!(!out.timed_out && !out.success());
        assert_eq!(out.stdout.text, "out\n");
        assert_eq!(out.stderr.text, "err\n");
        assert_eq!(out.stdout.total_bytes, 4);
        assert!(!out.stdout.truncated);
    }

    #[tokio::test]
    async fn runs_in_cwd_with_env_and_no_stdin() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let out = run(
            opts("pwd; echo $TD_X; cat; echo done", &dir.path().join("sub")).env("TD_X", "hello"),
        )
        .await
        .unwrap();
        let pwd = dir.path().join("sub").canonicalize().unwrap();
        assert_eq!(
            out.stdout.text,
            format!("{}\nhello\ndone\n", pwd.display()),
            "cat must see EOF on stdin at once"
        );
        assert!(out.success());
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pids");
        let started = Instant::now();
        let out = run(CommandOptions::new(
            format!(
                "sleep 1000 & echo $! > {p}; sleep 1000 & echo $! >> {p}; echo started; wait",
                p = pidfile.display()
            ),
            dir.path(),
        )
        .timeout(Duration::from_millis(500)))
        .await
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(out.timed_out);
        assert_eq!(out.exit_code, None);
        assert_eq!(out.signal, Some(libc::SIGKILL));
        assert_eq!(out.stdout.text, "started\n");
        let pids = read_pids(&pidfile);
        assert_eq!(pids.len(), 2);
        for pid in pids {
            assert!(wait_gone(pid).await, "background child {pid} survived");
        }
    }

    #[tokio::test]
    async fn background_children_are_killed_when_the_shell_exits() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let started = Instant::now();
        let out = run(opts(
            &format!("sleep 1000 & echo $! > {}; echo ok", pidfile.display()),
            dir.path(),
        ))
        .await
        .unwrap();
        // The child holds stdout open; killing the group is what lets the call return.
        assert!(started.elapsed() < DRAIN_TIMEOUT, "{:?}", started.elapsed());
        assert!(out.success());
        assert_eq!(out.stdout.text, "ok\n");
        let pid = read_pids(&pidfile)[0];
        assert!(wait_gone(pid).await, "background child {pid} survived");
    }

    #[tokio::test]
    async fn a_process_that_left_the_group_cannot_hang_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        // setsid puts the sleeper out of reach of killpg while it keeps our pipes open; the
        // shell waits until it has left the group, so the test does not race the kill.
        let out = run(opts(
            "setsid sh -c 'echo $$ > escaped; exec sleep 30' & \
             while [ ! -s escaped ]; do sleep 0.01; done; echo before",
            dir.path(),
        ))
        .await
        .unwrap();
        let took = started.elapsed();
        let escaped = read_pids(&dir.path().join("escaped"))[0];
        // SAFETY: test cleanup of the process this test started.
        unsafe { libc::kill(escaped, libc::SIGKILL) };
        assert!(took >= DRAIN_TIMEOUT, "{took:?}");
        assert!(took < DRAIN_TIMEOUT + Duration::from_secs(2), "{took:?}");
        assert!(out.success());
        assert_eq!(out.stdout.text, "before\n");
    }

    #[tokio::test]
    async fn dropping_the_future_kills_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let fut = run(opts(
            &format!("sleep 1000 & echo $! > {}; wait", pidfile.display()),
            dir.path(),
        ));
        assert!(
            tokio::time::timeout(Duration::from_millis(500), fut)
                .await
                .is_err()
        );
        let pid = read_pids(&pidfile)[0];
        assert!(
            wait_gone(pid).await,
            "child {pid} survived the dropped future"
        );
    }

    #[tokio::test]
    async fn output_is_bounded_and_keeps_head_and_tail() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(opts(
            "echo FIRST; seq 1 200000; echo LAST >&1; echo only-err >&2",
            dir.path(),
        )
        .max_bytes_per_stream(1000))
        .await
        .unwrap();
        assert!(out.stdout.truncated);
        assert!(out.stdout.total_bytes > 1_000_000);
        assert!(out.stdout.text.len() <= 1000 + MARKER_SLACK);
        assert!(out.stdout.text.starts_with("FIRST\n1\n2\n"));
        assert!(out.stdout.text.ends_with("200000\nLAST\n"));
        assert!(out.stdout.text.contains("bytes omitted"));
        assert_eq!(out.stderr.text, "only-err\n");
    }

    #[tokio::test]
    async fn invalid_utf8_output_stays_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(
            opts("head -c 100000 /dev/zero | tr '\\0' '\\377'", dir.path())
                .max_bytes_per_stream(1000),
        )
        .await
        .unwrap();
        assert!(out.stdout.text.len() <= 1000 + MARKER_SLACK + 80);
        assert_eq!(out.stdout.total_bytes, 100_000);
    }

    #[tokio::test]
    async fn nul_in_command_is_refused_before_spawning() {
        let dir = tempfile::tempdir().unwrap();
        let err = run(opts("echo a\0b", dir.path())).await.unwrap_err();
        assert!(matches!(err, RunError::InvalidCommand));
    }

    #[tokio::test]
    async fn missing_cwd_is_a_spawn_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = run(opts("true", &dir.path().join("nope")))
            .await
            .unwrap_err();
        assert!(matches!(err, RunError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("starting /bin/sh"));
    }

    fn own_netns() -> String {
        std::fs::read_link("/proc/self/ns/net")
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    /// A confined command in `worktree` (default settings), with its temp dir in `tmp`.
    fn confined(command: &str, worktree: &Path, tmp: &Path, no_network: bool) -> CommandOptions {
        static SETTINGS: std::sync::OnceLock<crate::SandboxSettings> = std::sync::OnceLock::new();
        let settings = SETTINGS.get_or_init(Default::default);
        let prepared = crate::prepare(&crate::CommandPolicy {
            settings,
            worktree,
            cwd: worktree,
            temp_dir: tmp,
            network: if no_network {
                crate::Network::Isolated
            } else {
                crate::Network::Host
            },
            launcher_env: vec![("TMPDIR".into(), tmp.into())],
        })
        .unwrap();
        opts(command, worktree).confined(prepared)
    }

    fn full_protections() -> bool {
        let p = crate::protections();
        let full = p.missing().is_empty();
        if !full {
            eprintln!("branch: this machine lacks protections: {:?}", p.missing());
        }
        full
    }

    /// Host pids of processes whose command line holds `marker`.
    fn pids_with(marker: &str) -> Vec<i32> {
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(marker) && !pid_is_gone(pid) {
                pids.push(pid);
            }
        }
        pids
    }

    async fn none_left_with(marker: &str) -> bool {
        for _ in 0..100 {
            if pids_with(marker).is_empty() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    #[tokio::test]
    async fn confined_status_and_output_are_the_commands_own() {
        if !full_protections() {
            return;
        }
        let wt = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = run(confined(
            "echo out; echo err >&2; exit 3",
            wt.path(),
            tmp.path(),
            false,
        ))
        .await
        .unwrap();
        assert_eq!((out.exit_code, out.signal), (Some(3), None));
        assert_eq!(out.stdout.text, "out\n");
        assert_eq!(out.stderr.text, "err\n");
        let out = run(confined("kill -TERM $$", wt.path(), tmp.path(), false))
            .await
            .unwrap();
        assert_eq!((out.exit_code, out.signal), (None, Some(libc::SIGTERM)));
        let out = run(confined("cat; echo eof", wt.path(), tmp.path(), false))
            .await
            .unwrap();
        assert_eq!(out.stdout.text, "eof\n", "stdin must be empty");
    }

    #[tokio::test]
    async fn confined_escapees_die_with_the_command_and_with_its_timeout() {
        if !full_protections() {
            return;
        }
        let wt = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        for (i, timeout) in [(1, false), (2, true)] {
            let marker = format!("{}.{i}31", std::process::id());
            let escape = format!(
                "setsid sleep {marker} & \
                 (sleep {marker} &) ; \
                 perl -e 'setpgrp(0,0); exec \"sleep\", \"{marker}\"' & \
                 sleep 0.3; echo started{}",
                if timeout { "; sleep 60" } else { "" }
            );
            let options = confined(&escape, wt.path(), tmp.path(), false)
                .timeout(Duration::from_millis(if timeout { 1500 } else { 20_000 }));
            let out = run(options).await.unwrap();
            assert_eq!(out.timed_out, timeout);
            assert_eq!(out.stdout.text, "started\n", "{out:?}");
            assert!(
                none_left_with(&marker).await,
                "survivors: {:?}",
                pids_with(&marker)
            );
        }
    }

    #[tokio::test]
    async fn confined_writes_stay_in_the_worktree_and_temp_dir() {
        if !full_protections() {
            return;
        }
        let wt = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(wt.path().join(".git")).unwrap();
        let command = format!(
            "echo a > inside && echo b > \"$TMPDIR/t\" && echo ok; \
             echo c > {o}/outside || echo refused-outside; \
             echo d > .git/config || echo refused-git; \
             echo e > /dev/null && echo devnull-ok",
            o = outside.path().display()
        );
        let out = run(confined(&command, wt.path(), tmp.path(), false))
            .await
            .unwrap();
        assert_eq!(
            out.stdout.text, "ok\nrefused-outside\nrefused-git\ndevnull-ok\n",
            "{out:?}"
        );
        assert!(!outside.path().join("outside").exists());
        assert!(!wt.path().join(".git/config").exists());
        assert!(tmp.path().join("t").exists());
    }

    #[tokio::test]
    async fn confined_commands_have_no_privileges_and_see_only_their_processes() {
        if !full_protections() {
            return;
        }
        let wt = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let daemon = std::process::id();
        let command = format!(
            "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; \
             cat /proc/{daemon}/environ >/dev/null 2>&1 && echo environ-readable; \
             ls /proc | grep -c '^[0-9]'; \
             unshare -n true 2>/dev/null && echo unshared"
        );
        let out = run(confined(&command, wt.path(), tmp.path(), false))
            .await
            .unwrap();
        let text = out.stdout.text;
        assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
        assert!(text.contains("CapBnd:\t0000000000000000"), "{text}");
        assert!(text.contains("NoNewPrivs:\t1"), "{text}");
        assert!(text.contains("Seccomp:\t2"), "{text}");
        assert!(!text.contains("environ-readable"), "{text}");
        assert!(!text.contains("unshared"), "{text}");
        let count: usize = text.lines().last().unwrap().trim().parse().unwrap();
        assert!(count < 10, "the command sees {count} processes: {text}");
    }

    #[tokio::test]
    async fn no_net_commands_get_an_empty_network_namespace() {
        if !full_protections() {
            return;
        }
        let wt = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = run(confined(
            "readlink /proc/self/ns/net; tail -n +3 /proc/net/dev | cut -d: -f1",
            wt.path(),
            tmp.path(),
            true,
        ))
        .await
        .unwrap();
        assert!(out.success(), "{out:?}");
        let lines: Vec<&str> = out.stdout.text.lines().map(str::trim).collect();
        assert_ne!(lines[0], own_netns());
        assert_eq!(lines[1..], ["lo"]);
    }
}
