//! The official Python MCP SDK for tests/mcp.rs, so that `cargo test` passes on a fresh
//! machine: the `python3` on PATH when it can already `import mcp`, else a virtual
//! environment of the tests' own under the cargo target directory, made once
//! (`python3 -m venv`, then pip installs [`SDK_REQUIREMENT`]) and reused by later runs.
//!
//! Test threads and test processes may ask at the same time: an exclusive `flock` on a file
//! beside the environment lets one of them make it while the others wait, and a marker
//! written last says the environment is complete, so one left half-made by a killed run is
//! made again rather than used.

use std::fs::{File, OpenOptions};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The SDK version the environment gets (the one CI used to install by hand).
pub const SDK_REQUIREMENT: &str = "mcp==2.3.0";

/// Longest a `python3 -m venv` or `pip install` may take before the test gives up on it.
const STEP_LIMIT: Duration = Duration::from_secs(600);

/// Name of the file, inside the environment, whose content says the environment is complete
/// and which requirement it holds.
const READY_MARKER: &str = "taskdaemon-ready";

/// A Python interpreter that can `import mcp`. Panics, saying what to do, when the SDK is
/// missing and no environment with it can be made (no `venv` module, no network...).
pub fn python_with_sdk() -> PathBuf {
    let system = PathBuf::from("python3");
    if imports_mcp(&system) {
        return system;
    }
    ensure_venv(&target_dir().join("python-mcp-sdk"))
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

/// Whether `python` runs and can import the SDK.
fn imports_mcp(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import mcp"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The interpreter of the environment at `venv`, made (or made again) under the lock unless
/// a complete one with [`SDK_REQUIREMENT`] is already there.
fn ensure_venv(venv: &Path) -> PathBuf {
    let python = venv.join("bin").join("python3");
    let marker = venv.join(READY_MARKER);
    let ready = || {
        std::fs::read_to_string(&marker).is_ok_and(|m| m == SDK_REQUIREMENT) && imports_mcp(&python)
    };
    let parent = venv
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent directory", venv.display()));
    std::fs::create_dir_all(parent)
        .unwrap_or_else(|e| panic!("creating {}: {e}", parent.display()));
    let lock_path = venv.with_extension("lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", lock_path.display()));
    // Held until `lock` is dropped at the end of this function: whoever waited here finds
    // the environment ready below.
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .unwrap_or_else(|e| panic!("locking {}: {e}", lock_path.display()));
    if ready() {
        return python;
    }
    match std::fs::remove_dir_all(venv) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!(
            "removing the incomplete Python environment {}: {e}; delete it by hand and run the \
             tests again",
            venv.display()
        ),
    }
    let log = venv.with_extension("log");
    let venv_arg = venv.as_os_str();
    let mut make = Command::new("python3");
    make.args(["-m".as_ref(), "venv".as_ref(), venv_arg]);
    run_step(
        make,
        &log,
        "`python3 -m venv` could not make a virtual environment for the Python MCP SDK",
    );
    let mut install = Command::new(&python);
    install.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        SDK_REQUIREMENT,
    ]);
    run_step(
        install,
        &log,
        "pip could not install the Python MCP SDK into the tests' virtual environment",
    );
    assert!(
        imports_mcp(&python),
        "{} still cannot `import mcp` after pip installed {SDK_REQUIREMENT}; see {}",
        python.display(),
        log.display()
    );
    std::fs::write(&marker, SDK_REQUIREMENT)
        .unwrap_or_else(|e| panic!("writing {}: {e}", marker.display()));
    drop(lock);
    python
}

/// Runs one provisioning step with its output in `log`, killing it after [`STEP_LIMIT`];
/// panics with `what`, the end of the log and what to do when it fails.
fn run_step(mut command: Command, log: &Path, what: &str) {
    let out = File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
    let shown = format!("{command:?}");
    let failed = |why: String| -> ! {
        let mut text = String::new();
        let _ = File::open(log).and_then(|mut f| f.read_to_string(&mut text));
        let start = text.len().saturating_sub(4000);
        let tail = text.get(start..).unwrap_or(&text);
        panic!(
            "{what}: {shown} {why}.\n{tail}\nThe MCP round-trip test needs the official Python \
             MCP SDK. Either install it for the python3 on PATH (`python3 -m pip install \
             '{SDK_REQUIREMENT}'`, Python 3.10 or later), or let this test make its own \
             environment: it needs python3 with the venv module (Debian/Ubuntu: `apt install \
             python3-venv`) and network access to PyPI. Full output: {}",
            log.display()
        )
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| failed(format!("could not start ({e})")));
    if let Err(why) = super::wait_successful(&mut child, STEP_LIMIT, Duration::from_millis(100)) {
        failed(why)
    }
}
