//! Running one shell command for a tool: `/bin/sh -c COMMAND` in its own process group, with
//! stdin closed, stdout and stderr captured into bounded head+tail buffers while it runs, a
//! timeout that kills the whole group, and optional network isolation.
//!
//! Invariants this module keeps:
//! - Nothing outlives the call. After the main process exits (or times out) every process
//!   still in its group is killed with SIGKILL; if the future is dropped mid-run (a watchdog,
//!   a loop that stops), a guard kills the group from `Drop`.
//! - Memory stays bounded whatever the command prints: each stream keeps at most its cap.
//! - A process that left the group (`setsid`) and still holds a pipe cannot hang the call:
//!   pipes are drained for at most [`DRAIN_TIMEOUT`] once the group is gone.
//!
//! What it cannot do: kill processes that escaped the group on purpose (`setsid`, double
//! fork into a new session). They lose their output pipe's reader and are left to the OS.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::text::{HeadTailBuffer, head_tail};

/// How long pipes are still read after the process group is gone. Only a process that left
/// the group can keep a pipe open that long; its remaining output is not worth a hung call.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// How long to wait for the killed main process to be reaped before giving up on its status.
const REAP_TIMEOUT: Duration = Duration::from_secs(2);

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
#[derive(Debug, Clone)]
pub struct RunOptions {
    command: String,
    cwd: PathBuf,
    timeout: Duration,
    max_bytes_per_stream: usize,
    isolate_network: bool,
    env: Vec<(OsString, OsString)>,
    /// Test hook: skip the plain `unshare(CLONE_NEWNET)` and go straight to the user
    /// namespace route, which root would otherwise never exercise.
    user_namespace_only: bool,
}

