//! A confined process that runs until it is stopped — a loop's compiler cache server — and
//! the namespaces through which that loop's commands reach it.
//!
//! A service that runs code for a loop (sccache runs `rustc`, and `rustc` runs the loop's
//! proc-macros) must be confined as the loop's commands are, and must be reachable by that
//! loop's commands only. It is started with [`crate::Network::PrivateLoopback`]: a network
//! namespace of its own whose loopback is up, so it listens on 127.0.0.1 of that namespace,
//! which neither the host nor any other loop shares. The loop's commands that use it are
//! started with [`crate::Network::Join`] on its [`Namespaces`]: they see that loopback and
//! nothing else. A Unix socket would do the same with less machinery, but commands may not
//! create Unix sockets (they would reach the host's services by path), and TCP on the host's
//! loopback would let every loop reach every loop's server.
//!
//! The service is the command's whole namespace: its init, the service and whatever it
//! starts. Dropping the [`Service`] (or [`Service::stop`]) ends all of it; so does the
//! daemon's death (see `crate::child`).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::child::JoinFds;
use crate::process::{RunError, confine, shell_command};
use crate::{ConfineError, Prepared};

/// Output kept from a service that failed to start, for the error message.
const KEPT_OUTPUT: usize = 4_000;

/// The namespaces of a running service that commands join.
#[derive(Debug)]
pub struct Namespaces {
    net: OwnedFd,
    user: Option<OwnedFd>,
}

impl Namespaces {
    /// Copies of the descriptors for one command's plan.
    pub(crate) fn for_child(&self) -> Result<JoinFds, ConfineError> {
        let copy = |fd: &OwnedFd| {
            fd.try_clone().map_err(|e| {
                ConfineError::Setup(format!(
                    "copying a descriptor of the compiler cache server's namespaces: {e}"
                ))
            })
        };
        Ok(JoinFds {
            net: copy(&self.net)?,
            user: self.user.as_ref().map(copy).transpose()?,
        })
    }
}

/// Why a service did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// It could not be launched.
    #[error(transparent)]
    Launch(#[from] RunError),
    /// It exited, or said nothing that shows it ready in time; the text has its output.
    #[error("{0}")]
    NotReady(String),
    /// Its namespaces could not be opened.
    #[error("opening the namespaces of the service: {0}")]
    Namespaces(std::io::Error),
}

/// A running confined service. Dropping it kills the service and everything it started.
#[derive(Debug)]
pub struct Service {
    child: tokio::process::Child,
    /// The daemon's end of the monitor's socket: closing it ends the namespace.
    status_socket: UnixStream,
    namespaces: std::sync::Arc<Namespaces>,
    drain: tokio::task::JoinHandle<()>,
}

impl Service {
    /// Starts `command` (by `/bin/sh -c`) in `cwd`, confined as `prepared` says (prepared with
    /// [`crate::Network::PrivateLoopback`] so that commands can join it), and waits until its
    /// output (stdout or stderr) holds `ready`, for at most `within`.
    pub async fn start(
        command: &str,
        cwd: &Path,
        prepared: Prepared,
        ready: &str,
        within: Duration,
    ) -> Result<Service, ServiceError> {
        if command.contains('\0') {
            return Err(RunError::InvalidCommand.into());
        }
        let own_user_namespace = prepared.plan.user_namespace;
        let mut shell = shell_command(command, cwd);
        let status_socket = confine(&mut shell, prepared)?;
        let spawned = shell.spawn();
        drop(shell);
        let mut child = spawned.map_err(|source| RunError::Io {
            action: "starting the service",
            source,
        })?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(ServiceError::NotReady(
                "the service's output could not be read".into(),
            ));
        };
        let mut seen = Vec::new();
        let (stdout, stderr) = match tokio::time::timeout(
            within,
            wait_for(stdout, stderr, ready.as_bytes(), &mut seen),
        )
        .await
        {
            Ok(Some(streams)) => streams,
            Ok(None) => {
                let status = child.wait().await.ok();
                return Err(ServiceError::NotReady(format!(
                    "it exited ({}) before it was ready; it said: {}",
                    status.map_or("status unknown".to_string(), |s| s.to_string()),
                    said(&seen)
                )));
            }
            Err(_) => {
                return Err(ServiceError::NotReady(format!(
                    "it was not ready within {} s; it said: {}",
                    within.as_secs(),
                    said(&seen)
                )));
            }
        };
        // The monitor (our child) made the namespaces and stays in them while the service
        // lives; it is not reaped before `child` is dropped, so its pid names it.
        let pid = child
            .id()
            .ok_or_else(|| ServiceError::NotReady("it exited as it became ready".to_string()))?;
        let open = |kind: &str| -> Result<OwnedFd, ServiceError> {
            File::open(format!("/proc/{pid}/ns/{kind}"))
                .map(OwnedFd::from)
                .map_err(ServiceError::Namespaces)
        };
        let namespaces = std::sync::Arc::new(Namespaces {
            net: open("net")?,
            user: if own_user_namespace {
                Some(open("user")?)
            } else {
                None
            },
        });
        // A service that writes on and on must not block on a full pipe.
        let drain = tokio::spawn(async move {
            tokio::join!(discard(stdout), discard(stderr));
        });
        Ok(Service {
            child,
            status_socket,
            namespaces,
            drain,
        })
    }

    /// The namespaces commands join to reach the service ([`crate::Network::Join`]). They
    /// outlive the service while a copy is held (a command that joins them after the service
    /// died finds an empty private network).
    pub fn namespaces(&self) -> &std::sync::Arc<Namespaces> {
        &self.namespaces
    }

    /// Whether the service still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the service and everything it started, and waits for it.
    pub async fn stop(mut self) {
        // Closing the socket makes the monitor kill the namespace's init, and with it
        // every process of the namespace.
        let _ = self.status_socket.shutdown(std::net::Shutdown::Both);
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        self.drain.abort();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.status_socket.shutdown(std::net::Shutdown::Both);
        let _ = self.child.start_kill();
        self.drain.abort();
    }
}

