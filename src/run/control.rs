//! The run's control socket: how the dashboard (or any local client of the same user) asks
//! a live run to stop a loop or to stop, without touching the run record.
//!
//! `taskdaemon run` listens on `RUN/control.sock` (a Unix stream socket, mode 0600) and
//! keeps a random key in `RUN/control.key` (mode 0600, hidden from commands like the receipt
//! chain key). Unix sockets are refused to commands by default, but `sandbox.unix-sockets:
//! host` would let a loop's command reach the socket: only the key, which commands cannot
//! read, keeps it from stopping other loops. Both files go when the run ends.
//!
//! The protocol is JSON lines: `{"key": "...", "op": "stop_loop", "loop": "name", "by":
//! "dashboard"}` or `{"key": "...", "op": "stop_run"}`, each answered by `{"ok": true}` or
//! `{"ok": false, "error": "..."}`. A wrong key, a line that is not such a request, or a
//! line over 64 KiB is answered with an error and the connection closed; nothing of it
//! reaches the run. Requests go to the orchestrator as [`ControlRequest`]s, which it
//! records (`stop_requested`) and acts on in its own loop.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc, oneshot};

/// The socket's file name in the run directory.
pub const SOCKET_FILE: &str = "control.sock";
/// The key's file name in the run directory.
pub const KEY_FILE: &str = "control.key";

/// Longest request or reply line.
const MAX_LINE: u64 = 64 * 1024;
/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 8;
/// How long a request waits for the run to act on it (the orchestrator takes requests
/// between its other work), and a client for the answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// How long a connection may stay silent before it is closed (so that idle connections
/// cannot hold every slot).
const IDLE: Duration = Duration::from_secs(30);
/// Random bytes of the key.
const KEY_BYTES: usize = 32;
/// Longest `by` a request may name.
const MAX_BY: usize = 32;

/// What a client asks of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Stop this loop now (its call in flight is cancelled).
    StopLoop(String),
    /// Stop the run, as SIGTERM does.
    StopRun,
}

/// A request the orchestrator acts on.
#[derive(Debug)]
pub struct ControlRequest {
    /// What is asked.
    pub command: Command,
    /// Who asks (`dashboard`): recorded in the `stop_requested` event.
    pub by: String,
    /// The answer: `Err` with what to tell the client when the run refuses.
    pub reply: oneshot::Sender<Result<(), String>>,
}

/// One request line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    key: String,
    op: String,
    #[serde(rename = "loop", default, skip_serializing_if = "Option::is_none")]
    loop_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    by: Option<String>,
}

/// One answer line.
#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The listening socket of a live run; its files are removed and its connections end when
/// it is dropped.
pub struct ControlSocket {
    socket: PathBuf,
    key: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl ControlSocket {
    /// Makes a new key and listens on `run_dir/control.sock` (replacing the files a killed
    /// run left: the caller owns the run). Returns the socket and the requests it receives.
    pub fn open(run_dir: &Path) -> Result<(ControlSocket, mpsc::Receiver<ControlRequest>), String> {
        let key_path = run_dir.join(KEY_FILE);
        let socket_path = run_dir.join(SOCKET_FILE);
        let key = new_key(&key_path)?;
        match std::fs::remove_file(&socket_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", socket_path.display())),
        }
        // A path past the kernel's 108 bytes for a socket (a deep run directory) cannot be
        // bound: the run goes on without controls, and leaves no key behind.
        let listened = UnixListener::bind(&socket_path)
            .map_err(|e| format!("cannot listen on {}: {e}", socket_path.display()))
            .and_then(|listener| {
                std::fs::set_permissions(
                    &socket_path,
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )
                .map(|()| listener)
                .map_err(|e| format!("cannot restrict {}: {e}", socket_path.display()))
            });
        let listener = match listened {
            Ok(listener) => listener,
            Err(why) => {
                let _ = std::fs::remove_file(&socket_path);
                let _ = std::fs::remove_file(&key_path);
                return Err(why);
            }
        };
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(accept(listener, Arc::from(key), tx));
        Ok((
            ControlSocket {
                socket: socket_path,
                key: key_path,
                task,
            },
            rx,
        ))
    }

    /// The key file (to hide from commands).
    pub fn key_path(&self) -> &Path {
        &self.key
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.key);
    }
}