impl RunOptions {
    /// `command` run by `/bin/sh -c` in `cwd`, with a 120 s timeout, 100 000 bytes kept per
    /// stream, network available and the environment inherited.
    pub fn new(command: impl Into<String>, cwd: impl Into<PathBuf>) -> Self {
        Self {
            command: command.into(),
            cwd: cwd.into(),
            timeout: Duration::from_secs(120),
            max_bytes_per_stream: 100_000,
            isolate_network: false,
            env: Vec::new(),
            user_namespace_only: false,
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

    /// Runs the command in a fresh network namespace (only a loopback that is down), so it
    /// has no network at all. Spawning fails with [`RunError::NetworkIsolationUnavailable`]
    /// when the kernel or the container refuses new namespaces.
    pub fn isolate_network(mut self, isolate: bool) -> Self {
        self.isolate_network = isolate;
        self
    }

    /// Sets an environment variable on top of the inherited environment.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    #[cfg(test)]
    fn via_user_namespace(mut self) -> Self {
        self.isolate_network = true;
        self.user_namespace_only = true;
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
    /// A new network namespace could not be created; the text says what was tried.
    #[error("network isolation is not available on this machine: {0}")]
    NetworkIsolationUnavailable(String),
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
pub async fn run(options: RunOptions) -> Result<RunOutput, RunError> {
    if options.command.contains('\0') {
        return Err(RunError::InvalidCommand);
    }
    let mut command = tokio::process::Command::new(SHELL);
    command
        .arg("-c")
        .arg(&options.command)
        .current_dir(&options.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for (key, value) in &options.env {
        command.env(key, value);
    }
    if options.isolate_network {
        let plan = netns::Plan::new(!options.user_namespace_only);
        // SAFETY: `Plan::enter` only makes async-signal-safe system calls (unshare, open,
        // write, close) on data prepared before the fork, and allocates nothing.
        unsafe {
            command.pre_exec(move || plan.enter());
        }
    }
    let mut child = command
        .spawn()
        .map_err(|e| classify_spawn_error(e, options.isolate_network))?;
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
        // Pipes are read while waiting, or a chatty command would block on a full pipe.
        let exited = loop {
            tokio::select! {
                status = child.wait() => break Some(status),
                () = &mut io, if !io_done => io_done = true,
                () = &mut deadline => break None,
            }
        };
        // Background jobs after a normal exit, the whole tree after a timeout: nothing in
        // the group may outlive the call.
        guard.kill_group();
        let timed_out = exited.is_none();
        let status = match exited {
            Some(status) => Some(status.map_err(|source| RunError::Io {
                action: "waiting for the command",
                source,
            })?),
            None => tokio::time::timeout(REAP_TIMEOUT, child.wait())
                .await
                .ok()
                .and_then(Result::ok),
        };
        // The leader is reaped, so its pid may be reused: the guard must not fire later.
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

fn classify_spawn_error(err: io::Error, isolating: bool) -> RunError {
    if isolating && let Some(detail) = err.raw_os_error().and_then(netns::describe_failure) {
        return RunError::NetworkIsolationUnavailable(detail);
    }
    RunError::Io {
        action: "starting /bin/sh",
        source: err,
    }
}

/// Entering a new network namespace between fork and exec.
///
/// A failure inside the child reaches the parent only as the errno of `spawn`'s error, so
/// the errors of both attempts are packed into one tagged code that no real errno can equal;
/// the parent unpacks it into a message that says what was tried.
mod netns {
    use std::ffi::CStr;
    use std::io;

    /// High bits that mark an errno as "network isolation failed" (no errno is this large).
    const TAG: i32 = 0x4E00_0000;
    const TAG_MASK: i32 = 0x7F00_0000;

    /// What the child does, prepared before the fork so the child allocates nothing.
    #[derive(Debug)]
    pub(super) struct Plan {
        try_plain: bool,
        uid_map: Vec<u8>,
        gid_map: Vec<u8>,
    }

    impl Plan {
        pub(super) fn new(try_plain: bool) -> Self {
            // SAFETY: getuid/getgid cannot fail and touch no memory.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            Self {
                try_plain,
                uid_map: format!("{uid} {uid} 1\n").into_bytes(),
                gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            }
        }

        /// Runs in the forked child: `unshare(CLONE_NEWNET)`, and when that is not permitted
        /// (no CAP_SYS_ADMIN), a new user namespace together with the network namespace.
        pub(super) fn enter(&self) -> io::Result<()> {
            let mut first = 0;
            if self.try_plain {
                // SAFETY: unshare only changes this (single-threaded, forked) process.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0 {
                    return Ok(());
                }
                first = errno();
                if first != libc::EPERM {
                    return Err(io::Error::from_raw_os_error(pack(first, 0)));
                }
            }
            // SAFETY: as above; CLONE_NEWUSER needs a single-threaded caller, which a forked
            // child is.
            if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::from_raw_os_error(pack(first, errno())));
            }
            // Map our own ids so files and `id` look as outside. Best effort: the network is
            // isolated either way, and an unmapped user can still use its own files.
            write_proc(c"/proc/self/setgroups", b"deny");
            write_proc(c"/proc/self/uid_map", &self.uid_map);
            write_proc(c"/proc/self/gid_map", &self.gid_map);
            Ok(())
        }
    }

    fn errno() -> i32 {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)
    }

    fn write_proc(path: &CStr, content: &[u8]) {
        // SAFETY: plain syscalls on a NUL-terminated path and a live buffer.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::write(fd, content.as_ptr().cast(), content.len());
                libc::close(fd);
            }
        }
    }

    /// Packs the errno of the plain attempt (0 when skipped) and of the user-namespace
    /// attempt (0 when not tried) under the tag.
    pub(super) fn pack(plain: i32, with_user: i32) -> i32 {
        TAG | ((plain & 0xFF) << 8) | (with_user & 0xFF)
    }

    /// The message for a packed code, or `None` when `code` is an ordinary errno.
    pub(super) fn describe_failure(code: i32) -> Option<String> {
        if code & TAG_MASK != TAG {
            return None;
        }
        let plain = (code >> 8) & 0xFF;
        let with_user = code & 0xFF;
        let mut parts = Vec::new();
        if plain != 0 {
            parts.push(format!(
                "unshare(CLONE_NEWNET) failed: {}",
                io::Error::from_raw_os_error(plain)
            ));
        }
        if with_user != 0 {
            parts.push(format!(
                "unshare(CLONE_NEWUSER | CLONE_NEWNET) failed: {}",
                io::Error::from_raw_os_error(with_user)
            ));
        }
        if parts.is_empty() {
            parts.push("creating a network namespace failed".to_string());
        }
        Some(parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Instant;

    fn opts(command: &str, dir: &Path) -> RunOptions {
        RunOptions::new(command, dir).timeout(Duration::from_secs(20))
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
        let out = run(RunOptions::new(
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

    #[tokio::test]
    async fn isolated_command_gets_its_own_network_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let result = run(
            opts("readlink /proc/self/ns/net; cat /proc/net/dev", dir.path()).isolate_network(true),
        )
        .await;
        match result {
            Ok(out) => {
                eprintln!("branch: isolation available");
                assert!(out.success(), "{out:?}");
                let mut lines = out.stdout.text.lines();
                assert_ne!(lines.next().unwrap(), own_netns());
                let ifaces: Vec<&str> = lines
                    .skip(2)
                    .filter_map(|l| l.split(':').next())
                    .map(str::trim)
                    .collect();
                assert_eq!(ifaces, ["lo"]);
            }
            Err(RunError::NetworkIsolationUnavailable(detail)) => {
                eprintln!("branch: isolation unavailable: {detail}");
                assert!(detail.contains("unshare("), "{detail}");
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    }

    #[tokio::test]
    async fn user_namespace_route_isolates_and_keeps_our_ids() {
        let dir = tempfile::tempdir().unwrap();
        let result = run(opts(
            "readlink /proc/self/ns/net; id -u; echo x > f; stat -c %u f",
            dir.path(),
        )
        .via_user_namespace())
        .await;
        match result {
            Ok(out) => {
                eprintln!("branch: user namespaces available");
                assert!(out.success(), "{out:?}");
                let lines: Vec<&str> = out.stdout.text.lines().collect();
                let uid = unsafe { libc::getuid() }.to_string();
                assert_ne!(lines[0], own_netns());
                assert_eq!(lines[1..], [uid.as_str(), uid.as_str()]);
                let meta = std::fs::metadata(dir.path().join("f")).unwrap();
                assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta).to_string(), uid);
            }
            Err(RunError::NetworkIsolationUnavailable(detail)) => {
                eprintln!("branch: user namespaces unavailable: {detail}");
                assert!(detail.contains("CLONE_NEWUSER"), "{detail}");
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    }

    #[test]
    fn packed_failures_describe_both_attempts_and_plain_errnos_pass_through() {
        let both = netns::describe_failure(netns::pack(libc::EPERM, libc::ENOSPC)).unwrap();
        assert!(both.starts_with("unshare(CLONE_NEWNET) failed: Operation not permitted"));
        assert!(both.contains("unshare(CLONE_NEWUSER | CLONE_NEWNET) failed: No space left"));
        let first = netns::describe_failure(netns::pack(libc::EINVAL, 0)).unwrap();
        assert!(!first.contains("CLONE_NEWUSER"), "{first}");
        assert_eq!(netns::describe_failure(libc::ENOENT), None);
        let err = classify_spawn_error(
            io::Error::from_raw_os_error(netns::pack(libc::EPERM, libc::EPERM)),
            true,
        );
        assert!(matches!(err, RunError::NetworkIsolationUnavailable(_)));
        let err = classify_spawn_error(io::Error::from_raw_os_error(libc::ENOENT), true);
        assert!(matches!(err, RunError::Io { .. }));
    }
}