/// Reads both streams until one of them has shown `ready` (returning them for draining), or
/// both ended (`None`). What was read is appended to `seen`, up to [`KEPT_OUTPUT`] bytes.
async fn wait_for<O, E>(
    mut stdout: O,
    mut stderr: E,
    ready: &[u8],
    seen: &mut Vec<u8>,
) -> Option<(O, E)>
where
    O: AsyncRead + Unpin,
    E: AsyncRead + Unpin,
{
    let mut out_buf = [0u8; 1024];
    let mut err_buf = [0u8; 1024];
    // Each stream's text so far (bounded), searched for the marker.
    let mut out_text = Vec::new();
    let mut err_text = Vec::new();
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        let (n, text, open) = tokio::select! {
            read = stdout.read(&mut out_buf), if out_open => {
                let n = read.unwrap_or(0);
                out_text.extend_from_slice(&out_buf[..n]);
                (n, &mut out_text, &mut out_open)
            }
            read = stderr.read(&mut err_buf), if err_open => {
                let n = read.unwrap_or(0);
                err_text.extend_from_slice(&err_buf[..n]);
                (n, &mut err_text, &mut err_open)
            }
        };
        if n == 0 {
            *open = false;
            continue;
        }
        let fresh = &text[text.len() - n..];
        let room = KEPT_OUTPUT.saturating_sub(seen.len());
        seen.extend_from_slice(&fresh[..fresh.len().min(room)]);
        if text.windows(ready.len()).any(|w| w == ready) {
            return Some((stdout, stderr));
        }
        // Keep only what could still hold the start of the marker.
        if text.len() > KEPT_OUTPUT {
            let keep = text.len().saturating_sub(ready.len());
            text.drain(..keep);
        }
    }
    None
}

/// Reads `stream` to its end, keeping nothing.
async fn discard(mut stream: impl AsyncRead + Unpin) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// What a service said, for an error message.
fn said(seen: &[u8]) -> String {
    let text = String::from_utf8_lossy(seen);
    let text = text.trim();
    if text.is_empty() {
        "nothing".to_string()
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{CommandOptions, run};
    use crate::{CommandPolicy, Network, SandboxSettings};

    /// A service on 127.0.0.1:`port` of its private network: answers each connection with
    /// `hello` (python3, which the tests' machines have).
    fn server(port: u16) -> String {
        format!(
            "exec python3 -c \"import socket\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen()\nprint('ready', flush=True)\nwhile True:\n    c, _ = s.accept()\n    c.sendall(b'hello')\n    c.close()\n\""
        )
    }

    /// Connects to 127.0.0.1:`port` and prints what it got, or `refused`.
    fn client(port: u16) -> String {
        format!(
            "python3 -c \"import socket\ntry:\n    print(socket.create_connection(('127.0.0.1', {port}), timeout=2).recv(5).decode())\nexcept OSError:\n    print('refused')\""
        )
    }

    fn prepared(dir: &Path, network: Network<'_>) -> Prepared {
        static SETTINGS: std::sync::OnceLock<SandboxSettings> = std::sync::OnceLock::new();
        crate::prepare(&CommandPolicy {
            settings: SETTINGS.get_or_init(Default::default),
            worktree: dir,
            cwd: dir,
            temp_dir: dir,
            network,
            launcher_env: Vec::new(),
        })
        .unwrap()
    }

    #[tokio::test]
    async fn only_the_commands_that_join_a_service_reach_it() {
        if !crate::protections().missing().is_empty() {
            eprintln!("branch: this machine lacks protections");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // A port nothing on the host listens on, so that a host-network client's refusal
        // says the service is not on the host's loopback.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let service = Service::start(
            &server(port),
            dir.path(),
            prepared(dir.path(), Network::PrivateLoopback),
            "ready",
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        let ask = |network: Network<'_>| {
            run(CommandOptions::new(client(port), dir.path())
                .confined(prepared(dir.path(), network)))
        };
        let joined = ask(Network::Join(service.namespaces())).await.unwrap();
        assert_eq!(joined.stdout.text.trim(), "hello", "{joined:?}");
        let host = ask(Network::Host).await.unwrap();
        assert_eq!(host.stdout.text.trim(), "refused", "{host:?}");
        let isolated = ask(Network::Isolated).await.unwrap();
        assert_eq!(isolated.stdout.text.trim(), "refused", "{isolated:?}");
        // Stopped, it is gone with everything it started; a command that joins afterwards
        // finds an empty private network.
        let namespaces = service.namespaces().clone();
        service.stop().await;
        let after = ask(Network::Join(&namespaces)).await.unwrap();
        assert_eq!(after.stdout.text.trim(), "refused", "{after:?}");
    }

    #[tokio::test]
    async fn a_service_that_exits_before_it_is_ready_says_what_it_said() {
        if !crate::protections().missing().is_empty() {
            eprintln!("branch: this machine lacks protections");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let err = Service::start(
            "echo cannot bind >&2; exit 3",
            dir.path(),
            prepared(dir.path(), Network::PrivateLoopback),
            "ready",
            Duration::from_secs(20),
        )
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("exited"), "{text}");
        assert!(text.contains("cannot bind"), "{text}");
        let err = Service::start(
            "sleep 30",
            dir.path(),
            prepared(dir.path(), Network::PrivateLoopback),
            "ready",
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("not ready within"), "{err}");
    }
}