/// Writes a new random key to `path` (mode 0600), replacing an old one.
fn new_key(path: &Path) -> Result<String, String> {
    use std::io::Write;
    let mut bytes = [0u8; KEY_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| format!("cannot draw the control key from the OS random source: {e}"))?;
    let key = hex::encode(bytes);
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".control-key-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .tempfile_in(dir)
        .map_err(|e| format!("cannot create the control key in {}: {e}", dir.display()))?;
    tmp.as_file()
        .write_all(format!("{key}\n").as_bytes())
        .map_err(|e| format!("cannot write the control key: {e}"))?;
    tmp.persist(path)
        .map_err(|e| format!("cannot place {}: {}", path.display(), e.error))?;
    Ok(key)
}

async fn accept(listener: UnixListener, key: Arc<str>, tx: mpsc::Sender<ControlRequest>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("control socket: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (key, tx) = (key.clone(), tx.clone());
        tokio::spawn(async move {
            serve(stream, &key, &tx).await;
            drop(permit);
        });
    }
}

/// Answers the requests of one connection until it closes or sends something wrong.
async fn serve(stream: UnixStream, key: &str, tx: &mpsc::Sender<ControlRequest>) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let read = tokio::time::timeout(IDLE, read_line(&mut reader)).await;
        let line = match read.unwrap_or(Ok(None)) {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(why) => {
                let _ = answer(&mut write, Err(why)).await;
                return;
            }
        };
        let (outcome, go_on) = match parse(&line, key) {
            Ok((command, by)) => (ask(tx, command, by).await, true),
            Err(why) => (Err(why), false),
        };
        if answer(&mut write, outcome).await.is_err() || !go_on {
            return;
        }
    }
}

/// The next line (without its newline), `None` at the end; an error for a line over
/// [`MAX_LINE`] or not UTF-8.
async fn read_line(reader: &mut (impl AsyncBufReadExt + Unpin)) -> Result<Option<String>, String> {
    let mut buf = Vec::new();
    let n = reader
        .take(MAX_LINE + 1)
        .read_until(b'\n', &mut buf)
        .await
        .map_err(|e| format!("cannot read the request: {e}"))?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        if u64::try_from(buf.len()).is_ok_and(|n| n > MAX_LINE) {
            return Err(format!("a line is longer than {MAX_LINE} bytes"));
        }
        // The last line, without its newline: taken as it is.
    } else {
        buf.pop();
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| "the request is not UTF-8".to_string())
}

/// The command of a request line, after its key was checked.
fn parse(line: &str, key: &str) -> Result<(Command, String), String> {
    let request: Request = serde_json::from_str(line).map_err(|e| {
        format!(
            "not a control request ({e}); send {{\"key\": ..., \"op\": \"stop_loop\", \"loop\": NAME}} or {{\"key\": ..., \"op\": \"stop_run\"}}"
        )
    })?;
    if !same_key(request.key.trim().as_bytes(), key.as_bytes()) {
        return Err(format!(
            "wrong key: the key is in the run directory's {KEY_FILE}"
        ));
    }
    let by = request.by.unwrap_or_else(|| "control socket".to_string());
    if by.is_empty()
        || by.len() > MAX_BY
        || !by
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == ' ')
    {
        return Err(format!(
            "`by` must be 1 to {MAX_BY} letters, digits, spaces, '-' or '_'"
        ));
    }
    let command = match (request.op.as_str(), request.loop_name) {
        ("stop_loop", Some(name)) if !name.is_empty() => Command::StopLoop(name),
        ("stop_loop", _) => return Err("stop_loop needs the name of a loop in `loop`".to_string()),
        ("stop_run", None) => Command::StopRun,
        ("stop_run", Some(_)) => {
            return Err("stop_run stops the whole run: send it without `loop`".to_string());
        }
        (op, _) => {
            return Err(format!(
                "unknown op {op:?}: the ops are stop_loop and stop_run"
            ));
        }
    };
    Ok((command, by))
}

/// Compares two keys in time independent of where they differ.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Hands a request to the run and waits for its answer.
async fn ask(
    tx: &mpsc::Sender<ControlRequest>,
    command: Command,
    by: String,
) -> Result<(), String> {
    let (reply, answered) = oneshot::channel();
    let request = ControlRequest { command, by, reply };
    let asked = async {
        tx.send(request)
            .await
            .map_err(|_| "the run is ending and takes no more requests".to_string())?;
        answered
            .await
            .map_err(|_| "the run ended before it acted on the request".to_string())?
    };
    tokio::time::timeout(ANSWER_WITHIN, asked)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the run did not act on the request within {} s (it may be starting its loops); try again",
                ANSWER_WITHIN.as_secs()
            ))
        })
}

async fn answer(
    write: &mut (impl AsyncWriteExt + Unpin),
    outcome: Result<(), String>,
) -> std::io::Result<()> {
    let reply = match outcome {
        Ok(()) => Reply {
            ok: true,
            error: None,
        },
        Err(error) => Reply {
            ok: false,
            error: Some(error),
        },
    };
    let mut line = serde_json::to_string(&reply).map_err(std::io::Error::other)?;
    line.push('\n');
    write.write_all(line.as_bytes()).await
}

/// Why a client's request did not go through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// No run listens (it ended, or never had a socket).
    NotLive(String),
    /// The run answered with an error.
    Refused(String),
    /// Talking to the run failed.
    Failed(String),
}

/// Sends `command` to the live run in `run_dir`, as `by`, and waits for its answer.
pub async fn send(run_dir: &Path, command: &Command, by: &str) -> Result<(), SendError> {
    let key_path = run_dir.join(KEY_FILE);
    let key = read_key(&key_path).await?;
    let mut stream = match UnixStream::connect(run_dir.join(SOCKET_FILE)).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Err(SendError::NotLive(format!(
                "no run listens on its control socket ({e})"
            )));
        }
        Err(e) => return Err(SendError::Failed(format!("cannot reach the run: {e}"))),
    };
    let (op, loop_name) = match command {
        Command::StopLoop(name) => ("stop_loop", Some(name.clone())),
        Command::StopRun => ("stop_run", None),
    };
    let request = Request {
        key,
        op: op.to_string(),
        loop_name,
        by: Some(by.to_string()),
    };
    let talk = async {
        let mut line = serde_json::to_string(&request)
            .map_err(|e| SendError::Failed(format!("cannot write the request: {e}")))?;
        line.push('\n');
        stream
            .write_all(line.as_bytes())
            .await
            .map_err(|e| SendError::Failed(format!("cannot send the request: {e}")))?;
        let mut reader = BufReader::new(&mut stream);
        let reply = read_line(&mut reader)
            .await
            .map_err(SendError::Failed)?
            .ok_or_else(|| {
                SendError::Failed("the run closed the socket without answering".to_string())
            })?;
        let reply: Reply = serde_json::from_str(&reply)
            .map_err(|e| SendError::Failed(format!("the run's answer is not one: {e}")))?;
        match reply {
            Reply { ok: true, .. } => Ok(()),
            Reply { error, .. } => Err(SendError::Refused(
                error.unwrap_or_else(|| "refused without a reason".to_string()),
            )),
        }
    };
    tokio::time::timeout(ANSWER_WITHIN + Duration::from_secs(1), talk)
        .await
        .unwrap_or_else(|_| {
            Err(SendError::Failed(
                "the run did not answer in time".to_string(),
            ))
        })
}

/// The key in `path`: at most a line of hex.
async fn read_key(path: &Path) -> Result<String, SendError> {
    let file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SendError::NotLive(format!(
                "the run has no control key ({} is missing): it is not running",
                path.display()
            )));
        }
        Err(e) => {
            return Err(SendError::Failed(format!(
                "cannot read {}: {e}",
                path.display()
            )));
        }
    };
    let mut text = String::new();
    take_text(file, 1024, &mut text)
        .await
        .map_err(|e| SendError::Failed(format!("cannot read {}: {e}", path.display())))?;
    Ok(text.trim().to_string())
}

async fn take_text(
    file: impl AsyncRead + Unpin,
    limit: u64,
    text: &mut String,
) -> std::io::Result<usize> {
    file.take(limit).read_to_string(text).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_parsed_and_checked() {
        let key = "ab".repeat(32);
        let line = |v: serde_json::Value| v.to_string();
        assert_eq!(
            parse(
                &line(
                    serde_json::json!({"key": key, "op": "stop_loop", "loop": "a", "by": "dashboard"})
                ),
                &key
            ),
            Ok((Command::StopLoop("a".into()), "dashboard".into()))
        );
        assert_eq!(
            parse(
                &line(serde_json::json!({"key": key, "op": "stop_run"})),
                &key
            ),
            Ok((Command::StopRun, "control socket".into()))
        );
        let refused = [
            serde_json::json!({"key": "cd".repeat(32), "op": "stop_run"}),
            serde_json::json!({"key": "", "op": "stop_run"}),
            serde_json::json!({"key": key, "op": "stop_loop"}),
            serde_json::json!({"key": key, "op": "stop_loop", "loop": ""}),
            serde_json::json!({"key": key, "op": "stop_run", "loop": "a"}),
            serde_json::json!({"key": key, "op": "rm -rf"}),
            serde_json::json!({"key": key, "op": "stop_run", "by": "x\ny"}),
            serde_json::json!({"key": key, "op": "stop_run", "extra": 1}),
        ];
        for request in refused {
            assert!(parse(&line(request.clone()), &key).is_err(), "{request}");
        }
        assert!(parse("garbage", &key).is_err());
        let wrong = parse(
            &line(serde_json::json!({"key": "x", "op": "stop_run"})),
            &key,
        );
        assert!(wrong.unwrap_err().contains("wrong key"));
    }

    #[tokio::test]
    async fn a_run_directory_too_deep_for_a_socket_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("d".repeat(120));
        std::fs::create_dir_all(&deep).unwrap();
        assert!(ControlSocket::open(&deep).is_err());
        assert!(!deep.join(KEY_FILE).exists());
        assert!(!deep.join(SOCKET_FILE).exists());
        assert!(matches!(
            send(&deep, &Command::StopRun, "dashboard").await,
            Err(SendError::NotLive(_))
        ));
    }

    #[tokio::test]
    async fn a_client_reaches_the_run_and_a_wrong_key_or_garbage_reaches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, mut rx) = ControlSocket::open(dir.path()).unwrap();
        let mode = |p: &Path| {
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
                & 0o777
        };
        assert_eq!(mode(socket.key_path()), 0o600);
        assert_eq!(mode(&dir.path().join(SOCKET_FILE)), 0o600);
        let run = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(request) = rx.recv().await {
                let answer = match &request.command {
                    Command::StopLoop(name) if name == "ghost" => Err("no loop ghost".to_string()),
                    _ => Ok(()),
                };
                seen.push((request.command.clone(), request.by.clone()));
                let _ = request.reply.send(answer);
            }
            seen
        });
        send(dir.path(), &Command::StopLoop("a".into()), "dashboard")
            .await
            .unwrap();
        assert_eq!(
            send(dir.path(), &Command::StopLoop("ghost".into()), "dashboard").await,
            Err(SendError::Refused("no loop ghost".into()))
        );
        // A wrong key and garbage: answered, and the connection closed.
        for line in [
            serde_json::json!({"key": "00", "op": "stop_run"}).to_string(),
            "garbage".to_string(),
            "x".repeat(200_000),
        ] {
            let stream = UnixStream::connect(dir.path().join(SOCKET_FILE))
                .await
                .unwrap();
            let (read, mut write) = stream.into_split();
            // The run may close before it read all of a long line: the write may fail.
            let writer = tokio::spawn(async move {
                let _ = write.write_all(format!("{line}\n").as_bytes()).await;
                write
            });
            let mut reply = String::new();
            BufReader::new(read).read_line(&mut reply).await.unwrap();
            drop(writer.await);
            let reply: Reply = serde_json::from_str(&reply).unwrap();
            assert!(!reply.ok, "{reply:?}");
        }
        send(dir.path(), &Command::StopRun, "dashboard")
            .await
            .unwrap();
        drop(socket);
        let seen = run.await.unwrap();
        assert_eq!(
            seen,
            [
                (Command::StopLoop("a".into()), "dashboard".into()),
                (Command::StopLoop("ghost".into()), "dashboard".into()),
                (Command::StopRun, "dashboard".into()),
            ]
        );
        assert!(!dir.path().join(SOCKET_FILE).exists());
        assert!(!dir.path().join(KEY_FILE).exists());
        assert!(matches!(
            send(dir.path(), &Command::StopRun, "dashboard").await,
            Err(SendError::NotLive(_))
        ));
    }
}
